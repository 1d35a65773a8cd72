// tests/cuda/test_forward.cc: the full forward pass on the real GGUF, cuda against the cpu backend (logits and greedy tokens).
#include "models/gguf.h"
#include "models/llama.h"
#include "tests/cuda/cuda_util.h"

namespace {

// Closes the GGUF last (declared before the models, which borrow it).
struct Gguf {
  mdl_gguf *g = nullptr;
  ~Gguf() { mdl_gguf_close(g); }
};

// A model and its KV cache on one backend.
struct Side {
  krn_ctx *kc = nullptr;
  mdl_llama *m = nullptr;
  mdl_kv kv{};
  ~Side() {
    if (kv.base) kc->be->free(kc, kv.base);
    mdl_llama_free(m);
  }
};

int argmax(const float *v, int n, float *gap) {
  int best = 0, second = -1;
  for (int i = 1; i < n; i++) {
    if (v[i] > v[best]) second = best, best = i;
    else if (second < 0 || v[i] > v[second]) second = i;
  }
  *gap = v[best] - v[second];
  return best;
}

} // namespace

TEST_F(CudaTest, ForwardMatchesCpu) {
  const char *path = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
  char err[256] = "";
  Gguf gg;
  if (mdl_gguf_open(path, &gg.g, err, sizeof err)) GTEST_SKIP() << "model weights absent (" << err << "); run scripts/setup.sh";
  krn_ctx host{};
  host.be = krn_cpu_best();
  Side cs, gs;
  cs.kc = &host;
  gs.kc = &gpu;
  ASSERT_EQ(mdl_llama_load(gg.g, cs.kc, &cs.m, err, sizeof err), 0) << err;
  ASSERT_EQ(mdl_llama_load(gg.g, gs.kc, &gs.m, err, sizeof err), 0) << err;
  const mdl_llama_cfg *cfg = mdl_llama_config(cs.m);
  const int bs = 16, n_blocks = 5, V = cfg->n_vocab;
  std::vector<int32_t> bt = {3, 0, 4, 1, 2}; // not in order
  for (Side *s : {&cs, &gs}) {
    s->kv.type = KRN_F16;
    s->kv.block_size = bs;
    s->kv.n_blocks = n_blocks;
    s->kv.base = s->kc->be->alloc(s->kc, mdl_kv_block_bytes(cfg, KRN_F16, bs) * n_blocks);
    ASSERT_NE(s->kv.base, nullptr);
  }
  std::vector<int32_t> toks;
  for (int i = 0; i < 21; i++) toks.push_back((int32_t)((1000 + 337 * i) % V));
  std::vector<float> lc(V), lg(V);
  int pos0 = 0, n_new = (int)toks.size(), compared = 0;
  for (int step = 0; step < 9; step++) {
    SCOPED_TRACE(testing::Message() << "step " << step << " pos0 " << pos0);
    mdl_seq sq{};
    sq.tokens = toks.data() + pos0;
    sq.n_tokens = n_new;
    sq.pos0 = pos0;
    sq.block_table = bt.data();
    sq.n_blocks = n_blocks;
    sq.want_logits = 1;
    ASSERT_EQ(mdl_llama_forward(cs.m, &cs.kv, &sq, 1, lc.data(), nullptr, nullptr, err, sizeof err), 0) << err;
    ASSERT_EQ(mdl_llama_forward(gs.m, &gs.kv, &sq, 1, lg.data(), nullptr, nullptr, err, sizeof err), 0) << err;
    // Prefill (21 rows) goes through the F16 GEMM: looser than the f32 GEMV of the decode steps.
    EXPECT_LT(rel_err(lg, lc), step == 0 ? 3e-2 : 1e-2);
    float gap_c, gap_g;
    const int tc = argmax(lc.data(), V, &gap_c), tg = argmax(lg.data(), V, &gap_g);
    if (gap_c > 0.05f) { // a near tie may flip under rounding; it says nothing about the kernels
      EXPECT_EQ(tg, tc);
      compared++;
    }
    toks.push_back(tc); // both sides continue with the cpu's greedy token
    pos0 += n_new;
    n_new = 1;
  }
  EXPECT_GE(compared, 5) << "too many near ties to compare greedy tokens";
}
