// worker/genreq.c: checks a decoded `generate` message against the model (and compiles its grammar, cached); error
// replies and signal waiting shared by workers.
#include "worker/genreq.h"
#include "proto/request.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama.h"
#include "util/buf.h"

void wrk_grammars_init(wrk_grammars *c, const mdl_tok *tok) {
  memset(c, 0, sizeof *c);
  c->tok = tok;
}

void wrk_grammars_fini(wrk_grammars *c) {
  for (int i = 0; i < c->n; i++) {
    free(c->slot[i].key);
    mdl_grammar_unref(c->slot[i].g);
  }
  mdl_grammar_vocab_free(c->vocab);
  memset(c, 0, sizeof *c);
}

// A grammar's cache key (grammar_key) and what it compiles to: "" any JSON object, "S" + a schema's JSON text, "T" +
// '0'|'1' (parallel) + open US close US sep US args_key US tools (US: the unit separator, 0x1f, which neither the
// template's markup nor JSON text holds).
#define KEY_SEP '\x1f'
static int grammar_compile(const char *key, mdl_grammar **g, char *err, size_t errlen) {
  if (!key[0]) return mdl_grammar_from_json_schema(NULL, 0, g, err, errlen);
  if (key[0] == 'S') return mdl_grammar_from_json_schema(key + 1, strlen(key + 1), g, err, errlen);
  char *k = strdup(key + 2), *part[5] = {k, NULL, NULL, NULL, NULL};
  if (!k) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (int i = 1; i < 5 && part[i - 1]; i++)
    if ((part[i] = strchr(part[i - 1], KEY_SEP))) *part[i]++ = 0;
  int rc = part[4] ? mdl_grammar_from_tool_calls(part[4], strlen(part[4]), part[0], part[1], part[2], part[3],
                                                 key[1] == '1', g, err, errlen) // sep "": calls back to back
                   : (snprintf(err, errlen, "a malformed tool_calls grammar key"), -1);
  free(k);
  return rc;
}

// The grammar for cache key key (grammar_compile's) as a new reference in *out: from the cache, or compiled
// (evicting the least recently used). 0, or -1 with err.
static int grammar_get(wrk_grammars *c, const char *key, mdl_grammar **out, char *err, size_t errlen) {
  *out = NULL;
  if (!c->vocab && mdl_grammar_vocab_from_tok(c->tok, &c->vocab, err, errlen)) return -1;
  for (int i = 0; i < c->n; i++)
    if (!strcmp(c->slot[i].key, key)) {
      c->slot[i].used = ++c->tick;
      *out = mdl_grammar_ref(c->slot[i].g);
      return 0;
    }
  mdl_grammar *g = NULL;
  if (grammar_compile(key, &g, err, errlen)) return -1;
  char *k = strdup(key);
  if (!k) {
    mdl_grammar_unref(g);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  wrk_grammar_slot *s = &c->slot[c->n < WRK_GRAMMAR_CACHE ? c->n++ : 0];
  if (c->n == WRK_GRAMMAR_CACHE && s->key) { // full: the least recently used one goes (requests keep their reference)
    for (int i = 1; i < c->n; i++)
      if (c->slot[i].used < s->used) s = &c->slot[i];
    free(s->key);
    mdl_grammar_unref(s->g);
  }
  *s = (wrk_grammar_slot){k, g, ++c->tick};
  *out = mdl_grammar_ref(g);
  return 0;
}

// The cache key of a generate's grammar (decoded by proto/request.c): see grammar_compile. NULL on out of memory.
static char *grammar_key(const prt_grammar *gm) {
  utl_buf b = {0};
  if (gm->type == PRT_GRAMMAR_JSON || (gm->type == PRT_GRAMMAR_JSON_SCHEMA && !gm->schema)) return strdup("");
  if (gm->type == PRT_GRAMMAR_JSON_SCHEMA) utl_buf_printf(&b, "S%s", gm->schema);
  else
    utl_buf_printf(&b, "T%c%s%c%s%c%s%c%s%c%s", gm->parallel ? '1' : '0', gm->open, KEY_SEP, gm->close, KEY_SEP,
                   gm->sep ? gm->sep : "", KEY_SEP, gm->args_key ? gm->args_key : "arguments", KEY_SEP, gm->tools);
  return utl_buf_take(&b);
}

#define FAIL(c, ...)                                                                                                  \
  do {                                                                                                                \
    snprintf(code, code_len, "%s", c);                                                                                \
    snprintf(err, errlen, __VA_ARGS__);                                                                               \
    goto fail;                                                                                                        \
  } while (0)

// A seed as an int64: out of range reads as INT64_MIN, what the x86 conversion always gave (a seed is any number).
static uint64_t seed_of(double x) {
  return (uint64_t)(x >= -9223372036854775808.0 && x < 9223372036854775808.0 ? (int64_t)x : INT64_MIN);
}

static int copy_name(const char *v, char *out, size_t cap) {
  out[0] = 0;
  if (!v) return 0;
  if (strlen(v) >= cap) return -1;
  snprintf(out, cap, "%s", v);
  return 0;
}

int wrk_genreq_parse(const prt_generate *g, int n_vocab, int n_ctx, wrk_grammars *gc, wrk_genreq *r, char *code,
                     size_t code_len, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  if (!g->id[0] || strlen(g->id) >= sizeof r->id)
    FAIL("invalid_request", "generate needs an id of 1..%zu characters", sizeof r->id - 1);
  snprintf(r->id, sizeof r->id, "%s", g->id);
  r->n_prompt = g->n_prompt;
  if (r->n_prompt < 1) FAIL("invalid_request", "prompt must be a non-empty array of token ids");
  if (r->n_prompt >= n_ctx)
    FAIL("context_length_exceeded", "the prompt has %d tokens; this model's context is %d tokens", r->n_prompt, n_ctx);
  r->prompt = malloc((size_t)r->n_prompt * sizeof *r->prompt);
  if (!r->prompt) FAIL("internal_error", "out of memory");
  for (int i = 0; i < r->n_prompt; i++) {
    if (g->prompt[i] < 0 || g->prompt[i] >= n_vocab)
      FAIL("invalid_request", "prompt[%d] is not a token id of this model (0..%d)", i, n_vocab - 1);
    r->prompt[i] = g->prompt[i];
  }
  if (g->resume > r->n_prompt - 1)
    FAIL("invalid_request", "resume must be an integer 0..%d (tokens of the prompt generated already)", r->n_prompt - 1);
  r->n_resume = g->resume;
  int n_asked = r->n_prompt - r->n_resume; // the prompt the client sent; max_tokens counts from its end
  r->max_tokens = g->max_tokens < 0 || g->max_tokens > n_ctx - n_asked ? n_ctx - n_asked : g->max_tokens;
  if (r->max_tokens <= r->n_resume)
    FAIL("invalid_request", "max_tokens %d leaves nothing to generate after %d resumed tokens", r->max_tokens, r->n_resume);
  r->deadline_ms = g->deadline_ms;
  r->ignore_eos = g->ignore_eos;
  r->no_spec = g->no_spec;
  if (g->embed) {
    r->embed = mdl_pool_named(g->embed);
    if (r->embed != MDL_POOL_MEAN && r->embed != MDL_POOL_CLS && r->embed != MDL_POOL_LAST)
      FAIL("invalid_request", "embed must be mean, cls or last (the pooling of the prompt's hidden states)");
    if (g->grammar.type != PRT_GRAMMAR_NONE || g->resume > 0)
      FAIL("invalid_request", "an embedding (embed) has no grammar and no resumed tokens");
  }
  if (copy_name(g->mode, r->mode, sizeof r->mode) || copy_name(g->prefill, r->prefill, sizeof r->prefill) ||
      copy_name(g->decode, r->decode, sizeof r->decode))
    FAIL("invalid_request", "bad mode / prefill / decode field");
  if (!r->mode[0]) snprintf(r->mode, sizeof r->mode, "local");
  r->traced = g->traceparent && utl_traceparent_parse(g->traceparent, &r->trace) == 0 && r->trace.sampled;
  if (strcmp(r->mode, "local") && strcmp(r->mode, "prefill") && strcmp(r->mode, "decode"))
    FAIL("invalid_request", "mode must be local, prefill or decode");

  const prt_sampling *gs = &g->sampling;
  mdl_sampling *sp = &r->sampling;
  *sp = (mdl_sampling){.temperature = (float)gs->temperature, .top_k = gs->top_k > 0 ? gs->top_k : 0,
                       .top_p = (float)gs->top_p, .min_p = (float)gs->min_p,
                       .presence_penalty = (float)gs->presence_penalty,
                       .frequency_penalty = (float)gs->frequency_penalty,
                       .repetition_penalty = (float)gs->repetition_penalty,
                       .seed = gs->has_seed ? seed_of(gs->seed) : 0};
  r->n_logprobs = gs->logprobs;
  sp->n_logprobs = r->n_logprobs > 0 ? r->n_logprobs : 0;
  sp->no_logprob = r->n_logprobs < 0; // not asked for: no log-softmax over the vocabulary per token
  int nb = gs->n_logit_bias;
  if (nb && !(r->bias = calloc((size_t)nb, sizeof *r->bias))) FAIL("internal_error", "out of memory");
  for (int j = 0; j < nb; j++) {
    const prt_bias *b = &gs->logit_bias[j];
    if (b->token < 0 || b->token >= n_vocab) FAIL("invalid_request", "logit_bias[%d] must be [token id, bias]", j);
    r->bias[j] = (mdl_bias){b->token, (float)b->bias};
  }
  sp->bias = r->bias;
  sp->n_bias = nb;
  // the grammar (response_format, or tool_choice required or a named function), decoded by proto/request.c
  if (g->grammar.type != PRT_GRAMMAR_NONE) {
    if (!gc) FAIL("invalid_request", "this worker cannot constrain its output to a grammar");
    char *key = grammar_key(&g->grammar);
    if (!key) FAIL("internal_error", "out of memory");
    char gerr[400];
    int rc = grammar_get(gc, key, &r->grammar, gerr, sizeof gerr);
    free(key);
    if (rc) FAIL("invalid_request", "grammar: %s", gerr);
    sp->grammar = r->grammar;
    sp->grammar_vocab = gc->vocab;
    r->ignore_eos = 0;
  }
  int ns = g->n_stop;
  if (ns > 1024) FAIL("invalid_request", "too many stop strings");
  if (ns && !(r->stop = calloc((size_t)ns, sizeof *r->stop))) FAIL("internal_error", "out of memory");
  for (int j = 0; j < ns; j++) {
    if (!g->stop[j][0]) FAIL("invalid_request", "stop[%d] must be a non-empty string", j);
    if (!(r->stop[j] = strdup(g->stop[j]))) FAIL("internal_error", "out of memory");
    r->n_stop = j + 1;
  }
  int nsi = g->n_stop_ids;
  if (nsi && !(r->stop_ids = malloc((size_t)nsi * sizeof *r->stop_ids))) FAIL("internal_error", "out of memory");
  if (nsi) memcpy(r->stop_ids, g->stop_ids, (size_t)nsi * sizeof *r->stop_ids);
  r->n_stop_ids = nsi;
  return 0;
fail:
  wrk_genreq_free(r);
  return -1;
}

void wrk_genreq_resume_sampler(const wrk_genreq *r, mdl_sampler *s) {
  for (int i = r->n_prompt - r->n_resume; i < r->n_prompt; i++) mdl_sampler_accept(s, r->prompt[i]);
}

void wrk_genreq_free(wrk_genreq *r) {
  mdl_grammar_unref(r->grammar);
  free(r->prompt);
  free(r->bias);
  for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
  free(r->stop);
  free(r->stop_ids);
  memset(r, 0, sizeof *r);
}

void wrk_send_error(ctl_peer *to, const char *id, const char *code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cJSON *m = prt_error_encode(&(prt_error){.id = id, .message = msg, .code = code}, NULL, 0);
  if (m) ctl_peer_send(to, m);
  cJSON_Delete(m);
}

void wrk_signals_block(wrk_signals *s) {
  sigemptyset(&s->set);
  sigaddset(&s->set, SIGTERM);
  sigaddset(&s->set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &s->set, NULL);
  signal(SIGPIPE, SIG_IGN);
  atomic_store(&s->stop, 0);
  s->hub = NULL;
}

static void *signal_main(void *arg) {
  wrk_signals *s = arg;
  int sig = 0;
  if (sigwait(&s->set, &sig) == 0) {
    atomic_store(&s->stop, 1);
    if (s->hub) ctl_hub_wake(s->hub);
  }
  return NULL;
}

int wrk_signals_start(wrk_signals *s, ctl_hub *hub) {
  s->hub = hub;
  pthread_t t;
  if (pthread_create(&t, NULL, signal_main, s)) return -1;
  pthread_detach(t);
  return 0;
}
