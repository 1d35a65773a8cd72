// tests/cuda/cuda_util.h: helpers the cuda tests share: a cuda ctx fixture, device buffers, random inputs, comparisons.
#ifndef DSERVE_TESTS_CUDA_UTIL_H
#define DSERVE_TESTS_CUDA_UTIL_H

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/krn.h"

// Skips the test, with the reason, when there is no device to run on.
#define CUDA_REQUIRE_DEVICE()                                                       \
  do {                                                                              \
    if (krn_cuda() == nullptr) GTEST_SKIP() << "built without the CUDA toolkit";    \
    if (krn_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";            \
  } while (0)

// A cuda ctx on device 0 and a cpu scalar ctx, set up for each test.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CUDA_REQUIRE_DEVICE();
    gpu.be = krn_cuda();
    char err[256] = "";
    ASSERT_EQ(gpu.be->ctx_init(&gpu, 0, err, sizeof err), 0) << err;
    inited = true;
    cpu.be = krn_cpu_scalar();
    ASSERT_NE(cpu.be, nullptr);
  }
  void TearDown() override {
    for (void *p : bufs) gpu.be->free(&gpu, p);
    if (inited) gpu.be->ctx_fini(&gpu);
  }
  // A device copy of host bytes (freed at the end of the test).
  void *dev(const void *host, size_t bytes) {
    void *p = gpu.be->alloc(&gpu, bytes);
    EXPECT_NE(p, nullptr);
    if (p && bytes) gpu.be->upload(&gpu, p, host, bytes);
    bufs.push_back(p);
    return p;
  }
  template <typename T> T *dev(const std::vector<T> &v) { return (T *)dev(v.data(), v.size() * sizeof(T)); }
  template <typename T> T *dev_zero(size_t n) {
    std::vector<T> z(n);
    return dev(z);
  }
  template <typename T> std::vector<T> down(const T *d, size_t n) {
    std::vector<T> h(n);
    gpu.be->download(&gpu, h.data(), d, n * sizeof(T));
    return h;
  }

  krn_ctx gpu{}, cpu{};
  bool inited = false;
  std::vector<void *> bufs;
  std::mt19937 rng{1234};
};

inline std::vector<float> rand_floats(std::mt19937 &rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = u(rng);
  return v;
}

// Random weight bytes of m rows of k elements of type t (scales kept small so that sums stay O(1)).
inline std::vector<uint8_t> rand_weights(std::mt19937 &rng, krn_type t, int m, int k) {
  const size_t rb = krn_row_size(t, k);
  std::vector<uint8_t> w(rb * m);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), sc(0.005f, 0.05f);
  for (int r = 0; r < m; r++) {
    uint8_t *row = w.data() + rb * r;
    if (t == KRN_F32) {
      for (int j = 0; j < k; j++) {
        float f = u(rng);
        memcpy(row + 4 * j, &f, 4);
      }
    } else if (t == KRN_F16) {
      for (int j = 0; j < k; j++) {
        krn_f16 h = krn_f32_to_f16(u(rng));
        memcpy(row + 2 * j, &h, 2);
      }
    } else if (t == KRN_BF16) {
      for (int j = 0; j < k; j++) {
        krn_bf16 h = krn_f32_to_bf16(u(rng));
        memcpy(row + 2 * j, &h, 2);
      }
    } else {
      for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)byte(rng);
      const int nblk = k / krn_type_block(t);
      const size_t bb = rb / nblk;
      // where the f16 scale (and the min or offset) sit in a block; K-quants' sub-block scales are bytes
      const size_t d_at = t == KRN_Q6_K ? 208 : 0;
      const bool has_m = t == KRN_Q4_1 || t == KRN_Q5_1 || t == KRN_Q4_K || t == KRN_Q5_K;
      // K-quant super-block scales multiply 6- or 8-bit sub-block scales: divide so that weights stay O(0.1 - 1)
      const float kdiv = t == KRN_Q6_K ? 64.0f : t == KRN_Q4_K || t == KRN_Q5_K ? 40.0f : 1.0f;
      for (int b = 0; b < nblk; b++) { // valid scales (random bytes could be inf/nan)
        krn_f16 d = krn_f32_to_f16(sc(rng) / kdiv), mm = krn_f32_to_f16(kdiv > 1 ? sc(rng) / kdiv : u(rng) * 0.1f);
        memcpy(row + bb * b + d_at, &d, 2);
        if (has_m) memcpy(row + bb * b + 2, &mm, 2);
      }
    }
  }
  return w;
}

// Max |a - b| over max(1, max |b|): a relative error that does not blow up near zero.
inline double rel_err(const std::vector<float> &a, const std::vector<float> &b) {
  double md = 0, mb = 1e-30;
  for (size_t i = 0; i < b.size(); i++) {
    md = std::max(md, (double)std::fabs(a[i] - b[i]));
    mb = std::max(mb, (double)std::fabs(b[i]));
  }
  return md / std::max(1.0, mb) + (std::any_of(a.begin(), a.end(), [](float x) { return !std::isfinite(x); }) ? 1e9 : 0);
}

// ---- the matmul's error bound against the scalar reference ----
// The scalar backend's matmul is the exact product of the dequantized weight (f32, bit for bit what the cuda
// dequantizers give: GetRowsMatchesReference) with the f32 activation, summed in f32. The cuda matmul differs from
// it only by (a) the order of its f32 sums and (b) on its GEMM path (n > 8 rows; kernels/cuda/matmul.cu) rounding x
// and, for non-F32 types, the dequantized weight to f16 before an f32-accumulating cuBLAS GEMM. So for each output
// y[r][j] = sum_i w[j][i] x[r][i], with S = sum_i |w[j][i] x[r][i]| (computed in double from the dequantized rows):
//   |cuda - ref| <= (eps_x + eps_w + eps_x eps_w + 2 gamma_k) S + 2^-24 sum_i (|x[r][i]| + |w[j][i]|)
// where gamma_k = k u / (1 - k u), u = 2^-24, bounds either side's f32 summation (any order, products included;
// 2u per operation on the GEMM path, whose tensor cores may truncate rather than round their f32 sums);
// eps_x = 2^-11 (half an f16 ulp, relative) on the GEMM path for non-F32 weights, else 0; eps_w is what rounding
// the weight type's dequantized values to f16 costs (krn_f16_round_eps); the last term covers values that land in
// f16's subnormal range, where the rounding error is absolute (<= 2^-25) instead of relative.
// eps_w per type, from its quantization step: a value of a 32- or 256-element type is d * q (+ m or - dmin * m):
// d, the block's quantization step, is an f16 (11 significant bits) and q a 4- to 8-bit integer (times a 6- or
// 8-bit sub-block scale in K-quants), so the value needs up to 19-25 significant bits and its f16 rounding errs by
// up to 2^-11 of it. F16 weights are f16 already (0); BF16's 8 significant bits fit f16's 11 (0, for values in f16's
// normal range, which rand_weights' are; the absolute term covers the rest); F32 stays f32 (cublasSgemm: 0).
inline double krn_f16_round_eps(krn_type t) {
  return t == KRN_F32 || t == KRN_F16 || t == KRN_BF16 ? 0.0 : std::ldexp(1.0, -11);
}

// Per-output tolerances (n, m) for y = x(n, k) . w(m, k)^T of type t on the cuda backend, by the bound above;
// wdeq is w dequantized (m, k) by the scalar backend.
inline std::vector<double> matmul_tolerances(const std::vector<float> &wdeq, krn_type t, const float *x, int n, int k,
                                             int m) {
  const bool gemm = n > 8 && t != KRN_F32;
  // Tensor cores' f32 accumulation may truncate instead of rounding to nearest: up to 2u per addition there.
  const double u = std::ldexp(1.0, -24), ua = n > 8 ? 2 * u : u, gamma = k * ua / (1 - k * ua);
  const double ex = gemm ? std::ldexp(1.0, -11) : 0.0, ew = gemm ? krn_f16_round_eps(t) : 0.0;
  std::vector<double> tol((size_t)n * m);
  for (int r = 0; r < n; r++)
    for (int j = 0; j < m; j++) {
      double S = 0, A = 0;
      for (int i = 0; i < k; i++) {
        const double a = std::fabs((double)wdeq[(size_t)j * k + i]), b = std::fabs((double)x[(size_t)r * k + i]);
        S += a * b;
        A += a + b;
      }
      tol[(size_t)r * m + j] = (ex + ew + ex * ew + 2 * gamma) * S + u * A;
    }
  return tol;
}

// What the cuda GEMM path computes (n > 8), on the host: x and (for non-F32 types) the dequantized weight
// wdeq(m, k) rounded to f16, products summed in f32; F32 weights stay f32 throughout (cublasSgemm).
inline void emulate_gemm_f16(float *y, const float *wdeq, krn_type t, const float *x, int n, int k, int m) {
  auto r16 = [](float v) { return krn_f16_to_f32(krn_f32_to_f16(v)); };
  const bool round = t != KRN_F32;
  std::vector<float> xr((size_t)n * k), wr((size_t)m * k);
  for (size_t i = 0; i < xr.size(); i++) xr[i] = round ? r16(x[i]) : x[i];
  for (size_t i = 0; i < wr.size(); i++) wr[i] = round ? r16(wdeq[i]) : wdeq[i];
  for (int r = 0; r < n; r++)
    for (int j = 0; j < m; j++) {
      float acc = 0;
      for (int i = 0; i < k; i++) acc += xr[(size_t)r * k + i] * wr[(size_t)j * k + i];
      y[(size_t)r * m + j] = acc;
    }
}

// The largest |got - ref| / tol over all outputs (> 1: outside the bound; a non-finite value counts as 1e9).
inline double worst_ratio(const std::vector<float> &got, const std::vector<float> &ref, const std::vector<double> &tol) {
  double w = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    if (!std::isfinite(got[i])) return 1e9;
    w = std::max(w, std::fabs((double)got[i] - ref[i]) / std::max(tol[i], 1e-30));
  }
  return w;
}

#endif
