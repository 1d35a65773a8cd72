// kernels/cuda/attention_prefill.cuh: paged attention for many rows: query tiles in shared memory, K/V tiles through the block table, online softmax, causal by position.
#ifndef DSERVE_KRN_CUDA_ATTENTION_PREFILL_CUH
#define DSERVE_KRN_CUDA_ATTENTION_PREFILL_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
// Computes the rows of the 32-row tiles krn_cu_attn_tile_is_prefill picks, or every row when all_rows = 1
// (when the decode kernel does not take the shape). head_dim <= 256.
void krn_cuda_attn_prefill(krn_ctx *c, float *out, const float *q, const krn_attn_args *a, int all_rows);

#endif
