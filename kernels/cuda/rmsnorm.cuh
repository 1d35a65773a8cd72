// kernels/cuda/rmsnorm.cuh: RMSNorm, one block per row.
#ifndef DSERVE_KRN_CUDA_RMSNORM_CUH
#define DSERVE_KRN_CUDA_RMSNORM_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
void krn_cuda_rmsnorm(krn_ctx *c, float *out, const float *x, const float *w, int n, int d, float eps);

#endif
