// tests/models/test_ppl.cc: perplexity and KL-divergence scoring on logits whose answers are known analytically, and
// the llama-perplexity logits file (layout, and every way a bad file is refused).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "models/ppl.h"
}

namespace {

std::vector<float> logs(std::vector<double> p) { // logits whose softmax is p (p sums to 1)
  std::vector<float> l;
  for (double x : p) l.push_back((float)std::log(x));
  return l;
}

std::vector<uint16_t> encode(const std::vector<float> &l, int tok = 0) {
  std::vector<uint16_t> row(mdl_kld_row_len((int)l.size()));
  mdl_kld_encode_row(l.data(), (int)l.size(), tok, row.data());
  return row;
}

TEST(Ppl, UniformLogitsGivePplOfTheVocabularySize) {
  for (int V : {2, 7, 1000, 49152}) {
    std::vector<float> l(V, 3.25f); // any constant: softmax is uniform
    double sum = 0, sum2 = 0;
    for (int t = 0; t < 10; t++) {
      double nll = mdl_ppl_nll(l.data(), V, (t * 37) % V);
      EXPECT_NEAR(nll, std::log((double)V), 1e-6);
      sum += nll;
      sum2 += nll * nll;
    }
    double mean, err;
    mdl_ppl_mean(sum, sum2, 10, &mean, &err);
    EXPECT_NEAR(std::exp(mean), V, V * 1e-6);
    EXPECT_LT(err, 1e-6); // every token equally likely: no spread (but the rounding of sum2 / n - mean^2)
  }
}

TEST(Ppl, NllIsMinusLogOfTheSoftmax) {
  // logits log(1..4): p = k / 10
  std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  for (int t = 0; t < 4; t++) EXPECT_NEAR(mdl_ppl_nll(l.data(), 4, t), -std::log((t + 1) / 10.0), 1e-6);
  // shifting every logit changes nothing; a huge spread does not overflow
  for (auto &x : l) x += 1000;
  EXPECT_NEAR(mdl_ppl_nll(l.data(), 4, 3), -std::log(0.4), 1e-4);
  std::vector<float> big = {0, 200};
  EXPECT_NEAR(mdl_ppl_nll(big.data(), 2, 0), 200, 1e-3);
  EXPECT_NEAR(mdl_ppl_nll(big.data(), 2, 1), 0, 1e-6);
}

TEST(Ppl, MeanAndStandardError) {
  double mean, err;
  mdl_ppl_mean(1 + 2 + 3 + 4, 1 + 4 + 9 + 16, 4, &mean, &err);
  EXPECT_DOUBLE_EQ(mean, 2.5);
  EXPECT_NEAR(err, std::sqrt(1.25 / 3), 1e-12); // population variance 1.25, over n - 1
  mdl_ppl_mean(5, 25, 1, &mean, &err);
  EXPECT_EQ(mean, 5);
  EXPECT_EQ(err, 0);
  mdl_ppl_mean(0, 0, 0, &mean, &err);
  EXPECT_EQ(mean, 0);
  EXPECT_EQ(err, 0);
}

TEST(Ppl, ScoredPositions) {
  EXPECT_EQ(mdl_ppl_scored(512), 255); // llama-perplexity: n_ctx - 1 - n_ctx/2
  EXPECT_EQ(mdl_ppl_scored(2048), 1023);
  EXPECT_EQ(mdl_ppl_scored(5), 2);
  EXPECT_EQ(mdl_kld_row_len(49152), 49156u);
  EXPECT_EQ(mdl_kld_row_len(5), 10u); // 5 rounded up to 6, and the 4 of the two floats
}

TEST(Ppl, EncodedRowKeepsTheLogProbs) {
  std::mt19937 g(7);
  std::normal_distribution<float> d(0, 3);
  std::vector<float> l(1000);
  for (auto &x : l) x = d(g);
  auto row = encode(l, 17);
  float scale, min_lp;
  memcpy(&scale, row.data(), 4);
  memcpy(&min_lp, row.data() + 2, 4);
  double lse = 0;
  float mx = *std::max_element(l.begin(), l.end());
  for (float x : l) lse += std::exp((double)x - mx);
  lse = std::log(lse) + mx;
  for (int i = 0; i < 1000; i++) {
    double lp = l[i] - lse, got = scale * row[4 + i] + min_lp;
    if (lp > min_lp) EXPECT_NEAR(got, lp, scale) << i; // within one step of the 16-bit grid
    else EXPECT_EQ(row[4 + i], 0) << i;                 // at or below the floor
  }
  EXPECT_GE(min_lp, l[0] - lse - 16 - 1e-3); // the floor sits at most 16 below the top
  EXPECT_NEAR(mdl_kld_encode_row(l.data(), 1000, 17, row.data()), lse - l[17], 1e-4);
}

TEST(Ppl, KlOfIdenticalDistributionsIsZero) {
  std::mt19937 g(3);
  std::normal_distribution<float> d(0, 2);
  std::vector<float> l(5000);
  for (auto &x : l) x = d(g);
  auto row = encode(l, 42);
  mdl_kld_acc acc{};
  double kld = mdl_kld_compare(l.data(), 5000, row.data(), 42, &acc);
  EXPECT_NEAR(kld, 0, 1e-5); // only the 16-bit rounding of the base
  EXPECT_EQ(acc.count, 1);
  EXPECT_EQ(acc.n_same_top, 1);
  EXPECT_NEAR(acc.sum_nll, acc.sum_nll_base, 1e-3);
  EXPECT_NEAR(acc.sum_nll, mdl_ppl_nll(l.data(), 5000, 42), 1e-4);
}

TEST(Ppl, KlOfAHandComputedPair) {
  // base p = (1/2, 1/4, 1/4), model q = (1/4, 1/2, 1/4):
  // KL(p || q) = 1/2 ln 2 + 1/4 ln(1/2) + 0 = ln(2) / 4; the tops differ (0 against 1)
  auto base = logs({0.5, 0.25, 0.25}), model = logs({0.25, 0.5, 0.25});
  auto row = encode(base, 1);
  mdl_kld_acc acc{};
  EXPECT_NEAR(mdl_kld_compare(model.data(), 3, row.data(), 1, &acc), std::log(2.0) / 4, 1e-5);
  EXPECT_EQ(acc.n_same_top, 0);
  EXPECT_NEAR(acc.sum_nll, std::log(2.0), 1e-5);      // -ln q[1]
  EXPECT_NEAR(acc.sum_nll_base, std::log(4.0), 1e-4); // -ln p[1]
  // and the other way round: KL(q || p) = 1/4 ln(1/2) + 1/2 ln 2 = ln(2) / 4 too, by symmetry of this pair;
  // an asymmetric pair: p = (0.9, 0.1), q = (0.5, 0.5): 0.9 ln 1.8 + 0.1 ln 0.2
  auto p2 = logs({0.9, 0.1}), q2 = logs({0.5, 0.5});
  auto row2 = encode(p2);
  mdl_kld_acc acc2{};
  EXPECT_NEAR(mdl_kld_compare(q2.data(), 2, row2.data(), 0, &acc2), 0.9 * std::log(1.8) + 0.1 * std::log(0.2),
              1e-5);
  EXPECT_EQ(acc2.n_same_top, 1); // q2's tie goes to the first token, as p2's top
}

TEST(Ppl, BaseEntriesBelowMinus16AreLeftOut) {
  // a base token at log p = -20: its term p (log p - log q) is < 1e-7 and llama-perplexity skips it
  std::vector<float> base = {0, -20}, model = {0, 5};
  auto row = encode(base);
  mdl_kld_acc acc{};
  double kld = mdl_kld_compare(model.data(), 2, row.data(), 0, &acc);
  double lq0 = -std::log1p(std::exp(5.0)); // log q[0]
  double lp0 = -std::log1p(std::exp(-20.0));
  EXPECT_NEAR(kld, std::exp(lp0) * (lp0 - lq0), 1e-5);
}

TEST(Ppl, PercentileAndSummary) {
  std::vector<float> v = {1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(mdl_ppl_percentile(v.data(), 5, 0), 1);
  EXPECT_DOUBLE_EQ(mdl_ppl_percentile(v.data(), 5, 1), 5);
  EXPECT_NEAR(mdl_ppl_percentile(v.data(), 5, 0.99), 4.96, 1e-9); // 0.99 * 4 = 3.96: between 4 and 5
  EXPECT_NEAR(mdl_ppl_percentile(v.data(), 5, 0.5), 3, 1e-12);

  // 100 positions of the hand-computed pair: every figure known
  auto base = logs({0.5, 0.25, 0.25}), model = logs({0.25, 0.5, 0.25});
  auto row = encode(base);
  mdl_kld_acc acc{};
  std::vector<float> klds;
  for (int i = 0; i < 100; i++) klds.push_back((float)mdl_kld_compare(model.data(), 3, row.data(), i % 2, &acc));
  std::swap(klds[3], klds[99]);
  mdl_kld_summary s;
  mdl_kld_summarize(&acc, klds.data(), klds.size(), &s);
  const double k = std::log(2.0) / 4;
  EXPECT_NEAR(s.kld, k, 1e-5);
  EXPECT_NEAR(s.kld_err, 0, 1e-6);
  EXPECT_NEAR(s.kld_max, k, 1e-5);
  EXPECT_NEAR(s.kld_p99, k, 1e-5);
  EXPECT_NEAR(s.kld_median, k, 1e-5);
  EXPECT_EQ(s.same_top, 0);
  // tokens 0 and 1 alternate: model nll ln 4 and ln 2, base ln 2 and ln 4: the same PPL, ratio 1
  EXPECT_NEAR(s.ppl, std::sqrt(8.0), 1e-4);
  EXPECT_NEAR(s.ppl_base, std::sqrt(8.0), 1e-3);
  EXPECT_NEAR(s.ppl_ratio, 1, 1e-4);
}

// ---- the file ----

struct TmpFile {
  std::string path;
  TmpFile() {
    char p[] = "/tmp/dserve_ppl_XXXXXX";
    int fd = mkstemp(p);
    if (fd >= 0) close(fd);
    path = p;
  }
  ~TmpFile() { unlink(path.c_str()); }
  void write(const std::vector<uint8_t> &b) const {
    FILE *f = fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fwrite(b.data(), 1, b.size(), f);
    fclose(f);
  }
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> b;
    FILE *f = fopen(path.c_str(), "rb");
    if (!f) return b;
    int c;
    while ((c = fgetc(f)) != EOF) b.push_back((uint8_t)c);
    fclose(f);
    return b;
  }
};

// A base file of n_chunk chunks of n_ctx tokens over a vocabulary of V, rows made from seeded logits.
void write_base(const TmpFile &t, int n_ctx, int V, int n_chunk, std::vector<int32_t> *tokens,
                std::vector<std::vector<uint16_t>> *rows) {
  std::mt19937 g(11);
  tokens->clear();
  for (int i = 0; i < n_ctx * n_chunk; i++) tokens->push_back((int32_t)(g() % V));
  FILE *f = fopen(t.path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  char err[256];
  ASSERT_EQ(mdl_kld_write_header(f, n_ctx, V, n_chunk, tokens->data(), err, sizeof err), 0) << err;
  std::normal_distribution<float> d(0, 2);
  rows->clear();
  for (int c = 0; c < n_chunk; c++)
    for (int r = 0; r < mdl_ppl_scored(n_ctx); r++) {
      std::vector<float> l(V);
      for (auto &x : l) x = d(g);
      rows->push_back(encode(l));
      fwrite(rows->back().data(), 2, rows->back().size(), f);
    }
  fclose(f);
}

TEST(PplFile, WrittenThenReadBack) {
  TmpFile t;
  std::vector<int32_t> tokens;
  std::vector<std::vector<uint16_t>> rows;
  write_base(t, 8, 5, 3, &tokens, &rows);
  // the layout: magic, n_ctx, n_vocab, n_chunk, tokens, 3 chunks of 3 rows of 10 u16
  EXPECT_EQ(t.read().size(), 20u + 4 * 24 + 3 * 3 * 10 * 2);
  EXPECT_EQ(memcmp(t.read().data(), "_logits_", 8), 0);
  mdl_kld_file kf;
  char err[256];
  ASSERT_EQ(mdl_kld_open(t.path.c_str(), &kf, err, sizeof err), 0) << err;
  EXPECT_EQ(kf.n_ctx, 8);
  EXPECT_EQ(kf.n_vocab, 5);
  EXPECT_EQ(kf.n_chunk, 3);
  EXPECT_EQ(std::vector<int32_t>(kf.tokens, kf.tokens + 24), tokens);
  std::vector<uint16_t> got(3 * 10);
  for (int c = 0; c < 3; c++) {
    ASSERT_EQ(mdl_kld_read_chunk(&kf, got.data(), err, sizeof err), 0) << err;
    for (int r = 0; r < 3; r++)
      EXPECT_EQ(std::vector<uint16_t>(got.begin() + r * 10, got.begin() + r * 10 + 10), rows[c * 3 + r]);
  }
  EXPECT_NE(mdl_kld_read_chunk(&kf, got.data(), err, sizeof err), 0); // no fourth chunk
  EXPECT_NE(std::string(err).find("all 3 chunks"), std::string::npos) << err;
  mdl_kld_close(&kf);
}

TEST(PplFile, BadFilesAreRefusedWithTheReason) {
  TmpFile t;
  std::vector<int32_t> tokens;
  std::vector<std::vector<uint16_t>> rows;
  write_base(t, 8, 5, 2, &tokens, &rows);
  const std::vector<uint8_t> good = t.read();
  mdl_kld_file kf;
  char err[256];
  auto refused = [&](const std::vector<uint8_t> &b, const char *why) {
    t.write(b);
    err[0] = 0;
    EXPECT_NE(mdl_kld_open(t.path.c_str(), &kf, err, sizeof err), 0) << why;
    EXPECT_NE(std::string(err).find(why), std::string::npos) << err;
    EXPECT_EQ(kf.f, nullptr);
    EXPECT_EQ(kf.tokens, nullptr);
  };
  EXPECT_NE(mdl_kld_open("/nonexistent/base.kld", &kf, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("/nonexistent/base.kld"), std::string::npos) << err;
  auto b = good;
  b[0] = 'X';
  refused(b, "not a llama-perplexity logits file");
  refused(std::vector<uint8_t>(good.begin(), good.begin() + 14), "header cut short");
  b = good;
  b[8] = 2; // n_ctx 2: nothing to score
  b[9] = b[10] = b[11] = 0;
  refused(b, "out of range");
  refused(std::vector<uint8_t>(good.begin(), good.end() - 1), "its header");       // cut
  b = good;
  b.push_back(0);
  refused(b, "its header");                                                        // padded
  b = good;
  int32_t bad = 5; // == n_vocab
  memcpy(&b[20 + 4 * 3], &bad, 4);
  refused(b, "outside the vocabulary");
  b = good;
  bad = -1;
  memcpy(&b[20], &bad, 4);
  refused(b, "outside the vocabulary");
  t.write(good);
  ASSERT_EQ(mdl_kld_open(t.path.c_str(), &kf, err, sizeof err), 0) << err;
  mdl_kld_close(&kf);
}

} // namespace
