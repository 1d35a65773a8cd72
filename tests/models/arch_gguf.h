// tests/models/arch_gguf.h: GGUF bytes of tiny qwen3, phi3, gemma2 (and other) models with random F32 weights, keys
// and tensor names as llama.cpp's converters write them; for the models tests and `dserve inspect`'s.
#ifndef DSERVE_TESTS_MODELS_ARCH_GGUF_H
#define DSERVE_TESTS_MODELS_ARCH_GGUF_H

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/models/gguf_writer.h"

extern "C" {
#include "kernels/krn.h"
#include "models/gguf.h"
}

namespace dserve_test {
namespace arch {

// A tiny model's shape; hd 0: n_embd / n_head.
struct Spec {
  std::string arch;
  int n_layer = 2, n_embd = 64, n_head = 4, n_kv = 2, hd = 0, n_ff = 96, n_vocab = 128;
  bool fused = false;     // phi3's attn_qkv and gate+up ffn_up
  bool qk_norm = false;   // attn_q_norm / attn_k_norm
  bool post_norms = false; // post_attention_norm / post_ffw_norm
  bool biases = false;    // attn_q/k/v.bias
  float out_scale = 1;    // output_norm's weights (a larger one gives larger logits)
  bool q8 = false;        // the layers' matrices in Q8_0 (rows of 64: two 34-byte blocks), the rest F32
};

// The weights of a tiny model, by name (F32, row-major (rows, k) as GGUF's (k, rows)), made from seed.
struct Weights {
  std::map<std::string, std::vector<float>> t;
  std::map<std::string, std::vector<int64_t>> ne;
  std::mt19937 rng;
  explicit Weights(uint32_t seed) : rng(seed) {}
  void add(const std::string &name, std::vector<int64_t> shape, float lo, float hi) {
    size_t n = 1;
    for (auto d : shape) n *= (size_t)d;
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto &x : v) x = u(rng);
    t[name] = v;
    ne[name] = shape;
  }
};

inline Weights make_weights(const Spec &s, uint32_t seed) {
  Weights w(seed);
  int hd = s.hd ? s.hd : s.n_embd / s.n_head, HD = s.n_head * hd, KD = s.n_kv * hd, E = s.n_embd, F = s.n_ff;
  w.add("token_embd.weight", {E, s.n_vocab}, -1, 1);
  w.add("output_norm.weight", {E}, 0.8f * s.out_scale, 1.2f * s.out_scale);
  for (int l = 0; l < s.n_layer; l++) {
    std::string p = "blk." + std::to_string(l) + ".";
    w.add(p + "attn_norm.weight", {E}, 0.8f, 1.2f);
    w.add(p + "attn_q.weight", {E, HD}, -0.4f, 0.4f);
    w.add(p + "attn_k.weight", {E, KD}, -0.4f, 0.4f);
    w.add(p + "attn_v.weight", {E, KD}, -0.3f, 0.3f);
    if (s.biases) {
      w.add(p + "attn_q.bias", {HD}, -0.3f, 0.3f);
      w.add(p + "attn_k.bias", {KD}, -0.3f, 0.3f);
      w.add(p + "attn_v.bias", {KD}, -0.3f, 0.3f);
    }
    w.add(p + "attn_output.weight", {HD, E}, -0.2f, 0.2f);
    w.add(p + "ffn_norm.weight", {E}, 0.8f, 1.2f);
    w.add(p + "ffn_gate.weight", {E, F}, -0.3f, 0.3f);
    w.add(p + "ffn_up.weight", {E, F}, -0.3f, 0.3f);
    w.add(p + "ffn_down.weight", {F, E}, -0.2f, 0.2f);
    if (s.qk_norm) {
      w.add(p + "attn_q_norm.weight", {hd}, 0.8f, 1.2f);
      w.add(p + "attn_k_norm.weight", {hd}, 0.8f, 1.2f);
    }
    if (s.post_norms) {
      w.add(p + "post_attention_norm.weight", {E}, 0.4f, 0.6f);
      w.add(p + "post_ffw_norm.weight", {E}, 0.4f, 0.6f);
    }
  }
  return w;
}

inline void put_f32(GgufWriter &g, const std::string &name, const std::vector<int64_t> &ne,
                    const std::vector<float> &v) {
  g.tensor(name, ne, KRN_F32, v.size() * 4);
  memcpy(g.tensors.back().data.data(), v.data(), v.size() * 4);
}

// A tensor as s stores it: a layer's matrix in Q8_0 when s.q8 (each row quantized alone, so a fused matrix holds
// the bytes of its parts), anything else F32.
inline void put_w(GgufWriter &g, const Spec &s, const std::string &name, const std::vector<int64_t> &ne,
                  const std::vector<float> &v) {
  if (!s.q8 || ne.size() != 2 || name.rfind("blk.", 0) != 0) return put_f32(g, name, ne, v);
  size_t row = krn_row_size(KRN_Q8_0, ne[0]);
  g.tensor(name, ne, KRN_Q8_0, row * (size_t)ne[1]);
  for (int64_t r = 0; r < ne[1]; r++)
    krn_quant_row_q8_0((krn_block_q8_0 *)(g.tensors.back().data.data() + (size_t)r * row), v.data() + r * ne[0],
                       (int)ne[0]);
}

// The GGUF bytes of s with weights w: keys as llama.cpp's converters write them, then extra's (which may also
// add tensors), then the tensors (phi3's fused ones concatenated: q rows, k rows, v rows; gate rows, up rows).
inline std::vector<uint8_t> gguf_bytes(const Spec &s, const Weights &w,
                                       const std::function<void(GgufWriter &)> &extra = {},
                                       const std::vector<std::string> &skip = {}) {
  GgufWriter g;
  const std::string a = s.arch;
  g.str("general.architecture", a);
  auto u32 = [&](const std::string &k, uint32_t v) { g.scalar<uint32_t>(a + "." + k, MDL_GGUF_U32, v); };
  u32("block_count", (uint32_t)s.n_layer);
  u32("embedding_length", (uint32_t)s.n_embd);
  u32("feed_forward_length", (uint32_t)s.n_ff);
  u32("attention.head_count", (uint32_t)s.n_head);
  u32("attention.head_count_kv", (uint32_t)s.n_kv);
  u32("context_length", 4096);
  if (s.hd) {
    u32("attention.key_length", (uint32_t)s.hd);
    u32("attention.value_length", (uint32_t)s.hd);
  }
  g.scalar<float>(a + ".attention.layer_norm_rms_epsilon", MDL_GGUF_F32, 1e-6f);
  g.scalar<float>(a + ".rope.freq_base", MDL_GGUF_F32, 10000.0f);
  if (extra) extra(g);
  auto skipped = [&](const std::string &n) {
    for (auto &x : skip)
      if (x == n) return true;
    return false;
  };
  for (auto &kv : w.t) {
    const std::string &n = kv.first;
    if (skipped(n)) continue;
    if (s.fused && (n.find("attn_k.") != std::string::npos || n.find("attn_v.") != std::string::npos ||
                    n.find("ffn_gate.") != std::string::npos))
      continue;
    if (s.fused && n.find("attn_q.weight") != std::string::npos) {
      std::string p = n.substr(0, n.find("attn_q."));
      std::vector<float> v = kv.second;
      for (const char *o : {"attn_k.weight", "attn_v.weight"})
        v.insert(v.end(), w.t.at(p + o).begin(), w.t.at(p + o).end());
      put_w(g, s, p + "attn_qkv.weight", {s.n_embd, (int64_t)(v.size() / s.n_embd)}, v);
      continue;
    }
    if (s.fused && n.find("ffn_up.") != std::string::npos) {
      std::string p = n.substr(0, n.find("ffn_up."));
      std::vector<float> v = w.t.at(p + "ffn_gate.weight");
      v.insert(v.end(), kv.second.begin(), kv.second.end());
      put_w(g, s, n, {s.n_embd, 2 * (int64_t)s.n_ff}, v);
      continue;
    }
    put_w(g, s, n, w.ne.at(n), kv.second);
  }
  return g.bytes();
}

inline Spec qwen3() {
  Spec s;
  s.arch = "qwen3";
  s.hd = 32; // 4 heads of 32 over an embedding of 64: not n_embd / n_head
  s.qk_norm = true;
  return s;
}
inline Spec phi3() {
  Spec s;
  s.arch = "phi3";
  s.n_kv = 4;
  s.fused = true;
  return s;
}
inline Spec gemma2() {
  Spec s;
  s.arch = "gemma2";
  s.post_norms = true;
  return s;
}


} // namespace arch
} // namespace dserve_test
#endif
