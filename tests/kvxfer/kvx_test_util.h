// tests/kvxfer/kvx_test_util.h: helpers shared by the kvxfer tests (agents, patterns, scattered block lists, waiting, log capture, fork pipes).
#pragma once
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "kvxfer/kvx.h"
#include "kvxfer/kvx_int.h"
}

namespace kvxt {

struct LogCap {
  std::mutex m;
  std::vector<std::string> lines;
  static void cb(void *ud, const char *line) {
    LogCap *c = (LogCap *)ud;
    std::lock_guard<std::mutex> g(c->m);
    c->lines.push_back(line);
  }
  bool has(const std::string &s) {
    std::lock_guard<std::mutex> g(m);
    for (auto &l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }
  std::string all() {
    std::lock_guard<std::mutex> g(m);
    std::string r;
    for (auto &l : lines) r += l + "\n";
    return r;
  }
};

// plaintext: the agent does not seal its tcp connections (kvx_opts.plaintext).
inline kvx_agent *agent(const char *name, const char *backend, LogCap *log = nullptr, const char *secret = "s3cret",
                        int timeout_ms = 3000, const char *host = nullptr, bool plaintext = false) {
  kvx_opts o = {};
  o.backend = backend;
  o.plaintext = plaintext;
  o.secret = secret;
  o.timeout_ms = timeout_ms;
  o.listen_host = host;
  if (log) {
    o.log = LogCap::cb;
    o.log_ud = log;
  }
  char err[256] = "";
  kvx_agent *a = kvx_agent_new(name, &o, err, sizeof err);
  if (!a) ADD_FAILURE() << "kvx_agent_new(" << name << ", " << backend << "): " << err;
  return a;
}

inline void fill(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = (uint8_t)s;
  }
}

inline uint64_t fnv(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Exchanges metadata: b learns a.
inline bool learn(kvx_agent *b, kvx_agent *a) {
  void *blob;
  size_t len;
  char err[256], name[KVX_MAX_NAME];
  if (kvx_pack_md(a, &blob, &len, err, sizeof err)) return false;
  int rc = kvx_load_remote_md(b, blob, len, name, sizeof name, err, sizeof err);
  free(blob);
  if (rc) ADD_FAILURE() << "load md: " << err;
  return rc == 0;
}

// n blocks of random lengths (1..slot) at permuted slots of two buffers of n*slot bytes.
struct Blocks {
  std::vector<kvx_desc> src, dst;
  uint64_t total = 0;
  Blocks(uint64_t sbase, uint64_t dbase, size_t n, size_t slot, uint32_t seed, bool full = false) {
    std::mt19937 rng(seed);
    std::vector<size_t> ps(n), pd(n);
    std::iota(ps.begin(), ps.end(), 0);
    std::iota(pd.begin(), pd.end(), 0);
    std::shuffle(ps.begin(), ps.end(), rng);
    std::shuffle(pd.begin(), pd.end(), rng);
    for (size_t i = 0; i < n; i++) {
      uint64_t len = full ? slot : 1 + rng() % slot;
      src.push_back({sbase + ps[i] * slot, len});
      dst.push_back({dbase + pd[i] * slot, len});
      total += len;
    }
  }
};

// Whether every dst block holds its src block's bytes.
inline bool blocks_equal(const Blocks &b, uint64_t src_off_to_ptr, uint64_t dst_off_to_ptr) {
  (void)src_off_to_ptr, (void)dst_off_to_ptr;
  for (size_t i = 0; i < b.src.size(); i++)
    if (memcmp((void *)(uintptr_t)b.src[i].addr, (void *)(uintptr_t)b.dst[i].addr, b.src[i].len)) return false;
  return true;
}

// Posts x. A post that fails leaves x in its error state, which the caller's wait_xfer (or kvx_xfer_poll) then
// returns, with kvx_xfer_error saying why: the cases check the outcome there, whichever step failed.
inline void post_xfer(kvx_xfer *x) { utl_ignore_status(kvx_xfer_post(x)); }

inline int wait_xfer(kvx_agent *a, kvx_xfer *x, int ms) {
  int64_t end = kvx_now_ms() + ms;
  int st;
  while ((st = kvx_xfer_poll(x)) == KVX_PENDING && kvx_now_ms() < end) kvx_progress(a, 50);
  return st;
}

inline std::vector<std::string> wait_notifs(kvx_agent *a, size_t want, int ms, std::vector<std::string> *peers = nullptr) {
  std::vector<std::string> out;
  int64_t end = kvx_now_ms() + ms;
  while (out.size() < want && kvx_now_ms() < end) {
    kvx_notif n[16];
    size_t room = want - out.size();
    int k = kvx_get_notifs(a, n, room < 16 ? (int)room : 16);  // never take more than asked for
    for (int i = 0; i < k; i++) {
      out.push_back(std::string((char *)n[i].msg, n[i].len));
      if (peers) peers->push_back(n[i].peer);
      free(n[i].msg);
    }
    if (!k) kvx_progress(a, 50);
  }
  return out;
}

inline bool write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = (const uint8_t *)p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w <= 0) return false;
    b += w, n -= (size_t)w;
  }
  return true;
}

inline bool read_all(int fd, void *p, size_t n, int ms = 10000) {
  uint8_t *b = (uint8_t *)p;
  while (n) {
    struct pollfd q = {fd, POLLIN, 0};
    if (poll(&q, 1, ms) <= 0) return false;
    ssize_t r = read(fd, b, n);
    if (r <= 0) return false;
    b += r, n -= (size_t)r;
  }
  return true;
}

inline bool send_blob(int fd, const void *p, size_t n) {
  uint64_t l = n;
  return write_all(fd, &l, 8) && write_all(fd, p, n);
}

inline std::vector<uint8_t> recv_blob(int fd, int ms = 10000) {
  uint64_t l = 0;
  if (!read_all(fd, &l, 8, ms) || l > (1u << 24)) return {};
  std::vector<uint8_t> v(l);
  if (!read_all(fd, v.data(), l, ms)) return {};
  return v;
}

inline bool md_to_fd(kvx_agent *a, int fd) {
  void *blob;
  size_t len;
  char err[256];
  if (kvx_pack_md(a, &blob, &len, err, sizeof err)) return false;
  bool ok = send_blob(fd, blob, len);
  free(blob);
  return ok;
}

inline bool md_from_fd(kvx_agent *a, int fd, char *name) {
  auto v = recv_blob(fd);
  char err[256];
  if (v.empty()) return false;
  int rc = kvx_load_remote_md(a, v.data(), v.size(), name, KVX_MAX_NAME, err, sizeof err);
  if (rc) fprintf(stderr, "md_from_fd: %s\n", err);
  return rc == 0;
}

inline int reap(pid_t pid, int ms = 20000) {
  int64_t end = kvx_now_ms() + ms;
  int st = 0;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (kvx_now_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(10000);
  }
}

// The receiver runs in a forked child (its agent made after the fork: NIXL's threads do not survive one): it
// publishes its metadata, checks what lands after the notification and answers over a pipe; the parent then READs
// a region the child filled. n scattered blocks of 16 KiB over backend be; slow scales every timeout.
inline void two_processes_write_then_read(const char *be, size_t n, int slow) {
  const size_t slot = 16384, sz = slot * n;
  int md[2], res[2], go[2];
  ASSERT_EQ(pipe(md), 0);
  ASSERT_EQ(pipe(res), 0);
  ASSERT_EQ(pipe(go), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char err[512];
    kvx_opts o = {};
    o.backend = be;
    o.secret = "s3cret";
    o.timeout_ms = 3000 * slow;
    kvx_agent *b = kvx_agent_new("child", &o, err, sizeof err);
    if (!b) _exit(10);
    uint8_t *dst = (uint8_t *)kvx_host_alloc(sz, err, sizeof err);
    uint8_t *pat = (uint8_t *)kvx_host_alloc(sz, err, sizeof err);
    if (!dst || !pat) _exit(11);
    fill(pat, sz, 99);
    kvx_region *r1, *r2;
    if (kvx_register(b, dst, sz, KVX_MEM_HOST, &r1, err, sizeof err) ||
        kvx_register(b, pat, sz, KVX_MEM_HOST, &r2, err, sizeof err))
      _exit(12);
    if (!md_to_fd(b, md[1])) _exit(13);
    uint64_t dbase = 0;
    if (!read_all(go[0], &dbase, 8)) _exit(14);
    auto ns = wait_notifs(b, 1, 10000 * slow);
    if (ns.size() != 1 || ns[0] != "all-written") _exit(15);
    // Recompute what the parent wrote: same seed, same block list.
    std::vector<uint8_t> src(sz);
    fill(src.data(), sz, 7);
    Blocks bl(dbase, (uint64_t)(uintptr_t)dst, n, slot, 5);
    uint8_t ok = 1;
    for (size_t i = 0; i < n; i++)
      if (memcmp(src.data() + (bl.src[i].addr - dbase), (void *)(uintptr_t)bl.dst[i].addr, bl.src[i].len)) ok = 0;
    if (!write_all(res[1], &ok, 1)) _exit(16);
    uint8_t bye;
    read_all(go[0], &bye, 1, 20000 * slow);
    kvx_agent_free(b);
    _exit(0);
  }
  close(md[1]);
  close(res[1]);
  close(go[0]);
  kvx_agent *a = agent("parent", be, nullptr, "s3cret", 3000 * slow);
  ASSERT_TRUE(a);
  char err[512], name[KVX_MAX_NAME];
  ASSERT_TRUE(md_from_fd(a, md[0], name));
  EXPECT_STREQ(name, "child");
  EXPECT_STREQ(kvx_peer_backend(a, "child"), be);
  std::vector<uint8_t> src(sz), back(sz);
  fill(src.data(), sz, 7);
  kvx_region *rs, *rb;
  ASSERT_EQ(kvx_register(a, src.data(), sz, KVX_MEM_HOST, &rs, err, sizeof err), 0) << err;
  ASSERT_EQ(kvx_register(a, back.data(), sz, KVX_MEM_HOST, &rb, err, sizeof err), 0) << err;
  // The child's regions from its metadata, newest first: [pat, dst].
  kvx_desc regs[4];
  ASSERT_EQ(kvx_peer_regions(a, "child", regs, 4), 2);
  EXPECT_EQ(regs[0].len, sz);
  EXPECT_EQ(kvx_peer_regions(a, "nobody", regs, 4), -1);
  uint64_t pat = regs[0].addr, dst = regs[1].addr;
  uint64_t sbase = (uint64_t)(uintptr_t)src.data();
  ASSERT_TRUE(write_all(go[1], &sbase, 8));
  Blocks bl(sbase, dst, n, slot, 5);
  kvx_xfer *w;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, bl.src.data(), n, bl.dst.data(), n, "child", "all-written", 11, &w, err,
                         sizeof err),
            0)
      << err;
  ASSERT_EQ(kvx_xfer_post(w), 0);
  EXPECT_EQ(wait_xfer(a, w, 10000 * slow), KVX_DONE) << kvx_xfer_error(w);
  uint8_t ok = 0;
  ASSERT_TRUE(read_all(res[0], &ok, 1, 10000 * slow));
  EXPECT_EQ(ok, 1) << "the child saw wrong bytes after the notification";
  // READ the child's pattern region, scattered.
  Blocks rb2((uint64_t)(uintptr_t)back.data(), pat, n, slot, 8, true);
  kvx_xfer *r;
  ASSERT_EQ(kvx_xfer_new(a, KVX_READ, rb2.src.data(), n, rb2.dst.data(), n, "child", nullptr, 0, &r, err, sizeof err), 0)
      << err;
  ASSERT_EQ(kvx_xfer_post(r), 0);
  EXPECT_EQ(wait_xfer(a, r, 10000 * slow), KVX_DONE) << kvx_xfer_error(r);
  std::vector<uint8_t> want(sz);
  fill(want.data(), sz, 99);
  for (size_t i = 0; i < n; i++)
    ASSERT_EQ(memcmp(want.data() + (rb2.dst[i].addr - pat), (void *)(uintptr_t)rb2.src[i].addr, slot), 0) << i;
  uint8_t bye = 1;
  write_all(go[1], &bye, 1);
  EXPECT_EQ(reap(pid, 20000 * slow), 0);
  kvx_xfer_free(w);
  kvx_xfer_free(r);
  kvx_agent_free(a);
  close(md[0]);
  close(res[0]);
  close(go[1]);
}

}  // namespace kvxt
