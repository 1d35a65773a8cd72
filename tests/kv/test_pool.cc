// tests/kv/test_pool.cc: the paged KV block pool: sizing, reserve/release accounting, thread safety.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "../models/model_util.h"

extern "C" {
#include "kv/pool.h"
#include "kv/wire.h"
}

namespace {

// A backend with only memory ops, counting live allocations, so the test sees the pool free what it took.
std::atomic<int> g_live{0};
void *t_alloc(krn_ctx *, size_t n) {
  g_live++;
  return std::malloc(n);
}
void t_free(krn_ctx *, void *p) {
  if (p) g_live--;
  std::free(p);
}

struct KvPool : ::testing::Test {
  krn_backend be{};
  krn_ctx kc{};
  mdl_llama_cfg cfg{};
  char err[256] = {0};
  void SetUp() override {
    be.name = "test";
    be.alloc = t_alloc;
    be.free = t_free;
    kc.be = &be;
    cfg.n_layer = 30;
    cfg.n_kv_head = 3;
    cfg.head_dim = 64;
    cfg.n_head = 9;
    cfg.n_embd = 576;
  }
};

TEST_F(KvPool, BudgetSizing) {
  size_t bb = mdl_kv_block_bytes(&cfg, KRN_F16, 16);
  EXPECT_EQ(bb, 2u * 30 * 16 * 3 * 64 * 2);
  EXPECT_EQ(mdl_kv_block_bytes(&cfg, KRN_F32, 16), 2 * bb);
  kv_pool_opts o{};
  o.budget_bytes = bb * 10 + bb / 2;
  o.type = KRN_F16;
  o.block_size = 16;
  kv_pool *p = nullptr;
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
  EXPECT_EQ(kv_pool_total_blocks(p), 10);
  EXPECT_EQ(kv_pool_free_blocks(p), 10);
  size_t bytes = 0;
  void *base = kv_pool_base(p, &bytes);
  EXPECT_NE(base, nullptr);
  EXPECT_EQ(bytes, bb * 10);
  const mdl_kv *kv = kv_pool_kv(p);
  EXPECT_EQ(kv->n_blocks, 10);
  EXPECT_EQ(kv->block_size, 16);
  EXPECT_EQ(kv->type, KRN_F16);
  EXPECT_EQ(kv->base, base);
  // chunk layout: (layer, K|V, block) contiguous chunks, the last one ending at the end of the buffer
  size_t chunk = mdl_kv_chunk_bytes(&cfg, kv);
  EXPECT_EQ(chunk, 16u * 3 * 64 * 2);
  EXPECT_EQ((char *)mdl_kv_chunk(&cfg, kv, 0, 1, 0) - (char *)base, (ptrdiff_t)(10 * chunk));
  EXPECT_EQ((char *)mdl_kv_chunk(&cfg, kv, 29, 1, 9) + chunk, (char *)base + bytes);
  EXPECT_EQ(g_live.load(), 1);
  kv_pool_free(p);
  EXPECT_EQ(g_live.load(), 0);
  kv_pool_free(nullptr);
}

TEST_F(KvPool, BadOptionsAreRefused) {
  kv_pool_opts o{};
  o.budget_bytes = 100; // less than one block
  o.type = KRN_F16;
  o.block_size = 16;
  kv_pool *p = nullptr;
  EXPECT_LT(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "holds no block"), nullptr) << err;
  EXPECT_EQ(p, nullptr);
  o.budget_bytes = 1 << 30;
  o.type = KRN_Q4_0;
  EXPECT_LT(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "Q4_0"), nullptr) << err;
  EXPECT_EQ(g_live.load(), 0);
}

TEST_F(KvPool, ReserveGrowsAndReleaseReturnsEverything) {
  kv_pool_opts o{};
  o.type = KRN_F32;
  o.block_size = 16;
  o.budget_bytes = mdl_kv_block_bytes(&cfg, KRN_F32, 16) * 8;
  kv_pool *p = nullptr;
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
  kv_blocks a{}, b{};
  ASSERT_EQ(kv_blocks_reserve(p, &a, 1), 0);
  EXPECT_EQ(a.n, 1);
  EXPECT_EQ(kv_pool_free_blocks(p), 7);
  ASSERT_EQ(kv_blocks_reserve(p, &a, 16), 0); // still one block
  EXPECT_EQ(a.n, 1);
  ASSERT_EQ(kv_blocks_reserve(p, &a, 17), 0); // grows by one, keeps the first
  EXPECT_EQ(a.n, 2);
  int32_t first = a.ids[0];
  ASSERT_EQ(kv_blocks_reserve(p, &a, 40), 0);
  EXPECT_EQ(a.n, 3);
  EXPECT_EQ(a.ids[0], first);
  EXPECT_EQ(kv_pool_free_blocks(p), 5);
  // short pool: nothing taken
  EXPECT_LT(kv_blocks_reserve(p, &b, 16 * 6), 0);
  EXPECT_EQ(b.n, 0);
  EXPECT_EQ(kv_pool_free_blocks(p), 5);
  ASSERT_EQ(kv_blocks_reserve(p, &b, 16 * 5), 0);
  EXPECT_EQ(kv_pool_free_blocks(p), 0);
  EXPECT_LT(kv_blocks_reserve(p, &a, 16 * 3 + 1), 0);
  EXPECT_EQ(a.n, 3);
  std::set<int32_t> ids(a.ids, a.ids + a.n);
  ids.insert(b.ids, b.ids + b.n);
  EXPECT_EQ(ids.size(), 8u); // every block handed out once
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 8);
  kv_blocks_release(p, &a);
  EXPECT_EQ(a.n, 0);
  EXPECT_EQ(kv_pool_free_blocks(p), 3);
  kv_blocks_release(p, &b);
  kv_blocks_release(p, &b); // already empty: no-op
  EXPECT_EQ(kv_pool_free_blocks(p), 8);
  // reusable after release
  ASSERT_EQ(kv_blocks_reserve(p, &a, 128), 0);
  EXPECT_EQ(kv_pool_free_blocks(p), 0);
  kv_blocks_release(p, &a);
  EXPECT_EQ(kv_pool_free_blocks(p), 8);
  kv_pool_free(p);
}

TEST_F(KvPool, ConcurrentReserveReleaseUnderFourThreads) {
  kv_pool_opts o{};
  o.type = KRN_F16;
  o.block_size = 16;
  o.budget_bytes = mdl_kv_block_bytes(&cfg, KRN_F16, 16) * 64;
  kv_pool *p = nullptr;
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
  std::vector<std::vector<int>> owner(4);
  std::atomic<int> failures{0}, overlap{0};
  std::vector<std::atomic<int>> held(64);
  for (auto &h : held) h = 0;
  auto work = [&](int tid) {
    unsigned seed = 1234u + (unsigned)tid;
    for (int it = 0; it < 20000; it++) {
      kv_blocks b{};
      int n = 1 + (int)(rand_r(&seed) % 300);
      if (kv_blocks_reserve(p, &b, n) != 0) {
        failures++;
        continue;
      }
      for (int i = 0; i < b.n; i++)
        if (held[b.ids[i]].fetch_add(1) != 0) overlap++;
      for (int i = 0; i < b.n; i++) held[b.ids[i]].fetch_sub(1);
      kv_blocks_release(p, &b);
    }
  };
  std::vector<std::thread> th;
  for (int i = 0; i < 4; i++) th.emplace_back(work, i);
  for (auto &t : th) t.join();
  EXPECT_EQ(overlap.load(), 0); // no block was ever handed to two tables at once
  EXPECT_EQ(kv_pool_free_blocks(p), 64);
  kv_pool_free(p);
  EXPECT_EQ(g_live.load(), 0);
}

// A window-only handoff (Gemma 3's local layers): which blocks each layer is sent, what that weighs, and that the
// decode worker is told not to reuse blocks some layer was not sent.
TEST_F(KvPool, SlidingWindowLayersAreSentOnlyTheBlocksTheyReadAgain) {
  cfg.n_layer = 6;
  cfg.n_swa = 64;
  cfg.swa_pattern = 3; // layers 0, 1, 3, 4 local; 2, 5 global
  const int bs = 16;
  EXPECT_EQ(kv_wire_first_live_block(&cfg, 2, 1000, bs), 0);  // global: every block
  EXPECT_EQ(kv_wire_first_live_block(&cfg, 0, 1000, bs), 58); // local: (1000 - 64) / 16, holding position 936
  EXPECT_EQ(kv_wire_first_live_block(&cfg, 4, 64, bs), 0);    // a prompt inside the window: every block
  EXPECT_EQ(kv_wire_first_live_block(&cfg, 4, 80, bs), 1);
  // Position 1000 (the first decoded token) sees (936, 1000]: block 58 holds 928..943, so it must be sent and
  // block 57 (912..927) need not.
  EXPECT_LE(58 * bs, 1000 - 64 + 1);
  EXPECT_GT(58 * bs + bs, 1000 - 64 + 1);
  kv_pool_opts o{};
  o.type = KRN_F16;
  o.block_size = bs;
  o.budget_bytes = mdl_kv_block_bytes(&cfg, KRN_F16, bs) * 70;
  kv_pool *p = nullptr;
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
  double per_layer_block = (double)kv_pool_block_bytes(p) / 6;
  int dead = -1;
  // 63 blocks: 2 global layers x 63 + 4 local layers x (63 - 58)
  EXPECT_DOUBLE_EQ(kv_wire_handoff_bytes(p, 1000, 0, &dead), (2 * 63 + 4 * 5) * per_layer_block);
  EXPECT_EQ(dead, 1);
  EXPECT_DOUBLE_EQ(kv_wire_handoff_bytes(p, 1000, 60, &dead), 6 * 3 * per_layer_block); // decode held 60
  EXPECT_EQ(dead, 0);
  EXPECT_DOUBLE_EQ(kv_wire_handoff_bytes(p, 50, 0, &dead), 6 * 4 * per_layer_block); // inside the window
  EXPECT_EQ(dead, 0);
  kv_pool_free(p);
  cfg.n_swa = 0; // no sliding window: every layer, every block
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
  EXPECT_DOUBLE_EQ(kv_wire_handoff_bytes(p, 1000, 0, &dead), 6 * 63 * per_layer_block);
  EXPECT_EQ(dead, 0);
  kv_pool_free(p);
}

TEST_F(KvPool, SlidingWindowModelsKeepLayerGroupsInTheirOwnPages) {
  cfg.n_layer = 6;
  cfg.n_swa = 64;
  cfg.swa_pattern = 3; // layers 0, 1, 3, 4 local; 2, 5 global
  int16_t group[6], slot[6];
  ASSERT_EQ(mdl_kv_plan_groups(&cfg, group, slot), 3); // 2 global, 4 local layers: groups of gcd(2, 4) = 2
  const int16_t want_group[6] = {1, 1, 0, 2, 2, 0}, want_slot[6] = {0, 1, 0, 0, 1, 1};
  for (int l = 0; l < 6; l++) {
    EXPECT_EQ(group[l], want_group[l]) << l;
    EXPECT_EQ(slot[l], want_slot[l]) << l;
  }
  const int bs = 16;
  size_t bb = mdl_kv_block_bytes(&cfg, KRN_F16, bs);
  kv_pool_opts o{};
  o.type = KRN_F16;
  o.block_size = bs;
  o.budget_bytes = bb * 10;
  kv_pool *p = nullptr;
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
  const mdl_kv *kv = kv_pool_kv(p);
  ASSERT_EQ(kv_pool_groups(p), 3);
  EXPECT_EQ(kv_pool_window(p), 64);
  EXPECT_EQ(kv->n_blocks, 30); // pages
  EXPECT_EQ(kv_pool_total_blocks(p), 10);
  size_t bytes = 0;
  char *base = (char *)kv_pool_base(p, &bytes);
  EXPECT_EQ(bytes, bb * 10);
  // every (layer, K|V, page) chunk of one group is its own, inside the buffer; layers of different groups share slots
  size_t chunk = mdl_kv_chunk_bytes(&cfg, kv);
  std::set<std::pair<int, ptrdiff_t>> seen;
  for (int l = 0; l < 6; l++)
    for (int k = 0; k < 2; k++)
      for (int pg = 0; pg < 30; pg++) {
        char *c = (char *)mdl_kv_chunk(&cfg, kv, l, k, pg);
        EXPECT_GE(c, base);
        EXPECT_LE(c + chunk, base + bytes);
        EXPECT_TRUE(seen.insert({group[l], c - base}).second) << l << " " << k << " " << pg;
      }

  // 10 blocks for 160 positions take every page
  kv_blocks a{};
  ASSERT_EQ(kv_blocks_reserve(p, &a, 160), 0);
  EXPECT_EQ(kv_pool_free_blocks(p), 0);
  for (int i = 0; i < 10; i++) {
    EXPECT_TRUE(kv_pool_whole(p, a.ids[i]));
    EXPECT_EQ(mdl_kv_page(kv, a.ids[i], 0), a.ids[i]);
  }
  // Once 160 positions are computed, a window of 64 never reads blocks 0..5 again (position 160 sees 97..160).
  EXPECT_EQ(kv_blocks_slide(p, &a, 160), 6);
  EXPECT_EQ(kv_blocks_slide(p, &a, 160), 0);
  int reclaimable = -1;
  EXPECT_EQ(kv_pool_free_pages(p, &reclaimable), 0);
  EXPECT_EQ(reclaimable, 12); // 6 blocks x 2 local groups
  EXPECT_EQ(kv_pool_free_blocks(p), 4);
  EXPECT_TRUE(kv_pool_whole(p, a.ids[0])); // still attached: a prefix store could serve it
  EXPECT_EQ(kv_pool_usable_prefix(p, a.ids, 10), 10);

  // A second table shares block 9 (pinned by both) and takes 4 new blocks: their 12 pages come from the reclaimable
  // window pages, oldest first.
  kv_pool_ref(p, a.ids[9]);
  kv_blocks b{};
  ASSERT_EQ(kv_blocks_append(p, &b, a.ids + 9, 1), 0);
  ASSERT_EQ(kv_blocks_reserve(p, &b, 5 * bs), 0);
  EXPECT_EQ(kv_pool_free_blocks(p), 0);
  EXPECT_LT(kv_blocks_reserve(p, &b, 6 * bs), 0); // nothing left, and nothing pinned was taken
  for (int i = 0; i < 6; i++) {
    EXPECT_FALSE(kv_pool_whole(p, a.ids[i])) << i;
    EXPECT_EQ(mdl_kv_page(kv, a.ids[i], 0), a.ids[i]); // the global group stays
    EXPECT_EQ(mdl_kv_page(kv, a.ids[i], 1), -1);
  }
  for (int i = 6; i < 10; i++) EXPECT_TRUE(kv_pool_whole(p, a.ids[i])) << i;
  std::vector<char> host(bb);
  EXPECT_LT(kv_pool_read_block(p, a.ids[0], host.data()), 0); // not one block's bytes any more
  EXPECT_EQ(kv_pool_read_block(p, a.ids[9], host.data()), 0);
  // As a cached prefix: all 10 blocks serve (position 160's window reads blocks 6..9), 8 would not (block 4..7).
  EXPECT_EQ(kv_pool_usable_prefix(p, a.ids, 10), 10);
  EXPECT_EQ(kv_pool_usable_prefix(p, a.ids, 8), 0);

  // b slides past its first block, which a still pins: it stays out of the reclaimable pages
  EXPECT_EQ(kv_blocks_slide(p, &b, 64 + bs), 1); // position 80 sees 17..80: block 0 passed
  kv_pool_free_pages(p, &reclaimable);
  EXPECT_EQ(reclaimable, 0);
  kv_blocks_release(p, &a);
  kv_pool_free_pages(p, &reclaimable);
  EXPECT_EQ(reclaimable, 2); // now nobody pins block 9's window pages
  kv_blocks_release(p, &b);
  EXPECT_EQ(kv_pool_free_pages(p, &reclaimable), 30);
  EXPECT_EQ(reclaimable, 0);
  EXPECT_EQ(kv_pool_free_blocks(p), 10);

  // A window-only handoff: the table slides to the prompt's end before it takes its blocks, and those before the
  // window get no window pages at all.
  EXPECT_EQ(kv_blocks_slide(p, &a, 160), 0); // nothing held yet to unpin
  EXPECT_EQ(a.slid, 6);
  ASSERT_EQ(kv_blocks_reserve(p, &a, 160), 0);
  EXPECT_EQ(kv_pool_free_pages(p, &reclaimable), 12);
  EXPECT_EQ(reclaimable, 0);
  EXPECT_FALSE(kv_pool_whole(p, a.ids[5]));
  EXPECT_TRUE(kv_pool_whole(p, a.ids[6]));
  // what one sequence holds at most, in blocks' worth of pages: every block's global pages, and window pages for
  // (window + chunk) / 16 + 2 blocks
  EXPECT_EQ(kv_pool_blocks_needed(p, 48, 16), 3);                      // inside the window: every page
  EXPECT_EQ(kv_pool_blocks_needed(p, 160, 16), (10 + 2 * 7 + 2) / 3);   // 10 global pages + 7 blocks x 2
  EXPECT_EQ(kv_pool_blocks_needed(p, 1600, 16), (100 + 2 * 7 + 2) / 3); // 100 global pages + 7 blocks x 2
  EXPECT_EQ(kv_pool_usable_prefix(p, a.ids, 10), 10);
  EXPECT_EQ(kv_pool_usable_prefix(p, a.ids, 9), 0);
  kv_blocks_release(p, &a);
  EXPECT_EQ(kv_pool_free_pages(p, nullptr), 30);
  kv_pool_free(p);

  o.plain = 1; // the plain layout on request: one group, nothing given back
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
  EXPECT_EQ(kv_pool_groups(p), 1);
  EXPECT_EQ(kv_pool_kv(p)->n_blocks, 10);
  ASSERT_EQ(kv_blocks_reserve(p, &a, 160), 0);
  EXPECT_EQ(kv_blocks_slide(p, &a, 160), 0);
  EXPECT_EQ(kv_pool_usable_prefix(p, a.ids, 8), 8);
  kv_blocks_release(p, &a);
  kv_pool_free(p);
}

// Gemma 3 270M on a pool of 45 blocks' bytes: a prompt of 1100 tokens (69 blocks) does not fit the plain layout but
// fits once the 15 local layers give back what their 512-token window passed (the 3 global layers keep all 69). Run
// chunk by chunk, sliding after each, it gives the logits of a plain pool large enough for the whole prompt: pages
// reclaimed too early would have been overwritten by later chunks' and change them.
TEST(KvPoolGemma, WindowPagesGoBackAndTheLogitsStayTheSame) {
  const char *model = DSERVE_SOURCE_DIR "/models/weights/gemma-3-270m-q4_k_m.gguf";
  if (access(model, R_OK) != 0) GTEST_SKIP() << "missing " << model << " (run scripts/fetch_gemma.sh)";
  ModelEngine e;
  ASSERT_TRUE(e.open(model, 1, nullptr, KRN_F16));
  const int P = 1100, chunk = 128, V = e.cfg->n_vocab;
  std::vector<int32_t> prompt(P);
  unsigned r = 11;
  for (int32_t &t : prompt) t = 1000 + (int32_t)((r = r * 1103515245u + 12345u) >> 8) % 20000;
  auto run = [&](kv_pool *pool, std::vector<float> &logits) { // false when the pool ran short
    kv_blocks b{};
    bool ok = true;
    for (int at = 0; at < P && ok; at += chunk) {
      int n = std::min(chunk, P - at);
      if (kv_blocks_reserve(pool, &b, at + n) != 0) {
        ok = false;
        break;
      }
      mdl_seq s = {prompt.data() + at, n, at, b.ids, b.n, 1};
      ok = ok && mdl_llama_forward(e.m, kv_pool_kv(pool), &s, 1, logits.data(), nullptr, nullptr, e.err,
                                   sizeof e.err) == 0;
      EXPECT_TRUE(ok) << e.err;
      kv_blocks_slide(pool, &b, at + n);
    }
    kv_blocks_release(pool, &b);
    return ok;
  };
  size_t bb = mdl_kv_block_bytes(e.cfg, KRN_F16, 16);
  kv_pool_opts o{};
  o.type = KRN_F16;
  o.block_size = 16;
  o.plain = 1;
  o.budget_bytes = bb * 80;
  kv_pool *plain = nullptr, *small = nullptr;
  ASSERT_EQ(kv_pool_new(e.cfg, &e.kc, &o, &plain, e.err, sizeof e.err), 0) << e.err;
  std::vector<float> want(V), got(V);
  ASSERT_TRUE(run(plain, want));
  kv_pool_free(plain);
  o.budget_bytes = bb * 45; // the run peaks at 264 pages (44 blocks' worth) in its chunk at 896
  ASSERT_EQ(kv_pool_new(e.cfg, &e.kc, &o, &plain, e.err, sizeof e.err), 0) << e.err;
  kv_blocks b{};
  EXPECT_LT(kv_blocks_reserve(plain, &b, P), 0) << "the plain layout should not hold the prompt in 45 blocks";
  kv_pool_free(plain);
  o.plain = 0;
  ASSERT_EQ(kv_pool_new(e.cfg, &e.kc, &o, &small, e.err, sizeof e.err), 0) << e.err;
  ASSERT_EQ(kv_pool_groups(small), 6); // 3 global layers, 15 local: groups of 3
  ASSERT_TRUE(run(small, got)) << "the grouped pool ran short";
  float d = 0;
  for (int i = 0; i < V; i++) d = std::fmax(d, std::fabs(want[i] - got[i]));
  EXPECT_EQ(d, 0.0f) << "the grouped pool's logits differ from the plain pool's by " << d;
  EXPECT_EQ(kv_pool_free_blocks(small), kv_pool_total_blocks(small));
  kv_pool_free(small);
  // 43 blocks (258 pages) are less than the window needs at the peak: the pins keep the pages the window reads, so
  // the pool runs short instead of handing them out.
  o.budget_bytes = bb * 43;
  ASSERT_EQ(kv_pool_new(e.cfg, &e.kc, &o, &small, e.err, sizeof e.err), 0) << e.err;
  EXPECT_FALSE(run(small, got)) << "a pool smaller than the window's pages gave some of them out";
  EXPECT_EQ(kv_pool_free_blocks(small), kv_pool_total_blocks(small));
  kv_pool_free(small);
}

} // namespace
