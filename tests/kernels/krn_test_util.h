// tests/kernels/krn_test_util.h: random tensors, test-side dequantization and dense references for the kernel tests.
#ifndef DSERVE_TESTS_KRN_TEST_UTIL_H
#define DSERVE_TESTS_KRN_TEST_UTIL_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/krn.h"

namespace krntest {

// A weight matrix (m, k) of type t with random contents, as raw bytes (k a multiple of krn_type_block(t)).
// Scales are kept so that weights stay O(1): |w| up to about 0.05 * levels.
inline std::vector<uint8_t> random_weights(std::mt19937 &rng, krn_type t, int m, int k) {
  size_t rs = krn_row_size(t, k);
  std::vector<uint8_t> buf(rs * (size_t)m);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), ud(0.002f, 0.05f);
  std::uniform_int_distribution<int> b8(0, 255), q8(-127, 127);
  for (auto &v : buf) v = (uint8_t)b8(rng); // quants, qh bits and packed 6-bit scales: any bytes are valid
  for (int j = 0; j < m; j++) {
    uint8_t *row = buf.data() + rs * j;
    for (int b = 0; b < k / KRN_QK; b++) { // 32-element types: valid (finite) scales
      switch (t) {
      case KRN_Q4_0: ((krn_block_q4_0 *)row)[b].d = krn_f32_to_f16(ud(rng) * (u(rng) < 0 ? -1 : 1)); break;
      case KRN_Q4_1: {
        krn_block_q4_1 *blk = (krn_block_q4_1 *)row + b;
        blk->d = krn_f32_to_f16(ud(rng));
        blk->m = krn_f32_to_f16(-8 * ud(rng) + 0.01f * u(rng));
      } break;
      case KRN_Q5_0: ((krn_block_q5_0 *)row)[b].d = krn_f32_to_f16(ud(rng) / 2 * (u(rng) < 0 ? -1 : 1)); break;
      case KRN_Q5_1: {
        krn_block_q5_1 *blk = (krn_block_q5_1 *)row + b;
        blk->d = krn_f32_to_f16(ud(rng) / 2);
        blk->m = krn_f32_to_f16(-8 * ud(rng) + 0.01f * u(rng));
      } break;
      case KRN_Q8_0: {
        krn_block_q8_0 *blk = (krn_block_q8_0 *)row + b;
        blk->d = krn_f32_to_f16(ud(rng) / 8);
        for (auto &q : blk->qs) q = (int8_t)q8(rng);
      } break;
      default: break;
      }
    }
    for (int b = 0; b < k / KRN_QK_K; b++) { // K-quants: super-block scales (sub-block scales are the random bytes)
      switch (t) {
      case KRN_Q4_K: case KRN_Q5_K: {
        krn_block_q4_k *blk = (krn_block_q4_k *)(row + (size_t)b * (t == KRN_Q4_K ? sizeof(krn_block_q4_k) : sizeof(krn_block_q5_k)));
        blk->d = krn_f32_to_f16(ud(rng) / (t == KRN_Q4_K ? 40 : 80));
        blk->dmin = krn_f32_to_f16(ud(rng) / 40);
      } break;
      case KRN_Q6_K: ((krn_block_q6_k *)row)[b].d = krn_f32_to_f16(ud(rng) / 64 * (u(rng) < 0 ? -1 : 1)); break;
      default: break;
      }
    }
    if (t == KRN_F32) for (int e = 0; e < k; e++) ((float *)row)[e] = u(rng) * 0.1f;
    if (t == KRN_F16) for (int e = 0; e < k; e++) ((krn_f16 *)row)[e] = krn_f32_to_f16(u(rng) * 0.1f);
    if (t == KRN_BF16) for (int e = 0; e < k; e++) ((krn_bf16 *)row)[e] = krn_f32_to_bf16(u(rng) * 0.1f);
  }
  return buf;
}

// Element e of a row of type t, written from the block layouts in krn.h (independent of the kernels); each
// weight in float, in the order ggml computes it, so that it is the very value a GGUF's type defines.
inline float dequant_elem(const uint8_t *row, krn_type t, int e) {
  int b = e / KRN_QK, i = e % KRN_QK, nib = i < 16 ? i : i - 16, hi = i >= 16;
  int sb = e / KRN_QK_K, s = (e % KRN_QK_K) / 32, l = e % 32;
  switch (t) {
  case KRN_F32: return ((const float *)row)[e];
  case KRN_F16: return krn_f16_to_f32(((const krn_f16 *)row)[e]);
  case KRN_BF16: { uint32_t u = (uint32_t)((const krn_bf16 *)row)[e] << 16; float f; memcpy(&f, &u, 4); return f; }
  case KRN_Q4_0: {
    const krn_block_q4_0 *blk = (const krn_block_q4_0 *)row + b;
    return krn_f16_to_f32(blk->d) * (float)(((blk->qs[nib] >> (4 * hi)) & 15) - 8);
  }
  case KRN_Q4_1: {
    const krn_block_q4_1 *blk = (const krn_block_q4_1 *)row + b;
    return krn_f16_to_f32(blk->d) * (float)((blk->qs[nib] >> (4 * hi)) & 15) + krn_f16_to_f32(blk->m);
  }
  case KRN_Q5_0: {
    const krn_block_q5_0 *blk = (const krn_block_q5_0 *)row + b;
    int q = ((blk->qs[nib] >> (4 * hi)) & 15) | ((blk->qh[i / 8] >> (i % 8)) & 1) << 4;
    return krn_f16_to_f32(blk->d) * (float)(q - 16);
  }
  case KRN_Q5_1: {
    const krn_block_q5_1 *blk = (const krn_block_q5_1 *)row + b;
    int q = ((blk->qs[nib] >> (4 * hi)) & 15) | ((blk->qh[i / 8] >> (i % 8)) & 1) << 4;
    return krn_f16_to_f32(blk->d) * (float)q + krn_f16_to_f32(blk->m);
  }
  case KRN_Q8_0: {
    const krn_block_q8_0 *blk = (const krn_block_q8_0 *)row + b;
    return krn_f16_to_f32(blk->d) * (float)blk->qs[i];
  }
  case KRN_Q4_K: case KRN_Q5_K: {
    const uint8_t *p = row + (size_t)sb * (t == KRN_Q4_K ? 144 : 176); // d, dmin, scales[12], (qh[32]), qs[128]
    const uint8_t *sc12 = p + 4, *qs = p + (t == KRN_Q4_K ? 16 : 48), *qh = p + 16;
    int sc, mn;
    if (s < 4) { sc = sc12[s] & 63; mn = sc12[s + 4] & 63; }
    else { sc = (sc12[s + 4] & 15) | (sc12[s - 4] >> 6) << 4; mn = (sc12[s + 4] >> 4) | (sc12[s] >> 6) << 4; }
    int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
    if (t == KRN_Q5_K) q |= ((qh[l] >> s) & 1) << 4;
    krn_f16 d, dmin;
    memcpy(&d, p, 2);
    memcpy(&dmin, p + 2, 2);
    float dl = krn_f16_to_f32(d) * (float)sc, ml = krn_f16_to_f32(dmin) * (float)mn;
    return dl * (float)q - ml;
  }
  case KRN_Q6_K: {
    const uint8_t *p = row + (size_t)sb * 210; // ql[128], qh[64], scales[16] (int8), d
    int h = s / 4, j = s % 4;
    int q = ((p[64 * h + 32 * (j % 2) + l] >> (4 * (j / 2))) & 15) | ((p[128 + 32 * h + l] >> (2 * j)) & 3) << 4;
    krn_f16 d;
    memcpy(&d, p + 208, 2);
    int8_t sc = (int8_t)p[192 + 8 * h + (32 * j + l) / 16];
    return krn_f16_to_f32(d) * (float)sc * (float)(q - 32);
  }
  }
  return NAN;
}

// Dequantize row j of w (m rows of k elements of type t).
inline std::vector<double> dequant_row(const uint8_t *w, krn_type t, int k, int j) {
  std::vector<double> out((size_t)k);
  const uint8_t *row = w + krn_row_size(t, k) * j;
  for (int e = 0; e < k; e++) out[e] = dequant_elem(row, t, e);
  return out;
}

// Every row of w (m rows of k elements of type t), dequantized.
inline std::vector<std::vector<double>> dequant_rows(const uint8_t *w, krn_type t, int k, int m) {
  std::vector<std::vector<double>> rows;
  for (int j = 0; j < m; j++) rows.push_back(dequant_row(w, t, k, j));
  return rows;
}

// What a product of dequantized weight row wd(k) with activation row x(k) may be off by on a SIMD backend: *mag =
// sum|w||x| (float rounding: 1e-5 of it), *qbound = sum over blocks b of max|x_b| / 127 / 2 * sum_b |w| (each
// activation element moves by at most half its block's int8 step).
inline void matmul_bounds(const std::vector<double> &wd, const float *x, int k, double *mag, double *qbound) {
  *mag = *qbound = 0;
  for (int b = 0; b < k / 32; b++) {
    double amax = 0, wabs = 0;
    for (int e = b * 32; e < b * 32 + 32; e++) {
      *mag += std::fabs(wd[e] * x[e]);
      amax = std::max(amax, std::fabs((double)x[e]));
      wabs += std::fabs(wd[e]);
    }
    *qbound += amax / 127 / 2 * wabs;
  }
}

inline std::vector<float> random_floats(std::mt19937 &rng, size_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = u(rng);
  return v;
}

// A batch for paged attention: sequences with their lengths, the new tokens each brings, shuffled block ids.
struct PagedBatch {
  int n_head, n_kv_head, head_dim, block_size = 16, max_blocks;
  krn_type kv_type;
  std::vector<int32_t> tok_seq, tok_pos, tables;
  int n_blocks;
  std::vector<uint8_t> kc, vc;
  // dense K/V per sequence: (seq)(len, n_kv_head, head_dim), as the cache holds them (after f16 rounding)
  std::vector<std::vector<float>> dk, dv;
  krn_attn_args args() {
    krn_attn_args a{};
    a.n_tokens = (int)tok_seq.size();
    a.n_head = n_head;
    a.n_kv_head = n_kv_head;
    a.head_dim = head_dim;
    a.block_size = block_size;
    a.tok_seq = tok_seq.data();
    a.tok_pos = tok_pos.data();
    a.block_tables = tables.data();
    a.max_blocks = max_blocks;
    a.k_cache = kc.data();
    a.v_cache = vc.data();
    a.kv_type = kv_type;
    a.scale = 1.0f / std::sqrt((float)head_dim);
    return a;
  }
};

// x through Q8_0 and back (ggml's blocks of 32, as a Q8_0 cache holds it); x.size() a multiple of 32.
inline void q8_0_round_trip(std::vector<float> &x) {
  std::vector<krn_block_q8_0> b(x.size() / KRN_QK);
  krn_quant_row_q8_0(b.data(), x.data(), (int)x.size());
  for (size_t i = 0; i < x.size(); i++) x[i] = krn_f16_to_f32(b[i / KRN_QK].d) * (float)b[i / KRN_QK].qs[i % KRN_QK];
}

// Element e of the position row at byte offset off of a cache of type t (Q8_0: d * q of its block).
inline float kv_cache_value(const std::vector<uint8_t> &cache, krn_type t, size_t off, size_t e) {
  const uint8_t *r = cache.data() + off;
  if (t == KRN_F32) return ((const float *)r)[e];
  if (t == KRN_F16) return krn_f16_to_f32(((const krn_f16 *)r)[e]);
  const krn_block_q8_0 *b = (const krn_block_q8_0 *)r + e / KRN_QK;
  return krn_f16_to_f32(b->d) * (float)b->qs[e % KRN_QK];
}

// Sequence s has ctx[s] positions in total, of which the last new_toks[s] are this batch's query rows.
// The cache is filled with kv_store from random K/V for every position (so kv_store is exercised too).
inline PagedBatch make_batch(std::mt19937 &rng, const krn_backend *be, krn_ctx *c, int n_head, int n_kv_head, int hd,
                             krn_type kv_type, const std::vector<int> &ctx, const std::vector<int> &new_toks) {
  PagedBatch pb;
  pb.n_head = n_head;
  pb.n_kv_head = n_kv_head;
  pb.head_dim = hd;
  pb.kv_type = kv_type;
  int ns = (int)ctx.size(), maxb = 0, total = 0;
  for (int s = 0; s < ns; s++) {
    int nb = (ctx[s] + pb.block_size - 1) / pb.block_size;
    maxb = std::max(maxb, nb);
    total += nb;
  }
  pb.max_blocks = maxb + 1;   // one spare column, left -1
  pb.n_blocks = total + 3;    // a few blocks nobody uses
  std::vector<int32_t> ids(pb.n_blocks);
  for (int i = 0; i < pb.n_blocks; i++) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  pb.tables.assign((size_t)ns * pb.max_blocks, -1);
  int next = 0;
  for (int s = 0; s < ns; s++)
    for (int b = 0; b < (ctx[s] + pb.block_size - 1) / pb.block_size; b++) pb.tables[(size_t)s * pb.max_blocks + b] = ids[next++];
  size_t kvd = (size_t)n_kv_head * hd, row = krn_row_size(kv_type, (int64_t)kvd); // a position's bytes
  pb.kc.assign((size_t)pb.n_blocks * pb.block_size * row, 0xff); // garbage (nan) outside written slots
  pb.vc.assign(pb.kc.size(), 0xff);
  pb.dk.resize(ns);
  pb.dv.resize(ns);
  // store every position of every sequence through kv_store, in one call
  std::vector<int32_t> ss, pp;
  std::vector<float> k, v;
  for (int s = 0; s < ns; s++) {
    auto ks = random_floats(rng, (size_t)ctx[s] * kvd), vs = random_floats(rng, (size_t)ctx[s] * kvd);
    for (int p = 0; p < ctx[s]; p++) { ss.push_back(s); pp.push_back(p); }
    k.insert(k.end(), ks.begin(), ks.end());
    v.insert(v.end(), vs.begin(), vs.end());
    if (kv_type == KRN_F16) {
      for (auto &x : ks) x = krn_f16_to_f32(krn_f32_to_f16(x));
      for (auto &x : vs) x = krn_f16_to_f32(krn_f32_to_f16(x));
    } else if (kv_type == KRN_Q8_0) {
      q8_0_round_trip(ks);
      q8_0_round_trip(vs);
    }
    pb.dk[s] = ks;
    pb.dv[s] = vs;
  }
  krn_attn_args a = pb.args();
  a.n_tokens = (int)ss.size();
  a.tok_seq = ss.data();
  a.tok_pos = pp.data();
  be->kv_store(c, k.data(), v.data(), &a);
  for (int s = 0; s < ns; s++)
    for (int p = ctx[s] - new_toks[s]; p < ctx[s]; p++) { pb.tok_seq.push_back(s); pb.tok_pos.push_back(p); }
  return pb;
}

// Dense causal attention for the batch's query rows, in double.
// softcap > 0: scores s become softcap * tanh(s / softcap) before the softmax (Gemma 2).
inline std::vector<double> dense_attention(const PagedBatch &pb, const std::vector<float> &q, double softcap = 0) {
  int nt = (int)pb.tok_seq.size(), hd = pb.head_dim, group = pb.n_head / pb.n_kv_head;
  std::vector<double> out((size_t)nt * pb.n_head * hd, 0.0);
  double scale = 1.0 / std::sqrt((double)hd);
  for (int t = 0; t < nt; t++) {
    int s = pb.tok_seq[t], pos = pb.tok_pos[t];
    for (int h = 0; h < pb.n_head; h++) {
      int kh = h / group;
      const float *qv = &q[((size_t)t * pb.n_head + h) * hd];
      std::vector<double> sc(pos + 1);
      double mx = -1e300, sum = 0;
      for (int p = 0; p <= pos; p++) {
        double d = 0;
        for (int e = 0; e < hd; e++) d += (double)qv[e] * pb.dk[s][((size_t)p * pb.n_kv_head + kh) * hd + e];
        sc[p] = d * scale;
        if (softcap > 0) sc[p] = softcap * std::tanh(sc[p] / softcap);
        mx = std::max(mx, sc[p]);
      }
      for (int p = 0; p <= pos; p++) { sc[p] = std::exp(sc[p] - mx); sum += sc[p]; }
      double *o = &out[((size_t)t * pb.n_head + h) * hd];
      for (int p = 0; p <= pos; p++)
        for (int e = 0; e < hd; e++) o[e] += sc[p] / sum * pb.dv[s][((size_t)p * pb.n_kv_head + kh) * hd + e];
    }
  }
  return out;
}

} // namespace krntest
#endif
