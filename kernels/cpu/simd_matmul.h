// kernels/cpu/simd_matmul.h: the SIMD backends' matmul (quantized weight blocks, float weights, the pool's split).
// Quantized weight blocks are unpacked for the int8 dot and tiled by matmul_rows.h (AVX2) or matmul_x16.h (AVX-512);
// float weights are dotted in F32.
#ifndef DSERVE_KRN_CPU_SIMD_MATMUL_H
#define DSERVE_KRN_CPU_SIMD_MATMUL_H

#include "kernels/cpu/simd_vec.h"

// ---- weight blocks: each 32 weights become 32 bytes for the u8 x s8 dot, in one of two forms ----
// Unsigned (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K): bytes q >= 0 with w = d q + m, so that
// dot(w, x) = d dx sum(q xq) + m sx, sx = dx sum(xq) being kept with the activation block.
// Signed (Q8_0, Q6_K): w = d q with q in [-127, 127] (Q8_0) or [-32, 31] (Q6_K); the u8 x s8 dot takes |q| and moves
// q's sign onto x. Q6_K has one scale per 16 weights, so the block scale is a vector: int32 lanes 0-3 of the dot
// sum elements 0-15, lanes 4-7 elements 16-31.
KRN_INLINE int wt_kquant(krn_type t) { return t == KRN_Q4_K || t == KRN_Q5_K || t == KRN_Q6_K; }
KRN_INLINE int wt_signed(krn_type t) { return t == KRN_Q8_0 || t == KRN_Q6_K; }

// The 16 bytes qs as 32 nibbles: low nibbles (elements 0-15), then high nibbles (16-31).
KRN_INLINE __m256i unpack_nibbles(const uint8_t *qs) {
  __m128i q = _mm_loadu_si128((const __m128i *)qs);
  __m128i lo = _mm_and_si128(q, _mm_set1_epi8(15)), hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(15));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// The 32 bits of qh (little-endian) as 32 bytes: byte j is 16 when bit j is set, else 0 (a q5 element's fifth bit).
KRN_INLINE __m256i unpack_bit4(const uint8_t *qh) {
  uint32_t bits;
  memcpy(&bits, qh, 4);
  // byte j takes byte j / 8 of bits (pshufb works per 128-bit lane; every lane holds all four bytes)
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), pick);
  const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL); // bit j % 8 in byte j
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel), _mm256_set1_epi8(16));
}

// Bytes of v shifted right by n (< 8) and masked: ((v >> n) & mask) per byte (16-bit shifts; the mask drops what
// crossed over from the neighbouring byte).
KRN_INLINE __m256i bytes_srl(__m256i v, int n, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(n)), _mm256_set1_epi8((char)mask));
}

// Q4_K / Q5_K super-block: sub-block s's weights are d_s q + m_s with d_s = d sc[s], m_s = -(dmin m[s]).
KRN_INLINE void kq_scales(const krn_block_q4_k *blk, float *ds, float *ms) {
  float d = f16f(blk->d), dmin = f16f(blk->dmin);
  for (int s = 0; s < 8; s++) {
    int sc, m;
    krn_k_scale_min(blk->scales, s, &sc, &m);
    ds[s] = d * (float)sc;
    ms[s] = -(dmin * (float)m);
  }
}

// 32-element block b (sub-block s = b % 8 of a K-quant, whose scales kd/km kq_scales decoded) of weight row wr:
// *wa the bytes the dot takes, *wq the signed weights (signed form), *vd the scale per int32 lane, *mw the offset.
KRN_INLINE void load_wblock(const void *wr, krn_type wt, int b, int s, const float *kd, const float *km, __m256i *wa,
                            __m256i *wq, __m256 *vd, float *mw) {
  *mw = 0;
  switch (wt) {
  case KRN_Q8_0: {
    const krn_block_q8_0 *blk = (const krn_block_q8_0 *)wr + b;
    *wq = _mm256_loadu_si256((const __m256i *)blk->qs);
    *wa = _mm256_sign_epi8(*wq, *wq);
    *vd = _mm256_set1_ps(f16f(blk->d));
  } break;
  case KRN_Q4_0: {
    const krn_block_q4_0 *blk = (const krn_block_q4_0 *)wr + b;
    float d = f16f(blk->d);
    *wa = unpack_nibbles(blk->qs);
    *vd = _mm256_set1_ps(d);
    *mw = -8.0f * d;
  } break;
  case KRN_Q4_1: {
    const krn_block_q4_1 *blk = (const krn_block_q4_1 *)wr + b;
    *wa = unpack_nibbles(blk->qs);
    *vd = _mm256_set1_ps(f16f(blk->d));
    *mw = f16f(blk->m);
  } break;
  case KRN_Q5_0: {
    const krn_block_q5_0 *blk = (const krn_block_q5_0 *)wr + b;
    float d = f16f(blk->d);
    *wa = _mm256_or_si256(unpack_nibbles(blk->qs), unpack_bit4(blk->qh));
    *vd = _mm256_set1_ps(d);
    *mw = -16.0f * d;
  } break;
  case KRN_Q5_1: {
    const krn_block_q5_1 *blk = (const krn_block_q5_1 *)wr + b;
    *wa = _mm256_or_si256(unpack_nibbles(blk->qs), unpack_bit4(blk->qh));
    *vd = _mm256_set1_ps(f16f(blk->d));
    *mw = f16f(blk->m);
  } break;
  case KRN_Q4_K: {
    const krn_block_q4_k *blk = (const krn_block_q4_k *)wr + b / 8;
    *wa = bytes_srl(_mm256_loadu_si256((const __m256i *)(blk->qs + 32 * (s / 2))), 4 * (s & 1), 15);
    *vd = _mm256_set1_ps(kd[s]);
    *mw = km[s];
  } break;
  case KRN_Q5_K: {
    const krn_block_q5_k *blk = (const krn_block_q5_k *)wr + b / 8;
    __m256i lo = bytes_srl(_mm256_loadu_si256((const __m256i *)(blk->qs + 32 * (s / 2))), 4 * (s & 1), 15);
    __m256i hi = _mm256_slli_epi16(bytes_srl(_mm256_loadu_si256((const __m256i *)blk->qh), s, 1), 4);
    *wa = _mm256_or_si256(lo, hi);
    *vd = _mm256_set1_ps(kd[s]);
    *mw = km[s];
  } break;
  case KRN_Q6_K: {
    const krn_block_q6_k *blk = (const krn_block_q6_k *)wr + b / 8;
    int h = s / 4, j = s % 4; // half of the super-block, 32-element group within it
    __m256i lo = bytes_srl(_mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32 * (j & 1))), 4 * (j >> 1), 15);
    __m256i hi = _mm256_slli_epi16(bytes_srl(_mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h)), 2 * j, 3), 4);
    *wq = _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
    *wa = _mm256_sign_epi8(*wq, *wq);
    float d = f16f(blk->d);
    *vd = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(d * (float)blk->scales[2 * s])),
                               _mm_set1_ps(d * (float)blk->scales[2 * s + 1]), 1);
  } break;
  default: break;
  }
}

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

typedef struct q8_task {
  const mr_act *xa;
  const float *x;
  int n, k;
} q8_task;

static void q8_run(void *vp, int ith, int nth) {
  const q8_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range(t->n, ith, nth, &lo, &hi);
  for (int64_t i = lo; i < hi; i++) mr_quant_row(t->xa, t->x + (size_t)i * t->k, t->k, i);
}

static void simd_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  if (!krn_cpu_mm_ok(wt, n, k, m)) { if (n > 0 && m > 0) krn_cpu_fill_nan(y, (int64_t)n * m); return; }
  mm_task t = {y, w, wt, x, {0}, n, k, m};
  int par = (int64_t)n * k * m >= KRN_PAR_MIN;
  void *buf = NULL;
  if (!krn_cpu_is_float(wt)) {
    int nbp = (k / KRN_QK + MR_CH - 1) / MR_CH * MR_CH;
    size_t per = (size_t)nbp * (KRN_QK + 4 * sizeof(float)); // one row's qs, d, s, c and c16
    buf = aligned_alloc(64, ((size_t)n * per + 63) / 64 * 64 + 64);
    if (!buf) abort(); // the activation's own size: only impossible sizes fail here
    t.xa.qs = buf;
    t.xa.d = (float *)((char *)buf + (size_t)n * nbp * KRN_QK);
    t.xa.s = t.xa.d + (size_t)n * nbp;
    t.xa.c = (int32_t *)(t.xa.s + (size_t)n * nbp);
    t.xa.c16 = t.xa.c + (size_t)n * nbp;
    t.xa.nbp = nbp;
    t.xa.u8 = MR_U8 && wt_signed(wt); // (matmul_x16.h takes the signed bytes: MR_U8 is 0 with AVX-512)
    q8_task q = {&t.xa, x, n, k};
    if (par && n >= 8) krn_cpu_par(c, q8_run, &q);
    else q8_run(&q, 0, 1);
  }
  if (par) krn_cpu_par(c, mm_run, &t);
  else mm_run(&t, 0, 1);
  free(buf);
}

#endif
