// kernels/cuda/rope.cu: rotary position embedding in place, one thread per rotated pair (plain or scaled frequencies).
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.cuh"

// x(n, n_head, head_dim); pair i of a head rotates by pos * theta^(-2i / head_dim), or with inv_freq by
// pos * inv_freq[i], the rotated values scaled by mscale. neox = 0: pairs (2i, 2i + 1); neox = 1: (i, i + head_dim / 2).
__global__ void krn_cu_rope(float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta,
                            const float *inv_freq, float mscale, int neox) {
  const int half = head_dim / 2;
  const int64_t total = (int64_t)n * n_head * half;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int i = (int)(t % half);
    const int64_t hrow = t / half; // row * n_head + head
    const int row = (int)(hrow / n_head);
    float *h = x + hrow * head_dim;
    float sn, cs;
    if (inv_freq) {
      const float ang = (float)pos[row] * inv_freq[i];
      cs = cosf(ang) * mscale;
      sn = sinf(ang) * mscale;
    } else {
      sincosf((float)pos[row] * powf(theta, -2.0f * (float)i / (float)head_dim), &sn, &cs);
    }
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = h[a], x1 = h[b];
    h[a] = x0 * cs - x1 * sn;
    h[b] = x0 * sn + x1 * cs;
  }
}

static void rope_launch(krn_ctx *c, const char *what, float *x, const int32_t *pos, int n, int n_head, int head_dim,
                        float theta, const float *inv_freq, float mscale, int neox) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0 || n_head <= 0 || head_dim < 2) return;
  if (head_dim % 2) {
    krn_cuda_fail(s, what, "head_dim must be even");
    return;
  }
  krn_cu_rope<<<krn_cuda_blocks((int64_t)n * n_head * (head_dim / 2), 256), 256, 0, s->stream>>>(
      x, pos, n, n_head, head_dim, theta, inv_freq, mscale, neox);
  krn_cuda_check(s, what);
}

void krn_cuda_rope(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta, int neox) {
  rope_launch(c, "rope", x, pos, n, n_head, head_dim, theta, NULL, 1.0f, neox);
}

void krn_cuda_rope_freqs(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim,
                         const float *inv_freq, float mscale, int neox) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (s && !inv_freq) {
    krn_cuda_fail(s, "rope_freqs", "no frequencies");
    return;
  }
  rope_launch(c, "rope_freqs", x, pos, n, n_head, head_dim, 0.0f, inv_freq, mscale, neox);
}
