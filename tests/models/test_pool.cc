// tests/models/test_pool.cc: embeddings from the forward pass (mdl_llama_forward_pooled): a prompt's mean is the mean
// of each position's last-token row, chunking and batching change nothing, cls and last read the right rows; the
// GGUF's pooling key and the normalisation.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gguf_writer.h"
#include "model_util.h"

extern "C" {
#include "models/gguf.h"
#include "models/llama.h"
}

namespace {

const char *kSmol = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
const char *kGemma = DSERVE_SOURCE_DIR "/models/weights/gemma-3-270m-q4_k_m.gguf";

std::vector<int32_t> prompt(int n, int n_vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; i++) p.push_back((int32_t)((i * 7919 + 13) % (n_vocab - 10) + 5));
  return p;
}

// The pooled (raw, not finished) vector of p run as chunks of `chunk` tokens, alone in each step.
std::vector<float> pooled(ModelEngine &e, const std::vector<int32_t> &p, int pool, int chunk) {
  std::vector<float> v((size_t)e.cfg->n_embd, -7.0f);
  auto bt = e.blocks(8);
  for (int at = 0; at < (int)p.size(); at += chunk) {
    int n = std::min(chunk, (int)p.size() - at);
    mdl_seq s = {p.data() + at, n, at, bt.data(), 8, 0};
    mdl_pool_out o = {pool, v.data()};
    EXPECT_EQ(mdl_llama_forward_pooled(e.m, &e.kv, &s, 1, &o, nullptr, nullptr, nullptr, e.err, sizeof e.err), 0)
        << e.err;
  }
  return v;
}

float max_diff(const std::vector<float> &a, const std::vector<float> &b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

void pooling_reads_the_right_rows(const char *model) {
  ModelEngine e;
  ASSERT_TRUE(e.open(model, 128, nullptr, KRN_F16, " (the real model is needed: run scripts/setup.sh)"));
  const int n = 37, E = e.cfg->n_embd; // 37: past two blocks, chunks that straddle them
  auto p = prompt(n, e.cfg->n_vocab);
  // the mean is the sum of each position's row: the last-token row of each prefix (attention is causal)
  auto mean = pooled(e, p, MDL_POOL_MEAN, n);
  std::vector<float> sum((size_t)E, 0.0f), first, last;
  for (int i = 1; i <= n; i++) {
    std::vector<int32_t> pre(p.begin(), p.begin() + i);
    auto r = pooled(e, pre, MDL_POOL_LAST, i);
    for (int k = 0; k < E; k++) sum[k] += r[k];
    if (i == 1) first = r;
    if (i == n) last = r;
  }
  EXPECT_LT(max_diff(mean, sum), 2e-3f * n);
  // chunked as a worker runs a long prompt: the same sums (the cpu kernels compute each row alone)
  EXPECT_EQ(max_diff(pooled(e, p, MDL_POOL_MEAN, 13), mean), 0.0f);
  EXPECT_EQ(max_diff(pooled(e, p, MDL_POOL_LAST, 13), last), 0.0f);
  EXPECT_EQ(max_diff(pooled(e, p, MDL_POOL_CLS, 13), first), 0.0f);
  // a sequence recomputed from position 0 (preempted) starts its sum again
  std::vector<float> again((size_t)E, 0.0f);
  auto bt = e.blocks(8);
  for (int rep = 0; rep < 2; rep++) {
    mdl_seq s = {p.data(), n, 0, bt.data(), 8, 0};
    mdl_pool_out o = {MDL_POOL_MEAN, again.data()};
    ASSERT_EQ(mdl_llama_forward_pooled(e.m, &e.kv, &s, 1, &o, nullptr, nullptr, nullptr, e.err, sizeof e.err), 0);
  }
  EXPECT_EQ(max_diff(again, mean), 0.0f);
  // beside a sequence that wants logits, in one step: both as when alone
  std::vector<float> logits_alone((size_t)e.cfg->n_vocab), logits((size_t)e.cfg->n_vocab), v((size_t)E);
  auto q = prompt(9, e.cfg->n_vocab - 100);
  auto bq = e.blocks(8);
  mdl_seq sq = {q.data(), 9, 0, bq.data(), 8, 1};
  ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &sq, 1, logits_alone.data(), nullptr, nullptr, e.err, sizeof e.err), 0);
  auto bp = e.blocks(8), bq2 = e.blocks(8);
  mdl_seq two[2] = {{q.data(), 9, 0, bq2.data(), 8, 1}, {p.data(), n, 0, bp.data(), 8, 0}};
  mdl_pool_out outs[2] = {{0, nullptr}, {MDL_POOL_MEAN, v.data()}};
  ASSERT_EQ(mdl_llama_forward_pooled(e.m, &e.kv, two, 2, outs, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0)
      << e.err;
  EXPECT_EQ(max_diff(logits, logits_alone), 0.0f);
  EXPECT_EQ(max_diff(v, mean), 0.0f);
  // refused: a pooling without an output vector, one this pass does not compute
  mdl_pool_out none = {MDL_POOL_MEAN, nullptr}, rank = {MDL_POOL_RANK, v.data()};
  EXPECT_NE(mdl_llama_forward_pooled(e.m, &e.kv, &two[1], 1, &none, nullptr, nullptr, nullptr, e.err, sizeof e.err), 0);
  EXPECT_NE(mdl_llama_forward_pooled(e.m, &e.kv, &two[1], 1, &rank, nullptr, nullptr, nullptr, e.err, sizeof e.err), 0);
  EXPECT_NE(std::string(e.err).find("rank"), std::string::npos) << e.err;
}

TEST(Pool, RowsChunksAndBatchesSmolLM2) { pooling_reads_the_right_rows(kSmol); }
TEST(Pool, RowsChunksAndBatchesGemma3) { pooling_reads_the_right_rows(kGemma); } // sliding-window layers

TEST(Pool, FinishDividesAndNormalises) {
  std::vector<float> v = {3, 0, 4, 0};
  mdl_pool_finish(v.data(), 4, MDL_POOL_MEAN, 7);
  EXPECT_NEAR(v[0], 0.6f, 1e-6f);
  EXPECT_NEAR(v[2], 0.8f, 1e-6f);
  std::vector<float> z = {0, 0};
  mdl_pool_finish(z.data(), 2, MDL_POOL_LAST, 1);
  EXPECT_EQ(z[0], 0.0f);
  EXPECT_STREQ(mdl_pool_name(MDL_POOL_CLS), "cls");
  EXPECT_EQ(mdl_pool_named("last"), MDL_POOL_LAST);
  EXPECT_EQ(mdl_pool_named("max"), -1);
}

TEST(Pool, GgufKeyOrMeanForACausalLM) {
  mdl_gguf *g = nullptr;
  char err[256];
  ASSERT_EQ(mdl_gguf_open(kSmol, &g, err, sizeof err), 0) << err;
  int pool = -1;
  EXPECT_EQ(mdl_gguf_pooling(g, &pool, err, sizeof err), 0);
  EXPECT_EQ(pool, MDL_POOL_MEAN); // no llama.pooling_type key
  mdl_gguf_close(g);
  // the key as llama.cpp's converters write it (a uint32), each of its values; one outside the enum is refused
  for (uint32_t v : {0u, 1u, 2u, 3u, 4u, 9u}) {
    dserve_test::GgufWriter w;
    w.str("general.architecture", "qwen3");
    w.scalar("qwen3.pooling_type", 4 /* uint32 */, v);
    dserve_test::TempGguf f(w.bytes());
    ASSERT_EQ(mdl_gguf_open(f.path.c_str(), &g, err, sizeof err), 0) << err;
    int rc = mdl_gguf_pooling(g, &pool, err, sizeof err);
    mdl_gguf_close(g);
    if (v > 4) {
      EXPECT_NE(rc, 0);
      EXPECT_NE(std::string(err).find("qwen3.pooling_type is 9"), std::string::npos) << err;
    } else {
      EXPECT_EQ(rc, 0) << err;
      EXPECT_EQ(pool, (int)v);
    }
  }
}

} // namespace
