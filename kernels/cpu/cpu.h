// kernels/cpu/cpu.h: what the cpu backends share internally (not part of the public krn.h interface).
#ifndef DSERVE_KRN_CPU_H
#define DSERVE_KRN_CPU_H

#include <stdint.h>

#include "kernels/krn.h"

#ifdef __cplusplus
extern "C" { // tests/kernels reaches the amx emulated table through this header
#endif

// An activation block quantized on the fly: x[j] ~= d * qs[j]; s = d * sum(qs) (for the Q4_1 offset term).
typedef struct krn_q8x {
  float d, s;
  int8_t qs[KRN_QK];
} krn_q8x;

// Run fn on c's pool, or inline as thread 0 of 1 when there is no pool.
static inline void krn_cpu_par(krn_ctx *c, krn_task_fn fn, void *arg) {
  if (c && c->pool && krn_pool_threads(c->pool) > 1) krn_pool_run(c->pool, fn, arg);
  else fn(arg, 0, 1);
}

// Contiguous share [*lo, *hi) of n items for thread ith of nth.
static inline void krn_cpu_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
  int64_t per = n / nth, rem = n % nth;
  *lo = ith * per + (ith < rem ? ith : rem);
  *hi = *lo + per + (ith < rem ? 1 : 0);
}

// Scalar ops the SIMD backends reuse where there is nothing to gain (memory, lookups, rope, kv_store).
void *krn_scalar_alloc(krn_ctx *c, size_t bytes);
void krn_scalar_free(krn_ctx *c, void *p);
void krn_scalar_upload(krn_ctx *c, void *dst, const void *src, size_t bytes);
void krn_scalar_download(krn_ctx *c, void *dst, const void *src, size_t bytes);
void krn_scalar_sync(krn_ctx *c);
// Events of the cpu tables: ops have finished when they return, so an event is a token with nothing to wait
// for. They exist so that a caller's event path (prefill/worker.c's per-layer pushes) runs in CPU-only tests too.
void *krn_scalar_event_new(krn_ctx *c);
void krn_scalar_event_noop(krn_ctx *c, void *ev);
void krn_scalar_get_rows(krn_ctx *c, float *out, const void *w, krn_type wt, const int32_t *ids, int n, int k);
// Rotates rows [t0, t1) of x by pos * inv_freq(head_dim / 2), cos and sin scaled by mscale (the one loop of rope and
// rope_freqs, which the SIMD backends run on the pool); inv_freq of plain RoPE from krn_scalar_rope_inv_freq (malloc).
void krn_scalar_rope_span(float *x, const int32_t *pos, int t0, int t1, int n_head, int head_dim,
                          const float *inv_freq, float mscale, int neox);
float *krn_scalar_rope_inv_freq(float theta, int head_dim);
void krn_scalar_rope(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta, int neox);
void krn_scalar_rope_freqs(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim,
                           const float *inv_freq, float mscale, int neox);
void krn_scalar_kv_store(krn_ctx *c, const float *k, const float *v, const krn_attn_args *a);
void krn_scalar_geglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n);
void krn_scalar_scale(krn_ctx *c, float *x, float s, int64_t n);
// Row i, elements [e0, e1), of the scalar moe_combine (the SIMD tables finish their rows with it).
void krn_scalar_moe_combine_span(float *y, const float *x, const int32_t *rows, const float *w, int k_used, int d,
                                 int64_t i, int e0, int e1);
void krn_scalar_softcap(krn_ctx *c, float *x, float cap, int64_t n); // x = cap * tanh(x / cap)
// First position a row at pos sees: pos - window + 1 under a sliding window, else 0.
static inline int32_t krn_cpu_first_visible(const krn_attn_args *a, int32_t pos) {
  return a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
}
// Dequantize one row of k elements of type t into out(k).
void krn_scalar_dequant_row(float *out, const void *row, krn_type t, int k);
// Float weight types: the SIMD backends multiply them with the float activation (no int8 activation blocks).
static inline int krn_cpu_is_float(krn_type t) { return t == KRN_F32 || t == KRN_F16 || t == KRN_BF16; }
// Quantize x(k) into k/32 activation blocks (round to nearest, d = max|x| / 127).
void krn_scalar_quant_row_q8x(krn_q8x *out, const float *x, int k);
// Block id holding position pos of sequence seq, or -1 when outside the table.
static inline int32_t krn_cpu_block_of(const krn_attn_args *a, int32_t seq, int32_t pos) {
  if (seq < 0 || pos < 0 || pos / a->block_size >= a->max_blocks) return -1;
  return a->block_tables[(int64_t)seq * a->max_blocks + pos / a->block_size];
}

// Shapes an op cannot run with: the op then fills its output with NaN (the table has no error channel),
// so a caller's bug shows up as NaN logits instead of a crash or silent garbage.
static inline int krn_cpu_mm_ok(krn_type t, int n, int k, int m) {
  if (!krn_type_known(t) || n < 0 || k <= 0 || m < 0) return 0;
  return k % krn_type_block(t) == 0;
}
static inline int krn_cpu_attn_ok(const krn_attn_args *a) {
  return a->n_tokens >= 0 && a->n_head > 0 && a->n_kv_head > 0 && a->n_head % a->n_kv_head == 0 && a->head_dim > 0 &&
         a->block_size > 0 && a->max_blocks >= 0 && krn_kv_type_ok(a->kv_type, a->head_dim) && a->v_dim >= 0 &&
         a->v_dim <= a->head_dim && (a->v_dim == 0 || krn_kv_type_ok(a->kv_type, a->v_dim));
}
// Values in one head's output row (and read of each V row): krn_attn_args.v_dim, or head_dim.
static inline int krn_cpu_attn_vd(const krn_attn_args *a) { return a->v_dim > 0 ? a->v_dim : a->head_dim; }
// Byte offset of position pos's row (all kv heads) in block blk of a cache, and of kv head kh inside a row: a cache
// row is krn_row_size(kv_type, n_kv_head * head_dim) bytes whatever the type (Q8_0's scales sit in its blocks).
static inline size_t krn_cpu_kv_off(const krn_attn_args *a, int32_t blk, int32_t pos_in_block) {
  return ((size_t)blk * (size_t)a->block_size + (size_t)pos_in_block) *
         krn_row_size(a->kv_type, (int64_t)a->n_kv_head * a->head_dim);
}
static inline size_t krn_cpu_kv_head_off(const krn_attn_args *a, int kh) {
  return (size_t)kh * krn_row_size(a->kv_type, a->head_dim);
}
// Stores one token's row x(n_kv_head * head_dim) into the cache at dst (a row's offset), in the cache's type.
void krn_cpu_kv_store_row(void *dst, const float *x, const krn_attn_args *a);
static inline void krn_cpu_fill_nan(float *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = __builtin_nanf("");
}

const krn_backend *krn_cpu_avx2_table(void);   // only call when the CPU has AVX2+FMA+F16C
const krn_backend *krn_cpu_avx2vnni_table(void); // only call when the CPU has AVX2+FMA+F16C+AVX-VNNI
const krn_backend *krn_cpu_avx512_table(void); // only call when the CPU has AVX-512 F/BW/VL/DQ/VNNI
const krn_backend *krn_cpu_amx_table(void);    // only call when the CPU has AVX-512 and usable AMX (krn_cpu_amx_absent)
// The amx kernel over plain-C tiles (amx_tile.h): a test instrument for CPUs without AMX, not a backend anyone picks
// (krn_cpu_by_name does not know it). Only call when the CPU has AVX-512.
const krn_backend *krn_cpu_amx_emulated_table(void);

#ifdef __cplusplus
}
#endif
#endif
