// tests/models/test_moe.cc: mixture-of-experts models (models/llama_moe.c): qwen3moe and Mixtral-style llama load,
// the routed FFN against a naive reference, batch invariance, and the load errors of bad expert counts and shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/models/model_util.h"
#include "tests/models/moe_model.h"

extern "C" {
#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"
}

namespace {

using dserve_test::make_moe;
using dserve_test::MoeModel;
using dserve_test::MoeShape;

// A MoE GGUF loaded on a cpu backend (2 threads) with an F32 paged KV cache of 64 blocks.
struct Moe : MemModel {
  MoeModel mm; // its tensors, for the references
  int next_block = 0;
  Moe(const MoeShape &s, const krn_backend *be = nullptr, uint32_t seed = 1) : Moe(make_moe(s, seed), be) {}
  Moe(MoeModel model, const krn_backend *be)
      : MemModel(model.bytes, be ? be : krn_cpu_best(), 64, 2), mm(std::move(model)) {}
  std::vector<int32_t> blocks(int n) {
    std::vector<int32_t> b;
    for (int i = 0; i < n; i++) b.push_back(next_block++);
    return b;
  }
};

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; i++) t.push_back((i * 37 + salt * 11 + 5) % 256);
  return t;
}

void rmsnorm(const std::vector<double> &x, const float *w, double eps, std::vector<double> &out) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double inv = 1.0 / std::sqrt(ss / (double)x.size() + eps);
  out.resize(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = x[i] * inv * w[i];
}

// y(m) = W(m rows of k) x(k)
std::vector<double> matvec(const float *W, const std::vector<double> &x, int m) {
  std::vector<double> y(m, 0.0);
  const size_t k = x.size();
  for (int j = 0; j < m; j++)
    for (size_t e = 0; e < k; e++) y[j] += (double)W[j * k + e] * x[e];
  return y;
}

// The naive reference of a model whose attention adds nothing (zero_wo): each token alone, its embedding through every
// layer's MoE FFN, each routed expert run one by one in double (softmax over the router's logits, the n_used best,
// their weights divided by their sum: llama.cpp's build_moe_ffn for qwen3moe and llama), then the output norm and
// projection. min_gap: the smallest margin between a token's last chosen and first unchosen probability, so that
// float rounding cannot flip the choice the test depends on.
std::vector<double> reference(const MoeModel &mm, const MoeShape &s, int tok, double *min_gap) {
  const int E = s.n_embd, F = s.n_ff_exp, NE = s.n_expert, K = s.n_used;
  const float *emb = mm.f("token_embd.weight");
  std::vector<double> x(emb + (size_t)tok * E, emb + (size_t)(tok + 1) * E), h, a(F);
  for (int l = 0; l < s.n_layer; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    rmsnorm(x, mm.f(p + "ffn_norm.weight"), 1e-6, h);
    std::vector<double> lg = matvec(mm.f(p + "ffn_gate_inp.weight"), h, NE), pr(NE);
    double mx = *std::max_element(lg.begin(), lg.end()), sum = 0;
    for (int e = 0; e < NE; e++) sum += pr[e] = std::exp(lg[e] - mx);
    for (double &v : pr) v /= sum;
    std::vector<int> order(NE);
    for (int e = 0; e < NE; e++) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int i, int j) { return pr[i] > pr[j]; });
    if (K < NE) *min_gap = std::min(*min_gap, pr[order[K - 1]] - pr[order[K]]); // (every expert used: no choice)
    double wsum = 0;
    for (int j = 0; j < K; j++) wsum += pr[order[j]];
    std::vector<double> out(E, 0.0);
    for (int j = 0; j < K; j++) {
      int e = order[j];
      auto g = matvec(mm.f(p + "ffn_gate_exps.weight") + (size_t)e * F * E, h, F);
      auto u = matvec(mm.f(p + "ffn_up_exps.weight") + (size_t)e * F * E, h, F);
      for (int i = 0; i < F; i++) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      auto y = matvec(mm.f(p + "ffn_down_exps.weight") + (size_t)e * E * F, a, E);
      for (int i = 0; i < E; i++) out[i] += pr[e] / wsum * y[i];
    }
    for (int i = 0; i < E; i++) x[i] += out[i];
  }
  rmsnorm(x, mm.f("output_norm.weight"), 1e-6, h);
  return matvec(mm.f("output.weight"), h, s.n_vocab);
}

TEST(Moe, LoadsQwen3MoeAndMixtralConfigs) {
  MoeShape s;
  Moe q(s);
  ASSERT_EQ(q.rc, 0) << q.err;
  EXPECT_STREQ(q.cfg()->arch, "qwen3moe");
  EXPECT_EQ(q.cfg()->n_expert, 8);
  EXPECT_EQ(q.cfg()->n_expert_used, 2);
  EXPECT_EQ(q.cfg()->n_ff_exp, 64);
  EXPECT_EQ(q.cfg()->qk_norm, 1);
  EXPECT_EQ(q.cfg()->rope_neox, 1);
  s.arch = "llama";
  s.n_expert = 4;
  Moe mx(s);
  ASSERT_EQ(mx.rc, 0) << mx.err;
  EXPECT_EQ(mx.cfg()->n_expert, 4);
  EXPECT_EQ(mx.cfg()->n_ff_exp, 64); // Mixtral: feed_forward_length is the experts' width
  EXPECT_EQ(mx.cfg()->qk_norm, 0);
  EXPECT_EQ(mx.cfg()->rope_neox, 0);
}

// Every token's logits (a 9-token prompt, each row) against the naive reference, on the scalar reference backend and
// on the best one, for both architectures and several (experts, used) pairs.
TEST(Moe, RoutedFfnMatchesNaiveReference) {
  struct Case {
    const char *arch;
    int n_expert, n_used;
  } cases[] = {{"qwen3moe", 8, 2}, {"qwen3moe", 16, 4}, {"llama", 8, 2}, {"llama", 4, 1}, {"qwen3moe", 6, 6}};
  for (const auto &c : cases) {
    for (const krn_backend *be : {krn_cpu_scalar(), krn_cpu_best()}) {
      MoeShape s;
      s.arch = c.arch;
      s.n_expert = c.n_expert;
      s.n_used = c.n_used;
      s.zero_wo = true;
      Moe e(s, be, 3);
      ASSERT_EQ(e.rc, 0) << e.err;
      auto toks = prompt(9, 1);
      auto bt = e.blocks(1);
      mdl_seq sq{toks.data(), (int)toks.size(), 0, bt.data(), 1, 1};
      std::vector<float> lg(toks.size() * 256);
      ASSERT_EQ(mdl_llama_forward_all(e.m, &e.kv, &sq, lg.data(), e.err, sizeof e.err), 0) << e.err;
      double gap = 1, worst = 0, scale = 0;
      for (size_t t = 0; t < toks.size(); t++) {
        auto ref = reference(e.mm, s, toks[t], &gap);
        for (int v = 0; v < 256; v++) {
          worst = std::max(worst, std::fabs(ref[v] - lg[t * 256 + v]));
          scale = std::max(scale, std::fabs(ref[v]));
        }
      }
      if (c.n_used < c.n_expert) {
        ASSERT_GT(gap, 1e-4) << "the data has a near tie: pick another seed";
      }
      EXPECT_LT(worst, 1e-4 * scale + 1e-5) << c.arch << " " << c.n_expert << "/" << c.n_used << " on " << be->name
                                            << " (logits up to " << scale << ")";
    }
  }
}

// A sequence's logits do not depend on what shares its step: its prefill alone, then in a step with a decode token
// and another prompt (so its tokens sit at other rows of each expert's group), and its decode step alone and batched,
// bit for bit; quantized weights on the best backend (the SIMD kernels' tiles), and the scalar one.
TEST(Moe, BatchInvariant) {
  for (const char *arch : {"qwen3moe", "llama"}) {
    for (const krn_backend *be : {krn_cpu_best(), krn_cpu_scalar()}) {
      MoeShape s;
      s.arch = arch;
      s.wtype = KRN_Q8_0;
      Moe e(s, be, 9);
      ASSERT_EQ(e.rc, 0) << e.err;
      const int V = 256;
      auto pa = prompt(21, 1), pb = prompt(7, 2), pc = prompt(33, 3);
      auto ba1 = e.blocks(2), ba2 = e.blocks(2), bb = e.blocks(2), bc = e.blocks(3);
      std::vector<float> alone(V), dec_alone(V), l3(3 * V), l2(2 * V);
      mdl_seq a1{pa.data(), 21, 0, ba1.data(), 2, 1};
      ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &a1, 1, alone.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
      int32_t next = 17;
      a1 = {&next, 1, 21, ba1.data(), 2, 1};
      ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &a1, 1, dec_alone.data(), nullptr, nullptr, e.err, sizeof e.err), 0);
      // b's prompt first, so that it can decode beside a's second prefill
      mdl_seq b0{pb.data(), 7, 0, bb.data(), 2, 1};
      ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &b0, 1, l2.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
      int32_t tb = 3;
      mdl_seq step[3] = {{&tb, 1, 7, bb.data(), 2, 1},
                         {pa.data(), 21, 0, ba2.data(), 2, 1},
                         {pc.data(), 33, 0, bc.data(), 3, 1}};
      ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, step, 3, l3.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), l3.begin() + V)) << arch << " prefill on " << be->name;
      tb = 5;
      mdl_seq dstep[2] = {{&next, 1, 21, ba2.data(), 2, 1}, {&tb, 1, 8, bb.data(), 2, 1}};
      ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, dstep, 2, l2.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
      EXPECT_TRUE(std::equal(dec_alone.begin(), dec_alone.end(), l2.begin())) << arch << " decode on " << be->name;
    }
  }
}

TEST(Moe, RefusesBadExpertCountsAndShapes) {
  struct Bad {
    const char *what;
    std::function<void(MoeShape &)> set;
    const char *want;
  } cases[] = {
      {"used 0", [](MoeShape &s) { s.key_n_used = 0; }, "qwen3moe.expert_used_count is 0"},
      {"used missing", [](MoeShape &s) { s.key_n_used = -2; }, "qwen3moe.expert_used_count missing"},
      {"used > experts", [](MoeShape &s) { s.key_n_used = 9; },
       "qwen3moe.expert_used_count = 9 exceeds qwen3moe.expert_count = 8"},
      {"qwen3moe without experts", [](MoeShape &s) { s.key_n_expert = -2; }, "qwen3moe.expert_count missing"},
      {"count vs tensors", [](MoeShape &s) { s.key_n_expert = 6; },
       "tensor blk.0.ffn_gate_inp.weight routes to 8 experts but qwen3moe.expert_count is 6"},
      {"3-D expert count",
       [](MoeShape &s) {
         s.tweak = [](std::string &n, std::vector<int64_t> &ne) {
           if (n == "blk.1.ffn_up_exps.weight") ne[2] = 7;
         };
       },
       "tensor blk.1.ffn_up_exps.weight holds 7 experts but qwen3moe.expert_count is 8"},
      {"3-D shape",
       [](MoeShape &s) {
         s.tweak = [](std::string &n, std::vector<int64_t> &ne) {
           if (n == "blk.0.ffn_down_exps.weight") ne[0] = 96;
         };
       },
       "tensor blk.0.ffn_down_exps.weight has shape (96, 128, 8), expected (64, 128, 8)"},
      {"2-D experts",
       [](MoeShape &s) {
         s.tweak = [](std::string &n, std::vector<int64_t> &ne) {
           if (n == "blk.0.ffn_gate_exps.weight") ne.pop_back();
         };
       },
       "tensor blk.0.ffn_gate_exps.weight has shape (128, 64), expected (128, 64, 8)"},
      {"old per-expert Mixtral",
       [](MoeShape &s) {
         s.arch = "llama";
         s.tweak = [](std::string &n, std::vector<int64_t> &ne) {
           if (n == "blk.0.ffn_gate_exps.weight") {
             n = "blk.0.ffn_gate.0.weight";
             ne.pop_back();
           }
         };
       },
       "tensor blk.0.ffn_gate.0.weight: experts stored one 2-D tensor each (an old Mixtral GGUF) are not supported; "
       "convert the model again with a current llama.cpp"},
      {"router without count", [](MoeShape &s) { s.arch = "llama", s.key_n_expert = -2; },
       "blk.0.ffn_gate_inp.weight (an expert router) present but llama.expert_count missing"},
      {"too many experts", [](MoeShape &s) { s.key_n_expert = 5000; }, "qwen3moe.expert_count = 5000 exceeds 1024"},
  };
  for (auto &c : cases) {
    MoeShape s;
    c.set(s);
    Moe e(s, krn_cpu_scalar());
    EXPECT_NE(e.rc, 0) << c.what;
    EXPECT_NE(std::string(e.err).find(c.want), std::string::npos) << c.what << ": " << e.err;
  }
}

// A backend table without moe_combine (cuda before it had one) refuses an MoE model at load, naming the op.
TEST(Moe, RefusesABackendWithoutTheCombineOp) {
  krn_backend nocombine = *krn_cpu_scalar();
  nocombine.moe_combine = nullptr;
  Moe e(MoeShape{}, &nocombine);
  EXPECT_NE(e.rc, 0);
  EXPECT_NE(std::string(e.err).find("needs the moe_combine op, which the scalar backend lacks"), std::string::npos)
      << e.err;
}

} // namespace
