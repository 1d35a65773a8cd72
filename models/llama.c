// models/llama.c: Llama-family forward pass (llama, qwen2, gemma3) over a mixed prefill/decode batch and a paged KV cache.
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama.h"

typedef struct mdl_w {  // one weight matrix or vector
  const void *data;     // backend memory: the mapping (cpu) or an uploaded copy (cuda, owned by the model)
  krn_type type;
} mdl_w;

typedef struct mdl_layer {
  mdl_w attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, wg, wu, wd; // bq/bk/bv data NULL when absent
  mdl_w q_norm, k_norm, post_attn_norm, post_ffn_norm;              // gemma3 only
} mdl_layer;

// The shape of a decode step that a recorded graph replays (its buffers are the model's, fixed until they grow).
typedef struct mdl_graph_key {
  int n_seqs, max_blocks;  // one token and one logits row per sequence; block-table width
  const void *kv_base;
  int kv_type, kv_block_size, kv_n_blocks, kv_n_groups;
} mdl_graph_key;

#define MDL_GRAPHS 8 // recorded decode steps kept (round robin)

struct mdl_llama {
  mdl_llama_cfg cfg;
  const mdl_gguf *g;   // (borrowed)
  krn_ctx *kc;         // (borrowed)
  int on_host;         // 1: weights used in place from the mapping
  int f32_weights;     // 1: non-F32 weights dequantized into uploads at load (mdl_llama_opts)
  mdl_w tok_embd, output_norm, output;
  mdl_layer *layers;   // (owned) (n_layer)
  void **uploads;      // (owned) (n_uploads) device copies of the weights (cuda), or their F32 copies (f32_weights)
  int n_uploads;
  const float *rope_freq; // (head_dim / 2) cfg.rope_inv_freq in backend memory when cfg.rope_scaled (an upload on cuda)

  // Step graphs (mdl_llama_set_graphs); kept before the scratch, which a failed grow clears.
  int graphs;                      // 1: decode steps are recorded and replayed
  struct {
    mdl_graph_key key;
    void *h;                       // (owned) from kc->be->graph_end
  } gcache[MDL_GRAPHS];
  int n_gcache, g_next;
  mdl_graph_key last;              // the previous decode step's shape: a shape seen twice in a row is recorded
  long n_replayed, n_recorded;

  // Scratch, grown as needed and reused across calls; backend memory unless said host.
  int cap_t;           // token rows the activation buffers hold
  float *x, *xb;       // (cap_t, n_embd)
  float *q, *att;      // (cap_t, n_head * head_dim)
  float *k, *v;        // (cap_t, n_kv_head * head_dim)
  float *hb, *hb2;     // (cap_t, n_ff)
  int32_t *d_ids, *d_seq, *d_pos; // (cap_t)
  int cap_s;           // sequences the per-sequence buffers hold
  float *xo;           // (cap_s, n_embd) rows that want logits
  float *lo;           // (cap_s, n_vocab) their logits
  int32_t *d_rows;     // (cap_s) row index in x of each logits row
  int cap_bt;          // ints in d_bt
  int32_t *d_bt;       // (n_groups, n_seqs, max_blocks) block tables, one per layer group of the KV cache (mdl_kv)
  int bt_group_stride; // ints from one group's tables to the next's in d_bt, this step
  int32_t *h_ids, *h_seq, *h_pos; // host (cap_t)
  int32_t *h_rows, *h_rseq;       // host (cap_s): row in x, and row of the caller's logits, of each logits row
  int32_t *h_bt;                  // host (cap_bt)
};

const mdl_llama_cfg *mdl_llama_config(const mdl_llama *m) { return &m->cfg; }

static void drop_graphs(mdl_llama *m) {
  for (int i = 0; i < m->n_gcache; i++) m->kc->be->graph_free(m->kc, m->gcache[i].h);
  m->n_gcache = m->g_next = 0;
  memset(&m->last, 0, sizeof m->last);
}

int mdl_llama_set_graphs(mdl_llama *m, int on, char *err, size_t errlen) {
  const krn_backend *be = m->kc->be;
  if (on && !(be->graph_begin && be->graph_end && be->graph_launch && be->graph_free)) {
    snprintf(err, errlen, "model: the %s backend has no step graphs", be->name);
    return -1;
  }
  if (!on && m->graphs) drop_graphs(m);
  m->graphs = on != 0;
  return 0;
}

void mdl_llama_graph_stats(const mdl_llama *m, long *replayed, long *recorded) {
  if (replayed) *replayed = m->n_replayed;
  if (recorded) *recorded = m->n_recorded;
}

// ---- loading ----

static int get_int(const mdl_gguf *g, const char *arch, const char *key, int required, int dflt, int *out, char *err,
                   size_t errlen) {
  char k[128];
  snprintf(k, sizeof k, "%s.%s", arch, key);
  int64_t v;
  if (mdl_gguf_get_i64(g, k, &v) != 0) {
    if (required) {
      snprintf(err, errlen, "model: metadata %s missing", k);
      return -1;
    }
    *out = dflt;
    return 0;
  }
  if (v < 1 || v > (1 << 30)) {
    snprintf(err, errlen, "model: metadata %s = %lld out of range", k, (long long)v);
    return -1;
  }
  *out = (int)v;
  return 0;
}

// mdl_llama_opts.f32_weights: t's rows(rows, k) into an F32 copy in m->uploads, by the scalar backend's get_rows
// (krn_scalar_dequant_row, the reference every backend is tested against), a bounded run of row ids at a time.
static int dequant_w(mdl_llama *m, const char *name, const mdl_gguf_tensor *t, int64_t k, int64_t rows, mdl_w *out,
                     char *err, size_t errlen) {
  size_t bytes = (size_t)k * (size_t)rows * sizeof(float);
  float *d = m->kc->be->alloc(m->kc, bytes);
  if (!d) {
    snprintf(err, errlen, "model: cannot allocate %zu bytes for %s in F32", bytes, name);
    return -1;
  }
  m->uploads[m->n_uploads++] = d;
  const krn_backend *sc = krn_cpu_scalar();
  krn_ctx sctx = {sc, NULL, NULL};
  int32_t ids[256];
  for (int64_t r0 = 0; r0 < rows; r0 += 256) {
    int n = rows - r0 < 256 ? (int)(rows - r0) : 256;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(r0 + i);
    sc->get_rows(&sctx, d + (size_t)r0 * (size_t)k, t->data, (krn_type)t->type, ids, n, (int)k);
  }
  out->data = d;
  out->type = KRN_F32;
  return 0;
}

// Finds a tensor, checks its type and its shape (ne0 = row length, ne1 = rows; ne1 0 for a vector).
static int get_w(mdl_llama *m, const char *name, int64_t ne0, int64_t ne1, int optional, int f32_only, mdl_w *out,
                 char *err, size_t errlen) {
  const mdl_gguf_tensor *t = mdl_gguf_tensor_find(m->g, name);
  out->data = NULL;
  out->type = KRN_F32;
  if (!t) {
    if (optional) return 0;
    snprintf(err, errlen, "model: tensor %s missing", name);
    return -1;
  }
  if (!krn_type_known(t->type) || (f32_only && t->type != KRN_F32)) {
    snprintf(err, errlen, "model: tensor %s has type %s, which dserve does not support%s", name,
             krn_type_name(t->type), f32_only ? " here (F32 needed)" : " (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
    return -1;
  }
  int want_dims = ne1 ? 2 : 1;
  int64_t have1 = t->n_dims >= 2 ? t->ne[1] : 0;
  int extra = 0;
  for (int d = 2; d < t->n_dims; d++) extra |= t->ne[d] != 1;
  if (t->ne[0] != ne0 || have1 != ne1 || extra || t->n_dims < want_dims) {
    snprintf(err, errlen, "model: tensor %s has shape (%lld, %lld), expected (%lld, %lld)", name,
             (long long)t->ne[0], (long long)have1, (long long)ne0, (long long)ne1);
    return -1;
  }
  if (ne0 % krn_type_block(t->type)) {
    snprintf(err, errlen, "model: tensor %s rows of %lld are not a multiple of %d", name, (long long)ne0, krn_type_block(t->type));
    return -1;
  }
  size_t need = krn_row_size((krn_type)t->type, ne0) * (size_t)(ne1 ? ne1 : 1);
  if (t->nbytes < need) {
    snprintf(err, errlen, "model: tensor %s holds %zu bytes, %zu needed", name, t->nbytes, need);
    return -1;
  }
  out->type = (krn_type)t->type;
  if (m->f32_weights && t->type != KRN_F32) return dequant_w(m, name, t, ne0, ne1 ? ne1 : 1, out, err, errlen);
  if (m->on_host) {
    out->data = t->data;
    return 0;
  }
  void *d = m->kc->be->alloc(m->kc, need);
  if (!d) {
    snprintf(err, errlen, "model: cannot allocate %zu bytes for %s on %s", need, name, m->kc->be->name);
    return -1;
  }
  m->kc->be->upload(m->kc, d, t->data, need);
  m->uploads[m->n_uploads++] = d;
  out->data = d;
  return 0;
}

#define PI_F 3.14159265358979f

void mdl_rope_freqs(const mdl_rope_scaling *s, int n_dims, float base, float *inv_freq, float *mscale) {
  int half = n_dims / 2;
  float fs = s->type == MDL_ROPE_NONE || !(s->factor > 0) ? 1.0f : 1.0f / s->factor;
  float lo = 0, hi = 0;
  if (s->type == MDL_ROPE_YARN) { // the pairs that turn fewer than beta_fast..beta_slow times over n_ctx_orig
    float dfast = (float)n_dims * logf((float)s->n_ctx_orig / (s->beta_fast * 2.0f * PI_F)) / (2.0f * logf(base));
    float dslow = (float)n_dims * logf((float)s->n_ctx_orig / (s->beta_slow * 2.0f * PI_F)) / (2.0f * logf(base));
    lo = fmaxf(0.0f, floorf(dfast));
    hi = fminf((float)(n_dims - 1), ceilf(dslow));
  }
  for (int i = 0; i < half; i++) {
    float b = powf(base, -2.0f * (float)i / (float)n_dims);
    if (s->freq_factors) b /= s->freq_factors[i];
    float mix = 0; // yarn: 1 keeps the pair's frequency (fast pairs), 0 interpolates it (slow ones)
    if (s->type == MDL_ROPE_YARN) mix = 1.0f - fminf(1.0f, fmaxf(0.0f, ((float)i - lo) / fmaxf(0.001f, hi - lo)));
    inv_freq[i] = b * (fs * (1.0f - mix) + mix);
  }
  *mscale = s->attn_factor;
  if (s->type == MDL_ROPE_YARN && s->factor > 1.0f) *mscale *= 1.0f + 0.1f * logf(s->factor);
}

// The GGUF's RoPE scaling (llama.h) into m->cfg; an unknown type, a bad factor or a scaling this backend or
// architecture cannot run is an error. Scaling that changes nothing leaves plain RoPE.
static int rope_scaling(mdl_llama *m, const mdl_gguf *g, const char *arch, char *err, size_t errlen) {
  mdl_llama_cfg *c = &m->cfg;
  mdl_rope_scaling s = {.type = MDL_ROPE_LINEAR, .factor = 1, .attn_factor = 1, .n_ctx_orig = c->n_ctx_train,
                        .beta_fast = 32, .beta_slow = 1};
  char key[128];
  mdl_str rs;
  snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
  snprintf(c->rope_scaling, sizeof c->rope_scaling, "linear"); // llama.cpp's default when the key is absent
  if (mdl_gguf_get_str(g, key, &rs) == 0) {
    if (mdl_str_eq(rs, "none")) s.type = MDL_ROPE_NONE;
    else if (mdl_str_eq(rs, "yarn")) s.type = MDL_ROPE_YARN;
    else if (!mdl_str_eq(rs, "linear")) {
      snprintf(err, errlen,
               "model: %s '%.*s' not supported (none, linear and yarn are; Llama 3's scaling comes as the tensor "
               "rope_freqs.weight)",
               key, (int)(rs.n < 32 ? rs.n : 32), rs.p);
      return -1;
    }
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "%.*s", (int)rs.n, rs.p);
  }
  float f = 0;
  snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
  if (mdl_gguf_get_f32(g, key, &f) != 0) {
    snprintf(key, sizeof key, "%s.rope.scale_linear", arch);
    if (mdl_gguf_get_f32(g, key, &f) != 0) f = 0;
  }
  if (!(f >= 0) || !isfinite(f)) {
    snprintf(err, errlen, "model: %s = %g is not a scaling factor (> 0, or 0 for none)", key, f);
    return -1;
  }
  s.factor = f == 0 ? 1.0f : f;
  snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", arch);
  if (mdl_gguf_get_f32(g, key, &s.attn_factor) != 0) s.attn_factor = 1;
  if (!(s.attn_factor > 0) || !isfinite(s.attn_factor)) {
    snprintf(err, errlen, "model: %s = %g not positive", key, s.attn_factor);
    return -1;
  }
  int64_t oc;
  snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
  if (mdl_gguf_get_i64(g, key, &oc) == 0) {
    if (oc < 1 || oc > (1 << 30)) {
      snprintf(err, errlen, "model: %s = %lld out of range", key, (long long)oc);
      return -1;
    }
    s.n_ctx_orig = (int)oc;
  }
  int half = c->head_dim / 2;
  const mdl_gguf_tensor *ft = mdl_gguf_tensor_find(g, "rope_freqs.weight");
  if (ft) { // Llama 3.x: llama.cpp reads it for the llama architecture only
    if (strcmp(arch, "llama") != 0) {
      snprintf(err, errlen, "model: rope_freqs.weight is not supported for %s (llama only, as llama.cpp)", arch);
      return -1;
    }
    if (ft->type != KRN_F32 || ft->n_dims != 1 || ft->ne[0] != half || ft->nbytes < (size_t)half * 4) {
      snprintf(err, errlen, "model: rope_freqs.weight must be F32 of %d values (head_dim / 2)", half);
      return -1;
    }
    s.freq_factors = (const float *)ft->data;
    for (int i = 0; i < half; i++)
      if (!(s.freq_factors[i] > 0) || !isfinite(s.freq_factors[i])) {
        snprintf(err, errlen, "model: rope_freqs.weight[%d] = %g not positive", i, s.freq_factors[i]);
        return -1;
      }
    size_t l = strlen(c->rope_scaling);
    snprintf(c->rope_scaling + l, sizeof c->rope_scaling - l, "+freqs");
  }
  int identity = (s.type == MDL_ROPE_NONE || s.factor == 1.0f) && !s.freq_factors && s.attn_factor == 1.0f;
  if (identity) return 0;
  if (half > (int)(sizeof c->rope_inv_freq / sizeof c->rope_inv_freq[0])) {
    snprintf(err, errlen, "model: head_dim %d too large for scaled RoPE (512 at most)", c->head_dim);
    return -1;
  }
  if (c->gemma3 && (s.type == MDL_ROPE_YARN || s.attn_factor != 1.0f)) { // (llama.cpp scales the local layers too)
    snprintf(err, errlen, "model: yarn rope scaling or an attention factor with gemma3 is not supported (linear is)");
    return -1;
  }
  if (!m->kc->be->rope_freqs) {
    snprintf(err, errlen, "model: rope scaling (%s) needs scaled RoPE, which the %s backend lacks", c->rope_scaling,
             m->kc->be->name);
    return -1;
  }
  mdl_rope_freqs(&s, c->head_dim, c->rope_theta, c->rope_inv_freq, &c->rope_mscale);
  c->rope_scaled = 1;
  if (m->on_host) m->rope_freq = c->rope_inv_freq;
  else {
    void *d = m->kc->be->alloc(m->kc, (size_t)half * 4);
    if (!d) {
      snprintf(err, errlen, "model: cannot allocate the RoPE frequencies on %s", m->kc->be->name);
      return -1;
    }
    m->kc->be->upload(m->kc, d, c->rope_inv_freq, (size_t)half * 4);
    m->uploads[m->n_uploads++] = d;
    m->rope_freq = d;
  }
  return 0;
}

int mdl_llama_load(const mdl_gguf *g, krn_ctx *kc, mdl_llama **out, char *err, size_t errlen) {
  return mdl_llama_load_opts(g, kc, NULL, out, err, errlen);
}

int mdl_llama_load_opts(const mdl_gguf *g, krn_ctx *kc, const mdl_llama_opts *o, mdl_llama **out, char *err,
                        size_t errlen) {
  *out = NULL;
  if (!g || !kc || !kc->be) {
    snprintf(err, errlen, "model: no GGUF or no kernel context");
    return -1;
  }
  mdl_str a;
  if (mdl_gguf_get_str(g, "general.architecture", &a) != 0) {
    snprintf(err, errlen, "model: general.architecture missing");
    return -1;
  }
  char arch[32];
  snprintf(arch, sizeof arch, "%.*s", (int)(a.n < 31 ? a.n : 31), a.p);
  int qwen2 = !strcmp(arch, "qwen2"), gemma3 = !strcmp(arch, "gemma3");
  if (strcmp(arch, "llama") && !qwen2 && !gemma3) {
    snprintf(err, errlen, "model: architecture '%.*s' not supported (llama, qwen2, gemma3)", (int)(a.n < 64 ? a.n : 64),
             a.p);
    return -1;
  }
  if (gemma3 && !(kc->be->geglu && kc->be->scale && kc->be->attn_window)) {
    snprintf(err, errlen, "model: gemma3 needs GELU, scale and sliding-window attention ops, which the %s backend lacks",
             kc->be->name);
    return -1;
  }
  mdl_llama *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "model: out of memory");
    return -1;
  }
  m->g = g;
  m->kc = kc;
  m->on_host = kc->be != krn_cuda();
  m->f32_weights = o && o->f32_weights;
  if (m->f32_weights && !m->on_host) {
    snprintf(err, errlen, "model: F32 weights (a scoring reference) are for the cpu backends, not %s", kc->be->name);
    free(m);
    return -1;
  }
  mdl_llama_cfg *c = &m->cfg;
  snprintf(c->arch, sizeof c->arch, "%s", arch);
  c->rope_neox = qwen2 || gemma3; // llama.cpp: LLAMA_ROPE_TYPE_NEOX for both
  c->gemma3 = gemma3;
  if (get_int(g, arch, "block_count", 1, 0, &c->n_layer, err, errlen) ||
      get_int(g, arch, "embedding_length", 1, 0, &c->n_embd, err, errlen) ||
      get_int(g, arch, "feed_forward_length", 1, 0, &c->n_ff, err, errlen) ||
      get_int(g, arch, "attention.head_count", 1, 0, &c->n_head, err, errlen) ||
      get_int(g, arch, "attention.head_count_kv", 0, c->n_head, &c->n_kv_head, err, errlen) ||
      get_int(g, arch, "context_length", 0, 2048, &c->n_ctx_train, err, errlen))
    goto fail;
  if (c->n_embd % c->n_head || c->n_head % c->n_kv_head) {
    snprintf(err, errlen, "model: %d heads do not divide embedding %d or are not a multiple of %d KV heads", c->n_head,
             c->n_embd, c->n_kv_head);
    goto fail;
  }
  if (get_int(g, arch, "attention.key_length", 0, c->n_embd / c->n_head, &c->head_dim, err, errlen)) goto fail;
  int vlen, rdim;
  if (get_int(g, arch, "attention.value_length", 0, c->head_dim, &vlen, err, errlen) ||
      get_int(g, arch, "rope.dimension_count", 0, c->head_dim, &rdim, err, errlen))
    goto fail;
  if (vlen != c->head_dim || rdim != c->head_dim || (c->head_dim & 1)) {
    snprintf(err, errlen, "model: head dims (key %d, value %d, rope %d) differ; not supported", c->head_dim, vlen, rdim);
    goto fail;
  }
  char key[128];
  snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
  if (mdl_gguf_get_f32(g, key, &c->rms_eps) != 0) c->rms_eps = 1e-5f;
  snprintf(key, sizeof key, "%s.rope.freq_base", arch);
  if (mdl_gguf_get_f32(g, key, &c->rope_theta) != 0) c->rope_theta = 10000.0f;
  c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
  if (gemma3) {
    if (get_int(g, arch, "attention.sliding_window", 0, 0, &c->n_swa, err, errlen)) goto fail;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    const mdl_gguf_kv *pk = mdl_gguf_find(g, key);
    if (pk && pk->type == MDL_GGUF_ARR) {
      snprintf(err, errlen, "model: %s as a per-layer array is not supported (an integer pattern is)", key);
      goto fail;
    }
    if (get_int(g, arch, "attention.sliding_window_pattern", 0, 6, &c->swa_pattern, err, errlen)) goto fail;
    // llama.cpp: the local layers' RoPE base is rope.freq_base_swa when given, else 10000
    snprintf(key, sizeof key, "%s.rope.freq_base_swa", arch);
    if (mdl_gguf_get_f32(g, key, &c->rope_theta_swa) != 0) c->rope_theta_swa = 10000.0f;
    float cap = 0;
    snprintf(key, sizeof key, "%s.final_logit_softcapping", arch);
    if (mdl_gguf_get_f32(g, key, &cap) == 0 && cap != 0) {
      snprintf(err, errlen, "model: %s = %g (final logit soft-capping) not supported", key, cap);
      goto fail;
    }
    // llama.cpp (after gemma_pytorch): query_pre_attn_scalar is head_dim, except the 27B (62 layers): n_embd / n_head
    if (c->n_layer == 62) c->attn_scale = 1.0f / sqrtf((float)(c->n_embd / c->n_head));
    if (!(c->rope_theta_swa > 0)) {
      snprintf(err, errlen, "model: local rope base %g not positive", c->rope_theta_swa);
      goto fail;
    }
  }
  if (!(c->rms_eps > 0) || !(c->rope_theta > 0)) {
    snprintf(err, errlen, "model: rms epsilon %g or rope base %g not positive", c->rms_eps, c->rope_theta);
    goto fail;
  }
  const mdl_gguf_tensor *te = mdl_gguf_tensor_find(g, "token_embd.weight");
  if (!te || te->n_dims < 2 || te->ne[1] < 1 || te->ne[1] > (1 << 30)) {
    snprintf(err, errlen, "model: tensor token_embd.weight missing or not a matrix");
    goto fail;
  }
  c->n_vocab = (int)te->ne[1];
  c->tied_embeddings = mdl_gguf_tensor_find(g, "output.weight") == NULL;

  int E = c->n_embd, HD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim, F = c->n_ff;
  m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
  m->uploads = calloc((size_t)c->n_layer * 16 + 4, sizeof *m->uploads);
  if (!m->layers || !m->uploads) {
    snprintf(err, errlen, "model: out of memory");
    goto fail;
  }
  if (rope_scaling(m, g, arch, err, errlen) != 0) goto fail; // (may upload its table: after m->uploads)
  if (get_w(m, "token_embd.weight", E, c->n_vocab, 0, 0, &m->tok_embd, err, errlen) ||
      get_w(m, "output_norm.weight", E, 0, 0, 1, &m->output_norm, err, errlen))
    goto fail;
  if (c->tied_embeddings) m->output = m->tok_embd;
  else if (get_w(m, "output.weight", E, c->n_vocab, 0, 0, &m->output, err, errlen)) goto fail;
  for (int l = 0; l < c->n_layer; l++) {
    mdl_layer *L = &m->layers[l];
    char n[12][64];
    static const char *const names[12] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q",
                                          "attn_k", "attn_v", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
    for (int i = 0; i < 12; i++)
      snprintf(n[i], sizeof n[i], "blk.%d.%s.%s", l, names[i], i >= 5 && i <= 7 ? "bias" : "weight");
    if (get_w(m, n[0], E, 0, 0, 1, &L->attn_norm, err, errlen) || get_w(m, n[1], E, HD, 0, 0, &L->wq, err, errlen) ||
        get_w(m, n[2], E, KD, 0, 0, &L->wk, err, errlen) || get_w(m, n[3], E, KD, 0, 0, &L->wv, err, errlen) ||
        get_w(m, n[4], HD, E, 0, 0, &L->wo, err, errlen) || get_w(m, n[5], HD, 0, 1, 1, &L->bq, err, errlen) ||
        get_w(m, n[6], KD, 0, 1, 1, &L->bk, err, errlen) || get_w(m, n[7], KD, 0, 1, 1, &L->bv, err, errlen) ||
        get_w(m, n[8], E, 0, 0, 1, &L->ffn_norm, err, errlen) || get_w(m, n[9], E, F, 0, 0, &L->wg, err, errlen) ||
        get_w(m, n[10], E, F, 0, 0, &L->wu, err, errlen) || get_w(m, n[11], F, E, 0, 0, &L->wd, err, errlen))
      goto fail;
    if (gemma3) {
      // the norms are plain RMS norms: llama.cpp's converter folds Gemma's (1 + w) into the stored weights
      char g4[4][64];
      static const char *const gn[4] = {"attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"};
      for (int i = 0; i < 4; i++) snprintf(g4[i], sizeof g4[i], "blk.%d.%s.weight", l, gn[i]);
      if (get_w(m, g4[0], c->head_dim, 0, 0, 1, &L->q_norm, err, errlen) ||
          get_w(m, g4[1], c->head_dim, 0, 0, 1, &L->k_norm, err, errlen) ||
          get_w(m, g4[2], E, 0, 0, 1, &L->post_attn_norm, err, errlen) ||
          get_w(m, g4[3], E, 0, 0, 1, &L->post_ffn_norm, err, errlen))
        goto fail;
    }
  }
  *out = m;
  return 0;
fail:
  mdl_llama_free(m);
  return -1;
}

static void free_scratch(mdl_llama *m) {
  const krn_backend *be = m->kc->be;
  void *bufs[] = {m->x, m->xb, m->q, m->att, m->k, m->v, m->hb, m->hb2, m->d_ids, m->d_seq, m->d_pos,
                  m->xo, m->lo, m->d_rows, m->d_bt};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) be->free(m->kc, bufs[i]);
  free(m->h_ids);
  free(m->h_seq);
  free(m->h_pos);
  free(m->h_rows);
  free(m->h_rseq);
  free(m->h_bt);
}

void mdl_llama_free(mdl_llama *m) {
  if (!m) return;
  if (m->graphs) drop_graphs(m);
  free_scratch(m);
  for (int i = 0; i < m->n_uploads; i++) m->kc->be->free(m->kc, m->uploads[i]);
  free(m->uploads);
  free(m->layers);
  free(m);
}

// ---- scratch ----

static void *balloc(mdl_llama *m, size_t bytes, int *ok) {
  void *p = m->kc->be->alloc(m->kc, bytes ? bytes : 1);
  if (!p) *ok = 0;
  return p;
}

static void bfree(mdl_llama *m, void *p) {
  if (p) m->kc->be->free(m->kc, p);
}

static int grow_tokens(mdl_llama *m, int T, char *err, size_t errlen) {
  if (T <= m->cap_t) return 0;
  if (m->graphs) drop_graphs(m); // they name the buffers about to move
  int cap = m->cap_t * 2 > T ? m->cap_t * 2 : T;
  if (cap < 16) cap = 16;
  const mdl_llama_cfg *c = &m->cfg;
  size_t n = (size_t)cap, E = (size_t)c->n_embd, HD = (size_t)c->n_head * c->head_dim,
         KD = (size_t)c->n_kv_head * c->head_dim, F = (size_t)c->n_ff;
  float **fb[] = {&m->x, &m->xb, &m->q, &m->att, &m->k, &m->v, &m->hb, &m->hb2};
  size_t fs[] = {E, E, HD, HD, KD, KD, F, F};
  int ok = 1;
  for (int i = 0; i < 8; i++) {
    bfree(m, *fb[i]);
    *fb[i] = balloc(m, n * fs[i] * sizeof(float), &ok);
  }
  int32_t **ib[] = {&m->d_ids, &m->d_seq, &m->d_pos};
  for (int i = 0; i < 3; i++) {
    bfree(m, *ib[i]);
    *ib[i] = balloc(m, n * sizeof(int32_t), &ok);
  }
  int32_t **hb[] = {&m->h_ids, &m->h_seq, &m->h_pos};
  for (int i = 0; i < 3; i++) {
    free(*hb[i]);
    *hb[i] = malloc(n * sizeof(int32_t));
    if (!*hb[i]) ok = 0;
  }
  m->cap_t = cap;
  if (!ok) {
    snprintf(err, errlen, "model: cannot allocate activations for %d tokens", cap);
    free_scratch(m);
    memset(&m->cap_t, 0, sizeof *m - offsetof(mdl_llama, cap_t));
    return -1;
  }
  return 0;
}

static int grow_seqs(mdl_llama *m, int S, int n_bt, char *err, size_t errlen) {
  int ok = 1;
  const mdl_llama_cfg *c = &m->cfg;
  if (m->graphs && (S > m->cap_s || n_bt > m->cap_bt)) drop_graphs(m); // they name the buffers about to move
  if (S > m->cap_s) {
    int cap = m->cap_s * 2 > S ? m->cap_s * 2 : S;
    if (cap < 8) cap = 8;
    bfree(m, m->xo);
    bfree(m, m->lo);
    bfree(m, m->d_rows);
    m->xo = balloc(m, (size_t)cap * c->n_embd * sizeof(float), &ok);
    m->lo = balloc(m, (size_t)cap * c->n_vocab * sizeof(float), &ok);
    m->d_rows = balloc(m, (size_t)cap * sizeof(int32_t), &ok);
    free(m->h_rows);
    free(m->h_rseq);
    m->h_rows = malloc((size_t)cap * sizeof(int32_t));
    m->h_rseq = malloc((size_t)cap * sizeof(int32_t));
    if (!m->h_rows || !m->h_rseq) ok = 0;
    m->cap_s = cap;
  }
  if (ok && n_bt > m->cap_bt) {
    int cap = m->cap_bt * 2 > n_bt ? m->cap_bt * 2 : n_bt;
    if (cap < 256) cap = 256;
    bfree(m, m->d_bt);
    free(m->h_bt);
    m->d_bt = balloc(m, (size_t)cap * sizeof(int32_t), &ok);
    m->h_bt = malloc((size_t)cap * sizeof(int32_t));
    if (!m->h_bt) ok = 0;
    m->cap_bt = cap;
  }
  if (!ok) {
    snprintf(err, errlen, "model: cannot allocate buffers for %d sequences", S);
    free_scratch(m);
    memset(&m->cap_t, 0, sizeof *m - offsetof(mdl_llama, cap_t));
    return -1;
  }
  return 0;
}

// ---- forward ----

static void run_layers(mdl_llama *m, const mdl_kv *kv, krn_attn_args *ap, int R, mdl_layer_done_fn on_layer,
                       void *on_layer_arg);
static int step_graph(mdl_llama *m, const mdl_kv *kv, krn_attn_args *a);

// The step behind both entry points. all_rows (n_seqs 1): logits for every new token, row i for token i;
// otherwise one row for each sequence with want_logits, row s for sequence s.
static int forward(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seqs, int n_seqs, float *logits, int all_rows,
                   mdl_layer_done_fn on_layer, void *on_layer_arg, char *err, size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_ctx *kc = m->kc;
  const krn_backend *be = kc->be;
  if (n_seqs < 1 || !seqs || !kv || !kv->base) {
    snprintf(err, errlen, "forward: empty batch or no KV cache");
    return -1;
  }
  if ((kv->type != KRN_F16 && kv->type != KRN_F32) || kv->block_size < 1 || kv->n_blocks < 1) {
    snprintf(err, errlen, "forward: bad KV cache (type %s, block size %d, %d blocks)", krn_type_name(kv->type),
             kv->block_size, kv->n_blocks);
    return -1;
  }
  // validate and size the batch
  int64_t T64 = 0;
  int max_blocks = 1, R = 0;
  for (int s = 0; s < n_seqs; s++) {
    const mdl_seq *q = &seqs[s];
    if (q->n_tokens < 1 || q->pos0 < 0 || !q->tokens || q->n_blocks < 0 || (q->n_blocks > 0 && !q->block_table)) {
      snprintf(err, errlen, "forward: sequence %d has %d tokens at position %d (needs >= 1 token)", s, q->n_tokens,
               q->pos0);
      return -1;
    }
    int64_t end = (int64_t)q->pos0 + q->n_tokens;
    if (end > (int64_t)q->n_blocks * kv->block_size) {
      snprintf(err, errlen, "forward: sequence %d needs %lld positions but its %d blocks hold %lld", s,
               (long long)end, q->n_blocks, (long long)q->n_blocks * kv->block_size);
      return -1;
    }
    for (int i = 0; i < q->n_blocks; i++)
      if (q->block_table[i] < 0 || q->block_table[i] >= kv->n_blocks) {
        snprintf(err, errlen, "forward: sequence %d block %d is id %d, outside the pool (0..%d)", s, i,
                 (int)q->block_table[i], kv->n_blocks - 1);
        return -1;
      }
    // A local group may have given back the pages its window passed, never one this step reads or writes.
    for (int g = 1; g < mdl_kv_groups(kv); g++) {
      int live = mdl_kv_first_live_block(mdl_kv_group_window(c, kv, g), q->pos0, kv->block_size);
      for (int i = 0; i < q->n_blocks; i++) {
        int32_t pg = mdl_kv_page(kv, q->block_table[i], g);
        if (pg >= kv->n_blocks || (pg < 0 && i >= live)) {
          snprintf(err, errlen, "forward: sequence %d block %d has no page for layer group %d (page %d)", s, i, g,
                   (int)pg);
          return -1;
        }
      }
    }
    for (int i = 0; i < q->n_tokens; i++)
      if (q->tokens[i] < 0 || q->tokens[i] >= c->n_vocab) {
        snprintf(err, errlen, "forward: sequence %d token %d is %d, outside the vocabulary (0..%d)", s, i,
                 (int)q->tokens[i], c->n_vocab - 1);
        return -1;
      }
    if (q->n_blocks > max_blocks) max_blocks = q->n_blocks;
    T64 += q->n_tokens;
    R += all_rows ? q->n_tokens : q->want_logits != 0;
  }
  if (T64 > (1 << 24)) {
    snprintf(err, errlen, "forward: batch of %lld tokens too large", (long long)T64);
    return -1;
  }
  if (R > 0 && !logits) {
    snprintf(err, errlen, "forward: logits wanted but no output buffer");
    return -1;
  }
  int T = (int)T64;
  // A pure decode step (one new token and logits per sequence, no layer callback) may run from a recorded
  // graph; its block tables are padded to a power-of-two width so that one graph serves many lengths.
  const int graph_step = m->graphs && !all_rows && T == n_seqs && R == n_seqs && !on_layer;
  if (graph_step)
    for (int w = 16;; w *= 2)
      if (w >= max_blocks) {
        max_blocks = w;
        break;
      }
  const int n_groups = mdl_kv_groups(kv);
  if ((int64_t)n_groups * n_seqs * max_blocks > (1 << 28)) {
    snprintf(err, errlen, "forward: block tables too large");
    return -1;
  }
  if (grow_tokens(m, T, err, errlen) ||
      grow_seqs(m, R > n_seqs ? R : n_seqs, n_groups * n_seqs * max_blocks, err, errlen))
    return -1;
  m->bt_group_stride = n_seqs * max_blocks;

  // flatten the batch
  int t = 0, r = 0;
  for (int s = 0; s < n_seqs; s++) {
    const mdl_seq *q = &seqs[s];
    for (int i = 0; i < q->n_tokens; i++, t++) {
      m->h_ids[t] = q->tokens[i];
      m->h_seq[t] = s;
      m->h_pos[t] = q->pos0 + i;
    }
    for (int g = 0; g < n_groups; g++) { // a page given back is -1: the kernels skip it (outside every window)
      int32_t *bt = m->h_bt + (size_t)g * m->bt_group_stride + (size_t)s * max_blocks;
      for (int i = 0; i < q->n_blocks; i++) bt[i] = mdl_kv_page(kv, q->block_table[i], g);
      for (int i = q->n_blocks; i < max_blocks; i++) bt[i] = 0;
    }
    if (all_rows) {
      for (int i = 0; i < q->n_tokens; i++, r++) m->h_rows[r] = t - q->n_tokens + i;
    } else if (q->want_logits) {
      m->h_rows[r] = t - 1;
      m->h_rseq[r] = s;
      r++;
    }
  }
  be->upload(kc, m->d_ids, m->h_ids, (size_t)T * 4);
  be->upload(kc, m->d_seq, m->h_seq, (size_t)T * 4);
  be->upload(kc, m->d_pos, m->h_pos, (size_t)T * 4);
  be->upload(kc, m->d_bt, m->h_bt, (size_t)n_groups * n_seqs * max_blocks * 4);
  if (R) be->upload(kc, m->d_rows, m->h_rows, (size_t)R * 4);

  krn_attn_args a = {
      .n_tokens = T,
      .n_head = c->n_head,
      .n_kv_head = c->n_kv_head,
      .head_dim = c->head_dim,
      .block_size = kv->block_size,
      .tok_seq = m->d_seq,
      .tok_pos = m->d_pos,
      .block_tables = m->d_bt,
      .max_blocks = max_blocks,
      .kv_type = kv->type,
      .scale = c->attn_scale,
  };
  if (!graph_step || step_graph(m, kv, &a) != 0) run_layers(m, kv, &a, R, on_layer, on_layer_arg);
  if (all_rows) // the rows are in order on both sides: one copy
    be->download(kc, logits, m->lo, (size_t)R * c->n_vocab * sizeof(float));
  else
    for (int i = 0; i < R; i++)
      be->download(kc, logits + (size_t)m->h_rseq[i] * c->n_vocab, m->lo + (size_t)i * c->n_vocab,
                   (size_t)c->n_vocab * sizeof(float));
  if (be->sync) be->sync(kc);
  return krn_ctx_error(kc, err, errlen) ? -1 : 0; // a device failure anywhere in the step (sticky on the ctx)
}

int mdl_llama_forward(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seqs, int n_seqs, float *logits,
                      mdl_layer_done_fn on_layer, void *on_layer_arg, char *err, size_t errlen) {
  return forward(m, kv, seqs, n_seqs, logits, 0, on_layer, on_layer_arg, err, errlen);
}

int mdl_llama_forward_all(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seq, float *logits, char *err,
                          size_t errlen) {
  if (!logits) {
    snprintf(err, errlen, "forward: logits wanted but no output buffer");
    return -1;
  }
  return forward(m, kv, seq, 1, logits, 1, NULL, NULL, err, errlen);
}

// RoPE on m->q and m->k (T rows): plain with base theta, or the model's scaled frequencies when it has them and
// scaled (the layer is one scaling applies to).
static void rope(mdl_llama *m, int T, float theta, int scaled) {
  const mdl_llama_cfg *c = &m->cfg;
  const krn_backend *be = m->kc->be;
  if (scaled && c->rope_scaled) {
    be->rope_freqs(m->kc, m->q, m->d_pos, T, c->n_head, c->head_dim, m->rope_freq, c->rope_mscale, c->rope_neox);
    be->rope_freqs(m->kc, m->k, m->d_pos, T, c->n_kv_head, c->head_dim, m->rope_freq, c->rope_mscale, c->rope_neox);
    return;
  }
  be->rope(m->kc, m->q, m->d_pos, T, c->n_head, c->head_dim, theta, c->rope_neox);
  be->rope(m->kc, m->k, m->d_pos, T, c->n_kv_head, c->head_dim, theta, c->rope_neox);
}

// One gemma3 layer over x (llama.cpp's gemma3 graph): q/k norms, RoPE with the layer's base, attention (sliding
// window on local layers), a norm after attention and after the GELU FFN, each before its residual add.
static void gemma3_layer(mdl_llama *m, const mdl_kv *kv, krn_attn_args *a, int l, mdl_layer_done_fn on_layer,
                         void *on_layer_arg) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_ctx *kc = m->kc;
  const krn_backend *be = kc->be;
  const mdl_layer *L = &m->layers[l];
  const int T = a->n_tokens;
  int E = c->n_embd, HD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim, F = c->n_ff;
  float *x = m->x, *xb = m->xb;
  be->rmsnorm(kc, xb, x, L->attn_norm.data, T, E, c->rms_eps);
  be->matmul(kc, m->q, L->wq.data, L->wq.type, xb, T, E, HD);
  be->matmul(kc, m->k, L->wk.data, L->wk.type, xb, T, E, KD);
  be->matmul(kc, m->v, L->wv.data, L->wv.type, xb, T, E, KD);
  be->rmsnorm(kc, m->q, m->q, L->q_norm.data, T * c->n_head, c->head_dim, c->rms_eps);
  be->rmsnorm(kc, m->k, m->k, L->k_norm.data, T * c->n_kv_head, c->head_dim, c->rms_eps);
  a->window = mdl_llama_layer_window(c, l);
  rope(m, T, a->window ? c->rope_theta_swa : c->rope_theta, !a->window); // scaling: global layers only
  a->k_cache = mdl_kv_chunk(c, kv, l, 0, 0);
  a->v_cache = mdl_kv_chunk(c, kv, l, 1, 0);
  a->block_tables = m->d_bt + (size_t)mdl_kv_group_of(kv, l) * m->bt_group_stride;
  be->kv_store(kc, m->k, m->v, a);
  if (on_layer) on_layer(on_layer_arg, l);
  be->paged_attention(kc, m->att, m->q, a);
  be->matmul(kc, xb, L->wo.data, L->wo.type, m->att, T, HD, E);
  be->rmsnorm(kc, xb, xb, L->post_attn_norm.data, T, E, c->rms_eps);
  be->add(kc, x, xb, (int64_t)T * E);
  be->rmsnorm(kc, xb, x, L->ffn_norm.data, T, E, c->rms_eps);
  be->matmul(kc, m->hb, L->wg.data, L->wg.type, xb, T, E, F);
  be->matmul(kc, m->hb2, L->wu.data, L->wu.type, xb, T, E, F);
  be->geglu(kc, m->hb, m->hb, m->hb2, (int64_t)T * F);
  be->matmul(kc, xb, L->wd.data, L->wd.type, m->hb, T, F, E);
  be->rmsnorm(kc, xb, xb, L->post_ffn_norm.data, T, E, c->rms_eps);
  be->add(kc, x, xb, (int64_t)T * E);
}

// The step's ops from the embedding lookup to the logits of the R rows that want them (left in m->lo).
static void run_layers(mdl_llama *m, const mdl_kv *kv, krn_attn_args *ap, int R, mdl_layer_done_fn on_layer,
                       void *on_layer_arg) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_ctx *kc = m->kc;
  const krn_backend *be = kc->be;
  krn_attn_args a = *ap;
  const int T = a.n_tokens;
  int E = c->n_embd, HD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim, F = c->n_ff;
  float *x = m->x, *xb = m->xb;
  be->get_rows(kc, x, m->tok_embd.data, m->tok_embd.type, m->d_ids, T, E);
  if (c->gemma3) be->scale(kc, x, sqrtf((float)E), (int64_t)T * E);
  for (int l = 0; l < c->n_layer; l++) {
    const mdl_layer *L = &m->layers[l];
    if (c->gemma3) {
      gemma3_layer(m, kv, &a, l, on_layer, on_layer_arg);
      continue;
    }
    be->rmsnorm(kc, xb, x, L->attn_norm.data, T, E, c->rms_eps);
    be->matmul(kc, m->q, L->wq.data, L->wq.type, xb, T, E, HD);
    be->matmul(kc, m->k, L->wk.data, L->wk.type, xb, T, E, KD);
    be->matmul(kc, m->v, L->wv.data, L->wv.type, xb, T, E, KD);
    // qwen2 biases: one add per row (the backend table has no broadcast add)
    for (int i = 0; L->bq.data && i < T; i++) be->add(kc, m->q + (size_t)i * HD, L->bq.data, HD);
    for (int i = 0; L->bk.data && i < T; i++) be->add(kc, m->k + (size_t)i * KD, L->bk.data, KD);
    for (int i = 0; L->bv.data && i < T; i++) be->add(kc, m->v + (size_t)i * KD, L->bv.data, KD);
    rope(m, T, c->rope_theta, 1);
    a.k_cache = mdl_kv_chunk(c, kv, l, 0, 0);
    a.v_cache = mdl_kv_chunk(c, kv, l, 1, 0);
    a.block_tables = m->d_bt + (size_t)mdl_kv_group_of(kv, l) * m->bt_group_stride;
    be->kv_store(kc, m->k, m->v, &a);
    if (on_layer) on_layer(on_layer_arg, l); // no sync: the callback waits for this layer only (llama.h)
    be->paged_attention(kc, m->att, m->q, &a);
    be->matmul(kc, xb, L->wo.data, L->wo.type, m->att, T, HD, E);
    be->add(kc, x, xb, (int64_t)T * E);
    be->rmsnorm(kc, xb, x, L->ffn_norm.data, T, E, c->rms_eps);
    be->matmul(kc, m->hb, L->wg.data, L->wg.type, xb, T, E, F);
    be->matmul(kc, m->hb2, L->wu.data, L->wu.type, xb, T, E, F);
    be->swiglu(kc, m->hb, m->hb, m->hb2, (int64_t)T * F);
    be->matmul(kc, xb, L->wd.data, L->wd.type, m->hb, T, F, E);
    be->add(kc, x, xb, (int64_t)T * E);
  }
  if (R) {
    // only the rows that want logits: gather, norm, project
    be->get_rows(kc, m->xo, x, KRN_F32, m->d_rows, R, E);
    be->rmsnorm(kc, m->xo, m->xo, m->output_norm.data, R, E, c->rms_eps);
    be->matmul(kc, m->lo, m->output.data, m->output.type, m->xo, R, E, c->n_vocab);
  }
}

// Runs a decode step from its recorded graph, recording one when this shape came twice in a row. 0 when the
// step ran (or is queued), -1 when the caller must run it plainly.
static int step_graph(mdl_llama *m, const mdl_kv *kv, krn_attn_args *a) {
  const krn_backend *be = m->kc->be;
  mdl_graph_key k;
  memset(&k, 0, sizeof k); // compared with memcmp
  k.n_seqs = a->n_tokens;
  k.max_blocks = a->max_blocks;
  k.kv_base = kv->base;
  k.kv_type = kv->type;
  k.kv_block_size = kv->block_size;
  k.kv_n_blocks = kv->n_blocks;
  k.kv_n_groups = mdl_kv_groups(kv);
  for (int i = 0; i < m->n_gcache; i++)
    if (!memcmp(&m->gcache[i].key, &k, sizeof k)) {
      if (be->graph_launch(m->kc, m->gcache[i].h) == 0) {
        m->n_replayed++;
        return 0;
      }
      be->graph_free(m->kc, m->gcache[i].h); // stale (the backend moved scratch it uses): record it again
      m->gcache[i] = m->gcache[--m->n_gcache];
      if (m->g_next > m->n_gcache) m->g_next = 0;
      break;
    }
  const int again = !memcmp(&m->last, &k, sizeof k);
  m->last = k;
  if (!again) return -1; // first sight of this shape: run it plainly (which also sizes the backend's scratch)
  if (be->graph_begin(m->kc)) return -1;
  run_layers(m, kv, a, a->n_tokens, NULL, NULL);
  void *h = be->graph_end(m->kc);
  if (!h) return -1; // the recording broke: nothing ran
  int slot;
  if (m->n_gcache < MDL_GRAPHS) {
    slot = m->n_gcache++;
  } else { // full: replace the oldest
    slot = m->g_next;
    m->g_next = (m->g_next + 1) % MDL_GRAPHS;
    be->graph_free(m->kc, m->gcache[slot].h);
  }
  m->gcache[slot].key = k;
  m->gcache[slot].h = h;
  m->n_recorded++;
  if (be->graph_launch(m->kc, h)) return -1;
  m->n_replayed++;
  return 0;
}
