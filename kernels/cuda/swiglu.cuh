// kernels/cuda/swiglu.cuh: the gated activations: out = silu(gate) * up, and out = gelu(gate) * up.
#ifndef DSERVE_KRN_CUDA_SWIGLU_CUH
#define DSERVE_KRN_CUDA_SWIGLU_CUH

#include "kernels/krn.h"

// Pointers are device memory; the op is enqueued on the ctx stream and returns without waiting.
void krn_cuda_swiglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n);
// GELU with the tanh approximation, as the scalar reference (krn_scalar_geglu) and llama.cpp's gemma3 graph.
void krn_cuda_geglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n);

#endif
