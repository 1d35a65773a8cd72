// tests/kernels/test_ops.cc: every cpu backend's ops against double-precision references and against scalar.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/krn.h"
#include "tests/kernels/krn_test_util.h"

using namespace krntest;

namespace {
// (backend name, pool threads)
class KrnOps : public ::testing::TestWithParam<std::tuple<const char *, int>> {
protected:
  const krn_backend *be = nullptr, *ref = nullptr;
  krn_pool *pool = nullptr;
  krn_ctx ctx{}, rctx{};
  void SetUp() override {
    const char *name = std::get<0>(GetParam());
    be = krn_cpu_by_name(name);
    if (!be) GTEST_SKIP() << "this CPU lacks what the " << name << " backend needs";
    ref = krn_cpu_scalar();
    char err[128];
    pool = krn_pool_new(std::get<1>(GetParam()), err, sizeof err);
    ASSERT_NE(pool, nullptr) << err;
    ctx.be = be;
    ctx.pool = pool;
    rctx.be = ref;
    rctx.pool = nullptr;
  }
  void TearDown() override { krn_pool_free(pool); }
  bool is_scalar() const { return std::string(be->name) == "scalar"; }
};

const krn_type kWeightTypes[] = {KRN_F32,  KRN_F16,  KRN_BF16, KRN_Q4_0, KRN_Q4_1, KRN_Q5_0,
                                 KRN_Q5_1, KRN_Q8_0, KRN_Q4_K, KRN_Q5_K, KRN_Q6_K};
} // namespace

TEST_P(KrnOps, NameAndMemory) {
  EXPECT_STREQ(be->name, std::get<0>(GetParam()));
  EXPECT_EQ(be->ctx_init, nullptr);
  EXPECT_EQ(be->ctx_fini, nullptr);
  for (size_t sz : {0, 1, 63, 64, 1000}) {
    void *p = be->alloc(&ctx, sz);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ((uintptr_t)p % 64, 0u);
    std::vector<uint8_t> src(sz), dst(sz);
    for (size_t i = 0; i < sz; i++) src[i] = (uint8_t)(i * 7 + 1);
    be->upload(&ctx, p, src.data(), sz);
    be->sync(&ctx);
    be->download(&ctx, dst.data(), p, sz);
    EXPECT_EQ(src, dst);
    be->free(&ctx, p);
  }
  be->free(&ctx, nullptr);
}

// matmul. The scalar backend computes the exact product of the dequantized weight with the f32 activation
// (double accumulation), so it is held to 1e-5 of sum|w||x| against the test's own double product.
// SIMD backends quantize each 32-element block b of an activation row to int8 with d_b = max|x_b| / 127
// (round to nearest, d kept in f32) for every quantized weight type (K-quants too: their 32-element sub-blocks
// line up with the activation blocks), so each element moves by at most d_b / 2 and
// |y_simd - y_scalar| <= sum_b d_b / 2 * sum_{e in b} |w_e|; they get that bound (x1.01) plus 1e-5 of
// sum|w||x| for float rounding. F32/F16/BF16 weights are not quantized: 1e-5 of sum|w||x| alone.
TEST_P(KrnOps, MatmulAllTypesAwkwardSizes) {
  std::mt19937 rng(1234);
  const std::vector<int> ks32 = {32, 96, 224, 576, 1440}, ks256 = {256, 768, 1536};
  const int ms[] = {1, 7, 19, 37};
  const int ns[] = {1, 3, 17};
  for (krn_type t : kWeightTypes) {
    for (int k : krn_type_block(t) == KRN_QK_K ? ks256 : ks32) {
      for (int m : ms) {
        auto w = random_weights(rng, t, m, k);
        auto wd = dequant_rows(w.data(), t, k, m);
        for (int n : ns) {
          auto x = random_floats(rng, (size_t)n * k);
          for (int e = 0; e < k; e += 13) x[e] *= 8; // outliers within a block
          std::vector<float> y((size_t)n * m, NAN), yr((size_t)n * m, NAN);
          be->matmul(&ctx, y.data(), w.data(), t, x.data(), n, k, m);
          ref->matmul(&rctx, yr.data(), w.data(), t, x.data(), n, k, m);
          for (int i = 0; i < n; i++) {
            for (int j = 0; j < m; j++) {
              double exact = 0, mag = 0, qbound = 0;
              for (int b = 0; b < k / 32; b++) {
                double amax = 0, wabs = 0;
                for (int e = b * 32; e < b * 32 + 32; e++) {
                  double xv = x[(size_t)i * k + e];
                  exact += wd[j][e] * xv;
                  mag += std::fabs(wd[j][e] * xv);
                  amax = std::max(amax, std::fabs(xv));
                  wabs += std::fabs(wd[j][e]);
                }
                qbound += amax / 127 / 2 * wabs;
              }
              float got = y[(size_t)i * m + j], want = yr[(size_t)i * m + j];
              ASSERT_NEAR(want, exact, 1e-5 * mag + 1e-30) << "scalar " << krn_type_name(t) << " k=" << k;
              bool quantized = t != KRN_F32 && t != KRN_F16 && !is_scalar();
              double tol = (quantized ? 1.01 * qbound : 0) + 1e-5 * mag + 1e-30;
              ASSERT_NEAR(got, want, tol) << krn_type_name(t) << " k=" << k << " m=" << m << " n=" << n << " i=" << i
                                          << " j=" << j;
            }
          }
        }
      }
    }
  }
}

// The bound every SIMD matmul test holds a product to (krn_test_util.h's matmul_bounds): the activation's int8
// rounding where quantized is on, and float rounding.
static double mm_tol(const std::vector<double> &wd, const float *x, int k, bool quantized) {
  double mag, qbound;
  matmul_bounds(wd, x, k, &mag, &qbound);
  return (quantized ? 1.01 * qbound : 0) + 1e-5 * mag + 1e-30;
}

// The batched decode shapes: every activation row count 1..16 (tiles of 8 rows plus 4 / 2 / 1 leftovers; AVX-512's
// batch-1 path), odd block counts and ones not a multiple of AVX2's 8-block offset chunks, and weight row counts
// that leave a partial group of 16 rows (AVX-512) or one row for the last tile; same bound as above.
TEST_P(KrnOps, MatmulRowTilesMatchScalar) {
  std::mt19937 rng(99);
  const std::vector<int> ks32 = {32, 288, 544}, ks256 = {256, 768};
  for (krn_type t : kWeightTypes) {
    for (int k : krn_type_block(t) == KRN_QK_K ? ks256 : ks32) {
      const int m = 37;
      auto w = random_weights(rng, t, m, k);
      auto wd = dequant_rows(w.data(), t, k, m);
      for (int n = 1; n <= 16; n++) {
        auto x = random_floats(rng, (size_t)n * k);
        for (int e = 5; e < n * k; e += 29) x[e] *= 8;
        std::vector<float> y((size_t)n * m, NAN), yr((size_t)n * m, NAN);
        be->matmul(&ctx, y.data(), w.data(), t, x.data(), n, k, m);
        ref->matmul(&rctx, yr.data(), w.data(), t, x.data(), n, k, m);
        for (int i = 0; i < n; i++) {
          for (int j = 0; j < m; j++) {
            double tol = mm_tol(wd[j], x.data() + (size_t)i * k, k, t != KRN_F32 && t != KRN_F16 && !is_scalar());
            ASSERT_NEAR(y[(size_t)i * m + j], yr[(size_t)i * m + j], tol)
                << krn_type_name(t) << " k=" << k << " n=" << n << " i=" << i << " j=" << j;
          }
        }
      }
    }
  }
}

// Rows longer than the AVX-512 path's packed panel (64 blocks of 16 weight rows): the sums carried across chunks of
// blocks through y, for the decode and prefill row counts; the bound of MatmulAllTypesAwkwardSizes, and each row
// alone gives its batch result to the bit.
TEST_P(KrnOps, MatmulLongRowsMatchScalar) {
  std::mt19937 rng(31);
  for (krn_type t : kWeightTypes) {
    const int k = krn_type_block(t) == KRN_QK_K ? 4352 : 4128, m = 21; // 136 / 129 blocks: three chunks
    auto w = random_weights(rng, t, m, k);
    auto wd = dequant_rows(w.data(), t, k, m);
    auto x = random_floats(rng, (size_t)9 * k);
    std::vector<float> one((size_t)m);
    be->matmul(&ctx, one.data(), w.data(), t, x.data() + (size_t)8 * k, 1, k, m);
    for (int n : {1, 9}) {
      const float *xn = x.data() + (size_t)(9 - n) * k; // n = 1 and the last of n = 9 are the same row
      std::vector<float> y((size_t)n * m, NAN), yr((size_t)n * m, NAN);
      be->matmul(&ctx, y.data(), w.data(), t, xn, n, k, m);
      ref->matmul(&rctx, yr.data(), w.data(), t, xn, n, k, m);
      for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
          double tol = mm_tol(wd[j], xn + (size_t)i * k, k, t != KRN_F32 && t != KRN_F16 && !is_scalar());
          ASSERT_NEAR(y[(size_t)i * m + j], yr[(size_t)i * m + j], tol)
              << krn_type_name(t) << " n=" << n << " i=" << i << " j=" << j;
        }
      for (int j = 0; j < m; j++)
        ASSERT_EQ(y[(size_t)(n - 1) * m + j], one[j]) << krn_type_name(t) << " n=" << n << " j=" << j;
    }
  }
}

// A row's product must not depend on the batch it is computed in (which tile shape, which leftover path, which
// thread's share of the weight rows): the same activation row alone and inside batches of 2..16 rows gives
// bit-identical outputs, or a sequence's logits would change with the other sequences decoding next to it. Short
// and long weight rows (AVX-512: within one packed chunk and across two; batch 1 runs its own path).
TEST_P(KrnOps, MatmulRowIndependentOfBatch) {
  std::mt19937 rng(7);
  for (krn_type t : kWeightTypes)
  for (int k : krn_type_block(t) == KRN_QK_K ? std::vector<int>{512, 2048} : std::vector<int>{352, 1536}) {
    const int m = 45;
    auto w = random_weights(rng, t, m, k);
    auto x = random_floats(rng, (size_t)16 * k);
    std::vector<std::vector<float>> alone(16, std::vector<float>(m));
    for (int i = 0; i < 16; i++) be->matmul(&ctx, alone[i].data(), w.data(), t, x.data() + (size_t)i * k, 1, k, m);
    for (int n = 2; n <= 16; n++) {
      for (int off : {0, 16 - n}) { // the row at different positions within the batch
        std::vector<float> y((size_t)n * m);
        be->matmul(&ctx, y.data(), w.data(), t, x.data() + (size_t)off * k, n, k, m);
        for (int i = 0; i < n; i++)
          for (int j = 0; j < m; j++)
            ASSERT_EQ(y[(size_t)i * m + j], alone[off + i][j])
                << krn_type_name(t) << " n=" << n << " row " << off + i << " j=" << j;
      }
    }
  }
}

// A matmul group (krn_matmul_group: the backend's matmul_group, or matmul per product where the table has none)
// gives each product bit for bit what matmul gives it alone, whatever the mix of weight types (signed and unsigned
// int8 forms, K-quants, float) and sizes in it, at decode and prefill row counts; a product matmul refuses (k not a
// multiple of its block) is NaN and leaves the others whole.
TEST_P(KrnOps, MatmulGroupMatchesMatmul) {
  std::mt19937 rng(11);
  const krn_type mixes[][3] = {{KRN_Q4_1, KRN_Q4_1, KRN_Q4_1}, {KRN_Q5_0, KRN_Q5_0, KRN_Q8_0},
                               {KRN_Q4_K, KRN_Q6_K, KRN_F16},  {KRN_Q8_0, KRN_Q4_0, KRN_BF16}};
  const int ms[3] = {96, 33, 130};
  for (const auto &mix : mixes) {
    for (int k : {512, 1536}) {
      std::vector<std::vector<uint8_t>> w;
      for (int i = 0; i < 3; i++) w.push_back(random_weights(rng, mix[i], ms[i], k));
      for (int n : {1, 2, 9}) {
        auto x = random_floats(rng, (size_t)n * k);
        for (int n_mm = 1; n_mm <= 3; n_mm++) {
          std::vector<std::vector<float>> y(3), alone(3);
          krn_mm mm[3];
          for (int i = 0; i < n_mm; i++) {
            y[i].assign((size_t)n * ms[i], NAN);
            alone[i].assign((size_t)n * ms[i], NAN);
            mm[i] = {y[i].data(), w[i].data(), mix[i], ms[i], nullptr, 0};
            be->matmul(&ctx, alone[i].data(), w[i].data(), mix[i], x.data(), n, k, ms[i]);
          }
          krn_matmul_group(&ctx, mm, n_mm, x.data(), n, k);
          for (int i = 0; i < n_mm; i++)
            for (size_t e = 0; e < y[i].size(); e++)
              ASSERT_EQ(y[i][e], alone[i][e]) << krn_type_name(mix[i]) << " product " << i << " of " << n_mm
                                              << " k=" << k << " n=" << n << " e=" << e;
        }
      }
    }
  }
  // k = 288: a whole number of 32-element blocks, not of a K-quant's 256: the Q6_K product is NaN, the others not
  auto wa = random_weights(rng, KRN_Q4_0, 8, 288), wb = random_weights(rng, KRN_Q8_0, 8, 288);
  std::vector<uint8_t> wk(8 * krn_row_size(KRN_Q6_K, 256));
  auto x = random_floats(rng, 288);
  std::vector<float> ya(8, NAN), yk(8, 0), yb(8, NAN), ra(8), rb(8);
  krn_mm mm[3] = {{ya.data(), wa.data(), KRN_Q4_0, 8, nullptr, 0},
                  {yk.data(), wk.data(), KRN_Q6_K, 8, nullptr, 0},
                  {yb.data(), wb.data(), KRN_Q8_0, 8, nullptr, 0}};
  krn_matmul_group(&ctx, mm, 3, x.data(), 1, 288);
  be->matmul(&ctx, ra.data(), wa.data(), KRN_Q4_0, x.data(), 1, 288, 8);
  be->matmul(&ctx, rb.data(), wb.data(), KRN_Q8_0, x.data(), 1, 288, 8);
  for (int j = 0; j < 8; j++) {
    EXPECT_TRUE(std::isnan(yk[j])) << j;
    EXPECT_EQ(ya[j], ra[j]) << j;
    EXPECT_EQ(yb[j], rb[j]) << j;
  }
}

TEST_P(KrnOps, GetRowsDequantizes) {
  std::mt19937 rng(7);
  for (krn_type t : kWeightTypes) {
    int k = krn_type_block(t) == KRN_QK_K ? 512 : 96, rows = 11;
    auto w = random_weights(rng, t, rows, k);
    std::vector<int32_t> ids = {3, 0, 10, 3};
    std::vector<float> out(ids.size() * k);
    be->get_rows(&ctx, out.data(), w.data(), t, ids.data(), (int)ids.size(), k);
    for (size_t i = 0; i < ids.size(); i++) {
      auto want = dequant_row(w.data(), t, k, ids[i]);
      for (int e = 0; e < k; e++) ASSERT_NEAR(out[i * k + e], want[e], 1e-6 * std::fabs(want[e]) + 1e-9);
    }
  }
}

TEST_P(KrnOps, RmsnormInPlaceAndNot) {
  std::mt19937 rng(9);
  for (int d : {1, 7, 64, 576, 1000}) {
    int n = 5;
    auto x = random_floats(rng, (size_t)n * d, -3, 3), w = random_floats(rng, d);
    std::vector<float> out((size_t)n * d), inpl = x;
    be->rmsnorm(&ctx, out.data(), x.data(), w.data(), n, d, 1e-5f);
    be->rmsnorm(&ctx, inpl.data(), inpl.data(), w.data(), n, d, 1e-5f);
    for (int i = 0; i < n; i++) {
      double ss = 0;
      for (int j = 0; j < d; j++) ss += (double)x[i * d + j] * x[i * d + j];
      double inv = 1 / std::sqrt(ss / d + 1e-5);
      for (int j = 0; j < d; j++) {
        double want = x[i * d + j] * inv * w[j];
        ASSERT_NEAR(out[i * d + j], want, 1e-5 * std::fabs(want) + 1e-6) << "d=" << d;
        ASSERT_EQ(inpl[i * d + j], out[i * d + j]);
      }
    }
  }
}

// A hand-worked case fixes the pairing of each convention: head_dim 4, theta 100, position 1:
// pair 0 turns by 1 rad, pair 1 by 100^(-2/4) = 0.1 rad.
TEST_P(KrnOps, RopePairsBothConventions) {
  for (int neox : {0, 1}) {
    float x[4] = {1, 2, 3, 4};
    int32_t pos = 1;
    be->rope(&ctx, x, &pos, 1, 1, 4, 100.0f, neox);
    int a0 = 0, b0 = neox ? 2 : 1, a1 = neox ? 1 : 2, b1 = 3;
    float in[4] = {1, 2, 3, 4};
    EXPECT_NEAR(x[a0], in[a0] * std::cos(1.0) - in[b0] * std::sin(1.0), 1e-5) << neox;
    EXPECT_NEAR(x[b0], in[a0] * std::sin(1.0) + in[b0] * std::cos(1.0), 1e-5) << neox;
    EXPECT_NEAR(x[a1], in[a1] * std::cos(0.1) - in[b1] * std::sin(0.1), 1e-5) << neox;
    EXPECT_NEAR(x[b1], in[a1] * std::sin(0.1) + in[b1] * std::cos(0.1), 1e-5) << neox;
  }
}

// Random heads and positions against a double reference; angles are float in the kernel, as in ggml,
// so at position p the angle is off by about p * 2^-24 rad: 2e-4 of |x| covers positions below 2000.
TEST_P(KrnOps, RopeRandomMatchesDouble) {
  std::mt19937 rng(11);
  int n = 6, nh = 9, hd = 64;
  std::vector<int32_t> pos = {0, 1, 17, 300, 1023, 1999};
  for (int neox : {0, 1}) {
    auto x = random_floats(rng, (size_t)n * nh * hd), y = x;
    be->rope(&ctx, y.data(), pos.data(), n, nh, hd, 10000.0f, neox);
    for (int t = 0; t < n; t++)
      for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd / 2; i++) {
          double ang = pos[t] * std::pow(10000.0, -2.0 * i / hd);
          size_t base = ((size_t)t * nh + h) * hd;
          int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
          double x0 = x[base + a], x1 = x[base + b];
          ASSERT_NEAR(y[base + a], x0 * std::cos(ang) - x1 * std::sin(ang), 2e-4);
          ASSERT_NEAR(y[base + b], x0 * std::sin(ang) + x1 * std::cos(ang), 2e-4);
        }
  }
}

// The SIMD backends run rope, rope_freqs and kv_store on the pool, split by rows: the same arithmetic as the scalar
// loops, so the same bits, for a batch big enough to be split (and one row).
TEST_P(KrnOps, RopeAndKvStoreOnThePoolEqualScalar) {
  std::mt19937 rng(31);
  for (int n : {1, 97}) {
    std::vector<int32_t> pos(n);
    for (int i = 0; i < n; i++) pos[i] = 3 * i + 1;
    for (int neox : {0, 1}) {
      auto x = random_floats(rng, (size_t)n * 4 * 256), y = x;
      be->rope(&ctx, x.data(), pos.data(), n, 4, 256, 1e6f, neox);
      ref->rope(&rctx, y.data(), pos.data(), n, 4, 256, 1e6f, neox);
      ASSERT_EQ(x, y) << "rope, " << n << " rows, neox " << neox;
      auto f = random_floats(rng, 128, 1e-4f, 1.0f);
      be->rope_freqs(&ctx, x.data(), pos.data(), n, 4, 256, f.data(), 1.25f, neox);
      ref->rope_freqs(&rctx, y.data(), pos.data(), n, 4, 256, f.data(), 1.25f, neox);
      ASSERT_EQ(x, y) << "rope_freqs, " << n << " rows, neox " << neox;
    }
  }
  for (krn_type kt : {KRN_F16, KRN_F32}) {
    std::mt19937 r1(37), r2(37);
    PagedBatch mine = make_batch(r1, be, &ctx, 8, 2, 72, kt, {300, 7}, {1, 1});
    PagedBatch want = make_batch(r2, ref, &rctx, 8, 2, 72, kt, {300, 7}, {1, 1});
    EXPECT_EQ(mine.kc, want.kc) << krn_type_name(kt);
    EXPECT_EQ(mine.vc, want.vc) << krn_type_name(kt);
  }
}

TEST_P(KrnOps, SwigluGegluAddSoftmax) {
  std::mt19937 rng(13);
  for (int64_t n : {1, 7, 33, 1536, 4099}) {
    auto g = random_floats(rng, n, -12, 12), u = random_floats(rng, n, -2, 2);
    std::vector<float> out(n), inpl = g;
    be->swiglu(&ctx, out.data(), g.data(), u.data(), n);
    be->swiglu(&ctx, inpl.data(), inpl.data(), u.data(), n);
    for (int64_t i = 0; i < n; i++) {
      double want = g[i] / (1 + std::exp(-(double)g[i])) * u[i];
      ASSERT_NEAR(out[i], want, 2e-6 * std::fabs(want) + 1e-7) << "swiglu n=" << n << " g=" << g[i];
      ASSERT_EQ(inpl[i], out[i]);
    }
    // geglu: gelu's tanh approximation (Gemma 3's FFN) against the scalar reference's formula in double, over the
    // range where its tanh saturates both ways; the reference's float 1 + tanh(z) cancels for negative z, an error
    // of a few float ulps of 1 times |g u| (the SIMD tables' g / (1 + exp(-2 z)) has no such cancellation)
    std::vector<float> ge(n), gin = g;
    be->geglu(&ctx, ge.data(), g.data(), u.data(), n);
    be->geglu(&ctx, gin.data(), gin.data(), u.data(), n);
    for (int64_t i = 0; i < n; i++) {
      double x = g[i], want = 0.5 * x * (1 + std::tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x))) * u[i];
      ASSERT_NEAR(ge[i], want, 4e-6 * std::fabs(want) + 3e-7 * std::fabs(x * u[i]) + 1e-7)
          << "geglu n=" << n << " g=" << g[i];
      ASSERT_EQ(gin[i], ge[i]);
    }
    auto y = random_floats(rng, n), x = random_floats(rng, n), y0 = y;
    be->add(&ctx, y.data(), x.data(), n);
    for (int64_t i = 0; i < n; i++) ASSERT_EQ(y[i], y0[i] + x[i]);
  }
  // softmax: large logits (max subtraction), a -inf entry, awkward widths
  for (int d : {1, 5, 17, 49152 / 3}) {
    int n = 3;
    auto x = random_floats(rng, (size_t)n * d, -20, 20);
    x[0] += 1000;
    if (d > 2) x[1] = -INFINITY;
    auto y = x;
    be->softmax(&ctx, y.data(), n, d);
    for (int i = 0; i < n; i++) {
      double mx = -1e300, sum = 0;
      for (int j = 0; j < d; j++) mx = std::max(mx, (double)x[i * d + j]);
      for (int j = 0; j < d; j++) sum += std::exp(x[i * d + j] - mx);
      for (int j = 0; j < d; j++) {
        double want = std::exp(x[i * d + j] - mx) / sum;
        ASSERT_NEAR(y[i * d + j], want, 2e-6 * want + 1e-9) << "softmax d=" << d;
      }
    }
  }
}

TEST_P(KrnOps, KvStoreRoundTrip) {
  std::mt19937 rng(17);
  for (krn_type kt : {KRN_F16, KRN_F32, KRN_Q8_0}) {
    PagedBatch pb = make_batch(rng, be, &ctx, 9, 3, 64, kt, {5, 16, 33}, {5, 16, 33});
    size_t kvd = 3 * 64;
    for (int s = 0; s < 3; s++) {
      int len = (int)(pb.dk[s].size() / kvd);
      for (int p = 0; p < len; p++) {
        int32_t blk = pb.tables[(size_t)s * pb.max_blocks + p / 16];
        size_t off = ((size_t)blk * 16 + p % 16) * krn_row_size(kt, (int64_t)kvd);
        for (size_t e = 0; e < kvd; e++) {
          float k = kv_cache_value(pb.kc, kt, off, e), v = kv_cache_value(pb.vc, kt, off, e);
          ASSERT_EQ(k, pb.dk[s][p * kvd + e]) << krn_type_name(kt) << " seq " << s << " pos " << p;
          ASSERT_EQ(v, pb.dv[s][p * kvd + e]);
        }
      }
    }
    // a row whose position lies beyond its block table writes nothing
    std::vector<uint8_t> before = pb.kc;
    std::vector<int32_t> seq = {0}, pos = {pb.max_blocks * 16 + 3};
    krn_attn_args a = pb.args();
    a.n_tokens = 1;
    a.tok_seq = seq.data();
    a.tok_pos = pos.data();
    std::vector<float> kk(kvd, 1.0f), vv(kvd, 2.0f);
    be->kv_store(&ctx, kk.data(), vv.data(), &a);
    EXPECT_EQ(before, pb.kc);
  }
}

// Paged attention against the dense reference: shuffled block ids, partial last blocks, GQA 1 and 3,
// a mixed batch (decode rows with one query, prefill rows with many causal queries, a 1-token sequence).
// Tolerance 2e-5 absolute: outputs are convex mixtures of values in [-1, 1]; the cache's f16 rounding is
// already in the reference, so what is left is float accumulation and exp.
TEST_P(KrnOps, PagedAttentionMatchesDense) {
  std::mt19937 rng(19);
  struct Cfg { int nh, nkv, hd; };
  for (Cfg cfg : {Cfg{4, 4, 32}, Cfg{9, 3, 64}, Cfg{6, 2, 80}}) {
    for (krn_type kt : {KRN_F16, KRN_F32, KRN_Q8_0}) {
      if (!krn_kv_type_ok(kt, cfg.hd)) continue; // Q8_0 rows are whole blocks of 32
      std::vector<int> ctxl = {1, 17, 40, 16, 70, 5};
      std::vector<int> news = {1, 17, 1, 16, 1, 3};
      PagedBatch pb = make_batch(rng, be, &ctx, cfg.nh, cfg.nkv, cfg.hd, kt, ctxl, news);
      std::shuffle(pb.tok_seq.begin(), pb.tok_seq.end(), rng); // rows need not be grouped by sequence ...
      pb.tok_pos.clear();
      { // ... so reassign positions: each sequence's rows get its last positions, in order
        std::vector<int> next(ctxl.size());
        for (size_t s = 0; s < ctxl.size(); s++) next[s] = ctxl[s] - news[s];
        for (int32_t s : pb.tok_seq) pb.tok_pos.push_back(next[s]++);
      }
      int nt = (int)pb.tok_seq.size();
      auto q = random_floats(rng, (size_t)nt * cfg.nh * cfg.hd, -2, 2);
      std::vector<float> out(q.size(), NAN);
      krn_attn_args a = pb.args();
      be->paged_attention(&ctx, out.data(), q.data(), &a);
      auto want = dense_attention(pb, q);
      for (size_t i = 0; i < out.size(); i++)
        ASSERT_NEAR(out[i], want[i], 2e-5) << "heads " << cfg.nh << "/" << cfg.nkv << " " << krn_type_name(kt) << " at " << i;
    }
  }
}

// Prefill rows in batch order, as the engine sends them: consecutive rows of one sequence share the SIMD backends'
// tiles (several tokens times the heads of one kv head). Checked against the scalar reference with and without a
// sliding window, with the blocks before every row's window taken out of the table (-1, as a window group's table
// holds them once they slid out), for GQA groups of 1, 3 and 4 (Gemma 3) and head sizes that are and are not a
// multiple of the vector width. And each row alone gives its batch result to the bit.
TEST_P(KrnOps, PagedAttentionPrefillTilesMatchScalar) {
  std::mt19937 rng(29);
  struct Cfg { int nh, nkv, hd; };
  for (Cfg cfg : {Cfg{4, 4, 32}, Cfg{9, 3, 64}, Cfg{4, 1, 256}, Cfg{8, 2, 40}}) {
    for (krn_type kt : {KRN_F16, KRN_F32, KRN_Q8_0}) {
      if (!krn_kv_type_ok(kt, cfg.hd)) continue; // Q8_0 rows are whole blocks of 32
      std::vector<int> ctxl = {75, 1, 40, 100, 9}, news = {75, 1, 23, 2, 9}; // whole prompts, a chunk, decode rows
      PagedBatch pb = make_batch(rng, be, &ctx, cfg.nh, cfg.nkv, cfg.hd, kt, ctxl, news);
      int nt = (int)pb.tok_seq.size();
      auto q = random_floats(rng, (size_t)nt * cfg.nh * cfg.hd, -2, 2);
      for (int window : {0, 7, 20, 33}) {
        PagedBatch w = pb;
        if (window > 0) // blocks wholly before every row's window are gone
          for (size_t s = 0; s < ctxl.size(); s++) {
            int first = ctxl[s] - news[s] - window + 1; // the first row's first visible position
            for (int b = 0; (b + 1) * w.block_size <= first; b++) w.tables[s * w.max_blocks + b] = -1;
          }
        krn_attn_args a = w.args();
        a.window = window;
        std::vector<float> out(q.size(), NAN), want(q.size(), NAN);
        be->paged_attention(&ctx, out.data(), q.data(), &a);
        ref->paged_attention(&rctx, want.data(), q.data(), &a);
        for (size_t i = 0; i < out.size(); i++)
          ASSERT_NEAR(out[i], want[i], 2e-5) << "heads " << cfg.nh << "/" << cfg.nkv << " hd " << cfg.hd << " "
                                             << krn_type_name(kt) << " window " << window << " at " << i;
        // a row's result does not depend on the rows that share its tile: alone (a decode step) it is the same to
        // the bit, so a prompt prefilled at once, in chunks, or handed from a prefill worker gives the same tokens
        size_t rs = (size_t)cfg.nh * cfg.hd;
        for (int r = 0; r < nt; r++) {
          krn_attn_args one = a;
          one.n_tokens = 1;
          one.tok_seq = a.tok_seq + r;
          one.tok_pos = a.tok_pos + r;
          std::vector<float> alone(rs, NAN);
          be->paged_attention(&ctx, alone.data(), q.data() + r * rs, &one);
          for (size_t i = 0; i < rs; i++)
            ASSERT_EQ(alone[i], out[r * rs + i]) << "row " << r << " alone, heads " << cfg.nh << "/" << cfg.nkv
                                                 << " hd " << cfg.hd << " window " << window << " at " << i;
        }
      }
    }
  }
}

// Gemma 2's attention-logit soft-cap (krn_attn_args.softcap): the dense reference with cap * tanh(s / cap) on each
// score, and the SIMD tables' tiles against the scalar reference, with and without a window, for a cap that bends
// the scores (2: q in [-2, 2] gives scores of a few units) and Gemma 2's 50. A capped and an uncapped run differ.
TEST_P(KrnOps, PagedAttentionSoftcap) {
  ASSERT_EQ(be->attn_softcap, 1) << be->name;
  std::mt19937 rng(41);
  struct Cfg { int nh, nkv, hd; };
  for (Cfg cfg : {Cfg{4, 4, 32}, Cfg{8, 4, 256}, Cfg{8, 2, 40}}) {
    for (krn_type kt : {KRN_F16, KRN_Q8_0}) {
      if (!krn_kv_type_ok(kt, cfg.hd)) continue;
      std::vector<int> ctxl = {75, 1, 40, 100}, news = {75, 1, 23, 2};
      PagedBatch pb = make_batch(rng, be, &ctx, cfg.nh, cfg.nkv, cfg.hd, kt, ctxl, news);
      int nt = (int)pb.tok_seq.size();
      auto q = random_floats(rng, (size_t)nt * cfg.nh * cfg.hd, -2, 2);
      for (float cap : {2.0f, 50.0f}) {
        krn_attn_args a = pb.args();
        a.scale = 0.5f; // larger scores than 1 / sqrt(hd), so that a cap of 2 bends them
        a.softcap = cap;
        std::vector<float> out(q.size(), NAN), want(q.size(), NAN), plain(q.size(), NAN);
        be->paged_attention(&ctx, out.data(), q.data(), &a);
        ref->paged_attention(&rctx, want.data(), q.data(), &a);
        for (size_t i = 0; i < out.size(); i++)
          ASSERT_NEAR(out[i], want[i], 2e-5) << "heads " << cfg.nh << "/" << cfg.nkv << " hd " << cfg.hd << " cap "
                                             << cap << " at " << i;
        if (cap == 2.0f && kt == KRN_F16) {
          PagedBatch scaled = pb; // the dense reference's scale is 1 / sqrt(hd): fold 0.5 into q instead
          std::vector<float> q2(q);
          for (auto &x : q2) x *= 0.5f * std::sqrt((float)cfg.hd);
          auto dense = dense_attention(scaled, q2, cap);
          for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(want[i], dense[i], 2e-5) << "dense, at " << i;
          a.softcap = 0;
          be->paged_attention(&ctx, plain.data(), q.data(), &a);
          double diff = 0;
          for (size_t i = 0; i < out.size(); i++) diff = std::max(diff, (double)std::fabs(out[i] - plain[i]));
          EXPECT_GT(diff, 1e-2) << "a cap of 2 changed nothing";
        }
        a.softcap = cap;
        a.window = 20; // with a window too (Gemma 2's local layers)
        be->paged_attention(&ctx, out.data(), q.data(), &a);
        ref->paged_attention(&rctx, want.data(), q.data(), &a);
        for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], want[i], 2e-5) << "window 20, cap " << cap;
      }
    }
  }
}

// MLA's latent row read as K and its first v_dim values as V (krn_attn_args.v_dim, v_cache = k_cache): the output is
// (tokens, heads, v_dim) and equals the first v_dim values of each head of the plain attention over the same rows (the
// scalar reference bit for bit, as it sums the same terms), and the SIMD tables match the scalar one; with GQA groups,
// DeepSeek V3's 576 / 512, and a window.
TEST_P(KrnOps, PagedAttentionValuePrefix) {
  ASSERT_EQ(be->attn_vdim, 1) << be->name;
  std::mt19937 rng(47);
  struct Cfg { int nh, nkv, hd, vd; };
  for (Cfg cfg : {Cfg{4, 1, 96, 64}, Cfg{8, 1, 576, 512}, Cfg{4, 2, 64, 32}, Cfg{2, 1, 48, 40}}) {
    for (krn_type kt : {KRN_F32, KRN_F16, KRN_Q8_0}) {
      if (!krn_kv_type_ok(kt, cfg.hd) || !krn_kv_type_ok(kt, cfg.vd)) continue;
      std::vector<int> ctxl = {75, 1, 40}, news = {75, 1, 2};
      PagedBatch pb = make_batch(rng, be, &ctx, cfg.nh, cfg.nkv, cfg.hd, kt, ctxl, news);
      int nt = (int)pb.tok_seq.size();
      auto q = random_floats(rng, (size_t)nt * cfg.nh * cfg.hd);
      for (int window : {0, 20}) {
        krn_attn_args a = pb.args();
        a.window = window;
        a.v_cache = a.k_cache;
        std::vector<float> full((size_t)nt * cfg.nh * cfg.hd, NAN), want((size_t)nt * cfg.nh * cfg.vd, NAN),
            out(want.size(), NAN);
        ref->paged_attention(&rctx, full.data(), q.data(), &a);
        a.v_dim = cfg.vd;
        ref->paged_attention(&rctx, want.data(), q.data(), &a);
        be->paged_attention(&ctx, out.data(), q.data(), &a);
        for (int r = 0; r < nt * cfg.nh; r++)
          for (int d = 0; d < cfg.vd; d++) {
            ASSERT_EQ(want[(size_t)r * cfg.vd + d], full[(size_t)r * cfg.hd + d]) << "scalar, row " << r << " d " << d;
            ASSERT_NEAR(out[(size_t)r * cfg.vd + d], want[(size_t)r * cfg.vd + d], 2e-5)
                << be->name << " " << krn_type_name(kt) << " hd " << cfg.hd << " vd " << cfg.vd << " window " << window
                << " row " << r << " d " << d;
          }
      }
    }
  }
  krn_attn_args bad{}; // v_dim above head_dim: NaN, not a read past the row
  bad.n_tokens = 1, bad.n_head = 1, bad.n_kv_head = 1, bad.head_dim = 32, bad.block_size = 16, bad.v_dim = 64;
  std::vector<float> o(64, 0), q(32, 0);
  be->paged_attention(&ctx, o.data(), q.data(), &bad);
  EXPECT_TRUE(std::isnan(o[0]));
}

// The final logits' soft-cap op against cap * tanh(x / cap) in double, in place, over widths with and without a tail.
TEST_P(KrnOps, Softcap) {
  ASSERT_NE(be->softcap, nullptr) << be->name;
  std::mt19937 rng(43);
  for (int64_t n : {1, 7, 33, 4099}) {
    for (float cap : {30.0f, 3.0f}) {
      auto x = random_floats(rng, n, -200, 200);
      x[0] = 1e-3f;
      auto y = x;
      be->softcap(&ctx, y.data(), cap, n);
      for (int64_t i = 0; i < n; i++)
        ASSERT_NEAR(y[i], cap * std::tanh((double)x[i] / cap), 1e-6 * cap) << "n=" << n << " x=" << x[i];
    }
  }
}

// A Q8_0 cache holds ggml's Q8_0 layout (any Q8_0 reader decodes d * q): integers that fit keep d = 1 and q = x, an
// all-zero group has d = 0, and every backend's kv_store writes the bytes krn_quant_row_q8_0 writes. Its scale is ggml's
// (max|x| / 127) or a slightly smaller one with less squared error: per group never more error than ggml's encoding,
// and over random groups at least 10% less. And the error it adds to attention stays within what 8 bits allow.
TEST_P(KrnOps, KvStoreQ8_0Encoding) {
  std::mt19937 rng(31);
  PagedBatch pb = make_batch(rng, be, &ctx, 2, 1, 64, KRN_Q8_0, {1}, {1});
  std::vector<float> k = random_floats(rng, 64, -3, 3), v(64, 0.0f);
  for (int j = 0; j < 32; j++) v[j] = j == 5 ? 127.0f : (float)(j - 16); // integers up to 127: exact with d = 1
  krn_attn_args a = pb.args();
  a.n_tokens = 1;
  int32_t seq = 0, pos = 0;
  a.tok_seq = &seq;
  a.tok_pos = &pos;
  be->kv_store(&ctx, k.data(), v.data(), &a);
  int32_t blk = pb.tables[0];
  const krn_block_q8_0 *kb = (const krn_block_q8_0 *)(pb.kc.data() + (size_t)blk * 16 * 68);
  const krn_block_q8_0 *vb = (const krn_block_q8_0 *)(pb.vc.data() + (size_t)blk * 16 * 68);
  krn_block_q8_0 want[2];
  krn_quant_row_q8_0(want, k.data(), 64);
  EXPECT_EQ(std::memcmp(kb, want, sizeof want), 0) << "kv_store wrote other bytes than krn_quant_row_q8_0";
  EXPECT_EQ(krn_f16_to_f32(vb[0].d), 1.0f);
  for (int j = 0; j < 32; j++) EXPECT_EQ(vb[0].qs[j], (int)v[j]) << j;
  EXPECT_EQ(vb[1].d, 0); // an all-zero group
  for (int j = 0; j < 32; j++) EXPECT_EQ(vb[1].qs[j], 0);
  // against ggml's encoding (d = max|x| / 127 stored as f16, q = roundf(x / d) with the f32 d)
  double ours = 0, ggml = 0;
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (int g = 0; g < 2000; g++) {
    float x[32], amax = 0;
    for (float &e : x) amax = std::max(amax, std::fabs(e = gauss(rng) * (g % 2 ? 1.0f : 0.01f)));
    krn_block_q8_0 b;
    krn_quant_row_q8_0(&b, x, 32);
    float d = amax / 127.0f, dg = krn_f16_to_f32(krn_f32_to_f16(d)), eo = 0, eg = 0;
    for (int j = 0; j < 32; j++) {
      float o = x[j] - krn_f16_to_f32(b.d) * b.qs[j], r = x[j] - dg * roundf(x[j] * (1.0f / d));
      eo += o * o, eg += r * r;
    }
    ASSERT_LE(eo, eg) << "group " << g;
    ours += eo / (amax * amax), ggml += eg / (amax * amax);
  }
  EXPECT_LT(ours, 0.9 * ggml) << ours / ggml;
  // the same K/V through f16 and q8_0 caches: outputs differ by no more than the quantization step allows
  for (int hd : {64, 256}) {
    std::mt19937 r1(37), r2(37);
    PagedBatch f = make_batch(r1, be, &ctx, 4, 1, hd, KRN_F16, {300}, {3});
    PagedBatch q = make_batch(r2, be, &ctx, 4, 1, hd, KRN_Q8_0, {300}, {3});
    auto qv = random_floats(rng, (size_t)3 * 4 * hd, -2, 2);
    std::vector<float> of(qv.size()), oq(qv.size());
    krn_attn_args af = f.args(), aq = q.args();
    be->paged_attention(&ctx, of.data(), qv.data(), &af);
    be->paged_attention(&ctx, oq.data(), qv.data(), &aq);
    for (size_t i = 0; i < of.size(); i++) ASSERT_NEAR(oq[i], of[i], 1.0 / 127) << "hd " << hd << " at " << i;
  }
}

// Shapes an op cannot run with give NaN outputs (the table has no error channel), never a crash.
TEST_P(KrnOps, BadShapesGiveNaN) {
  std::vector<uint8_t> w(4096, 0);
  std::vector<float> x(256, 1.0f), y(8, 0.0f);
  be->matmul(&ctx, y.data(), w.data(), (krn_type)10, x.data(), 1, 64, 8); // Q2_K: refused type
  for (float v : y) EXPECT_TRUE(std::isnan(v));
  y.assign(8, 0.0f);
  be->matmul(&ctx, y.data(), w.data(), KRN_Q4_1, x.data(), 1, 40, 8); // k not a multiple of 32
  for (float v : y) EXPECT_TRUE(std::isnan(v));
  y.assign(8, 0.0f);
  be->matmul(&ctx, y.data(), w.data(), KRN_Q6_K, x.data(), 1, 96, 8); // k not a multiple of 256
  for (float v : y) EXPECT_TRUE(std::isnan(v));
  std::vector<float> rows(2 * 96, 0.0f);
  int32_t ids[2] = {0, 1};
  be->get_rows(&ctx, rows.data(), w.data(), KRN_Q4_K, ids, 2, 96);
  for (float v : rows) EXPECT_TRUE(std::isnan(v));
  y.assign(8, 0.0f);
  be->matmul(&ctx, y.data(), w.data(), KRN_F32, x.data(), 1, 40, 8); // float weights take any k
  for (float v : y) EXPECT_EQ(v, 0.0f);
  std::mt19937 rng(23);
  PagedBatch pb = make_batch(rng, be, &ctx, 9, 3, 64, KRN_F16, {4}, {1});
  for (int nkv : {0, 4}) {
    krn_attn_args a = pb.args();
    a.n_kv_head = nkv; // 9 heads cannot share 0 or 4 kv heads
    std::vector<float> q(9 * 64, 0.5f), out(9 * 64, 0.0f);
    be->paged_attention(&ctx, out.data(), q.data(), &a);
    for (float v : out) ASSERT_TRUE(std::isnan(v)) << nkv;
  }
  { // a Q8_0 cache of rows that are not whole blocks of 32 (head_dim 40): refused, NaN
    krn_attn_args a = pb.args();
    a.kv_type = KRN_Q8_0;
    a.head_dim = 40;
    std::vector<float> q(9 * 40, 0.5f), out(9 * 40, 0.0f);
    be->paged_attention(&ctx, out.data(), q.data(), &a);
    for (float v : out) ASSERT_TRUE(std::isnan(v)) << "q8_0 head_dim 40";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, KrnOps,
                         ::testing::Combine(::testing::Values("scalar", "avx2", "avx2vnni", "avx512", "amx"), ::testing::Values(1, 3)),
                         [](const auto &info) {
                           return std::string(std::get<0>(info.param)) + "_t" + std::to_string(std::get<1>(info.param));
                         });

TEST(KrnSelect, ByNameAndBest) {
  EXPECT_EQ(krn_cpu_by_name("scalar"), krn_cpu_scalar());
  EXPECT_EQ(krn_cpu_by_name("nonsense"), nullptr);
  EXPECT_EQ(krn_cpu_by_name(nullptr), nullptr);
  const krn_backend *best = krn_cpu_best();
  ASSERT_NE(best, nullptr);
  // best is the widest backend this CPU has (when DSERVE_KERNELS does not say otherwise)
  if (!getenv("DSERVE_KERNELS")) {
    const krn_backend *want = krn_cpu_by_name("avx512"); // "amx" by name only
    if (!want) want = krn_cpu_by_name("avx2vnni");
    if (!want) want = krn_cpu_by_name("avx2");
    if (!want) want = krn_cpu_scalar();
    EXPECT_EQ(best, want);
  }
  setenv("DSERVE_KERNELS", "scalar", 1);
  EXPECT_EQ(krn_cpu_best(), krn_cpu_scalar());
  setenv("DSERVE_KERNELS", "bogus", 1);
  EXPECT_NE(krn_cpu_best(), nullptr);
  unsetenv("DSERVE_KERNELS");
}
