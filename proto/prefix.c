// proto/prefix.c: prefix fetch's messages between prefill workers (prefix_pull, prefix_pulled, prefix_fail).
#include "proto/prefix.h"

#include <stdlib.h>
#include <string.h>

#include "proto/prt_int.h"
#include "util/err.h"

static cJSON *oom(cJSON *m, char *err, size_t errlen) {
  cJSON_Delete(m);
  utl_seterr(err, errlen, "out of memory");
  return NULL;
}

cJSON *prt_prefix_pull_encode(const prt_prefix_pull *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_PREFIX_PULL);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || prt__add_ints(j, "tokens", m->tokens, m->n_tokens) ||
      !cJSON_AddNumberToObject(j, "first", m->first) || prt__add_ints(j, "blocks", m->blocks, m->n_blocks) ||
      (m->has_layout && prt_kv_layout_add(j, &m->kv_layout)) || !PRT_ADD_STR(j, "kvx_md", m->kvx_md))
    return oom(j, err, errlen);
  return j;
}

void prt_prefix_pull_free(prt_prefix_pull *m) {
  free(m->tokens);
  free(m->blocks);
  m->tokens = m->blocks = NULL;
  m->n_tokens = m->n_blocks = 0;
}

int prt_prefix_pull_decode(const cJSON *j, prt_prefix_pull *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  int64_t first = 0;
  if (prt__str(j, PRT_OP_PREFIX_PULL, "id", 1, &m->id, err, errlen) ||
      prt__ints(j, PRT_OP_PREFIX_PULL, "tokens", 1, INT32_MIN, INT32_MAX, &m->tokens, &m->n_tokens, err, errlen) ||
      prt__int(j, PRT_OP_PREFIX_PULL, "first", 1, 0, INT32_MAX, &first, err, errlen) ||
      prt__ints(j, PRT_OP_PREFIX_PULL, "blocks", 1, 0, INT32_MAX, &m->blocks, &m->n_blocks, err, errlen) ||
      prt__str(j, PRT_OP_PREFIX_PULL, "kvx_md", 0, &m->kvx_md, err, errlen))
    goto fail;
  m->first = (int)first;
  m->has_layout = cJSON_HasObjectItem(j, "kv_layout");
  if (m->has_layout && prt_kv_layout_read(j, PRT_OP_PREFIX_PULL, &m->kv_layout, err, errlen)) goto fail;
  return 0;
fail:
  prt_prefix_pull_free(m);
  return -1;
}

cJSON *prt_prefix_pulled_encode(const prt_prefix_pulled *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_PREFIX_PULLED);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || !cJSON_AddNumberToObject(j, "n_blocks", m->n_blocks))
    return oom(j, err, errlen);
  return j;
}

int prt_prefix_pulled_decode(const cJSON *j, prt_prefix_pulled *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  int64_t n = 0;
  if (prt__str(j, PRT_OP_PREFIX_PULLED, "id", 1, &m->id, err, errlen) ||
      prt__int(j, PRT_OP_PREFIX_PULLED, "n_blocks", 1, 0, INT32_MAX, &n, err, errlen))
    return -1;
  m->n_blocks = (int)n;
  return 0;
}

cJSON *prt_prefix_fail_encode(const prt_prefix_fail *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_PREFIX_FAIL);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || !PRT_ADD_STR(j, "message", m->message)) return oom(j, err, errlen);
  return j;
}

int prt_prefix_fail_decode(const cJSON *j, prt_prefix_fail *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_PREFIX_FAIL, "id", 1, &m->id, err, errlen) ||
                 prt__str(j, PRT_OP_PREFIX_FAIL, "message", 0, &m->message, err, errlen)
             ? -1
             : 0;
}
