// tests/router/test_kvroute.cc: KV-aware picking: the worker whose index holds the prompt's prefix wins, load decides otherwise.
#include <gtest/gtest.h>

#include <vector>

#include "sched_util.h"

extern "C" {
#include "kv/blockhash.h"
#include "router/kvindex.h"
#include "router/sched.h"
}

namespace {

rtr_sched_worker W(cfg_role role, int inflight = 0, int waiting = 0) {
  rtr_sched_worker w{};
  w.up = 1;
  w.role = role;
  w.inflight = inflight;
  w.waiting = waiting;
  w.free_blocks = 50;
  w.total_blocks = 100;
  w.block_size = 16;
  return w;
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; i++) p[i] = (int32_t)((i * 7919 + seed * 104729) % 49152);
  return p;
}

// Tells the index that worker holds the first n_blocks blocks of p (block size 16).
void Hold(rtr_kvindex *x, int worker, const std::vector<int32_t> &p, int n_blocks) {
  std::vector<uint64_t> keys(p.size() / 16);
  int n = kv_blockhash_chain(nullptr, p.data(), (int)p.size(), 16, keys.data(), (int)keys.size());
  ASSERT_GE(n, n_blocks);
  std::vector<kv_event> ev;
  for (int i = 0; i < n_blocks; i++) ev.push_back({keys[i], KV_EVENT_ADDED});
  ASSERT_EQ(rtr_kvindex_apply(x, worker, ev.data(), (int)ev.size()), 0);
}

struct KvRoute : ::testing::Test {
  rtr_kvindex *x = nullptr;
  rtr_kvindex_weights wt{1.0, 0.5, 0.2}; // the config defaults
  void SetUp() override {
    char err[128];
    ASSERT_EQ(rtr_kvindex_new(8, 1024, &x, err, sizeof err), 0) << err;
  }
  void TearDown() override { rtr_kvindex_free(x); }
};

TEST_F(KvRoute, PrefersTheBothWorkerHoldingThePrefix) {
  auto p = Prompt(320, 1); // 20 blocks
  Hold(x, 2, p, 20);
  // worker 2 is busier (one in flight) than the idle workers 0 and 1, but holds the whole prompt
  rtr_sched_worker w[] = {W(CFG_ROLE_BOTH), W(CFG_ROLE_BOTH), W(CFG_ROLE_BOTH, 1)};
  rtr_sched_target t;
  int ov = -1;
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, p.data(), (int)p.size(), Thr(100), x, &wt, &t, &ov), 0);
  EXPECT_EQ(t.decode, 2);
  EXPECT_EQ(t.prefill, -1);
  EXPECT_EQ(ov, 20);
  // a different prompt: nobody holds it, so the least loaded (first idle) worker wins
  auto q = Prompt(320, 2);
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, q.data(), (int)q.size(), Thr(100), x, &wt, &t, &ov), 0);
  EXPECT_EQ(t.decode, 0);
  EXPECT_EQ(ov, 0);
  // only the first 2 of 20 blocks cached: too little to beat an idle worker
  rtr_kvindex_remove_worker(x, 2);
  Hold(x, 2, p, 2);
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, p.data(), (int)p.size(), Thr(100), x, &wt, &t, &ov), 0);
  EXPECT_EQ(t.decode, 0);
}

TEST_F(KvRoute, FallsBackToLoad) {
  auto p = Prompt(160, 3);
  rtr_sched_worker w[] = {W(CFG_ROLE_BOTH, 3), W(CFG_ROLE_BOTH, 1), W(CFG_ROLE_BOTH, 2)};
  rtr_sched_target t;
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, p.data(), (int)p.size(), Thr(100), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 1);
  // no index at all: the load policy
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, p.data(), (int)p.size(), Thr(100), nullptr, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 1);
  // a prompt shorter than one block: load
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, p.data(), 10, Thr(100), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 1);
  // the holder went down: its entries no longer matter, and it is not eligible
  Hold(x, 0, p, 10);
  w[0].up = 0;
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, p.data(), (int)p.size(), Thr(100), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 1);
  w[0].up = 1;
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, p.data(), (int)p.size(), Thr(100), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 0);
  // a CLEARED event forgets it
  kv_event clr{0, KV_EVENT_CLEARED};
  ASSERT_EQ(rtr_kvindex_apply(x, 0, &clr, 1), 0);
  ASSERT_EQ(rtr_sched_pick_kv(w, 3, p.data(), (int)p.size(), Thr(100), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 1);
}

TEST_F(KvRoute, PrefillSideOfAPairAndLocalDecode) {
  auto p = Prompt(480, 4); // 30 blocks
  // 0 decode (busy), 1 decode (idle), 2 prefill idle, 3 prefill queued but holding the prompt
  rtr_sched_worker w[] = {W(CFG_ROLE_DECODE, 3), W(CFG_ROLE_DECODE), W(CFG_ROLE_PREFILL), W(CFG_ROLE_PREFILL, 1)};
  Hold(x, 3, p, 30);
  Hold(x, 0, p, 10); // the decode side stays by load even though worker 0 holds a third (320 tokens uncached)
  rtr_sched_target t;
  ASSERT_EQ(rtr_sched_pick_kv(w, 4, p.data(), (int)p.size(), Thr(100), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 1);
  EXPECT_EQ(t.prefill, 3);
  Hold(x, 0, p, 30);
  ASSERT_EQ(rtr_sched_pick_kv(w, 4, p.data(), (int)p.size(), Thr(100), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 0); // worker 0 holds it all: what it would compute is under the threshold, it prefills itself
  EXPECT_EQ(t.prefill, -1);
  auto q = Prompt(480, 5);
  ASSERT_EQ(rtr_sched_pick_kv(w, 4, q.data(), (int)q.size(), Thr(100), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.prefill, 2);
  // under the disaggregation threshold the decode worker prefills itself (mode local): KV-aware among decode
  ASSERT_EQ(rtr_sched_pick_kv(w, 4, p.data(), (int)p.size(), Thr(100000), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 0);
  EXPECT_EQ(t.prefill, -1);
  ASSERT_EQ(rtr_sched_pick_kv(w, 4, q.data(), (int)q.size(), Thr(100000), x, &wt, &t, nullptr), 0);
  EXPECT_EQ(t.decode, 1);
}

TEST_F(KvRoute, PrefixPeerHoldsMoreThanTheChosenPrefillWorker) {
  auto p = Prompt(480, 7); // 30 blocks; at most 29 are worth fetching (the last token is computed)
  // 0 decode, 1 prefill (chosen), 2 prefill holding 20 blocks, 3 prefill holding all 30, 4 both holding all
  rtr_sched_worker w[] = {W(CFG_ROLE_DECODE), W(CFG_ROLE_PREFILL), W(CFG_ROLE_PREFILL), W(CFG_ROLE_PREFILL),
                          W(CFG_ROLE_BOTH)};
  Hold(x, 2, p, 20);
  Hold(x, 3, p, 30);
  Hold(x, 4, p, 30); // not a prefill worker: it cannot serve a pull
  Hold(x, 0, p, 30);
  int blocks = -1;
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), (int)p.size(), x, 1, 4, &blocks), 3);
  EXPECT_EQ(blocks, 29);
  // the longest holder is down: the next one
  w[3].up = 0;
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), (int)p.size(), x, 1, 4, &blocks), 2);
  EXPECT_EQ(blocks, 20);
  // the chosen worker holds 17 itself: 3 more are under the minimum of 4, but not under 3
  Hold(x, 1, p, 17);
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), (int)p.size(), x, 1, 4, &blocks), -1);
  EXPECT_EQ(blocks, 0);
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), (int)p.size(), x, 1, 3, &blocks), 2);
  // a peer with another block size keys the prompt differently: not asked
  w[2].block_size = 32;
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), (int)p.size(), x, 1, 3, &blocks), -1);
  // nobody else holds a prompt; the chosen worker must be a prefill worker; no index, no hint
  auto q = Prompt(480, 8);
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, q.data(), (int)q.size(), x, 1, 1, &blocks), -1);
  w[3].up = 1;
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), (int)p.size(), x, 4, 1, &blocks), -1);
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), (int)p.size(), nullptr, 1, 1, &blocks), -1);
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), 16, x, 1, 1, &blocks), -1); // one block: nothing to fetch
  EXPECT_EQ(rtr_sched_prefix_peer(w, 5, p.data(), (int)p.size(), x, 1, 1, &blocks), 3);
}

TEST_F(KvRoute, NothingUp) {
  auto p = Prompt(64, 6);
  rtr_sched_worker w[] = {W(CFG_ROLE_PREFILL)};
  w[0].up = 1;
  rtr_sched_target t;
  EXPECT_EQ(rtr_sched_pick_kv(w, 1, p.data(), (int)p.size(), Thr(10), x, &wt, &t, nullptr), -1);
  EXPECT_EQ(rtr_sched_pick_kv(w, 0, p.data(), (int)p.size(), Thr(10), x, &wt, &t, nullptr), -1);
}

} // namespace
