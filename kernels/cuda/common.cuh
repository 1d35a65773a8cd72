// kernels/cuda/common.cuh: the cuda backend's private state (stream, cuBLAS, scratch) and helpers shared by every op file.
#ifndef DSERVE_KRN_CUDA_COMMON_CUH
#define DSERVE_KRN_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/krn.h"

// What ctx_init hangs off krn_ctx.dev. Scratch buffers grow on demand and are freed by ctx_fini.
typedef struct krn_cuda_state {
  int device;
  int n_sm;                 // multiprocessors of the device (sizes split-K grids)
  cudaStream_t stream;      // (owned) every op and copy of this ctx runs on it
  cublasHandle_t blas;      // (owned) bound to stream
  cudaStream_t xfer;        // (owned) download_ready copies: they must not queue behind the compute on stream
  void *scratch[4];         // (owned) device scratch, see KRN_CUDA_SCR_*
  size_t scratch_bytes[4];
  void *blas_ws;            // (owned) cuBLAS workspace, set once so that cuBLAS never allocates inside a graph capture
  int failed;               // sticky: 1 after the first CUDA error (reported once on stderr)
  char err[256];            // that first error
  uint64_t epoch;           // bumped whenever a scratch buffer is reallocated (graphs recorded before are stale)
  int capturing;            // between graph_begin and graph_end
  int capture_broken;       // something failed while capturing: graph_end returns NULL, the ctx is not failed
} krn_cuda_state;

enum { KRN_CUDA_SCR_W = 0, KRN_CUDA_SCR_X = 1, KRN_CUDA_SCR_ATTN = 2, KRN_CUDA_SCR_ATTN2 = 3 };

// Returns the state of c after making its device current, or NULL (error recorded nowhere: no state) when
// ctx_init was not run.
krn_cuda_state *krn_cuda_st(krn_ctx *c);
// Records the first failure of the ctx (and prints it once); later calls are ignored.
void krn_cuda_fail(krn_cuda_state *s, const char *what, const char *detail);
// Checks cudaGetLastError after a launch; 0 ok, -1 failed (recorded).
int krn_cuda_check(krn_cuda_state *s, const char *what);
// Scratch slot `slot` of at least bytes bytes, or NULL (recorded) when cudaMalloc fails. While a graph is
// being captured it never reallocates (that would sync the capturing stream): a slot too small breaks the
// capture instead (NULL, capture_broken).
void *krn_cuda_scratch(krn_cuda_state *s, int slot, size_t bytes);

// Step graphs (kernels/cuda/graph.cu), the table's graph_* entries.
int krn_cuda_graph_begin(krn_ctx *c);
void *krn_cuda_graph_end(krn_ctx *c);
int krn_cuda_graph_launch(krn_ctx *c, void *graph);
void krn_cuda_graph_free(krn_ctx *c, void *graph);

// Elements per block of a weight type (1 for float types), 0 for a type the cuda ops do not take.
static inline int krn_cuda_type_block(int t) {
  switch (t) {
  case KRN_F32: case KRN_F16: case KRN_BF16: return 1;
  case KRN_Q4_0: case KRN_Q4_1: case KRN_Q5_0: case KRN_Q5_1: case KRN_Q8_0: return KRN_QK;
  case KRN_Q4_K: case KRN_Q5_K: case KRN_Q6_K: return KRN_QK_K;
  }
  return 0;
}
// Bytes of a row of n elements of type t, 0 for an unknown type (krn_row_size without linking krn.c into this library).
static inline size_t krn_cuda_row_bytes(int t, int64_t n) {
  switch (t) {
  case KRN_F32: return (size_t)n * 4;
  case KRN_F16: return (size_t)n * 2;
  case KRN_BF16: return (size_t)n * 2;
  case KRN_Q4_0: return (size_t)(n / KRN_QK) * sizeof(krn_block_q4_0);
  case KRN_Q4_1: return (size_t)(n / KRN_QK) * sizeof(krn_block_q4_1);
  case KRN_Q5_0: return (size_t)(n / KRN_QK) * sizeof(krn_block_q5_0);
  case KRN_Q5_1: return (size_t)(n / KRN_QK) * sizeof(krn_block_q5_1);
  case KRN_Q8_0: return (size_t)(n / KRN_QK) * sizeof(krn_block_q8_0);
  case KRN_Q4_K: return (size_t)(n / KRN_QK_K) * sizeof(krn_block_q4_k);
  case KRN_Q5_K: return (size_t)(n / KRN_QK_K) * sizeof(krn_block_q5_k);
  case KRN_Q6_K: return (size_t)(n / KRN_QK_K) * sizeof(krn_block_q6_k);
  }
  return 0;
}
// 1 when t is a weight type the cuda ops take with rows of k elements (k a multiple of its block).
static inline int krn_cuda_type_ok(int t, int64_t k) {
  const int blk = krn_cuda_type_block(t);
  return blk > 0 && k % blk == 0;
}

// Number of blocks of `threads` threads covering n items, capped for grid-stride loops.
static inline unsigned krn_cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 8) b = 65535LL * 8;
  return (unsigned)b;
}

__device__ __forceinline__ float krn_cu_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float krn_cu_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float krn_cu_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Dequantizes the 32 elements of block b of a row of type T into out[32]. row points at the row start.
// Block layouts are krn.h's: q4 element j < 16 is the low nibble of qs[j], j + 16 the high nibble.
template <int T> __device__ __forceinline__ void krn_cu_deq_block(const void *row, int64_t b, float *out);

template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_F32>(const void *row, int64_t b, float *out) {
  const float4 *p = (const float4 *)((const float *)row + b * 32);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    float4 v = p[i];
    out[4 * i] = v.x; out[4 * i + 1] = v.y; out[4 * i + 2] = v.z; out[4 * i + 3] = v.w;
  }
}
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_F16>(const void *row, int64_t b, float *out) {
  const uint4 *p = (const uint4 *)((const uint16_t *)row + b * 32);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    uint4 v = p[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float2 f = __half22float2(*(const __half2 *)&w[j]);
      out[8 * i + 2 * j] = f.x; out[8 * i + 2 * j + 1] = f.y;
    }
  }
}
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_Q4_0>(const void *row, int64_t b, float *out) {
  const krn_block_q4_0 *blk = (const krn_block_q4_0 *)row + b; // 18 bytes: 2-byte aligned
  const uint16_t *q = (const uint16_t *)blk->qs;
  float d = krn_cu_h2f(blk->d);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    uint16_t v = q[i];
    out[2 * i] = d * (float)((int)(v & 0xf) - 8);
    out[2 * i + 1] = d * (float)((int)((v >> 8) & 0xf) - 8);
    out[2 * i + 16] = d * (float)((int)((v >> 4) & 0xf) - 8);
    out[2 * i + 17] = d * (float)((int)(v >> 12) - 8);
  }
}
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_Q4_1>(const void *row, int64_t b, float *out) {
  const krn_block_q4_1 *blk = (const krn_block_q4_1 *)row + b; // 20 bytes: 4-byte aligned
  const uint32_t *q = (const uint32_t *)blk->qs;
  float d = krn_cu_h2f(blk->d), m = krn_cu_h2f(blk->m);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    uint32_t v = q[i];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      uint32_t byte = (v >> (8 * j)) & 0xff;
      out[4 * i + j] = d * (float)(byte & 0xf) + m;
      out[4 * i + j + 16] = d * (float)(byte >> 4) + m;
    }
  }
}
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_Q8_0>(const void *row, int64_t b, float *out) {
  const krn_block_q8_0 *blk = (const krn_block_q8_0 *)row + b; // 34 bytes: 2-byte aligned
  const uint16_t *q = (const uint16_t *)blk->qs;
  float d = krn_cu_h2f(blk->d);
#pragma unroll
  for (int i = 0; i < 16; i++) {
    uint16_t v = q[i];
    out[2 * i] = d * (float)(int8_t)(v & 0xff);
    out[2 * i + 1] = d * (float)(int8_t)(v >> 8);
  }
}

template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_BF16>(const void *row, int64_t b, float *out) {
  const uint4 *p = (const uint4 *)((const uint16_t *)row + b * 32);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    uint4 v = p[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
      out[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
      out[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  }
}
// q5 blocks: the 5-bit q of element j (< 16) is nibble (qs[j] & 15) with bit j of qh, element j + 16 is
// (qs[j] >> 4) with bit j + 16. Every product d * q is exact in f32 (11 + 5 bits), so FMA contraction cannot
// change a result: the cuda floats are the cpu reference's bit for bit (likewise for the K-quants below).
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_Q5_0>(const void *row, int64_t b, float *out) {
  const krn_block_q5_0 *blk = (const krn_block_q5_0 *)row + b; // 22 bytes: 2-byte aligned
  const uint16_t *h = (const uint16_t *)blk->qh, *q = (const uint16_t *)blk->qs;
  const uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 16;
  const float d = krn_cu_h2f(blk->d);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const uint32_t v = q[i];
    out[2 * i] = d * (float)((int)((v & 0xf) | ((qh >> (2 * i)) & 1) << 4) - 16);
    out[2 * i + 1] = d * (float)((int)(((v >> 8) & 0xf) | ((qh >> (2 * i + 1)) & 1) << 4) - 16);
    out[2 * i + 16] = d * (float)((int)(((v >> 4) & 0xf) | ((qh >> (2 * i + 16)) & 1) << 4) - 16);
    out[2 * i + 17] = d * (float)((int)((v >> 12) | ((qh >> (2 * i + 17)) & 1) << 4) - 16);
  }
}
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_Q5_1>(const void *row, int64_t b, float *out) {
  const krn_block_q5_1 *blk = (const krn_block_q5_1 *)row + b; // 24 bytes: 4-byte aligned
  const uint32_t qh = *(const uint32_t *)blk->qh;
  const uint32_t *q = (const uint32_t *)blk->qs;
  const float d = krn_cu_h2f(blk->d), m = krn_cu_h2f(blk->m);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t v = q[i];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int e = 4 * i + j;
      const uint32_t byte = (v >> (8 * j)) & 0xff;
      out[e] = d * (float)((byte & 0xf) | ((qh >> e) & 1) << 4) + m;
      out[e + 16] = d * (float)((byte >> 4) | ((qh >> (e + 16)) & 1) << 4) + m;
    }
  }
}
// Sub-block s (< 8) of a Q4_K / Q5_K scales[12]: 6-bit scale and min (krn.h's krn_k_scale_min, on the device).
__device__ __forceinline__ void krn_cu_k_scale_min(const uint8_t *q, int s, int *sc, int *m) {
  if (s < 4) {
    *sc = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *sc = (q[s + 4] & 0xf) | ((q[s - 4] >> 6) << 4);
    *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}
// Q4_K / Q5_K: block b is sub-block b % 8 of super-block b / 8; its nibbles are the low (even s) or high (odd s)
// halves of qs[32 (s / 2) ..], Q5_K's fifth bit is bit s of qh[l].
template <int T> __device__ __forceinline__ void krn_cu_deq_kq(const void *row, int64_t b, float *out) {
  const int s = (int)(b & 7);
  const uint8_t *blk = (const uint8_t *)row + (b >> 3) * (T == KRN_Q4_K ? sizeof(krn_block_q4_k) : sizeof(krn_block_q5_k));
  const krn_block_q4_k *hd = (const krn_block_q4_k *)blk; // d, dmin, scales: the same offsets in both
  int sc, mn;
  krn_cu_k_scale_min(hd->scales, s, &sc, &mn);
  const float dl = krn_cu_h2f(hd->d) * (float)sc, ml = krn_cu_h2f(hd->dmin) * (float)mn;
  const uint32_t *q = (const uint32_t *)((T == KRN_Q4_K ? hd->qs : ((const krn_block_q5_k *)blk)->qs) + 32 * (s >> 1));
  const uint32_t *h = (const uint32_t *)((const krn_block_q5_k *)blk)->qh;
  const int shift = 4 * (s & 1);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const uint32_t v = q[i] >> shift, hb = T == KRN_Q5_K ? h[i] >> s : 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int qv = (int)((v >> (8 * j)) & 0xf);
      if (T == KRN_Q5_K) qv |= (int)((hb >> (8 * j)) & 1) << 4;
      out[4 * i + j] = dl * (float)qv - ml;
    }
  }
}
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_Q4_K>(const void *row, int64_t b, float *out) {
  krn_cu_deq_kq<KRN_Q4_K>(row, b, out); // 144 bytes: 4-byte aligned
}
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_Q5_K>(const void *row, int64_t b, float *out) {
  krn_cu_deq_kq<KRN_Q5_K>(row, b, out); // 176 bytes: 4-byte aligned
}
// Q6_K: block b is group j = s % 4 of half h = s / 4 (s = b % 8) of super-block b / 8: low 4 bits from
// ql[64 h + 32 (j & 1) + l] (low nibble for j < 2), high 2 bits from qh[32 h + l] >> 2 j; scale per 16 elements.
template <> __device__ __forceinline__ void krn_cu_deq_block<KRN_Q6_K>(const void *row, int64_t b, float *out) {
  const krn_block_q6_k *blk = (const krn_block_q6_k *)row + (b >> 3); // 210 bytes: 2-byte aligned
  const int s = (int)(b & 7), hh = s >> 2, j = s & 3;
  const uint16_t *ql = (const uint16_t *)(blk->ql + 64 * hh + 32 * (j & 1)), *qh = (const uint16_t *)(blk->qh + 32 * hh);
  const float d = krn_cu_h2f(blk->d);
  const float d0 = d * (float)blk->scales[2 * s], d1 = d * (float)blk->scales[2 * s + 1];
  const int lshift = 4 * (j >> 1), hshift = 2 * j;
#pragma unroll
  for (int i = 0; i < 16; i++) {
    const uint32_t lo = (uint32_t)ql[i] >> lshift, hi = (uint32_t)qh[i] >> hshift;
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const int q = (int)(((lo >> (8 * k)) & 0xf) | ((hi >> (8 * k)) & 3) << 4) - 32;
      out[2 * i + k] = (i < 8 ? d0 : d1) * (float)q;
    }
  }
}

// Paged attention splits rows between its two kernels by 32-row tiles: a tile whose rows come from at most
// KRN_CU_ATTN_TILE_SEGS runs of one sequence goes to the prefill kernel (it shares K/V tiles among the rows),
// any other tile (a decode batch: one row per sequence) to the split-K decode kernel. Both kernels and the
// decode combine pass evaluate this same test, so each row is computed exactly once.
#define KRN_CU_ATTN_TILE 32
#define KRN_CU_ATTN_TILE_SEGS 4
__device__ __forceinline__ int krn_cu_attn_tile_is_prefill(const int32_t *tok_seq, int n_tokens, int tile) {
  const int r0 = tile * KRN_CU_ATTN_TILE, r1 = min(n_tokens, r0 + KRN_CU_ATTN_TILE);
  int segs = 1;
  for (int r = r0 + 1; r < r1; r++) segs += tok_seq[r] != tok_seq[r - 1];
  return segs <= KRN_CU_ATTN_TILE_SEGS;
}

// Element j of a row of type t (any alignment; the slow generic path).
__device__ __forceinline__ float krn_cu_deq_elem(const void *row, int t, int64_t j) {
  const int64_t b = j / 32;
  const int jj = (int)(j % 32);
  switch (t) {
  case KRN_F32: return ((const float *)row)[j];
  case KRN_F16: return krn_cu_h2f(((const uint16_t *)row)[j]);
  case KRN_Q4_0: {
    const krn_block_q4_0 *k = (const krn_block_q4_0 *)row + b;
    int q = jj < 16 ? (k->qs[jj] & 0xf) : (k->qs[jj - 16] >> 4);
    return krn_cu_h2f(k->d) * (float)(q - 8);
  }
  case KRN_Q4_1: {
    const krn_block_q4_1 *k = (const krn_block_q4_1 *)row + b;
    int q = jj < 16 ? (k->qs[jj] & 0xf) : (k->qs[jj - 16] >> 4);
    return krn_cu_h2f(k->d) * (float)q + krn_cu_h2f(k->m);
  }
  case KRN_Q8_0: {
    const krn_block_q8_0 *k = (const krn_block_q8_0 *)row + b;
    return krn_cu_h2f(k->d) * (float)k->qs[jj];
  }
  case KRN_BF16: return __uint_as_float((uint32_t)((const uint16_t *)row)[j] << 16);
  case KRN_Q5_0: case KRN_Q5_1: {
    const uint8_t *k = (const uint8_t *)row + b * (t == KRN_Q5_0 ? sizeof(krn_block_q5_0) : sizeof(krn_block_q5_1));
    const uint8_t *qh = k + (t == KRN_Q5_0 ? 2 : 4), *qs = qh + 4;
    const int q = (jj < 16 ? (qs[jj] & 0xf) : (qs[jj - 16] >> 4)) | ((qh[jj >> 3] >> (jj & 7)) & 1) << 4;
    const float d = krn_cu_h2f(*(const uint16_t *)k);
    return t == KRN_Q5_0 ? d * (float)(q - 16) : d * (float)q + krn_cu_h2f(*(const uint16_t *)(k + 2));
  }
  case KRN_Q4_K: case KRN_Q5_K: {
    const int s = (int)(b & 7), l = jj;
    const uint8_t *k = (const uint8_t *)row + (b >> 3) * (t == KRN_Q4_K ? sizeof(krn_block_q4_k) : sizeof(krn_block_q5_k));
    const krn_block_q4_k *hd = (const krn_block_q4_k *)k;
    int sc, mn;
    krn_cu_k_scale_min(hd->scales, s, &sc, &mn);
    const uint8_t *qs = t == KRN_Q4_K ? hd->qs : ((const krn_block_q5_k *)k)->qs;
    int q = (qs[32 * (s >> 1) + l] >> (4 * (s & 1))) & 0xf;
    if (t == KRN_Q5_K) q |= ((((const krn_block_q5_k *)k)->qh[l] >> s) & 1) << 4;
    return krn_cu_h2f(hd->d) * (float)sc * (float)q - krn_cu_h2f(hd->dmin) * (float)mn;
  }
  case KRN_Q6_K: {
    const krn_block_q6_k *k = (const krn_block_q6_k *)row + (b >> 3);
    const int s = (int)(b & 7), hh = s >> 2, g = s & 3, l = jj;
    const int q = ((k->ql[64 * hh + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xf) | ((k->qh[32 * hh + l] >> (2 * g)) & 3) << 4;
    return krn_cu_h2f(k->d) * (float)k->scales[2 * s + (l >> 4)] * (float)(q - 32);
  }
  }
  return 0.0f;
}

#endif
