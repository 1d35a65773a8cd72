// models/llama_pool.c: embeddings: a step's final hidden states pooled per sequence (mdl_seq.pool), the GGUF's
// pooling_type, and the normalisation llama.cpp applies.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama_int.h"

static const char *const k_pool_names[] = {"none", "mean", "cls", "last", "rank"};
#define N_POOL (int)(sizeof k_pool_names / sizeof k_pool_names[0])

const char *mdl_pool_name(int pool) { return pool >= 0 && pool < N_POOL ? k_pool_names[pool] : "?"; }

int mdl_pool_named(const char *name) {
  for (int i = 0; name && i < N_POOL; i++)
    if (!strcmp(name, k_pool_names[i])) return i;
  return -1;
}

int mdl_gguf_pooling(const mdl_gguf *g, int *pool, char *err, size_t errlen) {
  mdl_str a;
  *pool = MDL_POOL_MEAN;
  if (!g || mdl_gguf_get_str(g, "general.architecture", &a) != 0 || a.n > 64) return 0;
  char key[96];
  snprintf(key, sizeof key, "%.*s.pooling_type", (int)a.n, a.p);
  int64_t v;
  if (mdl_gguf_get_i64(g, key, &v) != 0) return 0; // absent: a causal LM, mean (docs/openai.md)
  if (v < 0 || v >= N_POOL) {
    snprintf(err, errlen, "model: %s is %lld, not one of llama.cpp's pooling types (0 none .. 4 rank)", key,
             (long long)v);
    return -1;
  }
  *pool = (int)v;
  return 0;
}

void mdl_pool_finish(float *embd, int n, int pool, int n_tokens) {
  if (pool == MDL_POOL_MEAN && n_tokens > 0)
    for (int i = 0; i < n; i++) embd[i] /= (float)n_tokens;
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)embd[i] * embd[i];
  if (ss <= 0) return;
  float inv = (float)(1.0 / sqrt(ss));
  for (int i = 0; i < n; i++) embd[i] *= inv;
}

// After the layers: each pooled sequence's rows of x (its tokens are contiguous in the step: t0 .. t0 + n_tokens),
// normed by output_norm into xb and downloaded, then pooled on the host. Only the rows a pooling reads are normed.
int mdl__pool_step(mdl_llama *m, const mdl_seq *seqs, const mdl_pool_out *pools, int n_seqs, char *err,
                   size_t errlen) {
  const mdl_llama_cfg *c = &m->cfg;
  krn_ctx *kc = m->kc;
  const krn_backend *be = kc->be;
  const int E = c->n_embd;
  for (int s = 0, t0 = 0; s < n_seqs; t0 += seqs[s].n_tokens, s++) {
    const mdl_seq *q = &seqs[s];
    const mdl_pool_out *p = &pools[s];
    if (!p->pool) continue;
    int first = 0, n = q->n_tokens; // the rows this pooling reads, relative to the sequence's first new token
    if (p->pool == MDL_POOL_CLS) {
      if (q->pos0 > 0) continue; // position 0 was in an earlier chunk
      n = 1;
    } else if (p->pool == MDL_POOL_LAST) {
      first = q->n_tokens - 1;
      n = 1;
    } else if (p->pool != MDL_POOL_MEAN) {
      snprintf(err, errlen, "forward: sequence %d asks for pooling '%s' (mean, cls and last are computed)", s,
               mdl_pool_name(p->pool));
      return -1;
    }
    if (n > m->cap_embd) {
      float *h = realloc(m->h_embd, (size_t)n * E * sizeof *h);
      if (!h) {
        snprintf(err, errlen, "forward: out of memory for %d hidden rows", n);
        return -1;
      }
      m->h_embd = h;
      m->cap_embd = n;
    }
    size_t off = (size_t)(t0 + first) * E;
    be->rmsnorm(kc, m->xb + off, m->x + off, m->output_norm.data, n, E, c->rms_eps);
    be->download(kc, m->h_embd, m->xb + off, (size_t)n * E * sizeof(float));
    if (be->sync) be->sync(kc);
    float *o = p->embd;
    if (p->pool != MDL_POOL_MEAN) {
      memcpy(o, m->h_embd, (size_t)E * sizeof *o);
      continue;
    }
    if (q->pos0 == 0) memset(o, 0, (size_t)E * sizeof *o);
    for (int r = 0; r < n; r++)
      for (int i = 0; i < E; i++) o[i] += m->h_embd[(size_t)r * E + i];
  }
  return 0;
}
