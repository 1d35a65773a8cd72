// tests/kv/test_pool_discard.cc: kv_pool_discard: a pool made for the null model (opts.unread) gives the memory pages
// of the blocks named back to the system (they read as zeros after); every other pool keeps them as they are.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "kv/pool.h"
}

namespace {

void *page_alloc(krn_ctx *, size_t n) { return std::aligned_alloc(4096, (n + 4095) / 4096 * 4096); }
void page_free(krn_ctx *, void *p) { std::free(p); }

struct Discard : ::testing::TestWithParam<int> { // the parameter: a shareable (memfd) pool or a private one
  krn_backend be{};
  krn_ctx kc{};
  mdl_llama_cfg cfg{};
  char err[256] = {0};
  void SetUp() override {
    be.name = "test";
    be.alloc = page_alloc;
    be.free = page_free;
    kc.be = &be;
    cfg.n_layer = 4; // the null model's geometry at 36864 bytes a token: a chunk is 16 x 4608 bytes, 18 pages
    cfg.n_head = cfg.n_kv_head = 36;
    cfg.head_dim = 64;
    cfg.n_embd = 36 * 64;
  }
  kv_pool *make(int unread) {
    kv_pool_opts o{};
    o.budget_bytes = 8 * mdl_kv_block_bytes(&cfg, KRN_F16, 16);
    o.type = KRN_F16;
    o.block_size = 16;
    o.shareable = GetParam();
    o.unread = unread;
    kv_pool *p = nullptr;
    EXPECT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
    return p;
  }
  // Every byte of block b's chunks (all layers and parts) set to v, or checked against it.
  void fill(kv_pool *p, int32_t b, uint8_t v) {
    size_t n = mdl_kv_chunk_bytes(&cfg, kv_pool_kv(p));
    for (int l = 0; l < cfg.n_layer; l++)
      for (int part = 0; part < 2; part++) std::memset(mdl_kv_chunk(&cfg, kv_pool_kv(p), l, part, b), v, n);
  }
  int count(kv_pool *p, int32_t b, uint8_t v) {
    size_t n = mdl_kv_chunk_bytes(&cfg, kv_pool_kv(p));
    int c = 0;
    for (int l = 0; l < cfg.n_layer; l++)
      for (int part = 0; part < 2; part++) {
        const uint8_t *q = static_cast<const uint8_t *>(mdl_kv_chunk(&cfg, kv_pool_kv(p), l, part, b));
        for (size_t i = 0; i < n; i++) c += q[i] == v;
      }
    return c;
  }
};

TEST_P(Discard, AnUnreadPoolGivesTheBlocksPagesBack) {
  kv_pool *p = make(1);
  ASSERT_NE(p, nullptr);
  int32_t ids[2];
  ASSERT_EQ(kv_pool_alloc(p, ids, 2), 0);
  int whole = 2 * cfg.n_layer * (int)mdl_kv_chunk_bytes(&cfg, kv_pool_kv(p));
  fill(p, ids[0], 0xab);
  fill(p, ids[1], 0xcd);
  kv_pool_discard(p, ids, 1);
  // the chunks are 18 whole pages each (the pool's base is page-aligned here): all of block 0 reads zeros
  EXPECT_EQ(count(p, ids[0], 0), whole);
  EXPECT_EQ(count(p, ids[1], 0xcd), whole); // its neighbour is untouched
  int32_t bad = 1 << 20;
  kv_pool_discard(p, &bad, 1); // an id out of range is ignored
  kv_pool_unref(p, ids[0]);
  kv_pool_unref(p, ids[1]);
  kv_pool_free(p);
}

TEST_P(Discard, AnyOtherPoolKeepsItsBytes) {
  kv_pool *p = make(0);
  ASSERT_NE(p, nullptr);
  int32_t id;
  ASSERT_EQ(kv_pool_alloc(p, &id, 1), 0);
  fill(p, id, 0x5a);
  kv_pool_discard(p, &id, 1);
  EXPECT_EQ(count(p, id, 0x5a), 2 * cfg.n_layer * (int)mdl_kv_chunk_bytes(&cfg, kv_pool_kv(p)));
  kv_pool_unref(p, id);
  kv_pool_free(p);
}

INSTANTIATE_TEST_SUITE_P(Pools, Discard, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) { return i.param ? "Shareable" : "Private"; });

} // namespace
