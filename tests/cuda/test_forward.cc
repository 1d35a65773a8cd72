// tests/cuda/test_forward.cc: the full forward pass on the real GGUF and on a synthetic one, cuda against the scalar f32 reference (logits and greedy tokens), the tolerance sized by a host emulation of the cuda GEMM's f16 rounding.
#include "models/gguf.h"
#include "models/llama.h"
#include "tests/cuda/cuda_util.h"
#include "tests/cuda/synth_model.h"

#include <thread>

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

// The scalar backend with the cuda GEMM path's rounding (emulate_gemm_f16 for n > 8, as kernels/cuda/matmul.cu
// takes that path): a host model of the arithmetic the cuda forward pass does, used to size its tolerance.
void emu_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  const krn_backend *sc = krn_cpu_scalar();
  if (n <= 8 || wt == KRN_F32) {
    sc->matmul(c, y, w, wt, x, n, k, m);
    return;
  }
  std::vector<float> wd((size_t)m * k);
  std::vector<int32_t> ids(m);
  for (int j = 0; j < m; j++) ids[j] = j;
  sc->get_rows(c, wd.data(), w, wt, ids.data(), m, k);
  emulate_gemm_f16(y, wd.data(), wt, x, n, k, m);
}

const krn_backend *emu_backend() {
  static const krn_backend b = [] {
    krn_backend t = *krn_cpu_scalar();
    t.name = "scalar+f16gemm";
    t.matmul = emu_matmul;
    return t;
  }();
  return &b;
}

// Runs prefill (21 tokens) then 8 decode steps on each side, every side fed the reference's greedy tokens; calls
// step(i, logits of each side) after each. Side 0 is the reference.
template <typename F>
void run_steps(mdl_gguf *g, const std::vector<krn_ctx *> &ctxs, F step) {
  char err[256] = "";
  std::vector<Side> sides(ctxs.size());
  for (size_t i = 0; i < ctxs.size(); i++) {
    sides[i].kc = ctxs[i];
    ASSERT_EQ(mdl_llama_load(g, sides[i].kc, &sides[i].m, err, sizeof err), 0) << ctxs[i]->be->name << ": " << err;
  }
  const mdl_llama_cfg *cfg = mdl_llama_config(sides[0].m);
  const int bs = 16, n_blocks = 5, V = cfg->n_vocab;
  std::vector<int32_t> bt = {3, 0, 4, 1, 2}; // not in order
  for (Side &s : sides) {
    s.kv.type = KRN_F16;
    s.kv.block_size = bs;
    s.kv.n_blocks = n_blocks;
    s.kv.base = s.kc->be->alloc(s.kc, mdl_kv_block_bytes(cfg, KRN_F16, bs) * n_blocks);
    ASSERT_NE(s.kv.base, nullptr);
  }
  std::vector<int32_t> toks;
  for (int i = 0; i < 21; i++) toks.push_back((int32_t)((1000 + 337 * i) % V));
  std::vector<std::vector<float>> logits(sides.size(), std::vector<float>(V));
  int pos0 = 0, n_new = (int)toks.size();
  for (int st = 0; st < 9; st++) {
    SCOPED_TRACE(testing::Message() << "step " << st << " pos0 " << pos0);
    mdl_seq sq{};
    sq.tokens = toks.data() + pos0;
    sq.n_tokens = n_new;
    sq.pos0 = pos0;
    sq.block_table = bt.data();
    sq.n_blocks = n_blocks;
    sq.want_logits = 1;
    for (size_t i = 0; i < sides.size(); i++)
      ASSERT_EQ(mdl_llama_forward(sides[i].m, &sides[i].kv, &sq, 1, logits[i].data(), nullptr, nullptr, err, sizeof err), 0)
          << sides[i].kc->be->name << ": " << err;
    step(st, cfg, logits);
    float gap;
    toks.push_back(argmax(logits[0].data(), V, &gap)); // every side continues with the reference's greedy token
    pos0 += n_new;
    n_new = 1;
  }
}

// The tolerance of the cuda logits against the scalar f32 reference, per step: the cuda forward pass rounds what the
// emulation rounds (x and the weight type's dequantized values to f16 in every GEMM, i.e. the 21-row prefill; the
// decode steps are f32 GEMVs that inherit the prefill's K/V), applied to inputs that differ from the emulation's
// only by f32 summation order; so its error is another draw of the same roundings: allowed 3x the emulation's error,
// plus the f32 floor 4 k_max 2^-24 (twice the summation bound 2 gamma_k of one matmul, k_max = max(n_embd, n_ff),
// for the other ops' f32 differences: attention, softmax, norms, rope at positions < 32).
double forward_tol(const mdl_llama_cfg *cfg, double emu_err) {
  return 3 * emu_err + 4.0 * std::max(cfg->n_embd, cfg->n_ff) * std::ldexp(1.0, -24);
}

// Prefill then decode steps on the scalar reference, its f16-GEMM emulation, and gpu (a cuda ctx): logits within
// forward_tol, greedy tokens equal wherever the reference's winner stands clear of twice the tolerance.
void forward_matches_cpu(mdl_gguf *g, krn_ctx *gpu) {
  Gguf gg;
  gg.g = g;
  krn_pool *pool = krn_pool_new(std::min(16, std::max(1, (int)std::thread::hardware_concurrency())), nullptr, 0);
  krn_ctx ref{}, emu{};
  ref.be = krn_cpu_scalar();
  emu.be = emu_backend();
  ref.pool = emu.pool = pool;
  int compared = 0;
  double emu_prefill = 0;
  run_steps(gg.g, {&ref, &emu, gpu}, [&](int st, const mdl_llama_cfg *cfg, const std::vector<std::vector<float>> &l) {
    const double e_emu = rel_err(l[1], l[0]), tol = forward_tol(cfg, e_emu), e_gpu = rel_err(l[2], l[0]);
    if (st == 0) emu_prefill = e_emu;
    EXPECT_LT(e_gpu, tol) << "emulated f16 GEMM error " << e_emu;
    const int V = cfg->n_vocab;
    float gap_c, gap_g, mx = 1;
    for (float v : l[0]) mx = std::max(mx, std::fabs(v));
    const int tc = argmax(l[0].data(), V, &gap_c), tg = argmax(l[2].data(), V, &gap_g);
    if (gap_c > 2 * tol * mx) { // a nearer tie may flip under the allowed rounding; it says nothing about the kernels
      EXPECT_EQ(tg, tc);
      compared++;
    }
  });
  EXPECT_GT(emu_prefill, 0.0) << "the prefill took no GEMM path: the tolerance was not sized by it";
  EXPECT_GE(compared, 5) << "too many near ties to compare greedy tokens";
  krn_pool_free(pool);
}

} // namespace

// DSERVE_CUDA_TEST_MODEL names another GGUF (scripts/gpu-check.sh passes a copy cut to a few layers by
// scripts/gguf_truncate.py where the full model could not be fetched).
TEST_F(CudaTest, ForwardMatchesCpu) {
  const char *env = getenv("DSERVE_CUDA_TEST_MODEL");
  const char *path = env && env[0] ? env : DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
  char err[256] = "";
  mdl_gguf *g = nullptr;
  if (mdl_gguf_open(path, &g, err, sizeof err)) GTEST_SKIP() << "model weights absent (" << err << "); run scripts/setup.sh";
  forward_matches_cpu(g, &gpu);
}

// Gemma 3 270M (scripts/fetch_gemma.sh): GELU FFN, q/k and post norms, sliding-window layers, K-quant weights.
TEST_F(CudaTest, GemmaForwardMatchesCpu) {
  const char *path = DSERVE_SOURCE_DIR "/models/weights/gemma-3-270m-q4_k_m.gguf";
  char err[256] = "";
  mdl_gguf *g = nullptr;
  if (mdl_gguf_open(path, &g, err, sizeof err)) GTEST_SKIP() << "Gemma 3 absent (" << err << "); run scripts/fetch_gemma.sh";
  forward_matches_cpu(g, &gpu);
}

// Runs where the real GGUF cannot be fetched (a GPU machine without network): the same check on random weights.
TEST_F(CudaTest, ForwardMatchesCpuOnSyntheticModel) {
  auto bytes = dserve_test::synth_model(dserve_test::tiny_shape(), 11);
  char err[256] = "";
  mdl_gguf *g = nullptr;
  ASSERT_EQ(mdl_gguf_from_memory(bytes.data(), bytes.size(), &g, err, sizeof err), 0) << err;
  forward_matches_cpu(g, &gpu);
}

// The generator itself, checked where there is no GPU: it loads, and a cpu forward pass gives finite logits
// with a clear winner (so that the gpu test above has greedy tokens to compare).
TEST(SynthModel, LoadsAndRunsOnCpu) {
  auto bytes = dserve_test::synth_model(dserve_test::tiny_shape(), 11);
  char err[256] = "";
  mdl_gguf *g = nullptr;
  ASSERT_EQ(mdl_gguf_from_memory(bytes.data(), bytes.size(), &g, err, sizeof err), 0) << err;
  krn_ctx host{};
  host.be = krn_cpu_best();
  mdl_llama *m = nullptr;
  ASSERT_EQ(mdl_llama_load(g, &host, &m, err, sizeof err), 0) << err;
  const mdl_llama_cfg *cfg = mdl_llama_config(m);
  EXPECT_EQ(cfg->n_layer, dserve_test::tiny_shape().n_layer);
  EXPECT_EQ(cfg->n_kv_head, 2);
  EXPECT_EQ(cfg->head_dim, 64);
  mdl_kv kv{};
  kv.type = KRN_F16;
  kv.block_size = 16;
  kv.n_blocks = 2;
  std::vector<uint8_t> pool(mdl_kv_block_bytes(cfg, KRN_F16, 16) * 2);
  kv.base = pool.data();
  std::vector<int32_t> toks = {1, 5, 9, 200, 31, 7}, bt = {1, 0};
  mdl_seq sq{};
  sq.tokens = toks.data();
  sq.n_tokens = (int)toks.size();
  sq.block_table = bt.data();
  sq.n_blocks = 2;
  sq.want_logits = 1;
  std::vector<float> lo(cfg->n_vocab);
  ASSERT_EQ(mdl_llama_forward(m, &kv, &sq, 1, lo.data(), nullptr, nullptr, err, sizeof err), 0) << err;
  float mx = -1e30f, mn = 1e30f;
  for (float x : lo) {
    ASSERT_TRUE(std::isfinite(x));
    mx = std::max(mx, x);
    mn = std::min(mn, x);
  }
  EXPECT_GT(mx - mn, 1.0f) << "logits nearly flat: the weights are scaled too small";
  // decode steps continue greedily; the winners must stand clear for the gpu test to compare them
  int clear = 0;
  for (int step = 0; step < 8; step++) {
    float gap;
    toks.push_back(argmax(lo.data(), cfg->n_vocab, &gap));
    clear += gap > 0.05f;
    sq.tokens = toks.data() + toks.size() - 1;
    sq.n_tokens = 1;
    sq.pos0 = (int)toks.size() - 1;
    ASSERT_EQ(mdl_llama_forward(m, &kv, &sq, 1, lo.data(), nullptr, nullptr, err, sizeof err), 0) << err;
  }
  EXPECT_GE(clear, 6);
  mdl_llama_free(m);
  mdl_gguf_close(g);
}

// The emulation that sizes the forward tolerance, where there is no GPU: on the synthetic model it rounds (the
// prefill's logits move) by about what f16 GEMMs should (well under 1% of the largest logit), and its greedy
// tokens stay the reference's where those stand clear.
TEST(EmulatedGemm, SizesTheForwardTolerance) {
  auto bytes = dserve_test::synth_model(dserve_test::tiny_shape(), 11);
  char err[256] = "";
  Gguf gg;
  ASSERT_EQ(mdl_gguf_from_memory(bytes.data(), bytes.size(), &gg.g, err, sizeof err), 0) << err;
  krn_ctx ref{}, emu{};
  ref.be = krn_cpu_scalar();
  emu.be = emu_backend();
  std::vector<double> errs;
  int compared = 0;
  run_steps(gg.g, {&ref, &emu}, [&](int, const mdl_llama_cfg *cfg, const std::vector<std::vector<float>> &l) {
    errs.push_back(rel_err(l[1], l[0]));
    float gap_c, gap_e, mx = 1;
    for (float v : l[0]) mx = std::max(mx, std::fabs(v));
    const int tc = argmax(l[0].data(), cfg->n_vocab, &gap_c), te = argmax(l[1].data(), cfg->n_vocab, &gap_e);
    if (gap_c > 2 * forward_tol(cfg, errs.back()) * mx) {
      EXPECT_EQ(te, tc);
      compared++;
    }
  });
  ASSERT_EQ(errs.size(), 9u);
  EXPECT_GT(errs[0], 0.0) << "the 21-row prefill did not go through the emulated GEMM";
  for (double e : errs) EXPECT_LT(e, 1e-2);
  EXPECT_GE(compared, 5);
  printf("emulated f16 GEMM: logit error %.2g at prefill, %.2g at the last decode step\n", errs[0], errs.back());
}

// Decode steps replayed from CUDA graphs against plain steps, batch of 3 on the synthetic model: the padded
// block-table width may change how attention splits the context, so logits agree to rounding, tokens exactly.
TEST_F(CudaTest, GraphStepsMatchPlainSteps) {
  auto bytes = dserve_test::synth_model(dserve_test::tiny_shape(), 11);
  char err[256] = "";
  Gguf gg;
  ASSERT_EQ(mdl_gguf_from_memory(bytes.data(), bytes.size(), &gg.g, err, sizeof err), 0) << err;
  krn_ctx gpu2{};
  gpu2.be = krn_cuda();
  ASSERT_EQ(gpu2.be->ctx_init(&gpu2, 0, err, sizeof err), 0) << err;
  {
    Side plain, graphed;
    plain.kc = &gpu;
    graphed.kc = &gpu2;
    ASSERT_EQ(mdl_llama_load(gg.g, plain.kc, &plain.m, err, sizeof err), 0) << err;
    ASSERT_EQ(mdl_llama_load(gg.g, graphed.kc, &graphed.m, err, sizeof err), 0) << err;
    ASSERT_EQ(mdl_llama_set_graphs(graphed.m, 1, err, sizeof err), 0) << err;
    const mdl_llama_cfg *cfg = mdl_llama_config(plain.m);
    const int V = cfg->n_vocab, S = 3, per = 8;
    for (Side *s : {&plain, &graphed}) {
      s->kv.type = KRN_F16;
      s->kv.block_size = 16;
      s->kv.n_blocks = S * per;
      s->kv.base = s->kc->be->alloc(s->kc, mdl_kv_block_bytes(cfg, KRN_F16, 16) * S * per);
      ASSERT_NE(s->kv.base, nullptr);
    }
    std::vector<std::vector<int32_t>> toks(S);
    std::vector<int32_t> bt(S * per);
    for (int i = 0; i < S * per; i++) bt[i] = (i * 7) % (S * per); // scattered
    for (int i = 0; i < S; i++)
      for (int j = 0; j < 20 + 9 * i; j++) toks[i].push_back((int32_t)((31 * j + 101 * i + 7) % V));
    std::vector<float> lp(S * V), lg(S * V);
    int compared = 0;
    for (int step = 0; step < 40; step++) {
      SCOPED_TRACE(testing::Message() << "step " << step);
      std::vector<mdl_seq> b(S);
      for (int i = 0; i < S; i++) {
        b[i].n_tokens = step ? 1 : (int)toks[i].size();
        b[i].pos0 = step ? (int)toks[i].size() - 1 : 0;
        b[i].tokens = toks[i].data() + b[i].pos0;
        b[i].block_table = bt.data() + i * per;
        b[i].n_blocks = per;
        b[i].want_logits = 1;
      }
      ASSERT_EQ(mdl_llama_forward(plain.m, &plain.kv, b.data(), S, lp.data(), nullptr, nullptr, err, sizeof err), 0)
          << err;
      ASSERT_EQ(mdl_llama_forward(graphed.m, &graphed.kv, b.data(), S, lg.data(), nullptr, nullptr, err, sizeof err), 0)
          << err;
      EXPECT_LT(rel_err(lg, lp), 1e-3);
      for (int i = 0; i < S; i++) {
        float gp, gq;
        const int tp = argmax(lp.data() + (size_t)i * V, V, &gp), tq = argmax(lg.data() + (size_t)i * V, V, &gq);
        if (gp > 0.05f) {
          EXPECT_EQ(tq, tp);
          compared++;
        }
        toks[i].push_back(tp);
      }
    }
    long replayed = 0, recorded = 0;
    mdl_llama_graph_stats(graphed.m, &replayed, &recorded);
    EXPECT_GE(replayed, 30) << "decode steps did not run from graphs";
    EXPECT_GE(recorded, 1);
    EXPECT_GE(compared, 60);
  }
  gpu2.be->ctx_fini(&gpu2);
}
