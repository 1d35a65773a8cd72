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

#endif
