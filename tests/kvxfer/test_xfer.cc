// tests/kvxfer/test_xfer.cc: round trips of many scattered blocks (WRITE, READ, notifications after data) per backend, in one process and across two; posting and waiting from several threads, the agent fd.
#include <atomic>
#include <thread>

#include "kvx_test_util.h"

using namespace kvxt;

namespace {

class Xfer : public ::testing::TestWithParam<const char *> {};

struct Mem {
  uint8_t *p = nullptr;
  size_t n = 0;
  bool shared = false;
  Mem(size_t len, bool sh) : n(len), shared(sh) {
    char err[256];
    p = sh ? (uint8_t *)kvx_host_alloc(len, err, sizeof err) : (uint8_t *)calloc(1, len);
  }
  ~Mem() {
    if (shared)
      kvx_host_free(p, n);
    else
      free(p);
  }
};

TEST_P(Xfer, InProcessScatteredWriteReadWithNotifs) {
  const char *be = GetParam();
  kvx_agent *a = agent("sender", be), *b = agent("receiver", be);
  ASSERT_TRUE(a && b);
  const size_t slot = 8192, n = 300, sz = slot * n;
  Mem src(sz, false), dst(sz, true), back(sz, false);
  fill(src.p, sz, 1);
  kvx_region *rs, *rd, *rb;
  char err[256];
  ASSERT_EQ(kvx_register(a, src.p, sz, KVX_MEM_HOST, &rs, err, sizeof err), 0) << err;
  ASSERT_EQ(kvx_register(a, back.p, sz, KVX_MEM_HOST, &rb, err, sizeof err), 0) << err;
  ASSERT_EQ(kvx_register(b, dst.p, sz, KVX_MEM_HOST, &rd, err, sizeof err), 0) << err;
  ASSERT_TRUE(learn(a, b));
  ASSERT_TRUE(learn(b, a));
  EXPECT_STREQ(kvx_peer_backend(a, "receiver"), be);

  // Several WRITEs in flight at once, each with a notification.
  const int K = 4;
  std::vector<Blocks> bl;
  std::vector<kvx_xfer *> xs(K);
  for (int k = 0; k < K; k++) bl.emplace_back((uint64_t)(uintptr_t)src.p, (uint64_t)(uintptr_t)dst.p, n, slot, 10 + k);
  // Requests k write disjoint quarters of the blocks so they do not overwrite each other.
  for (int k = 0; k < K; k++) {
    Blocks &q = bl[0];
    size_t lo = k * n / K, hi = (k + 1) * n / K;
    std::string note = "w" + std::to_string(k);
    ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &q.src[lo], hi - lo, &q.dst[lo], hi - lo, "receiver", note.data(), note.size(),
                           &xs[k], err, sizeof err),
              0)
        << err;
    ASSERT_EQ(kvx_xfer_post(xs[k]), 0) << kvx_xfer_error(xs[k]);
  }
  // Each notification, when seen, already has all its bytes in place.
  std::vector<std::string> got;
  int64_t end = kvx_now_ms() + 10000;
  while (got.size() < (size_t)K && kvx_now_ms() < end) {
    kvx_notif nt[4];
    int m = kvx_get_notifs(b, nt, 4);
    for (int i = 0; i < m; i++) {
      std::string s((char *)nt[i].msg, nt[i].len);
      EXPECT_STREQ(nt[i].peer, "sender");
      int k = s[1] - '0';
      size_t lo = k * n / K, hi = (k + 1) * n / K;
      for (size_t j = lo; j < hi; j++)
        ASSERT_EQ(memcmp((void *)(uintptr_t)bl[0].src[j].addr, (void *)(uintptr_t)bl[0].dst[j].addr, bl[0].src[j].len), 0)
            << "block " << j << " not landed when notification " << s << " arrived";
      got.push_back(s);
      free(nt[i].msg);
    }
    if (!m) kvx_progress(b, 20);
  }
  ASSERT_EQ(got.size(), (size_t)K);
  for (int k = 0; k < K; k++) {
    EXPECT_EQ(wait_xfer(a, xs[k], 5000), KVX_DONE) << kvx_xfer_error(xs[k]);
    kvx_xfer_free(xs[k]);
  }
  EXPECT_TRUE(blocks_equal(bl[0], 0, 0));

  // READ them back into other scattered places, one request, checksummed.
  std::vector<kvx_desc> loc;
  for (size_t j = 0; j < n; j++) loc.push_back({(uint64_t)(uintptr_t)back.p + (n - 1 - j) * slot, bl[0].dst[j].len});
  kvx_xfer *r;
  ASSERT_EQ(kvx_xfer_new(a, KVX_READ, loc.data(), n, bl[0].dst.data(), n, "receiver", "r", 1, &r, err, sizeof err), 0)
      << err;
  ASSERT_EQ(kvx_xfer_post(r), 0);
  ASSERT_EQ(wait_xfer(a, r, 10000), KVX_DONE) << kvx_xfer_error(r);
  uint64_t h1 = 0, h2 = 0;
  for (size_t j = 0; j < n; j++) {
    h1 = h1 * 31 + fnv((uint8_t *)(uintptr_t)bl[0].src[j].addr, bl[0].src[j].len);
    h2 = h2 * 31 + fnv((uint8_t *)(uintptr_t)loc[j].addr, loc[j].len);
  }
  EXPECT_EQ(h1, h2);
  auto rn = wait_notifs(b, 1, 5000);
  ASSERT_EQ(rn.size(), 1u);
  EXPECT_EQ(rn[0], "r");
  // Re-posting a finished request runs it again.
  memset(back.p, 0, sz);
  ASSERT_EQ(kvx_xfer_post(r), 0);
  ASSERT_EQ(wait_xfer(a, r, 10000), KVX_DONE) << kvx_xfer_error(r);
  EXPECT_EQ(memcmp((void *)(uintptr_t)loc[5].addr, (void *)(uintptr_t)bl[0].src[5].addr, loc[5].len), 0);
  EXPECT_EQ(wait_notifs(b, 1, 5000).size(), 1u);
  kvx_xfer_free(r);

  // Lists of different shapes with the same total: one local run onto many remote blocks.
  std::vector<kvx_desc> rem;
  uint64_t tot = 0;
  for (size_t j = 0; j < 50; j++) {
    rem.push_back({(uint64_t)(uintptr_t)dst.p + j * slot * 2 + 7, 1000 + j});
    tot += 1000 + j;
  }
  kvx_desc one = {(uint64_t)(uintptr_t)src.p + 3, tot};
  kvx_xfer *w;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &one, 1, rem.data(), rem.size(), "receiver", nullptr, 0, &w, err, sizeof err), 0)
      << err;
  ASSERT_EQ(kvx_xfer_post(w), 0);
  ASSERT_EQ(wait_xfer(a, w, 5000), KVX_DONE) << kvx_xfer_error(w);
  uint64_t off = 0;
  for (auto &d : rem) {
    EXPECT_EQ(memcmp((void *)(uintptr_t)d.addr, src.p + 3 + off, d.len), 0);
    off += d.len;
  }
  kvx_xfer_free(w);

  // Standalone notifications, both ways, in order.
  for (int i = 0; i < 20; i++) {
    std::string m = "n" + std::to_string(i);
    ASSERT_EQ(kvx_notify(a, "receiver", m.data(), m.size(), err, sizeof err), 0) << err;
  }
  auto ns = wait_notifs(b, 20, 5000);
  ASSERT_EQ(ns.size(), 20u);
  for (int i = 0; i < 20; i++) EXPECT_EQ(ns[i], "n" + std::to_string(i));
  ASSERT_EQ(kvx_notify(b, "sender", "back", 4, err, sizeof err), 0) << err;
  std::vector<std::string> from;
  auto nb = wait_notifs(a, 1, 5000, &from);
  ASSERT_EQ(nb.size(), 1u);
  EXPECT_EQ(nb[0], "back");
  EXPECT_EQ(from[0], "receiver");

  kvx_deregister(b, rd);
  kvx_deregister(a, rs);
  kvx_deregister(a, rb);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

// More descriptors than one frame carries (tcp: KVX_MAX_VEC per WRITEV/READV): the request goes out as several
// frames and still ends with one notification after every byte, and a READ's data comes back frame by frame.
TEST_P(Xfer, ManyDescriptorsSpanSeveralFrames) {
  const char *be = GetParam();
  kvx_agent *a = agent("many-a", be), *b = agent("many-b", be);
  ASSERT_TRUE(a && b);
  const size_t slot = 512, n = 3 * KVX_MAX_VEC + 17, sz = slot * n;
  Mem src(sz, false), dst(sz, true), back(sz, false);
  fill(src.p, sz, 21);
  kvx_region *rs, *rd, *rb;
  char err[256];
  ASSERT_EQ(kvx_register(a, src.p, sz, KVX_MEM_HOST, &rs, err, sizeof err), 0) << err;
  ASSERT_EQ(kvx_register(a, back.p, sz, KVX_MEM_HOST, &rb, err, sizeof err), 0) << err;
  ASSERT_EQ(kvx_register(b, dst.p, sz, KVX_MEM_HOST, &rd, err, sizeof err), 0) << err;
  ASSERT_TRUE(learn(a, b));
  Blocks bl((uint64_t)(uintptr_t)src.p, (uint64_t)(uintptr_t)dst.p, n, slot, 31);
  kvx_xfer *w;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, bl.src.data(), n, bl.dst.data(), n, "many-b", "all", 3, &w, err, sizeof err), 0)
      << err;
  ASSERT_EQ(kvx_xfer_post(w), 0);
  auto ns = wait_notifs(b, 1, 10000);
  ASSERT_EQ(ns.size(), 1u);
  EXPECT_TRUE(blocks_equal(bl, 0, 0)) << "a block had not landed when the notification arrived";
  EXPECT_EQ(wait_xfer(a, w, 10000), KVX_DONE) << kvx_xfer_error(w);
  // READ them back in reverse order into one contiguous run per block.
  std::vector<kvx_desc> loc, rem;
  uint64_t off = 0;
  for (size_t j = n; j-- > 0;) {
    rem.push_back(bl.dst[j]);
    loc.push_back({(uint64_t)(uintptr_t)back.p + off, bl.dst[j].len});
    off += bl.dst[j].len;
  }
  kvx_xfer *r;
  ASSERT_EQ(kvx_xfer_new(a, KVX_READ, loc.data(), n, rem.data(), n, "many-b", nullptr, 0, &r, err, sizeof err), 0)
      << err;
  ASSERT_EQ(kvx_xfer_post(r), 0);
  ASSERT_EQ(wait_xfer(a, r, 10000), KVX_DONE) << kvx_xfer_error(r);
  for (size_t j = 0; j < n; j++)
    ASSERT_EQ(memcmp((void *)(uintptr_t)loc[j].addr, (void *)(uintptr_t)bl.src[n - 1 - j].addr, loc[j].len), 0) << j;
  kvx_xfer_free(w);
  kvx_xfer_free(r);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

// Two processes: kvx_test_util.h two_processes_write_then_read.
TEST_P(Xfer, TwoProcessesWriteAndRead) { two_processes_write_then_read(GetParam(), 256, 1); }

INSTANTIATE_TEST_SUITE_P(Backends, Xfer, ::testing::Values("tcp", "shm"),
                         [](const ::testing::TestParamInfo<const char *> &i) { return std::string(i.param); });

}  // namespace

namespace {

// The workers' pattern: a compute thread posts, an event-loop thread waits on kvx_agent_fd and polls; meanwhile
// other threads send notifications.
TEST(KvxThreads, PostOnOneThreadPollOnAnother) {
  for (const char *be : {"tcp", "shm"}) {
    kvx_agent *a = agent("poster", be), *b = agent("sink", be);
    ASSERT_TRUE(a && b);
    const size_t slot = 4096, n = 64, N = 200;
    std::vector<uint8_t> src(slot * n);
    fill(src.data(), src.size(), 8);
    uint8_t *dst = (uint8_t *)kvx_host_alloc(slot * n, nullptr, 0);
    kvx_region *r1, *r2;
    char err[256];
    ASSERT_EQ(kvx_register(a, src.data(), src.size(), KVX_MEM_HOST, &r1, err, sizeof err), 0);
    ASSERT_EQ(kvx_register(b, dst, slot * n, KVX_MEM_HOST, &r2, err, sizeof err), 0);
    ASSERT_TRUE(learn(a, b));
    std::vector<kvx_xfer *> xs(N, nullptr);
    std::atomic<size_t> posted{0};
    std::thread compute([&] {
      for (size_t i = 0; i < N; i++) {
        kvx_desc l = {(uint64_t)(uintptr_t)src.data() + (i % n) * slot, slot};
        kvx_desc r = {(uint64_t)(uintptr_t)dst + (i % n) * slot, slot};
        std::string note = std::to_string(i);
        char e[256];
        if (kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "sink", note.data(), note.size(), &xs[i], e, sizeof e)) break;
        post_xfer(xs[i]);
        posted = i + 1;
      }
    });
    std::thread chatter([&] {
      char e[256];
      for (int i = 0; i < 100; i++) EXPECT_EQ(kvx_notify(a, "sink", "chat", 4, e, sizeof e), 0) << e;
    });
    // Event loop: wake on the fd, clear it, poll everything posted so far.
    size_t done = 0;
    int64_t end = kvx_now_ms() + 20000;
    std::vector<bool> seen(N, false);
    while (done < N && kvx_now_ms() < end) {
      struct pollfd p = {kvx_agent_fd(a), POLLIN, 0};
      poll(&p, 1, 100);
      kvx_progress(a, 0);
      for (size_t i = 0; i < posted.load(); i++)
        if (!seen[i] && kvx_xfer_poll(xs[i]) != KVX_PENDING) {
          EXPECT_EQ(kvx_xfer_poll(xs[i]), KVX_DONE) << kvx_xfer_error(xs[i]);
          seen[i] = true;
          done++;
        }
    }
    compute.join();
    chatter.join();
    EXPECT_EQ(done, N) << be;
    auto ns = wait_notifs(b, N + 100, 10000);
    EXPECT_EQ(ns.size(), N + 100) << be;
    // Request notifications keep their order among themselves.
    std::vector<std::string> req;
    for (auto &s : ns)
      if (s != "chat") req.push_back(s);
    for (size_t i = 0; i < req.size(); i++) EXPECT_EQ(req[i], std::to_string(i));
    EXPECT_EQ(memcmp(src.data(), dst, slot * n), 0);
    for (auto *x : xs) kvx_xfer_free(x);
    kvx_agent_free(a);
    kvx_agent_free(b);
    kvx_host_free(dst, slot * n);
  }
}

// Completions before anyone asked for the fd still show on it (a signal with nobody asleep skips the write).
TEST(KvxThreads, AgentFdShowsEarlierCompletions) {
  kvx_agent *a = agent("fd-a", "tcp"), *b = agent("fd-b", "tcp");
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> src(4096, 3), dst(4096);
  kvx_region *r1, *r2;
  char err[256];
  ASSERT_EQ(kvx_register(a, src.data(), 4096, KVX_MEM_HOST, &r1, err, sizeof err), 0);
  ASSERT_EQ(kvx_register(b, dst.data(), 4096, KVX_MEM_HOST, &r2, err, sizeof err), 0);
  ASSERT_TRUE(learn(a, b));
  kvx_desc l = {(uint64_t)(uintptr_t)src.data(), 4096}, r = {(uint64_t)(uintptr_t)dst.data(), 4096};
  kvx_xfer *x;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "fd-b", nullptr, 0, &x, err, sizeof err), 0);
  ASSERT_EQ(kvx_xfer_post(x), 0);
  int64_t end = kvx_now_ms() + 5000;
  while (kvx_xfer_poll(x) == KVX_PENDING && kvx_now_ms() < end) usleep(1000);  // no kvx_progress
  ASSERT_EQ(kvx_xfer_poll(x), KVX_DONE);
  struct pollfd p = {kvx_agent_fd(a), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 1000), 1) << "the completion did not show on kvx_agent_fd";
  EXPECT_EQ(kvx_progress(a, 0), 1);
  EXPECT_EQ(poll(&p, 1, 0), 0) << "kvx_progress did not clear the fd";
  // And a later completion wakes a poll on it.
  ASSERT_EQ(kvx_xfer_post(x), 0);
  EXPECT_EQ(poll(&p, 1, 5000), 1);
  EXPECT_EQ(kvx_xfer_poll(x), KVX_DONE);
  kvx_xfer_free(x);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

}  // namespace
