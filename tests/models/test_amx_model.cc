// tests/models/test_amx_model.cc: SmolLM2's prefill on the amx kernels (tile emulation here, real AMX where present) against avx512.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <unistd.h>
#include <vector>

#include "tests/models/model_util.h"

extern "C" {
#include "kernels/cpu/cpu.h"
}

namespace {

const char *kSmol = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
const char *kGemma = DSERVE_SOURCE_DIR "/models/weights/gemma-3-270m-q4_k_m.gguf";

// A 32-token prompt (one full tile step of activation rows: every projection of every layer goes through the tiles;
// the output layer sees the last row only, on VNNI rows) and its last position's logits on be.
std::vector<float> prefill_logits(const char *model, const krn_backend *be) {
  ModelEngine e;
  if (!e.open(model, 4, be, KRN_F16, " (the real model is needed: run scripts/setup.sh)")) return {};
  std::vector<int32_t> prompt(32), blocks = e.blocks(4);
  for (int i = 0; i < 32; i++) prompt[i] = (int32_t)((i * 7919 + 11) % e.cfg->n_vocab);
  std::vector<float> logits(e.cfg->n_vocab);
  mdl_seq s = {prompt.data(), (int)prompt.size(), 0, blocks.data(), (int)blocks.size(), 1};
  if (mdl_llama_forward(e.m, &e.kv, &s, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err) != 0) {
    ADD_FAILURE() << e.err;
    return {};
  }
  return logits;
}

// The amx table multiplies the avx512 path's own int8 bytes and differs by float rounding only, but through the
// layers a rounding difference flips the int8 rounding of some activation and the logits part by far more than the
// rounding (0.53 on SmolLM2, measured): so each is held to its distance from the exact scalar reference (double sums
// of the dequantized weights, no activation quantization), amx's within 1.25x avx512's, and the greedy token agrees.
void expect_like_avx512(const char *model, const krn_backend *amx) {
  std::vector<float> ref = prefill_logits(model, krn_cpu_scalar()), want = prefill_logits(model, krn_cpu_by_name("avx512"));
  std::vector<float> got = prefill_logits(model, amx);
  ASSERT_FALSE(ref.empty());
  ASSERT_EQ(want.size(), ref.size());
  ASSERT_EQ(got.size(), ref.size());
  float d_amx = 0, d_avx = 0, d = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    d_amx = std::fmax(d_amx, std::fabs(got[i] - ref[i]));
    d_avx = std::fmax(d_avx, std::fabs(want[i] - ref[i]));
    d = std::fmax(d, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(d_amx, 1.25f * d_avx) << amx->name << " is " << d_amx << " from scalar's logits, avx512 " << d_avx;
  EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(), std::max_element(want.begin(), want.end()) - want.begin());
  std::fprintf(stderr, "%s, 32-token prefill, max |logit diff| from scalar: %s %.4f, avx512 %.4f; between them %.4f\n",
               model, amx->name, d_amx, d_avx, d);
}

TEST(AmxModel, EmulatedTilesPrefillLikeAvx512) {
  if (!krn_cpu_by_name("avx512")) GTEST_SKIP() << "no AVX-512 on this CPU (the amx kernels, emulated ones too, build on it)";
  expect_like_avx512(kSmol, krn_cpu_amx_emulated_table());
  if (access(kGemma, R_OK) != 0) GTEST_SKIP() << "missing " << kGemma << " (run scripts/fetch_gemma.sh)";
  expect_like_avx512(kGemma, krn_cpu_amx_emulated_table()); // Q4_K, Q5_0, Q6_K and a Q8_0 output layer
}

TEST(AmxModel, AmxPrefillLikeAvx512) {
  const krn_backend *amx = krn_cpu_by_name("amx");
  if (!amx) GTEST_SKIP() << "no AMX on this CPU (amx: " << krn_cpu_amx_absent() << ")";
  expect_like_avx512(kSmol, amx);
  if (access(kGemma, R_OK) != 0) GTEST_SKIP() << "missing " << kGemma << " (run scripts/fetch_gemma.sh)";
  expect_like_avx512(kGemma, amx);
}

} // namespace
