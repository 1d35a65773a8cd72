// proto/proto.c: the op table and the field readers every message codec shares.
#include "proto/proto.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/prt_int.h"
#include "util/err.h"

const char *const prt_ops[] = {
    PRT_OP_CHALLENGE, PRT_OP_HELLO,     PRT_OP_HELLO_OK,    PRT_OP_GENERATE,   PRT_OP_TOKEN,       PRT_OP_TOKENS,      PRT_OP_DONE,
    PRT_OP_ERROR,     PRT_OP_CANCEL,    PRT_OP_DRAINING,    PRT_OP_PING,       PRT_OP_PONG,        PRT_OP_STATS,
    PRT_OP_STATS_OK,  PRT_OP_KV_TABLE,  PRT_OP_KV_FIRST,    PRT_OP_KV_STARTED, PRT_OP_KV_FAIL,     PRT_OP_KV_FREED,
    PRT_OP_PREFIX_PULL, PRT_OP_PREFIX_PULLED, PRT_OP_PREFIX_FAIL, PRT_OP_KV_EVENTS,
    PRT_OP_REFUSED,
};
const int prt_n_ops = (int)(sizeof prt_ops / sizeof prt_ops[0]);

const char *prt_op(const cJSON *m) {
  const cJSON *op = cJSON_GetObjectItemCaseSensitive(m, "op");
  return cJSON_IsString(op) ? op->valuestring : "";
}

const char *prt_id(const cJSON *m) {
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
  return cJSON_IsString(id) ? id->valuestring : NULL;
}

int prt_is(const cJSON *m, const char *op) { return !strcmp(prt_op(m), op); }

cJSON *prt_new(const char *op) {
  cJSON *m = cJSON_CreateObject();
  if (m && !cJSON_AddStringToObject(m, "op", op)) {
    cJSON_Delete(m);
    return NULL;
  }
  return m;
}

cJSON *prt_bare_encode(const char *op) { return prt_new(op); }

// Field k of o into *v (null reads as absent): 1 when present; 0 when absent and optional; -1 with err when absent
// and required (req). Every reader below starts here.
static int present(const cJSON *o, const char *op, const char *k, int req, const cJSON **v, char *err, size_t errlen) {
  *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (*v && !cJSON_IsNull(*v)) return 1;
  *v = NULL;
  if (!req) return 0;
  utl_seterr(err, errlen, "%s: %s is missing", op, k);
  return -1;
}

int prt__str(const cJSON *o, const char *op, const char *k, int req, const char **out, char *err, size_t errlen) {
  const cJSON *v;
  int p = present(o, op, k, req, &v, err, errlen);
  if (p <= 0) return p;
  if (!cJSON_IsString(v)) {
    utl_seterr(err, errlen, "%s: %s must be a string", op, k);
    return -1;
  }
  *out = v->valuestring;
  return 0;
}

int prt__num(const cJSON *o, const char *op, const char *k, int req, double lo, double hi, double *out, char *err,
             size_t errlen) {
  const cJSON *v;
  int p = present(o, op, k, req, &v, err, errlen);
  if (p <= 0) return p;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
    utl_seterr(err, errlen, "%s: %s must be a number in [%g, %g]", op, k, lo, hi);
    return -1;
  }
  *out = v->valuedouble;
  return 0;
}

static int is_int(const cJSON *v, int64_t lo, int64_t hi) {
  return cJSON_IsNumber(v) && v->valuedouble >= (double)lo && v->valuedouble <= (double)hi &&
         v->valuedouble == (double)(int64_t)v->valuedouble;
}

int prt__int(const cJSON *o, const char *op, const char *k, int req, int64_t lo, int64_t hi, int64_t *out, char *err,
             size_t errlen) {
  const cJSON *v;
  int p = present(o, op, k, req, &v, err, errlen);
  if (p <= 0) return p;
  if (!is_int(v, lo, hi)) {
    utl_seterr(err, errlen, "%s: %s must be an integer in [%lld, %lld]", op, k, (long long)lo, (long long)hi);
    return -1;
  }
  *out = (int64_t)v->valuedouble;
  return 0;
}

int prt__ints(const cJSON *o, const char *op, const char *k, int req, int64_t lo, int64_t hi, int32_t **out, int *n,
              char *err, size_t errlen) {
  const cJSON *v, *e;
  *out = NULL;
  *n = 0;
  int p = present(o, op, k, req, &v, err, errlen);
  if (p <= 0) return p;
  if (!cJSON_IsArray(v)) {
    utl_seterr(err, errlen, "%s: %s must be an array of integers", op, k);
    return -1;
  }
  int len = cJSON_GetArraySize(v), i = 0;
  if (!len) return 0;
  int32_t *a = malloc((size_t)len * sizeof *a);
  if (!a) {
    utl_seterr(err, errlen, "%s: out of memory", op);
    return -1;
  }
  cJSON_ArrayForEach(e, v) {
    if (!is_int(e, lo, hi)) {
      utl_seterr(err, errlen, "%s: %s[%d] must be an integer in [%lld, %lld]", op, k, i, (long long)lo, (long long)hi);
      free(a);
      return -1;
    }
    a[i++] = (int32_t)e->valuedouble;
  }
  *out = a;
  *n = len;
  return 0;
}

int prt__add_ints(cJSON *o, const char *k, const int32_t *v, int n) {
  cJSON *a = cJSON_AddArrayToObject(o, k);
  if (!a) return -1;
  for (int i = 0; i < n; i++) {
    cJSON *x = cJSON_CreateNumber(v[i]);
    if (!x || !cJSON_AddItemToArray(a, x)) {
      cJSON_Delete(x);
      return -1;
    }
  }
  return 0;
}

int prt__obj(const cJSON *o, const char *op, const char *k, int req, const cJSON **out, char *err, size_t errlen) {
  const cJSON *v;
  int p = present(o, op, k, req, &v, err, errlen);
  if (p <= 0) return p;
  if (!cJSON_IsObject(v)) {
    utl_seterr(err, errlen, "%s: %s must be an object", op, k);
    return -1;
  }
  *out = v;
  return 0;
}
