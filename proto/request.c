// proto/request.c: a request's messages between the router and the workers: generate, token, done, error, cancel.
#include "proto/request.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/prt_int.h"
#include "util/err.h"

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
      !cJSON_AddNumberToObject(j, "kv_bytes", m->kv_bytes) || !cJSON_AddNumberToObject(j, "kv_ms", m->kv_ms))
    return oom(j, err, errlen);
  return j;
}

int prt_done_decode(const cJSON *j, prt_done *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  int64_t v[3] = {-1, -1, -1};
  static const char *const k[3] = {"prompt_tokens", "completion_tokens", "cached_tokens"};
  m->kv_bytes = m->kv_ms = -1;
  if (prt__str(j, PRT_OP_DONE, "id", 1, &m->id, err, errlen) ||
      prt__str(j, PRT_OP_DONE, "finish_reason", 0, &m->finish_reason, err, errlen))
    return -1;
  for (int i = 0; i < 3; i++)
    if (prt__int(j, PRT_OP_DONE, k[i], 0, -1, INT32_MAX, &v[i], err, errlen)) return -1;
  if (prt__num(j, PRT_OP_DONE, "kv_bytes", 0, -1, HUGE_VAL, &m->kv_bytes, err, errlen) ||
      prt__num(j, PRT_OP_DONE, "kv_ms", 0, -1, HUGE_VAL, &m->kv_ms, err, errlen))
    return -1;
  m->prompt_tokens = (int)v[0];
  m->completion_tokens = (int)v[1];
  m->cached_tokens = (int)v[2];
  return 0;
}
