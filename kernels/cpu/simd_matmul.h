// kernels/cpu/simd_matmul.h: the SIMD backends' matmul (quantized weight blocks, float weights, the pool's split).
// Quantized weight blocks are unpacked for the int8 dot and tiled by matmul_rows.h (AVX2) or matmul_x16.h (AVX-512);
// float weights are dotted in F32.
#ifndef DSERVE_KRN_CPU_SIMD_MATMUL_H
#define DSERVE_KRN_CPU_SIMD_MATMUL_H

#include "kernels/cpu/simd_vec.h"
#include "kernels/cpu/simd_wblock.h"
#include "kernels/cpu/matmul_rows.h"

KRN_INLINE float bf16f(krn_bf16 h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
#ifdef KRN_W512
#define v_loadbf(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#else
#define v_loadbf(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#endif

// Element e of a float weight row (F32, F16 or BF16; wt is a constant after inlining).
KRN_INLINE vf load_wf(const void *wv, krn_type wt, int e) {
  if (wt == KRN_F16) return v_loadh((const krn_f16 *)wv + e);
  if (wt == KRN_BF16) return v_loadbf((const krn_bf16 *)wv + e);
  return v_load((const float *)wv + e);
}
KRN_INLINE float load_wf1(const void *wv, krn_type wt, int e) {
  if (wt == KRN_F16) return f16f(((const krn_f16 *)wv)[e]);
  if (wt == KRN_BF16) return bf16f(((const krn_bf16 *)wv)[e]);
  return ((const float *)wv)[e];
}

// Float weights (F32 / F16 / BF16) against float activation rows; k need not be a multiple of the vector width.
KRN_INLINE void dot_float(const void *wv, krn_type wt, const float *const *xr, int R, int k, float *out) {
  vf acc[4] = {v_zero(), v_zero(), v_zero(), v_zero()};
  int e = 0;
  for (; e + VL <= k; e += VL) {
    vf w = load_wf(wv, wt, e);
    for (int r = 0; r < R; r++) acc[r] = v_fma(w, v_load(xr[r] + e), acc[r]);
  }
  for (int r = 0; r < R; r++) {
    float s = v_hsum(acc[r]);
    for (int t = e; t < k; t++) s += load_wf1(wv, wt, t) * xr[r][t];
    out[r] = s;
  }
}

typedef struct mm_task {
  float *y;            // (n, m)
  const void *w;       // (m, k) of wt
  krn_type wt;
  const float *x;      // (n, k)
  mr_act xa;           // x quantized (quantized weights only)
  int n, k, m;
} mm_task;

#define MM_JBLOCK 16 // weight rows kept hot while activation tiles stream past
#define MM_TILE 4    // activation rows sharing each float weight row

#ifndef KRN_W512 // AVX-512 multiplies the quantized types in matmul_x16.h
// Weight rows [j, j + NW) (the last one repeated past m) against activation rows [i0, i0 + R).
KRN_INLINE void mm_rows_q(const mm_task *t, krn_type wt, int64_t j, int64_t j1, int i0, int NW, int R) {
  size_t rs = krn_row_size(wt, t->k);
  const void *wr[MR_W];
  float out[MR_W * MR_R];
  int W = j1 - j < NW ? (int)(j1 - j) : NW;
  for (int w = 0; w < NW; w++) wr[w] = (const char *)t->w + (size_t)(j + (w < W ? w : W - 1)) * rs;
  mr_tile(wr, wt, &t->xa, i0, NW, R, t->k / KRN_QK, out);
  for (int w = 0; w < W; w++)
    for (int r = 0; r < R; r++) t->y[(size_t)(i0 + r) * t->m + j + w] = out[w * MR_R + r];
}

#endif

KRN_INLINE void mm_rows_f(const mm_task *t, krn_type wt, int64_t j, int i0, int R) {
  const void *wr = (const char *)t->w + (size_t)j * krn_row_size(wt, t->k);
  const float *xr[MM_TILE];
  float out[MM_TILE];
  for (int r = 0; r < R; r++) xr[r] = t->x + (size_t)(i0 + r) * t->k;
  dot_float(wr, wt, xr, R, t->k, out);
  for (int r = 0; r < R; r++) t->y[(size_t)(i0 + r) * t->m + j] = out[r];
}

#ifndef KRN_W512
// Rows [j0, j1) of w, NW at a time, against every activation row: tiles of MR_R activation rows, then the leftover
// rows as 4 + 2 + 1 (R is a constant in each instance).
KRN_INLINE void mm_block_q(const mm_task *t, krn_type wt, int64_t j0, int64_t j1, int NW) {
  int i = 0;
  for (; i + MR_R <= t->n; i += MR_R)
    for (int64_t j = j0; j < j1; j += NW) mm_rows_q(t, wt, j, j1, i, NW, MR_R);
  for (int R = 4; R >= 1; R /= 2) {
    if (t->n - i < R) continue;
    for (int64_t j = j0; j < j1; j += NW) {
      if (R == 4) mm_rows_q(t, wt, j, j1, i, NW, 4);
      else if (R == 2) mm_rows_q(t, wt, j, j1, i, NW, 2);
      else mm_rows_q(t, wt, j, j1, i, NW, 1);
    }
    i += R;
  }
}
#endif

// The same for float weights: tiles of MM_TILE activation rows by one weight row.
KRN_INLINE void mm_block_f(const mm_task *t, krn_type wt, int64_t j0, int64_t j1) {
  int i = 0;
  for (; i + MM_TILE <= t->n; i += MM_TILE)
    for (int64_t j = j0; j < j1; j++) mm_rows_f(t, wt, j, i, MM_TILE);
  int rest = t->n - i;
  for (int64_t j = j0; j < j1; j++) {
    if (rest == 3) mm_rows_f(t, wt, j, i, 3);
    else if (rest == 2) mm_rows_f(t, wt, j, i, 2);
    else if (rest == 1) mm_rows_f(t, wt, j, i, 1);
  }
}

#ifdef KRN_W512
#include "kernels/cpu/matmul_x16.h"
#endif

static void mm_run(void *vp, int ith, int nth) {
  const mm_task *t = vp;
#ifdef KRN_W512
  if (!krn_cpu_is_float(t->wt)) { // every quantized type
    mx_run(t, ith, nth);
    return;
  }
#endif
  int64_t lo, hi;
  krn_cpu_range(t->m, ith, nth, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += MM_JBLOCK) {
    int64_t j1 = j0 + MM_JBLOCK < hi ? j0 + MM_JBLOCK : hi;
    // one instance per type, so that the type's branches fold away inside the loops
    switch (t->wt) {
#ifndef KRN_W512
    case KRN_Q4_0: mm_block_q(t, KRN_Q4_0, j0, j1, MR_W); break;
    case KRN_Q4_1: mm_block_q(t, KRN_Q4_1, j0, j1, MR_W); break;
    case KRN_Q5_0: mm_block_q(t, KRN_Q5_0, j0, j1, MR_W); break;
    case KRN_Q5_1: mm_block_q(t, KRN_Q5_1, j0, j1, MR_W); break;
    case KRN_Q8_0: mm_block_q(t, KRN_Q8_0, j0, j1, MR_W); break;
    case KRN_Q4_K: mm_block_q(t, KRN_Q4_K, j0, j1, MR_W); break;
    case KRN_Q5_K: mm_block_q(t, KRN_Q5_K, j0, j1, MR_W); break;
    case KRN_Q6_K: mm_block_q(t, KRN_Q6_K, j0, j1, MR_W); break;
#endif
    case KRN_F16: mm_block_f(t, KRN_F16, j0, j1); break;
    case KRN_BF16: mm_block_f(t, KRN_BF16, j0, j1); break;
    default: mm_block_f(t, KRN_F32, j0, j1); break;
    }
  }
}

static void simd_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  if (!krn_cpu_mm_ok(wt, n, k, m)) { if (n > 0 && m > 0) krn_cpu_fill_nan(y, (int64_t)n * m); return; }
  mm_task t = {y, w, wt, x, {0}, n, k, m};
  int par = (int64_t)n * k * m >= KRN_PAR_MIN;
  void *buf = NULL;
  if (!krn_cpu_is_float(wt)) {
    // (matmul_x16.h takes the signed bytes: MR_U8 is 0 with AVX-512)
    buf = mr_act_alloc(&t.xa, n, k, MR_U8 && wt_signed(wt));
    mr_quant_task q = {&t.xa, x, n, k};
    if (par && n >= 8) krn_cpu_par(c, mr_quant_run, &q);
    else mr_quant_run(&q, 0, 1);
  }
  if (par) krn_cpu_par(c, mm_run, &t);
  else mm_run(&t, 0, 1);
  free(buf);
}

#endif
