// tests/models/test_archs.cc: qwen3, phi3 and gemma2 from small GGUFs written here: each loads with its own fields and
// runs; phi3's fused tensors give what the same weights give unfused; LongRoPE follows the context; soft-caps bound
// what they cap; bad files are refused naming what is wrong. (Logits against llama.cpp's: the tiny GGUF goldens.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "arch_gguf.h"
#include "gguf_writer.h"
#include "model_util.h"

extern "C" {
#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"
}

namespace {

using dserve_test::GgufWriter;
using namespace dserve_test::arch;

// A model from bytes on a cpu table (the scalar reference unless said), with 8 KV blocks: room for 70 tokens, past
// gemma2's window of 32 here.
struct Loaded : MemModel {
  Loaded(std::vector<uint8_t> b, const krn_backend *be = krn_cpu_scalar()) : MemModel(std::move(b), be, 8) {}
  std::vector<float> logits() { return MemModel::logits(70); }
};

float max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::fmax(d, std::fabs(a[i] - b[i]));
  return d;
}

bool all_finite(const std::vector<float> &v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

TEST(Archs, EachLoadsWithItsOwnFieldsAndRuns) {
  {
    Spec s = qwen3();
    Loaded q(gguf_bytes(s, make_weights(s, 1)));
    ASSERT_EQ(q.rc, 0) << q.err;
    EXPECT_EQ(q.cfg()->head_dim, 32);
    EXPECT_EQ(q.cfg()->qk_norm, 1);
    EXPECT_EQ(q.cfg()->rope_neox, 1);
    EXPECT_FLOAT_EQ(q.cfg()->attn_scale, 1.0f / std::sqrt(32.0f));
    EXPECT_TRUE(all_finite(q.logits()));
  }
  {
    Spec s = phi3();
    Loaded p(gguf_bytes(s, make_weights(s, 2), [](GgufWriter &g) {
      g.scalar<uint32_t>("phi3.attention.sliding_window", MDL_GGUF_U32, 2047);
    }));
    ASSERT_EQ(p.rc, 0) << p.err;
    EXPECT_EQ(p.cfg()->fused_qkv, 2);
    EXPECT_EQ(p.cfg()->fused_gate_up, 1);
    EXPECT_EQ(p.cfg()->n_swa, 0); // llama.cpp does not apply phi3's window: every layer global
    EXPECT_EQ(p.cfg()->n_swa_ignored, 2047);
    EXPECT_EQ(p.cfg()->rope_long, -1);
    EXPECT_EQ(p.cfg()->rope_neox, 1);
    EXPECT_TRUE(all_finite(p.logits()));
  }
  {
    Spec s = gemma2();
    Loaded m(gguf_bytes(s, make_weights(s, 3)));
    ASSERT_EQ(m.rc, 0) << m.err;
    const mdl_llama_cfg *c = m.cfg();
    EXPECT_EQ(c->gemma2, 1);
    EXPECT_EQ(c->qk_norm, 0);
    EXPECT_EQ(c->n_swa, 4096); // llama.cpp's defaults for gemma2: window 4096 on even layers, caps 50 and 30
    EXPECT_EQ(c->swa_pattern, 2);
    EXPECT_EQ(mdl_llama_layer_window(c, 0), 4096);
    EXPECT_EQ(mdl_llama_layer_window(c, 1), 0);
    EXPECT_FLOAT_EQ(c->attn_softcap, 50);
    EXPECT_FLOAT_EQ(c->final_softcap, 30);
    EXPECT_FLOAT_EQ(c->rope_theta_swa, c->rope_theta);
    EXPECT_EQ(c->tied_embeddings, 1);
    EXPECT_TRUE(all_finite(m.logits()));
  }
}

// phi3's attn_qkv and ffn_up hold q, k, v and gate, up as row ranges: the same weights written unfused under an
// architecture that differs in nothing else (qwen2 without biases: NeoX RoPE, SwiGLU) give the same logits, to the
// bit, on the scalar table and on the best this CPU has. A wrong row offset (k's rows for q, up's for gate) would not.
TEST(Archs, Phi3FusedTensorsAreRowRangesOfTheSameWeights) {
  for (bool q8 : {false, true}) { // F32, and Q8_0 rows of 68 bytes (the offsets are r * krn_row_size, whole blocks)
    Spec s = phi3();
    s.q8 = q8;
    Weights w = make_weights(s, 4);
    Spec plain = s;
    plain.arch = "qwen2";
    plain.fused = false;
    for (const krn_backend *be : {krn_cpu_scalar(), krn_cpu_best()}) {
      Loaded fused(gguf_bytes(s, w), be), split(gguf_bytes(plain, w), be);
      ASSERT_EQ(fused.rc, 0) << fused.err;
      ASSERT_EQ(split.rc, 0) << split.err;
      EXPECT_EQ(split.cfg()->fused_qkv, 0);
      EXPECT_EQ(fused.logits(), split.logits()) << be->name << (q8 ? " Q8_0" : " F32");
    }
  }
  // and a fused attn_qkv with its bias under qwen2 (llama.cpp's create_tensor_qkv takes it for any architecture)
  Spec biased = phi3();
  biased.arch = "qwen2";
  biased.fused = false;
  biased.biases = true;
  Weights wb = make_weights(biased, 5);
  Loaded sep(gguf_bytes(biased, wb));
  ASSERT_EQ(sep.rc, 0) << sep.err;
  Loaded fu(gguf_bytes(
      biased, wb,
      [&](GgufWriter &g) {
        for (int l = 0; l < biased.n_layer; l++) {
          std::string p = "blk." + std::to_string(l) + ".";
          std::vector<float> v = wb.t.at(p + "attn_q.weight"), b = wb.t.at(p + "attn_q.bias");
          for (const char *o : {"attn_k", "attn_v"}) {
            auto &m = wb.t.at(p + o + ".weight");
            auto &bb = wb.t.at(p + o + ".bias");
            v.insert(v.end(), m.begin(), m.end());
            b.insert(b.end(), bb.begin(), bb.end());
          }
          put_f32(g, p + "attn_qkv.weight", {biased.n_embd, (int64_t)(v.size() / biased.n_embd)}, v);
          put_f32(g, p + "attn_qkv.bias", {(int64_t)b.size()}, b);
        }
      },
      [&] {
        std::vector<std::string> sk;
        for (int l = 0; l < biased.n_layer; l++)
          for (const char *o : {"attn_q", "attn_k", "attn_v"})
            for (const char *kind : {".weight", ".bias"}) sk.push_back("blk." + std::to_string(l) + "." + o + kind);
        return sk;
      }()));
  ASSERT_EQ(fu.rc, 0) << fu.err;
  EXPECT_EQ(fu.cfg()->fused_qkv, 2);
  EXPECT_EQ(fu.logits(), sep.logits());
}

// LongRoPE (phi3's rope_factors_long / _short, rope.scaling.attn_factor): the long factors when the context exceeds
// the original one (the trained context 4096 > 1024 at load), the short ones at 1024 and below (mdl_llama_set_ctx, as
// llama.cpp's n_ctx_seq), each pair's frequency divided by its factor and the rotation scaled by the attention factor.
TEST(Archs, Phi3LongRopeFactorsFollowTheContext) {
  Spec s = phi3();
  int half = s.n_embd / s.n_head / 2;
  std::vector<float> lng(half), shrt(half);
  for (int i = 0; i < half; i++) {
    lng[i] = 1.0f + 3.0f * (float)i;
    shrt[i] = 1.0f + 0.25f * (float)i;
  }
  Loaded p(gguf_bytes(s, make_weights(s, 6), [&](GgufWriter &g) {
    g.scalar<uint32_t>("phi3.rope.scaling.original_context_length", MDL_GGUF_U32, 1024);
    g.scalar<float>("phi3.rope.scaling.attn_factor", MDL_GGUF_F32, 1.25f);
    put_f32(g, "rope_factors_long.weight", {half}, lng);
    put_f32(g, "rope_factors_short.weight", {half}, shrt);
  }));
  ASSERT_EQ(p.rc, 0) << p.err;
  const mdl_llama_cfg *c = p.cfg();
  EXPECT_EQ(c->rope_long, 1);
  EXPECT_STREQ(c->rope_scaling, "linear+long");
  EXPECT_FLOAT_EQ(c->rope_mscale, 1.25f);
  int hd = c->head_dim;
  for (int i = 0; i < half; i++) EXPECT_FLOAT_EQ(c->rope_inv_freq[i], std::pow(10000.0f, -2.0f * i / hd) / lng[i]);
  std::vector<float> at_long = p.logits();
  ASSERT_EQ(mdl_llama_set_ctx(p.m, 1024, p.err, sizeof p.err), 0) << p.err;
  EXPECT_EQ(c->rope_long, 0);
  EXPECT_STREQ(c->rope_scaling, "linear+short");
  for (int i = 0; i < half; i++) EXPECT_FLOAT_EQ(c->rope_inv_freq[i], std::pow(10000.0f, -2.0f * i / hd) / shrt[i]);
  std::vector<float> at_short = p.logits();
  EXPECT_GT(max_abs_diff(at_long, at_short), 1e-3f) << "the factors did not reach the forward pass";
  ASSERT_EQ(mdl_llama_set_ctx(p.m, 1025, p.err, sizeof p.err), 0) << p.err;
  EXPECT_EQ(p.logits(), at_long);
  EXPECT_NE(mdl_llama_set_ctx(p.m, 0, p.err, sizeof p.err), 0);
}

// gemma2's final soft-cap bounds the logits by the cap (here 3, with an output norm that makes them far larger),
// and the attention soft-cap reaches the forward pass (a small cap changes the logits); gemma3 takes a final cap too.
TEST(Archs, Gemma2SoftCapsBoundWhatTheyCap) {
  Spec s = gemma2();
  s.out_scale = 20;
  Weights w = make_weights(s, 7);
  auto with = [&](float attn_cap, float final_cap) {
    return gguf_bytes(s, w, [=](GgufWriter &g) {
      g.scalar<float>("gemma2.attn_logit_softcapping", MDL_GGUF_F32, attn_cap);
      g.scalar<float>("gemma2.final_logit_softcapping", MDL_GGUF_F32, final_cap);
      g.scalar<uint32_t>("gemma2.attention.sliding_window", MDL_GGUF_U32, 32);
    });
  };
  Loaded capped(with(50, 3)), uncapped(with(50, 0)), tight(with(0.5f, 3));
  ASSERT_EQ(capped.rc, 0) << capped.err;
  ASSERT_EQ(uncapped.rc, 0) << uncapped.err;
  ASSERT_EQ(tight.rc, 0) << tight.err;
  EXPECT_EQ(uncapped.cfg()->final_softcap, 0);
  std::vector<float> lc = capped.logits(), lu = uncapped.logits(), lt = tight.logits();
  float big = 0;
  for (size_t i = 0; i < lc.size(); i++) {
    ASSERT_LE(std::fabs(lc[i]), 3.0f);
    EXPECT_NEAR(lc[i], 3 * std::tanh(lu[i] / 3), 2e-5) << i;
    big = std::fmax(big, std::fabs(lu[i]));
  }
  EXPECT_GT(big, 6) << "the logits were never large enough for the cap to matter";
  EXPECT_GT(max_abs_diff(lc, lt), 1e-3f) << "the attention soft-cap did not reach the forward pass";
  // the SIMD tables give the scalar reference's logits within float rounding
  Loaded best(with(0.5f, 3), krn_cpu_best());
  ASSERT_EQ(best.rc, 0) << best.err;
  EXPECT_LT(max_abs_diff(best.logits(), lt), 1e-3f);
  // gemma3 takes final_logit_softcapping now (llama.cpp applies it when given)
  Spec g3 = s;
  g3.arch = "gemma3";
  g3.qk_norm = true;
  Loaded m3(gguf_bytes(g3, make_weights(g3, 8), [](GgufWriter &g) {
    g.scalar<float>("gemma3.final_logit_softcapping", MDL_GGUF_F32, 3.0f);
  }));
  ASSERT_EQ(m3.rc, 0) << m3.err;
  for (float x : m3.logits()) ASSERT_LE(std::fabs(x), 3.0f);
}

// gemma2's local layers (even ones) on the window-aware paged KV: with the layers cut into a global and a local
// group (mdl_kv_plan_groups), a prompt prefilled in chunks, the local pages its window has passed given back (-1)
// between them, gives the logits of one plain one-shot prefill; the chunks share a step with another sequence.
TEST(Archs, Gemma2LocalLayersGiveBackThePagesTheirWindowPassed) {
  Spec s = gemma2();
  s.n_layer = 4;
  std::vector<uint8_t> bytes = gguf_bytes(s, make_weights(s, 16), [](GgufWriter &g) {
    g.scalar<uint32_t>("gemma2.attention.sliding_window", MDL_GGUF_U32, 24);
  });
  Loaded plain(bytes);
  ASSERT_EQ(plain.rc, 0) << plain.err;
  const mdl_llama_cfg *c = plain.cfg();
  std::vector<float> want = plain.logits(); // 70 tokens at once, the plain layout
  std::vector<int16_t> group(4), slot(4);
  ASSERT_EQ(mdl_kv_plan_groups(c, group.data(), slot.data()), 2);
  EXPECT_EQ(group, (std::vector<int16_t>{1, 0, 1, 0})); // the global layers (odd) are group 0
  const int NB = 16, G = 2;
  std::vector<int32_t> page_map((size_t)NB * G);
  for (int b = 0; b < NB; b++) page_map[(size_t)b * G] = b, page_map[(size_t)b * G + 1] = NB - 1 - b;
  mdl_kv kv{};
  kv.type = KRN_F32;
  kv.block_size = 16;
  kv.n_blocks = NB;
  kv.n_groups = G;
  kv.layer_group = group.data();
  kv.layer_slot = slot.data();
  kv.page_map = page_map.data();
  std::vector<uint8_t> mem(mdl_kv_block_bytes(c, kv.type, 16) / G * NB);
  kv.base = mem.data();
  ASSERT_EQ(mdl_kv_group_window(c, &kv, 1), 24);
  std::vector<int32_t> toks, bt = {0, 1, 2, 3, 4}, other = {8, 0}, bt_other = {9};
  for (int i = 0; i < 70; i++) toks.push_back((i * 37 + 5) % c->n_vocab);
  std::vector<float> got((size_t)c->n_vocab * 2, NAN);
  for (int at = 0; at < 70; at += 20) {
    int n = std::min(20, 70 - at), live = mdl_kv_first_live_block(24, at, 16);
    for (int b = 0; b < live; b++) page_map[(size_t)bt[b] * G + 1] = -1; // given back: the kernels skip it
    mdl_seq sq[2] = {{toks.data() + at, n, at, bt.data(), 5, 1}, {other.data(), 1, at / 20, bt_other.data(), 1, 1}};
    ASSERT_EQ(mdl_llama_forward(plain.m, &kv, sq, 2, got.data(), nullptr, nullptr, plain.err, sizeof plain.err), 0)
        << plain.err;
  }
  EXPECT_EQ(page_map[(size_t)bt[1] * G + 1], -1) << "no page was given back";
  for (int i = 0; i < c->n_vocab; i++) ASSERT_NEAR(got[i], want[i], 1e-4f) << i;
  // a page the window still needs, given back, is refused by name
  page_map[(size_t)bt[3] * G + 1] = -1;
  mdl_seq sq = {toks.data(), 1, 70, bt.data(), 5, 1};
  EXPECT_NE(mdl_llama_forward(plain.m, &kv, &sq, 1, got.data(), nullptr, nullptr, plain.err, sizeof plain.err), 0);
  EXPECT_NE(std::string(plain.err).find("has no page for layer group 1"), std::string::npos) << plain.err;
}

// qwen3's q/k norms reach the forward pass: scaling a layer's attn_q_norm weights changes the logits.
TEST(Archs, Qwen3QkNormsReachTheForwardPass) {
  Spec s = qwen3();
  Weights w = make_weights(s, 9), w2 = w;
  for (auto &x : w2.t.at("blk.0.attn_q_norm.weight")) x *= 3;
  Loaded a(gguf_bytes(s, w)), b(gguf_bytes(s, w2));
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_GT(max_abs_diff(a.logits(), b.logits()), 1e-3f);
}

// Bad files: each refused with a message that names what is wrong.
TEST(Archs, BadFilesAreRefusedNamingWhatIsWrong) {
  struct Bad {
    const char *what;
    Spec s;
    std::function<void(GgufWriter &)> extra;
    std::vector<std::string> skip;
    const char *want;
  };
  Spec mamba = qwen3();
  mamba.arch = "mamba";
  Spec no_norm = qwen3();
  std::vector<Bad> cases = {
      {"unknown architecture", mamba, {}, {},
       "architecture 'mamba' not supported (llama, qwen2, "},
      {"a missing key", qwen3(), {}, {}, "metadata qwen3.block_count missing"},
      {"qwen3 without attn_q_norm", no_norm, {}, {"blk.1.attn_q_norm.weight"},
       "tensor blk.1.attn_q_norm.weight missing"},
      {"gemma2 with output.weight", gemma2(),
       [](GgufWriter &g) { put_f32(g, "output.weight", {64, 128}, std::vector<float>(64 * 128, 0.1f)); }, {},
       "gemma2 projects its logits with token_embd.weight; output.weight is not expected"},
      {"phi3 rope factors of the wrong length", phi3(),
       [](GgufWriter &g) {
         put_f32(g, "rope_factors_long.weight", {5}, std::vector<float>(5, 1.0f));
         put_f32(g, "rope_factors_short.weight", {8}, std::vector<float>(8, 1.0f));
       },
       {}, "tensor rope_factors_long.weight has type F32 and shape (5), expected F32 of (8)"},
      {"phi3 with one set of rope factors", phi3(),
       [](GgufWriter &g) { put_f32(g, "rope_factors_short.weight", {8}, std::vector<float>(8, 1.0f)); }, {},
       "rope_factors_long.weight missing (rope_factors_short.weight is present)"},
      {"gemma2 attention soft-cap not positive", gemma2(),
       [](GgufWriter &g) { g.scalar<float>("gemma2.attn_logit_softcapping", MDL_GGUF_F32, -1.0f); }, {},
       "gemma2.attn_logit_softcapping = -1 not positive"},
  };
  for (auto &c : cases) {
    std::vector<uint8_t> bytes;
    if (!strcmp(c.what, "a missing key")) { // a qwen3 file with its architecture and one key, not block_count
      GgufWriter g;
      g.str("general.architecture", "qwen3");
      g.scalar<uint32_t>("qwen3.embedding_length", MDL_GGUF_U32, 64);
      bytes = g.bytes();
    } else {
      Weights w = make_weights(c.s, 12);
      bytes = gguf_bytes(c.s, w, c.extra, c.skip);
    }
    Loaded m(bytes);
    EXPECT_NE(m.rc, 0) << c.what;
    EXPECT_NE(std::string(m.err).find(c.want), std::string::npos) << c.what << ": " << m.err;
    if (c.s.arch == "mamba") { // every supported architecture is named
      for (const char *a : {"qwen3,", "phi3,", "gemma2,", "gemma3"})
        EXPECT_NE(std::string(m.err).find(a), std::string::npos) << a << " not named: " << m.err;
    }
  }
  // phi3 with separate gate and up (q, k, v may be separate, as llama.cpp's create_tensor_qkv takes them): ffn_up
  // has n_ff rows where phi3 reads the gate and up halves of 2 n_ff
  {
    Spec s = phi3();
    Weights w = make_weights(s, 11);
    s.fused = false;
    Loaded m(gguf_bytes(s, w, {}, {"blk.0.ffn_gate.weight", "blk.1.ffn_gate.weight"}));
    EXPECT_NE(m.rc, 0);
    EXPECT_NE(std::string(m.err).find("tensor blk.0.ffn_up.weight has shape (64, 96), expected (64, 192)"),
              std::string::npos)
        << m.err;
  }
  // a fused attn_qkv of the wrong width names the tensor and both shapes
  Spec s = phi3();
  Weights w = make_weights(s, 13);
  w.t["blk.0.attn_v.weight"].resize((size_t)64 * 32); // v of 32 rows instead of 64
  Loaded bad(gguf_bytes(s, w));
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(std::string(bad.err).find("tensor blk.0.attn_qkv.weight has shape (64, 160), expected (64, 192)"),
            std::string::npos)
      << bad.err;
  // a table without soft-capped attention (cuda's) refuses gemma2 at load, saying why; qwen3 and phi3 need no new op
  krn_backend nocap = *krn_cpu_scalar();
  nocap.name = "nocap";
  nocap.attn_softcap = 0;
  nocap.softcap = nullptr;
  Spec g2 = gemma2();
  Loaded refused(gguf_bytes(g2, make_weights(g2, 14)), &nocap);
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(std::string(refused.err).find("gemma2 needs soft-capped attention scores, which the nocap backend lacks"),
            std::string::npos)
      << refused.err;
  nocap.geglu = nullptr; // and nothing more than cuda has for the other two (no geglu, scale or window there either)
  nocap.scale = nullptr;
  nocap.attn_window = 0;
  for (Spec q : {qwen3(), phi3()}) {
    Loaded ok(gguf_bytes(q, make_weights(q, 15)), &nocap);
    EXPECT_EQ(ok.rc, 0) << q.arch << ": " << ok.err;
  }
}

} // namespace
