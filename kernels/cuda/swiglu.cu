// kernels/cuda/swiglu.cu: the gated activations, element-wise: out = silu(gate) * up, out = gelu(gate) * up.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/swiglu.cuh"

__global__ void krn_cu_swiglu(float *out, const float *gate, const float *up, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

void krn_cuda_swiglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0) return;
  krn_cu_swiglu<<<krn_cuda_blocks(n, 256), 256, 0, s->stream>>>(out, gate, up, n);
  krn_cuda_check(s, "swiglu");
}

__global__ void krn_cu_geglu(float *out, const float *gate, const float *up, int64_t n) {
  const float k = 0.7978845608028654f; // sqrt(2 / pi)
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float g = gate[i];
    out[i] = 0.5f * g * (1.0f + tanhf(k * g * (1.0f + 0.044715f * g * g))) * up[i];
  }
}

void krn_cuda_geglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0) return;
  krn_cu_geglu<<<krn_cuda_blocks(n, 256), 256, 0, s->stream>>>(out, gate, up, n);
  krn_cuda_check(s, "geglu");
}
