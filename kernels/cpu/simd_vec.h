// kernels/cpu/simd_vec.h: the SIMD backends' vector vocabulary (VL-float vectors, F16 loads, the u8 x s8 block dot).
// AVX2 (8 floats) or AVX-512 (KRN_W512: 16); every simd_*.h is written over it.
#ifndef DSERVE_KRN_CPU_SIMD_VEC_H
#define DSERVE_KRN_CPU_SIMD_VEC_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define KRN_INLINE static inline __attribute__((always_inline))

// Below this many multiply-adds an op runs on the calling thread: waking the pool would cost more.
#define KRN_PAR_MIN 32768

// ---- float vectors ----
#ifdef KRN_W512
typedef __m512 vf;
#define VL 16
#define v_load(p) _mm512_loadu_ps(p)
#define v_store(p, v) _mm512_storeu_ps(p, v)
#define v_loadh(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define v_loadq8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))) // VL int8s
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
#define v_loadq8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))) // VL int8s
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

// tanh(x) = 1 - 2 / (1 + exp(2x)): v_exp's clamps make it exactly -1 or 1 far out; near 0 its error is a few ulps of
// 1 (absolute, not relative), which is all the soft-caps that use it need.
KRN_INLINE vf v_tanh(vf x) {
  const vf one = v_set1(1.0f);
  return v_sub(one, v_div(v_set1(2.0f), v_add(one, v_exp(v_add(x, x)))));
}

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

#endif
