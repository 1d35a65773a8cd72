// tests/worker/engine_fixture.h: a one-layer model's engine over a small pool, without a model: test_engine.cc's plans
// and test_spec.cc's drafts do a step's bookkeeping on it.
#ifndef DSERVE_TESTS_WORKER_ENGINE_FIXTURE_H
#define DSERVE_TESTS_WORKER_ENGINE_FIXTURE_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

extern "C" {
#include "kv/pool.h"
#include "worker/engine.h"
}

namespace engine_test {

inline void *t_alloc(krn_ctx *, size_t n) { return std::calloc(1, n); }
inline void t_free(krn_ctx *, void *p) { std::free(p); }

struct Engine : ::testing::Test {
  krn_backend be{};
  krn_ctx kc{};
  mdl_llama_cfg cfg{};
  cfg_worker wc{};
  wrk_runtime rt{};
  wrk_engine eng{};
  std::vector<std::unique_ptr<wrk_seq>> seqs;
  char err[256] = {0};
  bool made = false;

  // The engine over a pool of pool_blocks blocks; prefix_mb > 0: with a prefix cache that size.
  void make(int pool_blocks, double prefix_mb) {
    be.name = "test";
    be.alloc = t_alloc;
    be.free = t_free;
    kc.be = &be;
    cfg.n_layer = cfg.n_kv_head = cfg.n_head = 1;
    cfg.head_dim = cfg.n_embd = 4;
    kv_pool_opts o{};
    o.type = KRN_F32;
    o.block_size = 16;
    o.budget_bytes = mdl_kv_block_bytes(&cfg, KRN_F32, 16) * (size_t)pool_blocks;
    ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &rt.kv, err, sizeof err), 0) << err;
    ASSERT_EQ(kv_pool_total_blocks(rt.kv), pool_blocks);
    wc.max_batch_tokens = 512;
    wc.max_seqs = 64;
    wc.prefix_cache_mb = prefix_mb;
    rt.w = &wc;
    ASSERT_EQ(wrk_engine_init(&eng, &rt, err, sizeof err), 0) << err;
    made = true;
  }
  void TearDown() override {
    if (!made) return;
    wrk_engine_fini(&eng);
    for (auto &s : seqs) wrk_seq_fini(s.get(), rt.kv);
    kv_pool_free(rt.kv);
  }
  // Token i of the prompts add makes.
  virtual int32_t token_at(int i) const = 0;
  // A running sequence of n tokens, done of them already in the cache (n - 1: a decode row).
  wrk_seq *add(int n, int done) {
    std::vector<int32_t> toks(n);
    for (int i = 0; i < n; i++) toks[i] = token_at(i);
    seqs.push_back(std::make_unique<wrk_seq>());
    wrk_seq *s = seqs.back().get();
    EXPECT_EQ(wrk_seq_init(s, toks.data(), n, nullptr), 0);
    EXPECT_EQ(kv_blocks_reserve(rt.kv, &s->blocks, done), 0);
    s->n_done = done;
    EXPECT_EQ(wrk_engine_start(&eng, s), 0);
    return s;
  }
  // The tokens the last plan gave s (0: none).
  int chunk_of(const wrk_seq *s) const {
    for (int i = 0; i < eng.n_batch; i++)
      if (eng.batch_of[i] == s) return eng.batch_chunk[i];
    return 0;
  }
};

} // namespace engine_test

#endif
