// kernels/cuda/add.cuh: y += x, and x *= s.
#ifndef DSERVE_KRN_CUDA_ADD_CUH
#define DSERVE_KRN_CUDA_ADD_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
void krn_cuda_add(krn_ctx *c, float *y, const float *x, int64_t n);
void krn_cuda_scale(krn_ctx *c, float *x, float s, int64_t n);

#endif
