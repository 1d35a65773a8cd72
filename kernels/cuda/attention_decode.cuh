// kernels/cuda/attention_decode.cuh: paged attention for few rows: split the context over CTAs (flash-decoding), one CTA per kv head group, then a combine pass.
#ifndef DSERVE_KRN_CUDA_ATTENTION_DECODE_CUH
#define DSERVE_KRN_CUDA_ATTENTION_DECODE_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
// Returns -1 without enqueueing anything when the shape is not one it handles (head_dim % 8 or > 256).
int krn_cuda_attn_decode(krn_ctx *c, float *out, const float *q, const krn_attn_args *a);
// The backend's paged_attention: picks the decode kernel for few rows, the prefill kernel otherwise.
void krn_cuda_paged_attention(krn_ctx *c, float *out, const float *q, const krn_attn_args *a);

#endif
