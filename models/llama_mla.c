// models/llama_mla.c: multi-head latent attention (deepseek2: DeepSeek V2/V3, Kimi K2): its keys, weights and the
// attention step over a cache of one latent row per position (models/llama.h, mdl_kv), the up-projections absorbed.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama_int.h"

// ---- load ----

// An unsigned key arch.name: 0 with *out (>= lo) when present, *out = dflt when absent and not required; else -1.
static int ukey(const mdl_gguf *g, const char *arch, const char *name, int required, int dflt, int lo, int *out,
                char *err, size_t errlen) {
  char k[128];
  snprintf(k, sizeof k, "%s.%s", arch, name);
  int64_t v;
  const mdl_gguf_kv *kv = mdl_gguf_find(g, k);
  if (!kv) {
    if (required) {
      snprintf(err, errlen, "model: metadata %s missing", k);
      return -1;
    }
    *out = dflt;
    return 0;
  }
  if (kv->type == MDL_GGUF_ARR || mdl_gguf_get_i64(g, k, &v) != 0 || v < lo || v > (1 << 24)) {
    snprintf(err, errlen, "model: metadata %s is not an integer in %d..%d", k, lo, 1 << 24);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static float mscale_of(float factor, float m) { return factor <= 1.0f ? 1.0f : 1.0f + 0.1f * m * logf(factor); }

// deepseek2's RoPE magnitude and softmax scale under YaRN, as llama.cpp computes them (src/llama-context.cpp sets the
// YaRN attention factor from rope.scaling.yarn_log_multiplier; src/models/deepseek2.cpp pre-scales kq_scale by the
// square of the magnitude it cancels; ggml's rope multiplies by the factor times 1 + 0.1 ln(factor) under YaRN).
int mdl_mla_scales(mdl_llama *m, const char *arch, char *err, size_t errlen) {
  mdl_llama_cfg *c = &m->cfg;
  const mdl_rope_scaling *s = &m->rope_s;
  char key[128];
  float logmul = 0;
  snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", arch);
  if (mdl_gguf_get_f32(m->g, key, &logmul) == 0) {
    if (!isfinite(logmul) || logmul < 0) {
      snprintf(err, errlen, "model: %s = %g not a multiplier", key, logmul);
      return -1;
    }
    logmul /= 0.1f; // llama.cpp cancels the converter's 0.1 (its TAG_DEEPSEEK2_YARN_LOG_MUL_FIX)
  }
  float f = s->type == MDL_ROPE_NONE ? 1.0f : s->factor, a = s->attn_factor, yarn_attn = a, rope_mag = a;
  if (s->type == MDL_ROPE_YARN) {
    float ms = logmul != 0 && logmul != 1.0f ? logmul : 1.0f; // llama.cpp's mscale (assumed 1 unless deepseek2's)
    yarn_attn = a * (logmul != 0 ? mscale_of(f, ms) / mscale_of(f, logmul) : mscale_of(f, 1.0f)) /
                (1.0f + 0.1f * logf(f));
    rope_mag = yarn_attn * (1.0f + 0.1f * logf(f));
  }
  float org = yarn_attn * (1.0f + 0.1f * logf(f)), kq = org * (1.0f + 0.1f * logmul * logf(f));
  c->attn_scale = kq * kq / sqrtf((float)c->head_dim);
  if (c->rope_scaled) c->rope_mscale = rope_mag;
  else if (rope_mag != 1.0f) {
    snprintf(err, errlen, "model: a RoPE magnitude of %g without scaled RoPE is not supported", rope_mag);
    return -1;
  }
  return 0;
}

int mdl_mla_load_cfg(mdl_llama *m, const char *arch, char *err, size_t errlen) {
  mdl_llama_cfg *c = &m->cfg;
  const mdl_gguf *g = m->g;
  if (!m->on_host || !m->kc->be->attn_vdim) { // the absorbed attention gathers heads on the host, reads V in K
    snprintf(err, errlen, "model: %s (multi-head latent attention) runs on the cpu backends only, not %s", arch,
             m->kc->be->name);
    return -1;
  }
  int nextn, klen, vlen, kmla, vmla;
  if (ukey(g, arch, "nextn_predict_layers", 0, 0, 0, &nextn, err, errlen)) return -1;
  if (nextn >= c->n_layer) {
    snprintf(err, errlen, "model: %s.nextn_predict_layers = %d leaves no layer of %s.block_count = %d", arch, nextn,
             arch, c->n_layer);
    return -1;
  }
  c->n_layer -= nextn; // the multi-token-prediction layers come last; speculative drafting with them is not built
  c->n_nextn_skipped = nextn;
  if (ukey(g, arch, "attention.kv_lora_rank", 1, 0, 1, &c->kv_lora_rank, err, errlen) ||
      ukey(g, arch, "attention.q_lora_rank", 0, 0, 0, &c->q_lora_rank, err, errlen) ||
      ukey(g, arch, "attention.key_length", 0, c->n_embd / c->n_head, 1, &klen, err, errlen) ||
      ukey(g, arch, "attention.value_length", 0, klen, 1, &vlen, err, errlen) ||
      ukey(g, arch, "attention.key_length_mla", 0, 0, 1, &kmla, err, errlen) ||
      ukey(g, arch, "attention.value_length_mla", 0, 0, 1, &vmla, err, errlen) ||
      ukey(g, arch, "rope.dimension_count", 1, 0, 2, &c->n_rot, err, errlen) ||
      ukey(g, arch, "leading_dense_block_count", 0, 0, 0, &c->n_layer_dense_lead, err, errlen))
    return -1;
  if (!kmla != !vmla) {
    snprintf(err, errlen, "model: %s.attention.key_length_mla and value_length_mla come together (one is missing)",
             arch);
    return -1;
  }
  // split k_b/v_b files name the heads' dims *_mla (key_length is then the latent row's); older ones key_length
  c->head_dim = kmla ? kmla : klen;
  c->head_dim_v = kmla ? vmla : vlen;
  if (kmla && (klen != c->kv_lora_rank + c->n_rot || vlen != c->kv_lora_rank)) {
    snprintf(err, errlen, "model: %s.attention.key_length %d and value_length %d do not match kv_lora_rank %d + "
             "rope.dimension_count %d and kv_lora_rank", arch, klen, vlen, c->kv_lora_rank, c->n_rot);
    return -1;
  }
  if ((c->n_rot & 1) || c->n_rot >= c->head_dim) {
    snprintf(err, errlen, "model: %s.rope.dimension_count %d must be even and below the key length %d", arch,
             c->n_rot, c->head_dim);
    return -1;
  }
  if (c->n_layer_dense_lead > c->n_layer) {
    snprintf(err, errlen, "model: %s.leading_dense_block_count %d exceeds the %d layers", arch,
             c->n_layer_dense_lead, c->n_layer);
    return -1;
  }
  c->n_kv_head = 1; // one latent row serves every head (MQA over a head of kv_lora_rank + n_rot)
  c->rope_neox = 0;
  return 0;
}

// A tensor's row count (ne[1]) or -1; for naming a mismatch with the metadata before the generic shape check.
static int64_t rows_of(const mdl_gguf *g, const char *name) {
  const mdl_gguf_tensor *t = mdl_gguf_tensor_find(g, name);
  return t && t->n_dims >= 2 ? t->ne[1] : -1;
}

// kv_b's nope rows of every head, transposed into an F32 (n_head, kv_lora_rank, qk_nope) k_b the model owns: the
// older combined attn_kv_b (n_head * (qk_nope + head_dim_v) rows of kv_lora_rank) as llama.cpp's converter splits it.
static int split_kv_b(mdl_llama *m, mdl_w kvb, mdl_layer *L, char *err, size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  const int H = c->n_head, R = c->kv_lora_rank, nope = c->head_dim - c->n_rot, vd = c->head_dim_v;
  float *kb = m->kc->be->alloc(m->kc, (size_t)H * R * nope * sizeof(float));
  float *row = malloc((size_t)R * sizeof(float));
  if (!kb || !row) {
    if (kb) m->kc->be->free(m->kc, kb);
    free(row);
    snprintf(err, errlen, "model: out of memory splitting attn_kv_b");
    return -1;
  }
  m->uploads[m->n_uploads++] = kb;
  const krn_backend *sc = krn_cpu_scalar();
  krn_ctx sctx = {sc, NULL, NULL};
  for (int h = 0; h < H; h++)
    for (int j = 0; j < nope; j++) {
      int32_t id = h * (nope + vd) + j;
      sc->get_rows(&sctx, row, kvb.data, kvb.type, &id, 1, R);
      for (int r = 0; r < R; r++) kb[((size_t)h * R + r) * nope + j] = row[r];
    }
  free(row);
  L->wk_b = (mdl_w){kb, KRN_F32};
  L->wv_b = kvb;
  L->wv_b.data = (const char *)kvb.data + (size_t)nope * krn_row_size(kvb.type, R);
  L->vb_stride = nope + vd;
  return 0;
}

int mdl_mla_load_layer(mdl_llama *m, int l, char *err, size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  mdl_layer *L = &m->layers[l];
  const int E = c->n_embd, H = c->n_head, R = c->kv_lora_rank, rope = c->n_rot, nope = c->head_dim - c->n_rot,
            vd = c->head_dim_v, qr = c->q_lora_rank, HK = H * c->head_dim;
  char n[8][64];
  static const char *const names[8] = {"attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_q",
                                       "attn_kv_a_mqa", "attn_kv_a_norm", "attn_k_b", "attn_v_b"};
  for (int i = 0; i < 8; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.weight", l, names[i]);
  int64_t qa = rows_of(m->g, n[0]), kva = rows_of(m->g, n[4]), kb = rows_of(m->g, n[6]);
  if (!qr && qa >= 0) {
    snprintf(err, errlen, "model: tensor %s present (rank %lld) but %s.attention.q_lora_rank is 0", n[0], (long long)qa,
             c->arch);
    return -1;
  }
  if (qr && qa >= 0 && qa != qr) {
    snprintf(err, errlen, "model: tensor %s has rank %lld but %s.attention.q_lora_rank is %d", n[0], (long long)qa,
             c->arch, qr);
    return -1;
  }
  if (kva >= 0 && kva != R + rope) {
    snprintf(err, errlen, "model: tensor %s has %lld rows but %s.attention.kv_lora_rank %d + rope.dimension_count %d = "
             "%d", n[4], (long long)kva, c->arch, R, rope, R + rope);
    return -1;
  }
  if (kb >= 0 && kb != R) {
    snprintf(err, errlen, "model: tensor %s has rank %lld but %s.attention.kv_lora_rank is %d", n[6], (long long)kb,
             c->arch, R);
    return -1;
  }
  if (qr ? mdl_llama_get_w(m, n[0], E, qr, 0, 0, 0, &L->wq_a, err, errlen) ||
               mdl_llama_get_w(m, n[1], qr, 0, 0, 0, 1, &L->q_a_norm, err, errlen) ||
               mdl_llama_get_w(m, n[2], qr, HK, 0, 0, 0, &L->wq_b, err, errlen)
         : mdl_llama_get_w(m, n[3], E, HK, 0, 0, 0, &L->wq, err, errlen))
    return -1;
  if (mdl_llama_get_w(m, n[4], E, R + rope, 0, 0, 0, &L->wkv_a, err, errlen) ||
      mdl_llama_get_w(m, n[5], R, 0, 0, 0, 1, &L->kv_a_norm, err, errlen))
    return -1;
  if (kb >= 0) { // the split form: k_b (n_head, R, nope), v_b (n_head, vd, R)
    if (mdl_llama_get_w(m, n[6], nope, R, H, 0, 0, &L->wk_b, err, errlen) ||
        mdl_llama_get_w(m, n[7], R, vd, H, 0, 0, &L->wv_b, err, errlen))
      return -1;
    L->vb_stride = vd;
  } else {
    char kvn[64];
    mdl_w kvb;
    snprintf(kvn, sizeof kvn, "blk.%d.attn_kv_b.weight", l);
    if (mdl_gguf_tensor_find(m->g, kvn) == NULL) {
      snprintf(err, errlen, "model: tensor %s missing (and so is %s)", n[6], kvn);
      return -1;
    }
    int64_t kvr = mdl_gguf_tensor_find(m->g, kvn)->ne[0];
    if (kvr != R) {
      snprintf(err, errlen, "model: tensor %s has rank %lld but %s.attention.kv_lora_rank is %d", kvn,
               (long long)kvr, c->arch, R);
      return -1;
    }
    if (mdl_llama_get_w(m, kvn, R, (int64_t)H * (nope + vd), 0, 0, 0, &kvb, err, errlen) ||
        split_kv_b(m, kvb, L, err, errlen))
      return -1;
  }
  return 0;
}

// ---- scratch ----

void mdl_mla_free(mdl_llama *m) {
  mdl_mla_scratch *s = &m->mla;
  float *b[] = {s->qa, s->kv, s->qw, s->ow, s->g1, s->g2, s->o};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
    if (b[i]) m->kc->be->free(m->kc, b[i]);
  memset(s, 0, sizeof *s);
}

static int imax(int a, int b) { return a > b ? a : b; }

int mdl_mla_reserve(mdl_llama *m, int T, char *err, size_t errlen) {
  mdl_mla_scratch *s = &m->mla;
  if (T <= s->cap) return 0;
  const mdl_llama_cfg *c = &m->cfg;
  int cap = imax(s->cap * 2 > T ? s->cap * 2 : T, 16);
  mdl_mla_free(m);
  size_t n = (size_t)cap, H = (size_t)c->n_head, W = (size_t)mdl_kv_width(c), R = (size_t)c->kv_lora_rank;
  size_t g1 = (size_t)imax(imax(c->head_dim - c->n_rot, c->n_rot), c->kv_lora_rank);
  size_t g2 = (size_t)imax(c->kv_lora_rank, c->head_dim_v);
  float **b[] = {&s->qa, &s->kv, &s->qw, &s->ow, &s->g1, &s->g2, &s->o};
  size_t sz[] = {n * (size_t)imax(c->q_lora_rank, 1), n * W, n * H * W, n * H * W, H * n * g1, H * n * g2,
                 n * H * (size_t)c->head_dim_v};
  (void)R;
  for (int i = 0; i < 7; i++)
    if (!(*b[i] = m->kc->be->alloc(m->kc, sz[i] * sizeof(float)))) {
      mdl_mla_free(m);
      snprintf(err, errlen, "model: cannot allocate the latent attention's buffers for %d tokens", cap);
      return -1;
    }
  s->cap = cap;
  return 0;
}

// ---- the step ----

// dst(T rows of dw, at column d0) = src(T rows of sw, from column s0), n values each.
static void cols(float *dst, int dw, int d0, const float *src, int sw, int s0, int T, int n) {
  for (int t = 0; t < T; t++) memcpy(dst + (size_t)t * dw + d0, src + (size_t)t * sw + s0, (size_t)n * sizeof(float));
}

// llama.cpp's deepseek2 graph with MLA (src/models/deepseek2.cpp, is_mla): q (low-rank or plain) split into q_nope
// and the roped q_pe; the latent kv_cmpr normed, the shared key k_pe roped; q_nope times each head's k_b gives a
// latent query, so scores are [q_latent, q_pe] . [latent, k_pe] against the one cached row (MQA), and the values are
// that row's latent, turned into each head's value by its v_b, then attn_output. The row is cached whole and read as
// both K and V: the attention's v_dim is kv_lora_rank, so V is the latent part of the row (krn_attn_args.v_dim).
void mdl_mla_attn(mdl_llama *m, const mdl_layer *L, const mdl_kv *kv, krn_attn_args *a, int l,
                  mdl_layer_done_fn on_layer, void *on_layer_arg) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_ctx *kc = m->kc;
  const krn_backend *be = kc->be;
  mdl_mla_scratch *s = &m->mla;
  const int T = a->n_tokens, E = c->n_embd, H = c->n_head, R = c->kv_lora_rank, rope = c->n_rot, hk = c->head_dim,
            nope = hk - rope, vd = c->head_dim_v, W = R + rope, qr = c->q_lora_rank;
  float *xb = m->xb, *q = m->q; // q (T, H, hk)
  be->rmsnorm(kc, xb, m->x, L->attn_norm.data, T, E, c->rms_eps);
  if (qr) {
    krn_mm mm[2] = {{s->qa, L->wq_a.data, L->wq_a.type, qr, NULL, 0},
                    {s->kv, L->wkv_a.data, L->wkv_a.type, W, NULL, 0}};
    krn_matmul_group(kc, mm, 2, xb, T, E);
    be->rmsnorm(kc, s->qa, s->qa, L->q_a_norm.data, T, qr, c->rms_eps);
    be->matmul(kc, q, L->wq_b.data, L->wq_b.type, s->qa, T, qr, H * hk);
  } else {
    krn_mm mm[2] = {{q, L->wq.data, L->wq.type, H * hk, NULL, 0}, {s->kv, L->wkv_a.data, L->wkv_a.type, W, NULL, 0}};
    krn_matmul_group(kc, mm, 2, xb, T, E);
  }
  // the cache rows: the latent normed in place, the key roped (gathered, as the rope op takes whole rows)
  for (int t = 0; t < T; t++) be->rmsnorm(kc, s->kv + (size_t)t * W, s->kv + (size_t)t * W, L->kv_a_norm.data, 1, R,
                                          c->rms_eps);
  cols(s->g1, rope, 0, s->kv, W, R, T, rope);
  if (c->rope_scaled) be->rope_freqs(kc, s->g1, m->d_pos, T, 1, rope, m->rope_freq, c->rope_mscale, 0);
  else be->rope(kc, s->g1, m->d_pos, T, 1, rope, c->rope_theta, 0);
  cols(s->kv, W, R, s->g1, rope, 0, T, rope);
  // the queries' rope parts, then each head's latent query: q_nope (T, nope) of head h times k_b[h] (R, nope)^T
  for (int h = 0; h < H; h++) cols(s->g1 + (size_t)h * rope, H * rope, 0, q, H * hk, h * hk + nope, T, rope);
  if (c->rope_scaled) be->rope_freqs(kc, s->g1, m->d_pos, T, H, rope, m->rope_freq, c->rope_mscale, 0);
  else be->rope(kc, s->g1, m->d_pos, T, H, rope, c->rope_theta, 0);
  for (int h = 0; h < H; h++) cols(s->qw, H * W, h * W + R, s->g1, H * rope, h * rope, T, rope);
  size_t kb_head = krn_row_size(L->wk_b.type, nope) * (size_t)R;
  for (int h = 0; h < H; h++) {
    float *qn = s->g1 + (size_t)h * T * nope;
    cols(qn, nope, 0, q, H * hk, h * hk, T, nope);
    be->matmul(kc, s->g2, (const char *)L->wk_b.data + (size_t)h * kb_head, L->wk_b.type, qn, T, nope, R);
    cols(s->qw, H * W, h * W, s->g2, R, 0, T, R);
  }
  krn_attn_args aa = *a;
  aa.n_head = H;
  aa.n_kv_head = 1;
  aa.head_dim = W;
  aa.k_cache = aa.v_cache = mdl_kv_chunk(c, kv, l, 0, 0);
  aa.block_tables = m->d_bt + (size_t)mdl_kv_group_of(kv, l) * m->bt_group_stride;
  aa.scale = c->attn_scale;
  aa.v_dim = R;
  be->kv_store(kc, s->kv, s->kv, &aa); // K and V are the same row: written once per pointer, the same bytes
  if (on_layer) on_layer(on_layer_arg, l);
  be->paged_attention(kc, s->ow, s->qw, &aa);
  // each head's value: its latent output (T, R) times v_b[h] (vd, R)^T, into o (T, H * vd)
  size_t vb_row = krn_row_size(L->wv_b.type, R);
  for (int h = 0; h < H; h++) {
    float *ol = s->g1 + (size_t)h * T * R, *ov = s->g2 + (size_t)h * T * vd;
    cols(ol, R, 0, s->ow, H * R, h * R, T, R);
    be->matmul(kc, ov, (const char *)L->wv_b.data + (size_t)h * L->vb_stride * vb_row, L->wv_b.type, ol, T, R, vd);
    cols(s->o, H * vd, h * vd, ov, vd, 0, T, vd);
  }
  be->matmul(kc, xb, L->wo.data, L->wo.type, s->o, T, H * vd, E);
  be->add(kc, m->x, xb, (int64_t)T * E);
}
