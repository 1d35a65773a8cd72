// tests/cuda/synth_model.h: an in-memory Llama GGUF of given shapes with random, well-scaled weights, for the gpu checks when the real GGUF is absent.
// Speed does not depend on weight values, and cuda-vs-cpu agreement holds for any weights, so a model of
// SmolLM2-135M's shapes stands in for the real file on a GPU machine that cannot download it.
#ifndef DSERVE_TESTS_CUDA_SYNTH_MODEL_H
#define DSERVE_TESTS_CUDA_SYNTH_MODEL_H

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/krn.h"
#include "models/gguf.h"
#include "tests/models/gguf_writer.h"

namespace dserve_test {

struct SynthShape {
  int n_layer, n_embd, n_ff, n_head, n_kv_head, n_vocab, n_ctx;
  krn_type wtype; // every matrix (norms are F32)
};

inline SynthShape smollm2_shape() { return {30, 576, 1536, 9, 3, 49152, 8192, KRN_Q4_1}; }
inline SynthShape tiny_shape() { return {4, 256, 512, 4, 2, 1024, 2048, KRN_Q4_1}; }

// Fills rows of k elements of type t with random values of about +-amp (valid scales: no inf/nan).
inline void synth_fill(std::mt19937 &rng, std::vector<uint8_t> &w, krn_type t, int64_t k, float amp) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  if (t == KRN_F32 || t == KRN_F16) {
    const size_t n = w.size() / (t == KRN_F32 ? 4 : 2);
    for (size_t i = 0; i < n; i++) {
      const float f = amp * u(rng);
      if (t == KRN_F32) memcpy(&w[4 * i], &f, 4);
      else {
        const krn_f16 h = krn_f32_to_f16(f);
        memcpy(&w[2 * i], &h, 2);
      }
    }
    return;
  }
  for (auto &b : w) b = (uint8_t)byte(rng);
  const size_t bb = krn_row_size(t, KRN_QK);
  (void)k;
  for (size_t o = 0; o + bb <= w.size(); o += bb) {
    // q4_0: d * (q - 8); q4_1: d * q + m; q8_0: d * q. Scales so that elements span about +-amp.
    const float d = t == KRN_Q8_0 ? amp / 127.0f : amp / 7.5f;
    const krn_f16 dh = krn_f32_to_f16(d * (0.5f + 0.5f * (u(rng) + 1.0f) / 2.0f));
    memcpy(&w[o], &dh, 2);
    if (t == KRN_Q4_1) {
      const krn_f16 mh = krn_f32_to_f16(-7.5f * krn_f16_to_f32(dh));
      memcpy(&w[o + 2], &mh, 2);
    }
  }
}

// GGUF bytes of a llama model of shape s (tied embeddings, like SmolLM2); open with mdl_gguf_from_memory
// and keep the bytes alive while the model is. extra (may be empty) adds keys or tensors of its own.
inline std::vector<uint8_t> synth_model(const SynthShape &s, uint32_t seed,
                                        const std::function<void(GgufWriter &)> &extra = {}) {
  std::mt19937 rng(seed);
  GgufWriter w;
  if (extra) extra(w);
  w.str("general.architecture", "llama");
  w.scalar<uint32_t>("llama.block_count", MDL_GGUF_U32, (uint32_t)s.n_layer);
  w.scalar<uint32_t>("llama.embedding_length", MDL_GGUF_U32, (uint32_t)s.n_embd);
  w.scalar<uint32_t>("llama.feed_forward_length", MDL_GGUF_U32, (uint32_t)s.n_ff);
  w.scalar<uint32_t>("llama.attention.head_count", MDL_GGUF_U32, (uint32_t)s.n_head);
  w.scalar<uint32_t>("llama.attention.head_count_kv", MDL_GGUF_U32, (uint32_t)s.n_kv_head);
  w.scalar<uint32_t>("llama.context_length", MDL_GGUF_U32, (uint32_t)s.n_ctx);
  w.scalar<float>("llama.attention.layer_norm_rms_epsilon", MDL_GGUF_F32, 1e-5f);
  w.scalar<float>("llama.rope.freq_base", MDL_GGUF_F32, 10000.0f);
  const int64_t E = s.n_embd, HD = s.n_embd, KD = (int64_t)s.n_kv_head * (s.n_embd / s.n_head), F = s.n_ff;
  auto mat = [&](const std::string &name, int64_t k, int64_t m, float amp) {
    w.tensor(name, {k, m}, (uint32_t)s.wtype, krn_row_size(s.wtype, k) * (size_t)m);
    synth_fill(rng, w.tensors.back().data, s.wtype, k, amp);
  };
  auto norm = [&](const std::string &name, int64_t n) {
    w.tensor(name, {n}, KRN_F32, (size_t)n * 4);
    std::uniform_real_distribution<float> u(0.8f, 1.2f);
    for (int64_t i = 0; i < n; i++) {
      const float f = u(rng);
      memcpy(&w.tensors.back().data[(size_t)i * 4], &f, 4);
    }
  };
  mat("token_embd.weight", E, s.n_vocab, 1.0f);
  norm("output_norm.weight", E);
  for (int l = 0; l < s.n_layer; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", E);
    mat(p + "attn_q.weight", E, HD, 2.0f / 24);
    mat(p + "attn_k.weight", E, KD, 2.0f / 24);
    mat(p + "attn_v.weight", E, KD, 2.0f / 24);
    mat(p + "attn_output.weight", HD, E, 1.0f / 24);
    norm(p + "ffn_norm.weight", E);
    mat(p + "ffn_gate.weight", E, F, 2.0f / 24);
    mat(p + "ffn_up.weight", E, F, 2.0f / 24);
    mat(p + "ffn_down.weight", F, E, 1.0f / 40);
  }
  return w.bytes();
}

} // namespace dserve_test
#endif
