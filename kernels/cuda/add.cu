// kernels/cuda/add.cu: y += x and x *= s, element-wise.
#include "kernels/cuda/add.cuh"
#include "kernels/cuda/common.cuh"

__global__ void krn_cu_add(float *y, const float *x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] += x[i];
}

void krn_cuda_add(krn_ctx *c, float *y, const float *x, int64_t n) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0) return;
  krn_cu_add<<<krn_cuda_blocks(n, 256), 256, 0, s->stream>>>(y, x, n);
  krn_cuda_check(s, "add");
}

__global__ void krn_cu_scale(float *x, float f, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    x[i] *= f;
}

void krn_cuda_scale(krn_ctx *c, float *x, float f, int64_t n) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0) return;
  krn_cu_scale<<<krn_cuda_blocks(n, 256), 256, 0, s->stream>>>(x, f, n);
  krn_cuda_check(s, "scale");
}
