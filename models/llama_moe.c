// models/llama_moe.c: mixture-of-experts FFNs (qwen3moe, Mixtral): their keys and tensors, routing, the routed FFN.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama_int.h"

#define MOE_MAX_EXPERTS 1024 // llama.cpp's LLAMA_MAX_EXPERTS

// ---- load ----

// An unsigned key of arch: 0 and *out when present, 1 when absent, -1 with err when not a single integer.
static int moe_key(const mdl_gguf *g, const char *arch, const char *name, int64_t *out, char *err, size_t errlen) {
  char k[128];
  snprintf(k, sizeof k, "%s.%s", arch, name);
  const mdl_gguf_kv *kv = mdl_gguf_find(g, k);
  if (!kv) return 1;
  if (kv->type == MDL_GGUF_ARR || mdl_gguf_get_i64(g, k, out) != 0) {
    snprintf(err, errlen, "model: %s must be one integer (a per-layer array is not supported)", k);
    return -1;
  }
  if (*out < 0 || *out > (1 << 30)) {
    snprintf(err, errlen, "model: %s = %lld out of range", k, (long long)*out);
    return -1;
  }
  return 0;
}

// deepseek2's routing keys (llama.cpp's deepseek2 load_arch_hparams and load_hparams), after the expert counts.
static int ds2_keys(mdl_llama *m, const char *arch, char *err, size_t errlen) {
  mdl_llama_cfg *c = &m->cfg;
  const mdl_gguf *g = m->g;
  int64_t v;
  char k[128];
  int rc = moe_key(g, arch, "expert_shared_count", &v, err, errlen);
  if (rc) {
    if (rc > 0) snprintf(err, errlen, "model: metadata %s.expert_shared_count missing", arch);
    return -1;
  }
  c->n_expert_shared = (int)v;
  if ((rc = moe_key(g, arch, "expert_gating_func", &v, err, errlen)) < 0) return -1;
  c->expert_gating = rc > 0 || v == 0 ? MDL_GATING_SOFTMAX : (int)v; // absent or 0: softmax, as llama.cpp's V2 files
  if (c->expert_gating != MDL_GATING_SOFTMAX && c->expert_gating != MDL_GATING_SIGMOID) {
    snprintf(err, errlen, "model: %s.expert_gating_func = %d not supported (1 softmax, 2 sigmoid)", arch,
             c->expert_gating);
    return -1;
  }
  snprintf(k, sizeof k, "%s.expert_weights_scale", arch);
  if (mdl_gguf_get_f32(g, k, &c->expert_weights_scale) != 0) c->expert_weights_scale = 0;
  if (!isfinite(c->expert_weights_scale) || c->expert_weights_scale < 0) {
    snprintf(err, errlen, "model: %s = %g not a scale", k, c->expert_weights_scale);
    return -1;
  }
  snprintf(k, sizeof k, "%s.expert_weights_norm", arch);
  const mdl_gguf_kv *nk = mdl_gguf_find(g, k);
  c->expert_weights_norm = 0; // llama.cpp's default for deepseek2
  if (nk && nk->type == MDL_GGUF_BOOL) c->expert_weights_norm = nk->val[0] != 0;
  else if (nk) {
    snprintf(err, errlen, "model: %s is not a boolean", k);
    return -1;
  }
  int64_t ng = 0, gu = 0;
  if (moe_key(g, arch, "expert_group_count", &ng, err, errlen) < 0 ||
      moe_key(g, arch, "expert_group_used_count", &gu, err, errlen) < 0)
    return -1;
  if (ng > 1 && (ng >= c->n_expert || c->n_expert % ng || gu < 1 || gu >= ng)) { // llama.cpp's asserts
    snprintf(err, errlen, "model: %s.expert_group_count %lld and expert_group_used_count %lld do not fit %d experts "
             "(groups must divide them, 0 < used < groups)", arch, (long long)ng, (long long)gu, c->n_expert);
    return -1;
  }
  c->n_expert_groups = ng > 1 ? (int)ng : 0;
  c->n_group_used = ng > 1 ? (int)gu : 0;
  return 0;
}

int mdl_moe_load_cfg(mdl_llama *m, const char *arch, char *err, size_t errlen) {
  mdl_llama_cfg *c = &m->cfg;
  const mdl_gguf *g = m->g;
  int qwen3moe = !strcmp(arch, "qwen3moe"), ds2 = !strcmp(arch, "deepseek2");
  c->n_expert = c->n_expert_used = c->n_ff_exp = 0;
  c->expert_gating = MDL_GATING_SOFTMAX; // qwen3moe's and Mixtral's routing: softmax, weights normalised
  c->expert_weights_norm = 1;
  // Old Mixtral GGUFs kept each expert as its own 2-D tensor (blk.N.ffn_gate.E.weight); llama.cpp's converter has
  // written 3-D ffn_*_exps tensors since 2024, and no current reader takes the old layout.
  static const char *const old[3] = {"ffn_gate", "ffn_up", "ffn_down"};
  for (int i = 0; i < 3; i++) {
    char n[64];
    snprintf(n, sizeof n, "blk.0.%s.0.weight", old[i]);
    if (mdl_gguf_tensor_find(g, n)) {
      snprintf(err, errlen,
               "model: tensor %s: experts stored one 2-D tensor each (an old Mixtral GGUF) are not supported; convert "
               "the model again with a current llama.cpp (convert_hf_to_gguf.py), which writes 3-D ffn_*_exps tensors",
               n);
      return -1;
    }
  }
  int64_t ne = 0, nu = 0, ffe = 0;
  int rc = moe_key(g, arch, "expert_count", &ne, err, errlen);
  if (rc < 0) return -1;
  if (rc > 0 || ne == 0) { // dense, unless the file says otherwise
    if (qwen3moe || ds2) {
      snprintf(err, errlen, "model: %s.expert_count %s (%s needs experts)", arch, rc > 0 ? "missing" : "is 0", arch);
      return -1;
    }
    if (mdl_gguf_tensor_find(g, "blk.0.ffn_gate_inp.weight")) {
      snprintf(err, errlen, "model: tensor blk.0.ffn_gate_inp.weight (an expert router) present but %s.expert_count %s",
               arch, rc > 0 ? "missing" : "is 0");
      return -1;
    }
    return 0;
  }
  if (ne > MOE_MAX_EXPERTS) {
    snprintf(err, errlen, "model: %s.expert_count = %lld exceeds %d", arch, (long long)ne, MOE_MAX_EXPERTS);
    return -1;
  }
  rc = moe_key(g, arch, "expert_used_count", &nu, err, errlen);
  if (rc < 0) return -1;
  if (rc > 0 || nu == 0) {
    snprintf(err, errlen, "model: %s.expert_used_count %s: a model with %lld experts must use at least one per token",
             arch, rc > 0 ? "missing" : "is 0", (long long)ne);
    return -1;
  }
  if (nu > ne) {
    snprintf(err, errlen, "model: %s.expert_used_count = %lld exceeds %s.expert_count = %lld", arch, (long long)nu,
             arch, (long long)ne);
    return -1;
  }
  // An expert's width: llama.cpp's llama (Mixtral) uses feed_forward_length; qwen3moe expert_feed_forward_length,
  // or feed_forward_length / expert_used_count without it.
  if (qwen3moe || ds2) {
    rc = moe_key(g, arch, "expert_feed_forward_length", &ffe, err, errlen);
    if (rc < 0) return -1;
    if (rc > 0 || ffe == 0) ffe = ds2 ? 0 : c->n_ff / nu; // (deepseek2: llama.cpp requires the key)
  } else {
    ffe = c->n_ff;
  }
  if (ffe < 1) {
    snprintf(err, errlen, "model: %s.expert_feed_forward_length and %s.feed_forward_length missing", arch, arch);
    return -1;
  }
  if (!m->kc->be->moe_combine) {
    snprintf(err, errlen, "model: mixture of experts needs the moe_combine op, which the %s backend lacks",
             m->kc->be->name);
    return -1;
  }
  c->n_expert = (int)ne;
  c->n_expert_used = (int)nu;
  c->n_ff_exp = (int)ffe;
  if (ds2 && ds2_keys(m, arch, err, errlen)) return -1;
  if (!c->n_ff) c->n_ff = c->n_ff_exp; // (the dense scratch is sized by n_ff; an MoE layer does not use it)
  return 0;
}

// The expert count of a 3-D tensor against the config's, named both ways; then the full shape check.
static int load_exps(mdl_llama *m, const char *name, int64_t ne0, int64_t ne1, mdl_w *out, char *err, size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  const mdl_gguf_tensor *t = mdl_gguf_tensor_find(m->g, name);
  if (t && t->n_dims == 3 && t->ne[2] != c->n_expert) {
    snprintf(err, errlen, "model: tensor %s holds %lld experts but %s.expert_count is %d", name, (long long)t->ne[2],
             c->arch, c->n_expert);
    return -1;
  }
  return mdl_llama_get_w(m, name, ne0, ne1, c->n_expert, 0, 0, out, err, errlen);
}

int mdl_moe_load_layer(mdl_llama *m, int l, char *err, size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  mdl_layer *L = &m->layers[l];
  char n[4][64];
  static const char *const names[4] = {"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
  for (int i = 0; i < 4; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.weight", l, names[i]);
  const mdl_gguf_tensor *r = mdl_gguf_tensor_find(m->g, n[0]);
  if (r && r->n_dims == 2 && r->ne[0] == c->n_embd && r->ne[1] != c->n_expert) {
    snprintf(err, errlen, "model: tensor %s routes to %lld experts but %s.expert_count is %d", n[0],
             (long long)r->ne[1], c->arch, c->n_expert);
    return -1;
  }
  if (mdl_llama_get_w(m, n[0], c->n_embd, c->n_expert, 0, 0, 0, &L->ffn_gate_inp, err, errlen) ||
      load_exps(m, n[1], c->n_embd, c->n_ff_exp, &L->gate_exps, err, errlen) ||
      load_exps(m, n[2], c->n_embd, c->n_ff_exp, &L->up_exps, err, errlen) ||
      load_exps(m, n[3], c->n_ff_exp, c->n_embd, &L->down_exps, err, errlen))
    return -1;
  char b[64];
  snprintf(b, sizeof b, "blk.%d.exp_probs_b.bias", l); // deepseek2's selection bias (V3), read on the host
  mdl_w pb;
  if (mdl_llama_get_w(m, b, c->n_expert, 0, 0, 1, 1, &pb, err, errlen)) return -1;
  L->probs_b = pb.data ? (const float *)mdl_gguf_tensor_find(m->g, b)->data : NULL;
  if (c->n_expert_shared) {
    static const char *const sh[3] = {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"};
    int64_t FS = (int64_t)c->n_ff_exp * c->n_expert_shared;
    for (int i = 0; i < 3; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.weight", l, sh[i]);
    if (mdl_llama_get_w(m, n[0], c->n_embd, FS, 0, 0, 0, &L->gate_shexp, err, errlen) ||
        mdl_llama_get_w(m, n[1], c->n_embd, FS, 0, 0, 0, &L->up_shexp, err, errlen) ||
        mdl_llama_get_w(m, n[2], FS, c->n_embd, 0, 0, 0, &L->down_shexp, err, errlen))
      return -1;
  }
  return 0;
}

// ---- scratch ----

void mdl_moe_free(mdl_llama *m) {
  mdl_moe_scratch *s = &m->moe;
  void *dev[] = {s->logits, s->xe, s->ye, s->ge, s->ue, s->d_gather, s->d_rows, s->d_w};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    if (dev[i]) m->kc->be->free(m->kc, dev[i]);
  void *host[] = {s->h_logits, s->h_gather, s->h_rows, s->h_sel, s->h_w, s->h_count, s->h_off};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
  memset(s, 0, sizeof *s);
}

int mdl_moe_reserve(mdl_llama *m, int T, char *err, size_t errlen) {
  mdl_moe_scratch *s = &m->moe;
  if (T <= s->cap) return 0;
  const mdl_llama_cfg *c = &m->cfg;
  int cap = s->cap * 2 > T ? s->cap * 2 : T;
  if (cap < 16) cap = 16;
  mdl_moe_free(m);
  const krn_backend *be = m->kc->be;
  size_t n = (size_t)cap, ku = (size_t)c->n_expert_used, ne = (size_t)c->n_expert, E = (size_t)c->n_embd,
         F = (size_t)c->n_ff_exp;
  int ok = 1;
  float **fb[] = {&s->logits, &s->xe, &s->ye, &s->ge, &s->ue, &s->d_w};
  size_t fs[] = {n * ne, n * ku * E, n * ku * E, n * ku * F, n * ku * F, n * ku};
  for (int i = 0; i < 6; i++)
    if (!(*fb[i] = be->alloc(m->kc, fs[i] * sizeof(float)))) ok = 0;
  if (!(s->d_gather = be->alloc(m->kc, n * ku * sizeof(int32_t)))) ok = 0;
  if (!(s->d_rows = be->alloc(m->kc, n * ku * sizeof(int32_t)))) ok = 0;
  s->h_logits = malloc(n * ne * sizeof(float));
  s->h_gather = malloc(n * ku * sizeof(int32_t));
  s->h_rows = malloc(n * ku * sizeof(int32_t));
  s->h_sel = malloc(n * ku * sizeof(int32_t));
  s->h_w = malloc(n * ku * sizeof(float));
  s->h_count = malloc(ne * sizeof(int32_t));
  s->h_off = malloc(ne * sizeof(int32_t));
  if (!s->h_logits || !s->h_gather || !s->h_rows || !s->h_sel || !s->h_w || !s->h_count || !s->h_off) ok = 0;
  if (!ok) {
    mdl_moe_free(m);
    snprintf(err, errlen, "model: cannot allocate the expert buffers for %d tokens", cap);
    return -1;
  }
  s->cap = cap;
  return 0;
}

// ---- the routed FFN ----

// One token's routing, as llama.cpp's build_moe_ffn (llama.h, mdl_llama_cfg's MoE fields): p = softmax or sigmoid
// of logits(ne); the selection scores sp = p + bias (bias(ne) or NULL), masked to the n_group_used groups whose two
// best scores sum highest when there are groups; the ku experts of highest sp (ties: the lower id) into sel(ku), best
// first; their p, divided by their sum (at least 6.1e-5, ggml's clamp) when normalised, times the scale, into w(ku).
static void route(const mdl_llama_cfg *c, const float *logits, const float *bias, int32_t *sel, float *w, float *p,
                  float *sp) {
  const int ne = c->n_expert, ku = c->n_expert_used;
  if (c->expert_gating == MDL_GATING_SIGMOID) {
    for (int e = 0; e < ne; e++) p[e] = 1.0f / (1.0f + expf(-logits[e]));
  } else {
    float mx = -INFINITY;
    for (int e = 0; e < ne; e++) mx = fmaxf(mx, logits[e]);
    double sum = 0;
    for (int e = 0; e < ne; e++) {
      p[e] = expf(logits[e] - mx);
      sum += p[e];
    }
    float inv = (float)(1.0 / sum);
    for (int e = 0; e < ne; e++) p[e] *= inv;
  }
  for (int e = 0; e < ne; e++) sp[e] = bias ? p[e] + bias[e] : p[e];
  if (c->n_expert_groups > 1) { // DeepSeek V3's group-limited routing
    const int ng = c->n_expert_groups, per = ne / ng;
    float gs[MOE_MAX_EXPERTS]; // (ng) group scores (ng < ne)
    for (int gi = 0; gi < ng; gi++) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int i = 0; i < per; i++) {
        float v = sp[gi * per + i];
        if (v > b1) b2 = b1, b1 = v;
        else if (v > b2) b2 = v;
      }
      gs[gi] = per > 1 ? b1 + b2 : b1;
    }
    for (int j = 0; j < c->n_group_used; j++) { // keep the best groups: mark them with +inf in gs after choosing
      int best = -1;
      for (int gi = 0; gi < ng; gi++)
        if (gs[gi] != INFINITY && (best < 0 || gs[gi] > gs[best])) best = gi;
      gs[best] = INFINITY;
    }
    for (int gi = 0; gi < ng; gi++)
      if (gs[gi] != INFINITY)
        for (int i = 0; i < per; i++) sp[gi * per + i] = -INFINITY;
  }
  for (int j = 0; j < ku; j++) { // ku is small (8 at most in published models): selection, not a sort
    int best = -1;
    for (int e = 0; e < ne; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= sel[i] == e;
      if (!taken && (best < 0 || sp[e] > sp[best])) best = e;
    }
    sel[j] = best;
  }
  float ws = 1;
  if (c->expert_weights_norm) {
    ws = 0;
    for (int j = 0; j < ku; j++) ws += p[sel[j]];
    if (ws < 6.103515625e-5f) ws = 6.103515625e-5f;
  }
  float sc = c->expert_weights_scale != 0 ? c->expert_weights_scale : 1.0f;
  for (int j = 0; j < ku; j++) w[j] = p[sel[j]] / ws * sc;
}

// Products queued for krn_matmul_group, run whenever KRN_MM_GROUP_MAX are in (each has its own activation).
typedef struct mm_queue {
  krn_mm mm[KRN_MM_GROUP_MAX];
  int n, k;
} mm_queue;
static void mm_flush(krn_ctx *kc, mm_queue *q) {
  if (q->n) krn_matmul_group(kc, q->mm, q->n, q->mm[0].x, q->mm[0].xn, q->k);
  q->n = 0;
}
static void mm_push(krn_ctx *kc, mm_queue *q, krn_mm p) {
  q->mm[q->n++] = p;
  if (q->n == KRN_MM_GROUP_MAX) mm_flush(kc, q);
}

void mdl_moe_ffn(mdl_llama *m, const mdl_layer *L, int T) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_ctx *kc = m->kc;
  const krn_backend *be = kc->be;
  mdl_moe_scratch *s = &m->moe;
  const int ne = c->n_expert, ku = c->n_expert_used, E = c->n_embd, F = c->n_ff_exp, R = T * ku;
  // route on the host: the router's logits come down (a copy on cpu; a sync per layer on cuda)
  be->matmul(kc, s->logits, L->ffn_gate_inp.data, L->ffn_gate_inp.type, m->xb, T, E, ne);
  be->download(kc, s->h_logits, s->logits, (size_t)T * ne * sizeof(float));
  if (be->sync) be->sync(kc);
  float p[MOE_MAX_EXPERTS], sp[MOE_MAX_EXPERTS]; // one token's probabilities and selection scores
  memset(s->h_count, 0, (size_t)ne * sizeof(int32_t));
  for (int t = 0; t < T; t++) {
    route(c, s->h_logits + (size_t)t * ne, L->probs_b, s->h_sel + (size_t)t * ku, s->h_w + (size_t)t * ku, p, sp);
    for (int j = 0; j < ku; j++) s->h_count[s->h_sel[t * ku + j]]++;
  }
  // group by expert: expert e's tokens are rows [off[e], off[e] + count[e]) of xe, in token order
  for (int e = 0, o = 0; e < ne; e++) {
    s->h_off[e] = o;
    o += s->h_count[e];
  }
  for (int t = 0; t < T; t++)
    for (int j = 0; j < ku; j++) {
      int e = s->h_sel[t * ku + j], r = s->h_off[e]++;
      s->h_gather[r] = t;
      s->h_rows[t * ku + j] = r;
    }
  for (int e = 0; e < ne; e++) s->h_off[e] -= s->h_count[e];
  be->upload(kc, s->d_gather, s->h_gather, (size_t)R * sizeof(int32_t));
  be->upload(kc, s->d_rows, s->h_rows, (size_t)R * sizeof(int32_t));
  be->upload(kc, s->d_w, s->h_w, (size_t)R * sizeof(float));
  be->get_rows(kc, s->xe, m->xb, KRN_F32, s->d_gather, R, E);
  // each used expert's gate and up on its tokens, then its down: as few ops as the group size allows (at batch 1
  // every chosen expert's gate and up in one); expert e's matrix is the slice e of the 3-D tensor
  size_t g_bytes = krn_row_size(L->gate_exps.type, E) * (size_t)F;
  size_t u_bytes = krn_row_size(L->up_exps.type, E) * (size_t)F, d_bytes = krn_row_size(L->down_exps.type, F) * (size_t)E;
  mm_queue q = {.k = E};
  for (int e = 0; e < ne; e++) {
    if (!s->h_count[e]) continue;
    size_t o = (size_t)s->h_off[e];
    const float *xe = s->xe + o * E;
    mm_push(kc, &q, (krn_mm){s->ge + o * F, (const char *)L->gate_exps.data + (size_t)e * g_bytes, L->gate_exps.type, F,
                             xe, s->h_count[e]});
    mm_push(kc, &q, (krn_mm){s->ue + o * F, (const char *)L->up_exps.data + (size_t)e * u_bytes, L->up_exps.type, F, xe,
                             s->h_count[e]});
  }
  mm_flush(kc, &q);
  be->swiglu(kc, s->ge, s->ge, s->ue, (int64_t)R * F);
  q.k = F;
  for (int e = 0; e < ne; e++) {
    if (!s->h_count[e]) continue;
    size_t o = (size_t)s->h_off[e];
    mm_push(kc, &q, (krn_mm){s->ye + o * E, (const char *)L->down_exps.data + (size_t)e * d_bytes, L->down_exps.type, E,
                             s->ge + o * F, s->h_count[e]});
  }
  mm_flush(kc, &q);
  be->moe_combine(kc, m->x, s->ye, s->d_rows, s->d_w, T, ku, E);
}

void mdl_moe_shared(mdl_llama *m, const mdl_layer *L, int T) {
  const mdl_llama_cfg *c = &m->cfg;
  const int E = c->n_embd, FS = c->n_ff_exp * c->n_expert_shared;
  krn_mm mm[2] = {{m->hb, L->gate_shexp.data, L->gate_shexp.type, FS, NULL, 0},
                  {m->hb2, L->up_shexp.data, L->up_shexp.type, FS, NULL, 0}};
  krn_matmul_group(m->kc, mm, 2, m->xb, T, E);
  m->kc->be->swiglu(m->kc, m->hb, m->hb, m->hb2, (int64_t)T * FS);
  m->kc->be->matmul(m->kc, m->xb, L->down_shexp.data, L->down_shexp.type, m->hb, T, FS, E);
  m->kc->be->add(m->kc, m->x, m->xb, (int64_t)T * E);
}
