// models/llama_load.c: a Llama-family model from a GGUF: its config from the metadata, RoPE scaling, its weights.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama_int.h"
#include "models/null.h"

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

static int get_w(mdl_llama *m, const char *name, int64_t ne0, int64_t ne1, int optional, int f32_only, mdl_w *out,
                 char *err, size_t errlen) {
  return mdl_llama_get_w(m, name, ne0, ne1, 0, optional, f32_only, out, err, errlen);
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

// One per-pair factor tensor (rope_freqs.weight, rope_factors_long/_short.weight): F32, head_dim / 2 positive values.
static int rope_factor_tensor(const mdl_gguf *g, const char *name, int half, const float **out, char *err,
                              size_t errlen) {
  const mdl_gguf_tensor *ft = mdl_gguf_tensor_find(g, name);
  *out = NULL;
  if (!ft) return 0;
  if (ft->type != KRN_F32 || ft->n_dims != 1 || ft->ne[0] != half || ft->nbytes < (size_t)half * 4) {
    snprintf(err, errlen, "model: tensor %s has type %s and shape (%lld), expected F32 of (%d) (head_dim / 2)", name,
             krn_type_name(ft->type), (long long)ft->ne[0], half);
    return -1;
  }
  const float *f = (const float *)ft->data;
  for (int i = 0; i < half; i++)
    if (!(f[i] > 0) || !isfinite(f[i])) {
      snprintf(err, errlen, "model: %s[%d] = %g not positive", name, i, f[i]);
      return -1;
    }
  *out = f;
  return 0;
}

// The RoPE table for a sequence context of n_ctx (llama.h, mdl_llama_set_ctx): phi3's long or short factors chosen
// as llama.cpp's llama_model::get_rope_factors does, then one inverse frequency per pair into cfg (and the backend).
static int rope_table(mdl_llama *m, int n_ctx, char *err, size_t errlen) {
  mdl_llama_cfg *c = &m->cfg;
  mdl_rope_scaling s = m->rope_s;
  int rd = c->kv_lora_rank ? c->n_rot : c->head_dim, half = rd / 2; // (MLA ropes n_rot dims of each head)
  if (m->rope_factors[0] || m->rope_factors[1]) {
    c->rope_long = n_ctx > s.n_ctx_orig;
    s.freq_factors = m->rope_factors[c->rope_long]; // (both present: rope_scaling checked)
    char *plus = strchr(c->rope_scaling, '+');
    if (plus) *plus = 0;
    size_t l = strlen(c->rope_scaling);
    snprintf(c->rope_scaling + l, sizeof c->rope_scaling - l, c->rope_long ? "+long" : "+short");
  }
  int identity = (s.type == MDL_ROPE_NONE || s.factor == 1.0f) && !s.freq_factors && s.attn_factor == 1.0f;
  if (identity) return 0;
  mdl_rope_freqs(&s, rd, c->rope_theta, c->rope_inv_freq, &c->rope_mscale);
  c->rope_scaled = 1;
  if (m->on_host) m->rope_freq = c->rope_inv_freq;
  else {
    if (!m->rope_freq) {
      void *d = m->kc->be->alloc(m->kc, (size_t)half * 4);
      if (!d) {
        snprintf(err, errlen, "model: cannot allocate the RoPE frequencies on %s", m->kc->be->name);
        return -1;
      }
      m->uploads[m->n_uploads++] = d;
      m->rope_freq = d;
    }
    m->kc->be->upload(m->kc, (void *)m->rope_freq, c->rope_inv_freq, (size_t)half * 4);
  }
  return 0;
}

int mdl_llama_set_ctx(mdl_llama *m, int n_ctx, char *err, size_t errlen) {
  if (n_ctx < 1) {
    snprintf(err, errlen, "model: context %d not positive", n_ctx);
    return -1;
  }
  if (!m->rope_factors[0] && !m->rope_factors[1]) return 0; // nothing depends on it
  return rope_table(m, n_ctx, err, errlen);
}

// The GGUF's RoPE scaling (llama.h) into m->rope_s and m->cfg; an unknown type, a bad factor or a scaling this backend
// or architecture cannot run is an error. Scaling that changes nothing leaves plain RoPE.
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
    else if (!mdl_str_eq(rs, "linear") && !mdl_str_eq(rs, "longrope")) { // longrope: ggml rotates it as linear
      snprintf(err, errlen,
               "model: %s '%.*s' not supported (none, linear, yarn and longrope are; Llama 3's scaling comes as the "
               "tensor rope_freqs.weight)",
               key, (int)(rs.n < 32 ? rs.n : 32), rs.p);
      return -1;
    }
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "%.*s", (int)(rs.n < 16 ? rs.n : 16), rs.p);
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
  snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", arch); // phi3's LongRoPE attention factor, too
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
  int half = (c->kv_lora_rank ? c->n_rot : c->head_dim) / 2, phi3 = !strcmp(arch, "phi3");
  c->rope_long = -1;
  if (mdl_gguf_tensor_find(g, "rope_freqs.weight")) { // Llama 3.x: llama.cpp reads it for the llama architecture only
    if (strcmp(arch, "llama") != 0) {
      snprintf(err, errlen, "model: rope_freqs.weight is not supported for %s (llama only, as llama.cpp)", arch);
      return -1;
    }
    if (rope_factor_tensor(g, "rope_freqs.weight", half, &s.freq_factors, err, errlen)) return -1;
    size_t l = strlen(c->rope_scaling);
    snprintf(c->rope_scaling + l, sizeof c->rope_scaling - l, "+freqs");
  }
  // phi3's LongRoPE: per-pair divisors, long or short by the context (rope_table); llama.cpp reads them for phi3
  if (phi3 && (rope_factor_tensor(g, "rope_factors_short.weight", half, &m->rope_factors[0], err, errlen) ||
               rope_factor_tensor(g, "rope_factors_long.weight", half, &m->rope_factors[1], err, errlen)))
    return -1;
  if (!m->rope_factors[0] != !m->rope_factors[1]) { // llama.cpp would rotate one context without factors: more
    // likely a half-converted file than a model meant so
    snprintf(err, errlen, "model: rope_factors_%s.weight missing (rope_factors_%s.weight is present)",
             m->rope_factors[0] ? "long" : "short", m->rope_factors[0] ? "short" : "long");
    return -1;
  }
  if (!phi3 &&
      (mdl_gguf_tensor_find(g, "rope_factors_long.weight") || mdl_gguf_tensor_find(g, "rope_factors_short.weight"))) {
    snprintf(err, errlen, "model: rope_factors_long/short.weight are not supported for %s (phi3 only)", arch);
    return -1;
  }
  m->rope_s = s;
  int identity = (s.type == MDL_ROPE_NONE || s.factor == 1.0f) && !s.freq_factors && s.attn_factor == 1.0f &&
                 !m->rope_factors[0] && !m->rope_factors[1];
  if (identity) return 0;
  if (half > (int)(sizeof c->rope_inv_freq / sizeof c->rope_inv_freq[0])) {
    snprintf(err, errlen, "model: head_dim %d too large for scaled RoPE (512 at most)", c->head_dim);
    return -1;
  }
  if (c->gemma3 && (s.type == MDL_ROPE_YARN || s.attn_factor != 1.0f)) { // (llama.cpp scales the local layers too)
    snprintf(err, errlen, "model: yarn rope scaling or an attention factor with gemma3 is not supported (linear is)");
    return -1;
  }
  if (c->gemma2) { // llama.cpp scales its local layers too, with their own base: not done here
    snprintf(err, errlen, "model: rope scaling (%s) with gemma2 is not supported", c->rope_scaling);
    return -1;
  }
  if (!m->kc->be->rope_freqs) {
    snprintf(err, errlen, "model: rope scaling (%s) needs scaled RoPE, which the %s backend lacks", c->rope_scaling,
             m->kc->be->name);
    return -1;
  }
  return rope_table(m, c->n_ctx_train, err, errlen);
}

// The architectures mdl_llama_load takes (general.architecture), as llama.cpp names them, and whether each rotates
// NeoX-style (llama.cpp's llama_model_rope_type): the one list, which the error for any other name prints.
static const struct {
  const char *name;
  int neox;
} k_archs[] = {{"llama", 0},  {"qwen2", 1},    {"qwen3", 1},    {"phi3", 1},
               {"gemma2", 1}, {"gemma3", 1},   {"qwen3moe", 1}, {"deepseek2", 0}};
#define N_ARCHS (int)(sizeof k_archs / sizeof k_archs[0])

static int arch_index(const char *arch) {
  for (int i = 0; i < N_ARCHS; i++)
    if (!strcmp(arch, k_archs[i].name)) return i;
  return -1;
}

// Rows [r0, ...) of w, a matrix of k-element rows. A tensor's rows are contiguous, krn_row_size(type, k) bytes each
// (whole blocks: get_w checked k against the type's block), so a row range of a fused matrix (phi3's attn_qkv and
// ffn_up) is a pointer into the same memory, mapped or uploaded, with nothing copied and no kernel of its own.
static mdl_w w_rows(mdl_w w, int64_t k, int64_t r0) {
  w.data = (const char *)w.data + (size_t)r0 * krn_row_size(w.type, k);
  return w;
}

// The hyper-parameters only some architectures have (llama.cpp's load_arch_hparams for each), into m->cfg.
static int arch_keys(mdl_llama *m, const mdl_gguf *g, const char *arch, char *err, size_t errlen) {
  mdl_llama_cfg *c = &m->cfg;
  char key[128];
  if (c->gemma2 || c->gemma3) {
    // gemma2 (src/models/gemma2.cpp): window 4096 and pattern 2 unless given, local RoPE base = the global one,
    // attention scores capped at 50 and logits at 30 unless given; gemma3: pattern 6, local base 10000, no caps
    if (get_int(g, arch, "attention.sliding_window", 0, c->gemma2 ? 4096 : 0, &c->n_swa, err, errlen)) return -1;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    const mdl_gguf_kv *pk = mdl_gguf_find(g, key);
    if (pk && pk->type == MDL_GGUF_ARR) {
      snprintf(err, errlen, "model: %s as a per-layer array is not supported (an integer pattern is)", key);
      return -1;
    }
    if (get_int(g, arch, "attention.sliding_window_pattern", 0, c->gemma2 ? 2 : 6, &c->swa_pattern, err, errlen))
      return -1;
    snprintf(key, sizeof key, "%s.rope.freq_base_swa", arch);
    if (mdl_gguf_get_f32(g, key, &c->rope_theta_swa) != 0) c->rope_theta_swa = c->gemma2 ? c->rope_theta : 10000.0f;
    if (!(c->rope_theta_swa > 0)) {
      snprintf(err, errlen, "model: local rope base %g not positive", c->rope_theta_swa);
      return -1;
    }
    c->final_softcap = c->gemma2 ? 30.0f : 0.0f;
    snprintf(key, sizeof key, "%s.final_logit_softcapping", arch);
    if (mdl_gguf_get_f32(g, key, &c->final_softcap) == 0 && !(c->final_softcap >= 0 && isfinite(c->final_softcap))) {
      snprintf(err, errlen, "model: %s = %g not a soft-cap (> 0, or 0 for none)", key, c->final_softcap);
      return -1;
    }
    if (c->gemma2) {
      c->attn_softcap = 50.0f;
      snprintf(key, sizeof key, "%s.attn_logit_softcapping", arch);
      if (mdl_gguf_get_f32(g, key, &c->attn_softcap) == 0 && !(c->attn_softcap > 0 && isfinite(c->attn_softcap))) {
        snprintf(err, errlen, "model: %s = %g not positive", key, c->attn_softcap);
        return -1;
      }
    }
    // llama.cpp (after gemma_pytorch's query_pre_attn_scalar): 1 / sqrt(head_dim), except the 27B models (gemma2: 46
    // layers, gemma3: 62), whose scale is 1 / sqrt(n_embd / n_head)
    if (c->n_layer == (c->gemma2 ? 46 : 62)) c->attn_scale = 1.0f / sqrtf((float)(c->n_embd / c->n_head));
    if (c->final_softcap > 0 && !m->kc->be->softcap) {
      snprintf(err, errlen, "model: %s's final logit soft-capping needs the softcap op, which the %s backend lacks",
               arch, m->kc->be->name);
      return -1;
    }
  }
  if (!strcmp(arch, "phi3")) { // llama.cpp reads phi3's sliding_window and turns it off (its PR 13676): so do we
    if (get_int(g, arch, "attention.sliding_window", 0, 0, &c->n_swa_ignored, err, errlen)) return -1;
  }
  return 0;
}

// Layer l's attention weights: q, k, v separate (attn_q/k/v) or as row ranges of one attn_qkv (rows q, then k, then
// v, as llama.cpp's build_qkv views them), with optional biases (separate, or one attn_qkv.bias), as llama.cpp's
// create_tensor_qkv takes them for every architecture.
static int attn_weights(mdl_llama *m, int l, mdl_layer *L, char *err, size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  int E = c->n_embd, HD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim;
  char n[4][64];
  snprintf(n[0], sizeof n[0], "blk.%d.attn_qkv.weight", l);
  if (mdl_gguf_tensor_find(m->g, n[0])) {
    mdl_w qkv, b;
    snprintf(n[1], sizeof n[1], "blk.%d.attn_qkv.bias", l);
    if (get_w(m, n[0], E, HD + 2 * KD, 0, 0, &qkv, err, errlen) ||
        get_w(m, n[1], HD + 2 * KD, 0, 1, 1, &b, err, errlen))
      return -1;
    L->wq = qkv;
    L->wk = w_rows(qkv, E, HD);
    L->wv = w_rows(qkv, E, HD + KD);
    m->cfg.fused_qkv++;
    if (b.data) {
      L->bq = b;
      L->bk = w_rows(b, 1, HD);
      L->bv = w_rows(b, 1, HD + KD);
      return 0;
    }
  } else {
    static const char *const qkv[3] = {"attn_q", "attn_k", "attn_v"};
    for (int i = 0; i < 3; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.weight", l, qkv[i]);
    if (get_w(m, n[0], E, HD, 0, 0, &L->wq, err, errlen) || get_w(m, n[1], E, KD, 0, 0, &L->wk, err, errlen) ||
        get_w(m, n[2], E, KD, 0, 0, &L->wv, err, errlen))
      return -1;
  }
  static const char *const bias[3] = {"attn_q", "attn_k", "attn_v"};
  for (int i = 0; i < 3; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.bias", l, bias[i]);
  return get_w(m, n[0], HD, 0, 1, 1, &L->bq, err, errlen) || get_w(m, n[1], KD, 0, 1, 1, &L->bk, err, errlen) ||
                 get_w(m, n[2], KD, 0, 1, 1, &L->bv, err, errlen)
             ? -1
             : 0;
}

// Layer l's weights (llama.cpp's load_arch_tensors of each architecture).
static int layer_weights(mdl_llama *m, int l, char *err, size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  mdl_layer *L = &m->layers[l];
  int E = c->n_embd, HD = c->n_head * c->head_dim, F = c->n_ff;
  char n[6][64];
  static const char *const names[6] = {"attn_norm", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
  for (int i = 0; i < 6; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.weight", l, names[i]);
  if (c->kv_lora_rank) HD = c->n_head * c->head_dim_v; // MLA's attention output is n_head values of head_dim_v
  if (get_w(m, n[0], E, 0, 0, 1, &L->attn_norm, err, errlen) ||
      (c->kv_lora_rank ? mdl_mla_load_layer(m, l, err, errlen) : attn_weights(m, l, L, err, errlen)) ||
      get_w(m, n[1], HD, E, 0, 0, &L->wo, err, errlen) || get_w(m, n[2], E, 0, 0, 1, &L->ffn_norm, err, errlen))
    return -1;
  if (c->n_expert && l >= c->n_layer_dense_lead) { // the router and experts instead of ffn_gate, ffn_up, ffn_down
    if (mdl_moe_load_layer(m, l, err, errlen)) return -1;
  } else if (get_w(m, n[5], F, E, 0, 0, &L->wd, err, errlen)) {
    return -1;
  } else if (c->fused_gate_up) { // phi3: ffn_up (E, 2 F), gate rows first (llama.cpp's ggml_swiglu: silu of the first half)
    if (get_w(m, n[4], E, 2 * (int64_t)F, 0, 0, &L->wg, err, errlen)) return -1;
    L->wu = w_rows(L->wg, E, F);
  } else if (get_w(m, n[3], E, F, 0, 0, &L->wg, err, errlen) || get_w(m, n[4], E, F, 0, 0, &L->wu, err, errlen)) {
    return -1;
  }
  // the norms are plain RMS norms: llama.cpp's converter folds Gemma's (1 + w) into the stored weights
  char g4[4][64];
  static const char *const gn[4] = {"attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"};
  for (int i = 0; i < 4; i++) snprintf(g4[i], sizeof g4[i], "blk.%d.%s.weight", l, gn[i]);
  if (c->qk_norm && (get_w(m, g4[0], c->head_dim, 0, 0, 1, &L->q_norm, err, errlen) ||
                     get_w(m, g4[1], c->head_dim, 0, 0, 1, &L->k_norm, err, errlen)))
    return -1;
  if ((c->gemma2 || c->gemma3) && (get_w(m, g4[2], E, 0, 0, 1, &L->post_attn_norm, err, errlen) ||
                                   get_w(m, g4[3], E, 0, 0, 1, &L->post_ffn_norm, err, errlen)))
    return -1;
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
  int is_null = mdl_str_eq(a, MDL_NULL_NAME); // no weights: these same functions run it (models/null.h)
  int ai = a.n < 31 ? arch_index(arch) : -1, mla = !strcmp(arch, "deepseek2");
  if (ai < 0 && !is_null) {
    char list[256] = "";
    for (int i = 0; i < N_ARCHS; i++) {
      size_t l = strlen(list);
      snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", k_archs[i].name);
    }
    snprintf(err, errlen, "model: architecture '%.*s' not supported (%s)", (int)(a.n < 64 ? a.n : 64), a.p, list);
    return -1;
  }
  int gemma2 = !strcmp(arch, "gemma2"), gemma3 = !strcmp(arch, "gemma3"), qwen3moe = !strcmp(arch, "qwen3moe");
  if ((gemma2 || gemma3) && !(kc->be->geglu && kc->be->scale && kc->be->attn_window)) {
    snprintf(err, errlen, "model: %s needs GELU, scale and sliding-window attention ops, which the %s backend lacks",
             arch, kc->be->name);
    return -1;
  }
  if (gemma2 && !kc->be->attn_softcap) {
    snprintf(err, errlen, "model: gemma2 needs soft-capped attention scores, which the %s backend lacks (cpu has them)",
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
  if (is_null) {
    if (mdl_null_load(m, g, err, errlen)) {
      mdl_llama_free(m);
      return -1;
    }
    *out = m;
    return 0;
  }
  mdl_llama_cfg *c = &m->cfg;
  snprintf(c->arch, sizeof c->arch, "%s", arch);
  c->rope_neox = k_archs[ai].neox;
  c->gemma3 = gemma3;
  c->gemma2 = gemma2;
  c->qk_norm = gemma3 || !strcmp(arch, "qwen3") || qwen3moe;
  c->fused_gate_up = !strcmp(arch, "phi3");
  // (an MoE model's feed_forward_length is optional, as llama.cpp reads it: mdl_moe_load_cfg checks what it needs)
  if (get_int(g, arch, "block_count", 1, 0, &c->n_layer, err, errlen) ||
      get_int(g, arch, "embedding_length", 1, 0, &c->n_embd, err, errlen) ||
      get_int(g, arch, "feed_forward_length", !qwen3moe, 0, &c->n_ff, err, errlen) ||
      get_int(g, arch, "attention.head_count", 1, 0, &c->n_head, err, errlen) ||
      get_int(g, arch, "attention.head_count_kv", 0, c->n_head, &c->n_kv_head, err, errlen) ||
      get_int(g, arch, "context_length", 0, 2048, &c->n_ctx_train, err, errlen))
    goto fail;
  if (c->n_head % c->n_kv_head) {
    snprintf(err, errlen, "model: %d heads are not a multiple of %d KV heads", c->n_head, c->n_kv_head);
    goto fail;
  }
  // key_length and value_length: n_embd / n_head unless given (qwen3's heads are not n_embd / n_head wide)
  if (get_int(g, arch, "attention.key_length", 0, c->n_embd / c->n_head, &c->head_dim, err, errlen)) goto fail;
  int vlen, rdim;
  if (mla) { // its heads' dims and the latent's come from the MLA keys
    if (mdl_mla_load_cfg(m, arch, err, errlen)) goto fail;
  } else if (get_int(g, arch, "attention.value_length", 0, c->head_dim, &vlen, err, errlen) ||
             get_int(g, arch, "rope.dimension_count", 0, c->head_dim, &rdim, err, errlen)) {
    goto fail;
  } else if (vlen != c->head_dim || rdim != c->head_dim || (c->head_dim & 1) || c->head_dim < 2) {
    snprintf(err, errlen, "model: head dims (key %d, value %d, rope %d) differ; not supported (partial RoPE, as "
             "Phi-4-mini's, is not either)", c->head_dim, vlen, rdim);
    goto fail;
  }
  char key[128];
  snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
  if (mdl_gguf_get_f32(g, key, &c->rms_eps) != 0) c->rms_eps = 1e-5f;
  snprintf(key, sizeof key, "%s.rope.freq_base", arch);
  if (mdl_gguf_get_f32(g, key, &c->rope_theta) != 0) c->rope_theta = 10000.0f;
  c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
  if (!(c->rms_eps > 0) || !(c->rope_theta > 0)) {
    snprintf(err, errlen, "model: rms epsilon %g or rope base %g not positive", c->rms_eps, c->rope_theta);
    goto fail;
  }
  if (arch_keys(m, g, arch, err, errlen) || mdl_moe_load_cfg(m, arch, err, errlen)) goto fail;
  const mdl_gguf_tensor *te = mdl_gguf_tensor_find(g, "token_embd.weight");
  if (!te || te->n_dims < 2 || te->ne[1] < 1 || te->ne[1] > (1 << 30)) {
    snprintf(err, errlen, "model: tensor token_embd.weight missing or not a matrix");
    goto fail;
  }
  c->n_vocab = (int)te->ne[1];
  c->tied_embeddings = mdl_gguf_tensor_find(g, "output.weight") == NULL;
  if (gemma2 && !c->tied_embeddings) { // llama.cpp's gemma2 projects with token_embd and counts output.weight extra
    snprintf(err, errlen, "model: gemma2 projects its logits with token_embd.weight; output.weight is not expected");
    goto fail;
  }

  int E = c->n_embd;
  m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
  m->uploads = calloc((size_t)c->n_layer * 24 + 4, sizeof *m->uploads);
  if (!m->layers || !m->uploads) {
    snprintf(err, errlen, "model: out of memory");
    goto fail;
  }
  if (rope_scaling(m, g, arch, err, errlen) != 0) goto fail; // (may upload its table: after m->uploads)
  if (mla && mdl_mla_scales(m, arch, err, errlen)) goto fail;
  if (get_w(m, "token_embd.weight", E, c->n_vocab, 0, 0, &m->tok_embd, err, errlen) ||
      get_w(m, "output_norm.weight", E, 0, 0, 1, &m->output_norm, err, errlen))
    goto fail;
  if (c->tied_embeddings) m->output = m->tok_embd;
  else if (get_w(m, "output.weight", E, c->n_vocab, 0, 0, &m->output, err, errlen)) goto fail;
  for (int l = 0; l < c->n_layer; l++)
    if (layer_weights(m, l, err, errlen)) goto fail;
  *out = m;
  return 0;
fail:
  mdl_llama_free(m);
  return -1;
}
