// tests/disco/test_member.cc: the member record and its key, and a registrar and a watcher against a real etcd:
// join, restart (new incarnation), revoke on stop, expiry without keep-alive, an outage with a change meanwhile, and
// one name held by one key at a time.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "disco/disco.h"
#include "disco/etcd.h"
#include "tests/disco/etcd_proc.h"
#include "util/clock.h"

namespace {

dsc_member member(const char *name, int64_t incarnation) {
  dsc_member m{};
  snprintf(m.name, sizeof m.name, "%s", name);
  m.role = CFG_ROLE_DECODE;
  snprintf(m.host, sizeof m.host, "127.0.0.1");
  m.port = 9100;
  snprintf(m.kvx_host, sizeof m.kvx_host, "127.0.0.1");
  m.kvx_port = 9200;
  snprintf(m.fp.arch, sizeof m.fp.arch, "llama");
  snprintf(m.fp.file_hash, sizeof m.fp.file_hash, "98362432-0123456789abcdef");
  snprintf(m.fp.kv_type, sizeof m.fp.kv_type, "f16");
  m.fp.block_size = 16;
  m.max_seqs = 64;
  m.total_blocks = 91;
  m.incarnation = incarnation;
  return m;
}

cfg_discovery discovery(const std::string &url, int ttl = 2) {
  cfg_discovery d{};
  snprintf(d.etcd[0], sizeof d.etcd[0], "%s", url.c_str());
  d.n_etcd = 1;
  snprintf(d.cluster, sizeof d.cluster, "t");
  d.lease_ttl_s = ttl;
  return d;
}

// A client of the etcd at url (no TLS, no auth), or nullptr.
dsc_etcd *client(const std::string &url) {
  const char *ep = url.c_str();
  dsc_etcd_opts o{};
  o.endpoints = &ep;
  o.n_endpoints = 1;
  dsc_etcd *c = nullptr;
  char err[256];
  return dsc_etcd_new(&o, &c, err, sizeof err) ? nullptr : c;
}

// m's record under key, attached to lease (0: none): 0, or the client's status.
int put_member(dsc_etcd *c, const char *key, const dsc_member &m, int64_t lease = 0) {
  utl_buf b = {};
  char err[256];
  int rc = dsc_member_encode(&m, &b) ? -1 : dsc_put(c, key, b.p, b.n, lease, err, sizeof err);
  utl_buf_free(&b);
  return rc;
}

// What a watcher told: "join NAME INCARNATION" / "leave NAME".
struct Seen {
  std::mutex mu;
  std::vector<std::string> ev;
  std::string refuse; // a name join refuses (as a consumer refuses another model)
  bool keys = false;  // leave also says the key
  static int join(void *arg, const char *key, int64_t lease, const dsc_member *m) {
    (void)key;
    (void)lease;
    Seen *s = (Seen *)arg;
    std::lock_guard<std::mutex> g(s->mu);
    s->ev.push_back("join " + std::string(m->name) + " " + std::to_string(m->incarnation));
    return s->refuse == m->name;
  }
  static void leave(void *arg, const char *key, const dsc_member *m) {
    Seen *s = (Seen *)arg;
    std::lock_guard<std::mutex> g(s->mu);
    s->ev.push_back("leave " + std::string(m->name) + (s->keys ? " " + std::string(key) : ""));
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> g(mu);
    return ev;
  }
  // ms until ev has n entries (-1: not within timeout_ms)
  int64_t wait_for(size_t n, int timeout_ms = 8000) {
    int64_t t0 = utl_now_ms();
    while (get().size() < n) {
      if (utl_now_ms() - t0 > timeout_ms) return -1;
      usleep(10000);
    }
    return utl_now_ms() - t0;
  }
};

// Puts a leaseless record "marker" and deletes it, then waits until the watcher has told both: etcd's watch events
// come in revision order, so whatever the watcher was to report before them has been reported. The positive signal
// that makes "nothing else happened" a finding rather than a wait that was hopefully long enough. 0 when seen.
int marker(const std::string &url, Seen &seen, int incarnation) {
  dsc_etcd *c = client(url);
  if (!c) return -1;
  size_t n = seen.get().size();
  char err[256];
  const char *key = "/dserve/t/workers/decode/marker";
  int rc = put_member(c, key, member("marker", incarnation)) || dsc_delete(c, key, 0, err, sizeof err);
  dsc_etcd_free(c);
  if (rc || seen.wait_for(n + 2) < 0) return -1;
  std::vector<std::string> ev = seen.get();
  ev.erase(std::remove(ev.begin(), ev.end(), "join marker " + std::to_string(incarnation)), ev.end());
  ev.erase(std::remove(ev.begin(), ev.end(), std::string("leave marker")), ev.end());
  std::lock_guard<std::mutex> g(seen.mu);
  seen.ev = ev; // the marker's two events leave the list as they came
  return 0;
}

} // namespace

TEST(Member, RecordRoundTripsAndKeys) {
  dsc_member m = member("d1", 1733400000123456LL), back;
  utl_buf b = {};
  ASSERT_EQ(dsc_member_encode(&m, &b), 0);
  char err[256];
  ASSERT_EQ(dsc_member_decode(b.p, b.n, &back, err, sizeof err), 0) << err;
  EXPECT_EQ(memcmp(&m, &back, sizeof m), 0) << b.p;
  utl_buf_free(&b);
  char key[256];
  dsc_member_key("prod-a", &m, key, sizeof key);
  EXPECT_STREQ(key, "/dserve/prod-a/workers/decode/d1");
  dsc_workers_prefix("prod-a", key, sizeof key);
  EXPECT_STREQ(key, "/dserve/prod-a/workers/");
  cfg_worker w;
  dsc_member_to_cfg(&m, &w);
  EXPECT_STREQ(w.name, "d1");
  EXPECT_EQ(w.port, 9100);
  EXPECT_EQ(w.max_seqs, 64);
  EXPECT_EQ(w.block_size, 16);
  EXPECT_EQ(w.max_batch_tokens, CFG_DEF_MAX_BATCH_TOKENS) << "the rest: cfg_worker_defaults";
}

TEST(Member, BadRecordsAreRefusedNamingTheField) {
  struct Case {
    const char *json, *field;
  } cases[] = {
      {"[]", "not a JSON object"},
      {R"({"role":"decode"})", "name"},
      {R"({"name":"x","role":"boss"})", "role"},
      {R"({"name":"x","role":"decode","host":"h","port":0})", "port"},
      {R"({"name":"x","role":"decode","host":"h","port":1,"kvxfer_host":"","kvxfer_port":0})", "model"},
  };
  for (const Case &k : cases) {
    dsc_member m;
    char err[256];
    EXPECT_EQ(dsc_member_decode(k.json, strlen(k.json), &m, err, sizeof err), -1) << k.json;
    EXPECT_NE(std::string(err).find(k.field), std::string::npos) << err;
  }
  dsc_fingerprint a = member("a", 1).fp, b = a;
  EXPECT_TRUE(dsc_same_model(&a, &b));
  b.file_hash[0] = '7';
  EXPECT_FALSE(dsc_same_model(&a, &b));
}

TEST(Member, FileHashSeesSizeAndContent) {
  char path[] = "/tmp/dserve-hash-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "GGUF abc", 8), 8);
  char h1[40], h2[40], err[256];
  ASSERT_EQ(dsc_file_hash(path, h1, sizeof h1, err, sizeof err), 0);
  EXPECT_EQ(std::string(h1).substr(0, 2), "8-");
  ASSERT_EQ(pwrite(fd, "x", 1, 5), 1);
  ASSERT_EQ(dsc_file_hash(path, h2, sizeof h2, err, sizeof err), 0);
  EXPECT_STRNE(h1, h2);
  close(fd);
  unlink(path);
  EXPECT_EQ(dsc_file_hash(path, h2, sizeof h2, err, sizeof err), -1);
}

TEST(Membership, JoinRestartLeave) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  cfg_discovery d = discovery(e.url);
  Seen seen;
  dsc_watch_fns fns = {Seen::join, Seen::leave, &seen};
  dsc_watcher *w = nullptr;
  char err[512];
  ASSERT_EQ(dsc_watcher_start(&d, &fns, "test", &w, err, sizeof err), 0) << err;
  dsc_member m = member("d1", 100);
  dsc_registrar *r = nullptr;
  ASSERT_EQ(dsc_registrar_start(&d, &m, "d1", &r, err, sizeof err), 0) << err;
  ASSERT_GE(seen.wait_for(1), 0);
  EXPECT_TRUE(dsc_registrar_registered(r));
  usleep(2500000); // past the TTL: the keep-alive holds it
  ASSERT_EQ(marker(e.url, seen, 1), 0);
  EXPECT_EQ(seen.get(), (std::vector<std::string>{"join d1 100"}));
  // a restart: the same key, a new incarnation (the old process's lease is revoked or lapses)
  dsc_registrar *r2 = nullptr;
  m.incarnation = 101;
  ASSERT_EQ(dsc_registrar_start(&d, &m, "d1", &r2, err, sizeof err), 0) << err;
  ASSERT_GE(seen.wait_for(2), 0);
  EXPECT_EQ(seen.get()[1], "join d1 101");
  dsc_registrar_stop(r2); // revoked: gone at once, not after the TTL
  int64_t ms = seen.wait_for(3, 1000);
  EXPECT_GE(ms, 0) << "the revoke is seen at once";
  EXPECT_EQ(seen.get().back(), "leave d1");
  dsc_registrar_stop(r); // its lease no longer holds the key: nothing more
  ASSERT_EQ(marker(e.url, seen, 1), 0);
  EXPECT_EQ(seen.get().size(), 3u);
  dsc_watcher_stop(w);
}

TEST(Membership, ExpiresWithoutKeepAliveAndSurvivesAnOutage) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  cfg_discovery d = discovery(e.url);
  char err[512];
  // A lease nobody keeps alive: what a worker killed with -9 leaves behind.
  {
    dsc_etcd *c = client(e.url);
    ASSERT_TRUE(c);
    int64_t lease;
    ASSERT_EQ(dsc_lease_grant(c, 2, &lease, err, sizeof err), 0);
    ASSERT_EQ(put_member(c, "/dserve/t/workers/decode/dead", member("dead", 7), lease), 0);
    dsc_etcd_free(c);
  }
  Seen seen;
  dsc_watch_fns fns = {Seen::join, Seen::leave, &seen};
  dsc_watcher *w = nullptr;
  ASSERT_EQ(dsc_watcher_start(&d, &fns, "test", &w, err, sizeof err), 0) << err;
  ASSERT_GE(seen.wait_for(1), 0);
  int64_t ms = seen.wait_for(2, 4000);
  ASSERT_GE(ms, 0);
  EXPECT_LE(ms, 3000) << "gone within the TTL + 1 s";
  EXPECT_EQ(seen.get(), (std::vector<std::string>{"join dead 7", "leave dead"}));
  // An outage: the live member stays through it; one that registers meanwhile is seen once etcd is back.
  dsc_member a = member("a", 1), b = member("b", 2);
  dsc_registrar *ra = nullptr, *rb = nullptr;
  ASSERT_EQ(dsc_registrar_start(&d, &a, "a", &ra, err, sizeof err), 0);
  ASSERT_GE(seen.wait_for(3), 0);
  e.kill9();
  ASSERT_EQ(dsc_registrar_start(&d, &b, "b", &rb, err, sizeof err), 0);
  usleep(3000000); // longer than the TTL
  EXPECT_EQ(seen.get().size(), 3u) << "nothing changes while etcd is away";
  ASSERT_TRUE(e.start());
  int64_t t0 = utl_now_ms();
  ASSERT_GE(seen.wait_for(4, 5000), 0);
  EXPECT_LE(utl_now_ms() - t0, 2000) << "a change made while etcd was down is seen within 2 s of its return";
  EXPECT_EQ(seen.get()[3], "join b 2");
  usleep(2500000); // past the TTL since etcd came back: a lapsed lease would have been revoked by now
  ASSERT_EQ(marker(e.url, seen, 1), 0);
  EXPECT_EQ(seen.get().size(), 4u) << "a's record survived the outage (etcd renews leases when it comes back)";
  dsc_registrar_stop(ra);
  dsc_registrar_stop(rb);
  dsc_watcher_stop(w);
}

// Two records naming one worker (another key: a second worker of the same name, or a forged record): the member that
// holds the name keeps it, the second is refused and changes nothing; when the first leaves, the second is
// considered again. A record the consumer refuses (another model) holds no name.
TEST(Membership, ASecondRecordOfAMembersNameIsRefusedUntilItLeaves) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  cfg_discovery d = discovery(e.url);
  char err[512];
  dsc_etcd *c = client(e.url);
  ASSERT_TRUE(c);
  auto put = [&](const char *key, const dsc_member &m) { ASSERT_EQ(put_member(c, key, m), 0) << key; };
  Seen seen;
  seen.refuse = "other";
  seen.keys = true;
  dsc_watch_fns fns = {Seen::join, Seen::leave, &seen};
  dsc_watcher *w = nullptr;
  ASSERT_EQ(dsc_watcher_start(&d, &fns, "test", &w, err, sizeof err), 0) << err;
  put("/dserve/t/workers/decode/x", member("x", 1));
  ASSERT_GE(seen.wait_for(1), 0);
  dsc_member twin = member("x", 2);
  twin.role = CFG_ROLE_PREFILL;
  twin.port = 9999;
  put("/dserve/t/workers/prefill/x", twin);
  put("/dserve/t/workers/decode/x2", member("other", 3)); // refused by the consumer: holds no name
  put("/dserve/t/workers/decode/y", member("y", 4));       // after the twin in etcd's order: the twin was seen
  ASSERT_GE(seen.wait_for(3), 0);
  EXPECT_EQ(seen.get(), (std::vector<std::string>{"join x 1", "join other 3", "join y 4"})) << "the twin changed nothing";
  put("/dserve/t/workers/decode/x", member("x", 5)); // the holder's own record may change (a restart)
  ASSERT_GE(seen.wait_for(4), 0);
  EXPECT_EQ(seen.get().back(), "join x 5");
  ASSERT_EQ(dsc_delete(c, "/dserve/t/workers/decode/x", 0, err, sizeof err), 0) << err;
  ASSERT_GE(seen.wait_for(6), 0);
  std::vector<std::string> ev = seen.get();
  EXPECT_EQ(ev[4], "leave x /dserve/t/workers/decode/x");
  EXPECT_EQ(ev[5], "join x 2") << "the twin, considered again once the name is free";
  // a watcher that starts now gives a name to its oldest record, though another key naming it sorts first
  put("/dserve/t/workers/prefill/z", member("z", 6));
  put("/dserve/t/workers/decode/z", member("z", 7));
  put("/dserve/t/workers/both/z", member("z", 8));
  ASSERT_GE(seen.wait_for(7), 0);
  Seen later;
  dsc_watch_fns later_fns = {Seen::join, Seen::leave, &later};
  dsc_watcher *w2 = nullptr;
  ASSERT_EQ(dsc_watcher_start(&d, &later_fns, "test", &w2, err, sizeof err), 0) << err;
  ASSERT_GE(later.wait_for(4), 0);
  ev = later.get();
  std::sort(ev.begin(), ev.end()); // the range's order
  EXPECT_EQ(ev, (std::vector<std::string>{"join other 3", "join x 2", "join y 4", "join z 6"}));
  EXPECT_EQ(seen.get().back(), "join z 6");
  dsc_watcher_stop(w2);
  dsc_etcd_free(c);
  dsc_watcher_stop(w);
}

// A three-member etcd with one member killed changes nothing: the registrar's keep-alive and the watcher go on
// through the others, and a member registered after the loss is seen.
// Two honest workers of one name and role write one key (issue 39 item 2): the second must not overwrite the live
// first. It is refused at start, naming the holder's address, where something answers (a listener stands for the
// first worker); the record stays the first's. A restart at the holder's own address replaces it at once; so does
// one elsewhere once nothing answers at the holder's (a crashed worker whose lease has not lapsed); once the holder
// leaves the name is free.
TEST(Membership, ASecondWorkerOfTheSameNameAndRoleIsRefused) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e;
  ASSERT_TRUE(e.start());
  cfg_discovery d = discovery(e.url);
  char err[512];
  // the first worker's control port: a listener on an ephemeral port
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  ASSERT_EQ(bind(lfd, (sockaddr *)&sa, sizeof sa), 0);
  ASSERT_EQ(listen(lfd, 4), 0);
  ASSERT_EQ(getsockname(lfd, (sockaddr *)&sa, &sl), 0);
  dsc_member a = member("w0", 1), b = member("w0", 2), c3 = member("w0", 4);
  a.port = ntohs(sa.sin_port);
  b.port = a.port == 9101 ? 9102 : 9101;
  c3.port = b.port + 1;
  dsc_registrar *ra = nullptr, *rb = nullptr, *ra2 = nullptr, *rc3 = nullptr;
  ASSERT_EQ(dsc_registrar_start(&d, &a, "first", &ra, err, sizeof err), 0) << err;
  EXPECT_EQ(dsc_registrar_start(&d, &b, "second", &rb, err, sizeof err), -1);
  EXPECT_EQ(rb, nullptr);
  EXPECT_NE(std::string(err).find("registered in etcd (key /dserve/t/workers/decode/w0) by another live worker at "
                                  "127.0.0.1:" + std::to_string(a.port)), std::string::npos) << err;
  dsc_etcd *c = client(e.url);
  ASSERT_NE(c, nullptr);
  auto holder = [&]() {
    dsc_kv *kvs = nullptr;
    int n = 0;
    int64_t rev = 0;
    dsc_member m{};
    char e2[256];
    if (dsc_range(c, "/dserve/t/workers/decode/w0", 0, &kvs, &n, &rev, e2, sizeof e2) || n != 1 ||
        dsc_member_decode(kvs[0].value, kvs[0].value_len, &m, e2, sizeof e2))
      m.port = -1;
    dsc_kvs_free(kvs, n);
    return m;
  };
  EXPECT_EQ(holder().port, a.port);
  EXPECT_EQ(holder().incarnation, 1);
  // the first restarted at its own address: replaced at once
  a.incarnation = 3;
  ASSERT_EQ(dsc_registrar_start(&d, &a, "first-again", &ra2, err, sizeof err), 0) << err;
  EXPECT_EQ(holder().incarnation, 3);
  // it crashes (its port closes, its lease lives on): a restart on another port replaces the record at once
  close(lfd);
  ASSERT_EQ(dsc_registrar_start(&d, &c3, "restarted", &rc3, err, sizeof err), 0) << err;
  EXPECT_EQ(holder().port, c3.port);
  dsc_registrar_stop(ra); // the old processes' leases no longer hold the key
  dsc_registrar_stop(ra2);
  dsc_registrar_stop(rc3); // revoked: the key goes, the name is free
  ASSERT_EQ(dsc_registrar_start(&d, &b, "second", &rb, err, sizeof err), 0) << err;
  EXPECT_EQ(holder().port, b.port);
  dsc_registrar_stop(rb);
  dsc_etcd_free(c);
}

TEST(Membership, ThreeMemberEtcdLosesOne) {
  SKIP_WITHOUT_ETCD();
  etcdtest::Etcd e[3];
  std::string all;
  for (int i = 0; i < 3; i++) all += (i ? "," : "") + std::string("m") + std::to_string(i) + "=" + e[i].peer_url();
  for (int i = 0; i < 3; i++) {
    e[i].name = "m" + std::to_string(i);
    e[i].initial_cluster = all;
    e[i].launch(); // all three first: none answers before a quorum is up
  }
  for (int i = 0; i < 3; i++) ASSERT_TRUE(e[i].wait_up()) << i;
  cfg_discovery d = discovery(e[0].url);
  for (int i = 1; i < 3; i++) snprintf(d.etcd[i], sizeof d.etcd[i], "%s", e[i].url.c_str());
  d.n_etcd = 3;
  Seen seen;
  dsc_watch_fns fns = {Seen::join, Seen::leave, &seen};
  dsc_watcher *w = nullptr;
  char err[512];
  ASSERT_EQ(dsc_watcher_start(&d, &fns, "test", &w, err, sizeof err), 0) << err;
  dsc_member a = member("a", 1), b = member("b", 2);
  dsc_registrar *ra = nullptr, *rb = nullptr;
  ASSERT_EQ(dsc_registrar_start(&d, &a, "a", &ra, err, sizeof err), 0) << err;
  ASSERT_GE(seen.wait_for(1), 0);
  e[0].kill9(); // the first endpoint: the one both were using
  usleep(4000000); // twice the TTL
  EXPECT_EQ(seen.get(), (std::vector<std::string>{"join a 1"})) << "a stays a member";
  ASSERT_EQ(dsc_registrar_start(&d, &b, "b", &rb, err, sizeof err), 0) << err;
  EXPECT_GE(seen.wait_for(2, 5000), 0);
  EXPECT_EQ(seen.get().back(), "join b 2");
  dsc_registrar_stop(ra);
  EXPECT_GE(seen.wait_for(3, 3000), 0);
  EXPECT_EQ(seen.get().back(), "leave a");
  dsc_registrar_stop(rb);
  dsc_watcher_stop(w);
}
