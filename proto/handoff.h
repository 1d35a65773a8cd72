// proto/handoff.h: the KV handoff between a prefill and a decode worker: kv_table, kv_first, kv_started, kv_fail,
// kv_freed.
#ifndef DSERVE_PRT_HANDOFF_H
#define DSERVE_PRT_HANDOFF_H

#include "proto/request.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Strings in decoded structs are borrowed from the decoded cJSON: they live as long as it does.
// Encoders return a new message (owned by the caller) or NULL on out of memory (err says so).

typedef struct prt_kv_table {
  const char *id;  // (borrowed) required
  int32_t *blocks; // (owned) (n_blocks) the decode worker's block ids, in position order; required, ids >= 0
  int n_blocks;
  int skip_blocks; // leading blocks the decode worker already holds; 0 when absent
  int32_t *pages;  // (owned) (n_pages) with layer groups: n_blocks x n_groups page ids, -1 for a page given back;
  int n_pages;     //   NULL / 0 when absent
} prt_kv_table;
cJSON *prt_kv_table_encode(const prt_kv_table *m, char *err, size_t errlen);
int prt_kv_table_decode(const cJSON *j, prt_kv_table *m, char *err, size_t errlen) UTL_WARN_UNUSED;
void prt_kv_table_free(prt_kv_table *m);

typedef struct prt_kv_first {
  const char *id;    // (borrowed) required
  prt_sampled first; // the first sampled token: required
  int cached_tokens; // prompt tokens the prefill worker reused; 0 when absent
  double prefill_ms; // from the prefill worker's receipt of the request to this first token; -1 when absent (sent
                     // when >= 0)
  int cached_store_tokens; // of cached_tokens, the ones read from the shared KV tier (kvstore); 0 when absent (sent when > 0)
} prt_kv_first;
cJSON *prt_kv_first_encode(const prt_kv_first *m, char *err, size_t errlen);
int prt_kv_first_decode(const cJSON *j, prt_kv_first *m, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct prt_kv_started {
  const char *id; // (borrowed) required
} prt_kv_started;
cJSON *prt_kv_started_encode(const prt_kv_started *m, char *err, size_t errlen);
int prt_kv_started_decode(const cJSON *j, prt_kv_started *m, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct prt_kv_fail {
  const char *id;      // (borrowed) required
  const char *message; // (borrowed) why; NULL when absent
  const char *code;    // (borrowed) the OpenAI error code the request fails with (the prefill worker's refusal of a
                       // prompt: "context_length_exceeded"); NULL when absent: the receiver's own ("worker_failure")
} prt_kv_fail;
cJSON *prt_kv_fail_encode(const prt_kv_fail *m, char *err, size_t errlen);
int prt_kv_fail_decode(const cJSON *j, prt_kv_fail *m, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct prt_kv_freed {
  const char *id; // (borrowed) required
} prt_kv_freed;
cJSON *prt_kv_freed_encode(const prt_kv_freed *m, char *err, size_t errlen);
int prt_kv_freed_decode(const cJSON *j, prt_kv_freed *m, char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
