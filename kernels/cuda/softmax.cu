// kernels/cuda/softmax.cu: softmax in place on each row, one block per row.
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax.cuh"

__device__ __forceinline__ float krn_cu_block_reduce(float v, float *part, int is_max) {
  v = is_max ? krn_cu_warp_max(v) : krn_cu_warp_sum(v);
  __syncthreads(); // part may still be read by the previous reduction
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float u = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : (is_max ? -INFINITY : 0.0f);
    u = is_max ? krn_cu_warp_max(u) : krn_cu_warp_sum(u);
    if (threadIdx.x == 0) part[0] = u;
  }
  __syncthreads();
  return part[0];
}

__global__ void krn_cu_softmax(float *x, int d) {
  __shared__ float part[32];
  float *r = x + (size_t)blockIdx.x * d;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < d; i += blockDim.x) mx = fmaxf(mx, r[i]);
  mx = krn_cu_block_reduce(mx, part, 1);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float e = expf(r[i] - mx);
    r[i] = e;
    sum += e;
  }
  sum = krn_cu_block_reduce(sum, part, 0);
  const float inv = 1.0f / sum;
  for (int i = threadIdx.x; i < d; i += blockDim.x) r[i] *= inv;
}

void krn_cuda_softmax(krn_ctx *c, float *x, int n, int d) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0 || d <= 0) return;
  int threads = d >= 1024 ? 1024 : ((d + 31) / 32) * 32;
  krn_cu_softmax<<<n, threads, 0, s->stream>>>(x, d);
  krn_cuda_check(s, "softmax");
}
