// kernels/cuda/get_rows.cu: embedding lookup, out(n, k) = rows ids(n) of w dequantized; one thread per element.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/get_rows.cuh"

__global__ void krn_cu_get_rows(float *out, const void *w, int wt, size_t row_bytes, const int32_t *ids, int n, int k) {
  const int64_t total = (int64_t)n * k;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int r = (int)(t / k);
    const int j = (int)(t % k);
    const char *row = (const char *)w + (size_t)ids[r] * row_bytes;
    out[t] = krn_cu_deq_elem(row, wt, j);
  }
}

void krn_cuda_get_rows(krn_ctx *c, float *out, const void *w, krn_type wt, const int32_t *ids, int n, int k) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || n <= 0 || k <= 0) return;
  if (!krn_cuda_type_ok(wt, k)) {
    krn_cuda_fail(s, "get_rows", "unknown weight type or k not a multiple of the type's block (32, 256 for K-quants)");
    return;
  }
  krn_cu_get_rows<<<krn_cuda_blocks((int64_t)n * k, 256), 256, 0, s->stream>>>(out, w, (int)wt, krn_cuda_row_bytes(wt, k),
                                                                               ids, n, k);
  krn_cuda_check(s, "get_rows");
}
