// proto/stats.c: stats_ok, a worker's load and running counters as the router reads them.
#include "proto/stats.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "proto/prt_int.h"
#include "util/err.h"

const char *const prt_tier_names[PRT_N_TIERS] = {"pool", "host", "disk", "store"};

// The counts in field order: their names and where they live.
#define COUNTS(X)                                                                                                     \
  X(running) X(waiting) X(free_blocks) X(total_blocks) X(finished) X(prefix_hits) X(prefix_queries)                   \
  X(prefix_cached_blocks) X(kv_bytes_pushed) X(prefix_fetches) X(prefix_fetched_blocks) X(prefix_fetch_misses)        \
  X(prefix_served_blocks) X(auth_failures) X(trace_spans_dropped) X(evictable_blocks) X(kvstore_read_blocks)         \
  X(kvstore_read_bytes) X(kvstore_write_blocks) X(kvstore_write_bytes) X(kvstore_errors) X(kvstore_timeouts)          \
  X(kvstore_mac_failures) X(kvstore_mismatches) X(kvstore_queue_drops) X(kvstore_up)

void prt_stats_ok_init(prt_stats_ok *m) {
  memset(m, 0, sizeof *m);
#define INIT(f) m->f = -1;
  COUNTS(INIT)
#undef INIT
}

int prt_stats_ok_add(cJSON *j, const prt_stats_ok *m) {
#define ADD(f)                                                                                                        \
  if (m->f >= 0 && !cJSON_AddNumberToObject(j, #f, m->f)) return -1;
  COUNTS(ADD)
#undef ADD
  cJSON *tiers = NULL;
  for (int t = 0; t < PRT_N_TIERS; t++) {
    const prt_tier_stats *s = &m->tiers[t];
    if (!s->present) continue;
    if (!tiers && !(tiers = cJSON_AddObjectToObject(j, "prefix_tiers"))) return -1;
    cJSON *o = cJSON_AddObjectToObject(tiers, prt_tier_names[t]);
    if (!o || !cJSON_AddNumberToObject(o, "hits", s->hits) || !cJSON_AddNumberToObject(o, "queries", s->queries) ||
        !cJSON_AddNumberToObject(o, "blocks", s->blocks) || !cJSON_AddNumberToObject(o, "refused", s->refused))
      return -1;
  }
  return 0;
}

cJSON *prt_stats_ok_encode(const prt_stats_ok *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_STATS_OK);
  if (!j || prt_stats_ok_add(j, m)) {
    cJSON_Delete(j);
    utl_seterr(err, errlen, "out of memory");
    return NULL;
  }
  return j;
}

int prt_stats_ok_decode(const cJSON *j, prt_stats_ok *m, char *err, size_t errlen) {
  prt_stats_ok_init(m);
#define GET(f)                                                                                                        \
  if (prt__num(j, PRT_OP_STATS_OK, #f, 0, 0, HUGE_VAL, &m->f, err, errlen)) return -1;
  COUNTS(GET)
#undef GET
  const cJSON *tiers = NULL;
  if (prt__obj(j, PRT_OP_STATS_OK, "prefix_tiers", 0, &tiers, err, errlen)) return -1;
  for (int t = 0; tiers && t < PRT_N_TIERS; t++) {
    const cJSON *o = NULL;
    char what[48];
    snprintf(what, sizeof what, "stats_ok prefix_tiers.%s", prt_tier_names[t]);
    o = cJSON_GetObjectItemCaseSensitive(tiers, prt_tier_names[t]);
    if (!cJSON_IsObject(o)) continue; // a tier the worker does not have (anything but an object reads as absent)
    prt_tier_stats *s = &m->tiers[t];
    if (prt__num(o, what, "hits", 0, 0, HUGE_VAL, &s->hits, err, errlen) ||
        prt__num(o, what, "queries", 0, 0, HUGE_VAL, &s->queries, err, errlen) ||
        prt__num(o, what, "blocks", 0, 0, HUGE_VAL, &s->blocks, err, errlen) ||
        prt__num(o, what, "refused", 0, 0, HUGE_VAL, &s->refused, err, errlen))
      return -1;
    s->present = 1;
  }
  return 0;
}
