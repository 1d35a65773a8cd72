// kernels/cpu/amx_matmul.h: the amx tables' matmul: prefill products of quantized weights in AMX int8 tiles.
// Included by backend_amx.c (the real instructions) and backend_amx_emulated.c (KRN_AMX_EMULATE: amx_tile.h's
// plain-C tiles), both with KRN_W512 defined; defines the table KRN_AMX_TABLE() named KRN_AMX_NAME. Every other op,
// and every matmul below AMX_MIN_ROWS activation rows (decode) or of float weights, is the avx512 table's.
//
// The product is computed per scale unit: 32 elements (16 for Q6_K, whose scales cover 16), the span over which
// both the weight's and the activation block's scales are constant. Per unit, TDPBSSD gives the exact int32 dots of
// 32 activation rows by 32 weight rows (four 16 x 16 tiles), and the epilogue adds dot * (weight scale * activation
// scale) + weight offset * activation sum (the unsigned forms) to float accumulators, as the avx512 path does per
// block: the int8 operands are the same bytes (simd_wblock.h's load_wblock for the weights, matmul_rows.h's
// mr_quant_row for the activations), so the two differ only by float rounding; but that rounding, through 30
// layers of int8 activation quantization, moves SmolLM2's logits by up to 0.9 (measured). Within this table's tile
// path a row's product does not depend on its batch: the tail of a call past its full 32-row steps runs through
// amx_rows_direct, the same exact int32 dots per unit (AVX-512 VNNI straight from the weight blocks) and the same
// epilogue, bit for bit what the tiles give. Across AMX_MIN_ROWS it does: a row decoded alone (avx512) and the same
// row in a step of 32 or more rows (tiles) differ by that rounding. amx_rows_direct for decode too would keep rows
// batch-independent, but measured on AVX-512 it ran decode matmuls 3-5x slower than the avx512 path (its lanes are
// summed per unit and the epilogue is scalar), so krn_cpu_best does not pick this table by itself (see select.c).
//
// Weights are repacked per call, not at load: each thread unpacks its panels of 32 weight rows once into the VNNI
// tile layout (int8, k bytes a row) and runs every activation row against them, so the repack costs O(m k) against
// the O(n m k) of the product, and models keep one copy of their weights (a packed copy would take 1.25 bytes per
// weight next to the GGUF's 0.56 for Q4 types, and a decode step, which reads every weight once, would read twice
// the bytes).
#ifndef DSERVE_KRN_CPU_AMX_MATMUL_H
#define DSERVE_KRN_CPU_AMX_MATMUL_H

#include <pthread.h>

#include "kernels/cpu/amx_tile.h"
#include "kernels/cpu/matmul_rows.h"
#include "kernels/cpu/simd_vec.h"
#include "kernels/cpu/simd_wblock.h"

// Below this many activation rows a matmul is a decode step: the avx512 path reads each weight once per call anyway,
// and a 32-row tile step would mostly multiply padding. Not measured (no AMX CPU at hand): a guess at the crossover.
#define AMX_MIN_ROWS 32
#define AMX_COLS 32 // weight rows per panel: two tiles of 16 columns
#define AMX_ROWS 32 // activation rows per tile step (two tiles of 16 rows); fewer go through amx_rows_direct

// Elements per scale unit of a weight type: the depth of one TDPBSSD.
KRN_INLINE int amx_unit(krn_type wt) { return wt == KRN_Q6_K ? 16 : KRN_QK; }

// One panel of AMX_COLS weight rows, repacked. Unit u's tile for column half h is b + (2 u + h) * G * 4 int32s:
// G / 4 rows of 16 int32 lanes, lane c of row g holding weight row 16 h + c's elements 4 g .. 4 g + 3 of the unit
// (TDPBSSD's B operand). Rows past m are zeros.
typedef struct amx_panel {
  int32_t *b; // (k / G, 2, G / 4, 16)
  float *dw;  // (k / G, AMX_COLS) scale of each unit
  float *mw;  // (k / G, AMX_COLS) offset of each unit (unsigned forms; 0 for Q8_0 and Q6_K)
} amx_panel;

typedef struct amx_task {
  float *y;       // (n, m)
  const void *w;  // (m, k) of wt
  krn_type wt;
  mr_act xa;      // x quantized
  int n, k, m;
} amx_task;

// Block b of weight row wr through load_wblock (kd, km: the row's current Q4_K / Q5_K super-block scales, decoded
// here at each super-block's first block), its per-lane scales into ds(8).
KRN_INLINE void amx_wblock(const void *wr, krn_type wt, int b, float *kd, float *km, __m256i *wa, __m256i *wq, float *ds,
                           float *mw) {
  if ((wt == KRN_Q4_K || wt == KRN_Q5_K) && b % 8 == 0)
    kq_scales((const krn_block_q4_k *)((const char *)wr +
                                       (size_t)(b / 8) * (wt == KRN_Q4_K ? sizeof(krn_block_q4_k) : sizeof(krn_block_q5_k))),
              kd, km);
  __m256 vd;
  *wq = _mm256_setzero_si256();
  load_wblock(wr, wt, b, b % 8, kd, km, wa, wq, &vd, mw);
  _mm256_storeu_ps(ds, vd);
}

// Weight rows [j0, j0 + AMX_COLS) into p (wt a constant after inlining).
KRN_INLINE void amx_pack(const amx_task *t, krn_type wt, int64_t j0, const amx_panel *p) {
  const int G = amx_unit(wt), L = G / 4, upb = KRN_QK / G, nb = t->k / KRN_QK, nu = t->k / G;
  const size_t rs = krn_row_size(wt, t->k);
  for (int c = 0; c < AMX_COLS; c++) {
    int32_t *col = p->b + (c / 16) * L * 16 + c % 16; // unit u's group g: col[(2 u * L + g) * 16]
    if (j0 + c >= t->m) {
      for (int u = 0; u < nu; u++) {
        for (int g = 0; g < L; g++) col[((size_t)2 * u * L + g) * 16] = 0;
        p->dw[(size_t)u * AMX_COLS + c] = p->mw[(size_t)u * AMX_COLS + c] = 0;
      }
      continue;
    }
    const void *wr = (const char *)t->w + (size_t)(j0 + c) * rs;
    float kd[8] = {0}, km[8] = {0};
    for (int b = 0; b < nb; b++) {
      __m256i wa, wq;
      float ds[8], mw;
      amx_wblock(wr, wt, b, kd, km, &wa, &wq, ds, &mw);
      int32_t lanes[8];
      _mm256_storeu_si256((__m256i *)lanes, wt_signed(wt) ? wq : wa);
      for (int l = 0; l < 8; l++) col[((size_t)2 * (b * upb + l / L) * L + l % L) * 16] = lanes[l];
      for (int h = 0; h < upb; h++) {
        p->dw[(size_t)(b * upb + h) * AMX_COLS + c] = ds[4 * h]; // Q6_K: lanes 0-3 the first 16 elements' scale
        p->mw[(size_t)(b * upb + h) * AMX_COLS + c] = mw;
      }
    }
  }
}

// Tiles 0-3 the products (activation half a, column half h: tile 2 a + h), 4-5 the activation halves, 6-7 the
// weight halves, for units of G elements.
static void amx_config(amx_cfg *cfg, int G) {
  memset(cfg, 0, sizeof *cfg);
  cfg->palette = 1;
  for (int i = 0; i < 4; i++) {
    cfg->rows[i] = 16;
    cfg->colsb[i] = 64;
  }
  cfg->rows[4] = cfg->rows[5] = 16;
  cfg->colsb[4] = cfg->colsb[5] = (uint16_t)G;
  cfg->rows[6] = cfg->rows[7] = (uint8_t)(G / 4);
  cfg->colsb[6] = cfg->colsb[7] = 64;
}

// Activation rows [i0, i0 + AMX_ROWS) (all present) against panel p (weight rows [j0, j0 + AMX_COLS)), into y.
KRN_INLINE void amx_step(amx_regs *R, const amx_task *t, krn_type wt, const amx_panel *p, int i0, int64_t j0) {
  const int G = amx_unit(wt), L = G / 4, upb = KRN_QK / G, nu = t->k / G, sg = wt_signed(wt);
  const size_t xs = (size_t)t->xa.nbp * KRN_QK; // bytes from one activation row to the next
  float acc[AMX_ROWS][AMX_COLS] __attribute__((aligned(64)));
  int32_t dot[4][16][16] __attribute__((aligned(64)));
  for (int r = 0; r < AMX_ROWS; r++) {
    _mm512_store_ps(acc[r], _mm512_setzero_ps());
    _mm512_store_ps(acc[r] + 16, _mm512_setzero_ps());
  }
  for (int u = 0; u < nu; u++) {
    int b = u / upb;
    const int8_t *xq = t->xa.qs + (size_t)i0 * xs + (size_t)b * KRN_QK + (size_t)(u % upb) * G;
    const int32_t *wt0 = p->b + (size_t)2 * u * L * 16;
    AMX_ZERO(R, 0);
    AMX_ZERO(R, 1);
    AMX_ZERO(R, 2);
    AMX_ZERO(R, 3);
    AMX_LOAD(R, 4, xq, xs);
    AMX_LOAD(R, 5, xq + 16 * xs, xs);
    AMX_LOAD(R, 6, wt0, 64);
    AMX_LOAD(R, 7, wt0 + L * 16, 64);
    AMX_DPBSSD(R, 0, 4, 6);
    AMX_DPBSSD(R, 1, 4, 7);
    AMX_DPBSSD(R, 2, 5, 6);
    AMX_DPBSSD(R, 3, 5, 7);
    AMX_STORE(R, 0, dot[0], 64);
    AMX_STORE(R, 1, dot[1], 64);
    AMX_STORE(R, 2, dot[2], 64);
    AMX_STORE(R, 3, dot[3], 64);
    const float *dw = p->dw + (size_t)u * AMX_COLS, *mw = p->mw + (size_t)u * AMX_COLS;
    __m512 dw0 = _mm512_loadu_ps(dw), dw1 = _mm512_loadu_ps(dw + 16);
    __m512 mw0 = _mm512_loadu_ps(mw), mw1 = _mm512_loadu_ps(mw + 16);
    for (int r = 0; r < AMX_ROWS; r++) {
      size_t xb = (size_t)(i0 + r) * t->xa.nbp + b;
      __m512 dx = _mm512_set1_ps(t->xa.d[xb]);
      __m512 a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dot[r / 16 * 2][r % 16])), _mm512_mul_ps(dw0, dx),
                                  _mm512_load_ps(acc[r]));
      __m512 a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dot[r / 16 * 2 + 1][r % 16])),
                                  _mm512_mul_ps(dw1, dx), _mm512_load_ps(acc[r] + 16));
      if (!sg) {
        __m512 sx = _mm512_set1_ps(t->xa.s[xb]);
        a0 = _mm512_fmadd_ps(mw0, sx, a0);
        a1 = _mm512_fmadd_ps(mw1, sx, a1);
      }
      _mm512_store_ps(acc[r], a0);
      _mm512_store_ps(acc[r] + 16, a1);
    }
  }
  int cols = t->m - j0 < AMX_COLS ? (int)(t->m - j0) : AMX_COLS;
  for (int r = 0; r < AMX_ROWS; r++) memcpy(t->y + (size_t)(i0 + r) * t->m + j0, acc[r], (size_t)cols * sizeof(float));
}

// The int32 sums of a 256-bit dot's lanes: *p0 all 8 (one 32-element unit), or (Q6_K's two 16-element units) *p0
// lanes 0-3 and *p1 lanes 4-7. Integer sums: exact in any order.
KRN_INLINE void amx_unit_sums(__m256i d, int upb, int32_t *p0, int32_t *p1) {
  __m128i lo = _mm256_castsi256_si128(d), hi = _mm256_extracti128_si256(d, 1);
  if (upb == 1) lo = _mm_add_epi32(lo, hi);
  lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0x4e));
  lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0xb1));
  *p0 = _mm_cvtsi128_si32(lo);
  if (upb == 2) {
    hi = _mm_add_epi32(hi, _mm_shuffle_epi32(hi, 0x4e));
    hi = _mm_add_epi32(hi, _mm_shuffle_epi32(hi, 0xb1));
    *p1 = _mm_cvtsi128_si32(hi);
  }
}

// Activation rows [i0, i1) (fewer than a tile step: the tail of a call) by weight rows [j0, j1), straight from the
// weight blocks, bit for bit what amx_step gives them: per unit the exact int32 dot
// (256-bit vpdpbusd of load_wblock's bytes, its lanes summed), then the epilogue's operations in scalar form, in the
// same unit order (fmaf rounds as the vector FMA does).
KRN_INLINE void amx_rows_direct(const amx_task *t, krn_type wt, int i0, int i1, int64_t j0, int64_t j1) {
  const int G = amx_unit(wt), upb = KRN_QK / G, nb = t->k / KRN_QK, sg = wt_signed(wt);
  const size_t rs = krn_row_size(wt, t->k), xs = (size_t)t->xa.nbp * KRN_QK;
  float acc[AMX_ROWS];
  for (int64_t j = j0; j < j1; j++) {
    const void *wr = (const char *)t->w + (size_t)j * rs;
    float kd[8] = {0}, km[8] = {0};
    for (int i = i0; i < i1; i++) acc[i - i0] = 0;
    for (int b = 0; b < nb; b++) {
      __m256i wa, wq;
      float ds[8], mw;
      amx_wblock(wr, wt, b, kd, km, &wa, &wq, ds, &mw);
      for (int i = i0; i < i1; i++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(t->xa.qs + (size_t)i * xs + (size_t)b * KRN_QK));
        // w x as |w| (unsigned) times x with w's sign: exact for every byte w
        __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, sg ? _mm256_sign_epi8(x, wq) : x);
        int32_t p[2] = {0, 0};
        amx_unit_sums(d, upb, &p[0], &p[1]);
        size_t xb = (size_t)i * t->xa.nbp + b;
        float dx = t->xa.d[xb], a = acc[i - i0];
        for (int h = 0; h < upb; h++) a = fmaf((float)p[h], ds[4 * h] * dx, a);
        if (!sg) a = fmaf(mw, t->xa.s[xb], a);
        acc[i - i0] = a;
      }
    }
    for (int i = i0; i < i1; i++) t->y[(size_t)i * t->m + j] = acc[i - i0];
  }
}

// Panels [lo, hi) of weight type wt against every activation row: full 32-row steps in tiles (weights repacked), the
// rest straight from the weight blocks.
KRN_INLINE void amx_panels(const amx_task *t, krn_type wt, int64_t lo, int64_t hi) {
  const int full = t->n / AMX_ROWS * AMX_ROWS; // rows in full tile steps (n >= AMX_MIN_ROWS: at least one)
  const int G = amx_unit(wt), nu = t->k / G;
  amx_panel p;
  p.b = aligned_alloc(64, (size_t)t->k * AMX_COLS);
  p.dw = aligned_alloc(64, (size_t)nu * AMX_COLS * 2 * sizeof(float));
  if (!p.b || !p.dw) abort(); // a few panels' worth of bytes: only impossible sizes fail here
  p.mw = p.dw + (size_t)nu * AMX_COLS;
  amx_cfg cfg;
  amx_config(&cfg, G);
  amx_regs R;
  AMX_CONFIG(&R, &cfg);
  for (int64_t pi = lo; pi < hi; pi++) {
    int64_t j0 = pi * AMX_COLS, j1 = j0 + AMX_COLS < t->m ? j0 + AMX_COLS : t->m;
    amx_pack(t, wt, j0, &p);
    for (int i0 = 0; i0 < full; i0 += AMX_ROWS) amx_step(&R, t, wt, &p, i0, j0);
    amx_rows_direct(t, wt, full, t->n, j0, j1);
  }
  AMX_RELEASE(&R);
  free(p.b);
  free(p.dw);
}

static void amx_run(void *vp, int ith, int nth) {
  const amx_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range((t->m + AMX_COLS - 1) / AMX_COLS, ith, nth, &lo, &hi);
  if (lo >= hi) return;
  // one instance per type, so that the type's branches fold away inside the loops
  switch (t->wt) {
  case KRN_Q4_0: amx_panels(t, KRN_Q4_0, lo, hi); break;
  case KRN_Q4_1: amx_panels(t, KRN_Q4_1, lo, hi); break;
  case KRN_Q5_0: amx_panels(t, KRN_Q5_0, lo, hi); break;
  case KRN_Q5_1: amx_panels(t, KRN_Q5_1, lo, hi); break;
  case KRN_Q8_0: amx_panels(t, KRN_Q8_0, lo, hi); break;
  case KRN_Q4_K: amx_panels(t, KRN_Q4_K, lo, hi); break;
  case KRN_Q5_K: amx_panels(t, KRN_Q5_K, lo, hi); break;
  case KRN_Q6_K: amx_panels(t, KRN_Q6_K, lo, hi); break;
  default: break; // float types never get here (amx_matmul)
  }
}

// A group below AMX_MIN_ROWS rows (decode) is the avx512 table's group, one pool run. A prefill group quantizes x once
// (signed bytes: TDPBSSD takes them for every weight form) and runs each product of quantized weights on the tiles,
// so that q, k, v, gate and up stay on AMX; float weights and bad shapes take the avx512 matmul (which also answers
// bad shapes with NaN).
static void amx_matmul_group(krn_ctx *c, const krn_mm *mm, int n_mm, const float *x, int n, int k) {
  int own = 0; // products with their own activation (an MoE layer's experts): the few-row ones as one avx512 group,
  for (int i = 0; i < n_mm; i++) own |= mm[i].x != NULL; // each other one on the tiles alone
  if (own) {
    krn_mm small[KRN_MM_GROUP_MAX];
    int ns = 0;
    for (int i = 0; i < n_mm && i < KRN_MM_GROUP_MAX; i++) {
      krn_mm one = mm[i];
      if (!one.x) one.x = x, one.xn = n;
      if (one.xn < AMX_MIN_ROWS) {
        small[ns++] = one;
        continue;
      }
      one.x = NULL;
      amx_matmul_group(c, &one, 1, mm[i].x ? mm[i].x : x, mm[i].x ? mm[i].xn : n, k);
    }
    if (ns) krn_cpu_avx512_table()->matmul_group(c, small, ns, x, n, k);
    return;
  }
  if (n < AMX_MIN_ROWS) {
    krn_cpu_avx512_table()->matmul_group(c, mm, n_mm, x, n, k);
    return;
  }
  mr_act xa;
  void *buf = NULL;
  for (int i = 0; i < n_mm; i++) {
    if (krn_cpu_is_float(mm[i].wt) || !krn_cpu_mm_ok(mm[i].wt, n, k, mm[i].m) || mm[i].m == 0) {
      krn_cpu_avx512_table()->matmul(c, mm[i].y, mm[i].w, mm[i].wt, x, n, k, mm[i].m);
      continue;
    }
    if (!buf) {
      buf = mr_act_alloc(&xa, n, k, 0);
      mr_quant_task q = {&xa, x, n, k};
      krn_cpu_par(c, mr_quant_run, &q);
    }
    amx_task t = {mm[i].y, mm[i].w, mm[i].wt, xa, n, k, mm[i].m};
    krn_cpu_par(c, amx_run, &t);
  }
  free(buf);
}

static void amx_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  krn_mm one = {y, w, wt, m, NULL, 0};
  amx_matmul_group(c, &one, 1, x, n, k);
}

// The table: the avx512 table with its name and matmul (and matmul group) replaced. Built on first use because the avx512 ops are
// static in backend_avx512.c (a constant initializer cannot name them); written once under pthread_once, read-only
// after, so every caller sees the same complete table.
static krn_backend amx_backend;
static pthread_once_t amx_backend_once = PTHREAD_ONCE_INIT;
static void amx_backend_build(void) {
  amx_backend = *krn_cpu_avx512_table();
  amx_backend.name = KRN_AMX_NAME;
  amx_backend.matmul = amx_matmul;
  amx_backend.matmul_group = amx_matmul_group;
}
const krn_backend *KRN_AMX_TABLE(void) {
  pthread_once(&amx_backend_once, amx_backend_build);
  return &amx_backend;
}

#endif
