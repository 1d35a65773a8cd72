// tests/kernels/test_moe_ops.cc: the mixture-of-experts ops of every cpu backend: moe_combine against a hand
// computation and bit for bit against the scalar reference, and matmul groups whose products bring their own
// activation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/krn.h"
#include "tests/kernels/krn_test_util.h"

using namespace krntest;

namespace {
// (backend name, pool threads); rctx: the scalar reference, single-threaded
class KrnMoe : public ::testing::TestWithParam<std::tuple<const char *, int>> {
protected:
  const krn_backend *be = krn_cpu_by_name(std::get<0>(GetParam()));
  krn_pool *pool = nullptr;
  krn_ctx ctx{}, rctx{krn_cpu_scalar(), nullptr, nullptr};
  void SetUp() override {
    if (!be) GTEST_SKIP() << "this CPU lacks what the " << std::get<0>(GetParam()) << " backend needs";
    char err[128];
    ASSERT_NE(pool = krn_pool_new(std::get<1>(GetParam()), err, sizeof err), nullptr) << err;
    ctx = {be, pool, nullptr};
  }
  void TearDown() override { krn_pool_free(pool); }
};
} // namespace

// Two tokens, two experts each, rows of 3 by hand: y += w0 x[r0] + w1 x[r1].
TEST_P(KrnMoe, CombineByHand) {
  ASSERT_NE(be->moe_combine, nullptr);
  std::vector<float> x = {1, 2, 3, 10, 20, 30, -1, -2, -4}; // 3 expert rows of 3
  std::vector<int32_t> rows = {2, 0, 1, 1};
  std::vector<float> w = {0.5f, 0.25f, 1.0f, 2.0f};
  std::vector<float> y = {100, 100, 100, 0, 0, 0};
  be->moe_combine(&ctx, y.data(), x.data(), rows.data(), w.data(), 2, 2, 3);
  std::vector<float> want = {100 - 0.5f + 0.25f, 100 - 1 + 0.5f, 100 - 2 + 0.75f, 30, 60, 90};
  EXPECT_EQ(y, want);
}

// Every backend's combine is the scalar reference's, bit for bit, at sizes with and without a vector tail and
// batches small and large (the pool splits rows); and a row's result does not depend on the other rows.
TEST_P(KrnMoe, CombineMatchesScalarAndIsRowLocal) {
  std::mt19937 rng(5);
  for (int d : {8, 37, 64, 1024}) {
    for (int ku : {1, 2, 4, 8}) {
      for (int n : {1, 3, 65}) {
        int nx = n * ku;
        auto x = random_floats(rng, (size_t)nx * d, -3, 3);
        std::vector<int32_t> rows((size_t)n * ku);
        for (auto &r : rows) r = (int32_t)(rng() % (uint32_t)nx);
        auto w = random_floats(rng, (size_t)n * ku, 0, 1);
        auto y0 = random_floats(rng, (size_t)n * d);
        auto y = y0, yr = y0;
        be->moe_combine(&ctx, y.data(), x.data(), rows.data(), w.data(), n, ku, d);
        rctx.be->moe_combine(&rctx, yr.data(), x.data(), rows.data(), w.data(), n, ku, d);
        ASSERT_EQ(y, yr) << be->name << " d=" << d << " ku=" << ku << " n=" << n;
        // the last row alone gives the same bits
        std::vector<float> y1(y0.end() - d, y0.end());
        be->moe_combine(&ctx, y1.data(), x.data(), rows.data() + (size_t)(n - 1) * ku, w.data() + (size_t)(n - 1) * ku,
                        1, ku, d);
        for (int e = 0; e < d; e++) ASSERT_EQ(y1[e], y[(size_t)(n - 1) * d + e]) << e;
      }
    }
  }
}

// A matmul group whose products each take their own activation (an MoE layer's experts, each on its tokens) gives
// each product what matmul gives it alone, bit for bit: mixed row counts (0 included), weight types and sizes, in
// groups up to KRN_MM_GROUP_MAX, with products sharing an activation and not.
TEST_P(KrnMoe, MatmulGroupOwnActivations) {
  std::mt19937 rng(3);
  const krn_type types[] = {KRN_Q4_K, KRN_Q8_0, KRN_F32, KRN_Q6_K, KRN_Q4_0, KRN_F16, KRN_Q5_K, KRN_Q8_0};
  const int ns[] = {1, 1, 0, 17, 3, 3, 9, 1};
  const int k = 512, ms[] = {64, 48, 16, 80, 32, 16, 64, 96};
  std::vector<std::vector<uint8_t>> w;
  std::vector<std::vector<float>> x;
  for (int i = 0; i < KRN_MM_GROUP_MAX; i++) {
    w.push_back(random_weights(rng, types[i % 8], ms[i % 8], k));
    x.push_back(random_floats(rng, (size_t)(ns[i % 8] ? ns[i % 8] : 1) * k));
  }
  for (int n_mm = 1; n_mm <= KRN_MM_GROUP_MAX; n_mm++) {
    std::vector<std::vector<float>> y(n_mm), alone(n_mm);
    std::vector<krn_mm> mm(n_mm);
    for (int i = 0; i < n_mm; i++) {
      int n = ns[i % 8], m = ms[i % 8];
      // products 1 and 5 share product 0's activation when their row counts agree (a gate and up pair)
      const float *xi = (i % 4 == 1 && ns[i % 8] == ns[(i - 1) % 8]) ? x[i - 1].data() : x[i].data();
      y[i].assign((size_t)(n ? n : 1) * m, -7.0f);
      alone[i].assign((size_t)(n ? n : 1) * m, -7.0f);
      mm[i] = {y[i].data(), w[i].data(), types[i % 8], m, xi, n};
      if (n) be->matmul(&ctx, alone[i].data(), w[i].data(), types[i % 8], xi, n, k, m);
    }
    krn_matmul_group(&ctx, mm.data(), n_mm, x[0].data(), 5, k); // the group's own x and n go unused
    for (int i = 0; i < n_mm; i++) ASSERT_EQ(y[i], alone[i]) << be->name << " product " << i << " of " << n_mm;
  }
}

// A table without matmul_group (cuda's) gets krn_matmul_group's fallback, matmul per product, which honors each
// product's own activation and row count (0: nothing written).
TEST(KrnMoeFallback, MatmulGroupWithoutTheOpTakesOwnActivations) {
  krn_backend nogroup = *krn_cpu_scalar();
  nogroup.matmul_group = nullptr;
  krn_ctx c{&nogroup, nullptr, nullptr};
  std::mt19937 rng(4);
  const int k = 64, m = 8;
  auto w = random_weights(rng, KRN_Q8_0, m, k);
  auto x1 = random_floats(rng, 3 * k), x2 = random_floats(rng, (size_t)k);
  std::vector<float> y1(3 * m, -7), y2(m, -7), y3(m, -7), r1(3 * m), r2(m);
  krn_mm mm[3] = {{y1.data(), w.data(), KRN_Q8_0, m, x1.data(), 3},
                  {y2.data(), w.data(), KRN_Q8_0, m, x2.data(), 1},
                  {y3.data(), w.data(), KRN_Q8_0, m, x2.data(), 0}};
  krn_matmul_group(&c, mm, 3, nullptr, 0, k);
  nogroup.matmul(&c, r1.data(), w.data(), KRN_Q8_0, x1.data(), 3, k, m);
  nogroup.matmul(&c, r2.data(), w.data(), KRN_Q8_0, x2.data(), 1, k, m);
  EXPECT_EQ(y1, r1);
  EXPECT_EQ(y2, r2);
  EXPECT_EQ(y3, std::vector<float>(m, -7));
}

INSTANTIATE_TEST_SUITE_P(Backends, KrnMoe,
                         ::testing::Combine(::testing::Values("scalar", "avx2", "avx2vnni", "avx512", "amx"),
                                            ::testing::Values(1, 3)),
                         [](const auto &info) {
                           return std::string(std::get<0>(info.param)) + "_t" + std::to_string(std::get<1>(info.param));
                         });
