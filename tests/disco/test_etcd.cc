// tests/disco/test_etcd.cc: the etcd client (disco/etcd.h) against a real etcd: leases, put, range, delete, watch
// with revision resume, fail-over, an outage, and etcd's user/password auth.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "disco/etcd.h"
#include "tests/disco/etcd_proc.h"
#include "util/clock.h"

namespace {

struct Client {
  dsc_etcd *c = nullptr;
  char err[512] = "";
  explicit Client(const std::vector<std::string> &eps, const dsc_etcd_opts *base = nullptr) {
    std::vector<const char *> p;
    for (auto &e : eps) p.push_back(e.c_str());
    dsc_etcd_opts o{};
    if (base) o = *base;
    o.endpoints = p.data();
    o.n_endpoints = (int)p.size();
    EXPECT_EQ(dsc_etcd_new(&o, &c, err, sizeof err), 0) << err;
  }
  ~Client() { dsc_etcd_free(c); }
  // every key under prefix, "key=value" each
  std::vector<std::string> range(const char *prefix, int64_t *rev = nullptr) {
    dsc_kv *kvs;
    int n;
    int64_t r;
    EXPECT_EQ(dsc_range(c, prefix, 1, &kvs, &n, &r, err, sizeof err), 0) << err;
    std::vector<std::string> out;
    for (int i = 0; i < n; i++) out.push_back(std::string(kvs[i].key) + "=" + std::string(kvs[i].value, kvs[i].value_len));
    dsc_kvs_free(kvs, n);
    if (rev) *rev = r;
    return out;
  }
};

struct Events {
  std::mutex mu;
  std::vector<std::string> got; // "put key=value" / "del key"
  std::atomic<int> stop{0};
  static int on(void *arg, const dsc_event *ev) {
    Events *e = (Events *)arg;
    std::lock_guard<std::mutex> g(e->mu);
    e->got.push_back(ev->is_delete ? "del " + std::string(ev->kv.key)
                                   : "put " + std::string(ev->kv.key) + "=" + std::string(ev->kv.value, ev->kv.value_len));
    return 0;
  }
  static int stopped(void *arg) { return ((Events *)arg)->stop.load(); }
  size_t size() {
    std::lock_guard<std::mutex> g(mu);
    return got.size();
  }
  bool wait_for(size_t n, int ms = 5000) {
    for (int i = 0; i < ms / 10 && size() < n; i++) usleep(10000);
    return size() >= n;
  }
};

} // namespace

TEST(Etcd, LeasePutRangeDeleteRevoke) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  Client c({e.url});
  int64_t lease = 0;
  ASSERT_EQ(dsc_lease_grant(c.c, 5, &lease, c.err, sizeof c.err), 0) << c.err;
  EXPECT_NE(lease, 0);
  ASSERT_EQ(dsc_put(c.c, "/t/a/1", "one", 3, lease, c.err, sizeof c.err), 0) << c.err;
  ASSERT_EQ(dsc_put(c.c, "/t/a/2", "two", 3, 0, c.err, sizeof c.err), 0) << c.err;
  ASSERT_EQ(dsc_put(c.c, "/t/b", "other", 5, 0, c.err, sizeof c.err), 0) << c.err;
  EXPECT_EQ(c.range("/t/a/"), (std::vector<std::string>{"/t/a/1=one", "/t/a/2=two"}));
  int ttl = 0;
  ASSERT_EQ(dsc_lease_keepalive(c.c, lease, &ttl, c.err, sizeof c.err), 0) << c.err;
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 5);
  ASSERT_EQ(dsc_lease_revoke(c.c, lease, c.err, sizeof c.err), 0) << c.err;
  EXPECT_EQ(c.range("/t/a/"), (std::vector<std::string>{"/t/a/2=two"})); // the lease's key went with it
  EXPECT_EQ(dsc_lease_keepalive(c.c, lease, &ttl, c.err, sizeof c.err), DSC_ENOTFOUND);
  EXPECT_EQ(dsc_lease_revoke(c.c, lease, c.err, sizeof c.err), DSC_ENOTFOUND);
  ASSERT_EQ(dsc_delete(c.c, "/t/", 1, c.err, sizeof c.err), 0) << c.err;
  EXPECT_TRUE(c.range("/t/").empty());
}

TEST(Etcd, BinaryValuesAndExactKeysRoundTrip) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  Client c({e.url});
  std::string v;
  for (int i = 0; i < 256; i++) v.push_back((char)i);
  for (size_t n : {0, 1, 2, 3, 255, 256}) {
    ASSERT_EQ(dsc_put(c.c, "/bin/x", v.data(), n, 0, c.err, sizeof c.err), 0) << c.err;
    dsc_kv *kvs;
    int got;
    int64_t rev;
    ASSERT_EQ(dsc_range(c.c, "/bin/x", 0, &kvs, &got, &rev, c.err, sizeof c.err), 0) << c.err;
    ASSERT_EQ(got, 1);
    EXPECT_EQ(std::string(kvs[0].value, kvs[0].value_len), v.substr(0, n)) << n;
    EXPECT_GT(kvs[0].mod_revision, 0);
    dsc_kvs_free(kvs, got);
  }
  ASSERT_EQ(dsc_put(c.c, "/bin/xy", "z", 1, 0, c.err, sizeof c.err), 0);
  EXPECT_EQ(c.range("/bin/x").size(), 2u); // prefix: both
  dsc_kv *kvs;
  int got;
  int64_t rev;
  ASSERT_EQ(dsc_range(c.c, "/bin/x", 0, &kvs, &got, &rev, c.err, sizeof c.err), 0);
  EXPECT_EQ(got, 1); // exact: one
  dsc_kvs_free(kvs, got);
}

TEST(Etcd, LeaseExpiresWithoutKeepAlive) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  Client c({e.url});
  int64_t lease = 0;
  ASSERT_EQ(dsc_lease_grant(c.c, 2, &lease, c.err, sizeof c.err), 0) << c.err;
  ASSERT_EQ(dsc_put(c.c, "/exp/k", "v", 1, lease, c.err, sizeof c.err), 0);
  int64_t t0 = utl_now_ms();
  while (!c.range("/exp/").empty() && utl_now_ms() - t0 < 6000) usleep(50000);
  EXPECT_TRUE(c.range("/exp/").empty());
  int ttl;
  EXPECT_EQ(dsc_lease_keepalive(c.c, lease, &ttl, c.err, sizeof c.err), DSC_ENOTFOUND);
}

TEST(Etcd, WatchSeesChangesInOrderAndResumesFromARevision) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  Client c({e.url});
  int64_t rev0;
  c.range("/w/", &rev0);
  Events ev;
  int64_t last = -1;
  int rc = 0;
  // no wait for the watch to start: it begins at rev0 + 1, so it sees the puts below whenever it starts
  std::thread t([&] { rc = dsc_watch(c.c, "/w/", rev0 + 1, Events::on, Events::stopped, &ev, &last, c.err, sizeof c.err); });
  ASSERT_EQ(dsc_put(c.c, "/w/a", "1", 1, 0, c.err, sizeof c.err), 0);
  ASSERT_EQ(dsc_put(c.c, "/other", "x", 1, 0, c.err, sizeof c.err), 0); // outside the prefix: not seen
  ASSERT_EQ(dsc_put(c.c, "/w/b", "2", 1, 0, c.err, sizeof c.err), 0);
  ASSERT_EQ(dsc_delete(c.c, "/w/a", 0, c.err, sizeof c.err), 0);
  ASSERT_TRUE(ev.wait_for(3));
  ev.stop = 1;
  t.join();
  EXPECT_EQ(rc, DSC_ESTOPPED);
  EXPECT_EQ(ev.got, (std::vector<std::string>{"put /w/a=1", "put /w/b=2", "del /w/a"}));
  EXPECT_EQ(last, rev0 + 4);
  // The same history again from its first revision (what a watcher that lost its stream does), and nothing before.
  Events ev2;
  std::thread t2([&] { rc = dsc_watch(c.c, "/w/", rev0 + 3, Events::on, Events::stopped, &ev2, &last, c.err, sizeof c.err); });
  ASSERT_TRUE(ev2.wait_for(2));
  // a later change, seen after the replay (events come in revision order): nothing else came before it
  Client c2({e.url});
  ASSERT_EQ(dsc_put(c2.c, "/w/c", "3", 1, 0, c2.err, sizeof c2.err), 0) << c2.err;
  ASSERT_TRUE(ev2.wait_for(3));
  ev2.stop = 1;
  t2.join();
  EXPECT_EQ(ev2.got, (std::vector<std::string>{"put /w/b=2", "del /w/a", "put /w/c=3"}));
}

TEST(Etcd, OutageIsUnavailableThenRecovers) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  Client c({e.url});
  ASSERT_EQ(dsc_put(c.c, "/o/k", "v", 1, 0, c.err, sizeof c.err), 0);
  Events ev;
  int64_t last;
  std::atomic<int> rc{1};
  std::thread t([&] { rc = dsc_watch(c.c, "/o/", 0, Events::on, Events::stopped, &ev, &last, c.err, sizeof c.err); });
  usleep(300000);
  e.kill9();
  for (int i = 0; i < 50 && rc == 1; i++) usleep(100000);
  t.join();
  EXPECT_EQ(rc.load(), DSC_EUNAVAIL) << "the watch ends when etcd goes away";
  char err[512];
  EXPECT_EQ(dsc_put(c.c, "/o/k", "w", 1, 0, err, sizeof err), DSC_EUNAVAIL);
  EXPECT_NE(std::string(err).find("etcd"), std::string::npos) << err;
  ASSERT_TRUE(e.start()); // same ports, same data
  EXPECT_EQ(c.range("/o/"), (std::vector<std::string>{"/o/k=v"}));
}

TEST(Etcd, FailsOverToTheEndpointThatAnswers) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  std::string dead = "http://127.0.0.1:" + std::to_string(etcdtest::free_port());
  Client c({dead, e.url + "/"});
  ASSERT_EQ(dsc_put(c.c, "/f/k", "v", 1, 0, c.err, sizeof c.err), 0) << c.err;
  EXPECT_EQ(c.range("/f/"), (std::vector<std::string>{"/f/k=v"}));
  Client none({dead});
  EXPECT_EQ(dsc_put(none.c, "/f/k", "v", 1, 0, none.err, sizeof none.err), DSC_EUNAVAIL);
}

TEST(Etcd, UserAndPasswordFromAFile) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  { // etcd's own set-up: a root user, then auth on (what an operator does once with etcdctl)
    Client admin({e.url});
    std::string base = "curl -sf -XPOST " + e.url;
    ASSERT_EQ(system((base + "/v3/auth/user/add -d '{\"name\":\"root\",\"password\":\"pw-4-test\"}' >/dev/null").c_str()), 0);
    ASSERT_EQ(system((base + "/v3/auth/user/grant -d '{\"user\":\"root\",\"role\":\"root\"}' >/dev/null").c_str()), 0);
    ASSERT_EQ(system((base + "/v3/auth/enable -d '{}' >/dev/null").c_str()), 0);
  }
  std::string pw = e.dir + "/pw";
  FILE *f = fopen(pw.c_str(), "w");
  fputs("pw-4-test\n", f);
  fclose(f);
  Client anon({e.url});
  EXPECT_EQ(dsc_put(anon.c, "/a/k", "v", 1, 0, anon.err, sizeof anon.err), DSC_EPROTO) << "no user: refused";
  dsc_etcd_opts o{};
  o.user = "root";
  o.password_file = pw.c_str();
  Client c({e.url}, &o);
  ASSERT_EQ(dsc_put(c.c, "/a/k", "v", 1, 0, c.err, sizeof c.err), 0) << c.err;
  EXPECT_EQ(c.range("/a/"), (std::vector<std::string>{"/a/k=v"}));
  Events ev;
  int64_t last;
  int rc = 0;
  std::thread t([&] { rc = dsc_watch(c.c, "/a/", 1, Events::on, Events::stopped, &ev, &last, c.err, sizeof c.err); });
  EXPECT_TRUE(ev.wait_for(1)) << "the watch carries the token too";
  ev.stop = 1;
  t.join();
  EXPECT_EQ(rc, DSC_ESTOPPED) << c.err;
  std::string bad = e.dir + "/bad";
  f = fopen(bad.c_str(), "w");
  fputs("wrong\n", f);
  fclose(f);
  o.password_file = bad.c_str();
  Client wrong({e.url}, &o);
  EXPECT_EQ(dsc_put(wrong.c, "/a/k", "v", 1, 0, wrong.err, sizeof wrong.err), DSC_EPROTO);
  EXPECT_NE(std::string(wrong.err).find("authenticat"), std::string::npos) << wrong.err;
  o.password_file = "/nonexistent/pw";
  dsc_etcd *x = nullptr;
  char err[256];
  const char *ep = e.url.c_str();
  o.endpoints = &ep;
  o.n_endpoints = 1;
  EXPECT_NE(dsc_etcd_new(&o, &x, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("/nonexistent/pw"), std::string::npos) << err;
}

// etcd with TLS and client certificates (etcd --client-cert-auth): the files are handed to curl as they are.
TEST(Etcd, TlsWithAClientCertificate) {
  SKIP_WITHOUT_ETCD();
  if (system("command -v openssl >/dev/null 2>&1")) GTEST_SKIP() << "no openssl binary to make the test certificates";
  etcdtest::Etcd e;
  std::string d = e.dir, key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
  std::string mk =
      "cd " + d + " && openssl req -x509" + key + "-keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca && " +
      "openssl req" + key + "-keyout server.key -out server.csr -subj /CN=etcd && " +
      "printf 'subjectAltName=IP:127.0.0.1\\n' > ext && " +
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 1 -extfile ext && " +
      "openssl req" + key + "-keyout client.key -out client.csr -subj /CN=dserve && " +
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 1";
  ASSERT_EQ(system(("(" + mk + ") >/dev/null 2>&1").c_str()), 0) << mk;
  std::string ca = d + "/ca.pem", cert = d + "/client.pem", ck = d + "/client.key";
  e.scheme = "https";
  e.extra = {"--cert-file", d + "/server.pem", "--key-file", d + "/server.key", "--client-cert-auth",
             "--trusted-ca-file", ca};
  dsc_etcd_opts tls{};
  tls.ca_file = ca.c_str();
  tls.cert_file = cert.c_str();
  tls.key_file = ck.c_str();
  ASSERT_TRUE(e.start(&tls));
  Client c({e.url}, &tls);
  ASSERT_EQ(dsc_put(c.c, "/tls/k", "v", 1, 0, c.err, sizeof c.err), 0) << c.err;
  EXPECT_EQ(c.range("/tls/"), (std::vector<std::string>{"/tls/k=v"}));
  Events ev;
  int64_t last;
  int rc = 0;
  std::thread t([&] { rc = dsc_watch(c.c, "/tls/", 1, Events::on, Events::stopped, &ev, &last, c.err, sizeof c.err); });
  EXPECT_TRUE(ev.wait_for(1)) << "the watch goes over TLS too";
  ev.stop = 1;
  t.join();
  EXPECT_EQ(rc, DSC_ESTOPPED) << c.err;
  dsc_etcd_opts no_cert{};
  no_cert.ca_file = ca.c_str();
  Client anon({e.url}, &no_cert);
  EXPECT_EQ(dsc_put(anon.c, "/tls/k", "v", 1, 0, anon.err, sizeof anon.err), DSC_EUNAVAIL) << "no client certificate";
  Client untrusting({e.url}); // the system's CAs do not know the test CA
  EXPECT_EQ(dsc_put(untrusting.c, "/tls/k", "v", 1, 0, untrusting.err, sizeof untrusting.err), DSC_EUNAVAIL);
  EXPECT_NE(std::string(untrusting.err).find("etcd https://"), std::string::npos) << untrusting.err;
}
