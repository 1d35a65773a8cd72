// kernels/cpu/simd_attn.h: the SIMD backends' paged attention, tiled (query rows of one kv head share each K/V block).
#ifndef DSERVE_KRN_CPU_SIMD_ATTN_H
#define DSERVE_KRN_CPU_SIMD_ATTN_H

#include "kernels/cpu/simd_vec.h"

// ---- paged attention, tiled ----
// A tile is up to ATT_ROWS query rows that read the same K and V: the G = n_head / n_kv_head heads of one kv head,
// for up to ATT_ROWS / G consecutive batch rows of one sequence (a prefill chunk's tokens; a decode row alone).
// Each KV block the tile sees is converted to f32 once and read by all of the tile's rows, and the scores come out of
// a register micro-tile (ATT_QR rows x 4 positions) instead of one horizontal sum per (row, position). Work items are
// (tile, kv head) pairs, taken from a shared counter, last tile first (causal tiles grow along the batch).
#define ATT_ROWS 16     // query rows per tile (at least G: one token's heads always share a tile)
#define ATT_QR (VL / 4) // rows of the score micro-tile: ATT_QR x 4 positions = VL scores, one vector
#define ATT_PR 4        // rows of the P.V micro-tile (x 2 vectors of dimensions)
#define ATT_AHEAD_BYTES 8192 // how far ahead of the block being read its head's rows are prefetched (L1 is 32-48 KiB)

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

// Row p's elements [e, e + VL) of K or V rows that are f32 (h = 0) or the cache's own f16 (h = 1: f16 -> f32 is exact,
// so both give the same values); rows ks elements apart. h is a constant at every call, so the test folds away.
KRN_INLINE vf att_ld(const void *rows, size_t ks, int p, int e, int h) {
  return h ? v_loadh((const krn_f16 *)rows + (size_t)p * ks + e) : v_load((const float *)rows + (size_t)p * ks + e);
}
KRN_INLINE float att_at(const void *rows, size_t ks, int p, int e, int h) {
  return h ? f16f(((const krn_f16 *)rows)[(size_t)p * ks + e]) : ((const float *)rows)[(size_t)p * ks + e];
}

// sc[r * ss + p] = scale * q_r . k_p for ATT_QR rows q (stride hd) and 4 rows k (ks elements apart, f16 when h), soft-
// capped to cap * tanh(s / cap) when cap > 0 (Gemma 2).
KRN_INLINE void att_scores(float *sc, size_t ss, const float *q, const void *k, size_t ks, int h, int hd, float scale,
                           float cap) {
  vf acc[VL];
#pragma GCC unroll 16
  for (int i = 0; i < VL; i++) acc[i] = v_zero();
  int e = 0;
  for (; e + VL <= hd; e += VL) {
    vf k0 = att_ld(k, ks, 0, e, h), k1 = att_ld(k, ks, 1, e, h), k2 = att_ld(k, ks, 2, e, h), k3 = att_ld(k, ks, 3, e, h);
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
  if (e == hd) { // the whole head in vectors (every head size a model has): scale and cap the VL scores at once
    vf x = v_mul(v_hsums(acc), v_set1(scale));
    if (cap > 0) x = v_mul(v_set1(cap), v_tanh(v_mul(x, v_set1(1.0f / cap))));
    v_store(s, x);
    for (int r = 0; r < ATT_QR; r++)
      for (int p = 0; p < 4; p++) sc[(size_t)r * ss + p] = s[4 * r + p];
    return;
  }
  v_store(s, v_hsums(acc));
  for (int r = 0; r < ATT_QR; r++)
    for (int p = 0; p < 4; p++) {
      float x = s[4 * r + p];
      for (int j = e; j < hd; j++) x += q[(size_t)r * hd + j] * att_at(k, ks, p, j, h);
      x *= scale;
      sc[(size_t)r * ss + p] = cap > 0 ? cap * tanhf(x / cap) : x;
    }
}

// o_r[d, d + n VL) += sum over np positions of w_r[p] v_p, for ATT_PR rows o (stride hd), weights w (stride ss) and
// values v (ks elements apart, f16 when h); n is 2 or 1 vectors.
KRN_INLINE void att_pv(float *o, const float *w, size_t ss, const void *v, size_t ks, int h, int np, int hd, int d,
                       int n) {
  vf acc[ATT_PR][2];
#pragma GCC unroll 4
  for (int r = 0; r < ATT_PR; r++) {
    acc[r][0] = v_load(o + (size_t)r * hd + d);
    acc[r][1] = n > 1 ? v_load(o + (size_t)r * hd + d + VL) : v_zero();
  }
  for (int p = 0; p < np; p++) {
    vf v0 = att_ld(v, ks, p, d, h), v1 = n > 1 ? att_ld(v, ks, p, d + VL, h) : v_zero();
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

// Rows 0 .. n (stride bytes apart, of type t) of one kv head's cache block into f32 rows (stride hd); rows n .. n4
// zero. Q8_0 rows are read in place, block by block (d * q is exact in f32, so the values are the scalar reference's).
static void att_rows_f32(float *dst, const char *src, krn_type t, size_t stride, int hd, int n, int n4) {
  for (int p = 0; p < n; p++) {
    float *d = dst + (size_t)p * hd;
    const char *row = src + (size_t)p * stride;
    if (t == KRN_F16) {
      const krn_f16 *s = (const krn_f16 *)row;
      int e = 0;
      for (; e + VL <= hd; e += VL) v_store(d + e, v_loadh(s + e));
      for (; e < hd; e++) d[e] = f16f(s[e]);
    } else if (t == KRN_Q8_0) {
      const krn_block_q8_0 *b = (const krn_block_q8_0 *)row;
      for (int g = 0; g < hd / KRN_QK; g++) {
        vf sc = v_set1(f16f(b[g].d));
#pragma GCC unroll 4
        for (int j = 0; j < KRN_QK; j += VL) v_store(d + g * KRN_QK + j, v_mul(sc, v_loadq8(b[g].qs + j)));
      }
    } else {
      memcpy(d, row, (size_t)hd * sizeof(float));
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

// One kv head's rows (at hoff within each position's row) in the block holding position p0, prefetched when p0 < phi
// and the table holds that block: one head's rows are a stride apart (every head's row of a position sits between
// them) and blocks are wherever the pool put them, so the hardware prefetchers do not fetch them ahead; decode
// attention read its cache from DRAM at about 10 GB/s without this (v: the V cache, else K; row: bytes of one head's
// row, which the caller sizes once).
KRN_INLINE void att_prefetch_block(const krn_attn_args *a, const int32_t *bt, int32_t p0, int32_t phi, size_t hoff,
                                   size_t stride, size_t row, int v) {
  if (p0 >= phi) return;
  int32_t blk = bt[p0 / a->block_size];
  if (blk < 0) return;
  const char *k = (const char *)(v ? a->v_cache : a->k_cache) + krn_cpu_kv_off(a, blk, 0) + hoff;
  for (int p = 0; p < a->block_size; p++)
    for (size_t l = 0; l < row; l += 64) _mm_prefetch(k + (size_t)p * stride + l, _MM_HINT_T0);
}

static void attn_tile(const attn_task *t, const attn_scratch *s, int tile, int kh) {
  const krn_attn_args *a = t->a;
  int hd = a->head_dim, vd = krn_cpu_attn_vd(a), G = a->n_head / a->n_kv_head, bs = a->block_size;
  size_t ss = s->span, stride = krn_cpu_kv_off(a, 0, 1), hoff = krn_cpu_kv_head_off(a, kh); // bytes per position, head
  const int h16 = a->kv_type == KRN_F16;                        // f16 rows are read in place (not converted)
  const size_t head_row = krn_row_size(a->kv_type, hd);          // bytes of one head's row
  const size_t head_block = (size_t)bs * head_row;                // and of its rows in a block
  const int32_t ahead = head_block < ATT_AHEAD_BYTES ? (int32_t)(ATT_AHEAD_BYTES / head_block) : 1; // blocks
  const size_t ks16 = stride / sizeof(krn_f16);                  // elements from one f16 row to the next
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
      memset(t->out + ((size_t)(r0 + i) * a->n_head + kh * G + g) * vd, 0, (size_t)vd * sizeof(float));
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
    att_prefetch_block(a, bt, p0 + ahead * bs, phi, hoff, stride, head_row, 0);
    float *sc0 = s->sc + (p0 - plo);
    if (blk < 0) {
      for (int r = 0; r < Rp; r++)
        for (int p = 0; p < np; p++) sc0[(size_t)r * ss + p] = -INFINITY;
      continue;
    }
    const char *kb = (const char *)a->k_cache + krn_cpu_kv_off(a, blk, 0) + hoff;
    // f16 rows are read in place, four positions at a time; what is left (and every row of another type) is
    // converted into s->kv first, zero rows padding the last group of four
    int direct = h16 ? np / 4 * 4 : 0;
    for (int r = 0; r < Rp; r += ATT_QR)
      for (int p = 0; p < direct; p += 4)
        att_scores(sc0 + (size_t)r * ss + p, ss, s->q + (size_t)r * hd, kb + (size_t)p * stride, ks16, 1, hd, a->scale,
                   a->softcap);
    if (direct == np) continue;
    att_rows_f32(s->kv, kb + (size_t)direct * stride, a->kv_type, stride, hd, np - direct, np4 - direct);
    for (int r = 0; r < Rp; r += ATT_QR)
      for (int p = direct; p < np4; p += 4) {
        const float *kv = s->kv + (size_t)(p - direct) * hd;
        if (p + 4 <= np) {
          att_scores(sc0 + (size_t)r * ss + p, ss, s->q + (size_t)r * hd, kv, hd, 0, hd, a->scale, a->softcap);
        } else { // the block's last positions: scores past np land in a side buffer
          float tmp[ATT_QR * 4];
          att_scores(tmp, 4, s->q + (size_t)r * hd, kv, hd, 0, hd, a->scale, a->softcap);
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
  // out = P . V, block by block (the first vd values of each V row; s->o's rows keep the stride hd)
  memset(s->o, 0, (size_t)Rp * hd * sizeof(float));
  for (int32_t p0 = plo; p0 < phi; p0 += bs) {
    int32_t blk = bt[p0 / bs], np = p0 + bs < phi ? bs : phi - p0;
    att_prefetch_block(a, bt, p0 + ahead * bs, phi, hoff, stride, head_row, 1);
    if (blk < 0) continue;
    const char *vb = (const char *)a->v_cache + krn_cpu_kv_off(a, blk, 0) + hoff;
    const void *v = vb;
    size_t vs = ks16;
    if (!h16) { // rows of another type are converted first
      att_rows_f32(s->kv, vb, a->kv_type, stride, vd, np, np);
      v = s->kv;
      vs = (size_t)vd;
    }
    const float *w0 = s->sc + (p0 - plo);
    for (int r = 0; r < Rp; r += ATT_PR) {
      float *o = s->o + (size_t)r * hd;
      const float *w = w0 + (size_t)r * ss;
      int d = 0;
      if (h16) {
        for (; d + 2 * VL <= vd; d += 2 * VL) att_pv(o, w, ss, v, vs, 1, np, hd, d, 2);
        for (; d + VL <= vd; d += VL) att_pv(o, w, ss, v, vs, 1, np, hd, d, 1);
      } else {
        for (; d + 2 * VL <= vd; d += 2 * VL) att_pv(o, w, ss, v, vs, 0, np, hd, d, 2);
        for (; d + VL <= vd; d += VL) att_pv(o, w, ss, v, vs, 0, np, hd, d, 1);
      }
      for (; d < vd; d++)
        for (int rr = 0; rr < ATT_PR; rr++)
          for (int p = 0; p < np; p++) o[(size_t)rr * hd + d] += w[(size_t)rr * ss + p] * att_at(v, vs, p, d, h16);
    }
  }
  for (int i = 0; i < nt; i++)
    for (int g = 0; g < G; g++)
      memcpy(t->out + ((size_t)(r0 + i) * a->n_head + kh * G + g) * vd, s->o + ((size_t)i * G + g) * hd,
             (size_t)vd * sizeof(float));
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
  if (!krn_cpu_attn_ok(a)) { if (a->n_tokens > 0 && a->n_head > 0 && a->head_dim > 0) krn_cpu_fill_nan(out, (int64_t)a->n_tokens * a->n_head * (a->v_dim > 0 ? a->v_dim : a->head_dim)); return; }
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

#endif
