// kernels/cuda/moe.cu: a mixture-of-experts layer's combine (krn.h moe_combine), one thread per output element.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.cuh"

// Element (i, e): the weighted sum of token i's expert rows in j order (a product and an add per term, as the cpu
// reference; __fmul_rn / __fadd_rn keep the compiler from fusing them), then added to y.
__global__ void krn_cu_moe_combine(float *y, const float *x, const int32_t *rows, const float *w, int64_t n,
                                   int k_used, int d) {
  const int64_t total = n * (int64_t)d;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = t / d;
    const int e = (int)(t % d);
    float acc = 0.0f;
    for (int j = 0; j < k_used; j++) {
      const float p = __fmul_rn(w[i * k_used + j], x[(int64_t)rows[i * k_used + j] * d + e]);
      acc = j == 0 ? p : __fadd_rn(acc, p);
    }
    y[t] = __fadd_rn(y[t], acc);
  }
}

void krn_cuda_moe_combine(krn_ctx *c, float *y, const float *x, const int32_t *rows, const float *w, int n, int k_used,
                          int d) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0 || k_used <= 0 || d <= 0) return;
  const int64_t total = (int64_t)n * d;
  krn_cu_moe_combine<<<krn_cuda_blocks(total, 256), 256, 0, s->stream>>>(y, x, rows, w, (int64_t)n, k_used, d);
  krn_cuda_check(s, "moe_combine");
}
