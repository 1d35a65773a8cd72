// tests/kvxfer/test_faults.cc: faults with a receiver in a child process (killed, stalled, slow, cut, requests left half sent), API and metadata errors.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "kvx_test_util.h"

using namespace kvxt;

namespace {

// ---- faults with a receiver in a child process ----
struct Child {
  pid_t pid = -1;
  uint64_t dst = 0;
  size_t len = 0;
  int res_fd = -1;
};

// Child: tcp receiver with one len-byte region; when it gets notification "check" it verifies pattern seed 77 and
// writes 1/0 to the result pipe. Runs until killed.
// Forks before the caller makes any agent (no threads exist at fork time).
Child spawn_receiver(size_t len, std::vector<uint8_t> *md_blob) {
  Child c;
  int md[2], res[2];
  if (pipe(md) || pipe(res)) return c;
  c.pid = fork();
  if (c.pid == 0) {
    char err[256];
    kvx_opts o = {};
    o.backend = "tcp";
    o.secret = "s3cret";
    o.timeout_ms = 10000;
    kvx_agent *b = kvx_agent_new("child", &o, err, sizeof err);
    uint8_t *dst = (uint8_t *)calloc(1, len);
    kvx_region *r;
    if (!b || !dst || kvx_register(b, dst, len, KVX_MEM_HOST, &r, err, sizeof err) || !md_to_fd(b, md[1])) _exit(3);
    for (;;) {
      auto ns = wait_notifs(b, 1, 100000);
      if (ns.size() == 1 && ns[0] == "check") {
        std::vector<uint8_t> want(len);
        fill(want.data(), len, 77);
        uint8_t ok = memcmp(want.data(), dst, len) == 0;
        write_all(res[1], &ok, 1);
      }
    }
  }
  close(md[1]);
  close(res[1]);
  *md_blob = recv_blob(md[0]);
  if (md_blob->empty()) {
    kill(c.pid, SIGKILL);
    reap(c.pid);
    c.pid = -1;
  }
  close(md[0]);
  c.res_fd = res[0];
  c.len = len;
  return c;
}

struct FaultRig {
  kvx_agent *a;
  std::vector<uint8_t> src;
  kvx_region *rs = nullptr;
  Child ch;
  FaultRig(int timeout_ms, size_t len) {
    std::vector<uint8_t> blob;
    ch = spawn_receiver(len, &blob);
    a = agent("parent", "tcp", nullptr, "s3cret", timeout_ms);
    src.resize(len);
    fill(src.data(), len, 77);
    char err[256], name[KVX_MAX_NAME];
    if (kvx_register(a, src.data(), len, KVX_MEM_HOST, &rs, err, sizeof err)) ADD_FAILURE() << err;
    if (ch.pid > 0 && kvx_load_remote_md(a, blob.data(), blob.size(), name, sizeof name, err, sizeof err)) {
      ADD_FAILURE() << err;
      kill(ch.pid, SIGKILL);
      reap(ch.pid);
      ch.pid = -1;
    }
    pthread_mutex_lock(&a->mu);
    ch.dst = a->peers ? a->peers->regions[0].addr : 0;
    pthread_mutex_unlock(&a->mu);
    // Connect and authenticate first, so that the faults below hit a transfer, not the handshake.
    kvx_desc l = {(uint64_t)(uintptr_t)src.data(), 4096}, r = {ch.dst, 4096};
    kvx_xfer *x = nullptr;
    if (ch.pid > 0 && !kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "child", nullptr, 0, &x, err, sizeof err)) {
      post_xfer(x);
      if (wait_xfer(a, x, 5000) != KVX_DONE) ADD_FAILURE() << "warm-up write: " << kvx_xfer_error(x);
    }
    kvx_xfer_free(x);
  }
  ~FaultRig() {
    if (ch.pid > 0) {
      kill(ch.pid, SIGKILL);
      reap(ch.pid);
    }
    if (ch.res_fd >= 0) close(ch.res_fd);
    kvx_agent_free(a);
  }
  kvx_xfer *write(const char *notif) {
    kvx_desc l = {(uint64_t)(uintptr_t)src.data(), src.size()}, r = {ch.dst, src.size()};
    kvx_xfer *x = nullptr;
    char err[256];
    if (kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "child", notif, notif ? strlen(notif) : 0, &x, err, sizeof err))
      ADD_FAILURE() << err;
    else
      post_xfer(x);
    return x;
  }
};

TEST(KvxFaults, PeerKilledMidTransferFailsWithinTimeout) {
  FaultRig f(1500, 64 << 20);
  ASSERT_GT(f.ch.pid, 0);
  kill(f.ch.pid, SIGSTOP);  // it cannot drain: the transfer stays in flight
  std::vector<kvx_xfer *> xs;
  for (int i = 0; i < 3; i++) xs.push_back(f.write(nullptr));
  usleep(200000);
  for (auto *x : xs) EXPECT_EQ(kvx_xfer_poll(x), KVX_PENDING);
  int64_t t0 = kvx_now_ms();
  kill(f.ch.pid, SIGKILL);
  for (auto *x : xs) {
    EXPECT_LT(wait_xfer(f.a, x, 5000), 0);
    EXPECT_NE(std::string(kvx_xfer_error(x)).find("child"), std::string::npos) << kvx_xfer_error(x);
  }
  EXPECT_LT(kvx_now_ms() - t0, 1500 + 1000);
  for (auto *x : xs) kvx_xfer_free(x);
  reap(f.ch.pid);
  f.ch.pid = -1;
}

TEST(KvxFaults, StalledPeerFailsWithinTimeout) {
  FaultRig f(700, 32 << 20);
  ASSERT_GT(f.ch.pid, 0);
  kill(f.ch.pid, SIGSTOP);
  int64_t t0 = kvx_now_ms();
  kvx_xfer *x = f.write(nullptr);
  EXPECT_LT(wait_xfer(f.a, x, 10000), 0);
  int64_t dt = kvx_now_ms() - t0;
  EXPECT_GE(dt, 600);
  EXPECT_LT(dt, 700 + 1500);
  EXPECT_NE(std::string(kvx_xfer_error(x)).find("stalled"), std::string::npos) << kvx_xfer_error(x);
  kvx_xfer_free(x);
}

TEST(KvxFaults, SlowReceiverStillCompletes) {
  FaultRig f(3000, 32 << 20);
  ASSERT_GT(f.ch.pid, 0);
  kill(f.ch.pid, SIGSTOP);
  kvx_xfer *x = f.write("check");
  usleep(600000);  // stopped for a while, but less than the timeout
  EXPECT_EQ(kvx_xfer_poll(x), KVX_PENDING);
  kill(f.ch.pid, SIGCONT);
  EXPECT_EQ(wait_xfer(f.a, x, 10000), KVX_DONE) << kvx_xfer_error(x);
  uint8_t ok = 0;
  ASSERT_TRUE(read_all(f.ch.res_fd, &ok, 1));
  EXPECT_EQ(ok, 1);
  kvx_xfer_free(x);
}

// Small requests start on the posting thread; against a stopped receiver the socket fills mid-frame, and the
// connection's worker finishes what the posting thread began, in order, with later requests queued behind it.
// Whether pid is stopped (SIGSTOP takes effect when the process next runs, not at kill()).
bool wait_stopped(pid_t pid, int ms) {
  for (int64_t end = kvx_now_ms() + ms; kvx_now_ms() < end; usleep(1000)) {
    char path[64], buf[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    if (p && p[1] == ' ' && p[2] == 'T') return true;
  }
  return false;
}

TEST(KvxFaults, RequestsStartedOnThePostingThreadResume) {
  const size_t slice = 256 << 10, n = 48;  // more than loopback's socket buffers hold
  FaultRig f(5000, slice * n);
  ASSERT_GT(f.ch.pid, 0);
  kill(f.ch.pid, SIGSTOP);
  ASSERT_TRUE(wait_stopped(f.ch.pid, 3000));
  std::vector<kvx_xfer *> xs;
  char err[256];
  for (size_t i = 0; i < n; i++) {
    kvx_desc l = {(uint64_t)(uintptr_t)f.src.data() + i * slice, slice}, r = {f.ch.dst + i * slice, slice};
    kvx_xfer *x = nullptr;
    ASSERT_EQ(kvx_xfer_new(f.a, KVX_WRITE, &l, 1, &r, 1, "child", nullptr, 0, &x, err, sizeof err), 0) << err;
    int64_t t0 = kvx_now_ns();
    EXPECT_EQ(kvx_xfer_post(x), 0) << kvx_xfer_error(x);
    EXPECT_LT(kvx_now_ns() - t0, 500000000) << "a post blocked on a full socket";
    xs.push_back(x);
  }
  ASSERT_EQ(kvx_notify(f.a, "child", "check", 5, err, sizeof err), 0) << err;  // behind every write
  usleep(300000);
  for (auto *x : xs) EXPECT_EQ(kvx_xfer_poll(x), KVX_PENDING);
  kill(f.ch.pid, SIGCONT);
  for (auto *x : xs) EXPECT_EQ(wait_xfer(f.a, x, 10000), KVX_DONE) << kvx_xfer_error(x);
  uint8_t ok = 0;
  ASSERT_TRUE(read_all(f.ch.res_fd, &ok, 1));
  EXPECT_EQ(ok, 1) << "the receiver saw wrong bytes";
  for (auto *x : xs) kvx_xfer_free(x);
}

// A proxy between the agents that cuts both directions after `cut` bytes.
struct CutProxy {
  int lfd = -1, port = 0;
  std::thread th;
  std::atomic<bool> stop{false};
  CutProxy(int to_port, size_t cut) {
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa = {};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(lfd, (sockaddr *)&sa, sizeof sa);
    listen(lfd, 4);
    socklen_t sl = sizeof sa;
    getsockname(lfd, (sockaddr *)&sa, &sl);
    port = ntohs(sa.sin_port);
    th = std::thread([this, to_port, cut] {
      int c = accept(lfd, nullptr, nullptr);
      char err[256];
      int s = kvx_tcp_connect("127.0.0.1", to_port, 2000, err, sizeof err);
      size_t moved = 0;
      std::vector<char> buf(65536);
      while (c >= 0 && s >= 0 && moved < cut && !stop) {
        pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
        if (poll(p, 2, 100) <= 0) continue;
        for (int k = 0; k < 2; k++)
          if (p[k].revents) {
            ssize_t n = recv(p[k].fd, buf.data(), buf.size(), MSG_DONTWAIT);
            if (n <= 0) {
              moved = cut;
              break;
            }
            kvx_fd_send_all(p[1 - k].fd, buf.data(), (size_t)n, 2000);
            if (k == 0) moved += (size_t)n;
          }
      }
      if (c >= 0) close(c);
      if (s >= 0) close(s);
    });
  }
  ~CutProxy() {
    stop = true;
    shutdown(lfd, SHUT_RDWR);
    th.join();
    close(lfd);
  }
};

TEST(KvxFaults, ConnectionCutFailsThenReconnects) {
  kvx_agent *a = agent("a", "tcp", nullptr, "s3cret", 5000), *b = agent("b", "tcp");
  ASSERT_TRUE(a && b);
  size_t len = 16 << 20;
  std::vector<uint8_t> src(len), dst(len);
  fill(src.data(), len, 5);
  kvx_region *r1, *r2;
  char err[256];
  ASSERT_EQ(kvx_register(a, src.data(), len, KVX_MEM_HOST, &r1, err, sizeof err), 0);
  ASSERT_EQ(kvx_register(b, dst.data(), len, KVX_MEM_HOST, &r2, err, sizeof err), 0);
  ASSERT_TRUE(learn(a, b));
  {
    CutProxy px(kvx_agent_port(b), 1 << 20);
    ASSERT_EQ(kvx_set_peer_endpoint(a, "b", "127.0.0.1", px.port, err, sizeof err), 0);
    kvx_desc l = {(uint64_t)(uintptr_t)src.data(), len}, r = {(uint64_t)(uintptr_t)dst.data(), len};
    kvx_xfer *x;
    ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "b", "x", 1, &x, err, sizeof err), 0);
    int64_t t0 = kvx_now_ms();
    post_xfer(x);
    EXPECT_LT(wait_xfer(a, x, 10000), 0);
    EXPECT_LT(kvx_now_ms() - t0, 3000) << "a cut connection should fail at once, not at the timeout";
    EXPECT_NE(std::string(kvx_xfer_error(x)).find("'b'"), std::string::npos) << kvx_xfer_error(x);
    kvx_xfer_free(x);
  }
  EXPECT_EQ(wait_notifs(b, 1, 300).size(), 0u) << "a notification came for a write that did not finish";
  // Direct again: a new connection is made and the same request shape succeeds.
  ASSERT_EQ(kvx_set_peer_endpoint(a, "b", "127.0.0.1", kvx_agent_port(b), err, sizeof err), 0);
  kvx_desc l = {(uint64_t)(uintptr_t)src.data(), len}, r = {(uint64_t)(uintptr_t)dst.data(), len};
  kvx_xfer *x;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "b", "y", 1, &x, err, sizeof err), 0);
  post_xfer(x);
  EXPECT_EQ(wait_xfer(a, x, 10000), KVX_DONE) << kvx_xfer_error(x);
  EXPECT_EQ(src, dst);
  kvx_xfer_free(x);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

TEST(KvxFaults, InvalidatedPeerFailsPendingAndRefusesNew) {
  kvx_agent *a = agent("a", "tcp"), *b = agent("b", "tcp");
  std::vector<uint8_t> src(4096), dst(4096);
  kvx_region *r1, *r2;
  char err[256];
  ASSERT_EQ(kvx_register(a, src.data(), 4096, KVX_MEM_HOST, &r1, err, sizeof err), 0);
  ASSERT_EQ(kvx_register(b, dst.data(), 4096, KVX_MEM_HOST, &r2, err, sizeof err), 0);
  ASSERT_TRUE(learn(a, b));
  kvx_desc l = {(uint64_t)(uintptr_t)src.data(), 4096}, r = {(uint64_t)(uintptr_t)dst.data(), 4096};
  kvx_xfer *x;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "b", nullptr, 0, &x, err, sizeof err), 0);
  kvx_invalidate_peer(a, "b");
  EXPECT_LT(kvx_xfer_post(x), 0);
  EXPECT_NE(std::string(kvx_xfer_error(x)).find("unknown peer"), std::string::npos) << kvx_xfer_error(x);
  EXPECT_EQ(kvx_peer_backend(a, "b"), nullptr);
  EXPECT_LT(kvx_notify(a, "b", "x", 1, err, sizeof err), 0);
  kvx_xfer_free(x);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

// ---- API and metadata errors ----
TEST(KvxApi, BadArgumentsAndMetadata) {
  char err[256];
  EXPECT_EQ(kvx_agent_new("bad name!", nullptr, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("name"), std::string::npos);
  kvx_opts o = {};
  o.backend = "carrier-pigeon";
  EXPECT_EQ(kvx_agent_new("x", &o, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("unknown backend"), std::string::npos);
  o.backend = "tcp";
  EXPECT_EQ(kvx_agent_new("x", &o, err, sizeof err), nullptr); // no secret
  EXPECT_NE(std::string(err).find("shared secret is required"), std::string::npos) << err;
  o.secret = "";
  EXPECT_EQ(kvx_agent_new("x", &o, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("shared secret is required"), std::string::npos) << err;
  o.secret = "s3cret";
  o.listen_host = "not-an-ip";
  EXPECT_EQ(kvx_agent_new("x", &o, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("listen address"), std::string::npos) << err;
  EXPECT_EQ(kvx_host_alloc(0, err, sizeof err), nullptr);
  kvx_host_free(nullptr, 0);
  kvx_agent_free(nullptr);
  kvx_xfer_free(nullptr);

  kvx_agent *a = agent("a", "tcp"), *b = agent("b", "tcp");
  std::vector<uint8_t> m(8192);
  kvx_region *ra, *rb;
  EXPECT_LT(kvx_register(a, nullptr, 10, KVX_MEM_HOST, &ra, err, sizeof err), 0);
  EXPECT_LT(kvx_register(a, m.data(), 10, 7, &ra, err, sizeof err), 0);
  ASSERT_EQ(kvx_register(a, m.data(), 4096, KVX_MEM_HOST, &ra, err, sizeof err), 0);
  ASSERT_EQ(kvx_register(b, m.data() + 4096, 4096, KVX_MEM_HOST, &rb, err, sizeof err), 0);
  void *blob;
  size_t len;
  ASSERT_EQ(kvx_pack_md(b, &blob, &len, err, sizeof err), 0);
  std::vector<uint8_t> md((uint8_t *)blob, (uint8_t *)blob + len);
  free(blob);
  char name[KVX_MAX_NAME];
  EXPECT_LT(kvx_load_remote_md(a, md.data(), 10, name, sizeof name, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("truncated"), std::string::npos);
  auto bad = md;
  bad[0] ^= 1;
  EXPECT_LT(kvx_load_remote_md(a, bad.data(), bad.size(), name, sizeof name, err, sizeof err), 0);
  EXPECT_LT(kvx_load_remote_md(a, md.data(), md.size() - 1, name, sizeof name, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("does not match"), std::string::npos) << err;
  std::vector<uint8_t> longer = md;
  longer.resize(md.size() + 40);
  EXPECT_LT(kvx_load_remote_md(a, longer.data(), longer.size(), name, sizeof name, err, sizeof err), 0);
  // Random bit flips never crash the loader.
  std::mt19937 rng(9);
  for (int i = 0; i < 500; i++) {
    auto f = md;
    f[rng() % f.size()] ^= (uint8_t)(1 + rng() % 255);
    // Refused or (a flipped byte in a name or a port) loaded: either is right; the point is no crash and no hang.
    utl_ignore_status(kvx_load_remote_md(a, f.data(), f.size(), name, sizeof name, err, sizeof err));
  }
  kvx_invalidate_peer(a, "b");
  ASSERT_EQ(kvx_load_remote_md(a, md.data(), md.size(), name, sizeof name, err, sizeof err), 0) << err;
  ASSERT_EQ(kvx_pack_md(a, &blob, &len, err, sizeof err), 0);
  EXPECT_LT(kvx_load_remote_md(a, blob, len, name, sizeof name, err, sizeof err), 0);  // its own
  free(blob);

  uint64_t la = (uint64_t)(uintptr_t)m.data(), lb = la + 4096;
  kvx_desc l = {la, 4096}, r = {lb, 4096}, r_half = {lb, 2048}, l_out = {la + 100, 4096}, r_out = {lb + 1, 4096};
  kvx_xfer *x;
  EXPECT_LT(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "nobody", nullptr, 0, &x, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("unknown peer"), std::string::npos);
  EXPECT_LT(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r_half, 1, "b", nullptr, 0, &x, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("bytes"), std::string::npos);
  EXPECT_LT(kvx_xfer_new(a, KVX_WRITE, &l_out, 1, &r, 1, "b", nullptr, 0, &x, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("not in a registered region"), std::string::npos);
  EXPECT_LT(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r_out, 1, "b", nullptr, 0, &x, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("exported"), std::string::npos);
  std::vector<uint8_t> huge(KVX_MAX_NOTIF + 1);
  EXPECT_LT(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "b", huge.data(), huge.size(), &x, err, sizeof err), 0);
  EXPECT_LT(kvx_xfer_new(a, 9, &l, 1, &r, 1, "b", nullptr, 0, &x, err, sizeof err), 0);
  EXPECT_LT(kvx_notify(a, "b", huge.data(), huge.size(), err, sizeof err), 0);
  // A transfer that is fine on the sender side but the region was deregistered on the receiver: refused.
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "b", nullptr, 0, &x, err, sizeof err), 0);
  kvx_deregister(b, rb);
  post_xfer(x);
  EXPECT_LT(wait_xfer(a, x, 5000), 0);
  EXPECT_NE(std::string(kvx_xfer_error(x)).find("unknown region key"), std::string::npos) << kvx_xfer_error(x);
  kvx_xfer_free(x);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

// A write far larger than the socket buffers, refused by the receiver before a byte lands: the sender's send fails
// mid-frame, yet the request reports the receiver's reason (its ERR frame), not just a broken connection.
TEST(KvxApi, RefusedLargeWriteReportsTheReceiversReason) {
  kvx_agent *a = agent("a", "tcp"), *b = agent("b", "tcp");
  ASSERT_TRUE(a && b);
  const size_t len = 32 << 20;
  std::vector<uint8_t> src(len, 7), dst(len, 0);
  kvx_region *ra, *rb;
  char err[256];
  ASSERT_EQ(kvx_register(a, src.data(), len, KVX_MEM_HOST, &ra, err, sizeof err), 0);
  ASSERT_EQ(kvx_register(b, dst.data(), len, KVX_MEM_HOST, &rb, err, sizeof err), 0);
  ASSERT_TRUE(learn(a, b));
  kvx_deregister(b, rb);
  kvx_desc l = {(uint64_t)(uintptr_t)src.data(), len}, r = {(uint64_t)(uintptr_t)dst.data(), len};
  kvx_xfer *x;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "b", "n", 1, &x, err, sizeof err), 0);
  post_xfer(x);
  EXPECT_LT(wait_xfer(a, x, 10000), 0);
  EXPECT_NE(std::string(kvx_xfer_error(x)).find("unknown region key"), std::string::npos) << kvx_xfer_error(x);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), (long)len) << "bytes landed in a deregistered region";
  EXPECT_EQ(wait_notifs(b, 1, 200).size(), 0u);
  kvx_xfer_free(x);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

TEST(KvxApi, AutoPicksShmOnOneHostAndTcpForTcpOnlyPeers) {
  kvx_agent *a = agent("a", "auto"), *b = agent("b", "auto"), *c = agent("c", "tcp");
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(learn(a, b));
  ASSERT_TRUE(learn(a, c));
  EXPECT_STREQ(kvx_peer_backend(a, "b"), "shm");
  EXPECT_STREQ(kvx_peer_backend(a, "c"), "tcp");
  // An shm-only agent cannot reach a tcp-only peer: said at load time.
  kvx_agent *s = agent("s", "shm");
  void *blob;
  size_t len;
  char err[256], name[KVX_MAX_NAME];
  ASSERT_EQ(kvx_pack_md(c, &blob, &len, err, sizeof err), 0);
  EXPECT_LT(kvx_load_remote_md(s, blob, len, name, sizeof name, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("does not offer the shm backend"), std::string::npos) << err;
  free(blob);
  kvx_agent_free(s);
  kvx_agent_free(a);
  kvx_agent_free(b);
  kvx_agent_free(c);
}

TEST(KvxApi, ShmNeedsHostAllocMemoryOnTheReceiver) {
  kvx_agent *a = agent("a", "shm"), *b = agent("b", "shm");
  std::vector<uint8_t> src(4096), plain(4096);
  kvx_region *r1, *r2;
  char err[256];
  ASSERT_EQ(kvx_register(a, src.data(), 4096, KVX_MEM_HOST, &r1, err, sizeof err), 0);
  ASSERT_EQ(kvx_register(b, plain.data(), 4096, KVX_MEM_HOST, &r2, err, sizeof err), 0);
  ASSERT_TRUE(learn(a, b));
  kvx_desc l = {(uint64_t)(uintptr_t)src.data(), 4096}, r = {(uint64_t)(uintptr_t)plain.data(), 4096};
  kvx_xfer *x;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "b", nullptr, 0, &x, err, sizeof err), 0);
  post_xfer(x);
  EXPECT_LT(wait_xfer(a, x, 5000), 0);
  EXPECT_NE(std::string(kvx_xfer_error(x)).find("kvx_host_alloc"), std::string::npos) << kvx_xfer_error(x);
  kvx_xfer_free(x);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

}  // namespace
