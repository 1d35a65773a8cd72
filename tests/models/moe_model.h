// tests/models/moe_model.h: an in-memory mixture-of-experts GGUF (qwen3moe, or llama with experts: Mixtral) of small
// shapes and random weights, with knobs that break it on purpose for the load-error tests.
#ifndef DSERVE_TESTS_MODELS_MOE_MODEL_H
#define DSERVE_TESTS_MODELS_MOE_MODEL_H

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda/synth_model.h"
#include "tests/models/gguf_writer.h"

namespace dserve_test {

struct MoeShape {
  std::string arch = "qwen3moe"; // or "llama" (Mixtral's layout)
  int n_layer = 2, n_embd = 128, n_head = 4, n_kv_head = 2, head_dim = 32, n_vocab = 256;
  int n_expert = 8, n_used = 2, n_ff_exp = 64;
  krn_type wtype = KRN_F32; // every matrix but the router (F32, as llama-quantize leaves it)
  bool zero_wo = false;     // attention adds nothing: each token's logits are its embedding's through the FFNs
  // load-error knobs: the keys' values (-1: the shape's; -2: the key left out), and a hook that may rename or reshape
  // a tensor before it is written
  int key_n_expert = -1, key_n_used = -1;
  std::function<void(std::string &name, std::vector<int64_t> &ne)> tweak;
};

struct MoeModel {
  GgufWriter w;
  std::vector<uint8_t> bytes;
  // F32 weights by name (only when wtype is F32; the router always)
  const float *f(const std::string &name) const { return w.f32(name); }
};

inline MoeModel make_moe(const MoeShape &s, uint32_t seed) {
  MoeModel mm;
  GgufWriter &w = mm.w;
  std::mt19937 rng(seed);
  const std::string a = s.arch;
  const bool q3 = a == "qwen3moe";
  auto u32 = [&](const std::string &k, int v) { w.scalar<uint32_t>(a + "." + k, MDL_GGUF_U32, (uint32_t)v); };
  w.str("general.architecture", a);
  u32("block_count", s.n_layer);
  u32("embedding_length", s.n_embd);
  u32("feed_forward_length", q3 ? s.n_ff_exp * 6 : s.n_ff_exp); // (qwen3moe's is the dense width, unused)
  if (q3) u32("expert_feed_forward_length", s.n_ff_exp);
  u32("attention.head_count", s.n_head);
  u32("attention.head_count_kv", s.n_kv_head);
  if (q3) {
    u32("attention.key_length", s.head_dim);
    u32("attention.value_length", s.head_dim);
  }
  u32("context_length", 4096);
  if (s.key_n_expert != -2) u32("expert_count", s.key_n_expert == -1 ? s.n_expert : s.key_n_expert);
  if (s.key_n_used != -2) u32("expert_used_count", s.key_n_used == -1 ? s.n_used : s.key_n_used);
  w.scalar<float>(a + ".attention.layer_norm_rms_epsilon", MDL_GGUF_F32, 1e-6f);
  w.scalar<float>(a + ".rope.freq_base", MDL_GGUF_F32, 1000000.0f);
  const int64_t E = s.n_embd, HD = (int64_t)s.n_head * s.head_dim, KD = (int64_t)s.n_kv_head * s.head_dim,
                F = s.n_ff_exp, NE = s.n_expert;
  auto add = [&](std::string name, std::vector<int64_t> ne, krn_type t, float amp, bool norm) {
    if (s.tweak) s.tweak(name, ne);
    int64_t rows = 1;
    for (size_t i = 1; i < ne.size(); i++) rows *= ne[i];
    w.tensor(name, ne, (uint32_t)t, krn_row_size(t, ne[0]) * (size_t)rows);
    auto &d = w.tensors.back().data;
    if (norm) {
      std::uniform_real_distribution<float> u(0.8f, 1.2f);
      for (size_t i = 0; i < d.size() / 4; i++) {
        float v = u(rng);
        memcpy(&d[i * 4], &v, 4);
      }
    } else {
      synth_fill(rng, d, t, ne[0], amp);
    }
  };
  add("token_embd.weight", {E, s.n_vocab}, s.wtype, 1.0f, false);
  add("output_norm.weight", {E}, KRN_F32, 0, true);
  add("output.weight", {E, s.n_vocab}, s.wtype, 2.0f / std::sqrt((float)E), false);
  for (int l = 0; l < s.n_layer; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {E}, KRN_F32, 0, true);
    add(p + "attn_q.weight", {E, HD}, s.wtype, 2.0f / std::sqrt((float)E), false);
    add(p + "attn_k.weight", {E, KD}, s.wtype, 2.0f / std::sqrt((float)E), false);
    add(p + "attn_v.weight", {E, KD}, s.wtype, 2.0f / std::sqrt((float)E), false);
    add(p + "attn_output.weight", {HD, E}, s.wtype, 1.0f / std::sqrt((float)HD), false);
    if (s.zero_wo) std::fill(w.tensors.back().data.begin(), w.tensors.back().data.end(), 0);
    if (q3) {
      add(p + "attn_q_norm.weight", {s.head_dim}, KRN_F32, 0, true);
      add(p + "attn_k_norm.weight", {s.head_dim}, KRN_F32, 0, true);
    }
    add(p + "ffn_norm.weight", {E}, KRN_F32, 0, true);
    add(p + "ffn_gate_inp.weight", {E, NE}, KRN_F32, 3.0f / std::sqrt((float)E), false);
    add(p + "ffn_gate_exps.weight", {E, F, NE}, s.wtype, 2.0f / std::sqrt((float)E), false);
    add(p + "ffn_up_exps.weight", {E, F, NE}, s.wtype, 2.0f / std::sqrt((float)E), false);
    add(p + "ffn_down_exps.weight", {F, E, NE}, s.wtype, 1.0f / std::sqrt((float)F), false);
  }
  mm.bytes = w.bytes();
  return mm;
}

} // namespace dserve_test
#endif
