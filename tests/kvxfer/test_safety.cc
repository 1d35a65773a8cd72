// tests/kvxfer/test_safety.cc: authentication, bad and random frames on a raw socket (single and vector frames), the private shm socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <atomic>
#include <functional>
#include <thread>

#include "kvx_test_util.h"

using namespace kvxt;

namespace {

TEST(KvxAuth, WrongSecretIsRefused) {
  for (const char *be : {"tcp", "shm"}) {
    LogCap lb;
    kvx_agent *a = agent("intruder", be, nullptr, "not-the-secret"), *b = agent("victim", be, &lb, "cluster-secret");
    ASSERT_TRUE(a && b);
    std::vector<uint8_t> src(4096, 1);
    uint8_t *dst = (uint8_t *)kvx_host_alloc(4096, nullptr, 0);
    kvx_region *rs, *rd;
    char err[256];
    ASSERT_EQ(kvx_register(a, src.data(), 4096, KVX_MEM_HOST, &rs, err, sizeof err), 0);
    ASSERT_EQ(kvx_register(b, dst, 4096, KVX_MEM_HOST, &rd, err, sizeof err), 0);
    ASSERT_TRUE(learn(a, b));
    kvx_desc l = {(uint64_t)(uintptr_t)src.data(), 4096}, r = {(uint64_t)(uintptr_t)dst, 4096};
    kvx_xfer *x;
    ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "victim", "hi", 2, &x, err, sizeof err), 0);
    post_xfer(x);
    EXPECT_LT(wait_xfer(a, x, 5000), 0) << be;
    EXPECT_NE(std::string(kvx_xfer_error(x)).find("refused authentication"), std::string::npos) << kvx_xfer_error(x);
    for (int i = 0; i < 50 && !lb.has("wrong shared secret"); i++) usleep(10000);
    EXPECT_TRUE(lb.has("wrong shared secret")) << lb.all();
    EXPECT_EQ(kvx_get_notifs(b, nullptr, 0), 0);
    kvx_notif n[1];
    EXPECT_EQ(kvx_get_notifs(b, n, 1), 0);
    for (int i = 0; i < 4096; i++) ASSERT_EQ(dst[i], 0) << be;
    EXPECT_GE(kvx_auth_failures(b), 1u) << be; // counted on the side that refused
    EXPECT_EQ(kvx_auth_failures(a), 0u) << be;
    kvx_xfer_free(x);
    kvx_agent_free(a);
    kvx_agent_free(b);
    kvx_host_free(dst, 4096);
  }
}

bool closed_by_agent(int fd, int ms, std::string *reason = nullptr);

// The handshake refuses to run without a secret on either side.
TEST(KvxAuth, EmptySecretHandshakeRefusesLocally) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  char err[256], peer[KVX_MAX_NAME];
  kvx_chan c0, c1;
  kvx_ch_init(&c0, sv[0]);
  kvx_ch_init(&c1, sv[1]);
  EXPECT_EQ(kvx_handshake_client(&c0, "c", "", 0, 1, 500, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("no shared secret"), std::string::npos) << err;
  EXPECT_EQ(kvx_handshake_server(&c1, "", 0, 1, 500, peer, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("no shared secret"), std::string::npos) << err;
  close(sv[0]);
  close(sv[1]);
}

// What an attacker with the old empty-secret configs sent: a hand-made client hello whose HMAC has an empty key.
// The agent answers "refused", closes, logs the peer's address and counts it.
TEST(KvxAuth, EmptyKeyClientIsRefusedAndCounted) {
  LogCap lb;
  kvx_agent *b = agent("victim", "tcp", &lb, "cluster-secret");
  ASSERT_TRUE(b);
  char err[256];
  int fd = kvx_tcp_connect("127.0.0.1", kvx_agent_port(b), 2000, err, sizeof err);
  ASSERT_GE(fd, 0) << err;
  uint8_t g[36];
  ASSERT_EQ(kvx_fd_recv_all(fd, g, sizeof g, 2000, 0), 0);
  uint8_t out[4 + 2 + 8 + 65], nc[32] = {7}, seal = 1;
  const char *name = "attacker";
  uint32_t magic = 0x3243564bu;  // "KVC2": handshake version 2
  uint16_t nl = (uint16_t)strlen(name);
  size_t o = 0;
  memcpy(out + o, &magic, 4), o += 4;
  memcpy(out + o, &nl, 2), o += 2;
  memcpy(out + o, name, nl), o += nl;
  memcpy(out + o, nc, 32), o += 32;
  out[o++] = seal;
  const void *parts[5] = {"kvx-client-2", g + 4, nc, name, &seal};
  size_t lens[5] = {12, 32, 32, nl, 1};
  utl_hmac_sha256("", 0, parts, lens, 5, out + o), o += 32;
  ASSERT_EQ(kvx_fd_send_all(fd, out, o, 2000), 0);
  uint8_t resp[44];
  ASSERT_EQ(kvx_fd_recv_all(fd, resp, sizeof resp, 2000, 0), 0);
  uint32_t st;
  memcpy(&st, resp + 4, 4);
  EXPECT_EQ(st, 1u); // refused
  EXPECT_TRUE(closed_by_agent(fd, 2000));
  close(fd);
  for (int i = 0; i < 100 && kvx_auth_failures(b) < 1; i++) usleep(10000);
  EXPECT_EQ(kvx_auth_failures(b), 1u);
  EXPECT_TRUE(lb.has("refused connection from 127.0.0.1:")) << lb.all();
  kvx_agent_free(b);
}

// ---- raw frames against a tcp agent ----
// A plain connection (the victims below do not seal): frames are checked above the record layer, and a raw
// client writes them as they are.
int raw_client(int port, const char *secret) {
  char err[256];
  int fd = kvx_tcp_connect("127.0.0.1", port, 2000, err, sizeof err);
  if (fd < 0) return -1;
  kvx_chan ch;
  kvx_ch_init(&ch, fd);
  if (secret && kvx_handshake_client(&ch, "raw", secret, strlen(secret), 0, 2000, err, sizeof err)) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads until the agent closes the connection; true if it did within ms. reason gets any ERR frame text.
bool closed_by_agent(int fd, int ms, std::string *reason) {
  std::string got;
  int64_t end = kvx_now_ms() + ms;
  while (kvx_now_ms() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      if (reason && got.size() > sizeof(kvx_hdr)) *reason = got.substr(sizeof(kvx_hdr));
      return true;
    }
    if (n > 0) got.append(buf, (size_t)n);
  }
  return false;
}

void send_hdr(int fd, uint16_t op, uint64_t addr, uint64_t len, uint64_t key, const void *payload = nullptr,
              size_t plen = 0, uint32_t magic = KVX_FRAME_MAGIC) {
  kvx_hdr h = {magic, op, 0, 1, addr, len, key};
  kvx_fd_send_all(fd, &h, sizeof h, 1000);
  if (plen) kvx_fd_send_all(fd, payload, plen, 1000);
}

struct Victim {
  LogCap log;
  kvx_agent *b = nullptr;
  std::vector<uint8_t> mem, ref;
  kvx_region *r = nullptr;
  const size_t R = 65536;
  uint64_t lo = 0, key = 0;
  Victim() {
    b = agent("victim", "tcp", &log, "s3cret", 3000, nullptr, true);  // plain: raw clients write frames as they are
    mem.resize(3 * R);
    fill(mem.data(), mem.size(), 42);
    ref = mem;
    char err[256];
    EXPECT_EQ(kvx_register(b, mem.data() + R, R, KVX_MEM_HOST, &r, err, sizeof err), 0) << err;
    lo = (uint64_t)(uintptr_t)(mem.data() + R);
    key = r->key;
  }
  ~Victim() { kvx_agent_free(b); }
  bool unchanged() { return mem == ref; }
};

TEST(KvxBadFrames, CraftedFramesAreRefusedAndWriteNothing) {
  Victim v;
  ASSERT_TRUE(v.b && v.r);
  int port = kvx_agent_port(v.b);
  std::vector<uint8_t> junk(4096, 0xEE);
  struct Case {
    const char *what, *log;
    std::function<void(int)> send;
  };
  uint64_t lo = v.lo, R = v.R, key = v.key;
  std::vector<Case> cases = {
      {"write past the end", "out-of-range", [&](int fd) { send_hdr(fd, KVX_F_WRITE, lo + R - 10, 100, key, junk.data(), 100); }},
      {"write before the start", "out-of-range", [&](int fd) { send_hdr(fd, KVX_F_WRITE, lo - 1, 10, key, junk.data(), 10); }},
      {"wrong key", "unknown region key", [&](int fd) { send_hdr(fd, KVX_F_WRITE, lo, 100, key ^ 1, junk.data(), 100); }},
      {"huge length (wraps)", "out-of-range", [&](int fd) { send_hdr(fd, KVX_F_WRITE, lo + 16, UINT64_MAX - 8, key, junk.data(), 4096); }},
      {"address wraps", "out-of-range", [&](int fd) { send_hdr(fd, KVX_F_WRITE, UINT64_MAX - 4, 100, key, junk.data(), 100); }},
      {"read past the end", "out-of-range", [&](int fd) { send_hdr(fd, KVX_F_READ, lo + R, 1, key); }},
      {"huge notification", "exceeds", [&](int fd) { send_hdr(fd, KVX_F_WRITE_END, 0, 1ull << 40, 0, junk.data(), 4096); }},
      {"bad magic", "bad magic", [&](int fd) { send_hdr(fd, KVX_F_WRITE, lo, 10, key, junk.data(), 10, 0x12345678); }},
      {"unknown op", "unknown op", [&](int fd) { send_hdr(fd, 77, lo, 10, key, junk.data(), 10); }},
      {"server-bound ACK", "unknown op", [&](int fd) { send_hdr(fd, KVX_F_ACK, 0, 0, 0); }},
      {"rdma frame without rdma", "rdma", [&](int fd) { send_hdr(fd, KVX_F_RDMA_QP, 0, 64, 0, junk.data(), 64); }},
  };
  for (auto &c : cases) {
    int fd = raw_client(port, "s3cret");
    ASSERT_GE(fd, 0) << c.what;
    c.send(fd);
    std::string reason;
    EXPECT_TRUE(closed_by_agent(fd, 3000, &reason)) << c.what << ": connection left open";
    close(fd);
    EXPECT_TRUE(v.unchanged()) << c.what << ": memory changed";
    EXPECT_TRUE(v.log.has(c.log)) << c.what << ": log lacks '" << c.log << "'\n" << v.log.all();
  }
  // Truncated header, then the peer vanishes: nothing written.
  int fd = raw_client(port, "s3cret");
  kvx_hdr h = {KVX_FRAME_MAGIC, KVX_F_WRITE, 0, 1, lo, 100, key};
  kvx_fd_send_all(fd, &h, 20, 1000);
  close(fd);
  // A header that promises 100 bytes, followed by fewer, then close: only what arrived may land, in range.
  // Garbage instead of the client's hello is refused. First the agent's greeting (kvx_wire.c's handshake): the
  // server magic "KVH2" (0x3248564b, host order) and a 32-byte random nonce; then 200 bytes of junk as our hello.
  fd = raw_client(port, nullptr);
  ASSERT_GE(fd, 0);
  uint8_t greeting[36];
  ASSERT_TRUE(read_all(fd, greeting, sizeof greeting, 3000)) << "the agent sent no 36-byte greeting";
  uint32_t magic;
  memcpy(&magic, greeting, 4);
  EXPECT_EQ(magic, 0x3248564bu) << "the greeting does not start with the server handshake magic";
  EXPECT_NE(std::vector<uint8_t>(greeting + 4, greeting + 36), std::vector<uint8_t>(32, 0)) << "an all-zero nonce";
  kvx_fd_send_all(fd, junk.data(), 200, 1000);
  EXPECT_TRUE(closed_by_agent(fd, 3000));
  close(fd);
  for (int i = 0; i < 50 && !v.log.has("malformed client hello"); i++) usleep(10000);
  EXPECT_TRUE(v.log.has("malformed client hello")) << v.log.all();
  EXPECT_TRUE(v.unchanged());

  // A valid raw frame does land (so the refusals above are the validation, not a broken raw client).
  fd = raw_client(port, "s3cret");
  std::vector<uint8_t> good(256, 0x5A);
  send_hdr(fd, KVX_F_WRITE, lo + 100, 256, key, good.data(), 256);
  send_hdr(fd, KVX_F_WRITE_END, 0, 0, 0);
  kvx_hdr ack;
  ASSERT_EQ(kvx_fd_recv_all(fd, &ack, sizeof ack, 3000, 0), 0);
  EXPECT_EQ(ack.op, KVX_F_ACK);
  close(fd);
  EXPECT_EQ(memcmp(v.mem.data() + v.R + 100, good.data(), 256), 0);
  memcpy(v.ref.data() + v.R + 100, good.data(), 256);
  EXPECT_TRUE(v.unchanged());

  // And a real agent still gets served.
  kvx_agent *a = agent("good", "tcp", nullptr, "s3cret", 3000, nullptr, true);
  std::vector<uint8_t> src(v.R);
  fill(src.data(), src.size(), 3);
  kvx_region *rs;
  char err[256];
  ASSERT_EQ(kvx_register(a, src.data(), src.size(), KVX_MEM_HOST, &rs, err, sizeof err), 0);
  ASSERT_TRUE(learn(a, v.b));
  kvx_desc l = {(uint64_t)(uintptr_t)src.data(), v.R}, r = {lo, v.R};
  kvx_xfer *x;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "victim", "ok", 2, &x, err, sizeof err), 0) << err;
  post_xfer(x);
  EXPECT_EQ(wait_xfer(a, x, 5000), KVX_DONE) << kvx_xfer_error(x);
  EXPECT_EQ(memcmp(v.mem.data() + v.R, src.data(), v.R), 0);
  EXPECT_EQ(wait_notifs(v.b, 1, 3000).size(), 1u);
  kvx_xfer_free(x);
  kvx_agent_free(a);
}

// A WRITEV/READV frame: header, descriptor list, payload (WRITEV), notification (with KVX_FL_END).
void send_vec(int fd, uint16_t op, uint16_t flags, const std::vector<kvx_vdesc> &d, uint64_t len,
              const std::string &notif = "", const uint8_t *payload = nullptr, size_t plen = 0) {
  kvx_hdr h = {KVX_FRAME_MAGIC, op, flags, 9, d.size(), len, notif.size()};
  kvx_fd_send_all(fd, &h, sizeof h, 1000);
  if (!d.empty()) kvx_fd_send_all(fd, d.data(), d.size() * sizeof d[0], 1000);
  if (plen) kvx_fd_send_all(fd, payload, plen, 1000);
  if (!notif.empty()) kvx_fd_send_all(fd, notif.data(), notif.size(), 1000);
}

// A descriptor list is checked whole before a byte lands: one bad descriptor refuses the good ones with it.
TEST(KvxBadFrames, VectorFramesAreCheckedWhole) {
  Victim v;
  ASSERT_TRUE(v.b && v.r);
  int port = kvx_agent_port(v.b);
  std::vector<uint8_t> junk(4096, 0xEE);
  uint64_t lo = v.lo, R = v.R, key = v.key;
  const uint16_t END = KVX_FL_END;
  std::vector<kvx_vdesc> good2 = {{lo, 100, key}, {lo + 1000, 100, key}};
  struct Case {
    const char *what, *log;
    std::function<void(int)> send;
  };
  std::vector<Case> cases = {
      {"last descriptor out of range", "out-of-range",
       [&](int fd) {
         auto d = good2;
         d.push_back({lo + R - 10, 100, key});
         send_vec(fd, KVX_F_WRITEV, END, d, 300, "", junk.data(), 300);
       }},
      {"middle descriptor with a wrong key", "unknown region key",
       [&](int fd) {
         std::vector<kvx_vdesc> d = {good2[0], {lo + 500, 10, key ^ 1}, good2[1]};
         send_vec(fd, KVX_F_WRITEV, END, d, 210, "", junk.data(), 210);
       }},
      {"length not the descriptors' sum", "does not match its descriptors",
       [&](int fd) { send_vec(fd, KVX_F_WRITEV, END, good2, 150, "", junk.data(), 150); }},
      {"no descriptors", "malformed write frame", [&](int fd) { send_vec(fd, KVX_F_WRITEV, END, {}, 0); }},
      {"too many descriptors", "malformed write frame",
       [&](int fd) {
         std::vector<kvx_vdesc> d(KVX_MAX_VEC + 1, {lo, 1, key});
         send_vec(fd, KVX_F_WRITEV, END, d, d.size(), "", junk.data(), d.size());
       }},
      {"notification without the end flag", "malformed write frame",
       [&](int fd) { send_vec(fd, KVX_F_WRITEV, 0, good2, 200, "n", junk.data(), 200); }},
      {"read past the end", "out-of-range",
       [&](int fd) { send_vec(fd, KVX_F_READV, END, {{lo, 10, key}, {lo + R - 5, 10, key}}, 20); }},
      {"shm frame on the tcp listener", "belongs to the shm backend",
       [&](int fd) { send_hdr(fd, KVX_F_FDS_REQ, 0, 0, 0); }},
  };
  for (auto &c : cases) {
    int fd = raw_client(port, "s3cret");
    ASSERT_GE(fd, 0) << c.what;
    c.send(fd);
    EXPECT_TRUE(closed_by_agent(fd, 3000)) << c.what << ": connection left open";
    close(fd);
    EXPECT_TRUE(v.unchanged()) << c.what << ": memory changed";
    EXPECT_TRUE(v.log.has(c.log)) << c.what << ": log lacks '" << c.log << "'\n" << v.log.all();
  }
  EXPECT_EQ(wait_notifs(v.b, 1, 100).size(), 0u);

  // Valid frames: a WRITEV in two frames (the first without the end flag), then a READV of what landed.
  int fd = raw_client(port, "s3cret");
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> pay(300);
  fill(pay.data(), pay.size(), 9);
  send_vec(fd, KVX_F_WRITEV, 0, good2, 200, "", pay.data(), 200);
  send_vec(fd, KVX_F_WRITEV, END | KVX_FL_NOTIF, {{lo + 5000, 100, key}}, 100, "vn", pay.data() + 200, 100);
  kvx_hdr ack;
  ASSERT_EQ(kvx_fd_recv_all(fd, &ack, sizeof ack, 3000, 0), 0);
  EXPECT_EQ(ack.op, KVX_F_ACK);
  EXPECT_EQ(ack.req, 9u);
  EXPECT_EQ(memcmp(v.mem.data() + R, pay.data(), 100), 0);
  EXPECT_EQ(memcmp(v.mem.data() + R + 1000, pay.data() + 100, 100), 0);
  EXPECT_EQ(memcmp(v.mem.data() + R + 5000, pay.data() + 200, 100), 0);
  auto ns = wait_notifs(v.b, 1, 3000);
  ASSERT_EQ(ns.size(), 1u);
  EXPECT_EQ(ns[0], "vn");
  send_vec(fd, KVX_F_READV, END, {{lo + 5000, 100, key}, {lo, 100, key}}, 200);
  kvx_hdr rd;
  ASSERT_EQ(kvx_fd_recv_all(fd, &rd, sizeof rd, 3000, 0), 0);
  EXPECT_EQ(rd.op, KVX_F_READ_DATA);
  EXPECT_EQ(rd.addr, 2u);
  ASSERT_EQ(rd.len, 200u);
  std::vector<uint8_t> back(200);
  ASSERT_EQ(kvx_fd_recv_all(fd, back.data(), back.size(), 3000, 0), 0);
  EXPECT_EQ(memcmp(back.data(), pay.data() + 200, 100), 0);
  EXPECT_EQ(memcmp(back.data() + 100, pay.data(), 100), 0);
  ASSERT_EQ(kvx_fd_recv_all(fd, &ack, sizeof ack, 3000, 0), 0);
  EXPECT_EQ(ack.op, KVX_F_ACK);
  close(fd);
}

TEST(KvxBadFrames, RandomFramesNeverTouchMemory) {
  Victim v;
  ASSERT_TRUE(v.b);
  int port = kvx_agent_port(v.b);
  std::mt19937_64 rng(1234);
  std::vector<uint8_t> junk(8192);
  for (int i = 0; i < 60; i++) {
    int fd = raw_client(port, "s3cret");
    ASSERT_GE(fd, 0);
    for (auto &c : junk) c = (uint8_t)rng();
    uint16_t ops[] = {KVX_F_WRITE, KVX_F_READ,  KVX_F_WRITE_END, KVX_F_NOTIF, KVX_F_ACK, KVX_F_READ_DATA,
                      KVX_F_FD,    KVX_F_WRITEV, KVX_F_READV,   0,           99};
    kvx_hdr h;
    h.magic = (i % 7 == 0) ? (uint32_t)rng() : KVX_FRAME_MAGIC;
    h.op = ops[rng() % (sizeof ops / sizeof ops[0])];
    h.flags = (uint16_t)rng();
    h.req = rng();
    // Addresses near the region (in, across and outside it) with random keys that are never the region's.
    h.addr = (i % 3 == 0) ? rng() : v.lo - 4096 + rng() % (v.R + 8192);
    h.len = (i % 2) ? rng() : (rng() % 100000) | (1u << 17);
    h.key = rng();
    if (h.key == v.key) h.key ^= 1;
    kvx_fd_send_all(fd, &h, sizeof h, 1000);
    kvx_fd_send_all(fd, junk.data(), rng() % junk.size(), 1000);
    EXPECT_TRUE(closed_by_agent(fd, 3000)) << "frame " << i << " op " << h.op;
    close(fd);
    ASSERT_TRUE(v.unchanged()) << "random frame " << i << " changed memory";
  }
  // Totally random streams, no handshake.
  for (int i = 0; i < 10; i++) {
    int fd = raw_client(port, nullptr);
    for (auto &c : junk) c = (uint8_t)rng();
    kvx_fd_send_all(fd, junk.data(), 1 + rng() % 512, 1000);
    EXPECT_TRUE(closed_by_agent(fd, 3000));
    close(fd);
  }
  EXPECT_TRUE(v.unchanged());
}

}  // namespace

// ---- the shm socket: private to this user ----

namespace {

TEST(KvxShm, SocketIsPrivate) {
  kvx_agent *a = agent("priv", "shm");
  ASSERT_TRUE(a);
  std::string path = kvx_unix_path(a), dir = path.substr(0, path.rfind('/'));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u) << path;
  ASSERT_EQ(stat(dir.c_str(), &st), 0) << dir;
  EXPECT_EQ(st.st_mode & 0777, 0700u) << dir;
  EXPECT_EQ(st.st_uid, geteuid());
  kvx_agent_free(a);
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  EXPECT_NE(access(dir.c_str(), F_OK), 0) << "the private folder outlived the agent";
}

// Another user that reaches the socket anyway (here: root, which passes the folder's mode, against an agent run as
// nobody) is refused on its credentials (SO_PEERCRED) before the handshake, logged and counted.
TEST(KvxShm, AnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the agent as another user";
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    if (setgid(65534) || setuid(65534)) _exit(3);
    kvx_opts o = {};
    o.backend = "shm";
    o.secret = "s3cret";
    o.shm_dir = "/tmp";
    o.log = [](void *, const char *) {};
    char err[256];
    kvx_agent *v = kvx_agent_new("nobody-agent", &o, err, sizeof err);
    if (!v) _exit(4);
    char buf[200] = "";
    snprintf(buf, sizeof buf, "%s", kvx_unix_path(v));
    if (write(up[1], buf, sizeof buf) != (ssize_t)sizeof buf) _exit(5);
    char go;
    if (read(down[0], &go, 1) != 1) _exit(6);
    for (int i = 0; i < 200 && kvx_auth_failures(v) < 1; i++) usleep(10000);
    uint64_t n = kvx_auth_failures(v);
    if (write(up[1], &n, sizeof n) != (ssize_t)sizeof n) _exit(7);
    kvx_agent_free(v);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  char path[200];
  ASSERT_EQ(read(up[0], path, sizeof path), (ssize_t)sizeof path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {};
  sa.sun_family = AF_UNIX;
  path[sizeof sa.sun_path - 1] = 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  ASSERT_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0) << path << ": " << strerror(errno);
  uint8_t greet[36];
  EXPECT_NE(kvx_fd_recv_all(fd, greet, sizeof greet, 3000, 0), 0) << "an agent greeted another user";
  close(fd);
  ASSERT_EQ(write(down[1], "g", 1), 1);
  uint64_t n = 0;
  EXPECT_EQ(read(up[0], &n, sizeof n), (ssize_t)sizeof n);
  EXPECT_EQ(n, 1u);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  close(up[0]);
  close(down[1]);
}

} // namespace
