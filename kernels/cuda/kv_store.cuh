// kernels/cuda/kv_store.cuh: writes each row's K and V into its (seq, pos) slot of the paged caches.
#ifndef DSERVE_KRN_CUDA_KV_STORE_CUH
#define DSERVE_KRN_CUDA_KV_STORE_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
void krn_cuda_kv_store(krn_ctx *c, const float *k, const float *v, const krn_attn_args *a);
// Validates the shape fields of a; 0 ok, -1 failed (recorded on the ctx). Shared by the attention ops.
int krn_cuda_attn_check(krn_ctx *c, const krn_attn_args *a, const char *what);

#endif
