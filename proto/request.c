// proto/request.c: a request's messages between the router and the workers: generate, token, done, error, cancel.
#include "proto/request.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/prt_int.h"
#include "util/err.h"
#include "util/trace.h"

static cJSON *oom(cJSON *m, char *err, size_t errlen) {
  cJSON_Delete(m);
  utl_seterr(err, errlen, "out of memory");
  return NULL;
}

cJSON *prt_error_encode(const prt_error *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_ERROR);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || !PRT_ADD_STR(j, "message", m->message ? m->message : "") ||
      !PRT_ADD_STR(j, "code", m->code))
    return oom(j, err, errlen);
  return j;
}

int prt_error_decode(const cJSON *j, prt_error *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_ERROR, "id", 0, &m->id, err, errlen) ||
                 prt__str(j, PRT_OP_ERROR, "message", 1, &m->message, err, errlen) ||
                 prt__str(j, PRT_OP_ERROR, "code", 0, &m->code, err, errlen)
             ? -1
             : 0;
}

cJSON *prt_cancel_encode(const prt_cancel *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_CANCEL);
  if (!j || !PRT_ADD_STR(j, "id", m->id)) return oom(j, err, errlen);
  return j;
}

int prt_cancel_decode(const cJSON *j, prt_cancel *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_CANCEL, "id", 1, &m->id, err, errlen);
}

int prt_sampled_add(cJSON *o, const prt_sampled *s) {
  if (!cJSON_AddNumberToObject(o, "token", s->token) || !cJSON_AddNumberToObject(o, "logprob", s->logprob)) return -1;
  cJSON *top = cJSON_AddArrayToObject(o, "top");
  if (!top) return -1;
  for (int i = 0; i < s->n_top && i < PRT_MAX_TOP; i++) {
    cJSON *pair = cJSON_CreateArray();
    if (!pair || !cJSON_AddItemToArray(top, pair) ||
        !cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->top[i].token)) ||
        !cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->top[i].logprob)))
      return -1;
  }
  return 0;
}

int prt_sampled_read(const cJSON *o, const char *op, prt_sampled *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  int64_t tok = 0;
  double lp = 0;
  const cJSON *lj = cJSON_GetObjectItemCaseSensitive(o, "logprob");
  if (!cJSON_IsObject(o)) {
    utl_seterr(err, errlen, "%s: a sampled token must be an object", op);
    return -1;
  }
  if (prt__int(o, op, "token", 1, 0, INT32_MAX, &tok, err, errlen)) return -1;
  if (cJSON_IsNumber(lj) && fabs(lj->valuedouble) <= FLT_MAX) lp = lj->valuedouble; // -inf travels as null
  else if (lj && !cJSON_IsNull(lj)) {
    utl_seterr(err, errlen, "%s: logprob must be a number", op);
    return -1;
  }
  s->token = (int32_t)tok;
  s->logprob = (float)lp;
  const cJSON *top = cJSON_GetObjectItemCaseSensitive(o, "top"), *pair;
  if (top && !cJSON_IsArray(top) && !cJSON_IsNull(top)) {
    utl_seterr(err, errlen, "%s: top must be [[id, logprob], ...]", op);
    return -1;
  }
  cJSON_ArrayForEach(pair, top) {
    if (s->n_top >= PRT_MAX_TOP) break;
    const cJSON *t = cJSON_GetArrayItem(pair, 0), *l = cJSON_GetArrayItem(pair, 1);
    if (!cJSON_IsArray(pair) || !cJSON_IsNumber(t) || !cJSON_IsNumber(l) || !(t->valuedouble >= INT32_MIN) ||
        !(t->valuedouble <= INT32_MAX) || !(fabs(l->valuedouble) <= FLT_MAX)) {
      utl_seterr(err, errlen, "%s: top[%d] must be [token id, logprob]", op, s->n_top);
      return -1;
    }
    s->top[s->n_top++] = (prt_top){(int32_t)t->valuedouble, (float)l->valuedouble};
  }
  return 0;
}

cJSON *prt_token_encode(const prt_token *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_TOKEN);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || !PRT_ADD_STR(j, "text", m->text ? m->text : "") ||
      prt__add_ints(j, "tokens", m->tokens, m->n_tokens > 0 ? m->n_tokens : 0))
    return oom(j, err, errlen);
  if (m->n_logprobs >= 0) {
    cJSON *a = cJSON_AddArrayToObject(j, "logprobs");
    if (!a) return oom(j, err, errlen);
    for (int i = 0; i < m->n_logprobs; i++) {
      cJSON *e = cJSON_CreateObject();
      if (e && !cJSON_AddItemToArray(a, e)) {
        cJSON_Delete(e);
        e = NULL;
      }
      if (!e || prt_sampled_add(e, &m->logprobs[i])) return oom(j, err, errlen);
    }
  }
  return j;
}

cJSON *prt_tokens_new(void) {
  cJSON *j = prt_new(PRT_OP_TOKENS);
  if (j && !cJSON_AddArrayToObject(j, "items")) {
    cJSON_Delete(j);
    return NULL;
  }
  return j;
}

int prt_tokens_add(cJSON *batch, const prt_token *m) {
  cJSON *items = cJSON_GetObjectItemCaseSensitive(batch, "items"), *t = prt_token_encode(m, NULL, 0);
  if (!t || !cJSON_IsArray(items)) {
    cJSON_Delete(t);
    return -1;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(t, "op"); // the batch's op says what its items are
  if (!cJSON_AddItemToArray(items, t)) {
    cJSON_Delete(t);
    return -1;
  }
  return 0;
}

int prt_tokens_count(const cJSON *batch) {
  return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(batch, "items"));
}

const cJSON *prt_tokens_items(const cJSON *j, char *err, size_t errlen) {
  const cJSON *items = cJSON_GetObjectItemCaseSensitive(j, "items");
  if (!cJSON_IsArray(items)) {
    utl_seterr(err, errlen, "token_batch: items must be an array of token messages");
    return NULL;
  }
  return items;
}

void prt_token_free(prt_token *m) {
  free(m->tokens);
  free(m->logprobs);
  m->tokens = NULL;
  m->logprobs = NULL;
  m->n_tokens = m->n_logprobs = -1;
}

int prt_token_decode(const cJSON *j, prt_token *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  m->text = "";
  m->n_tokens = m->n_logprobs = -1;
  const cJSON *lps = cJSON_GetObjectItemCaseSensitive(j, "logprobs"), *e;
  if (prt__str(j, PRT_OP_TOKEN, "id", 1, &m->id, err, errlen) ||
      prt__str(j, PRT_OP_TOKEN, "text", 0, &m->text, err, errlen))
    return -1;
  if (cJSON_HasObjectItem(j, "tokens") && !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "tokens"))) {
    if (prt__ints(j, PRT_OP_TOKEN, "tokens", 1, 0, INT32_MAX, &m->tokens, &m->n_tokens, err, errlen)) {
      m->n_tokens = -1;
      return -1;
    }
  }
  if (lps && !cJSON_IsNull(lps)) {
    if (!cJSON_IsArray(lps)) {
      utl_seterr(err, errlen, "token: logprobs must be an array");
      goto fail;
    }
    int n = cJSON_GetArraySize(lps), i = 0;
    if (n && !(m->logprobs = calloc((size_t)n, sizeof *m->logprobs))) {
      utl_seterr(err, errlen, "token: out of memory");
      goto fail;
    }
    cJSON_ArrayForEach(e, lps) if (prt_sampled_read(e, "token logprobs", &m->logprobs[i++], err, errlen)) goto fail;
    m->n_logprobs = n;
  }
  return 0;
fail:
  prt_token_free(m);
  return -1;
}

cJSON *prt_done_encode(const prt_done *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_DONE);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || !PRT_ADD_STR(j, "finish_reason", m->finish_reason) ||
      !cJSON_AddNumberToObject(j, "prompt_tokens", m->prompt_tokens) ||
      !cJSON_AddNumberToObject(j, "completion_tokens", m->completion_tokens) ||
      !cJSON_AddNumberToObject(j, "cached_tokens", m->cached_tokens) ||
      (m->cached_store_tokens > 0 && !cJSON_AddNumberToObject(j, "cached_store_tokens", m->cached_store_tokens)) ||
      !cJSON_AddNumberToObject(j, "kv_bytes", m->kv_bytes) || !cJSON_AddNumberToObject(j, "kv_ms", m->kv_ms) ||
      (m->prefill_ms >= 0 && !cJSON_AddNumberToObject(j, "prefill_ms", m->prefill_ms)) ||
      (m->spec_drafts > 0 && (!cJSON_AddNumberToObject(j, "spec_drafts", (double)m->spec_drafts) ||
                              !cJSON_AddNumberToObject(j, "spec_drafted", (double)m->spec_drafted) ||
                              !cJSON_AddNumberToObject(j, "spec_accepted", (double)m->spec_accepted))))
    return oom(j, err, errlen);
  if (m->n_embedding > 0) {
    cJSON *a = cJSON_AddArrayToObject(j, "embedding");
    for (int i = 0; a && i < m->n_embedding; i++) {
      cJSON *x = cJSON_CreateNumber((double)m->embedding[i]);
      if (!x || !cJSON_AddItemToArray(a, x)) {
        cJSON_Delete(x);
        a = NULL;
      }
    }
    if (!a) return oom(j, err, errlen);
  }
  return j;
}

int prt_done_decode(const cJSON *j, prt_done *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  int64_t v[3] = {-1, -1, -1};
  static const char *const k[3] = {"prompt_tokens", "completion_tokens", "cached_tokens"};
  m->kv_bytes = m->kv_ms = m->prefill_ms = -1;
  if (prt__str(j, PRT_OP_DONE, "id", 1, &m->id, err, errlen) ||
      prt__str(j, PRT_OP_DONE, "finish_reason", 0, &m->finish_reason, err, errlen))
    return -1;
  for (int i = 0; i < 3; i++)
    if (prt__int(j, PRT_OP_DONE, k[i], 0, -1, INT32_MAX, &v[i], err, errlen)) return -1;
  int64_t cs = 0;
  if (prt__int(j, PRT_OP_DONE, "cached_store_tokens", 0, 0, INT32_MAX, &cs, err, errlen) ||
      prt__num(j, PRT_OP_DONE, "kv_bytes", 0, -1, HUGE_VAL, &m->kv_bytes, err, errlen) ||
      prt__num(j, PRT_OP_DONE, "kv_ms", 0, -1, HUGE_VAL, &m->kv_ms, err, errlen) ||
      prt__num(j, PRT_OP_DONE, "prefill_ms", 0, 0, HUGE_VAL, &m->prefill_ms, err, errlen) ||
      prt__int(j, PRT_OP_DONE, "spec_drafts", 0, 0, INT64_MAX / 2, &m->spec_drafts, err, errlen) ||
      prt__int(j, PRT_OP_DONE, "spec_drafted", 0, 0, INT64_MAX / 2, &m->spec_drafted, err, errlen) ||
      prt__int(j, PRT_OP_DONE, "spec_accepted", 0, 0, m->spec_drafted, &m->spec_accepted, err, errlen))
    return -1;
  m->prompt_tokens = (int)v[0];
  m->completion_tokens = (int)v[1];
  m->cached_tokens = (int)v[2];
  m->cached_store_tokens = (int)cs;
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "embedding"), *x;
  if (!e || cJSON_IsNull(e)) return 0;
  int n = 0, ok = cJSON_IsArray(e);
  cJSON_ArrayForEach(x, e) {
    ok = ok && cJSON_IsNumber(x) && fabs(x->valuedouble) <= FLT_MAX; // a float: finite and within its range
    n++;
  }
  if (!ok || n < 1) {
    utl_seterr(err, errlen, "%s: embedding must be a non-empty array of finite float32 numbers", PRT_OP_DONE);
    return -1;
  }
  m->embedding_json = e;
  m->n_embedding = n;
  return 0;
}

#define GEN PRT_OP_GENERATE
#define GEN_S "generate sampling"
static int add_grammar(cJSON *j, const prt_grammar *g);

static int add_sampling(cJSON *j, const prt_sampling *s) {
  cJSON *o = cJSON_AddObjectToObject(j, "sampling");
  if (!o || !cJSON_AddNumberToObject(o, "temperature", s->temperature) ||
      !cJSON_AddNumberToObject(o, "top_k", s->top_k) || !cJSON_AddNumberToObject(o, "top_p", s->top_p) ||
      !cJSON_AddNumberToObject(o, "min_p", s->min_p) ||
      !cJSON_AddNumberToObject(o, "presence_penalty", s->presence_penalty) ||
      !cJSON_AddNumberToObject(o, "frequency_penalty", s->frequency_penalty) ||
      !cJSON_AddNumberToObject(o, "repetition_penalty", s->repetition_penalty) ||
      (s->has_seed && !cJSON_AddNumberToObject(o, "seed", s->seed)) ||
      !cJSON_AddNumberToObject(o, "logprobs", s->logprobs))
    return -1;
  cJSON *lb = cJSON_AddArrayToObject(o, "logit_bias");
  if (!lb) return -1;
  for (int i = 0; i < s->n_logit_bias; i++) {
    cJSON *pair = cJSON_CreateArray();
    if (!pair || !cJSON_AddItemToArray(lb, pair) ||
        !cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->logit_bias[i].token)) ||
        !cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->logit_bias[i].bias)))
      return -1;
  }
  return 0;
}

cJSON *prt_generate_encode(const prt_generate *m, char *err, size_t errlen) {
  cJSON *j = prt_new(GEN), *st;
  if (!j || !PRT_ADD_STR(j, "id", m->id) || prt__add_ints(j, "prompt", m->prompt, m->n_prompt) ||
      (m->resume > 0 && !cJSON_AddNumberToObject(j, "resume", m->resume)) ||
      (m->max_tokens >= 0 && !cJSON_AddNumberToObject(j, "max_tokens", m->max_tokens)) ||
      add_sampling(j, &m->sampling) || !(st = cJSON_AddArrayToObject(j, "stop")))
    return oom(j, err, errlen);
  for (int i = 0; i < m->n_stop; i++) {
    cJSON *e = cJSON_CreateString(m->stop[i]);
    if (!e || !cJSON_AddItemToArray(st, e)) {
      cJSON_Delete(e);
      return oom(j, err, errlen);
    }
  }
  if (prt__add_ints(j, "stop_ids", m->stop_ids, m->n_stop_ids) ||
      !cJSON_AddBoolToObject(j, "ignore_eos", m->ignore_eos) ||
      (m->no_spec && !cJSON_AddBoolToObject(j, "speculative", 0)) ||
      !cJSON_AddNumberToObject(j, "deadline_ms", m->deadline_ms) || !PRT_ADD_STR(j, "mode", m->mode) ||
      !PRT_ADD_STR(j, "prefill", m->prefill) || !PRT_ADD_STR(j, "decode", m->decode) ||
      (m->prefix_peer && (!cJSON_AddStringToObject(j, "prefix_peer", m->prefix_peer) ||
                          !cJSON_AddNumberToObject(j, "prefix_blocks", m->prefix_blocks))) ||
      !PRT_ADD_STR(j, "embed", m->embed) || !PRT_ADD_STR(j, "traceparent", m->traceparent))
    return oom(j, err, errlen);
  if (m->grammar.type != PRT_GRAMMAR_NONE && add_grammar(j, &m->grammar)) return oom(j, err, errlen);
  return j;
}

static const char *const GRAMMAR_TYPES[] = {"", "json", "json_schema", "tool_calls"};

// The schema and the tools travel as JSON text in a string, not as a nested object: a cJSON tree keeps a number only
// as a double, and a schema's 9007199254740993 or 0.30000000000000004 must reach the worker's grammar as written.
// A decoder also takes the nested object an older router sends.
static int add_json(cJSON *o, const char *k, const char *json) { return cJSON_AddStringToObject(o, k, json) ? 0 : -1; }

// The JSON text under k: a string's own text, or a nested value printed (an older router's form); type checks it
// (cJSON_IsObject, ...; a string must hold such a value too). NULL with *bad when it is neither, or out of memory.
static char *read_json(const cJSON *o, const char *k, cJSON_bool (*type)(const cJSON *), cJSON_bool (*or)(const cJSON *),
                       int *bad) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
  *bad = 0;
  if (cJSON_IsString(x)) {
    cJSON *v = cJSON_ParseWithOpts(x->valuestring, NULL, 1);
    int ok = v && (type(v) || (or && or(v)));
    cJSON_Delete(v);
    if (!ok) return *bad = 1, NULL;
    return strdup(x->valuestring);
  }
  if (!x || !(type(x) || (or && or(x)))) return *bad = 1, NULL;
  return cJSON_PrintUnformatted(x);
}

static int add_grammar(cJSON *j, const prt_grammar *g) {
  cJSON *o = cJSON_AddObjectToObject(j, "grammar");
  if (!o || !cJSON_AddStringToObject(o, "type", GRAMMAR_TYPES[g->type])) return -1;
  if (g->type == PRT_GRAMMAR_JSON_SCHEMA && g->schema && add_json(o, "schema", g->schema)) return -1;
  if (g->type != PRT_GRAMMAR_TOOL_CALLS) return 0;
  if (add_json(o, "tools", g->tools ? g->tools : "[]") || !PRT_ADD_STR(o, "open", g->open) ||
      !PRT_ADD_STR(o, "close", g->close) || !PRT_ADD_STR(o, "sep", g->sep) ||
      !cJSON_AddBoolToObject(o, "parallel", g->parallel))
    return -1;
  if (g->args_key && strcmp(g->args_key, "arguments") && !PRT_ADD_STR(o, "args_key", g->args_key)) return -1;
  return 0;
}

// A call's arguments key (absent: "arguments"): 1..64 of a-z, A-Z, 0-9 and _, written into the call grammar's literal.
static int key_ok(const char *k) {
  size_t n = k ? strlen(k) : 1;
  for (const char *c = k; c && *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_')) return 0;
  return n >= 1 && n <= 64;
}

// The grammar object of a generate (absent: type NONE). -1 with err naming what is wrong.
static int read_grammar(const cJSON *j, prt_grammar *g, char *err, size_t errlen) {
  const cJSON *o = NULL;
  const char *type = NULL;
  if (prt__obj(j, GEN, "grammar", 0, &o, err, errlen)) return -1;
  if (!o) return 0;
  if (prt__str(o, "generate: grammar", "type", 1, &type, err, errlen)) return -1;
  for (int t = PRT_GRAMMAR_JSON; t <= PRT_GRAMMAR_TOOL_CALLS; t++)
    if (!strcmp(type, GRAMMAR_TYPES[t])) g->type = (prt_grammar_type)t;
  if (g->type == PRT_GRAMMAR_NONE) {
    utl_seterr(err, errlen, "generate: grammar: type '%.40s' is not json, json_schema or tool_calls", type);
    return -1;
  }
  if (g->type == PRT_GRAMMAR_JSON_SCHEMA) {
    int bad;
    if (!(g->schema = read_json(o, "schema", cJSON_IsObject, cJSON_IsBool, &bad)) && bad) {
      utl_seterr(err, errlen, "generate: grammar: a json_schema grammar needs a schema (an object or a boolean, or "
                 "its JSON text)");
      return -1;
    }
    if (!g->schema) goto oom;
  } else if (g->type == PRT_GRAMMAR_TOOL_CALLS) {
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(o, "parallel");
    int bad;
    g->tools = read_json(o, "tools", cJSON_IsArray, NULL, &bad);
    if (!g->tools && !bad) goto oom;
    if (bad || (par && !cJSON_IsBool(par)) ||
        prt__str(o, "generate: grammar", "open", 1, &g->open, err, errlen) ||
        prt__str(o, "generate: grammar", "close", 1, &g->close, err, errlen) ||
        prt__str(o, "generate: grammar", "sep", cJSON_IsTrue(par), &g->sep, err, errlen) ||
        prt__str(o, "generate: grammar", "args_key", 0, &g->args_key, err, errlen) || !key_ok(g->args_key)) {
      utl_seterr(err, errlen, "generate: grammar: a tool_calls grammar needs tools, open, close, and sep when "
                 "parallel (args_key, when given: 1..64 of a-z, A-Z, 0-9, _)");
      return -1;
    }
    g->parallel = cJSON_IsTrue(par);
  }
  return 0;
oom:
  utl_seterr(err, errlen, "generate: out of memory");
  return -1;
}

void prt_generate_free(prt_generate *m) {
  free(m->prompt);
  free(m->sampling.logit_bias);
  free(m->stop);
  free(m->stop_ids);
  m->prompt = m->stop_ids = NULL;
  m->sampling.logit_bias = NULL;
  m->stop = NULL;
  m->n_prompt = m->sampling.n_logit_bias = m->n_stop = m->n_stop_ids = 0;
  free(m->grammar.schema);
  free(m->grammar.tools);
  m->grammar = (prt_grammar){0};
}

static int read_sampling(const cJSON *j, prt_sampling *s, char *err, size_t errlen) {
  const cJSON *o = NULL, *lb, *pair;
  int64_t top_k = 0, lp = -1;
  if (prt__obj(j, GEN, "sampling", 0, &o, err, errlen)) return -1;
  if (!o) return 0;
  if (prt__num(o, GEN_S, "temperature", 0, 0, 100, &s->temperature, err, errlen) ||
      prt__int(o, GEN_S, "top_k", 0, -1, 1 << 30, &top_k, err, errlen) ||
      prt__num(o, GEN_S, "top_p", 0, 0, 1, &s->top_p, err, errlen) ||
      prt__num(o, GEN_S, "min_p", 0, 0, 1, &s->min_p, err, errlen) ||
      prt__num(o, GEN_S, "presence_penalty", 0, -2, 2, &s->presence_penalty, err, errlen) ||
      prt__num(o, GEN_S, "frequency_penalty", 0, -2, 2, &s->frequency_penalty, err, errlen) ||
      prt__num(o, GEN_S, "repetition_penalty", 0, 0, 100, &s->repetition_penalty, err, errlen) ||
      prt__int(o, GEN_S, "logprobs", 0, -1, 20, &lp, err, errlen))
    return -1;
  s->top_k = (int)top_k;
  s->logprobs = (int)lp;
  s->seed = NAN;
  if (prt__num(o, GEN_S, "seed", 0, -DBL_MAX, DBL_MAX, &s->seed, err, errlen)) return -1;
  s->has_seed = !isnan(s->seed);
  if (!s->has_seed) s->seed = 0;
  lb = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
  if (lb && !cJSON_IsNull(lb) && !cJSON_IsArray(lb)) {
    utl_seterr(err, errlen, "%s: logit_bias must be [[id, bias]...]", GEN_S);
    return -1;
  }
  int n = cJSON_IsArray(lb) ? cJSON_GetArraySize(lb) : 0, i = 0;
  if (n && !(s->logit_bias = calloc((size_t)n, sizeof *s->logit_bias))) {
    utl_seterr(err, errlen, "%s: out of memory", GEN);
    return -1;
  }
  cJSON_ArrayForEach(pair, lb) {
    const cJSON *t = cJSON_GetArrayItem(pair, 0), *b = cJSON_GetArrayItem(pair, 1);
    if (!cJSON_IsArray(pair) || !cJSON_IsNumber(t) || !cJSON_IsNumber(b) || !(t->valuedouble >= INT32_MIN) ||
        !(t->valuedouble <= INT32_MAX) || t->valuedouble != (double)(int32_t)t->valuedouble ||
        !isfinite(b->valuedouble)) {
      utl_seterr(err, errlen, "%s: logit_bias[%d] must be [token id, bias]", GEN_S, i);
      return -1;
    }
    s->logit_bias[i++] = (prt_bias){(int32_t)t->valuedouble, b->valuedouble};
    s->n_logit_bias = i;
  }
  return 0;
}

int prt_generate_decode(const cJSON *j, prt_generate *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  m->max_tokens = -1;
  m->sampling = (prt_sampling){.temperature = 1, .top_p = 1, .repetition_penalty = 1, .logprobs = -1};
  int64_t v[4] = {-1, 0, 0, 0};
  const cJSON *stop, *e, *ie;
  // id and the routing names first: a refusal needs them (see request.h)
  if (prt__str(j, GEN, "id", 1, &m->id, err, errlen) || prt__str(j, GEN, "mode", 0, &m->mode, err, errlen) ||
      prt__str(j, GEN, "decode", 0, &m->decode, err, errlen) ||
      prt__str(j, GEN, "prefill", 0, &m->prefill, err, errlen) ||
      prt__ints(j, GEN, "prompt", 1, INT32_MIN, INT32_MAX, &m->prompt, &m->n_prompt, err, errlen) ||
      prt__int(j, GEN, "max_tokens", 0, 1, 1 << 30, &v[0], err, errlen) ||
      prt__int(j, GEN, "deadline_ms", 0, 0, 1 << 30, &v[1], err, errlen) ||
      prt__int(j, GEN, "resume", 0, 0, INT32_MAX, &v[2], err, errlen) || read_sampling(j, &m->sampling, err, errlen) ||
      prt__ints(j, GEN, "stop_ids", 0, INT32_MIN, INT32_MAX, &m->stop_ids, &m->n_stop_ids, err, errlen) ||
      read_grammar(j, &m->grammar, err, errlen))
    goto fail;
  m->max_tokens = (int)v[0];
  m->deadline_ms = (int)v[1];
  m->resume = (int)v[2];
  ie = cJSON_GetObjectItemCaseSensitive(j, "ignore_eos");
  if (ie && !cJSON_IsNull(ie) && !cJSON_IsBool(ie)) {
    utl_seterr(err, errlen, "%s: ignore_eos must be a bool", GEN);
    goto fail;
  }
  m->ignore_eos = cJSON_IsTrue(ie);
  ie = cJSON_GetObjectItemCaseSensitive(j, "speculative");
  if (ie && !cJSON_IsNull(ie) && !cJSON_IsBool(ie)) {
    utl_seterr(err, errlen, "%s: speculative must be a bool", GEN);
    goto fail;
  }
  m->no_spec = cJSON_IsFalse(ie);
  utl_trace_ctx tc;
  if (prt__str(j, GEN, "embed", 0, &m->embed, err, errlen)) goto fail;
  if (prt__str(j, GEN, "traceparent", 0, &m->traceparent, err, errlen)) goto fail;
  if (m->traceparent && utl_traceparent_parse(m->traceparent, &tc)) {
    utl_seterr(err, errlen, "%s: traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)", GEN);
    goto fail;
  }
  // The prefix fetch hint: both or neither.
  const cJSON *hp = cJSON_GetObjectItemCaseSensitive(j, "prefix_peer"), *hb = cJSON_GetObjectItemCaseSensitive(j,
                                                                                                       "prefix_blocks");
  if ((hp && !cJSON_IsNull(hp)) || (hb && !cJSON_IsNull(hb))) {
    if (prt__str(j, GEN, "prefix_peer", 1, &m->prefix_peer, err, errlen) ||
        prt__int(j, GEN, "prefix_blocks", 1, 1, 1 << 30, &v[3], err, errlen)) {
      utl_seterr(err, errlen, "%s: prefix_peer must name a prefill worker and prefix_blocks be an integer >= 1", GEN);
      m->prefix_peer = NULL;
      goto fail;
    }
    m->prefix_blocks = (int)v[3];
  }
  stop = cJSON_GetObjectItemCaseSensitive(j, "stop");
  if (stop && !cJSON_IsNull(stop) && !cJSON_IsArray(stop)) {
    utl_seterr(err, errlen, "%s: stop must be an array of strings", GEN);
    goto fail;
  }
  int n = cJSON_IsArray(stop) ? cJSON_GetArraySize(stop) : 0;
  if (n && !(m->stop = calloc((size_t)n, sizeof *m->stop))) {
    utl_seterr(err, errlen, "%s: out of memory", GEN);
    goto fail;
  }
  cJSON_ArrayForEach(e, stop) {
    if (!cJSON_IsString(e)) {
      utl_seterr(err, errlen, "%s: stop[%d] must be a string", GEN, m->n_stop);
      goto fail;
    }
    m->stop[m->n_stop++] = e->valuestring;
  }
  return 0;
fail:
  prt_generate_free(m);
  return -1;
}
