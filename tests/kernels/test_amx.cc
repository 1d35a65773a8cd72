// tests/kernels/test_amx.cc: the amx tables' prefill matmul (tile emulation and real AMX) against scalar and avx512.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "tests/kernels/krn_test_util.h"

#define KRN_AMX_EMULATE 1
#include "kernels/cpu/amx_tile.h"

using namespace krntest;

namespace {

const krn_type kQuantTypes[] = {KRN_Q4_0, KRN_Q4_1, KRN_Q5_0, KRN_Q5_1, KRN_Q8_0, KRN_Q4_K, KRN_Q5_K, KRN_Q6_K};

// The emulation's TDPBSSD, checked against the instruction's definition written out here: A (16 x 32 bytes) by B in
// the VNNI layout (B[e / 4][4 n + e % 4] = column n's element e), signed bytes, accumulating onto what C held.
TEST(AmxTile, EmulatedDpbssdIsTheSdmDefinition) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(-128, 127);
  amx_cfg cfg{};
  cfg.palette = 1;
  cfg.rows[0] = 16, cfg.colsb[0] = 64; // C: 16 x 16 int32
  cfg.rows[1] = 16, cfg.colsb[1] = 32; // A: 16 rows of 32 bytes
  cfg.rows[2] = 8, cfg.colsb[2] = 64;  // B: 8 rows of 16 x 4 bytes
  amx_regs R;
  AMX_CONFIG(&R, &cfg);
  int8_t a[16][32], w[16][32], b[8][64];
  int32_t c0[16][16], c[16][16];
  for (auto &row : a) for (auto &v : row) v = (int8_t)byte(rng);
  for (auto &row : w) for (auto &v : row) v = (int8_t)byte(rng);
  for (int n = 0; n < 16; n++)
    for (int e = 0; e < 32; e++) b[e / 4][4 * n + e % 4] = w[n][e];
  for (auto &row : c0) for (auto &v : row) v = byte(rng) * 1000;
  AMX_LOAD(&R, 0, c0, 64);
  AMX_LOAD(&R, 1, a, 32);
  AMX_LOAD(&R, 2, b, 64);
  AMX_DPBSSD(&R, 0, 1, 2);
  AMX_STORE(&R, 0, c, 64);
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      int32_t want = c0[m][n];
      for (int e = 0; e < 32; e++) want += a[m][e] * w[n][e];
      ASSERT_EQ(c[m][n], want) << "m=" << m << " n=" << n;
    }
  // a tile load reads colsb bytes of each row at the stride and zeroes the rest; TILEZERO clears
  int8_t wide[16][48];
  for (auto &row : wide) for (auto &v : row) v = 7;
  AMX_LOAD(&R, 1, wide, 48);
  for (int r = 0; r < 16; r++) {
    for (int e = 0; e < 32; e++) ASSERT_EQ((int8_t)R.t[1][r][e], 7);
    for (int e = 32; e < 64; e++) ASSERT_EQ(R.t[1][r][e], 0);
  }
  AMX_ZERO(&R, 0);
  AMX_STORE(&R, 0, c, 64);
  for (auto &row : c) for (int32_t v : row) ASSERT_EQ(v, 0);
}

// Shapes that do not chain raise #UD on real AMX; the emulation must not compute through them.
TEST(AmxTile, EmulatedMismatchedShapesFault) {
  amx_cfg cfg{};
  cfg.palette = 1;
  cfg.rows[0] = 16, cfg.colsb[0] = 64;
  cfg.rows[1] = 16, cfg.colsb[1] = 32;
  cfg.rows[2] = 4, cfg.colsb[2] = 64; // 32 bytes of A need 8 rows of B
  EXPECT_DEATH({ amx_regs R; AMX_CONFIG(&R, &cfg); AMX_DPBSSD(&R, 0, 1, 2); }, "TDPBSSD");
  cfg.rows[2] = 17;
  EXPECT_DEATH({ amx_regs R; AMX_CONFIG(&R, &cfg); }, "LDTILECFG");
}

// (table: "amx-emulated" or "amx", pool threads)
class AmxMatmul : public ::testing::TestWithParam<std::tuple<const char *, int>> {
protected:
  const krn_backend *be = nullptr, *ref = nullptr, *avx = nullptr;
  krn_pool *pool = nullptr;
  krn_ctx ctx{}, rctx{}, actx{};
  void SetUp() override {
    std::string name = std::get<0>(GetParam());
    avx = krn_cpu_by_name("avx512");
    if (!avx) GTEST_SKIP() << "no AVX-512 on this CPU (the amx kernels, emulated ones too, build on it)";
    if (name == "amx") {
      be = krn_cpu_by_name("amx");
      if (!be) GTEST_SKIP() << "no AMX on this CPU (amx: " << krn_cpu_amx_absent() << ")";
    } else {
      be = krn_cpu_amx_emulated_table();
    }
    ref = krn_cpu_scalar();
    char err[128];
    pool = krn_pool_new(std::get<1>(GetParam()), err, sizeof err);
    ASSERT_NE(pool, nullptr) << err;
    ctx = {be, pool, nullptr};
    rctx = {ref, nullptr, nullptr};
    actx = {avx, pool, nullptr};
  }
  void TearDown() override { krn_pool_free(pool); }
};

// Every quantized weight type: row counts of one 32-row tile step and past it but not a multiple of it (a tail of
// rows computed straight from the weight blocks), weight
// row counts of one panel, a partial one and several, block counts from one unit to SmolLM2's 576 (18 blocks, padded
// to 32 in the activation rows). Against scalar with the bound of
// test_ops.cc (activation quantization plus float rounding), and against avx512, which multiplies the same int8
// bytes, within float rounding alone (1e-5 of sum|w||x|).
TEST_P(AmxMatmul, PrefillShapesMatchScalarAndAvx512) {
  std::mt19937 rng(321);
  const std::vector<int> ks32 = {32, 96, 576}, ks256 = {256, 768};
  const int ms[] = {1, 17, 33, 70};
  const int ns[] = {32, 45, 77}; // one tile step; tiles and a tail of rows straight from the weight blocks
  int cases = 0;
  for (krn_type t : kQuantTypes) {
    for (int k : krn_type_block(t) == KRN_QK_K ? ks256 : ks32) {
      for (int m : ms) {
        auto w = random_weights(rng, t, m, k);
        auto wd = dequant_rows(w.data(), t, k, m);
        for (int n : ns) {
          auto x = random_floats(rng, (size_t)n * k);
          for (int e = 3; e < n * k; e += 13) x[e] *= 8; // outliers within a block
          std::vector<float> y((size_t)n * m, NAN), yr((size_t)n * m, NAN), ya((size_t)n * m, NAN);
          be->matmul(&ctx, y.data(), w.data(), t, x.data(), n, k, m);
          ref->matmul(&rctx, yr.data(), w.data(), t, x.data(), n, k, m);
          avx->matmul(&actx, ya.data(), w.data(), t, x.data(), n, k, m);
          cases++;
          for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
              double mag, qbound;
              matmul_bounds(wd[j], &x[(size_t)i * k], k, &mag, &qbound);
              float got = y[(size_t)i * m + j];
              ASSERT_NEAR(got, yr[(size_t)i * m + j], 1.01 * qbound + 1e-5 * mag + 1e-30)
                  << "vs scalar " << krn_type_name(t) << " k=" << k << " m=" << m << " n=" << n << " i=" << i << " j=" << j;
              ASSERT_NEAR(got, ya[(size_t)i * m + j], 1e-5 * mag + 1e-30)
                  << "vs avx512 " << krn_type_name(t) << " k=" << k << " m=" << m << " n=" << n << " i=" << i << " j=" << j;
            }
        }
      }
    }
  }
  EXPECT_EQ(cases, (5 * 3 + 3 * 2) * 4 * 3); // 32-element types x 3 k, K-quants x 2 k; x 4 m x 3 n
}

// In the tile path a row's product does not depend on the batch around it: in a tile step or in the tail past the
// full steps, at any offset, the same row gives bit-identical outputs (over a model, rounding differences grow to
// tenths of a logit: tests/models). Below 32 rows (decode) the avx512 table's products, bit for bit.
TEST_P(AmxMatmul, RowIndependentOfBatchFrom32Rows) {
  std::mt19937 rng(8);
  for (krn_type t : kQuantTypes) {
    const int k = krn_type_block(t) == KRN_QK_K ? 512 : 160, m = 40;
    auto w = random_weights(rng, t, m, k);
    auto x = random_floats(rng, (size_t)80 * k);
    std::vector<float> all((size_t)77 * m);
    be->matmul(&ctx, all.data(), w.data(), t, x.data(), 77, k, m);
    for (int n : {32, 45, 70}) {
      for (int off : {3, 77 - n}) {
        std::vector<float> y((size_t)n * m);
        be->matmul(&ctx, y.data(), w.data(), t, x.data() + (size_t)off * k, n, k, m);
        for (int i = 0; i < n; i++)
          for (int j = 0; j < m; j++)
            ASSERT_EQ(y[(size_t)i * m + j], all[(size_t)(off + i) * m + j])
                << krn_type_name(t) << " n=" << n << " row " << off + i << " j=" << j;
      }
    }
    for (int n : {1, 8, 31}) {
      std::vector<float> y((size_t)n * m), ya((size_t)n * m);
      be->matmul(&ctx, y.data(), w.data(), t, x.data(), n, k, m);
      avx->matmul(&actx, ya.data(), w.data(), t, x.data(), n, k, m);
      ASSERT_EQ(0, std::memcmp(y.data(), ya.data(), y.size() * sizeof(float))) << krn_type_name(t) << " n=" << n;
    }
  }
}

// A matmul group (a layer's q, k, v) gives each product what the table's matmul gives it alone, bit for bit: on the
// tiles from 32 rows (prefill stays on AMX), the avx512 group below (decode).
TEST_P(AmxMatmul, GroupIsEachProductsMatmul) {
  std::mt19937 rng(12);
  const krn_type ts[3] = {KRN_Q4_1, KRN_Q8_0, KRN_Q6_K};
  const int k = 512, ms[3] = {64, 17, 40};
  std::vector<std::vector<uint8_t>> w;
  for (int i = 0; i < 3; i++) w.push_back(random_weights(rng, ts[i], ms[i], k));
  for (int n : {1, 8, 32, 45}) {
    auto x = random_floats(rng, (size_t)n * k);
    std::vector<std::vector<float>> y(3), alone(3);
    krn_mm mm[3];
    for (int i = 0; i < 3; i++) {
      y[i].assign((size_t)n * ms[i], NAN);
      alone[i].assign((size_t)n * ms[i], NAN);
      mm[i] = {y[i].data(), w[i].data(), ts[i], ms[i], nullptr, 0};
      be->matmul(&ctx, alone[i].data(), w[i].data(), ts[i], x.data(), n, k, ms[i]);
    }
    krn_matmul_group(&ctx, mm, 3, x.data(), n, k);
    for (int i = 0; i < 3; i++)
      ASSERT_EQ(0, std::memcmp(y[i].data(), alone[i].data(), y[i].size() * sizeof(float)))
          << krn_type_name(ts[i]) << " n=" << n;
  }
}

// Float weights are the avx512 table's own products, bit for bit; bad shapes give NaN as on every table.
TEST_P(AmxMatmul, FloatWeightsAreAvx512sAndBadShapesNaN) {
  std::mt19937 rng(11);
  for (krn_type t : {KRN_F16, KRN_BF16, KRN_F32}) {
    const int k = 64, m = 21;
    auto w = random_weights(rng, t, m, k);
    for (int n : {1, 8, 40}) {
      auto x = random_floats(rng, (size_t)n * k);
      std::vector<float> y((size_t)n * m), ya((size_t)n * m);
      be->matmul(&ctx, y.data(), w.data(), t, x.data(), n, k, m);
      avx->matmul(&actx, ya.data(), w.data(), t, x.data(), n, k, m);
      ASSERT_EQ(0, std::memcmp(y.data(), ya.data(), y.size() * sizeof(float))) << krn_type_name(t) << " n=" << n;
    }
  }
  for (int n : {1, 40}) {
    std::vector<float> y((size_t)n * 3, 0.0f), x((size_t)n * 48, 1.0f);
    std::vector<uint8_t> w(krn_row_size(KRN_Q8_0, 64) * 3, 0);
    be->matmul(&ctx, y.data(), w.data(), KRN_Q8_0, x.data(), n, 48, 3); // k not a multiple of 32
    for (float v : y) ASSERT_TRUE(std::isnan(v)) << "n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Tables, AmxMatmul,
                         ::testing::Combine(::testing::Values("amx-emulated", "amx"), ::testing::Values(1, 3)),
                         [](const auto &info) {
                           std::string n = std::get<0>(info.param);
                           return (n == "amx" ? std::string("amx") : std::string("emulated")) + "_t" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The amx table is offered exactly where detection found AMX, by name only (krn_cpu_best keeps avx512: amx's rounding
// depends on the batch size), and the log line says which kernels run and why not amx.
TEST(AmxSelect, OfferedByNameOnlyWithAmxAndDescribed) {
  const char *why = krn_cpu_amx_absent();
  char line[160];
  const krn_backend *amx = krn_cpu_by_name("amx");
  EXPECT_TRUE(getenv("DSERVE_KERNELS") || krn_cpu_best() != amx || !amx);
  if (why) {
    EXPECT_EQ(amx, nullptr);
    krn_describe(krn_cpu_scalar(), line, sizeof line);
    EXPECT_EQ(std::string(line), std::string("scalar (amx: ") + why + ")");
  } else {
    ASSERT_NE(amx, nullptr);
    EXPECT_EQ(std::string(amx->name), "amx");
    krn_describe(amx, line, sizeof line);
    EXPECT_EQ(std::string(line), "amx");
    krn_describe(krn_cpu_scalar(), line, sizeof line);
    EXPECT_EQ(std::string(line), "scalar (amx: present, not chosen)");
  }
  EXPECT_EQ(krn_cpu_amx_absent(), why); // asked once: the same answer every time
  EXPECT_EQ(std::string(krn_cpu_amx_emulated_table()->name), "amx-emulated");
}

} // namespace
