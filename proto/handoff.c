// proto/handoff.c: the KV handoff's messages between a prefill and a decode worker (kv_table, kv_first, kv_started,
// kv_fail, kv_freed).
#include "proto/handoff.h"

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

cJSON *prt_kv_table_encode(const prt_kv_table *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_KV_TABLE);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || prt__add_ints(j, "blocks", m->blocks, m->n_blocks) ||
      (m->pages && prt__add_ints(j, "pages", m->pages, m->n_pages)) ||
      !cJSON_AddNumberToObject(j, "skip_blocks", m->skip_blocks))
    return oom(j, err, errlen);
  return j;
}

void prt_kv_table_free(prt_kv_table *m) {
  free(m->blocks);
  free(m->pages);
  m->blocks = m->pages = NULL;
  m->n_blocks = m->n_pages = 0;
}

int prt_kv_table_decode(const cJSON *j, prt_kv_table *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  int64_t skip = 0;
  if (prt__str(j, PRT_OP_KV_TABLE, "id", 1, &m->id, err, errlen) ||
      prt__ints(j, PRT_OP_KV_TABLE, "blocks", 1, 0, INT32_MAX, &m->blocks, &m->n_blocks, err, errlen) ||
      prt__ints(j, PRT_OP_KV_TABLE, "pages", 0, -1, INT32_MAX, &m->pages, &m->n_pages, err, errlen) ||
      prt__int(j, PRT_OP_KV_TABLE, "skip_blocks", 0, 0, INT32_MAX, &skip, err, errlen)) {
    prt_kv_table_free(m);
    return -1;
  }
  m->skip_blocks = (int)skip;
  return 0;
}

cJSON *prt_kv_first_encode(const prt_kv_first *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_KV_FIRST);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || prt_sampled_add(j, &m->first) ||
      !cJSON_AddNumberToObject(j, "cached_tokens", m->cached_tokens) ||
      (m->cached_store_tokens > 0 && !cJSON_AddNumberToObject(j, "cached_store_tokens", m->cached_store_tokens)) ||
      (m->prefill_ms >= 0 && !cJSON_AddNumberToObject(j, "prefill_ms", m->prefill_ms)))
    return oom(j, err, errlen);
  return j;
}

int prt_kv_first_decode(const cJSON *j, prt_kv_first *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  m->prefill_ms = -1;
  int64_t c = 0, cs = 0;
  if (prt__str(j, PRT_OP_KV_FIRST, "id", 1, &m->id, err, errlen) ||
      prt_sampled_read(j, PRT_OP_KV_FIRST, &m->first, err, errlen) ||
      prt__int(j, PRT_OP_KV_FIRST, "cached_tokens", 0, 0, INT32_MAX, &c, err, errlen) ||
      prt__int(j, PRT_OP_KV_FIRST, "cached_store_tokens", 0, 0, c, &cs, err, errlen) ||
      prt__num(j, PRT_OP_KV_FIRST, "prefill_ms", 0, 0, HUGE_VAL, &m->prefill_ms, err, errlen))
    return -1;
  m->cached_tokens = (int)c;
  m->cached_store_tokens = (int)cs;
  return 0;
}

// kv_started, kv_freed: an id only.
static cJSON *id_encode(const char *op, const char *id, char *err, size_t errlen) {
  cJSON *j = prt_new(op);
  if (!j || !PRT_ADD_STR(j, "id", id)) return oom(j, err, errlen);
  return j;
}

cJSON *prt_kv_started_encode(const prt_kv_started *m, char *err, size_t errlen) {
  return id_encode(PRT_OP_KV_STARTED, m->id, err, errlen);
}

int prt_kv_started_decode(const cJSON *j, prt_kv_started *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_KV_STARTED, "id", 1, &m->id, err, errlen);
}

cJSON *prt_kv_freed_encode(const prt_kv_freed *m, char *err, size_t errlen) {
  return id_encode(PRT_OP_KV_FREED, m->id, err, errlen);
}

int prt_kv_freed_decode(const cJSON *j, prt_kv_freed *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_KV_FREED, "id", 1, &m->id, err, errlen);
}

cJSON *prt_kv_fail_encode(const prt_kv_fail *m, char *err, size_t errlen) {
  cJSON *j = id_encode(PRT_OP_KV_FAIL, m->id, err, errlen);
  if (j && (!PRT_ADD_STR(j, "message", m->message) || !PRT_ADD_STR(j, "code", m->code))) return oom(j, err, errlen);
  return j;
}

int prt_kv_fail_decode(const cJSON *j, prt_kv_fail *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_KV_FAIL, "id", 1, &m->id, err, errlen) ||
                 prt__str(j, PRT_OP_KV_FAIL, "message", 0, &m->message, err, errlen) ||
                 prt__str(j, PRT_OP_KV_FAIL, "code", 0, &m->code, err, errlen)
             ? -1
             : 0;
}
