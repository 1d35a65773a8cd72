// kernels/cuda/matmul.cuh: y(n, m) = x(n, k) . w(m, k)^T: fused dequantize GEMV for n <= 8, dequantize to F16 + cuBLAS GEMM above.
#ifndef DSERVE_KRN_CUDA_MATMUL_CUH
#define DSERVE_KRN_CUDA_MATMUL_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
void krn_cuda_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m);

#endif
