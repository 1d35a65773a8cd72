// kernels/cpu/simd_elementwise.h: the SIMD backends' row ops: rmsnorm, swiglu, geglu, add, softmax, rope, kv_store.
#ifndef DSERVE_KRN_CPU_SIMD_ELEMENTWISE_H
#define DSERVE_KRN_CPU_SIMD_ELEMENTWISE_H

#include "kernels/cpu/simd_vec.h"

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

// x = cap * tanh(x / cap), the final logits' soft-cap (Gemma 2): one row of the vocabulary per call, on the caller's
// thread (a few hundred thousand tanh at most, next to the output matmul's n_vocab * n_embd).
static void simd_softcap(krn_ctx *c, float *x, float cap, int64_t n) {
  const vf vc = v_set1(cap), vi = v_set1(1.0f / cap);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) v_store(x + i, v_mul(vc, v_tanh(v_mul(v_load(x + i), vi))));
  if (i < n) krn_scalar_softcap(c, x + i, cap, n - i);
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

// moe_combine (krn.h): per row, the weighted sum of its experts' rows in j order (a product and an add each, as the
// scalar reference: the same bits), then added to y. Rows share out over the pool.
typedef struct moe_task {
  float *y;
  const float *x, *w;
  const int32_t *rows;
  int n, k_used, d;
} moe_task;
static void moe_combine_rows(const moe_task *t, int64_t lo, int64_t hi) {
  const int d = t->d, ku = t->k_used;
  for (int64_t i = lo; i < hi; i++) {
    float *yi = t->y + (size_t)i * d;
    int e = 0;
    for (; e + VL <= d; e += VL) {
      vf acc = v_zero();
      for (int j = 0; j < ku; j++) {
        vf p = v_mul(v_set1(t->w[i * ku + j]), v_load(t->x + (size_t)t->rows[i * ku + j] * d + e));
        acc = j == 0 ? p : v_add(acc, p);
      }
      v_store(yi + e, v_add(v_load(yi + e), acc));
    }
    if (e < d) krn_scalar_moe_combine_span(t->y, t->x, t->rows, t->w, ku, d, i, e, d);
  }
}
static void moe_combine_run(void *vp, int ith, int nth) {
  const moe_task *t = vp;
  int64_t lo, hi;
  krn_cpu_range(t->n, ith, nth, &lo, &hi);
  moe_combine_rows(t, lo, hi);
}
static void simd_moe_combine(krn_ctx *c, float *y, const float *x, const int32_t *rows, const float *w, int n,
                             int k_used, int d) {
  if (n <= 0 || k_used <= 0 || d <= 0) return;
  moe_task t = {y, x, w, rows, n, k_used, d};
  if ((int64_t)n * k_used * d >= 4 * KRN_PAR_MIN && n > 1) krn_cpu_par(c, moe_combine_run, &t);
  else moe_combine_rows(&t, 0, n);
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
typedef struct cache_write_task {
  const float *k, *v;
  const krn_attn_args *a;
} cache_write_task;
static void cache_write_run(void *vp, int ith, int nth) {
  const cache_write_task *t = vp;
  const krn_attn_args *a = t->a;
  int kvd = a->n_kv_head * a->head_dim;
  int64_t lo, hi;
  krn_cpu_range(a->n_tokens, ith, nth, &lo, &hi);
  for (int64_t i = lo; i < hi; i++) {
    int32_t blk = krn_cpu_block_of(a, a->tok_seq[i], a->tok_pos[i]);
    if (blk < 0) continue; // outside the sequence's block table: nothing to write
    size_t off = krn_cpu_kv_off(a, blk, a->tok_pos[i] % a->block_size);
    const float *kt = t->k + (size_t)i * kvd, *vt = t->v + (size_t)i * kvd;
    if (a->kv_type != KRN_F16) { // f32: a copy; q8_0: the one quantizer every backend stores through
      krn_cpu_kv_store_row((char *)a->k_cache + off, kt, a);
      krn_cpu_kv_store_row((char *)a->v_cache + off, vt, a);
      continue;
    }
    krn_f16 *kc = (krn_f16 *)((char *)a->k_cache + off), *vc = (krn_f16 *)((char *)a->v_cache + off);
    int j = 0;
    for (; j + VL <= kvd; j += VL) { v_storeh(kc + j, v_load(kt + j)); v_storeh(vc + j, v_load(vt + j)); }
    for (; j < kvd; j++) { kc[j] = krn_f32_to_f16(kt[j]); vc[j] = krn_f32_to_f16(vt[j]); }
  }
}
static void simd_kv_store(krn_ctx *c, const float *k, const float *v, const krn_attn_args *a) {
  if (!krn_cpu_attn_ok(a)) return; // nothing sensible to write
  cache_write_task t = {k, v, a};
  if ((int64_t)a->n_tokens * a->n_kv_head * a->head_dim >= KRN_PAR_MIN && a->n_tokens > 1) krn_cpu_par(c, cache_write_run, &t);
  else cache_write_run(&t, 0, 1);
}

#endif
