// kernels/cuda/get_rows.cuh: out(n, k) = rows ids(n) of w, dequantized (embedding lookup).
#ifndef DSERVE_KRN_CUDA_GET_ROWS_CUH
#define DSERVE_KRN_CUDA_GET_ROWS_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
void krn_cuda_get_rows(krn_ctx *c, float *out, const void *w, krn_type wt, const int32_t *ids, int n, int k);

#endif
