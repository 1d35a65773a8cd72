// tests/models/test_f32_weights.cc: mdl_llama_opts.f32_weights, the F32 reference bench/accuracy.sh scores against.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "model_util.h"

namespace {

const char *kSmol = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
const char *kGemma = DSERVE_SOURCE_DIR "/models/weights/gemma-3-270m-q4_k_m.gguf";

// The logits of every position of a 24-token prompt (ids spread over the vocabulary), (24, n_vocab), on backend be,
// with the weights as the file stores them or dequantized to F32. The KV cache is F32, so that only the weights'
// path differs between runs.
std::vector<float> logits(const char *model, const krn_backend *be, int f32_weights, int *n_vocab) {
  ModelEngine e;
  e.opts.f32_weights = f32_weights;
  if (!e.open(model, 4, be, KRN_F32, " (run scripts/setup.sh)")) return {};
  const int V = e.cfg->n_vocab, n = 24;
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; i++) p[i] = (int32_t)((7919L * (i + 1)) % (V - 1)) + 1;
  auto bt = e.blocks(2);
  std::vector<float> out((size_t)n * V, NAN);
  mdl_seq s = {p.data(), n, 0, bt.data(), 2, 0};
  EXPECT_EQ(mdl_llama_forward_all(e.m, &e.kv, &s, out.data(), e.err, sizeof e.err), 0) << e.err;
  *n_vocab = V;
  return out;
}

// The largest |a - b| over rows, each relative to the row's spread of b (max - min), which is what a softmax sees.
double max_rel_diff(const std::vector<float> &a, const std::vector<float> &b, int V) {
  double worst = 0;
  for (size_t r = 0; r * V < b.size(); r++) {
    const float *x = a.data() + r * V, *y = b.data() + r * V;
    float lo = y[0], hi = y[0];
    double d = 0;
    for (int i = 0; i < V; i++) {
      lo = std::fmin(lo, y[i]);
      hi = std::fmax(hi, y[i]);
      d = std::fmax(d, std::fabs((double)x[i] - y[i]));
      if (std::isnan(x[i]) != std::isnan(y[i])) d = INFINITY;
    }
    worst = std::fmax(worst, d / (hi - lo));
  }
  return worst;
}

// The scalar backend multiplies the scalar dequantization of each weight row in double, whatever the weight's type:
// the same rows stored as F32 must give the same logits bit for bit (a row dequantized to the wrong place, or a
// tensor missed, changes them). On the best SIMD backend, F32 weights leave out the activation quantization of its
// quantized dot products, so its logits stay within float rounding of the scalar reference: well inside the gap the
// quantized path shows (which the test also prints).
void check(const char *model) {
  const krn_backend *best = krn_cpu_best();
  int V = 0;
  auto ref = logits(model, krn_cpu_scalar(), 0, &V);
  ASSERT_FALSE(ref.empty());
  auto ref32 = logits(model, krn_cpu_scalar(), 1, &V);
  ASSERT_EQ(ref32.size(), ref.size());
  for (size_t i = 0; i < ref.size(); i++)
    ASSERT_EQ(ref32[i], ref[i]) << "scalar, F32 weights vs the file's: logit " << i % V << " of row " << i / V;
  auto best32 = logits(model, best, 1, &V), bestq = logits(model, best, 0, &V);
  double d32 = max_rel_diff(best32, ref, V), dq = max_rel_diff(bestq, ref, V);
  printf("%s on %s vs scalar: F32 weights %.3g, the file's weights %.3g (max |diff| / row spread)\n", model,
         best->name, d32, dq);
  EXPECT_LT(d32, 1e-4) << best->name; // float sums of ~600-2000 products, against the double ones
  if (best != krn_cpu_scalar()) {
    EXPECT_LE(d32, dq) << best->name;
  }
}

TEST(F32Weights, SmolLM2LogitsMatchTheScalarReference) { check(kSmol); }

TEST(F32Weights, Gemma3LogitsMatchTheScalarReference) {
  if (access(kGemma, R_OK) != 0) GTEST_SKIP() << "missing " << kGemma << " (run scripts/fetch_gemma.sh)";
  check(kGemma);
}

// Off by default: mdl_llama_load and zeroed options use the mapping in place (the default path is unchanged).
TEST(F32Weights, RefusedOnCuda) {
  const krn_backend *cu = krn_cuda();
  if (!cu || krn_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: the refusal is cuda's";
  ModelEngine e;
  ASSERT_EQ(mdl_gguf_open(kSmol, &e.g, e.err, sizeof e.err), 0) << e.err;
  krn_ctx kc{};
  kc.be = cu;
  ASSERT_EQ(cu->ctx_init(&kc, 0, e.err, sizeof e.err), 0) << e.err;
  mdl_llama_opts o{};
  o.f32_weights = 1;
  mdl_llama *m = nullptr;
  EXPECT_NE(mdl_llama_load_opts(e.g, &kc, &o, &m, e.err, sizeof e.err), 0);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(e.err).find("F32 weights"), std::string::npos) << e.err;
  cu->ctx_fini(&kc);
}

} // namespace
