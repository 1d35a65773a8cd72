// models/llama.c: Llama-family forward pass (llama, qwen2, qwen3, phi3, gemma2, gemma3, qwen3moe, Mixtral, deepseek2)
// over a mixed prefill/decode batch and a paged KV cache.
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama_int.h"
#include "models/null.h"

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
  mdl_null_free(m);
  if (m->graphs) drop_graphs(m);
  free_scratch(m);
  mdl_moe_free(m);
  mdl_mla_free(m);
  free(m->h_embd);
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
         KD = (size_t)c->n_kv_head * c->head_dim, F = (size_t)c->n_ff, FS = (size_t)c->n_ff_exp * c->n_expert_shared;
  if (FS > F) F = FS; // (hb, hb2 also hold the shared experts' gate and up)
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
// otherwise the rows of each sequence with want_logits (its last token's, or its last want_logits tokens') at
// mdl_logit_row.
static int forward(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seqs, int n_seqs, const mdl_pool_out *pools,
                   float *logits, int all_rows, mdl_layer_done_fn on_layer, void *on_layer_arg, char *err,
                   size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_ctx *kc = m->kc;
  const krn_backend *be = kc->be;
  if (n_seqs < 1 || !seqs || !kv || !kv->base) {
    snprintf(err, errlen, "forward: empty batch or no KV cache");
    return -1;
  }
  if (mdl_kv_type_check(c, be, kv->type, err, errlen)) return -1;
  if (kv->block_size < 1 || kv->n_blocks < 1) {
    snprintf(err, errlen, "forward: bad KV cache (type %s, block size %d, %d blocks)", krn_type_name(kv->type),
             kv->block_size, kv->n_blocks);
    return -1;
  }
  // validate and size the batch
  int64_t T64 = 0;
  int max_blocks = 1, R = 0, pooled = 0;
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
    if (q->want_logits < 0 || q->want_logits > q->n_tokens) {
      snprintf(err, errlen, "forward: sequence %d wants logits of %d of its %d tokens", s, q->want_logits, q->n_tokens);
      return -1;
    }
    if (pools && pools[s].pool && (pools[s].pool < 0 || !pools[s].embd)) {
      snprintf(err, errlen, "forward: sequence %d asks for pooling %d without an output vector", s, pools[s].pool);
      return -1;
    }
    pooled |= pools && pools[s].pool;
    if (q->n_blocks > max_blocks) max_blocks = q->n_blocks;
    T64 += q->n_tokens;
    R += all_rows ? q->n_tokens : q->want_logits ? mdl_seq_rows(q) : 0;
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
  // (not an MoE step: its routing is decided on the host in the middle of the step, which a graph would freeze)
  const int graph_step =
      m->graphs && !all_rows && T == n_seqs && R == n_seqs && !on_layer && !c->n_expert && !pooled;
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
      grow_seqs(m, R > n_seqs ? R : n_seqs, n_groups * n_seqs * max_blocks, err, errlen) ||
      (c->n_expert && mdl_moe_reserve(m, T, err, errlen)) || (c->kv_lora_rank && mdl_mla_reserve(m, T, err, errlen)))
    return -1;
  m->bt_group_stride = n_seqs * max_blocks;

  // flatten the batch
  int t = 0, r = 0, out_row = 0;
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
      for (int i = mdl_seq_rows(q); i > 0; i--, r++) {
        m->h_rows[r] = t - i;
        m->h_rseq[r] = out_row + mdl_seq_rows(q) - i;
      }
    }
    out_row += mdl_seq_rows(q);
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
      .softcap = c->attn_softcap,
  };
  if (!graph_step || step_graph(m, kv, &a) != 0) run_layers(m, kv, &a, R, on_layer, on_layer_arg);
  if (pooled && mdl__pool_step(m, seqs, pools, n_seqs, err, errlen)) return -1;
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
  if (m->nul) return mdl_null_forward(m, seqs, n_seqs, logits, 0, on_layer, on_layer_arg, err, errlen);
  return forward(m, kv, seqs, n_seqs, NULL, logits, 0, on_layer, on_layer_arg, err, errlen);
}

int mdl_llama_forward_pooled(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seqs, int n_seqs,
                             const mdl_pool_out *pools, float *logits, mdl_layer_done_fn on_layer, void *on_layer_arg,
                             char *err, size_t errlen) {
  if (m->nul) { // no hidden states: it can step the others, never pool
    for (int s = 0; pools && s < n_seqs; s++)
      if (pools[s].pool) {
        snprintf(err, errlen, "forward: the null model has no hidden states to pool (embeddings)");
        return -1;
      }
    return mdl_null_forward(m, seqs, n_seqs, logits, 0, on_layer, on_layer_arg, err, errlen);
  }
  return forward(m, kv, seqs, n_seqs, pools, logits, 0, on_layer, on_layer_arg, err, errlen);
}

int mdl_llama_forward_all(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seq, float *logits, char *err,
                          size_t errlen) {
  if (!logits) {
    snprintf(err, errlen, "forward: logits wanted but no output buffer");
    return -1;
  }
  if (m->nul) return mdl_null_forward(m, seq, 1, logits, 1, NULL, NULL, err, errlen);
  return forward(m, kv, seq, 1, NULL, logits, 1, NULL, NULL, err, errlen);
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

// q, k, v (T rows each) from m->xb: one op, so that a decode step's three small products are one pool run; then the
// biases.
static void qkv(mdl_llama *m, const mdl_layer *L, int T) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_mm mm[3] = {{m->q, L->wq.data, L->wq.type, c->n_head * c->head_dim, NULL, 0},
                  {m->k, L->wk.data, L->wk.type, c->n_kv_head * c->head_dim, NULL, 0},
                  {m->v, L->wv.data, L->wv.type, c->n_kv_head * c->head_dim, NULL, 0}};
  krn_matmul_group(m->kc, mm, 3, m->xb, T, c->n_embd);
  // biases where the GGUF has them (qwen2's): one add per row (the backend table has no broadcast add)
  const krn_backend *be = m->kc->be;
  for (int i = 0; L->bq.data && i < T; i++) be->add(m->kc, m->q + (size_t)i * mm[0].m, L->bq.data, mm[0].m);
  for (int i = 0; L->bk.data && i < T; i++) be->add(m->kc, m->k + (size_t)i * mm[1].m, L->bk.data, mm[1].m);
  for (int i = 0; L->bv.data && i < T; i++) be->add(m->kc, m->v + (size_t)i * mm[2].m, L->bv.data, mm[2].m);
}

// The FFN's gate (into m->hb) and up (m->hb2) products from m->xb, as one op.
static void gate_up(mdl_llama *m, const mdl_layer *L, int T) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_mm mm[2] = {{m->hb, L->wg.data, L->wg.type, c->n_ff, NULL, 0}, {m->hb2, L->wu.data, L->wu.type, c->n_ff, NULL, 0}};
  krn_matmul_group(m->kc, mm, 2, m->xb, T, c->n_embd);
}

// The per-head RMS norms of q and k (qwen3, gemma3), after their projections (and biases) and before RoPE.
static void qk_norm(mdl_llama *m, const mdl_layer *L, int T) {
  const mdl_llama_cfg *c = &m->cfg;
  m->kc->be->rmsnorm(m->kc, m->q, m->q, L->q_norm.data, T * c->n_head, c->head_dim, c->rms_eps);
  m->kc->be->rmsnorm(m->kc, m->k, m->k, L->k_norm.data, T * c->n_kv_head, c->head_dim, c->rms_eps);
}

// One gemma2 or gemma3 layer over x (llama.cpp's gemma2 and gemma3 graphs): q/k norms (gemma3), RoPE with the
// layer's base, attention (sliding window on local layers; gemma2's scores soft-capped through a->softcap), a norm
// after attention and after the GELU FFN, each before its residual add.
static void gemma_layer(mdl_llama *m, const mdl_kv *kv, krn_attn_args *a, int l, mdl_layer_done_fn on_layer,
                         void *on_layer_arg) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_ctx *kc = m->kc;
  const krn_backend *be = kc->be;
  const mdl_layer *L = &m->layers[l];
  const int T = a->n_tokens;
  int E = c->n_embd, HD = c->n_head * c->head_dim, F = c->n_ff;
  float *x = m->x, *xb = m->xb;
  be->rmsnorm(kc, xb, x, L->attn_norm.data, T, E, c->rms_eps);
  qkv(m, L, T);
  if (c->qk_norm) qk_norm(m, L, T);
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
  gate_up(m, L, T);
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
  int E = c->n_embd, HD = c->n_head * c->head_dim, F = c->n_ff;
  float *x = m->x, *xb = m->xb;
  be->get_rows(kc, x, m->tok_embd.data, m->tok_embd.type, m->d_ids, T, E);
  const int gemma = c->gemma2 || c->gemma3;
  if (gemma) be->scale(kc, x, sqrtf((float)E), (int64_t)T * E);
  for (int l = 0; l < c->n_layer; l++) {
    const mdl_layer *L = &m->layers[l];
    if (gemma) {
      gemma_layer(m, kv, &a, l, on_layer, on_layer_arg);
      continue;
    }
    if (c->kv_lora_rank) { // deepseek2's latent attention (llama_mla.c), added into x; its FFN follows
      mdl_mla_attn(m, L, kv, &a, l, on_layer, on_layer_arg);
      goto ffn;
    }
    be->rmsnorm(kc, xb, x, L->attn_norm.data, T, E, c->rms_eps);
    qkv(m, L, T);
    if (c->qk_norm) qk_norm(m, L, T); // qwen3, qwen3moe
    rope(m, T, c->rope_theta, 1);
    a.k_cache = mdl_kv_chunk(c, kv, l, 0, 0);
    a.v_cache = mdl_kv_chunk(c, kv, l, 1, 0);
    a.block_tables = m->d_bt + (size_t)mdl_kv_group_of(kv, l) * m->bt_group_stride;
    be->kv_store(kc, m->k, m->v, &a);
    if (on_layer) on_layer(on_layer_arg, l); // no sync: the callback waits for this layer only (llama.h)
    be->paged_attention(kc, m->att, m->q, &a);
    be->matmul(kc, xb, L->wo.data, L->wo.type, m->att, T, HD, E);
    be->add(kc, x, xb, (int64_t)T * E);
  ffn:
    be->rmsnorm(kc, xb, x, L->ffn_norm.data, T, E, c->rms_eps);
    if (c->n_expert && l >= c->n_layer_dense_lead) { // routed experts (llama_moe.c), added into x; shared ones too
      mdl_moe_ffn(m, L, T);
      if (c->n_expert_shared) mdl_moe_shared(m, L, T);
      continue;
    }
    gate_up(m, L, T);
    be->swiglu(kc, m->hb, m->hb, m->hb2, (int64_t)T * F);
    be->matmul(kc, xb, L->wd.data, L->wd.type, m->hb, T, F, E);
    be->add(kc, x, xb, (int64_t)T * E);
  }
  if (R) {
    // only the rows that want logits: gather, norm, project
    be->get_rows(kc, m->xo, x, KRN_F32, m->d_rows, R, E);
    be->rmsnorm(kc, m->xo, m->xo, m->output_norm.data, R, E, c->rms_eps);
    be->matmul(kc, m->lo, m->output.data, m->output.type, m->xo, R, E, c->n_vocab);
    if (c->final_softcap > 0) be->softcap(kc, m->lo, c->final_softcap, (int64_t)R * c->n_vocab); // gemma2
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
