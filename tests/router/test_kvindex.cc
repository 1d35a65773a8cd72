// tests/router/test_kvindex.cc: the router's KV-aware index: events, overlap, caps, worker removal, scoring, and agreement with a worker's store.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "kv/pool.h"
#include "kv/prefix.h"
#include "router/kvindex.h"
}

namespace {

kv_event add(uint64_t k) { return kv_event{k, KV_EVENT_ADDED}; }
kv_event rem(uint64_t k) { return kv_event{k, KV_EVENT_REMOVED}; }

struct KvIndex : ::testing::Test {
  rtr_kvindex *x = nullptr;
  char err[256] = {0};
  void TearDown() override { rtr_kvindex_free(x); }
  void make(int workers, int cap) { ASSERT_EQ(rtr_kvindex_new(workers, cap, &x, err, sizeof err), 0) << err; }
  void apply(int w, std::vector<kv_event> ev) { ASSERT_EQ(rtr_kvindex_apply(x, w, ev.data(), (int)ev.size()), 0); }
};

TEST_F(KvIndex, BadArgumentsAreRefused) {
  EXPECT_LT(rtr_kvindex_new(0, 10, &x, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "max_workers"), nullptr) << err;
  EXPECT_LT(rtr_kvindex_new(4, 0, &x, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "cap_per_worker"), nullptr) << err;
  EXPECT_EQ(x, nullptr);
  make(2, 8);
  kv_event e = add(1);
  EXPECT_LT(rtr_kvindex_apply(x, 2, &e, 1), 0);
  EXPECT_LT(rtr_kvindex_apply(x, -1, &e, 1), 0);
  EXPECT_LT(rtr_kvindex_apply(x, 0, nullptr, 1), 0);
  uint64_t k = 1;
  EXPECT_EQ(rtr_kvindex_overlap(x, 5, &k, 1), 0);
  EXPECT_EQ(rtr_kvindex_count(x, 5), 0);
  rtr_kvindex_remove_worker(x, 7); // ignored
  rtr_kvindex_free(nullptr);
}

// A router's links grow as members join: the index grows with them and keeps what its workers told it.
TEST_F(KvIndex, GrowsKeepingItsWorkers) {
  make(2, 64);
  apply(1, {add(10), add(11)});
  kv_event e = add(1);
  EXPECT_LT(rtr_kvindex_apply(x, 40, &e, 1), 0);
  ASSERT_EQ(rtr_kvindex_grow(x, 64), 0);
  ASSERT_EQ(rtr_kvindex_grow(x, 8), 0); // never shrinks
  apply(40, {add(10)});
  uint64_t p[] = {10, 11};
  EXPECT_EQ(rtr_kvindex_overlap(x, 1, p, 2), 2);
  EXPECT_EQ(rtr_kvindex_overlap(x, 40, p, 2), 1);
  EXPECT_EQ(rtr_kvindex_count(x, 63), 0);
}

TEST_F(KvIndex, OverlapCountsLeadingBlocksOnly) {
  make(3, 64);
  apply(0, {add(10), add(11), add(12), add(20)});
  apply(1, {add(10), add(12)});
  uint64_t p[] = {10, 11, 12, 13};
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, p, 4), 3);
  EXPECT_EQ(rtr_kvindex_overlap(x, 1, p, 4), 1); // 12 is held but 11 is not: stops at the first miss
  EXPECT_EQ(rtr_kvindex_overlap(x, 2, p, 4), 0); // never heard from
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, p, 2), 2);
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, p, 0), 0);
  apply(0, {rem(11), rem(999)}); // removing an unknown key is harmless
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, p, 4), 1);
  EXPECT_EQ(rtr_kvindex_count(x, 0), 3);
  apply(0, {add(11), add(11)}); // duplicates count once
  EXPECT_EQ(rtr_kvindex_count(x, 0), 4);
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, p, 4), 3);
  // Order matters: remove then add leaves the key; add then remove does not.
  apply(2, {rem(5), add(5)});
  apply(1, {add(6), rem(6)});
  uint64_t k5 = 5, k6 = 6;
  EXPECT_EQ(rtr_kvindex_overlap(x, 2, &k5, 1), 1);
  EXPECT_EQ(rtr_kvindex_overlap(x, 1, &k6, 1), 0);
}

TEST_F(KvIndex, ClearedAndWorkerRemovalDropEverything) {
  make(2, 64);
  apply(0, {add(1), add(2)});
  apply(1, {add(1), add(2)});
  uint64_t p[] = {1, 2};
  apply(0, {kv_event{0, KV_EVENT_CLEARED}, add(1)});
  EXPECT_EQ(rtr_kvindex_count(x, 0), 1);
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, p, 2), 1);
  rtr_kvindex_remove_worker(x, 1);
  EXPECT_EQ(rtr_kvindex_count(x, 1), 0);
  EXPECT_EQ(rtr_kvindex_overlap(x, 1, p, 2), 0);
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, p, 2), 1); // the other worker is untouched
  apply(1, {add(2)});                            // a worker that comes back starts empty
  EXPECT_EQ(rtr_kvindex_count(x, 1), 1);
  apply(1, {kv_event{0, 77}}); // unknown kinds are skipped
  EXPECT_EQ(rtr_kvindex_count(x, 1), 1);
}

TEST_F(KvIndex, CapForgetsTheOldestKeys) {
  make(1, 4);
  apply(0, {add(1), add(2), add(3), add(4)});
  apply(0, {add(1)}); // refreshed: 2 is now the oldest
  apply(0, {add(5), add(6)});
  EXPECT_EQ(rtr_kvindex_count(x, 0), 4);
  for (uint64_t k : {1, 4, 5, 6}) EXPECT_EQ(rtr_kvindex_overlap(x, 0, &k, 1), 1) << k;
  for (uint64_t k : {2, 3}) EXPECT_EQ(rtr_kvindex_overlap(x, 0, &k, 1), 0) << k;
  // Churn far past the cap stays bounded and consistent.
  for (uint64_t k = 100; k < 10000; k++) {
    kv_event e = add(k);
    ASSERT_EQ(rtr_kvindex_apply(x, 0, &e, 1), 0);
    if (k % 3 == 0) {
      e = rem(k - 1);
      ASSERT_EQ(rtr_kvindex_apply(x, 0, &e, 1), 0);
    }
  }
  EXPECT_LE(rtr_kvindex_count(x, 0), 4);
  uint64_t last = 9999;
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, &last, 1), 1);
}

TEST_F(KvIndex, ScoreFollowsTheDocumentedFormula) {
  rtr_kvindex_weights w = rtr_kvindex_weights_default();
  EXPECT_DOUBLE_EQ(w.overlap, 2.0);
  EXPECT_DOUBLE_EQ(w.queue, 1.0);
  EXPECT_DOUBLE_EQ(w.free, 1.0);
  w = {3.0, 0.5, 0.25};
  EXPECT_DOUBLE_EQ(rtr_kvindex_score(&w, 2, 8, 3, 30, 120), 3.0 * 2 / 8 + 0.5 / 4 + 0.25 * 30 / 120);
  EXPECT_DOUBLE_EQ(rtr_kvindex_score(&w, 0, 0, 0, 0, 0), 0.5); // no prompt blocks, no pool: queue term only
  // clamping
  EXPECT_DOUBLE_EQ(rtr_kvindex_score(&w, 9, 8, -2, 200, 100), 3.0 + 0.5 + 0.25);
  EXPECT_DOUBLE_EQ(rtr_kvindex_score(nullptr, 4, 4, 1, 0, 10), 2.0 + 0.5);
  // more overlap, shorter queue, more free blocks: each strictly better
  EXPECT_GT(rtr_kvindex_score(nullptr, 3, 4, 1, 5, 10), rtr_kvindex_score(nullptr, 2, 4, 1, 5, 10));
  EXPECT_GT(rtr_kvindex_score(nullptr, 2, 4, 0, 5, 10), rtr_kvindex_score(nullptr, 2, 4, 1, 5, 10));
  EXPECT_GT(rtr_kvindex_score(nullptr, 2, 4, 1, 6, 10), rtr_kvindex_score(nullptr, 2, 4, 1, 5, 10));
}

TEST_F(KvIndex, PickWeighsOverlapAgainstLoad) {
  make(3, 64);
  uint64_t p[] = {1, 2, 3, 4};
  apply(1, {add(1), add(2), add(3), add(4)});
  rtr_kvindex_load c[] = {{0, 0, 100, 100}, {1, 1, 50, 100}, {2, 0, 100, 100}};
  int ov = -1;
  // cached worker: 2 + 0.5 + 0.5 = 3.0 beats idle ones at 0 + 1 + 1 = 2.0
  EXPECT_EQ(rtr_kvindex_pick(x, nullptr, p, 4, c, 3, &ov), 1);
  EXPECT_EQ(ov, 4);
  // heavily queued with a small overlap weight: 0.5 + 1/21 + 0.5 loses to an idle 0 + 1 + 1
  rtr_kvindex_weights w = {0.5, 1.0, 1.0};
  c[1].queue_len = 20;
  EXPECT_EQ(rtr_kvindex_pick(x, &w, p, 4, c, 3, &ov), 0); // tie between 0 and 2: the earlier
  EXPECT_EQ(ov, 0);
  c[0].queue_len = 1;
  c[2].queue_len = 1;
  c[0].free_blocks = 90;
  c[2].free_blocks = 90;
  EXPECT_EQ(rtr_kvindex_pick(x, &w, p, 4, c, 3, nullptr), 0);
  EXPECT_EQ(rtr_kvindex_pick(x, &w, p, 4, c, 0, &ov), -1);
  // A worker the index lost (dead) has no overlap anymore.
  rtr_kvindex_remove_worker(x, 1);
  c[1].queue_len = 0;
  c[1].free_blocks = 100;
  EXPECT_EQ(rtr_kvindex_pick(x, nullptr, p, 4, c, 3, &ov), 1); // now simply the idlest
  EXPECT_EQ(ov, 0);
}

void *t_alloc(krn_ctx *, size_t n) { return std::calloc(1, n); }
void t_free(krn_ctx *, void *p) { std::free(p); }

// The router's keys (kv_blockhash_chain over the prompt) name exactly what the worker's store holds.
TEST_F(KvIndex, AgreesWithAWorkersStoreThroughEvents) {
  krn_backend be{};
  be.name = "test";
  be.alloc = t_alloc;
  be.free = t_free;
  krn_ctx kc{};
  kc.be = &be;
  mdl_llama_cfg cfg{};
  cfg.n_layer = 1;
  cfg.n_kv_head = 1;
  cfg.head_dim = 2;
  kv_pool_opts po{};
  po.type = KRN_F32;
  po.block_size = 8;
  po.budget_bytes = mdl_kv_block_bytes(&cfg, KRN_F32, 8) * 12;
  kv_pool *pool = nullptr;
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &po, &pool, err, sizeof err), 0) << err;
  kv_prefix_opts so{};
  so.budget_blocks = 6;
  kv_prefix *st = nullptr;
  ASSERT_EQ(kv_prefix_new(pool, &so, &st, err, sizeof err), 0) << err;
  make(1, 1024);
  auto ship = [&]() {
    kv_event ev[16];
    int n;
    while ((n = kv_prefix_drain_events(st, ev, 16)) > 0) ASSERT_EQ(rtr_kvindex_apply(x, 0, ev, n), 0);
  };
  auto run = [&](int first_tok, int n_toks) {
    std::vector<int32_t> t(n_toks);
    for (int i = 0; i < n_toks; i++) t[i] = first_tok + i;
    kv_blocks b{};
    ASSERT_EQ(kv_blocks_reserve(pool, &b, n_toks), 0);
    kv_prefix_insert(st, t.data(), n_toks, b.ids, b.n);
    kv_blocks_release(pool, &b);
  };
  run(0, 8 * 4 + 3); // 4 blocks
  run(1000, 8 * 3);  // 3 blocks: over the budget of 6, the LRU leaf of the first prompt goes
  ship();
  std::vector<int32_t> q(8 * 4 + 3);
  for (int i = 0; i < (int)q.size(); i++) q[i] = i;
  uint64_t keys[8];
  int nk = kv_blockhash_chain(nullptr, q.data(), (int)q.size(), 8, keys, 8);
  ASSERT_EQ(nk, 4);
  int32_t ids[8];
  int nm = kv_prefix_match(st, q.data(), (int)q.size(), ids, 8);
  EXPECT_EQ(nm, 3);
  EXPECT_EQ(rtr_kvindex_overlap(x, 0, keys, nk), nm);
  EXPECT_EQ(rtr_kvindex_count(x, 0), 6);
  for (int i = 0; i < nm; i++) kv_pool_unref(pool, ids[i]);
  kv_prefix_clear(st);
  ship();
  EXPECT_EQ(rtr_kvindex_count(x, 0), 0);
  kv_prefix_free(st);
  kv_pool_free(pool);
}

} // namespace
