// kernels/cpu/simd_body.h: the AVX2 and AVX-512 backends' ops, written once over a small vector vocabulary.
// Included by backend_avx2.c (KRN_W512 undefined: 8-float vectors, maddubs dot products), backend_avx2vnni.c (the
// same with AVX-VNNI vpdpbusd dot products, KRN_AVXVNNI) and by
// backend_avx512.c (KRN_W512 defined: 16-float vectors, VNNI vpdpbusd dot products on 256-bit blocks).
// Defines one table; the including file names it KRN_SIMD_TABLE and its name string KRN_SIMD_NAME.
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define KRN_INLINE static inline __attribute__((always_inline))

// ---- float vectors ----
#ifdef KRN_W512
typedef __m512 vf;
#define VL 16
#define v_load(p) _mm512_loadu_ps(p)
#define v_store(p, v) _mm512_storeu_ps(p, v)
#define v_loadh(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define v_set1(x) _mm512_set1_ps(x)
#define v_zero() _mm512_setzero_ps()
#define v_add(a, b) _mm512_add_ps(a, b)
#define v_sub(a, b) _mm512_sub_ps(a, b)
#define v_mul(a, b) _mm512_mul_ps(a, b)
#define v_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define v_max(a, b) _mm512_max_ps(a, b)
#define v_min(a, b) _mm512_min_ps(a, b)
#define v_div(a, b) _mm512_div_ps(a, b)
#define v_hsum(v) _mm512_reduce_add_ps(v)
#define v_hmax(v) _mm512_reduce_max_ps(v)
KRN_INLINE vf v_exp(vf x) {
  __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
  vf fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vf r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  vf y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
  return _mm512_mask_blend_ps(under, y, _mm512_setzero_ps());
}
#else
typedef __m256 vf;
#define VL 8
#define v_load(p) _mm256_loadu_ps(p)
#define v_store(p, v) _mm256_storeu_ps(p, v)
#define v_loadh(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define v_set1(x) _mm256_set1_ps(x)
#define v_zero() _mm256_setzero_ps()
#define v_add(a, b) _mm256_add_ps(a, b)
#define v_sub(a, b) _mm256_sub_ps(a, b)
#define v_mul(a, b) _mm256_mul_ps(a, b)
#define v_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define v_max(a, b) _mm256_max_ps(a, b)
#define v_min(a, b) _mm256_min_ps(a, b)
#define v_div(a, b) _mm256_div_ps(a, b)
KRN_INLINE float v_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
KRN_INLINE float v_hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
KRN_INLINE vf v_exp(vf x) {
  __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
  vf fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vf r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  vf y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, y);
}
#endif

KRN_INLINE float f16f(krn_f16 h) { return _cvtsh_ss(h); }

// ---- int8 block dot products: 8 int32 partial sums of u8(a) * s8(b) over 32 bytes ----
#ifdef KRN_W512
KRN_INLINE __m256i dot_us(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
#elif defined(KRN_AVXVNNI)
KRN_INLINE __m256i dot_us(__m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s); }
#else
KRN_INLINE __m256i dot_us(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
#endif

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

KRN_INLINE void mm_rows_f(const mm_task *t, krn_type wt, int64_t j, int i0, int R) {
  const void *wr = (const char *)t->w + (size_t)j * krn_row_size(wt, t->k);
  const float *xr[MM_TILE];
  float out[MM_TILE];
  for (int r = 0; r < R; r++) xr[r] = t->x + (size_t)(i0 + r) * t->k;
  dot_float(wr, wt, xr, R, t->k, out);
  for (int r = 0; r < R; r++) t->y[(size_t)(i0 + r) * t->m + j] = out[r];
}

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

static void mm_run(void *vp, int ith, int nth) {
  const mm_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range(t->m, ith, nth, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += MM_JBLOCK) {
    int64_t j1 = j0 + MM_JBLOCK < hi ? j0 + MM_JBLOCK : hi;
    // one instance per type, so that the type's branches fold away inside the loops
    switch (t->wt) {
    case KRN_Q4_0: mm_block_q(t, KRN_Q4_0, j0, j1, MR_W); break;
    case KRN_Q4_1: mm_block_q(t, KRN_Q4_1, j0, j1, MR_W); break;
    case KRN_Q5_0: mm_block_q(t, KRN_Q5_0, j0, j1, MR_W); break;
    case KRN_Q5_1: mm_block_q(t, KRN_Q5_1, j0, j1, MR_W); break;
    // Q8_0 below a full activation tile (decode) reads one weight row at a time: the widest weight stream, and two
    // rows read side by side ran at half speed from DRAM on an AMD EPYC (Zen 4); the results are the same either way
    case KRN_Q8_0:
      if (t->n < MR_R) mm_block_q(t, KRN_Q8_0, j0, j1, 1);
      else mm_block_q(t, KRN_Q8_0, j0, j1, MR_W);
      break;
    case KRN_Q4_K: mm_block_q(t, KRN_Q4_K, j0, j1, MR_W); break;
    case KRN_Q5_K: mm_block_q(t, KRN_Q5_K, j0, j1, MR_W); break;
    case KRN_Q6_K: mm_block_q(t, KRN_Q6_K, j0, j1, MR_W); break;
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

// Below this many multiply-adds an op runs on the calling thread: waking the pool would cost more.
#define KRN_PAR_MIN 32768

static void simd_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  if (!krn_cpu_mm_ok(wt, n, k, m)) { if (n > 0 && m > 0) krn_cpu_fill_nan(y, (int64_t)n * m); return; }
  mm_task t = {y, w, wt, x, {0}, n, k, m};
  int par = (int64_t)n * k * m >= KRN_PAR_MIN;
  void *buf = NULL;
  if (!krn_cpu_is_float(wt)) {
    int nbp = (k / KRN_QK + MR_CH - 1) / MR_CH * MR_CH;
    size_t per = (size_t)nbp * (KRN_QK + 2 * sizeof(float)); // one row's qs, d and s
    buf = aligned_alloc(64, ((size_t)n * per + 63) / 64 * 64 + 64);
    if (!buf) abort(); // the activation's own size: only impossible sizes fail here
    t.xa.qs = buf;
    t.xa.d = (float *)((char *)buf + (size_t)n * nbp * KRN_QK);
    t.xa.s = t.xa.d + (size_t)n * nbp;
    t.xa.nbp = nbp;
    t.xa.u8 = MR_U8 && wt_signed(wt);
    q8_task q = {&t.xa, x, n, k};
    if (par && n >= 8) krn_cpu_par(c, q8_run, &q);
    else q8_run(&q, 0, 1);
  }
  if (par) krn_cpu_par(c, mm_run, &t);
  else mm_run(&t, 0, 1);
  free(buf);
}

// ---- elementwise ----

typedef struct ew_task {
  float *out;
  const float *a, *b;
  int64_t n;      // elements (swiglu / add), or rows (rmsnorm / softmax)
  int d;          // row width (rmsnorm / softmax)
  float eps;
} ew_task;

static void rmsnorm_rows(const ew_task *t, int64_t lo, int64_t hi) {
  int d = t->d;
  for (int64_t i = lo; i < hi; i++) {
    const float *x = t->a + (size_t)i * d;
    float *o = t->out + (size_t)i * d;
    vf acc = v_zero();
    int e = 0;
    for (; e + VL <= d; e += VL) { vf v = v_load(x + e); acc = v_fma(v, v, acc); }
    float ss = v_hsum(acc);
    for (int j = e; j < d; j++) ss += x[j] * x[j];
    float inv = 1.0f / sqrtf(ss / (float)d + t->eps);
    vf vi = v_set1(inv);
    for (e = 0; e + VL <= d; e += VL) v_store(o + e, v_mul(v_mul(v_load(x + e), vi), v_load(t->b + e)));
    for (int j = e; j < d; j++) o[j] = x[j] * inv * t->b[j];
  }
}
static void rmsnorm_run(void *vp, int ith, int nth) {
  const ew_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range(t->n, ith, nth, &lo, &hi);
  rmsnorm_rows(t, lo, hi);
}
static void simd_rmsnorm(krn_ctx *c, float *out, const float *x, const float *w, int n, int d, float eps) {
  ew_task t = {out, x, w, n, d, eps};
  if ((int64_t)n * d >= KRN_PAR_MIN && n > 1) krn_cpu_par(c, rmsnorm_run, &t);
  else rmsnorm_rows(&t, 0, n);
}

// Split n elements into per-thread ranges aligned to 64 elements.
static void ew_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
  int64_t chunks = (n + 63) / 64, clo, chi;
  krn_cpu_range(chunks, ith, nth, &clo, &chi);
  *lo = clo * 64 < n ? clo * 64 : n;
  *hi = chi * 64 < n ? chi * 64 : n;
}

static void swiglu_span(const ew_task *t, int64_t lo, int64_t hi) {
  int64_t i = lo;
  const vf one = v_set1(1.0f), zero = v_zero();
  for (; i + VL <= hi; i += VL) {
    vf g = v_load(t->a + i);
    vf s = v_div(g, v_add(one, v_exp(v_sub(zero, g))));
    v_store(t->out + i, v_mul(s, v_load(t->b + i)));
  }
  for (; i < hi; i++) { float g = t->a[i]; t->out[i] = g / (1.0f + expf(-g)) * t->b[i]; }
}
static void swiglu_run(void *vp, int ith, int nth) {
  const ew_task *t = vp;
  int64_t lo, hi;
  ew_range(t->n, ith, nth, &lo, &hi);
  swiglu_span(t, lo, hi);
}
static void simd_swiglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n) {
  ew_task t = {out, gate, up, n, 0, 0};
  if (n >= 4 * KRN_PAR_MIN) krn_cpu_par(c, swiglu_run, &t);
  else swiglu_span(&t, 0, n);
}

// gelu's tanh approximation as the scalar reference writes it, 0.5 g (1 + tanh(z)) with z = sqrt(2 / pi) g (1 +
// 0.044715 g^2), is g * sigmoid(2 z) = g / (1 + exp(-2 z)): swiglu's shape with another exponent, so the same v_exp
// serves (its clamp keeps exp finite: a large negative g gives g / 3.4e38, ~0, where the reference gives -0).
static void geglu_span(const ew_task *t, int64_t lo, int64_t hi) {
  int64_t i = lo;
  const float k2 = -2.0f * 0.7978845608028654f; // -2 sqrt(2 / pi)
  const vf one = v_set1(1.0f), vk2 = v_set1(k2), c = v_set1(0.044715f);
  for (; i + VL <= hi; i += VL) {
    vf g = v_load(t->a + i);
    vf z = v_mul(v_mul(vk2, g), v_fma(v_mul(c, g), g, one));
    v_store(t->out + i, v_mul(v_div(g, v_add(one, v_exp(z))), v_load(t->b + i)));
  }
  if (i < hi) krn_scalar_geglu(NULL, t->out + i, t->a + i, t->b + i, hi - i);
}
static void geglu_run(void *vp, int ith, int nth) {
  const ew_task *t = vp;
  int64_t lo, hi;
  ew_range(t->n, ith, nth, &lo, &hi);
  geglu_span(t, lo, hi);
}
static void simd_geglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n) {
  ew_task t = {out, gate, up, n, 0, 0};
  if (n >= 4 * KRN_PAR_MIN) krn_cpu_par(c, geglu_run, &t);
  else geglu_span(&t, 0, n);
}

static void add_span(const ew_task *t, int64_t lo, int64_t hi) {
  int64_t i = lo;
  for (; i + VL <= hi; i += VL) v_store(t->out + i, v_add(v_load(t->out + i), v_load(t->a + i)));
  for (; i < hi; i++) t->out[i] += t->a[i];
}
static void add_run(void *vp, int ith, int nth) {
  const ew_task *t = vp;
  int64_t lo, hi;
  ew_range(t->n, ith, nth, &lo, &hi);
  add_span(t, lo, hi);
}
static void simd_add(krn_ctx *c, float *y, const float *x, int64_t n) {
  ew_task t = {y, x, NULL, n, 0, 0};
  if (n >= 8 * KRN_PAR_MIN) krn_cpu_par(c, add_run, &t);
  else add_span(&t, 0, n);
}

// In place on r(d): r = exp(r - max) / sum.
static void softmax_row(float *r, int d) {
  vf vm = v_set1(-INFINITY);
  int e = 0;
  for (; e + VL <= d; e += VL) vm = v_max(vm, v_load(r + e));
  float mx = v_hmax(vm);
  for (int j = e; j < d; j++) mx = fmaxf(mx, r[j]);
  vf vmx = v_set1(mx), acc = v_zero();
  for (e = 0; e + VL <= d; e += VL) {
    vf v = v_exp(v_sub(v_load(r + e), vmx));
    v_store(r + e, v);
    acc = v_add(acc, v);
  }
  float sum = v_hsum(acc);
  for (int j = e; j < d; j++) { r[j] = expf(r[j] - mx); sum += r[j]; }
  float inv = 1.0f / sum;
  vf vi = v_set1(inv);
  for (e = 0; e + VL <= d; e += VL) v_store(r + e, v_mul(v_load(r + e), vi));
  for (int j = e; j < d; j++) r[j] *= inv;
}
static void softmax_run(void *vp, int ith, int nth) {
  const ew_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range(t->n, ith, nth, &lo, &hi);
  for (int64_t i = lo; i < hi; i++) softmax_row(t->out + (size_t)i * t->d, t->d);
}
static void simd_softmax(krn_ctx *c, float *x, int n, int d) {
  ew_task t = {x, NULL, NULL, n, d, 0};
  if ((int64_t)n * d >= KRN_PAR_MIN && n > 1) krn_cpu_par(c, softmax_run, &t);
  else softmax_run(&t, 0, 1);
}

// ---- rope and kv_store: the scalar loops, spread over the pool by rows (the same arithmetic, so the same bits) ----

typedef struct rope_task {
  float *x;
  const int32_t *pos;
  int n, n_head, head_dim, neox;
  const float *inv_freq; // (head_dim / 2)
  float mscale;
} rope_task;
static void rope_run(void *vp, int ith, int nth) {
  const rope_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range(t->n, ith, nth, &lo, &hi);
  krn_scalar_rope_span(t->x, t->pos, (int)lo, (int)hi, t->n_head, t->head_dim, t->inv_freq, t->mscale, t->neox);
}
static void rope_rows(krn_ctx *c, rope_task *t) {
  if ((int64_t)t->n * t->n_head * t->head_dim >= KRN_PAR_MIN && t->n > 1) krn_cpu_par(c, rope_run, t);
  else rope_run(t, 0, 1);
}
static void simd_rope(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta, int neox) {
  float *f = krn_scalar_rope_inv_freq(theta, head_dim);
  rope_task t = {x, pos, n, n_head, head_dim, neox, f, 1.0f};
  rope_rows(c, &t);
  free(f);
}
static void simd_rope_freqs(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim,
                            const float *inv_freq, float mscale, int neox) {
  rope_task t = {x, pos, n, n_head, head_dim, neox, inv_freq, mscale};
  rope_rows(c, &t);
}

#ifdef KRN_W512
#define v_storeh(p, v) _mm256_storeu_si256((__m256i *)(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#else
#define v_storeh(p, v) _mm_storeu_si128((__m128i *)(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#endif
typedef struct kvs_task {
  const float *k, *v;
  const krn_attn_args *a;
} kvs_task;
static void kvs_run(void *vp, int ith, int nth) {
  const kvs_task *t = vp;
  const krn_attn_args *a = t->a;
  int kvd = a->n_kv_head * a->head_dim;
  int64_t lo, hi;
  krn_cpu_range(a->n_tokens, ith, nth, &lo, &hi);
  for (int64_t i = lo; i < hi; i++) {
    int32_t blk = krn_cpu_block_of(a, a->tok_seq[i], a->tok_pos[i]);
    if (blk < 0) continue; // outside the sequence's block table: nothing to write
    size_t off = ((size_t)blk * a->block_size + (size_t)(a->tok_pos[i] % a->block_size)) * kvd;
    const float *kt = t->k + (size_t)i * kvd, *vt = t->v + (size_t)i * kvd;
    if (a->kv_type == KRN_F32) {
      memcpy((float *)a->k_cache + off, kt, (size_t)kvd * sizeof(float));
      memcpy((float *)a->v_cache + off, vt, (size_t)kvd * sizeof(float));
      continue;
    }
    krn_f16 *kc = (krn_f16 *)a->k_cache + off, *vc = (krn_f16 *)a->v_cache + off;
    int j = 0;
    for (; j + VL <= kvd; j += VL) { v_storeh(kc + j, v_load(kt + j)); v_storeh(vc + j, v_load(vt + j)); }
    for (; j < kvd; j++) { kc[j] = krn_f32_to_f16(kt[j]); vc[j] = krn_f32_to_f16(vt[j]); }
  }
}
static void simd_kv_store(krn_ctx *c, const float *k, const float *v, const krn_attn_args *a) {
  if (!krn_cpu_attn_ok(a)) return; // nothing sensible to write
  kvs_task t = {k, v, a};
  if ((int64_t)a->n_tokens * a->n_kv_head * a->head_dim >= KRN_PAR_MIN && a->n_tokens > 1) krn_cpu_par(c, kvs_run, &t);
  else kvs_run(&t, 0, 1);
}

// ---- paged attention, tiled ----
// A tile is up to ATT_ROWS query rows that read the same K and V: the G = n_head / n_kv_head heads of one kv head,
// for up to ATT_ROWS / G consecutive batch rows of one sequence (a prefill chunk's tokens; a decode row alone).
// Each KV block the tile sees is converted to f32 once and read by all of the tile's rows, and the scores come out of
// a register micro-tile (ATT_QR rows x 4 positions) instead of one horizontal sum per (row, position). Work items are
// (tile, kv head) pairs, taken from a shared counter, last tile first (causal tiles grow along the batch).
#define ATT_ROWS 16     // query rows per tile (at least G: one token's heads always share a tile)
#define ATT_QR (VL / 4) // rows of the score micro-tile: ATT_QR x 4 positions = VL scores, one vector
#define ATT_PR 4        // rows of the P.V micro-tile (x 2 vectors of dimensions)

typedef struct attn_task {
  float *out;             // (n_tokens, n_head, head_dim)
  const float *q;         // (n_tokens, n_head, head_dim)
  const krn_attn_args *a; // (borrowed)
  const int32_t *tiles;   // (n_tiles + 1) first batch row of each tile, then n_tokens
  int n_tiles, tile_rows; // tile_rows: ATT_ROWS rounded down to whole tokens (G rows each), at least G
  int64_t next;           // next work item (shared counter; items count down from n_tiles * n_kv_head)
} attn_task;

// VL vectors in, one out: lane i is the sum of the lanes of a[i].
#ifdef KRN_W512
KRN_INLINE __m512 att_pairs(__m512 a, __m512 b) { // a's 8 partial sums in the low half, b's in the high half
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
KRN_INLINE __m512 att_hadd(__m512 x, __m512 y) { // per 128-bit lane: x0+x1, x2+x3, y0+y1, y2+y3
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
}
KRN_INLINE vf v_hsums(const vf *a) {
  // the pairing order makes the last step's lanes come out as 0, 1, ..., 15
  __m512 lo = att_hadd(att_hadd(att_pairs(a[0], a[4]), att_pairs(a[1], a[5])),
                       att_hadd(att_pairs(a[2], a[6]), att_pairs(a[3], a[7])));
  __m512 hi = att_hadd(att_hadd(att_pairs(a[8], a[12]), att_pairs(a[9], a[13])),
                       att_hadd(att_pairs(a[10], a[14]), att_pairs(a[11], a[15])));
  return _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, 0x88), _mm512_shuffle_f32x4(lo, hi, 0xDD));
}
#else
KRN_INLINE vf v_hsums(const vf *a) {
  __m256 s03 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  __m256 s47 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s03, s47, 0x20), _mm256_permute2f128_ps(s03, s47, 0x31));
}
#endif

// sc[r * ss + p] = scale * q_r . k_p for ATT_QR rows q (stride hd) and 4 rows k (stride hd).
KRN_INLINE void att_scores(float *sc, size_t ss, const float *q, const float *k, int hd, float scale) {
  vf acc[VL];
#pragma GCC unroll 16
  for (int i = 0; i < VL; i++) acc[i] = v_zero();
  int e = 0;
  for (; e + VL <= hd; e += VL) {
    vf k0 = v_load(k + e), k1 = v_load(k + hd + e), k2 = v_load(k + 2 * hd + e), k3 = v_load(k + 3 * hd + e);
#pragma GCC unroll 4
    for (int r = 0; r < ATT_QR; r++) {
      vf qv = v_load(q + (size_t)r * hd + e);
      acc[4 * r] = v_fma(qv, k0, acc[4 * r]);
      acc[4 * r + 1] = v_fma(qv, k1, acc[4 * r + 1]);
      acc[4 * r + 2] = v_fma(qv, k2, acc[4 * r + 2]);
      acc[4 * r + 3] = v_fma(qv, k3, acc[4 * r + 3]);
    }
  }
  float s[VL];
  v_store(s, v_hsums(acc));
  for (int r = 0; r < ATT_QR; r++)
    for (int p = 0; p < 4; p++) {
      float x = s[4 * r + p];
      for (int j = e; j < hd; j++) x += q[(size_t)r * hd + j] * k[(size_t)p * hd + j];
      sc[(size_t)r * ss + p] = x * scale;
    }
}

// o_r[d, d + n VL) += sum over np positions of w_r[p] v_p, for ATT_PR rows o (stride hd), weights w (stride ss) and
// values v (stride hd); n is 2 or 1 vectors.
KRN_INLINE void att_pv(float *o, const float *w, size_t ss, const float *v, int np, int hd, int d, int n) {
  vf acc[ATT_PR][2];
#pragma GCC unroll 4
  for (int r = 0; r < ATT_PR; r++) {
    acc[r][0] = v_load(o + (size_t)r * hd + d);
    acc[r][1] = n > 1 ? v_load(o + (size_t)r * hd + d + VL) : v_zero();
  }
  for (int p = 0; p < np; p++) {
    vf v0 = v_load(v + (size_t)p * hd + d), v1 = n > 1 ? v_load(v + (size_t)p * hd + d + VL) : v_zero();
#pragma GCC unroll 4
    for (int r = 0; r < ATT_PR; r++) {
      vf wr = v_set1(w[(size_t)r * ss + p]);
      acc[r][0] = v_fma(wr, v0, acc[r][0]);
      acc[r][1] = v_fma(wr, v1, acc[r][1]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < ATT_PR; r++) {
    v_store(o + (size_t)r * hd + d, acc[r][0]);
    if (n > 1) v_store(o + (size_t)r * hd + d + VL, acc[r][1]);
  }
}

// Rows n0 .. n0 + n (stride kvd, kv_type) of one kv head's cache block into f32 rows (stride hd); rows n .. n4 zero.
static void att_rows_f32(float *dst, const char *src, int f16, int kvd, int hd, int n, int n4) {
  for (int p = 0; p < n; p++) {
    float *d = dst + (size_t)p * hd;
    if (f16) {
      const krn_f16 *s = (const krn_f16 *)src + (size_t)p * kvd;
      int e = 0;
      for (; e + VL <= hd; e += VL) v_store(d + e, v_loadh(s + e));
      for (; e < hd; e++) d[e] = f16f(s[e]);
    } else {
      memcpy(d, (const float *)src + (size_t)p * kvd, (size_t)hd * sizeof(float));
    }
  }
  if (n4 > n) memset(dst + (size_t)n * hd, 0, (size_t)(n4 - n) * hd * sizeof(float));
}

typedef struct attn_scratch {
  float *q, *o;  // (tile_rows padded to ATT_PR and ATT_QR, hd) the tile's query rows and outputs
  float *sc;     // (same rows, span) scores, then probabilities
  float *kv;     // (block_size padded to 4, hd) one block's K or V rows in f32
  size_t span;   // positions a tile can cover: max_blocks * block_size
} attn_scratch;

static void attn_tile(const attn_task *t, const attn_scratch *s, int tile, int kh) {
  const krn_attn_args *a = t->a;
  int hd = a->head_dim, G = a->n_head / a->n_kv_head, kvd = a->n_kv_head * hd, bs = a->block_size;
  int f16 = a->kv_type != KRN_F32;
  size_t esz = f16 ? 2 : 4, ss = s->span;
  int r0 = t->tiles[tile], nt = t->tiles[tile + 1] - r0, R = nt * G;
  int Rp = (R + ATT_PR - 1) / ATT_PR * ATT_PR; // ATT_PR is a multiple of ATT_QR
  int32_t seq = a->tok_seq[r0];
  // the tile's positions: from the first any row sees to the last any row sees
  int32_t plo = INT32_MAX, phi = 0, cap = a->max_blocks * bs;
  for (int i = 0; i < nt; i++) {
    int32_t pos = a->tok_pos[r0 + i], lo = krn_cpu_first_visible(a, pos), hi = pos + 1 < cap ? pos + 1 : cap;
    if (seq < 0 || pos < 0 || lo >= hi) continue;
    if (lo < plo) plo = lo;
    if (hi > phi) phi = hi;
  }
  for (int i = 0; i < nt; i++)
    for (int g = 0; g < G; g++)
      memset(t->out + ((size_t)(r0 + i) * a->n_head + kh * G + g) * hd, 0, (size_t)hd * sizeof(float));
  if (plo >= phi) return; // nothing visible to any row
  plo = plo / bs * bs;
  const int32_t *bt = a->block_tables + (size_t)seq * a->max_blocks;
  for (int i = 0; i < nt; i++)
    for (int g = 0; g < G; g++)
      memcpy(s->q + ((size_t)i * G + g) * hd, t->q + ((size_t)(r0 + i) * a->n_head + kh * G + g) * hd,
             (size_t)hd * sizeof(float));
  memset(s->q + (size_t)R * hd, 0, (size_t)(Rp - R) * hd * sizeof(float));
  // scores, block by block; a block the table does not hold (slid out of a window) scores -inf
  for (int32_t p0 = plo; p0 < phi; p0 += bs) {
    int32_t blk = bt[p0 / bs], np = p0 + bs < phi ? bs : phi - p0, np4 = (np + 3) / 4 * 4;
    float *sc0 = s->sc + (p0 - plo);
    if (blk < 0) {
      for (int r = 0; r < Rp; r++)
        for (int p = 0; p < np; p++) sc0[(size_t)r * ss + p] = -INFINITY;
      continue;
    }
    att_rows_f32(s->kv, (const char *)a->k_cache + ((size_t)blk * bs * kvd + (size_t)kh * hd) * esz, f16, kvd, hd, np,
                 np4);
    for (int r = 0; r < Rp; r += ATT_QR)
      for (int p = 0; p < np4; p += 4) {
        if (p + 4 <= np) {
          att_scores(sc0 + (size_t)r * ss + p, ss, s->q + (size_t)r * hd, s->kv + (size_t)p * hd, hd, a->scale);
        } else { // the block's last positions: scores past np land in a side buffer
          float tmp[ATT_QR * 4];
          att_scores(tmp, 4, s->q + (size_t)r * hd, s->kv + (size_t)p * hd, hd, a->scale);
          for (int rr = 0; rr < ATT_QR; rr++)
            for (int pp = p; pp < np; pp++) sc0[(size_t)(r + rr) * ss + pp] = tmp[rr * 4 + pp - p];
        }
      }
  }
  // each row's softmax over its own positions [lo, hi), in whole vectors from lo: a row's probabilities then depend on
  // nothing but the row (not on which rows share its tile), so prefill in one step, in chunks and decode agree to the bit
  int32_t n = phi - plo;
  for (int r = 0; r < Rp; r++) {
    float *row = s->sc + (size_t)r * ss;
    int32_t pos = r < R ? a->tok_pos[r0 + r / G] : -1, lo = 0, hi = 0;
    if (r < R && seq >= 0 && pos >= 0) {
      lo = krn_cpu_first_visible(a, pos) - plo, hi = pos + 1 - plo;
      if (hi > n) hi = n;
    }
    float mx = -INFINITY;
    for (int32_t p = lo; p < hi; p++) mx = row[p] > mx ? row[p] : mx;
    if (lo >= hi || mx == -INFINITY) { memset(row, 0, (size_t)n * sizeof(float)); continue; } // nothing visible
    int32_t end = lo + (hi - lo + VL - 1) / VL * VL; // at most n + VL - 1: the row's stride has VL to spare
    for (int32_t p = hi; p < end; p++) row[p] = -INFINITY;
    vf vmx = v_set1(mx), acc = v_zero();
    for (int32_t p = lo; p < end; p += VL) {
      vf e = v_exp(v_sub(v_load(row + p), vmx));
      v_store(row + p, e);
      acc = v_add(acc, e);
    }
    vf vi = v_set1(1.0f / v_hsum(acc));
    for (int32_t p = lo; p < end; p += VL) v_store(row + p, v_mul(v_load(row + p), vi));
    memset(row, 0, (size_t)lo * sizeof(float));
    if (end < n) memset(row + end, 0, (size_t)(n - end) * sizeof(float));
  }
  // out = P . V, block by block
  memset(s->o, 0, (size_t)Rp * hd * sizeof(float));
  for (int32_t p0 = plo; p0 < phi; p0 += bs) {
    int32_t blk = bt[p0 / bs], np = p0 + bs < phi ? bs : phi - p0;
    if (blk < 0) continue;
    att_rows_f32(s->kv, (const char *)a->v_cache + ((size_t)blk * bs * kvd + (size_t)kh * hd) * esz, f16, kvd, hd, np,
                 np);
    const float *w0 = s->sc + (p0 - plo);
    for (int r = 0; r < Rp; r += ATT_PR) {
      float *o = s->o + (size_t)r * hd;
      const float *w = w0 + (size_t)r * ss;
      int d = 0;
      for (; d + 2 * VL <= hd; d += 2 * VL) att_pv(o, w, ss, s->kv, np, hd, d, 2);
      for (; d + VL <= hd; d += VL) att_pv(o, w, ss, s->kv, np, hd, d, 1);
      for (; d < hd; d++)
        for (int rr = 0; rr < ATT_PR; rr++)
          for (int p = 0; p < np; p++) o[(size_t)rr * hd + d] += w[(size_t)rr * ss + p] * s->kv[(size_t)p * hd + d];
    }
  }
  for (int i = 0; i < nt; i++)
    for (int g = 0; g < G; g++)
      memcpy(t->out + ((size_t)(r0 + i) * a->n_head + kh * G + g) * hd, s->o + ((size_t)i * G + g) * hd,
             (size_t)hd * sizeof(float));
}

static void attn_run(void *vp, int ith, int nth) {
  (void)ith, (void)nth;
  attn_task *t = vp;
  const krn_attn_args *a = t->a;
  int64_t items = (int64_t)t->n_tiles * a->n_kv_head;
  size_t hd = (size_t)a->head_dim, rows = (size_t)(t->tile_rows + ATT_PR - 1) / ATT_PR * ATT_PR;
  attn_scratch s;
  s.span = (size_t)a->max_blocks * a->block_size + VL;
  size_t bs4 = (size_t)(a->block_size + 3) / 4 * 4;
  float *buf = malloc((2 * rows * hd + rows * s.span + bs4 * hd) * sizeof(float));
  if (!buf) abort(); // the tile's scratch: only impossible sizes fail here
  s.q = buf;
  s.o = s.q + rows * hd;
  s.sc = s.o + rows * hd;
  s.kv = s.sc + rows * s.span;
  for (;;) {
    int64_t it = __atomic_fetch_add(&t->next, 1, __ATOMIC_RELAXED);
    if (it >= items) break;
    it = items - 1 - it;
    attn_tile(t, &s, (int)(it / a->n_kv_head), (int)(it % a->n_kv_head));
  }
  free(buf);
}

static void simd_paged_attention(krn_ctx *c, float *out, const float *q, const krn_attn_args *a) {
  if (!krn_cpu_attn_ok(a)) { if (a->n_tokens > 0 && a->n_head > 0 && a->head_dim > 0) krn_cpu_fill_nan(out, (int64_t)a->n_tokens * a->n_head * a->head_dim); return; }
  if (a->n_tokens == 0) return;
  int G = a->n_head / a->n_kv_head, per = ATT_ROWS / G > 1 ? ATT_ROWS / G : 1;
  int32_t *tiles = malloc(((size_t)a->n_tokens + 1) * sizeof(int32_t));
  if (!tiles) abort(); // one index per batch row
  int n_tiles = 0;
  for (int i = 0; i < a->n_tokens;) { // consecutive rows of one sequence share a tile
    int j = i + 1;
    while (j < a->n_tokens && j - i < per && a->tok_seq[j] == a->tok_seq[i]) j++;
    tiles[n_tiles++] = i;
    i = j;
  }
  tiles[n_tiles] = a->n_tokens;
  attn_task t = {out, q, a, tiles, n_tiles, per * G, 0};
  int64_t work = 0;
  for (int i = 0; i < a->n_tokens; i++) work += (int64_t)(a->tok_pos[i] + 1) * a->n_head * a->head_dim;
  if (work >= KRN_PAR_MIN) krn_cpu_par(c, attn_run, &t);
  else attn_run(&t, 0, 1);
  free(tiles);
}

static const krn_backend simd_backend = {
    .name = KRN_SIMD_NAME,
    .alloc = krn_scalar_alloc,
    .free = krn_scalar_free,
    .upload = krn_scalar_upload,
    .download = krn_scalar_download,
    .sync = krn_scalar_sync,
    .matmul = simd_matmul,
    .get_rows = krn_scalar_get_rows,
    .rmsnorm = simd_rmsnorm,
    .rope = simd_rope,
    .swiglu = simd_swiglu,
    .softmax = simd_softmax,
    .add = simd_add,
    .kv_store = simd_kv_store,
    .paged_attention = simd_paged_attention,
    .ctx_init = NULL,
    .ctx_fini = NULL,
    .event_new = krn_scalar_event_new,
    .event_free = krn_scalar_event_noop,
    .event_record = krn_scalar_event_noop,
    .event_wait = krn_scalar_event_noop,
    .geglu = simd_geglu,
    .scale = krn_scalar_scale,
    .attn_window = 1,
    .rope_freqs = simd_rope_freqs,
};

const krn_backend *KRN_SIMD_TABLE(void) { return &simd_backend; }
