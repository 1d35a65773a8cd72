// kernels/cuda/moe.cuh: a mixture-of-experts layer's combine: each token's experts' outputs, weighted, into its row.
#ifndef DSERVE_KRN_CUDA_MOE_CUH
#define DSERVE_KRN_CUDA_MOE_CUH

#include "kernels/krn.h"

// krn_backend.moe_combine: y(n, d) += sum_j w[i k_used + j] * x[rows[i k_used + j]], j in order; device memory,
// enqueued on the ctx stream.
void krn_cuda_moe_combine(krn_ctx *c, float *y, const float *x, const int32_t *rows, const float *w, int n, int k_used,
                          int d);

#endif
