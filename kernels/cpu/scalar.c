// kernels/cpu/scalar.c: the plain C reference backend ("scalar") every other backend is tested against.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

// ---- memory ----

void *krn_scalar_alloc(krn_ctx *c, size_t bytes) {
  (void)c;
  size_t n = (bytes + 63) & ~(size_t)63;
  if (n < bytes) return NULL; // overflow
  return aligned_alloc(64, n ? n : 64);
}
void krn_scalar_free(krn_ctx *c, void *p) { (void)c; free(p); }
void krn_scalar_upload(krn_ctx *c, void *dst, const void *src, size_t bytes) { (void)c; if (bytes) memcpy(dst, src, bytes); }
void krn_scalar_download(krn_ctx *c, void *dst, const void *src, size_t bytes) { (void)c; if (bytes) memcpy(dst, src, bytes); }
void krn_scalar_sync(krn_ctx *c) { (void)c; }
void *krn_scalar_event_new(krn_ctx *c) {
  static const char token; // every cpu event is this one address: nothing is ever pending
  (void)c;
  return (void *)&token;
}
void krn_scalar_event_noop(krn_ctx *c, void *ev) { (void)c; (void)ev; }

// ---- (de)quantization ----

// Each type's arithmetic is ggml's (and the gguf Python package's) in the same float order, so that the result
// is bit for bit theirs (tests/kernels/test_golden.cc); the kernels are built without FMA contraction.
void krn_scalar_dequant_row(float *out, const void *row, krn_type t, int k) {
  int nb = k / KRN_QK, nk = k / KRN_QK_K;
  switch (t) {
  case KRN_F32: memcpy(out, row, (size_t)k * sizeof(float)); break;
  case KRN_F16: {
    const krn_f16 *h = row;
    for (int j = 0; j < k; j++) out[j] = krn_f16_to_f32(h[j]);
  } break;
  case KRN_BF16: {
    const krn_bf16 *h = row;
    for (int j = 0; j < k; j++) out[j] = krn_bf16_to_f32(h[j]);
  } break;
  case KRN_Q4_0: {
    const krn_block_q4_0 *b = row;
    for (int i = 0; i < nb; i++) {
      float d = krn_f16_to_f32(b[i].d);
      for (int j = 0; j < 16; j++) {
        out[i * 32 + j] = d * (float)((b[i].qs[j] & 15) - 8);
        out[i * 32 + j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
      }
    }
  } break;
  case KRN_Q4_1: {
    const krn_block_q4_1 *b = row;
    for (int i = 0; i < nb; i++) {
      float d = krn_f16_to_f32(b[i].d), m = krn_f16_to_f32(b[i].m);
      for (int j = 0; j < 16; j++) {
        out[i * 32 + j] = d * (float)(b[i].qs[j] & 15) + m;
        out[i * 32 + j + 16] = d * (float)(b[i].qs[j] >> 4) + m;
      }
    }
  } break;
  case KRN_Q5_0: {
    const krn_block_q5_0 *b = row;
    for (int i = 0; i < nb; i++) {
      float d = krn_f16_to_f32(b[i].d);
      uint32_t qh = (uint32_t)b[i].qh[0] | (uint32_t)b[i].qh[1] << 8 | (uint32_t)b[i].qh[2] << 16 | (uint32_t)b[i].qh[3] << 24;
      for (int j = 0; j < 16; j++) {
        int q0 = (b[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4, q1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        out[i * 32 + j] = d * (float)(q0 - 16);
        out[i * 32 + j + 16] = d * (float)(q1 - 16);
      }
    }
  } break;
  case KRN_Q5_1: {
    const krn_block_q5_1 *b = row;
    for (int i = 0; i < nb; i++) {
      float d = krn_f16_to_f32(b[i].d), m = krn_f16_to_f32(b[i].m);
      uint32_t qh = (uint32_t)b[i].qh[0] | (uint32_t)b[i].qh[1] << 8 | (uint32_t)b[i].qh[2] << 16 | (uint32_t)b[i].qh[3] << 24;
      for (int j = 0; j < 16; j++) {
        int q0 = (b[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4, q1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        out[i * 32 + j] = d * (float)q0 + m;
        out[i * 32 + j + 16] = d * (float)q1 + m;
      }
    }
  } break;
  case KRN_Q8_0: {
    const krn_block_q8_0 *b = row;
    for (int i = 0; i < nb; i++) {
      float d = krn_f16_to_f32(b[i].d);
      for (int j = 0; j < 32; j++) out[i * 32 + j] = d * (float)b[i].qs[j];
    }
  } break;
  case KRN_Q4_K:
  case KRN_Q5_K: {
    // Q4_K and Q5_K share the scales and the nibbles (at different offsets); Q5_K adds a fifth bit from qh.
    const int five = t == KRN_Q5_K;
    const size_t bs = five ? sizeof(krn_block_q5_k) : sizeof(krn_block_q4_k);
    for (int i = 0; i < nk; i++) {
      const uint8_t *blk = (const uint8_t *)row + (size_t)i * bs;
      const krn_block_q4_k *h = (const krn_block_q4_k *)blk; // d, dmin, scales: the same offsets in both
      const uint8_t *qs = five ? ((const krn_block_q5_k *)blk)->qs : h->qs, *qh = ((const krn_block_q5_k *)blk)->qh;
      float d = krn_f16_to_f32(h->d), dmin = krn_f16_to_f32(h->dmin);
      float *o = out + (size_t)i * KRN_QK_K;
      for (int s = 0; s < 8; s++) {
        int sc, mn;
        krn_k_scale_min(h->scales, s, &sc, &mn);
        float dl = d * (float)sc, ml = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        for (int l = 0; l < 32; l++) {
          int v = (q[l] >> (4 * (s & 1))) & 15;
          if (five) v |= ((qh[l] >> s) & 1) << 4;
          o[32 * s + l] = dl * (float)v - ml;
        }
      }
    }
  } break;
  case KRN_Q6_K: {
    const krn_block_q6_k *b = row;
    for (int i = 0; i < nk; i++) {
      float d = krn_f16_to_f32(b[i].d);
      for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
        float *o = out + (size_t)i * KRN_QK_K + 128 * h;
        for (int j = 0; j < 4; j++) {
          for (int l = 0; l < 32; l++) {
            int q = ((ql[l + 32 * (j & 1)] >> (4 * (j >> 1))) & 15) | ((qh[l] >> (2 * j)) & 3) << 4;
            int e = 32 * j + l;
            o[e] = d * (float)b[i].scales[8 * h + e / 16] * (float)(q - 32);
          }
        }
      }
    }
  } break;
  }
}

void krn_scalar_quant_row_q8x(krn_q8x *out, const float *x, int k) {
  for (int i = 0; i < k / KRN_QK; i++) {
    const float *xb = x + i * KRN_QK;
    float amax = 0;
    for (int j = 0; j < KRN_QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
    float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < KRN_QK; j++) {
      int q = (int)lrintf(xb[j] * id);
      q = q > 127 ? 127 : q < -127 ? -127 : q;
      out[i].qs[j] = (int8_t)q;
      sum += q;
    }
    out[i].d = d;
    out[i].s = d * (float)sum;
  }
}

// ---- matmul: the exact product of the dequantized weight with the f32 activation ----

typedef struct mm_task {
  float *y;
  const void *w;
  krn_type wt;
  const float *x;
  int n, k, m;
} mm_task;

static void mm_run(void *vp, int ith, int nth) {
  mm_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range(t->m, ith, nth, &lo, &hi);
  if (lo >= hi) return;
  float *row = malloc((size_t)t->k * sizeof(float));
  if (!row) abort(); // k floats: only impossible sizes fail here
  size_t rs = krn_row_size(t->wt, t->k);
  for (int64_t j = lo; j < hi; j++) {
    krn_scalar_dequant_row(row, (const char *)t->w + (size_t)j * rs, t->wt, t->k);
    for (int i = 0; i < t->n; i++) {
      const float *xi = t->x + (size_t)i * t->k;
      double acc = 0;
      for (int e = 0; e < t->k; e++) acc += (double)row[e] * xi[e];
      t->y[(size_t)i * t->m + j] = (float)acc;
    }
  }
  free(row);
}

static void scalar_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  if (!krn_cpu_mm_ok(wt, n, k, m)) { if (n > 0 && m > 0) krn_cpu_fill_nan(y, (int64_t)n * m); return; }
  mm_task t = {y, w, wt, x, n, k, m};
  krn_cpu_par(c, mm_run, &t);
}

void krn_scalar_get_rows(krn_ctx *c, float *out, const void *w, krn_type wt, const int32_t *ids, int n, int k) {
  (void)c;
  if (!krn_cpu_mm_ok(wt, n, k, 1)) { if (n > 0 && k > 0) krn_cpu_fill_nan(out, (int64_t)n * k); return; }
  size_t rs = krn_row_size(wt, k);
  for (int i = 0; i < n; i++) krn_scalar_dequant_row(out + (size_t)i * k, (const char *)w + (size_t)ids[i] * rs, wt, k);
}

// ---- elementwise ----

static void scalar_rmsnorm(krn_ctx *c, float *out, const float *x, const float *w, int n, int d, float eps) {
  (void)c;
  for (int i = 0; i < n; i++) {
    const float *xi = x + (size_t)i * d;
    float *oi = out + (size_t)i * d;
    double ss = 0;
    for (int j = 0; j < d; j++) ss += (double)xi[j] * xi[j];
    float inv = (float)(1.0 / sqrt(ss / d + eps));
    for (int j = 0; j < d; j++) oi[j] = xi[j] * inv * w[j];
  }
}

void krn_scalar_rope_span(float *x, const int32_t *pos, int t0, int t1, int n_head, int head_dim,
                          const float *inv_freq, float mscale, int neox) {
  int half = head_dim / 2;
  for (int t = t0; t < t1; t++) {
    for (int i = 0; i < half; i++) {
      float ang = (float)pos[t] * inv_freq[i], cs = cosf(ang) * mscale, sn = sinf(ang) * mscale;
      for (int h = 0; h < n_head; h++) {
        float *v = x + ((size_t)t * n_head + h) * head_dim;
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs - x1 * sn;
        v[b] = x0 * sn + x1 * cs;
      }
    }
  }
}

float *krn_scalar_rope_inv_freq(float theta, int head_dim) {
  float *f = malloc((size_t)(head_dim / 2 + 1) * sizeof(float));
  if (!f) abort(); // half a head of floats: only impossible sizes fail here
  for (int i = 0; i < head_dim / 2; i++) f[i] = powf(theta, -2.0f * (float)i / (float)head_dim);
  return f;
}

void krn_scalar_rope(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta, int neox) {
  (void)c;
  float *f = krn_scalar_rope_inv_freq(theta, head_dim);
  krn_scalar_rope_span(x, pos, 0, n, n_head, head_dim, f, 1.0f, neox);
  free(f);
}

void krn_scalar_rope_freqs(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim,
                           const float *inv_freq, float mscale, int neox) {
  (void)c;
  krn_scalar_rope_span(x, pos, 0, n, n_head, head_dim, inv_freq, mscale, neox);
}

static void scalar_swiglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n) {
  (void)c;
  for (int64_t i = 0; i < n; i++) {
    float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// gelu(x) ~ 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), the approximation Gemma and llama.cpp use
void krn_scalar_geglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n) {
  (void)c;
  const float k = 0.7978845608028654f; // sqrt(2 / pi)
  for (int64_t i = 0; i < n; i++) {
    float g = gate[i];
    out[i] = 0.5f * g * (1.0f + tanhf(k * g * (1.0f + 0.044715f * g * g))) * up[i];
  }
}

void krn_scalar_scale(krn_ctx *c, float *x, float s, int64_t n) {
  (void)c;
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void krn_scalar_softcap(krn_ctx *c, float *x, float cap, int64_t n) {
  (void)c;
  for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

static void scalar_softmax(krn_ctx *c, float *x, int n, int d) {
  (void)c;
  for (int i = 0; i < n; i++) {
    float *r = x + (size_t)i * d, mx = -INFINITY;
    for (int j = 0; j < d; j++) mx = fmaxf(mx, r[j]);
    double sum = 0;
    for (int j = 0; j < d; j++) { r[j] = expf(r[j] - mx); sum += r[j]; }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < d; j++) r[j] *= inv;
  }
}

static void scalar_add(krn_ctx *c, float *y, const float *x, int64_t n) {
  (void)c;
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

// Rows [lo, hi) of moe_combine (krn.h): the accumulator in j order, then added to y. Shared by the SIMD backends for
// what their vectors leave over, so the arithmetic is the same: a product and a sum per term, no fused multiply-add.
void krn_scalar_moe_combine_span(float *y, const float *x, const int32_t *rows, const float *w, int k_used, int d,
                                 int64_t i, int e0, int e1) {
  float *yi = y + (size_t)i * d;
  for (int e = e0; e < e1; e++) {
    float acc = 0;
    for (int j = 0; j < k_used; j++) {
      float p = w[i * k_used + j] * x[(size_t)rows[i * k_used + j] * d + e];
      acc = j == 0 ? p : acc + p;
    }
    yi[e] += acc;
  }
}

static void scalar_moe_combine(krn_ctx *c, float *y, const float *x, const int32_t *rows, const float *w, int n,
                               int k_used, int d) {
  (void)c;
  if (n <= 0 || k_used <= 0 || d <= 0) return;
  for (int64_t i = 0; i < n; i++) krn_scalar_moe_combine_span(y, x, rows, w, k_used, d, i, 0, d);
}

// ---- KV cache and attention ----

void krn_cpu_kv_store_row(void *dst, const float *x, const krn_attn_args *a) {
  int kvd = a->n_kv_head * a->head_dim;
  if (a->kv_type == KRN_F32) memcpy(dst, x, (size_t)kvd * sizeof(float));
  else if (a->kv_type == KRN_Q8_0) krn_quant_row_q8_0(dst, x, kvd); // head_dim % 32 == 0: no group spans two heads
  else for (int j = 0; j < kvd; j++) ((krn_f16 *)dst)[j] = krn_f32_to_f16(x[j]);
}

void krn_scalar_kv_store(krn_ctx *c, const float *k, const float *v, const krn_attn_args *a) {
  (void)c;
  if (!krn_cpu_attn_ok(a)) return; // nothing sensible to write
  int kvd = a->n_kv_head * a->head_dim;
  for (int t = 0; t < a->n_tokens; t++) {
    int32_t blk = krn_cpu_block_of(a, a->tok_seq[t], a->tok_pos[t]);
    if (blk < 0) continue; // outside the sequence's block table: nothing to write
    size_t off = krn_cpu_kv_off(a, blk, a->tok_pos[t] % a->block_size);
    krn_cpu_kv_store_row((char *)a->k_cache + off, k + (size_t)t * kvd, a);
    krn_cpu_kv_store_row((char *)a->v_cache + off, v + (size_t)t * kvd, a);
  }
}

// Element e of the (position, kv head) row at byte offset off, read in place (Q8_0: d * q of its block).
static inline float kv_at(const void *cache, krn_type t, size_t off, int e) {
  const char *row = (const char *)cache + off;
  if (t == KRN_F32) return ((const float *)row)[e];
  if (t == KRN_F16) return krn_f16_to_f32(((const krn_f16 *)row)[e]);
  const krn_block_q8_0 *b = (const krn_block_q8_0 *)row + e / KRN_QK;
  return krn_f16_to_f32(b->d) * (float)b->qs[e % KRN_QK];
}

typedef struct attn_task {
  float *out;
  const float *q;
  const krn_attn_args *a;
} attn_task;

static void attn_run(void *vp, int ith, int nth) {
  attn_task *t = vp;
  const krn_attn_args *a = t->a;
  int hd = a->head_dim, vd = krn_cpu_attn_vd(a), group = a->n_head / a->n_kv_head;
  int64_t lo, hi;
  krn_cpu_range((int64_t)a->n_tokens * a->n_head, ith, nth, &lo, &hi);
  if (lo >= hi) return;
  float *sc = malloc(((size_t)a->max_blocks * a->block_size + 1) * sizeof(float));
  if (!sc) abort();
  for (int64_t it = lo; it < hi; it++) {
    int tok = (int)(it / a->n_head), h = (int)(it % a->n_head), kh = h / group;
    int32_t seq = a->tok_seq[tok], pos = a->tok_pos[tok];
    const float *q = t->q + ((size_t)tok * a->n_head + h) * hd;
    float *o = t->out + ((size_t)tok * a->n_head + h) * vd;
    float mx = -INFINITY;
    const int32_t p_lo = krn_cpu_first_visible(a, pos);
    for (int32_t p = 0; p <= pos; p++) {
      int32_t blk = krn_cpu_block_of(a, seq, p);
      sc[p] = -INFINITY;
      if (blk < 0 || p < p_lo) continue;
      size_t base = krn_cpu_kv_off(a, blk, p % a->block_size) + krn_cpu_kv_head_off(a, kh);
      double s = 0;
      for (int e = 0; e < hd; e++) s += (double)q[e] * kv_at(a->k_cache, a->kv_type, base, e);
      sc[p] = (float)s * a->scale;
      if (a->softcap > 0) sc[p] = a->softcap * tanhf(sc[p] / a->softcap);
      mx = fmaxf(mx, sc[p]);
    }
    for (int e = 0; e < vd; e++) o[e] = 0;
    if (mx == -INFINITY) continue; // nothing visible
    double sum = 0;
    for (int32_t p = 0; p <= pos; p++) { sc[p] = expf(sc[p] - mx); sum += sc[p]; }
    for (int32_t p = p_lo; p <= pos; p++) {
      int32_t blk = krn_cpu_block_of(a, seq, p);
      if (blk < 0) continue;
      size_t base = krn_cpu_kv_off(a, blk, p % a->block_size) + krn_cpu_kv_head_off(a, kh);
      float w = (float)(sc[p] / sum);
      for (int e = 0; e < vd; e++) o[e] += w * kv_at(a->v_cache, a->kv_type, base, e);
    }
  }
  free(sc);
}

static void scalar_paged_attention(krn_ctx *c, float *out, const float *q, const krn_attn_args *a) {
  if (!krn_cpu_attn_ok(a)) { if (a->n_tokens > 0 && a->n_head > 0 && a->head_dim > 0) krn_cpu_fill_nan(out, (int64_t)a->n_tokens * a->n_head * (a->v_dim > 0 ? a->v_dim : a->head_dim)); return; }
  attn_task t = {out, q, a};
  krn_cpu_par(c, attn_run, &t);
}

static const krn_backend scalar_backend = {
    .name = "scalar",
    .alloc = krn_scalar_alloc,
    .free = krn_scalar_free,
    .upload = krn_scalar_upload,
    .download = krn_scalar_download,
    .sync = krn_scalar_sync,
    .matmul = scalar_matmul,
    .get_rows = krn_scalar_get_rows,
    .rmsnorm = scalar_rmsnorm,
    .rope = krn_scalar_rope,
    .swiglu = scalar_swiglu,
    .softmax = scalar_softmax,
    .add = scalar_add,
    .kv_store = krn_scalar_kv_store,
    .paged_attention = scalar_paged_attention,
    .ctx_init = NULL,
    .ctx_fini = NULL,
    .event_new = krn_scalar_event_new,
    .event_free = krn_scalar_event_noop,
    .event_record = krn_scalar_event_noop,
    .event_wait = krn_scalar_event_noop,
    .geglu = krn_scalar_geglu,
    .scale = krn_scalar_scale,
    .attn_window = 1,
    .kv_q8_0 = 1,
    .rope_freqs = krn_scalar_rope_freqs,
    .moe_combine = scalar_moe_combine,
    .attn_softcap = 1,
    .attn_vdim = 1,
    .softcap = krn_scalar_softcap,
};

const krn_backend *krn_cpu_scalar(void) { return &scalar_backend; }
