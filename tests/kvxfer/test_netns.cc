// tests/kvxfer/test_netns.cc: tcp between two network namespaces the test creates (veth pair, 10.x addresses inside them only).
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>

#include "kvx_test_util.h"

using namespace kvxt;

namespace {

int sh(const std::string &cmd) { return system((cmd + " >/dev/null 2>&1").c_str()); }

struct Netns {
  std::string a, b;
  bool ok = false;
  std::string why;
  Netns() {
    int id = (int)getpid() % 100000;
    a = "kvxA" + std::to_string(id);
    b = "kvxB" + std::to_string(id);
    std::string va = "kva" + std::to_string(id), vb = "kvb" + std::to_string(id);
    std::vector<std::string> cmds = {
        "ip netns add " + a,
        "ip netns add " + b,
        "ip link add " + va + " type veth peer name " + vb,
        "ip link set " + va + " netns " + a,
        "ip link set " + vb + " netns " + b,
        "ip -n " + a + " addr add 10.213.7.1/24 dev " + va,
        "ip -n " + b + " addr add 10.213.7.2/24 dev " + vb,
        "ip -n " + a + " link set " + va + " up",
        "ip -n " + b + " link set " + vb + " up",
        "ip -n " + a + " link set lo up",
        "ip -n " + b + " link set lo up",
    };
    for (auto &c : cmds)
      if (sh(c)) {
        why = "'" + c + "' failed";
        sh("ip link del " + va);
        return;
      }
    ok = true;
  }
  ~Netns() {
    sh("ip netns del " + a);  // the veth pair goes with its namespaces
    sh("ip netns del " + b);
  }
};

bool enter(const std::string &ns) {
  int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc == 0;
}

kvx_agent *ns_agent(const char *name, const char *host) {
  kvx_opts o = {};
  o.backend = "tcp";
  o.secret = "s3cret";
  o.timeout_ms = 5000;
  o.listen_host = host;
  char err[256];
  kvx_agent *a = kvx_agent_new(name, &o, err, sizeof err);
  if (!a) fprintf(stderr, "ns agent %s: %s\n", name, err);
  return a;
}

TEST(KvxNetns, TcpAcrossTwoNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  if (sh("ip -V")) GTEST_SKIP() << "the 'ip' tool is missing";
  Netns ns;
  if (!ns.ok) GTEST_SKIP() << "cannot build the namespaces here: " << ns.why;
  const size_t slot = 32768, n = 128, sz = slot * n;
  int md1[2], md2[2];
  ASSERT_EQ(pipe(md1), 0);
  ASSERT_EQ(pipe(md2), 0);
  pid_t recv_pid = fork();
  ASSERT_GE(recv_pid, 0);
  if (recv_pid == 0) {  // receiver in namespace A
    if (!enter(ns.a)) _exit(20);
    kvx_agent *b = ns_agent("ns-recv", "10.213.7.1");
    std::vector<uint8_t> dst(sz);
    kvx_region *r;
    char err[256];
    if (!b || kvx_register(b, dst.data(), sz, KVX_MEM_HOST, &r, err, sizeof err) || !md_to_fd(b, md1[1])) _exit(21);
    uint64_t sbase = 0;
    if (!read_all(md2[0], &sbase, 8)) _exit(22);
    auto ns1 = wait_notifs(b, 1, 20000);
    if (ns1.size() != 1 || ns1[0] != "written") _exit(23);
    std::vector<uint8_t> src(sz);
    fill(src.data(), sz, 31);
    Blocks bl(sbase, (uint64_t)(uintptr_t)dst.data(), n, slot, 4);
    for (size_t i = 0; i < n; i++)
      if (memcmp(src.data() + (bl.src[i].addr - sbase), (void *)(uintptr_t)bl.dst[i].addr, bl.src[i].len)) _exit(24);
    auto ns2 = wait_notifs(b, 1, 20000);
    kvx_agent_free(b);
    _exit(ns2.size() == 1 && ns2[0] == "bye" ? 0 : 25);
  }
  auto blob = recv_blob(md1[0]);
  ASSERT_FALSE(blob.empty()) << "the receiver did not start in its namespace";
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t send_pid = fork();
  ASSERT_GE(send_pid, 0);
  if (send_pid == 0) {  // sender in namespace B
    if (!enter(ns.b)) _exit(30);
    kvx_agent *a = ns_agent("ns-send", "10.213.7.2");
    char err[256], name[KVX_MAX_NAME];
    if (!a || kvx_load_remote_md(a, blob.data(), blob.size(), name, sizeof name, err, sizeof err)) _exit(31);
    std::vector<uint8_t> src(sz), back(sz);
    fill(src.data(), sz, 31);
    kvx_region *r1, *r2;
    if (kvx_register(a, src.data(), sz, KVX_MEM_HOST, &r1, err, sizeof err) ||
        kvx_register(a, back.data(), sz, KVX_MEM_HOST, &r2, err, sizeof err))
      _exit(32);
    uint64_t sbase = (uint64_t)(uintptr_t)src.data();
    write_all(go[1], &sbase, 8);
    pthread_mutex_lock(&a->mu);
    uint64_t dbase = a->peers->regions[0].addr;
    std::string host = a->peers->tcp_host;
    pthread_mutex_unlock(&a->mu);
    if (host != "10.213.7.1") _exit(33);
    Blocks bl(sbase, dbase, n, slot, 4);
    kvx_xfer *x;
    if (kvx_xfer_new(a, KVX_WRITE, bl.src.data(), n, bl.dst.data(), n, "ns-recv", "written", 7, &x, err, sizeof err))
      _exit(34);
    post_xfer(x);
    if (wait_xfer(a, x, 20000) != KVX_DONE) {
      fprintf(stderr, "netns write: %s\n", kvx_xfer_error(x));
      _exit(35);
    }
    // READ the same blocks back into other places.
    Blocks rb((uint64_t)(uintptr_t)back.data(), dbase, n, slot, 4);
    kvx_xfer *y;
    if (kvx_xfer_new(a, KVX_READ, rb.src.data(), n, bl.dst.data(), n, "ns-recv", nullptr, 0, &y, err, sizeof err))
      _exit(36);
    post_xfer(y);
    if (wait_xfer(a, y, 20000) != KVX_DONE) _exit(37);
    for (size_t i = 0; i < n; i++)
      if (memcmp((void *)(uintptr_t)rb.src[i].addr, (void *)(uintptr_t)bl.src[i].addr, bl.src[i].len)) _exit(38);
    if (kvx_notify(a, "ns-recv", "bye", 3, err, sizeof err)) _exit(39);
    usleep(100000);
    kvx_xfer_free(x);
    kvx_xfer_free(y);
    kvx_agent_free(a);
    _exit(0);
  }
  // Hand the sender's source address to the receiver so it can recompute the block list.
  uint64_t sbase = 0;
  ASSERT_TRUE(read_all(go[0], &sbase, 8, 20000));
  ASSERT_TRUE(write_all(md2[1], &sbase, 8));
  EXPECT_EQ(reap(send_pid, 30000), 0) << "sender in " << ns.b;
  EXPECT_EQ(reap(recv_pid, 30000), 0) << "receiver in " << ns.a;
  // The 10.x address lives only inside the namespace: this (root) namespace cannot bind it.
  kvx_opts o = {};
  o.backend = "tcp";
  o.listen_host = "10.213.7.1";
  o.secret = "s3cret";
  char err[256];
  kvx_agent *outside = kvx_agent_new("outside", &o, err, sizeof err);
  EXPECT_EQ(outside, nullptr);
  kvx_agent_free(outside);
  for (int fd : {md1[0], md1[1], md2[0], md2[1], go[0], go[1]}) close(fd);
}

}  // namespace
