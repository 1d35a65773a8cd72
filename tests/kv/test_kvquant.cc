// tests/kv/test_kvquant.cc: a Q8_0 KV pool (kv_type q8_0): block sizes, what refuses it, blocks as self-describing
// units (read and written whole, as the prefix store's tiers and kvxfer move them), and the wire's type check.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "kv/pool.h"
#include "kv/wire.h"
}

namespace {

void *t_alloc(krn_ctx *, size_t n) { return std::malloc(n); }
void t_free(krn_ctx *, void *p) { std::free(p); }

struct KvQuant : ::testing::Test {
  krn_backend be{};
  krn_ctx kc{};
  mdl_llama_cfg cfg{};
  char err[256] = {0};
  void SetUp() override {
    be.name = "test";
    be.alloc = t_alloc;
    be.free = t_free;
    be.kv_q8_0 = 1; // as the cpu tables
    kc.be = &be;
    cfg.n_layer = 30; // SmolLM2-135M's shape
    cfg.n_kv_head = 3;
    cfg.head_dim = 64;
    cfg.n_head = 9;
    cfg.n_embd = 576;
  }
  kv_pool *pool(krn_type t, size_t budget) {
    kv_pool_opts o{};
    o.type = t;
    o.block_size = 16;
    o.budget_bytes = budget;
    kv_pool *p = nullptr;
    EXPECT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
    return p;
  }
};

// Issue 31's targets on sizes: a q8_0 block is 34/64 of an f16 one (0.531 <= 0.55 per handoff), so the same budget
// holds 1.88x the blocks (>= 1.8x the sequences).
TEST_F(KvQuant, BlocksAreSmallerAndThePoolHoldsMore) {
  size_t f16 = mdl_kv_block_bytes(&cfg, KRN_F16, 16), q8 = mdl_kv_block_bytes(&cfg, KRN_Q8_0, 16);
  EXPECT_EQ(f16, 2u * 30 * 16 * 192 * 2);
  EXPECT_EQ(q8, 2u * 30 * 16 * (192 / 32) * 34); // each position's row: 6 blocks of 32 values + their f16 scale
  EXPECT_LE((double)q8 / (double)f16, 0.55);
  size_t budget = 64u << 20;
  kv_pool *pf = pool(KRN_F16, budget), *pq = pool(KRN_Q8_0, budget);
  ASSERT_TRUE(pf && pq);
  EXPECT_GE((double)kv_pool_total_blocks(pq) / kv_pool_total_blocks(pf), 1.8);
  EXPECT_EQ(kv_pool_block_bytes(pq), q8);
  const mdl_kv *kv = kv_pool_kv(pq);
  EXPECT_EQ(mdl_kv_chunk_bytes(&cfg, kv), 16u * 6 * 34); // the unit kvxfer and the stage move
  size_t bytes = 0;
  char *base = (char *)kv_pool_base(pq, &bytes);
  EXPECT_EQ((char *)mdl_kv_chunk(&cfg, kv, 29, 1, kv->n_blocks - 1) + mdl_kv_chunk_bytes(&cfg, kv), base + bytes);
  kv_pool_free(pf);
  kv_pool_free(pq);
}

// Refused at load, naming why: kernels without q8_0 attention (the cuda table), rows that are not whole blocks.
TEST_F(KvQuant, RefusedWhereItCannotWork) {
  kv_pool_opts o{};
  o.type = KRN_Q8_0;
  o.block_size = 16;
  o.budget_bytes = 1 << 26;
  kv_pool *p = nullptr;
  be.kv_q8_0 = 0;
  be.name = "cuda";
  EXPECT_LT(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "kv_type q8_0: the cuda kernels have no q8_0 paged attention"), nullptr) << err;
  EXPECT_EQ(p, nullptr);
  be.kv_q8_0 = 1;
  cfg.head_dim = 40;
  EXPECT_LT(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "kv_type q8_0 needs head_dim a multiple of 32; this model's is 40"), nullptr) << err;
  o.type = KRN_F16; // f16 takes any head_dim
  ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &p, err, sizeof err), 0) << err;
  kv_pool_free(p);
}

// A block is one self-describing unit: its bytes (values and scales of every layer's K and V) read out and written
// into another block of another pool give that block the same bytes, as the host and disk tiers and a peer fetch do.
TEST_F(KvQuant, BlockBytesTravelWhole) {
  kv_pool *a = pool(KRN_Q8_0, 1 << 24), *b = pool(KRN_Q8_0, 1 << 24);
  ASSERT_TRUE(a && b);
  int32_t ia, ib;
  ASSERT_EQ(kv_pool_alloc(a, &ia, 1), 0);
  ASSERT_EQ(kv_pool_alloc(b, &ib, 1), 0);
  ASSERT_EQ(kv_pool_alloc(b, &ib, 1), 0); // another id than a's
  const mdl_kv *ka = kv_pool_kv(a), *kb = kv_pool_kv(b);
  std::mt19937 rng(3);
  std::vector<float> row(192);
  for (int l = 0; l < 30; l++)
    for (int kvi = 0; kvi < 2; kvi++)
      for (int pos = 0; pos < 16; pos++) {
        for (auto &x : row) x = std::uniform_real_distribution<float>(-3, 3)(rng);
        krn_quant_row_q8_0((krn_block_q8_0 *)mdl_kv_chunk(&cfg, ka, l, kvi, ia) + pos * 6, row.data(), 192);
      }
  std::vector<uint8_t> buf(kv_pool_block_bytes(a));
  ASSERT_EQ(kv_pool_read_block(a, ia, buf.data()), 0);
  ASSERT_EQ(kv_pool_write_block(b, ib, buf.data()), 0);
  for (int l = 0; l < 30; l++)
    for (int kvi = 0; kvi < 2; kvi++)
      ASSERT_EQ(std::memcmp(mdl_kv_chunk(&cfg, ka, l, kvi, ia), mdl_kv_chunk(&cfg, kb, l, kvi, ib),
                            mdl_kv_chunk_bytes(&cfg, ka)),
                0)
          << "layer " << l << (kvi ? " V" : " K");
  kv_pool_free(a);
  kv_pool_free(b);
}

// Workers of different kv_type never exchange blocks: the hello's kv_layout check refuses the link naming both types
// (an f16 reader would take q8_0 bytes for halves: silent garbage). Same type: accepted, with q8_0's chunk size.
TEST_F(KvQuant, WireRefusesAnotherTypeNamingBoth) {
  kv_pool *f = pool(KRN_F16, 1 << 24), *q = pool(KRN_Q8_0, 1 << 24);
  ASSERT_TRUE(f && q);
  prt_kv_layout lf = kv_wire_layout(f), lq = kv_wire_layout(q);
  EXPECT_EQ(lq.type, (int)KRN_Q8_0);
  wrk_kv_remote r{};
  EXPECT_LT(kv_wire_check_layout(&lf, q, &r, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "the peer's pool holds kv_type f16, this worker's q8_0"), nullptr) << err;
  EXPECT_LT(kv_wire_check_layout(&lq, f, &r, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "the peer's pool holds kv_type q8_0, this worker's f16"), nullptr) << err;
  ASSERT_EQ(kv_wire_check_layout(&lq, q, &r, err, sizeof err), 0) << err;
  EXPECT_EQ(r.chunk_bytes, 16u * 6 * 34);
  // bytes per handoff: a 1000-token prompt moves 0.531x the bytes at q8_0
  EXPECT_NEAR(kv_wire_handoff_bytes(q, 1000, 0, nullptr) / kv_wire_handoff_bytes(f, 1000, 0, nullptr), 34.0 / 64, 1e-9);
  kv_pool_free(f);
  kv_pool_free(q);
}

} // namespace
