// proto/hello.c: the handshake's messages (challenge, hello, hello_ok, refused) and the kv_layout object.
#include "proto/hello.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/prt_int.h"
#include "util/err.h"

static cJSON *oom(cJSON *m, char *err, size_t errlen) {
  cJSON_Delete(m);
  utl_seterr(err, errlen, "out of memory");
  return NULL;
}

cJSON *prt_challenge_encode(const prt_challenge *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_CHALLENGE);
  if (!j || !PRT_ADD_STR(j, "nonce", m->nonce) || !PRT_ADD_STR(j, "name", m->name)) return oom(j, err, errlen);
  return j;
}

cJSON *prt_refused_encode(const prt_refused *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_REFUSED);
  if (!j || !PRT_ADD_STR(j, "reason", m->reason) || !PRT_ADD_STR(j, "code", m->code)) return oom(j, err, errlen);
  return j;
}

int prt_refused_decode(const cJSON *j, prt_refused *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_REFUSED, "reason", 1, &m->reason, err, errlen) ||
                 prt__str(j, PRT_OP_REFUSED, "code", 0, &m->code, err, errlen)
             ? -1
             : 0;
}

int prt_challenge_decode(const cJSON *j, prt_challenge *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_CHALLENGE, "nonce", 1, &m->nonce, err, errlen) ||
                 prt__str(j, PRT_OP_CHALLENGE, "name", 0, &m->name, err, errlen)
             ? -1
             : 0;
}

cJSON *prt_hello_encode(const prt_hello *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_HELLO);
  if (!j || !PRT_ADD_STR(j, "name", m->name) || !PRT_ADD_STR(j, "role", m->role) ||
      !PRT_ADD_STR(j, "auth", m->auth) || (m->proto >= 0 && !cJSON_AddNumberToObject(j, "proto", m->proto)) ||
      !PRT_ADD_STR(j, "nonce", m->nonce) || !PRT_ADD_STR(j, "member", m->member) || !PRT_ADD_STR(j, "addr", m->addr))
    return oom(j, err, errlen);
  return j;
}

int prt_hello_decode(const cJSON *j, prt_hello *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  int64_t v = -1;
  if (prt__str(j, PRT_OP_HELLO, "role", 0, &m->role, err, errlen) ||
      prt__str(j, PRT_OP_HELLO, "name", 0, &m->name, err, errlen) ||
      prt__str(j, PRT_OP_HELLO, "auth", 0, &m->auth, err, errlen) ||
      prt__str(j, PRT_OP_HELLO, "nonce", 0, &m->nonce, err, errlen) ||
      prt__str(j, PRT_OP_HELLO, "member", 0, &m->member, err, errlen) ||
      prt__str(j, PRT_OP_HELLO, "addr", 0, &m->addr, err, errlen) ||
      prt__int(j, PRT_OP_HELLO, "proto", 0, 0, INT32_MAX, &v, err, errlen))
    return -1;
  m->proto = (int)v;
  return 0;
}

int prt_kv_layout_add(cJSON *msg, const prt_kv_layout *l) {
  char base[32];
  snprintf(base, sizeof base, "%" PRIu64, l->base);
  cJSON *o = cJSON_AddObjectToObject(msg, "kv_layout");
  return o && cJSON_AddNumberToObject(o, "n_layer", l->n_layer) && cJSON_AddNumberToObject(o, "parts", l->parts) &&
                 cJSON_AddNumberToObject(o, "width", l->width) &&
                 cJSON_AddNumberToObject(o, "type", l->type) &&
                 cJSON_AddNumberToObject(o, "block_size", l->block_size) &&
                 cJSON_AddNumberToObject(o, "n_blocks", l->n_blocks) &&
                 cJSON_AddNumberToObject(o, "n_groups", l->n_groups) && cJSON_AddStringToObject(o, "base", base)
             ? 0
             : -1;
}

int prt_kv_layout_read(const cJSON *msg, const char *op, prt_kv_layout *l, char *err, size_t errlen) {
  const cJSON *o = NULL;
  const char *base = NULL;
  int64_t v[7] = {0, 0, 0, 0, 0, 0, 1};
  static const char *const k[7] = {"n_layer", "parts", "width", "type", "block_size", "n_blocks", "n_groups"};
  char op2[48];
  snprintf(op2, sizeof op2, "%s kv_layout", op);
  memset(l, 0, sizeof *l);
  if (prt__obj(msg, op, "kv_layout", 1, &o, err, errlen)) return -1;
  for (int i = 0; i < 7; i++) // type may be 0 (f32); parts and width at least 1; n_groups optional
    if (prt__int(o, op2, k[i], i < 6, i == 3 ? 0 : i == 1 || i == 2 || i == 6 ? 1 : 0, INT32_MAX, &v[i], err, errlen))
      return -1;
  if (prt__str(o, op2, "base", 1, &base, err, errlen)) return -1;
  char *end = NULL;
  unsigned long long b = strtoull(base, &end, 10);
  if (!base[0] || *end || base[0] == '-') {
    utl_seterr(err, errlen, "%s: base must be a decimal address", op2);
    return -1;
  }
  *l = (prt_kv_layout){(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5], (int)v[6], (uint64_t)b};
  return 0;
}

int prt_hello_ok_add_worker(cJSON *j, const prt_hello_ok *m) {
  if (m->has_worker && (!cJSON_AddNumberToObject(j, "n_ctx", m->n_ctx) ||
                        !cJSON_AddNumberToObject(j, "n_vocab", m->n_vocab) ||
                        !cJSON_AddNumberToObject(j, "total_blocks", m->total_blocks)))
    return -1;
  if (m->has_layout && prt_kv_layout_add(j, &m->kv_layout)) return -1;
  return PRT_ADD_STR(j, "kvx_md", m->kvx_md) ? 0 : -1;
}

cJSON *prt_hello_ok_encode(const prt_hello_ok *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_HELLO_OK);
  if (!j || !PRT_ADD_STR(j, "name", m->name) || !PRT_ADD_STR(j, "role", m->role) ||
      !PRT_ADD_STR(j, "auth", m->auth) || prt_hello_ok_add_worker(j, m))
    return oom(j, err, errlen);
  return j;
}

int prt_hello_ok_decode(const cJSON *j, prt_hello_ok *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  int64_t v[3] = {0, 0, 0};
  if (prt__str(j, PRT_OP_HELLO_OK, "role", 0, &m->role, err, errlen) ||
      prt__str(j, PRT_OP_HELLO_OK, "name", 0, &m->name, err, errlen) ||
      prt__str(j, PRT_OP_HELLO_OK, "kvx_md", 0, &m->kvx_md, err, errlen) ||
      prt__str(j, PRT_OP_HELLO_OK, "auth", 0, &m->auth, err, errlen))
    return -1;
  m->has_worker = cJSON_HasObjectItem(j, "n_ctx");
  static const char *const k[3] = {"n_ctx", "n_vocab", "total_blocks"};
  for (int i = 0; i < 3; i++)
    if (prt__int(j, PRT_OP_HELLO_OK, k[i], m->has_worker, 0, INT32_MAX, &v[i], err, errlen)) return -1;
  m->n_ctx = (int)v[0];
  m->n_vocab = (int)v[1];
  m->total_blocks = (int)v[2];
  m->has_layout = cJSON_HasObjectItem(j, "kv_layout");
  if (m->has_layout && prt_kv_layout_read(j, PRT_OP_HELLO_OK, &m->kv_layout, err, errlen)) return -1;
  return 0;
}
