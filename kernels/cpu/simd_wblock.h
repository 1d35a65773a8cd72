// kernels/cpu/simd_wblock.h: one quantized weight block unpacked into int8 lanes with its scales (the SIMD matmul's
// dot and the amx tables' tile repack read weights through it, so every type's layout is decoded in one place).
#ifndef DSERVE_KRN_CPU_SIMD_WBLOCK_H
#define DSERVE_KRN_CPU_SIMD_WBLOCK_H

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

#endif
