// models/null.c: the null model (models/null.h): its synthetic GGUF (vocabulary, geometry, step times) and its step,
// which computes nothing but waits the step's time and returns logits that depend on (position, token) only.
#include "models/null.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/llama_int.h"

// The vocabulary, in id order: 5 control tokens, the 256 byte tokens (any text encodes), U+2581 and the 26 letters
// alone and after U+2581, the syllables (consonant, vowel) alone and after U+2581, then the words: U+2581 and two
// syllables. Every word's SentencePiece merge path (U+2581 + syllable, then + syllable) is in the vocabulary, so
// " bako" encodes to one token; generated text is words only.
static const char *const k_control[] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
enum { NUL_UNK = 0, NUL_BOS = 1, NUL_EOS = 2, NUL_N_CONTROL = 5 };
static const char k_cons[] = "bdgklmnprstv", k_vow[] = "aeiou";
enum { NUL_N_SYL = 12 * 5, NUL_WORDS_PER_SYL = 10 };
enum { NUL_FIRST_WORD = NUL_N_CONTROL + 256 + 1 + 26 + 26 + NUL_N_SYL * 2 };
enum { NUL_N_VOCAB = NUL_FIRST_WORD + NUL_N_SYL * NUL_WORDS_PER_SYL };
#define SPACE "\xe2\x96\x81" // U+2581, SentencePiece's space

typedef struct mdl_null {
  int64_t step_us, prefill_ns;  // a step's time, and each extra token's (ns: 50 us / token is 50000)
  mdl_null_clock clock;
} mdl_null;

// ---- the GGUF in memory ----

typedef struct wbuf {
  uint8_t *p;
  size_t n, cap;
  int oom;
} wbuf;

static void put(wbuf *b, const void *src, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 65536;
    while (nc < b->n + n) nc *= 2;
    uint8_t *np = realloc(b->p, nc);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}
static void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(wbuf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void kv_str(wbuf *b, const char *k, const char *v) {
  put_str(b, k);
  put_u32(b, MDL_GGUF_STR);
  put_str(b, v);
}
static void kv_u32(wbuf *b, const char *k, uint32_t v) {
  put_str(b, k);
  put_u32(b, MDL_GGUF_U32);
  put_u32(b, v);
}
static void kv_bool(wbuf *b, const char *k, int v) {
  put_str(b, k);
  put_u32(b, MDL_GGUF_BOOL);
  uint8_t x = (uint8_t)(v != 0);
  put(b, &x, 1);
}
static void kv_arr(wbuf *b, const char *k, mdl_gguf_vtype t, uint64_t n) {
  put_str(b, k);
  put_u32(b, MDL_GGUF_ARR);
  put_u32(b, t);
  put_u64(b, n);
}

// Token i's text into out (cap >= 16); its GGUF token type in *type and its SentencePiece score in *score (longer
// pieces merge first).
static void token_text(int i, char *out, int *type, float *score) {
  *type = 1; // normal
  if (i < NUL_N_CONTROL) {
    snprintf(out, 16, "%s", k_control[i]);
    *type = i == NUL_UNK ? 2 : 3;
  } else if ((i -= NUL_N_CONTROL) < 256) {
    snprintf(out, 16, "<0x%02X>", i);
    *type = 6;
  } else if ((i -= 256) == 0) {
    snprintf(out, 16, SPACE);
  } else if ((i -= 1) < 52) {
    snprintf(out, 16, "%s%c", i < 26 ? "" : SPACE, 'a' + i % 26);
  } else if ((i -= 52) < 2 * NUL_N_SYL) {
    int s = i % NUL_N_SYL;
    snprintf(out, 16, "%s%c%c", i < NUL_N_SYL ? "" : SPACE, k_cons[s / 5], k_vow[s % 5]);
  } else {
    i -= 2 * NUL_N_SYL;
    int s1 = i / NUL_WORDS_PER_SYL, s2 = (s1 * 7 + i % NUL_WORDS_PER_SYL) % NUL_N_SYL;
    snprintf(out, 16, SPACE "%c%c%c%c", k_cons[s1 / 5], k_vow[s1 % 5], k_cons[s2 / 5], k_vow[s2 % 5]);
  }
  *score = *type == 1 ? (float)strlen(out) : 0.0f;
}

int mdl_null_gguf(const mdl_null_opts *o, mdl_gguf **out, char *err, size_t errlen) {
  *out = NULL;
  if (o && !(o->step_ms >= 0 && o->step_ms <= 60000)) {
    snprintf(err, errlen, "null_step_ms %g is out of range (0 to 60000)", o->step_ms);
    return -1;
  }
  if (o && !(o->prefill_us_per_token >= 0 && o->prefill_us_per_token <= 1e6)) {
    snprintf(err, errlen, "null_prefill_us_per_token %g is out of range (0 to 1000000)", o->prefill_us_per_token);
    return -1;
  }
  if (o && (o->kv_bytes_per_token < MDL_NULL_KV_QUANTUM || o->kv_bytes_per_token % MDL_NULL_KV_QUANTUM ||
            o->kv_bytes_per_token > (long)MDL_NULL_KV_QUANTUM * 4096)) {
    snprintf(err, errlen, "null_kv_bytes_per_token %ld must be a multiple of %d (%d layers of K and V in heads of %d "
             "F16 values), at most %ld", o->kv_bytes_per_token, MDL_NULL_KV_QUANTUM, MDL_NULL_LAYERS,
             MDL_NULL_HEAD_DIM, (long)MDL_NULL_KV_QUANTUM * 4096);
    return -1;
  }
  wbuf b = {0};
  put(&b, "GGUF", 4);
  put_u32(&b, 3);
  put_u64(&b, 0);                  // tensors: none
  put_u64(&b, o ? 17 : 12);        // keys, as written below
  kv_str(&b, "general.architecture", MDL_NULL_NAME);
  kv_str(&b, "general.name", MDL_NULL_NAME);
  kv_u32(&b, "null.context_length", MDL_NULL_CTX);
  kv_str(&b, "tokenizer.ggml.model", "llama");
  kv_u32(&b, "tokenizer.ggml.bos_token_id", NUL_BOS);
  kv_u32(&b, "tokenizer.ggml.eos_token_id", NUL_EOS);
  kv_u32(&b, "tokenizer.ggml.unknown_token_id", NUL_UNK);
  kv_bool(&b, "tokenizer.ggml.add_bos_token", 0);
  kv_bool(&b, "tokenizer.ggml.add_space_prefix", 0);
  char t[16];
  int ty;
  float sc;
  kv_arr(&b, "tokenizer.ggml.tokens", MDL_GGUF_STR, NUL_N_VOCAB);
  for (int i = 0; i < NUL_N_VOCAB; i++) {
    token_text(i, t, &ty, &sc);
    put_str(&b, t);
  }
  kv_arr(&b, "tokenizer.ggml.token_type", MDL_GGUF_I32, NUL_N_VOCAB);
  for (int i = 0; i < NUL_N_VOCAB; i++) {
    token_text(i, t, &ty, &sc);
    put_u32(&b, (uint32_t)ty);
  }
  kv_arr(&b, "tokenizer.ggml.scores", MDL_GGUF_F32, NUL_N_VOCAB);
  for (int i = 0; i < NUL_N_VOCAB; i++) {
    token_text(i, t, &ty, &sc);
    put(&b, &sc, 4);
  }
  if (o) {
    kv_u32(&b, "null.block_count", MDL_NULL_LAYERS);
    kv_u32(&b, "null.attention.head_count_kv", (uint32_t)(o->kv_bytes_per_token / MDL_NULL_KV_QUANTUM));
    kv_u32(&b, "null.attention.key_length", MDL_NULL_HEAD_DIM);
    // the times in integer units, so that every worker given the same options builds the same bytes
    kv_u32(&b, "null.step_us", (uint32_t)(o->step_ms * 1000.0 + 0.5));
    kv_u32(&b, "null.prefill_ns_per_token", (uint32_t)(o->prefill_us_per_token * 1000.0 + 0.5));
  }
  mdl_gguf *g = NULL;
  if (b.oom || mdl_gguf_from_memory(b.p, b.n, &g, err, errlen)) {
    if (b.oom) snprintf(err, errlen, "null model: out of memory");
    free(b.p);
    return -1;
  }
  g->owned = b.p;
  *out = g;
  return 0;
}

int mdl_model_open(const char *path, const mdl_null_opts *o, mdl_gguf **out, char *err, size_t errlen) {
  if (mdl_is_null_path(path)) return mdl_null_gguf(o, out, err, errlen);
  return mdl_gguf_open(path, out, err, errlen);
}

// ---- the model ----

static int64_t real_now_us(void *arg) {
  (void)arg;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void real_sleep_until_us(void *arg, int64_t t) {
  (void)arg;
  struct timespec ts = {.tv_sec = (time_t)(t / 1000000), .tv_nsec = (long)(t % 1000000) * 1000};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

static int get_u32(const mdl_gguf *g, const char *key, int64_t *out, char *err, size_t errlen) {
  if (mdl_gguf_get_i64(g, key, out) == 0 && *out >= 0) return 0;
  snprintf(err, errlen, "null model: %s is missing (a null GGUF carries the worker's null_* options)", key);
  return -1;
}

int mdl_null_load(mdl_llama *m, const mdl_gguf *g, char *err, size_t errlen) {
  int64_t n_layer, n_kv_head, head_dim;
  mdl_null *n = calloc(1, sizeof *n);
  if (!n) {
    snprintf(err, errlen, "null model: out of memory");
    return -1;
  }
  m->nul = n;
  const mdl_gguf_kv *toks = mdl_gguf_find(g, "tokenizer.ggml.tokens");
  if (get_u32(g, "null.block_count", &n_layer, err, errlen) ||
      get_u32(g, "null.attention.head_count_kv", &n_kv_head, err, errlen) ||
      get_u32(g, "null.attention.key_length", &head_dim, err, errlen) ||
      get_u32(g, "null.step_us", &n->step_us, err, errlen) ||
      get_u32(g, "null.prefill_ns_per_token", &n->prefill_ns, err, errlen))
    return -1;
  if (!toks || toks->arr_n != NUL_N_VOCAB || n_layer < 1 || n_layer > 64 || n_kv_head < 1 || head_dim != MDL_NULL_HEAD_DIM) {
    snprintf(err, errlen, "null model: not the vocabulary or geometry this build makes");
    return -1;
  }
  n->clock = (mdl_null_clock){real_now_us, real_sleep_until_us, NULL};
  mdl_llama_cfg *c = &m->cfg;
  snprintf(c->arch, sizeof c->arch, MDL_NULL_NAME);
  c->n_layer = (int)n_layer;
  c->n_kv_head = c->n_head = (int)n_kv_head;
  c->head_dim = c->head_dim_v = (int)head_dim;
  c->n_embd = c->n_ff = c->n_head * c->head_dim;
  c->n_vocab = NUL_N_VOCAB;
  c->n_ctx_train = MDL_NULL_CTX;
  c->rms_eps = 1e-6f;
  c->rope_theta = 10000.0f;
  c->attn_scale = 1.0f / 8.0f;
  snprintf(c->rope_scaling, sizeof c->rope_scaling, "none");
  c->rope_long = -1;
  return 0;
}

void mdl_null_free(mdl_llama *m) {
  free(m->nul);
  m->nul = NULL;
}

int mdl_null_set_clock(mdl_llama *m, const mdl_null_clock *c, char *err, size_t errlen) {
  if (!m->nul) {
    snprintf(err, errlen, "model: a clock is for the null model, not %s", m->cfg.arch);
    return -1;
  }
  m->nul->clock = c ? *c : (mdl_null_clock){real_now_us, real_sleep_until_us, NULL};
  return 0;
}

int64_t mdl_null_step_us(const mdl_llama *m, const mdl_seq *seqs, int n_seqs) {
  int64_t extra = 0;
  for (int s = 0; s < n_seqs; s++) extra += seqs[s].n_tokens > 1 ? seqs[s].n_tokens - 1 : 0;
  return m->nul->step_us + (extra * m->nul->prefill_ns + 500) / 1000;
}

static uint64_t mix(uint64_t z) { // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float mdl_null_logit(const mdl_llama *m, int pos, int32_t tok, int32_t v) {
  (void)m;
  // Whitespace is least likely, so that a grammar allowing it anywhere (JSON) still comes to its end under greedy.
  int b = v - NUL_N_CONTROL;
  if (b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == 256) return -30.0f;
  uint64_t h = mix(((uint64_t)(uint32_t)pos << 32 | (uint32_t)tok) * 0x9e3779b97f4a7c15ull + (uint64_t)v);
  float x = (float)(h >> 40) * (4.0f / 16777216.0f);
  return v >= NUL_FIRST_WORD ? x : x - 20.0f; // finite: a grammar may need a byte, a letter or the end
}

// The logits of one row: the token after tokens[i] of seq, at position pos0 + i.
static void row(const mdl_llama *m, const mdl_seq *q, int i, float *out) {
  for (int v = 0; v < NUL_N_VOCAB; v++) out[v] = mdl_null_logit(m, q->pos0 + i, q->tokens[i], v);
}

int mdl_null_forward(mdl_llama *m, const mdl_seq *seqs, int n_seqs, float *logits, int all_rows,
                     mdl_layer_done_fn on_layer, void *on_layer_arg, char *err, size_t errlen) {
  mdl_null *n = m->nul;
  int64_t t0 = n->clock.now_us(n->clock.arg), dur = mdl_null_step_us(m, seqs, n_seqs);
  size_t o = 0; // the sequence's first row
  for (int s = 0; s < n_seqs; s++) {
    const mdl_seq *q = &seqs[s];
    if (q->n_tokens < 1 || q->pos0 < 0 || q->pos0 + q->n_tokens > MDL_NULL_CTX) {
      snprintf(err, errlen, "forward: sequence %d: %d tokens at %d do not fit the context of %d", s, q->n_tokens,
               q->pos0, MDL_NULL_CTX);
      return -1;
    }
    for (int i = 0; i < q->n_tokens; i++)
      if (q->tokens[i] < 0 || q->tokens[i] >= NUL_N_VOCAB) {
        snprintf(err, errlen, "forward: token %d is not in the vocabulary (%d)", q->tokens[i], NUL_N_VOCAB);
        return -1;
      }
    // every sequence owns mdl_seq_rows rows of the output, written only when it wants logits
    int rows = all_rows ? q->n_tokens : mdl_seq_rows(q), want = logits && (all_rows || q->want_logits);
    for (int r = 0; r < rows && want; r++) {
      int i = q->n_tokens - rows + r;
      if (i >= 0) row(m, q, i, logits + (o + (size_t)r) * NUL_N_VOCAB);
    }
    o += (size_t)rows;
  }
  // The KV pages are left as they are: nothing reads them, and pages never written stay out of the RSS; the
  // layers finish at even steps through the step's time, so a prefill worker's pushes overlap it as a real one's.
  for (int l = 0; l < m->cfg.n_layer; l++) {
    n->clock.sleep_until_us(n->clock.arg, t0 + dur * (l + 1) / m->cfg.n_layer);
    if (on_layer) on_layer(on_layer_arg, l);
  }
  return 0;
}
