// tests/models/mla_model.h: an in-memory deepseek2 GGUF (multi-head latent attention, MoE with shared experts) of
// small shapes and random F32 weights, with knobs for each form and hooks that break it for the load-error tests.
#ifndef DSERVE_TESTS_MODELS_MLA_MODEL_H
#define DSERVE_TESTS_MODELS_MLA_MODEL_H

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/models/gguf_writer.h"

namespace dserve_test {

struct MlaShape {
  int n_layer = 2, E = 64, H = 2, R = 32, rope = 16, nope = 16, vd = 16, vocab = 256;
  int qr = 32;             // q_lora_rank (0: plain attn_q)
  bool split = true;       // attn_k_b / attn_v_b (false: the combined attn_kv_b)
  int dense_lead = 1;      // leading dense layers
  bool sigmoid = true;     // sigmoid gating with exp_probs_b (false: softmax, no bias)
  int groups = 2, groups_used = 1, shared = 1, n_expert = 4, n_used = 2, ff_exp = 32, ff = 48;
  float wscale = 2.0f;
  bool wnorm = true;
  int nextn = 0;           // extra multi-token-prediction layers (block_count counts them)
  bool yarn = false;
  std::function<void(std::string &key, int &v)> key_tweak; // may change an integer key's value (-2: leave it out)
  std::function<void(std::string &name, std::vector<int64_t> &ne)> tweak;
};

struct MlaModel {
  GgufWriter w;
  std::vector<uint8_t> bytes;
  const float *f(const std::string &name) const { return w.f32(name); }
};

inline MlaModel make_mla(const MlaShape &s, uint32_t seed) {
  MlaModel mm;
  GgufWriter &w = mm.w;
  std::mt19937 rng(seed);
  const std::string a = "deepseek2";
  auto u32 = [&](std::string k, int v) {
    if (s.key_tweak) s.key_tweak(k, v);
    if (v != -2) w.scalar<uint32_t>(a + "." + k, MDL_GGUF_U32, (uint32_t)v);
  };
  w.str("general.architecture", a);
  u32("block_count", s.n_layer + s.nextn);
  u32("embedding_length", s.E);
  u32("feed_forward_length", s.ff);
  u32("attention.head_count", s.H);
  u32("attention.head_count_kv", s.split ? 1 : s.H);
  u32("context_length", 4096);
  u32("leading_dense_block_count", s.dense_lead);
  u32("attention.q_lora_rank", s.qr);
  u32("attention.kv_lora_rank", s.R);
  u32("attention.key_length", s.split ? s.R + s.rope : s.nope + s.rope);
  u32("attention.value_length", s.split ? s.R : s.vd);
  if (s.split) {
    u32("attention.key_length_mla", s.nope + s.rope);
    u32("attention.value_length_mla", s.vd);
  }
  u32("rope.dimension_count", s.rope);
  u32("expert_feed_forward_length", s.ff_exp);
  u32("expert_count", s.n_expert);
  u32("expert_used_count", s.n_used);
  u32("expert_shared_count", s.shared);
  u32("expert_gating_func", s.sigmoid ? 2 : 1);
  if (s.groups) {
    u32("expert_group_count", s.groups);
    u32("expert_group_used_count", s.groups_used);
  }
  if (s.nextn) u32("nextn_predict_layers", s.nextn);
  w.scalar<float>(a + ".expert_weights_scale", MDL_GGUF_F32, s.wscale);
  w.scalar<uint8_t>(a + ".expert_weights_norm", MDL_GGUF_BOOL, s.wnorm ? 1 : 0);
  w.scalar<float>(a + ".attention.layer_norm_rms_epsilon", MDL_GGUF_F32, 1e-6f);
  w.scalar<float>(a + ".rope.freq_base", MDL_GGUF_F32, 10000.0f);
  if (s.yarn) {
    w.str(a + ".rope.scaling.type", "yarn");
    w.scalar<float>(a + ".rope.scaling.factor", MDL_GGUF_F32, 40.0f);
    w.scalar<uint32_t>(a + ".rope.scaling.original_context_length", MDL_GGUF_U32, 4096);
    w.scalar<float>(a + ".rope.scaling.yarn_log_multiplier", MDL_GGUF_F32, 0.1f);
  }
  auto add = [&](std::string name, std::vector<int64_t> ne, float amp, bool norm) {
    if (s.tweak) s.tweak(name, ne);
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    w.tensor(name, ne, KRN_F32, (size_t)n * 4);
    float *d = reinterpret_cast<float *>(w.tensors.back().data.data());
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), nu(0.8f, 1.2f);
    for (int64_t i = 0; i < n; i++) d[i] = norm ? nu(rng) : amp * u(rng);
  };
  const int64_t E = s.E, H = s.H, R = s.R, hk = s.nope + s.rope, F = s.ff_exp, NE = s.n_expert;
  add("token_embd.weight", {E, s.vocab}, 1.0f, false);
  add("output_norm.weight", {E}, 0, true);
  add("output.weight", {E, s.vocab}, 2.0f / std::sqrt((float)E), false);
  for (int l = 0; l < s.n_layer + s.nextn; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {E}, 0, true);
    if (s.qr) {
      add(p + "attn_q_a.weight", {E, s.qr}, 2.0f / std::sqrt((float)E), false);
      add(p + "attn_q_a_norm.weight", {s.qr}, 0, true);
      add(p + "attn_q_b.weight", {s.qr, H * hk}, 2.0f / std::sqrt((float)s.qr), false);
    } else {
      add(p + "attn_q.weight", {E, H * hk}, 2.0f / std::sqrt((float)E), false);
    }
    add(p + "attn_kv_a_mqa.weight", {E, R + s.rope}, 2.0f / std::sqrt((float)E), false);
    add(p + "attn_kv_a_norm.weight", {R}, 0, true);
    if (s.split) {
      add(p + "attn_k_b.weight", {s.nope, R, H}, 2.0f / std::sqrt((float)s.nope), false);
      add(p + "attn_v_b.weight", {R, s.vd, H}, 2.0f / std::sqrt((float)R), false);
    } else {
      add(p + "attn_kv_b.weight", {R, H * (s.nope + s.vd)}, 2.0f / std::sqrt((float)R), false);
    }
    add(p + "attn_output.weight", {H * s.vd, E}, 1.0f / std::sqrt((float)(H * s.vd)), false);
    add(p + "ffn_norm.weight", {E}, 0, true);
    if (l < s.dense_lead) {
      add(p + "ffn_gate.weight", {E, s.ff}, 2.0f / std::sqrt((float)E), false);
      add(p + "ffn_up.weight", {E, s.ff}, 2.0f / std::sqrt((float)E), false);
      add(p + "ffn_down.weight", {s.ff, E}, 1.0f / std::sqrt((float)s.ff), false);
      continue;
    }
    add(p + "ffn_gate_inp.weight", {E, NE}, 3.0f / std::sqrt((float)E), false);
    if (s.sigmoid) add(p + "exp_probs_b.bias", {NE}, 0.3f, false);
    add(p + "ffn_gate_exps.weight", {E, F, NE}, 2.0f / std::sqrt((float)E), false);
    add(p + "ffn_up_exps.weight", {E, F, NE}, 2.0f / std::sqrt((float)E), false);
    add(p + "ffn_down_exps.weight", {F, E, NE}, 1.0f / std::sqrt((float)F), false);
    add(p + "ffn_gate_shexp.weight", {E, F * s.shared}, 2.0f / std::sqrt((float)E), false);
    add(p + "ffn_up_shexp.weight", {E, F * s.shared}, 2.0f / std::sqrt((float)E), false);
    add(p + "ffn_down_shexp.weight", {F * s.shared, E}, 1.0f / std::sqrt((float)(F * s.shared)), false);
  }
  mm.bytes = w.bytes();
  return mm;
}

} // namespace dserve_test
#endif
