// kernels/krn.h: numeric types, the thread pool, and the op backend table that cpu and cuda fill in.
#ifndef DSERVE_KRN_H
#define DSERVE_KRN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Tensor element types, numbered as GGUF/ggml number them.
typedef enum krn_type {
  KRN_F32 = 0,
  KRN_F16 = 1,
  KRN_Q4_0 = 2,
  KRN_Q4_1 = 3,
  KRN_Q5_0 = 6,
  KRN_Q5_1 = 7,
  KRN_Q8_0 = 8,
  KRN_Q4_K = 12,
  KRN_Q5_K = 13,
  KRN_Q6_K = 14,
  KRN_BF16 = 30,
} krn_type;

#define KRN_QK 32    // elements per block of the 32-element types, and per activation block of the cpu backends
#define KRN_QK_K 256 // elements per super-block of the K-quants (Q4_K, Q5_K, Q6_K)

typedef uint16_t krn_f16;  // IEEE half, stored as bits
typedef uint16_t krn_bf16; // bfloat16: the high 16 bits of an f32

// Block layouts are ggml's, byte for byte (a GGUF's tensor data is used in place).
typedef struct krn_block_q4_0 { krn_f16 d; uint8_t qs[KRN_QK / 2]; } krn_block_q4_0;             // x = d * (q - 8)
typedef struct krn_block_q4_1 { krn_f16 d; krn_f16 m; uint8_t qs[KRN_QK / 2]; } krn_block_q4_1;  // x = d * q + m
typedef struct krn_block_q8_0 { krn_f16 d; int8_t qs[KRN_QK]; } krn_block_q8_0;                  // x = d * q
// In q4 and q5 blocks, element j (j < 16) is the low nibble of qs[j], element j + 16 the high nibble; a q5
// element's fifth bit is bit j of qh read as a little-endian uint32.
typedef struct krn_block_q5_0 { krn_f16 d; uint8_t qh[4]; uint8_t qs[KRN_QK / 2]; } krn_block_q5_0;            // x = d * (q - 16)
typedef struct krn_block_q5_1 { krn_f16 d; krn_f16 m; uint8_t qh[4]; uint8_t qs[KRN_QK / 2]; } krn_block_q5_1; // x = d * q + m
// K-quants: a super-block of 256 elements in 8 sub-blocks of 32 (Q6_K: 16 scales of 16 elements each).
// Q4_K / Q5_K: sub-block s has a 6-bit scale sc[s] and min m[s] packed in scales[12] (krn_k_scale_min);
// x = (d * sc[s]) * q - (dmin * m[s]). Element 32 s + l (l < 32) is the low (s even) or high (s odd) nibble of
// qs[32 (s / 2) + l]; in Q5_K its fifth bit is bit s of qh[l].
typedef struct krn_block_q4_k { krn_f16 d, dmin; uint8_t scales[12]; uint8_t qs[KRN_QK_K / 2]; } krn_block_q4_k;
typedef struct krn_block_q5_k {
  krn_f16 d, dmin;
  uint8_t scales[12];
  uint8_t qh[KRN_QK_K / 8];
  uint8_t qs[KRN_QK_K / 2];
} krn_block_q5_k;
// Q6_K: x = (d * scales[i / 16]) * (q - 32), q of 6 bits. In half h (128 elements; ql += 64 h, qh += 32 h) element
// 32 j + l (j < 4, l < 32) takes its low 4 bits from ql[l + 32 (j & 1)] (low nibble for j < 2, high for j >= 2) and
// its high 2 bits from qh[l] >> 2 j.
typedef struct krn_block_q6_k {
  uint8_t ql[KRN_QK_K / 2];
  uint8_t qh[KRN_QK_K / 4];
  int8_t scales[KRN_QK_K / 16];
  krn_f16 d;
} krn_block_q6_k;

// Sub-block j (< 8) of a Q4_K / Q5_K scales[12]: 6-bit scale and min. j < 4: the low 6 bits of bytes j and
// j + 4; j >= 4: a nibble of byte j + 4 with the top 2 bits of byte j - 4 (scale) or j (min) above it.
static inline void krn_k_scale_min(const uint8_t *q, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

int krn_type_known(int type);              // 1 for the types above
const char *krn_type_name(int type);       // "F32", "Q4_1", ... also for types dserve refuses ("Q2_K")
int krn_type_block(int type);              // elements per block: 1 (F32, F16, BF16), 32, 256 (K-quants); 0 if unknown
size_t krn_type_block_bytes(int type);     // bytes per block; 0 if unknown
size_t krn_row_size(krn_type t, int64_t n); // bytes holding n elements (n a multiple of krn_type_block(t))
float krn_f16_to_f32(krn_f16 h);
krn_f16 krn_f32_to_f16(float f);
float krn_bf16_to_f32(krn_bf16 h);
krn_bf16 krn_f32_to_bf16(float f); // round to nearest even; NaN stays a (quiet) NaN

// KV cache element types: F16 (the default), F32, and Q8_0 (ggml's blocks of 32 values with their f16 scale: a cache
// row of head_dim values is head_dim / 32 blocks, so every KV block carries its own scales). A row's bytes are
// krn_row_size(type, n): the one size every layer (pool, wire, stage, prefix tiers) derives from.
int krn_kv_type_parse(const char *name);        // "f16", "f32", "q8_0" -> the type; -1 for anything else
const char *krn_kv_type_str(int type);          // the config's name of a KV type: "f16", "f32", "q8_0"; else "unknown"
int krn_kv_type_ok(int type, int head_dim);     // 1: a cache of that type holds rows of head_dim (Q8_0: 32 | head_dim)
// out(n / 32) = x(n) in Q8_0 (ggml's layout, which any Q8_0 reader decodes as d * q): per group of 32, ggml's own
// encoding (d = max|x| / 127 as f16, q = round(x / d)) or one of 16 slightly smaller scales, whichever has the least
// squared error, so never more error than ggml's; n a multiple of 32. The cpu tables' kv_store stores through it, so
// every cpu backend writes the same bytes.
void krn_quant_row_q8_0(krn_block_q8_0 *out, const float *x, int n);

// A small fixed thread pool. krn_pool_run calls fn(arg, ith, nth) once on each of nth threads
// (the caller is thread 0) and returns when all are done. Not reentrant: one run at a time.
typedef struct krn_pool krn_pool;
typedef void (*krn_task_fn)(void *arg, int ith, int nth);
#define KRN_POOL_MAX_THREADS 1024 // what krn_pool_new takes at most (the config's "threads" range reads it)
krn_pool *krn_pool_new(int n_threads, char *err, size_t errlen);
void krn_pool_free(krn_pool *p);
int krn_pool_threads(const krn_pool *p);
void krn_pool_run(krn_pool *p, krn_task_fn fn, void *arg);

// What an op call runs on: the cpu backends use pool; cuda uses stream/handles (owned by the backend's ctx_new).
typedef struct krn_ctx {
  const struct krn_backend *be; // (borrowed)
  krn_pool *pool;               // (borrowed) cpu thread pool, may be NULL = single thread
  void *dev;                    // (owned by be) backend private state: cuda stream, cublas handle, scratch
} krn_ctx;

// Arguments of paged attention and KV store for one layer.
typedef struct krn_attn_args {
  int n_tokens;                // rows of q / k / v / out
  int n_head, n_kv_head;       // GQA: query head h reads kv head h / (n_head / n_kv_head)
  int head_dim;
  int block_size;              // tokens per KV block (16)
  const int32_t *tok_seq;      // (n_tokens) sequence index of each row
  const int32_t *tok_pos;      // (n_tokens) position of each row; row attends to positions [0, pos] of its sequence
  const int32_t *block_tables; // (n_seqs, max_blocks) block ids of each sequence in position order
  int max_blocks;
  void *k_cache, *v_cache;     // (n_blocks, block_size, n_kv_head, head_dim) of kv_type, one layer; Q8_0: each
                               // (position, kv head) row is head_dim / 32 blocks of krn_block_q8_0
  krn_type kv_type;            // KRN_F16 (default), KRN_F32, or KRN_Q8_0 on tables with kv_q8_0 = 1
  float scale;                 // usually 1 / sqrt(head_dim)
  int window;                  // > 0: sliding window, a row at pos sees positions (pos - window, pos] only (Gemma 3's
                               // local layers; only on tables with attn_window = 1); 0: all of [0, pos]
  float softcap;               // > 0: each score s = scale * q.k becomes softcap * tanh(s / softcap) before the softmax
                               // (Gemma 2; only on tables with attn_softcap = 1); 0: scores as they are
  int v_dim;                   // > 0: each position's value is the first v_dim (<= head_dim) values of its V row, and
                               // out is (n_tokens, n_head, v_dim): MLA's latent row read as K and its latent part as V
                               // (v_cache = k_cache; only on tables with attn_vdim = 1); 0: V rows of head_dim
} krn_attn_args;

// One product of a matmul group: y(n, m) = x(n, k) . w(m, k)^T, x and n, k being the group's unless the product
// names its own x (then y(xn, m) = x(xn, k) . w^T: a mixture-of-experts layer's experts each take the tokens routed to
// them, so that all of its experts are one op).
typedef struct krn_mm {
  float *y;       // (n, m)
  const void *w;  // (m, k) of wt
  krn_type wt;
  int m;
  const float *x; // NULL: the group's activation; else this product's own, of xn rows (0 allowed: nothing to do)
  int xn;
} krn_mm;
#define KRN_MM_GROUP_MAX 64 // products one matmul_group call takes at most (an MoE layer's experts' gates and ups)

// One table per backend. Pointers are host memory for cpu backends, device memory for cuda.
typedef struct krn_backend {
  const char *name; // "scalar", "avx2", "avx512", "cuda"
  // memory: cpu = malloc/memcpy; cuda = cudaMalloc/cudaMemcpyAsync on the ctx stream
  void *(*alloc)(krn_ctx *c, size_t bytes);
  void (*free)(krn_ctx *c, void *p);
  void (*upload)(krn_ctx *c, void *dst, const void *host_src, size_t bytes);
  void (*download)(krn_ctx *c, void *host_dst, const void *src, size_t bytes);
  void (*sync)(krn_ctx *c);
  // y(n, m) = x(n, k) . w(m, k)^T; w rows of k elements in type wt, row-major
  void (*matmul)(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m);
  // out(n, k) = rows ids(n) of w(rows, k), dequantized (embedding lookup)
  void (*get_rows)(krn_ctx *c, float *out, const void *w, krn_type wt, const int32_t *ids, int n, int k);
  // out(n, d) = x / sqrt(mean(x^2) + eps) * w(d), per row; out may equal x
  void (*rmsnorm)(krn_ctx *c, float *out, const float *x, const float *w, int n, int d, float eps);
  // rotate x(n, n_head, head_dim) in place at pos(n); neox = 0: pairs (2i, 2i+1) (GGUF llama), 1: pairs (i, i + d/2)
  void (*rope)(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim, float theta, int neox);
  // out(n) = silu(gate) * up; out may equal gate
  void (*swiglu)(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n);
  // softmax in place on each row of x(n, d)
  void (*softmax)(krn_ctx *c, float *x, int n, int d);
  // y(n) += x(n)
  void (*add)(krn_ctx *c, float *y, const float *x, int64_t n);
  // write k(n_tokens, n_kv_head*head_dim), v(same) into the caches at each row's (seq, pos) slot
  void (*kv_store)(krn_ctx *c, const float *k, const float *v, const krn_attn_args *a);
  // out(n_tokens, n_head, head_dim) = softmax(q k^T * scale) v over each row's visible positions
  void (*paged_attention)(krn_ctx *c, float *out, const float *q, const krn_attn_args *a);
  // backend context set-up (cuda: device, stream, cublas); NULL for cpu backends
  int (*ctx_init)(krn_ctx *c, int device, char *err, size_t errlen);
  void (*ctx_fini)(krn_ctx *c);
  // Optional; callers use the krn_event_*, krn_download_ready and krn_host_* wrappers below, which stand in
  // for what a table leaves NULL. The cpu tables' events are trivial (ops have finished when they return) and
  // they have no download_ready or host_register.
  void *(*event_new)(krn_ctx *c);            // a marker in the ctx's queue of work; NULL when out of resources
  void (*event_free)(krn_ctx *c, void *ev);
  void (*event_record)(krn_ctx *c, void *ev); // ev now stands after everything queued on c so far
  void (*event_wait)(krn_ctx *c, void *ev);   // blocks the calling thread until the work before ev has finished
  // like download, but without waiting for the work queued on c: for memory whose writer the caller has
  // already waited for (an event), so that the copy runs while c keeps computing
  void (*download_ready)(krn_ctx *c, void *host_dst, const void *src, size_t bytes);
  // page-locks host memory for faster upload/download (cuda: cudaHostRegister); 0 ok, -1 not pinned
  int (*host_register)(krn_ctx *c, void *host, size_t bytes);
  void (*host_unregister)(krn_ctx *c, void *host);
  // The ctx's first failure (ops report none themselves: cuda errors are sticky on the ctx): 0 when none,
  // else -1 with err. NULL in the cpu tables (their ops cannot fail at run time).
  int (*error)(krn_ctx *c, char *err, size_t errlen);
  // Step graphs (cuda graphs): graph_begin starts recording the ops then queued on c instead of running
  // them; graph_end stops and returns a replayable graph (NULL when the recording broke: nothing ran, run the
  // ops again without a graph). graph_launch replays it: every pointer, size and launch shape the recorded
  // ops saw is baked in, so the caller replays only with the same buffers and shapes; -1 (nothing queued)
  // when the backend reallocated scratch the graph uses since, after which the caller records a new one.
  // NULL in the cpu tables.
  int (*graph_begin)(krn_ctx *c);
  void *(*graph_end)(krn_ctx *c);
  int (*graph_launch)(krn_ctx *c, void *graph);
  void (*graph_free)(krn_ctx *c, void *graph);
  // Ops only some architectures need (Gemma 3); NULL, or 0, in tables that lack them (cuda), where a model that
  // needs them refuses to load.
  // out(n) = gelu(gate) * up, gelu's tanh approximation; out may equal gate
  void (*geglu)(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n);
  // x(n) *= s
  void (*scale)(krn_ctx *c, float *x, float s, int64_t n);
  int attn_window; // 1: paged_attention honors krn_attn_args.window
  int kv_q8_0;     // 1: kv_store and paged_attention take KRN_Q8_0 caches (the cpu tables); 0: a Q8_0 pool is refused
  // Scaled RoPE (models whose GGUF asks for rope scaling): as rope, but pair i of a head at position p turns by
  // p * inv_freq[i] (inv_freq(head_dim / 2), backend memory), and both rotated values are multiplied by mscale
  // (YaRN's magnitude scale; 1 otherwise). NULL in cuda, where such a model refuses to load.
  void (*rope_freqs)(krn_ctx *c, float *x, const int32_t *pos, int n, int n_head, int head_dim, const float *inv_freq,
                     float mscale, int neox);
  // Optional: the products mm(n_mm <= KRN_MM_GROUP_MAX) of one activation x(n, k) (a layer's q, k and v; its gate and
  // up) as one op, so that x is quantized once and the threads share out all their rows in one pool run: a decode
  // step is memory-bound and short, and each pool run costs a wake-up and a wait for the slower thread. Same results
  // as matmul per product. Callers use krn_matmul_group, which calls matmul per product where this is NULL (cuda).
  void (*matmul_group)(krn_ctx *c, const krn_mm *mm, int n_mm, const float *x, int n, int k);
  // Mixture of experts: y(n, d) += sum over j < k_used of w[i k_used + j] * x[rows[i k_used + j]] for each row i,
  // the sum taken in j order into a zeroed accumulator, then added to y's row (so a row's result depends on its own
  // k_used terms only, in a fixed order: batch invariant). x(*, d) the experts' outputs, rows and w (n, k_used)
  // backend memory. NULL in a table that lacks it, where a mixture-of-experts model refuses to load.
  void (*moe_combine)(krn_ctx *c, float *y, const float *x, const int32_t *rows, const float *w, int n, int k_used,
                      int d);
  // Gemma 2's soft-capping (0 / NULL in tables that lack it: cuda, where such a model refuses to load).
  int attn_softcap; // 1: paged_attention honors krn_attn_args.softcap
  // x(n) = cap * tanh(x / cap) (the final logits' soft-cap), cap > 0
  void (*softcap)(krn_ctx *c, float *x, float cap, int64_t n);
  int attn_vdim; // 1: paged_attention honors krn_attn_args.v_dim (the cpu tables; 0 in cuda, where MLA cannot load)
} krn_backend;

// Backend-neutral events, so that a consumer of one layer's output (a KV push) waits for that layer only,
// not for the whole queue. On a table without event_new *out is NULL, which every call below accepts as
// "already done". krn_event_new: 0, or -1 with err.
typedef struct krn_event krn_event;
int krn_event_new(krn_ctx *c, krn_event **out, char *err, size_t errlen);
void krn_event_free(krn_ctx *c, krn_event *e);     // NULL: no-op
void krn_event_record(krn_ctx *c, krn_event *e);
void krn_event_wait(krn_ctx *c, krn_event *e);
// be->matmul_group, or be->matmul once per product where the table has none.
void krn_matmul_group(krn_ctx *c, const krn_mm *mm, int n_mm, const float *x, int n, int k);
// be->download_ready, or be->download where the table has none.
void krn_download_ready(krn_ctx *c, void *host_dst, const void *src, size_t bytes);
// be->host_register / host_unregister; 0 (nothing to do) where the table has none.
int krn_host_register(krn_ctx *c, void *host, size_t bytes);
void krn_host_unregister(krn_ctx *c, void *host);
// be->error: 0, or -1 with the ctx's first failure in err; 0 where the table has none.
int krn_ctx_error(krn_ctx *c, char *err, size_t errlen);

const krn_backend *krn_cpu_scalar(void);               // the reference every backend is tested against
const krn_backend *krn_cpu_best(void);                 // avx512 > avx2vnni > avx2 > scalar by CPU features (or DSERVE_KERNELS;
                                                       // "amx" is picked by name only: its rounding depends on batch size)
const krn_backend *krn_cpu_by_name(const char *name);  // NULL when unknown or not supported by this CPU
// Why the "amx" table is not offered on this machine ("not on this CPU", ...), or NULL when it is. The first call
// asks Linux for this process's permission to use AMX tile data (once per process: the permission is the process's).
const char *krn_cpu_amx_absent(void);
// What runs, for logs: "amx", "avx512 (amx: not on this CPU)", "avx512 (amx: present, not chosen)", "cuda".
void krn_describe(const krn_backend *be, char *out, size_t outlen);
const krn_backend *krn_cuda(void);                     // NULL when built without CUDA
int krn_cuda_device_count(void);                       // 0 without CUDA or without a GPU

#ifdef __cplusplus
}
#endif
#endif
