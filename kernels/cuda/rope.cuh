// kernels/cuda/rope.cuh: rotary position embedding in place (pairs (2i, 2i+1) or NeoX (i, i + d/2)).
#ifndef DSERVE_KRN_CUDA_ROPE_CUH
#define DSERVE_KRN_CUDA_ROPE_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
void krn_cuda_rope(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta, int neox);
// Pair i turns by pos * inv_freq[i] (inv_freq: head_dim / 2, device memory) and is scaled by mscale: the scaled RoPE
// of models/llama.h (mdl_rope_freqs), as krn_scalar_rope_freqs.
void krn_cuda_rope_freqs(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim,
                         const float *inv_freq, float mscale, int neox);

#endif
