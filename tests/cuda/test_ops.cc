// tests/cuda/test_ops.cc: each cuda op against the cpu scalar reference on random inputs of awkward sizes.
#include "tests/cuda/cuda_util.h"

extern "C" {
#include "models/llama.h"
}

#include <algorithm>

TEST(CudaBackend, InitRefusesMissingDevice) {
  // Runs without a GPU too: the table exists when built with CUDA and ctx_init names the missing device.
  if (krn_cuda() == nullptr) GTEST_SKIP() << "built without the CUDA toolkit";
  const krn_backend *be = krn_cuda();
  EXPECT_STREQ(be->name, "cuda");
  krn_ctx c{};
  c.be = be;
  char err[256] = "";
  const int n = krn_cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_LT(be->ctx_init(&c, n, err, sizeof err), 0);
  EXPECT_NE(strstr(err, "does not exist"), nullptr) << err;
  EXPECT_EQ(c.dev, nullptr);
  EXPECT_LT(be->ctx_init(&c, -1, err, sizeof err), 0);
  be->ctx_fini(&c); // no-op on a ctx that was never set up
  be->ctx_fini(nullptr);
}

TEST_F(CudaTest, AllocUploadDownload) {
  std::vector<float> h = rand_floats(rng, 1000);
  float *d = dev(h);
  EXPECT_EQ(down(d, h.size()), h);
  gpu.be->free(&gpu, nullptr); // no-op
}

struct MatCase { krn_type t; int n, k, m; };

TEST_F(CudaTest, MatmulMatchesReference) {
  std::vector<MatCase> cases;
  for (krn_type t : {KRN_F32, KRN_F16, KRN_BF16, KRN_Q4_0, KRN_Q4_1, KRN_Q5_0, KRN_Q5_1, KRN_Q8_0})
    for (int n : {1, 3, 8, 9, 40})
      for (int k : {32, 96, 576})
        for (int m : {1, 7, 65}) cases.push_back({t, n, k, m});
  for (krn_type t : {KRN_Q4_K, KRN_Q5_K, KRN_Q6_K}) // super-blocks of 256
    for (int n : {1, 3, 8, 9, 40})
      for (int k : {256, 768})
        for (int m : {1, 7, 65}) cases.push_back({t, n, k, m});
  for (int n : {2, 17}) cases.push_back({KRN_BF16, n, 33, 5}); // k not a multiple of 32: the generic GEMV
  for (krn_type t : {KRN_F32, KRN_F16}) // k not a multiple of 32: the generic GEMV and cuBLAS on raw rows
    for (int n : {2, 17}) cases.push_back({t, n, 33, 5}), cases.push_back({t, n, 100, 3});
  for (const MatCase &mc : cases) {
    SCOPED_TRACE(testing::Message() << krn_type_name(mc.t) << " n=" << mc.n << " k=" << mc.k << " m=" << mc.m);
    std::vector<uint8_t> w = rand_weights(rng, mc.t, mc.m, mc.k);
    std::vector<float> x = rand_floats(rng, (size_t)mc.n * mc.k);
    std::vector<float> ref((size_t)mc.n * mc.m);
    cpu.be->matmul(&cpu, ref.data(), w.data(), mc.t, x.data(), mc.n, mc.k, mc.m);
    float *dy = dev_zero<float>(ref.size());
    gpu.be->matmul(&gpu, dy, dev(w.data(), w.size()), mc.t, dev(x), mc.n, mc.k, mc.m);
    std::vector<float> got = down(dy, ref.size());
    // Each output within the bound derived in cuda_util.h (f32 summation order; on the GEMM path, x and the
    // weight type's dequantized values rounded to f16).
    std::vector<float> wdeq((size_t)mc.m * mc.k);
    std::vector<int32_t> ids(mc.m);
    for (int j = 0; j < mc.m; j++) ids[j] = j;
    cpu.be->get_rows(&cpu, wdeq.data(), w.data(), mc.t, ids.data(), mc.m, mc.k);
    EXPECT_LE(worst_ratio(got, ref, matmul_tolerances(wdeq, mc.t, x.data(), mc.n, mc.k, mc.m)), 1.0);
  }
}

// The bound itself, where there is no GPU: it holds for host emulations of what it claims to cover (the GEMV's f32
// sums in another order; the GEMM path's f16 rounding) on every type, and it does not pass errors of a
// few quantization steps d (d: the smallest gap between a sub-block's values): on the GEMV path (n <= 8) one weight
// off by d (4 d for the 6- and 8-bit types), on the GEMM path one sub-block off by 2 d (8 d) (a wrong offset, or
// every q off by one or two); on both, one block dropped. (One step in a single weight is below what an f16 GEMM
// resolves over k = 512: that is the size of its own rounding.)
TEST(MatmulBound, CoversRoundingAndCatchesErrors) {
  std::mt19937 rng{99};
  krn_ctx cpu{};
  cpu.be = krn_cpu_scalar();
  for (krn_type t : {KRN_F32, KRN_F16, KRN_BF16, KRN_Q4_0, KRN_Q4_1, KRN_Q5_0, KRN_Q5_1, KRN_Q8_0, KRN_Q4_K, KRN_Q5_K,
                     KRN_Q6_K}) {
    for (int n : {4, 17}) {
      SCOPED_TRACE(testing::Message() << krn_type_name(t) << " n=" << n);
      const int k = 512, m = 24;
      const bool gemm = n > 8;
      // Q6_K and Q8_0 have 64 and 256 levels: their step is finer than the f32 summation bound at k = 512, so
      // the error planted in them is 4 steps; on the GEMM path, whose f16 rounding is of the size of a 5-bit
      // type's step over a sub-block, twice that
      const bool fine = t == KRN_Q6_K || t == KRN_Q8_0;
      std::vector<uint8_t> w = rand_weights(rng, t, m, k);
      std::vector<float> x = rand_floats(rng, (size_t)n * k), ref((size_t)n * m), emu(ref.size());
      cpu.be->matmul(&cpu, ref.data(), w.data(), t, x.data(), n, k, m);
      std::vector<float> wdeq((size_t)m * k);
      std::vector<int32_t> ids(m);
      for (int j = 0; j < m; j++) ids[j] = j;
      cpu.be->get_rows(&cpu, wdeq.data(), w.data(), t, ids.data(), m, k);
      const std::vector<double> tol = matmul_tolerances(wdeq, t, x.data(), n, k, m);
      emulate_gemm_f16(emu.data(), wdeq.data(), gemm ? t : KRN_F32, x.data(), n, k, m);
      EXPECT_LE(worst_ratio(emu, ref, tol), 1.0);
      if (gemm && t != KRN_F32) {
        EXPECT_NE(emu, ref) << "the emulation rounded nothing";
      }
      std::vector<float> got(ref.size());
      if (krn_type_block(t) > 1) { // quantized: d from row 0's values at 64.. (one sub-block: 16 of Q6_K, else 32)
        const int sub = t == KRN_Q6_K ? 16 : 32;
        std::vector<float> v(wdeq.begin() + 64, wdeq.begin() + 64 + sub);
        std::sort(v.begin(), v.end());
        float d = INFINITY;
        for (int i = 1; i < sub; i++)
          if (v[i] > v[i - 1]) d = std::min(d, v[i] - v[i - 1]);
        ASSERT_TRUE(std::isfinite(d));
        const int steps = (fine ? 4 : 1) * (gemm ? 2 : 1);
        d *= steps;
        std::vector<float> bad = wdeq;
        for (int i = 64; i < (gemm ? 64 + sub : 65); i++) bad[i] += d;
        emulate_gemm_f16(got.data(), bad.data(), KRN_F32, x.data(), n, k, m);
        EXPECT_GT(worst_ratio(got, ref, tol), 1.0) << (gemm ? "a block" : "a weight") << " off by " << steps
                                                    << " step(s) passed";
      }
      std::vector<float> drop = wdeq;
      for (int i = 0; i < 32; i++) drop[(size_t)5 * k + 64 + i] = 0;
      emulate_gemm_f16(got.data(), drop.data(), KRN_F32, x.data(), n, k, m);
      EXPECT_GT(worst_ratio(got, ref, tol), 1.0) << "a dropped block passed";
    }
  }
}

TEST_F(CudaTest, MatmulUnalignedInput) {
  // x one float past an aligned start: the fast GEMV needs 16-byte alignment, the generic one takes this.
  const int n = 2, k = 64, m = 9;
  std::vector<uint8_t> w = rand_weights(rng, KRN_Q4_1, m, k);
  std::vector<float> x = rand_floats(rng, (size_t)n * k + 1);
  std::vector<float> ref((size_t)n * m);
  cpu.be->matmul(&cpu, ref.data(), w.data(), KRN_Q4_1, x.data() + 1, n, k, m);
  float *dy = dev_zero<float>(ref.size());
  gpu.be->matmul(&gpu, dy, dev(w.data(), w.size()), KRN_Q4_1, dev(x) + 1, n, k, m);
  std::vector<float> wdeq((size_t)m * k);
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  cpu.be->get_rows(&cpu, wdeq.data(), w.data(), KRN_Q4_1, ids.data(), m, k);
  EXPECT_LE(worst_ratio(down(dy, ref.size()), ref, matmul_tolerances(wdeq, KRN_Q4_1, x.data() + 1, n, k, m)), 1.0);
}

TEST_F(CudaTest, GetRowsMatchesReference) {
  for (krn_type t : {KRN_F32, KRN_F16, KRN_BF16, KRN_Q4_0, KRN_Q4_1, KRN_Q5_0, KRN_Q5_1, KRN_Q8_0, KRN_Q4_K, KRN_Q5_K,
                     KRN_Q6_K}) {
    for (int k : {64, 33, 512}) {
      if (k % krn_type_block(t)) continue;
      SCOPED_TRACE(testing::Message() << krn_type_name(t) << " k=" << k);
      const int rows = 50, n = 13;
      std::vector<uint8_t> w = rand_weights(rng, t, rows, k);
      std::vector<int32_t> ids(n);
      for (auto &i : ids) i = (int32_t)(rng() % rows);
      ids[1] = ids[0]; // repeats
      ids[2] = rows - 1;
      std::vector<float> ref((size_t)n * k);
      cpu.be->get_rows(&cpu, ref.data(), w.data(), t, ids.data(), n, k);
      float *d = dev_zero<float>(ref.size());
      gpu.be->get_rows(&gpu, d, dev(w.data(), w.size()), t, dev(ids), n, k);
      EXPECT_EQ(rel_err(down(d, ref.size()), ref), 0.0) << "dequantization is exact";
    }
  }
}

TEST_F(CudaTest, RmsnormMatchesReference) {
  for (int d : {1, 37, 576, 2049}) {
    SCOPED_TRACE(d);
    const int n = 5;
    std::vector<float> x = rand_floats(rng, (size_t)n * d, -3, 3), w = rand_floats(rng, d);
    std::vector<float> ref(x.size());
    cpu.be->rmsnorm(&cpu, ref.data(), x.data(), w.data(), n, d, 1e-5f);
    float *dx = dev(x), *dw = dev(w), *dout = dev_zero<float>(x.size());
    gpu.be->rmsnorm(&gpu, dout, dx, dw, n, d, 1e-5f);
    EXPECT_LT(rel_err(down(dout, x.size()), ref), 1e-5);
    gpu.be->rmsnorm(&gpu, dx, dx, dw, n, d, 1e-5f); // in place
    EXPECT_LT(rel_err(down(dx, x.size()), ref), 1e-5);
  }
}

TEST_F(CudaTest, RopeMatchesReference) {
  for (int neox : {0, 1}) {
    for (int hd : {64, 6, 128}) {
      SCOPED_TRACE(testing::Message() << "neox=" << neox << " head_dim=" << hd);
      const int n = 7, nh = 3;
      std::vector<float> x = rand_floats(rng, (size_t)n * nh * hd);
      std::vector<int32_t> pos = {0, 1, 2, 15, 16, 1000, 4095};
      std::vector<float> ref = x;
      cpu.be->rope(&cpu, ref.data(), pos.data(), n, nh, hd, 10000.0f, neox);
      float *dx = dev(x);
      gpu.be->rope(&gpu, dx, dev(pos), n, nh, hd, 10000.0f, neox);
      // Angles up to 4095 rad: a 1-ulp difference in powf/sincosf moves the result by ~1e-3 at most.
      EXPECT_LT(rel_err(down(dx, x.size()), ref), 2e-3);
      EXPECT_NE(rel_err(x, ref), 0.0); // the rotation did something
    }
  }
}

TEST_F(CudaTest, RopeFreqsMatchesReference) {
  ASSERT_NE(gpu.be->rope_freqs, nullptr);
  for (int neox : {0, 1}) {
    SCOPED_TRACE(neox);
    const int n = 6, nh = 2, hd = 64;
    mdl_rope_scaling sc{};
    sc.type = MDL_ROPE_YARN;
    sc.factor = 4;
    sc.attn_factor = 1;
    sc.n_ctx_orig = 2048;
    sc.beta_fast = 32;
    sc.beta_slow = 1;
    std::vector<float> inv(hd / 2);
    float mscale = 0;
    mdl_rope_freqs(&sc, hd, 10000.0f, inv.data(), &mscale);
    std::vector<float> x = rand_floats(rng, (size_t)n * nh * hd), ref = x;
    std::vector<int32_t> pos = {0, 1, 17, 1000, 4095, 8000};
    cpu.be->rope_freqs(&cpu, ref.data(), pos.data(), n, nh, hd, inv.data(), mscale, neox);
    float *dx = dev(x);
    gpu.be->rope_freqs(&gpu, dx, dev(pos), n, nh, hd, dev(inv), mscale, neox);
    EXPECT_LT(rel_err(down(dx, x.size()), ref), 2e-3); // angles up to 8000 rad, as RopeMatchesReference
    EXPECT_NE(rel_err(x, ref), 0.0);
  }
}

TEST_F(CudaTest, ElementwiseMatchReference) {
  for (int64_t n : {1, 1000, 100003}) {
    SCOPED_TRACE(n);
    std::vector<float> g = rand_floats(rng, n, -8, 8), u = rand_floats(rng, n, -2, 2);
    std::vector<float> ref(n);
    cpu.be->swiglu(&cpu, ref.data(), g.data(), u.data(), n);
    float *dg = dev(g), *du = dev(u);
    gpu.be->swiglu(&gpu, dg, dg, du, n); // out may equal gate
    EXPECT_LT(rel_err(down(dg, n), ref), 1e-5);

    std::vector<float> gref(n);
    cpu.be->geglu(&cpu, gref.data(), g.data(), u.data(), n);
    float *dg2 = dev(g);
    gpu.be->geglu(&gpu, dg2, dg2, du, n);
    EXPECT_LT(rel_err(down(dg2, n), gref), 1e-5);

    std::vector<float> y = rand_floats(rng, n), x = rand_floats(rng, n), yr = y;
    cpu.be->add(&cpu, yr.data(), x.data(), n);
    float *dy = dev(y);
    gpu.be->add(&gpu, dy, dev(x), n);
    EXPECT_EQ(down(dy, n), yr);

    std::vector<float> sr = x;
    cpu.be->scale(&cpu, sr.data(), 25.3f, n);
    float *dsx = dev(x);
    gpu.be->scale(&gpu, dsx, 25.3f, n);
    EXPECT_EQ(down(dsx, n), sr);
  }
}

// moe_combine (kernels/cuda/moe.cu) is the scalar reference bit for bit: the same products and sums in the same order,
// none fused.
TEST_F(CudaTest, MoeCombineMatchesReference) {
  ASSERT_NE(gpu.be->moe_combine, nullptr);
  for (int d : {1, 37, 1024}) {
    for (int ku : {1, 4, 8}) {
      SCOPED_TRACE(testing::Message() << "d " << d << " k_used " << ku);
      const int n = 19, nx = n * ku;
      std::vector<float> x = rand_floats(rng, (size_t)nx * d), w = rand_floats(rng, (size_t)n * ku, 0, 1);
      std::vector<float> y = rand_floats(rng, (size_t)n * d), ref = y;
      std::vector<int32_t> rows((size_t)n * ku);
      for (size_t i = 0; i < rows.size(); i++) rows[i] = (int32_t)((i * 7 + 3) % (size_t)nx);
      cpu.be->moe_combine(&cpu, ref.data(), x.data(), rows.data(), w.data(), n, ku, d);
      float *dy = dev(y);
      gpu.be->moe_combine(&gpu, dy, dev(x), dev(rows), dev(w), n, ku, d);
      EXPECT_EQ(down(dy, y.size()), ref);
    }
  }
}

TEST_F(CudaTest, SoftmaxMatchesReference) {
  for (int d : {1, 5, 49152 / 16, 4099}) {
    SCOPED_TRACE(d);
    const int n = 3;
    std::vector<float> x = rand_floats(rng, (size_t)n * d, -20, 20), ref = x;
    cpu.be->softmax(&cpu, ref.data(), n, d);
    float *dx = dev(x);
    gpu.be->softmax(&gpu, dx, n, d);
    EXPECT_LT(rel_err(down(dx, x.size()), ref), 1e-5);
  }
}

TEST_F(CudaTest, RefusesBadArguments) {
  // A quantized matmul with k % 32 != 0 is refused (recorded, nothing written), not run out of bounds.
  std::vector<float> y(4, 7.0f);
  float *dy = dev(y);
  std::vector<uint8_t> w(64);
  std::vector<float> x(40);
  testing::internal::CaptureStderr();
  gpu.be->matmul(&gpu, dy, dev(w.data(), w.size()), KRN_Q4_0, dev(x), 1, 40, 1);
  std::string msg = testing::internal::GetCapturedStderr();
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  EXPECT_EQ(down(dy, 4), y);
}
