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
// mr_quant_row for the activations), so the two differ only by float rounding.
//
// Weights are repacked per call, not at load: each thread unpacks its panels of 32 weight rows once into the VNNI
// tile layout (int8, k bytes a row) and runs every activation row against them, so the repack costs O(m k) against
// the O(n m k) of the product, and models keep one copy of their weights (a packed copy would take 1.25 bytes per
// weight next to the GGUF's 0.56 for Q4 types).
#ifndef DSERVE_KRN_CPU_AMX_MATMUL_H
#define DSERVE_KRN_CPU_AMX_MATMUL_H

#include <pthread.h>

#include "kernels/cpu/amx_tile.h"
#include "kernels/cpu/matmul_rows.h"
#include "kernels/cpu/simd_vec.h"
#include "kernels/cpu/simd_wblock.h"

// Below this many activation rows a matmul is a decode step: the avx512 path reads each weight once per call
// anyway, and 32-row tiles would mostly multiply padding. Not measured (no AMX CPU at hand): a guess at the
// crossover, to be tuned where AMX runs.
#define AMX_MIN_ROWS 32
#define AMX_COLS 32 // weight rows per panel: two tiles of 16 columns
#define AMX_ROWS 32 // activation rows per step: two tiles of 16 rows

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
  mr_act xa;      // x quantized, rows n .. n_pad - 1 zero
  int n, n_pad, k, m;
} amx_task;

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
      if ((wt == KRN_Q4_K || wt == KRN_Q5_K) && b % 8 == 0)
        kq_scales((const krn_block_q4_k *)((const char *)wr + (size_t)(b / 8) * (wt == KRN_Q4_K ? sizeof(krn_block_q4_k)
                                                                                              : sizeof(krn_block_q5_k))),
                  kd, km);
      __m256i wa, wq = _mm256_setzero_si256();
      __m256 vd;
      float mw;
      load_wblock(wr, wt, b, b % 8, kd, km, &wa, &wq, &vd, &mw);
      int32_t lanes[8];
      float ds[8];
      _mm256_storeu_si256((__m256i *)lanes, wt_signed(wt) ? wq : wa);
      _mm256_storeu_ps(ds, vd);
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

// Activation rows [i0, i0 + AMX_ROWS) against panel p (weight rows [j0, j0 + AMX_COLS)), into y.
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
  int rows = t->n - i0 < AMX_ROWS ? t->n - i0 : AMX_ROWS;
  int cols = t->m - j0 < AMX_COLS ? (int)(t->m - j0) : AMX_COLS;
  for (int r = 0; r < rows; r++) memcpy(t->y + (size_t)(i0 + r) * t->m + j0, acc[r], (size_t)cols * sizeof(float));
}

// Panels [lo, hi) of weight type wt against every activation row.
KRN_INLINE void amx_panels(const amx_task *t, krn_type wt, int64_t lo, int64_t hi) {
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
    amx_pack(t, wt, pi * AMX_COLS, &p);
    for (int i0 = 0; i0 < t->n; i0 += AMX_ROWS) amx_step(&R, t, wt, &p, i0, pi * AMX_COLS);
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

typedef struct amx_quant_task {
  const mr_act *xa;
  const float *x;
  int n, k;
} amx_quant_task;

static void amx_quant_run(void *vp, int ith, int nth) {
  const amx_quant_task *q = vp;
  int64_t lo, hi;
  krn_cpu_range(q->n, ith, nth, &lo, &hi);
  for (int64_t i = lo; i < hi; i++) mr_quant_row(q->xa, q->x + (size_t)i * q->k, q->k, i);
}

static void amx_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  if (n < AMX_MIN_ROWS || krn_cpu_is_float(wt) || !krn_cpu_mm_ok(wt, n, k, m)) {
    krn_cpu_avx512_table()->matmul(c, y, w, wt, x, n, k, m); // which also answers bad shapes with NaN
    return;
  }
  amx_task t = {y, w, wt, {0}, n, (n + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS, k, m};
  int nbp = (k / KRN_QK + MR_CH - 1) / MR_CH * MR_CH;
  size_t per = (size_t)nbp * (KRN_QK + 2 * sizeof(float)); // one row's qs, d and s
  void *buf = aligned_alloc(64, ((size_t)t.n_pad * per + 63) / 64 * 64);
  if (!buf) abort(); // the activation's own size: only impossible sizes fail here
  t.xa.qs = buf;
  t.xa.d = (float *)((char *)buf + (size_t)t.n_pad * nbp * KRN_QK);
  t.xa.s = t.xa.d + (size_t)t.n_pad * nbp;
  t.xa.nbp = nbp;
  t.xa.u8 = 0; // TDPBSSD: signed activation bytes for every weight form
  // the padding rows multiply as zeros (their products are never stored)
  memset(t.xa.qs + (size_t)n * nbp * KRN_QK, 0, (size_t)(t.n_pad - n) * nbp * KRN_QK);
  memset(t.xa.d + (size_t)n * nbp, 0, (size_t)(t.n_pad - n) * nbp * sizeof(float));
  memset(t.xa.s + (size_t)n * nbp, 0, (size_t)(t.n_pad - n) * nbp * sizeof(float));
  amx_quant_task q = {&t.xa, x, n, k};
  krn_cpu_par(c, amx_quant_run, &q);
  krn_cpu_par(c, amx_run, &t);
  free(buf);
}

// The table: the avx512 table with its name and matmul replaced. Built on first use because the avx512 ops are
// static in backend_avx512.c (a constant initializer cannot name them); written once under pthread_once, read-only
// after, so every caller sees the same complete table.
static krn_backend amx_backend;
static pthread_once_t amx_backend_once = PTHREAD_ONCE_INIT;
static void amx_backend_build(void) {
  amx_backend = *krn_cpu_avx512_table();
  amx_backend.name = KRN_AMX_NAME;
  amx_backend.matmul = amx_matmul;
}
const krn_backend *KRN_AMX_TABLE(void) {
  pthread_once(&amx_backend_once, amx_backend_build);
  return &amx_backend;
}

#endif
