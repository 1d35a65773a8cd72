// tests/models/test_rope.cc: RoPE scaling from the GGUF (models/llama.c mdl_rope_freqs and its loading): the
// frequencies against the formulas of ggml's rope (linear, YaRN, frequency factors), the forward pass using them,
// and the load errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model_util.h"
#include "tests/cuda/synth_model.h"

extern "C" {
#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"
}

namespace {

using dserve_test::GgufWriter;

// The formulas, in double, as ggml defines them (ggml/src/ggml-cpu/ops.cpp rope_yarn, rope_yarn_ramp; ggml.c
// ggml_rope_yarn_corr_dims; llama.cpp src/llama-context.cpp for the YaRN attention factor): pair i's base frequency
// base^(-2i/d) / ff_i; linear divides it by the factor; YaRN mixes that with the unscaled one by a ramp over pair
// indices between the correction dims of beta_fast and beta_slow.
struct Ref {
  std::vector<double> inv;
  double mscale;
};

Ref reference(const mdl_rope_scaling &s, int d, double base) {
  Ref r;
  double fs = s.type == MDL_ROPE_NONE ? 1.0 : 1.0 / s.factor;
  auto corr = [&](double beta) { return d * std::log(s.n_ctx_orig / (beta * 2 * M_PI)) / (2 * std::log(base)); };
  double lo = std::max(0.0, std::floor(corr(s.beta_fast))), hi = std::min(d - 1.0, std::ceil(corr(s.beta_slow)));
  for (int i = 0; i < d / 2; i++) {
    double theta = std::pow(base, -2.0 * i / d) / (s.freq_factors ? s.freq_factors[i] : 1.0);
    double interp = fs * theta;
    if (s.type == MDL_ROPE_YARN) {
      double ramp = 1 - std::min(1.0, std::max(0.0, (i - lo) / std::max(0.001, hi - lo)));
      r.inv.push_back(interp * (1 - ramp) + theta * ramp);
    } else {
      r.inv.push_back(interp);
    }
  }
  // llama.cpp: attn_factor = get_mscale(factor) / (1 + 0.1 ln factor) * rope.scaling.attn_factor, and ggml's rope
  // multiplies it by 1 + 0.1 ln factor again: what remains is get_mscale(factor) * attn_factor
  r.mscale = s.attn_factor * (s.type == MDL_ROPE_YARN && s.factor > 1 ? 0.1 * std::log(s.factor) + 1.0 : 1.0);
  return r;
}

void expect_matches(const mdl_rope_scaling &s, int d, float base, const char *what) {
  std::vector<float> inv(d / 2);
  float ms = 0;
  mdl_rope_freqs(&s, d, base, inv.data(), &ms);
  Ref r = reference(s, d, base);
  for (int i = 0; i < d / 2; i++) EXPECT_NEAR(inv[i], r.inv[i], 2e-6 * r.inv[i] + 1e-12) << what << " pair " << i;
  EXPECT_NEAR(ms, r.mscale, 1e-6) << what;
}

TEST(RopeScaling, FrequenciesMatchTheFormulas) {
  mdl_rope_scaling s{};
  s.attn_factor = 1;
  s.n_ctx_orig = 4096;
  s.beta_fast = 32;
  s.beta_slow = 1;
  for (int d : {64, 128}) {
    for (float base : {10000.0f, 500000.0f}) {
      s.type = MDL_ROPE_NONE;
      s.factor = 8;
      expect_matches(s, d, base, "none (the factor is ignored)");
      s.type = MDL_ROPE_LINEAR;
      for (float f : {1.0f, 2.0f, 8.0f, 0.5f}) {
        s.factor = f;
        expect_matches(s, d, base, "linear");
      }
      s.type = MDL_ROPE_YARN;
      for (float f : {1.0f, 4.0f, 32.0f}) {
        s.factor = f;
        expect_matches(s, d, base, "yarn");
      }
    }
  }
  // frequency factors (Llama 3.x's rope_freqs.weight), alone and with a linear factor; an attention factor
  std::vector<float> ff(64);
  for (int i = 0; i < 64; i++) ff[i] = 1.0f + (float)i / 8;
  s.freq_factors = ff.data();
  s.type = MDL_ROPE_NONE;
  expect_matches(s, 128, 500000.0f, "freq factors");
  s.type = MDL_ROPE_LINEAR;
  s.factor = 2;
  s.attn_factor = 0.75f;
  expect_matches(s, 128, 500000.0f, "freq factors and linear");
}

// Hand-worked YaRN case: d 128, base 10000, 4096 trained positions, factor 4. The correction dims are
// 128 ln(4096 / (2 pi 32)) / (2 ln 10000) = 20.95 -> 20 and 128 ln(4096 / (2 pi)) / (2 ln 10000) = 45.03 -> 46:
// pairs up to 20 keep their frequency, pairs from 46 on are divided by 4, and the magnitude is 1 + 0.1 ln 4.
TEST(RopeScaling, YarnByHand) {
  mdl_rope_scaling s{};
  s.type = MDL_ROPE_YARN;
  s.factor = 4;
  s.attn_factor = 1;
  s.n_ctx_orig = 4096;
  s.beta_fast = 32;
  s.beta_slow = 1;
  std::vector<float> inv(64);
  float ms = 0;
  mdl_rope_freqs(&s, 128, 10000.0f, inv.data(), &ms);
  for (int i : {0, 10, 20}) EXPECT_NEAR(inv[i], std::pow(10000.0, -2.0 * i / 128), 1e-6 * std::pow(10000.0, -2.0 * i / 128)) << i;
  for (int i : {46, 50, 63})
    EXPECT_NEAR(inv[i], std::pow(10000.0, -2.0 * i / 128) / 4, 1e-6 * std::pow(10000.0, -2.0 * i / 128)) << i;
  // pair 33: ramp 1 - (33 - 20) / 26 = 0.5: halfway between the two
  double b33 = std::pow(10000.0, -2.0 * 33 / 128);
  EXPECT_NEAR(inv[33], b33 * (0.25 * 0.5 + 0.5), 1e-6 * b33);
  EXPECT_NEAR(ms, 1 + 0.1 * std::log(4.0), 1e-6);
}

// A tiny synthetic llama (tests/cuda/synth_model.h) with the given rope keys, on the scalar backend.
struct Model : MemModel {
  explicit Model(const std::function<void(GgufWriter &)> &keys) : MemModel(bytes_of(keys), krn_cpu_scalar(), 4) {}
  static std::vector<uint8_t> bytes_of(const std::function<void(GgufWriter &)> &keys) {
    dserve_test::SynthShape sh = dserve_test::tiny_shape();
    sh.n_layer = 2;
    return dserve_test::synth_model(sh, 7, keys);
  }
  // last-position logits of a 40-token prompt (positions far enough apart for the scaling to matter)
  std::vector<float> logits() { return MemModel::logits(40); }
};

void f32(GgufWriter &w, const char *k, float v) { w.scalar<float>(k, MDL_GGUF_F32, v); }

TEST(RopeScaling, LoadedModelsScaleTheirRope) {
  Model plain([](GgufWriter &) {});
  ASSERT_EQ(plain.rc, 0) << plain.err;
  EXPECT_EQ(plain.cfg()->rope_scaled, 0); // no keys: llama.cpp's "linear" with factor 1, i.e. plain RoPE
  Model linear([](GgufWriter &w) {
    w.str("llama.rope.scaling.type", "linear");
    f32(w, "llama.rope.scaling.factor", 4);
  });
  ASSERT_EQ(linear.rc, 0) << linear.err;
  ASSERT_EQ(linear.cfg()->rope_scaled, 1);
  EXPECT_STREQ(linear.cfg()->rope_scaling, "linear");
  int hd = linear.cfg()->head_dim;
  for (int i = 0; i < hd / 2; i++)
    EXPECT_FLOAT_EQ(linear.cfg()->rope_inv_freq[i], std::pow(10000.0f, -2.0f * i / hd) / 4) << i;
  // the same scaling as frequency factors of 4 (rope_freqs.weight, type none): the same logits; plain: others
  Model freqs([hd](GgufWriter &w) {
    w.str("llama.rope.scaling.type", "none");
    w.tensor("rope_freqs.weight", {hd / 2}, KRN_F32, (size_t)hd / 2 * 4);
    for (int i = 0; i < hd / 2; i++) {
      float four = 4;
      memcpy(&w.tensors.back().data[(size_t)i * 4], &four, 4);
    }
  });
  ASSERT_EQ(freqs.rc, 0) << freqs.err;
  EXPECT_STREQ(freqs.cfg()->rope_scaling, "none+freqs");
  std::vector<float> lp = plain.logits(), ll = linear.logits(), lf = freqs.logits();
  EXPECT_EQ(ll, lf);
  float diff = 0;
  for (size_t i = 0; i < lp.size(); i++) diff = std::fmax(diff, std::fabs(lp[i] - ll[i]));
  EXPECT_GT(diff, 1e-3f) << "the scaling did not reach the forward pass";
  Model yarn([](GgufWriter &w) {
    w.str("llama.rope.scaling.type", "yarn");
    f32(w, "llama.rope.scaling.factor", 4);
    w.scalar<uint32_t>("llama.rope.scaling.original_context_length", MDL_GGUF_U32, 512);
  });
  ASSERT_EQ(yarn.rc, 0) << yarn.err;
  EXPECT_NEAR(yarn.cfg()->rope_mscale, 1 + 0.1 * std::log(4.0), 1e-6);
  EXPECT_EQ(yarn.logits().size(), lp.size());
}

TEST(RopeScaling, LoadErrors) {
  struct Bad {
    std::function<void(GgufWriter &)> keys;
    const char *want;
  } cases[] = {
      {[](GgufWriter &w) { w.str("llama.rope.scaling.type", "su"); },
       "llama.rope.scaling.type 'su' not supported (none, linear, yarn and longrope are"},
      {[](GgufWriter &w) { w.str("llama.rope.scaling.type", "llama3"); }, "'llama3' not supported"},
      {[](GgufWriter &w) { f32(w, "llama.rope.scaling.factor", -2); }, "is not a scaling factor"},
      {[](GgufWriter &w) { f32(w, "llama.rope.scale_linear", NAN); }, "llama.rope.scale_linear = nan"},
      {[](GgufWriter &w) { f32(w, "llama.rope.scaling.attn_factor", 0); }, "attn_factor = 0 not positive"},
      {[](GgufWriter &w) { w.tensor("rope_freqs.weight", {7}, KRN_F32, 28); },
       "tensor rope_freqs.weight has type F32 and shape (7), expected F32 of (32)"},
      {[](GgufWriter &w) { w.tensor("rope_factors_long.weight", {32}, KRN_F32, 128); },
       "rope_factors_long/short.weight are not supported for llama (phi3 only)"},
      {[](GgufWriter &w) {
         w.str("llama.rope.scaling.type", "yarn");
         w.scalar<uint32_t>("llama.rope.scaling.original_context_length", MDL_GGUF_U32, 0);
       },
       "original_context_length = 0 out of range"},
  };
  for (auto &c : cases) {
    Model m(c.keys);
    EXPECT_NE(m.rc, 0) << c.want;
    EXPECT_NE(std::string(m.err).find(c.want), std::string::npos) << m.err;
  }
}

// rope_freqs (the scaled kernel) against rope: the plain frequencies give the same values, and mscale scales them.
TEST(RopeScaling, KernelEqualsPlainRopeOnPlainFrequencies) {
  for (const char *name : {"scalar", "avx2", "avx512"}) {
    const krn_backend *be = krn_cpu_by_name(name);
    if (!be) continue; // this CPU lacks it (the kernels suite covers what is there)
    ASSERT_NE(be->rope_freqs, nullptr) << name;
    krn_ctx kc{};
    kc.be = be;
    int n = 3, nh = 2, hd = 16;
    std::vector<int32_t> pos = {0, 5, 999};
    std::vector<float> x((size_t)n * nh * hd);
    for (size_t i = 0; i < x.size(); i++) x[i] = std::sin((float)i);
    std::vector<float> inv(hd / 2);
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
    for (int neox : {0, 1}) {
      auto a = x, b = x, c = x;
      be->rope(&kc, a.data(), pos.data(), n, nh, hd, 10000.0f, neox);
      be->rope_freqs(&kc, b.data(), pos.data(), n, nh, hd, inv.data(), 1.0f, neox);
      be->rope_freqs(&kc, c.data(), pos.data(), n, nh, hd, inv.data(), 2.0f, neox);
      EXPECT_EQ(a, b) << name;
      for (size_t i = 0; i < a.size(); i++) EXPECT_FLOAT_EQ(c[i], 2 * a[i]) << name;
    }
  }
}

} // namespace
