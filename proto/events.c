// proto/events.c: kv_events, [[kind, "key"], ...] in the order a worker's prefix store changed.
#include "proto/events.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/prt_int.h"
#include "util/err.h"

cJSON *prt_kv_events_encode(const prt_kv_events *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_KV_EVENTS), *arr = j ? cJSON_AddArrayToObject(j, "events") : NULL;
  for (int i = 0; arr && i < m->n; i++) {
    char key[24];
    snprintf(key, sizeof key, "%" PRIu64, m->ev[i].key);
    cJSON *e = cJSON_CreateArray();
    if (!e || !cJSON_AddItemToArray(arr, e) || !cJSON_AddItemToArray(e, cJSON_CreateNumber(m->ev[i].kind)) ||
        !cJSON_AddItemToArray(e, cJSON_CreateString(key)))
      arr = NULL;
  }
  if (!arr) {
    cJSON_Delete(j);
    utl_seterr(err, errlen, "out of memory");
    return NULL;
  }
  return j;
}

void prt_kv_events_free(prt_kv_events *m) {
  free(m->ev);
  memset(m, 0, sizeof *m);
}

int prt_kv_events_decode(const cJSON *j, prt_kv_events *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  const cJSON *evs = cJSON_GetObjectItemCaseSensitive(j, "events"), *e;
  if (!cJSON_IsArray(evs)) {
    utl_seterr(err, errlen, "kv_events: events must be an array of [kind, \"key\"]");
    return -1;
  }
  int n = cJSON_GetArraySize(evs);
  if (n && !(m->ev = malloc((size_t)n * sizeof *m->ev))) {
    utl_seterr(err, errlen, "kv_events: out of memory");
    return -1;
  }
  cJSON_ArrayForEach(e, evs) {
    const cJSON *kind = cJSON_GetArrayItem(e, 0), *key = cJSON_GetArrayItem(e, 1);
    if (!cJSON_IsArray(e) || !cJSON_IsNumber(kind)) {
      m->skipped++;
      continue;
    }
    uint64_t k = 0;
    if (cJSON_IsString(key)) {
      char *end = NULL;
      errno = 0;
      k = strtoull(key->valuestring, &end, 10);
      if (errno || end == key->valuestring || *end) {
        m->skipped++;
        continue;
      }
    } else if (kind->valueint != PRT_KV_CLEARED) {
      m->skipped++;
      continue;
    }
    m->ev[m->n++] = (prt_kv_event){.key = k, .kind = kind->valueint};
  }
  return 0;
}
