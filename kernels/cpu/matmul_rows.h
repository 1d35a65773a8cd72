// kernels/cpu/matmul_rows.h: the AVX2 backends' quantized matmul, and the activation blocks every SIMD backend's
// quantized matmul reads (the AVX-512 backend's own matmul is matmul_x16.h). Tiles of one weight row x up to MR_R
// activation rows, each weight block unpacked once into registers and dotted against every activation row of the
// tile (row loop innermost), accumulating in registers. Included by simd_matmul.h; amx_matmul.h quantizes its
// activations with mr_quant_row.
//
// One block per 256-bit vector, maddubs + madd with the sign moved onto x for signed weights (Q8_0, Q6_K); with
// AVX-VNNI (KRN_AVXVNNI, the "avx2vnni" table) vpdpbusd, signed weights taking the activation as unsigned bytes
// xq + 128 (stored that way when quantizing) and starting the dot's int32 accumulator at -128 * sum(wq), computed
// once per weight block, so no sign fix-up runs per activation row. The offset term of the unsigned forms
// (sum_b m_b * sx_b) is gathered MR_CH blocks at a time and added with one vector multiply-add per (weight row,
// activation row) instead of a scalar one per block.
//
// Every (weight row, activation row) pair goes through the same sequence of operations whatever the tile shape
// (NW, R) or the batch, so a sequence's logits do not depend on the batch it runs in (tests/kernels checks it).
#ifndef DSERVE_KRN_CPU_MATMUL_ROWS_H
#define DSERVE_KRN_CPU_MATMUL_ROWS_H

#include "kernels/cpu/simd_wblock.h"

#define MR_PB 1 // 32-element blocks per integer vector
#define MR_CH 8 // blocks per offset chunk: one float vector of per-block offsets
#define MR_W 1  // weight rows per tile
typedef __m256i mr_vi;
#define MR_R 8 // activation rows per tile, at most
// Loops over the tile's rows are unrolled whole so that the accumulators live in registers (-O2 alone leaves
// some of them on the stack).
#define MR_UNROLL _Pragma("GCC unroll 16")

// Activation rows quantized for one matmul. Row i's block b: qs + (i * nbp + b) * 32, d[i * nbp + b],
// s[i * nbp + b]; blocks nb..nbp-1 are zero padding (qs 0, or 0x80 in the +128 form), so the last block pair and
// offset chunk need no bounds checks.
#if defined(KRN_AVXVNNI)
#define MR_U8 1 // signed weights meet the activation in its +128 form
#else
#define MR_U8 0
#endif

typedef struct mr_act {
  int8_t *qs; // (n, nbp * 32)
  float *d;   // (n, nbp) block scales
  float *s;   // (n, nbp) d * sum(qs) per block
  int32_t *c; // (n, nbp) -128 * sum(qs) per block (matmul_x16.h's correction for its q + 128 weight bytes)
  int32_t *c16; // (n, nbp) the same over the block's first 16 elements (Q6_K's half-block scales there)
  int nbp;    // blocks per row rounded up to MR_CH
  int u8;     // qs holds q + 128 (AVX-VNNI, signed weight types)
} mr_act;

// Quantize one 32-element block (round to nearest, d = max|x| / 127; same as krn_scalar_quant_row_q8x).
KRN_INLINE void mr_quant_block(const float *xb, int8_t *qs, float *d, float *s, int32_t *cs, int32_t *cs16, int u8) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 a = _mm256_loadu_ps(xb), b = _mm256_loadu_ps(xb + 8), c = _mm256_loadu_ps(xb + 16), e = _mm256_loadu_ps(xb + 24);
  __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a), _mm256_andnot_ps(sign, b)),
                            _mm256_max_ps(_mm256_andnot_ps(sign, c), _mm256_andnot_ps(sign, e)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float amax = _mm_cvtss_f32(m4), dd = amax / 127.0f, id = dd > 0 ? 1.0f / dd : 0.0f;
  __m256 vid = _mm256_set1_ps(id);
  __m256i ia = _mm256_cvtps_epi32(_mm256_mul_ps(a, vid)), ib = _mm256_cvtps_epi32(_mm256_mul_ps(b, vid));
  __m256i ic = _mm256_cvtps_epi32(_mm256_mul_ps(c, vid)), ie = _mm256_cvtps_epi32(_mm256_mul_ps(e, vid));
  __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(ia, ib), _mm256_add_epi32(ic, ie));
  __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
  s2 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0x4e));
  s2 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xb1));
  __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(ia, ib), _mm256_packs_epi32(ic, ie));
  p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if (u8) p8 = _mm256_xor_si256(p8, _mm256_set1_epi8((char)0x80));
  _mm256_storeu_si256((__m256i *)qs, p8);
  *d = dd;
  *s = dd * (float)_mm_cvtsi128_si32(s2);
  *cs = -128 * _mm_cvtsi128_si32(s2);
  __m256i l4 = _mm256_add_epi32(ia, ib); // elements 0-15
  __m128i l2 = _mm_add_epi32(_mm256_castsi256_si128(l4), _mm256_extracti128_si256(l4, 1));
  l2 = _mm_add_epi32(l2, _mm_shuffle_epi32(l2, 0x4e));
  l2 = _mm_add_epi32(l2, _mm_shuffle_epi32(l2, 0xb1));
  *cs16 = -128 * _mm_cvtsi128_si32(l2);
}

// Row i of x(k) into a's row i, padding included.
static void mr_quant_row(const mr_act *a, const float *x, int k, int64_t i) {
  int nb = k / KRN_QK;
  int8_t *qs = a->qs + (size_t)i * a->nbp * KRN_QK;
  float *d = a->d + (size_t)i * a->nbp, *s = a->s + (size_t)i * a->nbp;
  int32_t *c = a->c + (size_t)i * a->nbp, *c16 = a->c16 + (size_t)i * a->nbp;
  for (int b = 0; b < nb; b++)
    mr_quant_block(x + (size_t)b * KRN_QK, qs + (size_t)b * KRN_QK, d + b, s + b, c + b, c16 + b, a->u8);
  memset(qs + (size_t)nb * KRN_QK, a->u8 ? 0x80 : 0, (size_t)(a->nbp - nb) * KRN_QK);
  for (int b = nb; b < a->nbp; b++) {
    d[b] = s[b] = 0;
    c[b] = c16[b] = 0;
  }
}

// Lays a's arrays out for n rows of k elements in one 64-byte-aligned allocation, returned for free() (aborts on
// failure: the activation's own size, so only impossible sizes fail); u8 as mr_act.u8.
static void *mr_act_alloc(mr_act *a, int n, int k, int u8) {
  int nbp = (k / KRN_QK + MR_CH - 1) / MR_CH * MR_CH;
  size_t per = (size_t)nbp * (KRN_QK + 4 * sizeof(float)); // one row's qs, d, s, c and c16
  void *buf = aligned_alloc(64, ((size_t)n * per + 63) / 64 * 64 + 64);
  if (!buf) abort();
  a->qs = buf;
  a->d = (float *)((char *)buf + (size_t)n * nbp * KRN_QK);
  a->s = a->d + (size_t)n * nbp;
  a->c = (int32_t *)(a->s + (size_t)n * nbp);
  a->c16 = a->c + (size_t)n * nbp;
  a->nbp = nbp;
  a->u8 = u8;
  return buf;
}

// Rows of x(n, k) quantized into xa, a share per pool thread (krn_task_fn).
typedef struct mr_quant_task {
  const mr_act *xa;
  const float *x;
  int n, k;
} mr_quant_task;

static void mr_quant_run(void *vp, int ith, int nth) {
  const mr_quant_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range(t->n, ith, nth, &lo, &hi);
  for (int64_t i = lo; i < hi; i++) mr_quant_row(t->xa, t->x + (size_t)i * t->k, t->k, i);
}

#ifndef KRN_W512 // the AVX-512 backend multiplies in matmul_x16.h
// The int8 dot of a weight vector (wv: bytes as load_wblock's wa; AVX-VNNI signed: wq) with an activation vector,
// per int32 lane (4 bytes each). wc: signed weights in the +128 form: -128 * the lane's sum of wq; AVX2 signed: wq
// for the sign.
KRN_INLINE mr_vi mr_dot(mr_vi wv, mr_vi wc, mr_vi x, int sg) {
#if defined(KRN_AVXVNNI)
  return sg ? _mm256_dpbusd_avx_epi32(wc, x, wv) : _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), wv, x);
#else
  return dot_us(wv, sg ? _mm256_sign_epi8(x, wc) : x);
#endif
}


// out[w * MR_R + r] = dot(weight row wr[w], activation row i0 + r) for w < NW <= MR_W, r < R, over nb blocks of type
// wt (wt, NW and R are constants after inlining). wr[w] may repeat a row when fewer than NW are left.
KRN_INLINE void mr_tile(const void *const *wr, krn_type wt, const mr_act *xa, int i0, int NW, int R, int nb, float *out) {
  const int sg = wt_signed(wt), kq = wt_kquant(wt);
  const size_t kbytes = wt == KRN_Q4_K ? sizeof(krn_block_q4_k) : sizeof(krn_block_q5_k);
  vf acc[MR_W][MR_R];
  // Offsets of the current chunk and the one before: a chunk's offsets are added one chunk later, when the scalar
  // stores that wrote them have left the store buffer (a vector load right after them stalls on the forwarding).
  float mloc[MR_W][2][MR_CH] __attribute__((aligned(64)));
  float kd[MR_W][8], km[MR_W][8]; // Q4_K / Q5_K: the current super-block's sub-block scales, offsets (else unread)
  const int8_t *xq[MR_R];
  const float *xd[MR_R], *xs[MR_R];
  MR_UNROLL for (int w = 0; w < NW; w++) {
    MR_UNROLL for (int r = 0; r < MR_R; r++) acc[w][r] = v_zero();
    v_store(mloc[w][0], v_zero()); // MR_CH == VL
    v_store(mloc[w][1], v_zero());
  }
  MR_UNROLL for (int r = 0; r < R; r++) {
    size_t row = (size_t)(i0 + r) * xa->nbp;
    xq[r] = xa->qs + row * KRN_QK;
    xd[r] = xa->d + row;
    xs[r] = xa->s + row;
  }
  for (int b = 0; b < nb; b += MR_PB) {
    if ((wt == KRN_Q4_K || wt == KRN_Q5_K) && b % 8 == 0)
      for (int w = 0; w < NW; w++)
        kq_scales((const krn_block_q4_k *)((const char *)wr[w] + (size_t)(b / 8) * kbytes), kd[w], km[w]);
    mr_vi wv[MR_W], wc[MR_W];
    vf vd[MR_W];
    MR_UNROLL for (int w = 0; w < NW; w++) {
      __m256i wa0, wq0 = _mm256_setzero_si256();
      __m256 vd0;
      float mw0;
      load_wblock(wr[w], wt, b, kq ? b % 8 : 0, kd[w], km[w], &wa0, &wq0, &vd0, &mw0);
#if defined(KRN_AVXVNNI)
      wv[w] = sg ? wq0 : wa0;
      wc[w] = sg ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), wq0))
                 : wa0;
      vd[w] = vd0;
      if (!sg) mloc[w][b / MR_CH & 1][b % MR_CH] = mw0;
#else
      wv[w] = wa0;
      wc[w] = wq0;
      vd[w] = vd0;
      if (!sg) mloc[w][b / MR_CH & 1][b % MR_CH] = mw0;
#endif
    }
    MR_UNROLL for (int r = 0; r < R; r++) {
      mr_vi x = _mm256_loadu_si256((const __m256i *)(xq[r] + (size_t)b * KRN_QK));
      vf dx = _mm256_broadcast_ss(xd[r] + b);
      MR_UNROLL for (int w = 0; w < NW; w++) {
        mr_vi dot = mr_dot(wv[w], wc[w], x, sg);
        acc[w][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(vd[w], dx), acc[w][r]);
      }
    }
    if (!sg && ((b + MR_PB) % MR_CH == 0 || b + MR_PB >= nb)) { // end of an offset chunk (or of the row)
      int c = b / MR_CH; // stale mloc entries past nb meet s = 0 padding
      if (c > 0)
        MR_UNROLL for (int w = 0; w < NW; w++) {
          vf m = v_load(mloc[w][(c - 1) & 1]);
          MR_UNROLL for (int r = 0; r < R; r++) acc[w][r] = v_fma(m, v_load(xs[r] + (c - 1) * MR_CH), acc[w][r]);
        }
      if (b + MR_PB >= nb)
        MR_UNROLL for (int w = 0; w < NW; w++) {
          vf m = v_load(mloc[w][c & 1]);
          MR_UNROLL for (int r = 0; r < R; r++) acc[w][r] = v_fma(m, v_load(xs[r] + c * MR_CH), acc[w][r]);
        }
    }
  }
  MR_UNROLL for (int w = 0; w < NW; w++)
    MR_UNROLL for (int r = 0; r < R; r++) out[w * MR_R + r] = v_hsum(acc[w][r]);
}

#endif
#endif
