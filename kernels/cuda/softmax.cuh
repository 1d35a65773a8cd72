// kernels/cuda/softmax.cuh: softmax in place per row, one block per row.
#ifndef DSERVE_KRN_CUDA_SOFTMAX_CUH
#define DSERVE_KRN_CUDA_SOFTMAX_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
void krn_cuda_softmax(krn_ctx *c, float *x, int n, int d);

#endif
