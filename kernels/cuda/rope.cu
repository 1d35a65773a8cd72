// kernels/cuda/rope.cu: rotary position embedding in place, one thread per rotated pair.
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.cuh"

// x(n, n_head, head_dim); pair i of a head rotates by pos * theta^(-2i / head_dim).
// neox = 0: pairs (2i, 2i + 1); neox = 1: pairs (i, i + head_dim / 2).
__global__ void krn_cu_rope(float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta, int neox) {
  const int half = head_dim / 2;
  const int64_t total = (int64_t)n * n_head * half;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int i = (int)(t % half);
    const int64_t hrow = t / half; // row * n_head + head
    const int row = (int)(hrow / n_head);
    float *h = x + hrow * head_dim;
    const float freq = powf(theta, -2.0f * (float)i / (float)head_dim);
    const float ang = (float)pos[row] * freq;
    float sn, cs;
    sincosf(ang, &sn, &cs);
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = h[a], x1 = h[b];
    h[a] = x0 * cs - x1 * sn;
    h[b] = x0 * sn + x1 * cs;
  }
}

void krn_cuda_rope(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta, int neox) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0 || n_head <= 0 || head_dim < 2) return;
  if (head_dim % 2) {
    krn_cuda_fail(s, "rope", "head_dim must be even");
    return;
  }
  krn_cu_rope<<<krn_cuda_blocks((int64_t)n * n_head * (head_dim / 2), 256), 256, 0, s->stream>>>(
      x, pos, n, n_head, head_dim, theta, neox);
  krn_cuda_check(s, "rope");
}

__global__ void krn_cu_rope_freqs(float *x, const int32_t *pos, int n, int n_head, int head_dim,
                                  const float *inv_freq, float mscale, int neox) {
  const int half = head_dim / 2;
  const int64_t total = (int64_t)n * n_head * half;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int i = (int)(t % half);
    const int64_t hrow = t / half; // row * n_head + head
    const int row = (int)(hrow / n_head);
    float *h = x + hrow * head_dim;
    const float ang = (float)pos[row] * inv_freq[i];
    const float cs = cosf(ang) * mscale, sn = sinf(ang) * mscale;
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = h[a], x1 = h[b];
    h[a] = x0 * cs - x1 * sn;
    h[b] = x0 * sn + x1 * cs;
  }
}

void krn_cuda_rope_freqs(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim,
                         const float *inv_freq, float mscale, int neox) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0 || n_head <= 0 || head_dim < 2) return;
  if (head_dim % 2 || !inv_freq) {
    krn_cuda_fail(s, "rope_freqs", head_dim % 2 ? "head_dim must be even" : "no frequencies");
    return;
  }
  krn_cu_rope_freqs<<<krn_cuda_blocks((int64_t)n * n_head * (head_dim / 2), 256), 256, 0, s->stream>>>(
      x, pos, n, n_head, head_dim, inv_freq, mscale, neox);
  krn_cuda_check(s, "rope_freqs");
}
