// tests/models/test_sampler.cc: greedy, seeded sampling, filters, bias, penalties and logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

extern "C" {
#include "models/sampler.h"
}

namespace {

mdl_sampling neutral() {
  mdl_sampling s{};
  s.top_p = 1;
  s.repetition_penalty = 1;
  return s;
}

std::vector<float> random_logits(int n, unsigned seed, float scale = 4) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(n);
  for (auto &x : v) x = d(g);
  return v;
}

struct Sampler {
  mdl_sampler *s = nullptr;
  Sampler(const mdl_sampling &p, int V, const std::vector<int32_t> &prompt = {}) {
    char err[256];
    EXPECT_EQ(mdl_sampler_new(&p, V, prompt.data(), (int)prompt.size(), &s, err, sizeof err), 0) << err;
  }
  ~Sampler() { mdl_sampler_free(s); }
  int32_t next(const std::vector<float> &l) {
    mdl_sampled o;
    mdl_sampler_sample(s, l.data(), &o);
    return o.token;
  }
};

int argmax(const std::vector<float> &v) {
  int b = 0;
  for (int i = 1; i < (int)v.size(); i++)
    if (v[i] > v[b]) b = i;
  return b;
}

TEST(Sampler, GreedyIsArgmaxTiesToLowestId) {
  auto l = random_logits(1000, 1);
  Sampler s(neutral(), 1000);
  EXPECT_EQ(s.next(l), argmax(l));
  l[10] = l[700] = 100;
  EXPECT_EQ(s.next(l), 10);
}

TEST(Sampler, SameSeedSameOutputDifferentSeedDiffers) {
  auto p = neutral();
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.seed = 42;
  std::vector<int32_t> a, b, c;
  {
    Sampler s1(p, 5000), s2(p, 5000);
    auto q = p;
    q.seed = 43;
    Sampler s3(q, 5000);
    for (int i = 0; i < 64; i++) {
      auto l = random_logits(5000, 100 + i, 1.0f);
      a.push_back(s1.next(l));
      b.push_back(s2.next(l));
      c.push_back(s3.next(l));
    }
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// A request that asks for no logprobs skips the log-softmax: the same tokens from the same seed (greedy, and
// temperature with top_k and top_p), and its logprob reads 0; with the log-softmax the logprob is a real one (< 0).
TEST(Sampler, NoLogprobSameTokens) {
  for (float temp : {0.0f, 1.0f}) {
    auto p = neutral();
    p.temperature = temp;
    p.top_k = 40;
    p.top_p = 0.9f;
    p.seed = 7;
    auto q = p;
    q.no_logprob = 1;
    Sampler with(p, 3000), without(q, 3000);
    for (int i = 0; i < 32; i++) {
      auto l = random_logits(3000, 500 + i, 2.0f);
      mdl_sampled a, b;
      mdl_sampler_sample(with.s, l.data(), &a);
      mdl_sampler_sample(without.s, l.data(), &b);
      ASSERT_EQ(a.token, b.token) << "temperature " << temp << " step " << i;
      EXPECT_LT(a.logprob, 0.0f);
      EXPECT_EQ(b.logprob, 0.0f);
    }
  }
}

TEST(Sampler, TopKOneIsGreedy) {
  auto p = neutral();
  p.temperature = 1.5f;
  p.top_k = 1;
  p.seed = 7;
  Sampler s(p, 3000);
  for (int i = 0; i < 20; i++) {
    auto l = random_logits(3000, 200 + i);
    EXPECT_EQ(s.next(l), argmax(l));
  }
}

TEST(Sampler, TopKAndTopPAndMinPKeepOnlyTheHead) {
  const int V = 2000;
  auto l = random_logits(V, 9);
  std::vector<int> order(V);
  for (int i = 0; i < V; i++) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  auto p = neutral();
  p.temperature = 1;
  p.top_k = 5;
  p.seed = 1;
  {
    Sampler s(p, V);
    std::map<int, int> seen;
    for (int i = 0; i < 400; i++) seen[s.next(l)]++;
    for (auto &kv : seen) EXPECT_NE(std::find(order.begin(), order.begin() + 5, kv.first), order.begin() + 5);
    EXPECT_GE(seen.size(), 2u); // actually random
  }
  // top_p: make two tokens hold ~all the mass
  auto l2 = random_logits(V, 10, 0.5f);
  l2[3] = 20;
  l2[17] = 20;
  p.top_k = 0;
  p.top_p = 0.9f;
  {
    Sampler s(p, V);
    std::map<int, int> seen;
    for (int i = 0; i < 400; i++) seen[s.next(l2)]++;
    EXPECT_EQ(seen.size(), 2u);
    EXPECT_GT(seen[3], 100);
    EXPECT_GT(seen[17], 100);
  }
  // min_p: 0.5 keeps tokens within log(2) of the best
  auto l3 = std::vector<float>(V, 0.0f);
  l3[5] = 10;
  l3[6] = 10 - 0.5f;  // p/pmax = 0.61 kept
  l3[7] = 10 - 0.8f;  // 0.45 dropped
  p.top_p = 1;
  p.min_p = 0.5f;
  {
    Sampler s(p, V);
    std::map<int, int> seen;
    for (int i = 0; i < 400; i++) seen[s.next(l3)]++;
    EXPECT_EQ(seen.size(), 2u);
    EXPECT_GT(seen[5], 0);
    EXPECT_GT(seen[6], 0);
  }
}

TEST(Sampler, TemperatureFollowsTheDistribution) {
  std::vector<float> l = {std::log(0.7f), std::log(0.2f), std::log(0.1f)};
  auto p = neutral();
  p.temperature = 1;
  p.seed = 99;
  Sampler s(p, 3);
  int n[3] = {0, 0, 0};
  for (int i = 0; i < 20000; i++) n[s.next(l)]++;
  EXPECT_NEAR(n[0] / 20000.0, 0.7, 0.02);
  EXPECT_NEAR(n[1] / 20000.0, 0.2, 0.02);
  EXPECT_NEAR(n[2] / 20000.0, 0.1, 0.02);
}

TEST(Sampler, NegativeInfiniteBiasBansAToken) {
  auto l = random_logits(500, 3);
  int best = argmax(l);
  mdl_bias b{best, -INFINITY};
  auto p = neutral();
  p.bias = &b;
  p.n_bias = 1;
  Sampler g(p, 500);
  int t = g.next(l);
  EXPECT_NE(t, best);
  auto l2 = l;
  l2[best] = -INFINITY;
  EXPECT_EQ(t, argmax(l2));
  p.temperature = 2;
  p.seed = 5;
  Sampler s(p, 500);
  for (int i = 0; i < 500; i++) EXPECT_NE(s.next(l), best);
  // a positive bias forces a token
  mdl_bias b2{17, 1000};
  p.bias = &b2;
  Sampler f(p, 500);
  EXPECT_EQ(f.next(l), 17);
}

TEST(Sampler, PenaltiesChangeTheChoice) {
  std::vector<float> l(100, 0.0f);
  l[4] = 5.0f;
  l[9] = 4.0f;
  auto p = neutral();
  {
    // repetition penalty over the prompt: 5/1.5 = 3.33 < 4
    p.repetition_penalty = 1.5f;
    Sampler s(p, 100, {4});
    EXPECT_EQ(s.next(l), 9);
  }
  {
    Sampler s(p, 100, {});
    EXPECT_EQ(s.next(l), 4); // generated 4 goes into the history
    EXPECT_EQ(s.next(l), 9);
  }
  p.repetition_penalty = 1;
  {
    p.presence_penalty = 1.5f;
    Sampler s(p, 100);
    EXPECT_EQ(s.next(l), 4);
    EXPECT_EQ(s.next(l), 9); // 5 - 1.5 < 4
    EXPECT_EQ(s.next(l), 4); // presence is once per token: 3.5 vs 2.5
  }
  p.presence_penalty = 0;
  {
    p.frequency_penalty = 0.6f;
    Sampler s(p, 100);
    EXPECT_EQ(s.next(l), 4);  // 5
    EXPECT_EQ(s.next(l), 4);  // 4.4 > 4
    EXPECT_EQ(s.next(l), 9);  // 3.8 < 4
  }
}

TEST(Sampler, LogprobsAreLogSoftmaxOfRawLogitsSorted) {
  const int V = 300;
  auto l = random_logits(V, 11);
  auto p = neutral();
  p.n_logprobs = 20;
  p.presence_penalty = 2; // penalties must not change the reported logprobs
  Sampler s(p, V);
  mdl_sampled o;
  mdl_sampler_sample(s.s, l.data(), &o);
  double z = 0;
  for (float x : l) z += std::exp((double)x);
  ASSERT_EQ(o.n_top, 20);
  EXPECT_EQ(o.top[0].token, argmax(l));
  for (int i = 0; i < o.n_top; i++) {
    EXPECT_NEAR(o.top[i].logprob, l[o.top[i].token] - std::log(z), 1e-4);
    if (i) {
      EXPECT_GE(o.top[i - 1].logprob, o.top[i].logprob);
    }
  }
  EXPECT_NEAR(o.logprob, l[o.token] - std::log(z), 1e-4);
  // all probabilities sum to one; the top 20 sum to less
  double sum = 0, top = 0;
  for (float x : l) sum += std::exp(x - std::log(z));
  for (int i = 0; i < o.n_top; i++) top += std::exp(o.top[i].logprob);
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_LT(top, 1.0);
  // the next step is penalised (token repeated) but logprobs still come from the raw logits
  mdl_sampled o2;
  mdl_sampler_sample(s.s, l.data(), &o2);
  EXPECT_NE(o2.token, o.token);
  EXPECT_NEAR(o2.top[0].logprob, o.top[0].logprob, 1e-6);
}

TEST(Sampler, BadSettingsAreRefused) {
  char err[256];
  mdl_sampler *s = nullptr;
  auto p = neutral();
  p.temperature = -1;
  EXPECT_LT(mdl_sampler_new(&p, 10, nullptr, 0, &s, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("temperature"), std::string::npos);
  p = neutral();
  p.top_p = 0;
  EXPECT_LT(mdl_sampler_new(&p, 10, nullptr, 0, &s, err, sizeof err), 0);
  p = neutral();
  p.n_logprobs = 21;
  EXPECT_LT(mdl_sampler_new(&p, 10, nullptr, 0, &s, err, sizeof err), 0);
  p = neutral();
  mdl_bias b{10, 1};
  p.bias = &b;
  p.n_bias = 1;
  EXPECT_LT(mdl_sampler_new(&p, 10, nullptr, 0, &s, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("token 10"), std::string::npos);
  p = neutral();
  p.repetition_penalty = 0;
  EXPECT_LT(mdl_sampler_new(&p, 10, nullptr, 0, &s, err, sizeof err), 0);
  EXPECT_EQ(s, nullptr);
  mdl_sampler_free(nullptr);
}

} // namespace
