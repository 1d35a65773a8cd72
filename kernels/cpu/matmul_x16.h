// kernels/cpu/matmul_x16.h: the AVX-512 matmul of the quantized types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K) with 16 weight rows per vector. Included by simd_matmul.h (KRN_W512 only), which sends every quantized type
// here, for every n.
//
// Why: the AVX-512 tile this replaced (matmul_rows.h's, 2 weight rows x 8 activation rows) dotted one weight row per
// 256-bit half, so each 64 multiply-adds of a (weight row, activation row) pair cost a vpdpbusd plus a convert, a
// multiply and an FMA to apply the two blocks' scales; at n = 8 on Gemma 3 (262k x 640 Q8_0 output matrix) those
// float ops were most of a decode step. Here lane i of every vector belongs to weight row j + i: 16 rows' block b are
// transposed into 8 vectors (vector g: elements 4g..4g+3 of each row, as unsigned bytes), each activation row's 4
// bytes are broadcast, and 8 vpdpbusd give the 16 rows' whole block dots at once, so the scale costs one convert,
// multiply and FMA per 512 multiply-adds, and each lane ends as one output: no horizontal sums.
//
// The transposed blocks of 16 rows are packed once per chunk of MX_KC blocks into a panel (L1/L2-resident) and every
// activation row of the matmul streams past it, so prefill (n = 512) unpacks each weight block once, not per tile.
//
// Weight bytes: symmetric types (Q4_0, Q5_0, Q8_0, Q6_K; w = d q) hold q + 128 as u8, and the activation block's
// c = -128 sum(xq) starts the int32 sum, so the dot is the exact signed one (Q6_K: one sum per 16-element half, c16
// the first half's); Q4_1 / Q5_1 / Q4_K / Q5_K (w = d q + m) hold q, and m sx is added per block. Each (weight row, activation row) pair runs the same sequence of operations over its
// blocks whatever n, the tile, the chunk or the thread, so a row's result does not depend on its batch.

#define MX_ROWS 16 // weight rows per vector
#define MX_KC 64   // blocks per packed chunk: a panel of 16 x 64 blocks is 48 KiB
#define MX_R 8     // activation rows per tile

// w = d q + m: an offset per block (the K-quants' sub-blocks: d = d sc[s], m = -dmin m[s])
KRN_INLINE int mx_min(krn_type t) { return t == KRN_Q4_1 || t == KRN_Q5_1 || t == KRN_Q4_K || t == KRN_Q5_K; }

typedef struct mx_panel {
  __m512i q[MX_KC][8]; // block b: q[b][g] lane i = elements 4g..4g+3 of row i (u8 as above)
  __m512 d[MX_KC];     // block b's scale per row (Q6_K: of elements 0-15)
  __m512 m[MX_KC];     // block b's offset per row (Q4_1 / Q5_1 / Q4_K / Q5_K); Q6_K: scale of elements 16-31
} mx_panel;

// Dword-transposes 8 vectors (r[i]: row i in the low 256 bits, row i + 8 in the high) into out[g]: lane i is dword g
// of row i, for 16 rows of 8 dwords.
KRN_INLINE void mx_transpose8(const __m512i *r, __m512i *out) {
  __m512i s[8], u[8];
  MR_UNROLL for (int i = 0; i < 4; i++) {
    s[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    s[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  MR_UNROLL for (int h = 0; h < 2; h++) { // rows 0-3 (and 8-11), then rows 4-7 (and 12-15)
    u[4 * h + 0] = _mm512_unpacklo_epi64(s[4 * h], s[4 * h + 2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(s[4 * h], s[4 * h + 2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(s[4 * h + 1], s[4 * h + 3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(s[4 * h + 1], s[4 * h + 3]);
  }
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  MR_UNROLL for (int g = 0; g < 4; g++) {
    out[g] = _mm512_permutex2var_epi64(u[g], lo, u[g + 4]);
    out[g + 4] = _mm512_permutex2var_epi64(u[g], hi, u[g + 4]);
  }
}

// The 32 bytes at p. The sanitize build reads them as two 16-byte halves: ASan checks those inline, while a 32-byte
// access takes its slow path (a call per load; see also kernels/CMakeLists.txt); the same bytes are read and checked
// either way.
#if defined(__SANITIZE_ADDRESS__)
#define MX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MX_ASAN 1
#endif
#endif
KRN_INLINE __m256i mx_loadu32(const char *p) {
#ifdef MX_ASAN
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                 _mm_loadu_si128((const __m128i *)(p + 16)), 1);
#else
  return _mm256_loadu_si256((const __m256i *)p);
#endif
}

// The 32 bytes at rp[i] + off of the 16 rows, transposed: out[g] lane i = bytes 4g..4g+3 of row i's 32.
KRN_INLINE void mx_load32(const char *const *rp, size_t off, __m512i *out) {
  __m512i r[8];
  MR_UNROLL for (int i = 0; i < 8; i++)
    r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(mx_loadu32(rp[i] + off)), mx_loadu32(rp[i + 8] + off), 1);
  mx_transpose8(r, out);
}

// Dword-transposes 4 vectors (z[i]'s 128-bit lane L: row 4L + i) into out[g]: lane i is dword g of row i, for 16
// rows of 4 dwords.
KRN_INLINE void mx_transpose4(const __m512i *z, __m512i *out) {
  __m512i s0 = _mm512_unpacklo_epi32(z[0], z[1]), s1 = _mm512_unpackhi_epi32(z[0], z[1]);
  __m512i s2 = _mm512_unpacklo_epi32(z[2], z[3]), s3 = _mm512_unpackhi_epi32(z[2], z[3]);
  out[0] = _mm512_unpacklo_epi64(s0, s2);
  out[1] = _mm512_unpackhi_epi64(s0, s2);
  out[2] = _mm512_unpacklo_epi64(s1, s3);
  out[3] = _mm512_unpackhi_epi64(s1, s3);
}

// The 16 bytes at rp[i] + off of the 16 rows, transposed: out[g] lane i = bytes 4g..4g+3 of row i's 16.
KRN_INLINE void mx_load16(const char *const *rp, size_t off, __m512i *out) {
  __m512i z[4];
  MR_UNROLL for (int i = 0; i < 4; i++) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[i] + off)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[i + 4] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[i + 8] + off)), 2);
    z[i] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[i + 12] + off)), 3);
  }
  mx_transpose4(z, out);
}

// Block b of nb of the 16 rows at rp[i] (repeats past the last row) into q[8], d and m (a panel's slot, or
// registers); gi: lane i = rp[i] - rp[0].
KRN_INLINE void mx_pack_block(__m512i *q, __m512 *d, __m512 *m, krn_type wt, const char *const *rp, __m512i gi, int b,
                              int nb) {
  size_t bs = wt == KRN_Q4_0 ? sizeof(krn_block_q4_0) : wt == KRN_Q4_1 ? sizeof(krn_block_q4_1)
            : wt == KRN_Q5_0 ? sizeof(krn_block_q5_0) : wt == KRN_Q5_1 ? sizeof(krn_block_q5_1) : sizeof(krn_block_q8_0);
  size_t off = (size_t)b * bs;
  __m512i dm, t[4], qh = _mm512_setzero_si512();
  if ((wt == KRN_Q4_1 || wt == KRN_Q5_1) && b + 1 < nb) {
    // d, m (qh) and qs are whole dwords from the block's start: one 32-byte load per row (the next block's bytes
    // past it; not past the row's last block) and one transpose give them all. The gather of d and m it replaces
    // was about half the time of a one-thread, cache-resident batch-1 Q4_1 product.
    __m512i r[8];
    mx_load32(rp, off, r);
    dm = r[0];
    int q0 = wt == KRN_Q4_1 ? 1 : 2;
    if (wt == KRN_Q5_1) qh = r[1];
    MR_UNROLL for (int g = 0; g < 4; g++) t[g] = r[q0 + g];
  } else {
    dm = _mm512_i32gather_epi32(gi, rp[0] + off, 1); // each row's first 4 bytes: d (and m)
    if (wt == KRN_Q8_0) {
      *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
      mx_load32(rp, off + offsetof(krn_block_q8_0, qs), q);
      MR_UNROLL for (int g = 0; g < 8; g++) q[g] = _mm512_xor_si512(q[g], _mm512_set1_epi8((char)0x80)); // q + 128
      return;
    }
    size_t qo = wt == KRN_Q4_0 ? offsetof(krn_block_q4_0, qs) : wt == KRN_Q4_1 ? offsetof(krn_block_q4_1, qs)
              : wt == KRN_Q5_0 ? offsetof(krn_block_q5_0, qs) : offsetof(krn_block_q5_1, qs);
    mx_load16(rp, off + qo, t);
    if (wt == KRN_Q5_0 || wt == KRN_Q5_1) {
      size_t ho = wt == KRN_Q5_0 ? offsetof(krn_block_q5_0, qh) : offsetof(krn_block_q5_1, qh);
      qh = _mm512_i32gather_epi32(gi, rp[0] + off + ho, 1);
    }
  }
  *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
  if (mx_min(wt)) *m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
  const __m512i nib = _mm512_set1_epi8(15);
  MR_UNROLL for (int g = 0; g < 4; g++) { // low nibbles are elements 0-15, high nibbles 16-31
    q[g] = _mm512_and_si512(t[g], nib);
    q[g + 4] = _mm512_and_si512(_mm512_srli_epi32(t[g], 4), nib);
  }
  if (wt == KRN_Q5_0 || wt == KRN_Q5_1) { // element e's fifth bit is bit e of the row's qh
    MR_UNROLL for (int g = 0; g < 8; g++) {
      // every byte of a lane takes qh's byte g / 2; byte k then tests bit 4 (g % 2) + k
      const int k0 = 0x01010101 * (g / 2);
      const __m512i pick = _mm512_set4_epi32(k0 + 0x0c0c0c0c, k0 + 0x08080808, k0 + 0x04040404, k0);
      const __m512i bit = _mm512_set1_epi32(g % 2 ? (int)0x80402010 : 0x08040201);
      __mmask64 set = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, pick), bit);
      q[g] = _mm512_mask_add_epi8(q[g], set, q[g], _mm512_set1_epi8(16));
    }
  }
  if (!mx_min(wt)) { // q - 8 (Q4_0) or q - 16 (Q5_0), + 128
    const __m512i add = _mm512_set1_epi8(wt == KRN_Q4_0 ? 120 : 112);
    MR_UNROLL for (int g = 0; g < 8; g++) q[g] = _mm512_add_epi8(q[g], add);
  }
}

KRN_INLINE __m512i mx_srl32(__m512i v, int n) { return _mm512_srl_epi32(v, _mm_cvtsi32_si128(n)); }

// Q4_K / Q5_K super-block sb of the 16 rows at rp[i] into slots pb..pb+7 of p (its 8 sub-blocks of 32): the 6-bit
// scales and mins of 16 rows decoded side by side (krn_k_scale_min per lane), the quants of sub-blocks 2t and
// 2t + 1 from one transpose of their 32 shared bytes (low and high nibbles).
KRN_INLINE void mx_pack_k(mx_panel *p, int pb, krn_type wt, const char *const *rp, int sb) {
  size_t off = (size_t)sb * (wt == KRN_Q4_K ? sizeof(krn_block_q4_k) : sizeof(krn_block_q5_k));
  __m512i head[4]; // each row's first 16 bytes, as dwords: d and dmin, scales[0..3], [4..7], [8..11]
  mx_load16(rp, off, head);
  __m512i dd = head[0], s0 = head[1], s1 = head[2], s2 = head[3];
  __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
  __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
  const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
  MR_UNROLL for (int j = 0; j < 8; j++) {
    int sh = 8 * (j & 3);
    __m512i sc, mn;
    if (j < 4) {
      sc = _mm512_and_si512(mx_srl32(s0, sh), m6);
      mn = _mm512_and_si512(mx_srl32(s1, sh), m6);
    } else {
      sc = _mm512_or_si512(_mm512_and_si512(mx_srl32(s2, sh), m4),
                           _mm512_slli_epi32(_mm512_and_si512(mx_srl32(s0, sh + 6), m2), 4));
      mn = _mm512_or_si512(_mm512_and_si512(mx_srl32(s2, sh + 4), m4),
                           _mm512_slli_epi32(_mm512_and_si512(mx_srl32(s1, sh + 6), m2), 4));
    }
    p->d[pb + j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    p->m[pb + j] = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
  }
  size_t qo = wt == KRN_Q4_K ? offsetof(krn_block_q4_k, qs) : offsetof(krn_block_q5_k, qs);
  __m512i h[8];
  if (wt == KRN_Q5_K) mx_load32(rp, off + offsetof(krn_block_q5_k, qh), h); // element l of sub-block s: bit s of qh[l]
  const __m512i nib = _mm512_set1_epi8(15), one = _mm512_set1_epi8(1);
  MR_UNROLL for (int t = 0; t < 4; t++) {
    __m512i *qa = p->q[pb + 2 * t], *qb = p->q[pb + 2 * t + 1];
    mx_load32(rp, off + qo + 32 * t, qa);
    MR_UNROLL for (int g = 0; g < 8; g++) {
      qb[g] = _mm512_and_si512(_mm512_srli_epi32(qa[g], 4), nib);
      qa[g] = _mm512_and_si512(qa[g], nib);
      if (wt == KRN_Q5_K) {
        qa[g] = _mm512_or_si512(qa[g], _mm512_slli_epi32(_mm512_and_si512(mx_srl32(h[g], 2 * t), one), 4));
        qb[g] = _mm512_or_si512(qb[g], _mm512_slli_epi32(_mm512_and_si512(mx_srl32(h[g], 2 * t + 1), one), 4));
      }
    }
  }
}

// Q6_K super-block sb of the 16 rows at rp[i] into slots pb..pb+7 of p: (q - 32) + 128 as u8, each sub-block's two
// 16-element scales d scales[2s], d scales[2s + 1]. Sub-block 4h + j takes the low bits of ql[64h + 32(j & 1) + l]'s
// nibble j >> 1 and the high two of qh[32h + l] >> 2j: one transpose of 32 ql bytes serves sub-blocks j and j + 2.
KRN_INLINE void mx_pack_q6k(mx_panel *p, int pb, const char *const *rp, __m512i gi, int sb) {
  size_t off = (size_t)sb * sizeof(krn_block_q6_k);
  const char *b0 = rp[0] + off;
  // d is the block's last 2 bytes: the dword ending there, so the last row's gather stays inside it
  __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
      _mm512_srli_epi32(_mm512_i32gather_epi32(gi, b0 + offsetof(krn_block_q6_k, d) - 2, 1), 16)));
  __m512i scales[4]; // scales[w] lane i = row i's scales[4w..4w+3]
  mx_load16(rp, off + offsetof(krn_block_q6_k, scales), scales);
  MR_UNROLL for (int w = 0; w < 4; w++) { // scales[4w..4w+3]: sub-blocks 2w, 2w + 1
    __m512i sc = scales[w];
    MR_UNROLL for (int e = 0; e < 4; e++) { // scales[4w + e], sign-extended
      __m512 v = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sc, 24 - 8 * e), 24));
      if (e % 2 == 0) p->d[pb + 2 * w + e / 2] = _mm512_mul_ps(d, v);
      else p->m[pb + 2 * w + e / 2] = _mm512_mul_ps(d, v);
    }
  }
  const __m512i nib = _mm512_set1_epi8(15), two = _mm512_set1_epi8(3), add = _mm512_set1_epi8(96);
  __m512i h[8], t[8];
  MR_UNROLL for (int hf = 0; hf < 2; hf++) {
    mx_load32(rp, off + offsetof(krn_block_q6_k, qh) + 32 * hf, h);
    MR_UNROLL for (int j1 = 0; j1 < 2; j1++) { // ql[64 hf + 32 j1 ..]: sub-blocks 4 hf + j1 and 4 hf + j1 + 2
      mx_load32(rp, off + offsetof(krn_block_q6_k, ql) + 64 * hf + 32 * j1, t);
      __m512i *qa = p->q[pb + 4 * hf + j1], *qb = p->q[pb + 4 * hf + j1 + 2];
      MR_UNROLL for (int g = 0; g < 8; g++) {
        __m512i ha = _mm512_slli_epi32(_mm512_and_si512(mx_srl32(h[g], 2 * j1), two), 4);
        __m512i hb = _mm512_slli_epi32(_mm512_and_si512(mx_srl32(h[g], 2 * j1 + 4), two), 4);
        qa[g] = _mm512_add_epi8(_mm512_or_si512(_mm512_and_si512(t[g], nib), ha), add);
        qb[g] = _mm512_add_epi8(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(t[g], 4), nib), hb), add);
      }
    }
  }
}

// acc (16 weight rows) + one block of them (q, d, m as a panel slot holds it) dotted with activation block o: the
// one sequence of operations every (weight row, activation row, block) runs, whatever the path.
KRN_INLINE __m512 mx_dot(const __m512i *q, __m512 d, __m512 m, krn_type wt, const mr_act *xa, size_t o, __m512 acc) {
  const int8_t *x = xa->qs + o * KRN_QK;
  if (wt == KRN_Q6_K) { // two int sums, one per 16-element scale (m holds the second scale)
    __m512i lo = _mm512_set1_epi32(xa->c16[o]), hi = _mm512_set1_epi32(xa->c[o] - xa->c16[o]);
    MR_UNROLL for (int g = 0; g < 4; g++) {
      int32_t xl, xh;
      memcpy(&xl, x + 4 * g, 4);
      memcpy(&xh, x + 16 + 4 * g, 4);
      lo = _mm512_dpbusd_epi32(lo, q[g], _mm512_set1_epi32(xl));
      hi = _mm512_dpbusd_epi32(hi, q[g + 4], _mm512_set1_epi32(xh));
    }
    __m512 dx = _mm512_set1_ps(xa->d[o]);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(d, dx), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(m, dx), acc);
  }
  __m512i ai = mx_min(wt) ? _mm512_setzero_si512() : _mm512_set1_epi32(xa->c[o]);
  MR_UNROLL for (int g = 0; g < 8; g++) {
    int32_t x4;
    memcpy(&x4, x + 4 * g, 4);
    ai = _mm512_dpbusd_epi32(ai, q[g], _mm512_set1_epi32(x4));
  }
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_mul_ps(d, _mm512_set1_ps(xa->d[o])), acc);
  if (mx_min(wt)) acc = _mm512_fmadd_ps(m, _mm512_set1_ps(xa->s[o]), acc);
  return acc;
}

// acc[r] (16 weight rows) += the panel's nbc blocks dotted with activation row i0 + r's blocks b0.. (r < R).
KRN_INLINE void mx_rows(const mx_panel *p, int nbc, krn_type wt, const mr_act *xa, int b0, int i0, int R,
                        __m512 *acc) {
  for (int b = 0; b < nbc; b++)
    MR_UNROLL for (int r = 0; r < R; r++)
      acc[r] = mx_dot(p->q[b], p->d[b], p->m[b], wt, xa, (size_t)(i0 + r) * xa->nbp + b0 + b, acc[r]);
}

// Activation rows [i0, i0 + R) against the packed chunk: y's 16 (W) columns j.. carry the sums between chunks.
KRN_INLINE void mx_tile(const mx_panel *p, int nbc, krn_type wt, const mr_act *xa, int b0, int i0, int R, float *y,
                        int64_t m, int64_t j, __mmask16 wm) {
  __m512 acc[MX_R];
  MR_UNROLL for (int r = 0; r < R; r++)
    acc[r] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(wm, y + (size_t)(i0 + r) * m + j);
  mx_rows(p, nbc, wt, xa, b0, i0, R, acc);
  MR_UNROLL for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)(i0 + r) * m + j, wm, acc[r]);
}

// Weight rows [lo, hi) of type wt against every activation row, 16 at a time (the last group may be short).
KRN_INLINE void mx_span(const mm_task *t, krn_type wt, mx_panel *p, int64_t lo, int64_t hi) {
  size_t rs = krn_row_size(wt, t->k);
  int nb = t->k / KRN_QK;
  for (int64_t j = lo; j < hi; j += MX_ROWS) {
    int W = hi - j < MX_ROWS ? (int)(hi - j) : MX_ROWS;
    const char *rp[MX_ROWS];
    int32_t gofs[MX_ROWS];
    MR_UNROLL for (int i = 0; i < MX_ROWS; i++) {
      rp[i] = (const char *)t->w + (size_t)(j + (i < W ? i : W - 1)) * rs;
      gofs[i] = (int32_t)(rp[i] - rp[0]); // < 16 rows: rows far beyond 2 GiB are not a shape any model has
    }
    __m512i gi = _mm512_loadu_si512(gofs);
    __mmask16 wm = (__mmask16)((1u << W) - 1);
    // The next group's rows (contiguous bytes), prefetched a share per block packed: the packing reads 16 rows side
    // by side, a pattern the hardware prefetchers do not follow (batch-1 decode ran at a third of its speed without)
    const char *next = (const char *)t->w + (size_t)(j + MX_ROWS) * rs;
    int64_t next_rows = hi - j - MX_ROWS < MX_ROWS ? hi - j - MX_ROWS : MX_ROWS; // <= 0: none
    size_t lines = next_rows > 0 ? (size_t)next_rows * rs / 64 : 0;
    if (t->n == 1) {
      // Batch-1 decode: each block goes from the rows into registers and is dotted at once, with no panel to store
      // and load again (about a tenth of a one-thread 576 x 1536 Q4_1 product); a K-quant super-block goes through
      // the panel's first 8 slots (5 KiB, in L1, where a 64-block chunk is not). mx_dot in block order from zero:
      // the result a batch gives this row.
      __m512 acc = _mm512_setzero_ps();
      for (int b = 0; b < nb; b++) {
        for (size_t l = lines * (size_t)b / nb; l < lines * (size_t)(b + 1) / nb; l++)
          _mm_prefetch(next + 64 * l, _MM_HINT_T1);
        if (wt == KRN_Q6_K || wt == KRN_Q4_K || wt == KRN_Q5_K) {
          if (b % 8 == 0) {
            if (wt == KRN_Q6_K) mx_pack_q6k(p, 0, rp, gi, b / 8);
            else mx_pack_k(p, 0, wt, rp, b / 8);
          }
          acc = mx_dot(p->q[b % 8], p->d[b % 8], p->m[b % 8], wt, &t->xa, (size_t)b, acc);
        } else {
          __m512i q[8];
          __m512 d, m = _mm512_setzero_ps();
          mx_pack_block(q, &d, &m, wt, rp, gi, b, nb);
          acc = mx_dot(q, d, m, wt, &t->xa, (size_t)b, acc);
        }
      }
      _mm512_mask_storeu_ps(t->y + j, wm, acc);
      continue;
    }
    for (int b0 = 0; b0 < nb; b0 += MX_KC) {
      int nbc = nb - b0 < MX_KC ? nb - b0 : MX_KC;
      for (int b = 0; b < nbc; b++) {
        for (size_t l = lines * (size_t)(b0 + b) / nb; l < lines * (size_t)(b0 + b + 1) / nb; l++)
          _mm_prefetch(next + 64 * l, _MM_HINT_T1);
        if (wt == KRN_Q6_K) {
          if (b % 8 == 0) mx_pack_q6k(p, b, rp, gi, (b0 + b) / 8);
        } else if (wt == KRN_Q4_K || wt == KRN_Q5_K) {
          if (b % 8 == 0) mx_pack_k(p, b, wt, rp, (b0 + b) / 8); // MX_KC is whole super-blocks
        } else {
          mx_pack_block(p->q[b], &p->d[b], &p->m[b], wt, rp, gi, b0 + b, nb);
        }
      }
      int i = 0;
      for (; i + MX_R <= t->n; i += MX_R) mx_tile(p, nbc, wt, &t->xa, b0, i, MX_R, t->y, t->m, j, wm);
      for (int R = 4; R >= 1; R /= 2) { // the leftover rows as 4 + 2 + 1 (R a constant in each instance)
        if (t->n - i < R) continue;
        if (R == 4) mx_tile(p, nbc, wt, &t->xa, b0, i, 4, t->y, t->m, j, wm);
        else if (R == 2) mx_tile(p, nbc, wt, &t->xa, b0, i, 2, t->y, t->m, j, wm);
        else mx_tile(p, nbc, wt, &t->xa, b0, i, 1, t->y, t->m, j, wm);
        i += R;
      }
    }
  }
}
