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
  size_t rs;           // bytes per weight row
} mm_task;

#define MM_JBLOCK 16 // weight rows kept hot while activation tiles stream past
#define MM_TILE 4    // activation rows sharing each float weight row

#ifndef KRN_W512 // AVX-512 multiplies the quantized types in matmul_x16.h
// Weight rows [j, j + NW) (the last one repeated past m) against activation rows [i0, i0 + R).
KRN_INLINE void mm_rows_q(const mm_task *t, krn_type wt, int64_t j, int64_t j1, int i0, int NW, int R) {
  size_t rs = t->rs;
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
  const void *wr = (const char *)t->w + (size_t)j * t->rs;
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

// Rows [lo, hi) of t's weight against every activation row (p: this thread's packing panel, AVX-512 only).
static void mm_span(const mm_task *t, void *p, int64_t lo, int64_t hi) {
#ifdef KRN_W512
  if (!krn_cpu_is_float(t->wt)) { // every quantized type
    switch (t->wt) { // one instance per type, so that the type's branches fold away inside the loops
    case KRN_Q4_0: mx_span(t, KRN_Q4_0, p, lo, hi); break;
    case KRN_Q4_1: mx_span(t, KRN_Q4_1, p, lo, hi); break;
    case KRN_Q5_0: mx_span(t, KRN_Q5_0, p, lo, hi); break;
    case KRN_Q5_1: mx_span(t, KRN_Q5_1, p, lo, hi); break;
    case KRN_Q4_K: mx_span(t, KRN_Q4_K, p, lo, hi); break;
    case KRN_Q5_K: mx_span(t, KRN_Q5_K, p, lo, hi); break;
    case KRN_Q6_K: mx_span(t, KRN_Q6_K, p, lo, hi); break;
    case KRN_Q8_0: mx_span(t, KRN_Q8_0, p, lo, hi); break;
    default: break; // krn_cpu_mm_ok lets in no other quantized type
    }
    return;
  }
#else
  (void)p;
#endif
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

// A group's products as one pool run. Their rows are laid end to end and cut into one contiguous share per thread,
// even in weight bytes (at whole MM_JBLOCKs, matmul_x16.h's groups of 16): each thread streams one run of memory,
// which the prefetchers follow (chunks claimed from a shared counter, interleaving the threads, ran a decode step at
// 80% of this speed).
typedef struct mm_group {
  mm_task t[KRN_MM_GROUP_MAX];
  int n_mm;
} mm_group;

// Each product's share of the work: its weight bytes times (rows + 4), the bytes streamed and the rows they meet (the
// products of one activation all weigh their bytes alike; an expert's product with many tokens weighs more).
static int64_t mm_group_cost(const mm_task *t) { return (int64_t)t->n + 4; }

// The row of the concatenated products at which share ith of nth starts, as (product, row).
static void mm_group_at(const mm_group *g, int ith, int nth, int *pi, int64_t *row) {
  int64_t total = 0;
  for (int i = 0; i < g->n_mm; i++) total += (int64_t)g->t[i].rs * g->t[i].m * mm_group_cost(&g->t[i]);
  int64_t at = total / nth * ith + total % nth * ith / nth; // work before the share
  for (int i = 0; i < g->n_mm; i++) {
    int64_t per_row = (int64_t)g->t[i].rs * mm_group_cost(&g->t[i]), work = per_row * g->t[i].m;
    if (at < work || i == g->n_mm - 1) {
      int64_t r = (at / per_row + MM_JBLOCK / 2) / MM_JBLOCK * MM_JBLOCK;
      *pi = i;
      *row = r < g->t[i].m ? r : g->t[i].m;
      return;
    }
    at -= work;
  }
  *pi = 0;
  *row = 0;
}

static void mm_group_run(void *vp, int ith, int nth) {
  const mm_group *g = vp;
  int i0, i1;
  int64_t r0, r1;
  mm_group_at(g, ith, nth, &i0, &r0);
  if (ith + 1 < nth) mm_group_at(g, ith + 1, nth, &i1, &r1);
  else i1 = g->n_mm - 1, r1 = g->t[i1].m;
  void *p = NULL;
#ifdef KRN_W512
  p = aligned_alloc(64, sizeof(mx_panel));
  if (!p) abort(); // 48 KiB
#endif
  for (int i = i0; i <= i1; i++) {
    int64_t lo = i == i0 ? r0 : 0, hi = i == i1 ? r1 : g->t[i].m;
    if (lo < hi) mm_span(&g->t[i], p, lo, hi);
  }
  free(p);
}

// One activation of a group (the group's x, or a product's own) and its quantized forms.
typedef struct mm_act {
  const float *x;
  int n;
  int forms; // bit 0: some product takes x's plain activation blocks, bit 1: the +128 form (signed weights)
  void *buf[2];
  mr_act xa[2];
} mm_act;

static void simd_matmul_group(krn_ctx *c, const krn_mm *mm, int n_mm, const float *x, int n, int k) {
  mm_group g;
  memset(&g, 0, sizeof g);
  mm_act act[KRN_MM_GROUP_MAX];
  int aidx[KRN_MM_GROUP_MAX], n_act = 0;
  memset(act, 0, sizeof act);
  int64_t work = 0;
  for (int i = 0; i < n_mm && i < KRN_MM_GROUP_MAX; i++) {
    const float *xi = mm[i].x ? mm[i].x : x;
    int ni = mm[i].x ? mm[i].xn : n;
    if (!krn_cpu_mm_ok(mm[i].wt, ni, k, mm[i].m)) {
      if (ni > 0 && mm[i].m > 0) krn_cpu_fill_nan(mm[i].y, (int64_t)ni * mm[i].m);
      continue;
    }
    if (ni == 0) continue;
    int a = 0;
    while (a < n_act && !(act[a].x == xi && act[a].n == ni)) a++;
    if (a == n_act) act[n_act++] = (mm_act){.x = xi, .n = ni};
    mm_task *t = &g.t[g.n_mm];
    *t = (mm_task){mm[i].y, mm[i].w, mm[i].wt, xi, {0}, ni, k, mm[i].m, krn_row_size(mm[i].wt, k)};
    work += (int64_t)ni * k * t->m;
    // (matmul_x16.h takes the signed bytes: MR_U8 is 0 with AVX-512)
    if (!krn_cpu_is_float(t->wt)) act[a].forms |= MR_U8 && wt_signed(t->wt) ? 2 : 1;
    aidx[g.n_mm++] = a;
  }
  if (g.n_mm == 0) return;
  int par = work >= KRN_PAR_MIN;
  for (int a = 0; a < n_act; a++)
    for (int f = 0; f < 2; f++) // each activation quantized once for every product that takes that form
      if (act[a].forms >> f & 1) {
        act[a].buf[f] = mr_act_alloc(&act[a].xa[f], act[a].n, k, f);
        mr_quant_task q = {&act[a].xa[f], act[a].x, act[a].n, k};
        if (par && act[a].n >= 8) krn_cpu_par(c, mr_quant_run, &q);
        else mr_quant_run(&q, 0, 1);
      }
  for (int i = 0; i < g.n_mm; i++) g.t[i].xa = act[aidx[i]].xa[MR_U8 && wt_signed(g.t[i].wt)];
  if (par) krn_cpu_par(c, mm_group_run, &g);
  else mm_group_run(&g, 0, 1);
  for (int a = 0; a < n_act; a++) {
    free(act[a].buf[0]);
    free(act[a].buf[1]);
  }
}

static void simd_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  krn_mm one = {y, w, wt, m, NULL, 0};
  simd_matmul_group(c, &one, 1, x, n, k);
}

#endif
