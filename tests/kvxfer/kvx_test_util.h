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

inline kvx_agent *agent(const char *name, const char *backend, LogCap *log = nullptr, const char *secret = "s3cret",
                        int timeout_ms = 3000, const char *host = nullptr) {
  kvx_opts o = {};
  o.backend = backend;
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

}  // namespace kvxt
