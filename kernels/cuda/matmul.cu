// kernels/cuda/matmul.cu: y(n, m) = x(n, k) . w(m, k)^T: fused dequantize GEMV for n <= 8, F16 cuBLAS GEMM above.
#include <stdint.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matmul.cuh"

#define KRN_CU_GEMV_ROWS 8 // largest n the fused GEMV takes; above it, dequantize + cuBLAS
#define KRN_CU_GEMV_WARPS 4
#define KRN_CU_GEMV_RPW 2 // weight rows per warp (x loaded once for both)

// Fused GEMV: each warp owns 2 weight rows; lane l dequantizes blocks l, l + 32, ... of both rows into registers
// and dots them with the same 32 elements of every x row. x(n, k) with n <= 8, k % 32 == 0, x 16-byte aligned.
template <int T>
__global__ void __launch_bounds__(KRN_CU_GEMV_WARPS * 32)
    krn_cu_gemv(float *y, const void *w, size_t row_bytes, const float *x, int n, int k, int m) {
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * KRN_CU_GEMV_WARPS + (threadIdx.x >> 5)) * KRN_CU_GEMV_RPW;
  if (row0 >= m) return;
  const bool has1 = row0 + 1 < m;
  const char *w0 = (const char *)w + (size_t)row0 * row_bytes;
  const char *w1 = has1 ? w0 + row_bytes : w0;
  float acc0[KRN_CU_GEMV_ROWS], acc1[KRN_CU_GEMV_ROWS];
#pragma unroll
  for (int r = 0; r < KRN_CU_GEMV_ROWS; r++) acc0[r] = acc1[r] = 0.0f;
  const int nb = k / 32;
  for (int b = lane; b < nb; b += 32) {
    float a[32], c[32];
    krn_cu_deq_block<T>(w0, b, a);
    krn_cu_deq_block<T>(w1, b, c);
#pragma unroll
    for (int r = 0; r < KRN_CU_GEMV_ROWS; r++) {
      if (r < n) {
        const float4 *xp = (const float4 *)(x + (size_t)r * k + (size_t)b * 32);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
          const float4 v = __ldg(xp + i);
          s0 += a[4 * i] * v.x + a[4 * i + 1] * v.y + a[4 * i + 2] * v.z + a[4 * i + 3] * v.w;
          s1 += c[4 * i] * v.x + c[4 * i + 1] * v.y + c[4 * i + 2] * v.z + c[4 * i + 3] * v.w;
        }
        acc0[r] += s0;
        acc1[r] += s1;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < KRN_CU_GEMV_ROWS; r++) {
    if (r < n) {
      const float s0 = krn_cu_warp_sum(acc0[r]), s1 = krn_cu_warp_sum(acc1[r]);
      if (lane == 0) {
        y[(size_t)r * m + row0] = s0;
        if (has1) y[(size_t)r * m + row0 + 1] = s1;
      }
    }
  }
}

// Generic GEMV for what the fast one does not take (k % 32 != 0 for F32/F16, unaligned pointers):
// one warp per weight row, lanes over elements, n <= 8 rows of x per launch.
__global__ void krn_cu_gemv_any(float *y, const void *w, int wt, size_t row_bytes, const float *x, int n, int k, int m) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * KRN_CU_GEMV_WARPS + (threadIdx.x >> 5);
  if (row >= m) return;
  const char *wr = (const char *)w + (size_t)row * row_bytes;
  float acc[KRN_CU_GEMV_ROWS];
#pragma unroll
  for (int r = 0; r < KRN_CU_GEMV_ROWS; r++) acc[r] = 0.0f;
  for (int j = lane; j < k; j += 32) {
    const float v = krn_cu_deq_elem(wr, wt, j);
#pragma unroll
    for (int r = 0; r < KRN_CU_GEMV_ROWS; r++)
      if (r < n) acc[r] += v * x[(size_t)r * k + j];
  }
#pragma unroll
  for (int r = 0; r < KRN_CU_GEMV_ROWS; r++) {
    if (r < n) {
      const float s = krn_cu_warp_sum(acc[r]);
      if (lane == 0) y[(size_t)r * m + row] = s;
    }
  }
}

// out(rows, k) F16 = w(rows, k) of type wt, dequantized; row_bytes == 0 means w is F32 x (contiguous).
__global__ void krn_cu_to_f16(__half *out, const void *w, int wt, size_t row_bytes, int64_t rows, int k) {
  const int64_t total = rows * k;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = t / k;
    const int j = (int)(t % k);
    out[t] = __float2half_rn(krn_cu_deq_elem((const char *)w + (size_t)r * row_bytes, wt, j));
  }
}

static int aligned(const void *p, uintptr_t a) { return ((uintptr_t)p % a) == 0; }

static void gemv(krn_cuda_state *s, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  const size_t rb = krn_cuda_row_bytes(wt, k);
  // what krn_cu_deq_block<wt> reads with wide loads: uint4 for float rows, uint32 where the block layout
  // allows it (Q4_1, Q5_1, Q4_K, Q5_K), uint16 otherwise
  const int walign = wt == KRN_F32 || wt == KRN_F16 || wt == KRN_BF16                        ? 16
                     : wt == KRN_Q4_1 || wt == KRN_Q5_1 || wt == KRN_Q4_K || wt == KRN_Q5_K ? 4
                                                                                             : 2;
  const int fast = k % 32 == 0 && aligned(x, 16) && aligned(w, walign) && rb % walign == 0;
  if (fast) {
    const unsigned grid = (unsigned)((m + KRN_CU_GEMV_WARPS * KRN_CU_GEMV_RPW - 1) / (KRN_CU_GEMV_WARPS * KRN_CU_GEMV_RPW));
    const int th = KRN_CU_GEMV_WARPS * 32;
    switch (wt) {
    case KRN_F32: krn_cu_gemv<KRN_F32><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_F16: krn_cu_gemv<KRN_F16><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_Q4_0: krn_cu_gemv<KRN_Q4_0><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_Q4_1: krn_cu_gemv<KRN_Q4_1><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_Q8_0: krn_cu_gemv<KRN_Q8_0><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_BF16: krn_cu_gemv<KRN_BF16><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_Q5_0: krn_cu_gemv<KRN_Q5_0><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_Q5_1: krn_cu_gemv<KRN_Q5_1><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_Q4_K: krn_cu_gemv<KRN_Q4_K><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_Q5_K: krn_cu_gemv<KRN_Q5_K><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    case KRN_Q6_K: krn_cu_gemv<KRN_Q6_K><<<grid, th, 0, s->stream>>>(y, w, rb, x, n, k, m); break;
    }
  } else {
    const unsigned grid = (unsigned)((m + KRN_CU_GEMV_WARPS - 1) / KRN_CU_GEMV_WARPS);
    krn_cu_gemv_any<<<grid, KRN_CU_GEMV_WARPS * 32, 0, s->stream>>>(y, w, (int)wt, rb, x, n, k, m);
  }
}

void krn_cuda_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0 || m <= 0) return;
  if (!krn_cuda_type_ok(wt, k) || k <= 0) {
    krn_cuda_fail(s, "matmul", "unknown weight type, or k not a positive multiple of the type's block (32, 256 for K-quants)");
    return;
  }
  if (n <= KRN_CU_GEMV_ROWS) {
    gemv(s, y, w, wt, x, n, k, m);
    krn_cuda_check(s, "matmul gemv");
    return;
  }
  // Prefill: column-major view. C(m, n) = W^T-as-stored(k, m)^T . X-as-stored(k, n); C(m, n) col-major = y(n, m).
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st;
  if (wt == KRN_F32) {
    st = cublasSgemm(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, (const float *)w, k, x, k, &zero, y, m);
  } else {
    const __half *wh = (const __half *)w;
    if (wt != KRN_F16) {
      __half *wd = (__half *)krn_cuda_scratch(s, KRN_CUDA_SCR_W, (size_t)m * k * 2);
      if (!wd) return;
      krn_cu_to_f16<<<krn_cuda_blocks((int64_t)m * k, 256), 256, 0, s->stream>>>(wd, w, (int)wt,
                                                                                krn_cuda_row_bytes(wt, k), m, k);
      wh = wd;
    }
    __half *xh = (__half *)krn_cuda_scratch(s, KRN_CUDA_SCR_X, (size_t)n * k * 2);
    if (!xh) return;
    krn_cu_to_f16<<<krn_cuda_blocks((int64_t)n * k, 256), 256, 0, s->stream>>>(xh, x, KRN_F32, (size_t)k * 4, n, k);
    if (krn_cuda_check(s, "matmul dequantize")) return;
    st = cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, wh, CUDA_R_16F, k, xh, CUDA_R_16F, k, &zero, y,
                      CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  if (st != CUBLAS_STATUS_SUCCESS) krn_cuda_fail(s, "matmul cublas", cublasGetStatusString(st));
  krn_cuda_check(s, "matmul");
}
