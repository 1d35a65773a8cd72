// kernels/cuda/rmsnorm.cu: RMSNorm, one block per row with warp reductions.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rmsnorm.cuh"

// out(n, d) = x / sqrt(mean(x^2) + eps) * w(d); out may equal x (each element is read before it is written).
__global__ void krn_cu_rmsnorm(float *out, const float *x, const float *w, int d, float eps) {
  __shared__ float part[32];
  const float *xr = x + (size_t)blockIdx.x * d;
  float *orow = out + (size_t)blockIdx.x * d;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = krn_cu_warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    v = krn_cu_warp_sum(v);
    if (threadIdx.x == 0) part[0] = 1.0f / sqrtf(v / (float)d + eps);
  }
  __syncthreads();
  const float scale = part[0];
  for (int i = threadIdx.x; i < d; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
}

void krn_cuda_rmsnorm(krn_ctx *c, float *out, const float *x, const float *w, int n, int d, float eps) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0 || d <= 0) return;
  int threads = d >= 1024 ? 1024 : ((d + 31) / 32) * 32;
  krn_cu_rmsnorm<<<n, threads, 0, s->stream>>>(out, x, w, d, eps);
  krn_cuda_check(s, "rmsnorm");
}
