// proto/prefix.h: prefix fetch between prefill workers: prefix_pull and its answers prefix_pulled, prefix_fail.
#ifndef DSERVE_PRT_PREFIX_H
#define DSERVE_PRT_PREFIX_H

#include "proto/hello.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Strings in decoded structs are borrowed from the decoded cJSON: they live as long as it does.
// Encoders return a new message (owned by the caller) or NULL on out of memory (err says so).

typedef struct prt_prefix_pull {
  const char *id;          // (borrowed) the request's; required
  int32_t *tokens;         // (owned) (n_tokens) the prompt's first n x block_size token ids; required
  int n_tokens;
  int first;               // leading blocks the asker holds already; required, >= 0
  int32_t *blocks;         // (owned) (n_blocks) the asker's pool block ids for blocks first..n-1; required
  int n_blocks;
  int has_layout;          // kv_layout is present (read on a connection's first pull)
  prt_kv_layout kv_layout;
  const char *kvx_md;      // (borrowed) base64 kvxfer metadata, or NULL
} prt_prefix_pull;
cJSON *prt_prefix_pull_encode(const prt_prefix_pull *m, char *err, size_t errlen);
int prt_prefix_pull_decode(const cJSON *j, prt_prefix_pull *m, char *err, size_t errlen) UTL_WARN_UNUSED;
void prt_prefix_pull_free(prt_prefix_pull *m);

typedef struct prt_prefix_pulled {
  const char *id; // (borrowed) required
  int n_blocks;   // blocks from first on written; required, >= 0
} prt_prefix_pulled;
cJSON *prt_prefix_pulled_encode(const prt_prefix_pulled *m, char *err, size_t errlen);
int prt_prefix_pulled_decode(const cJSON *j, prt_prefix_pulled *m, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct prt_prefix_fail {
  const char *id;      // (borrowed) required
  const char *message; // (borrowed) why; NULL when absent
} prt_prefix_fail;
cJSON *prt_prefix_fail_encode(const prt_prefix_fail *m, char *err, size_t errlen);
int prt_prefix_fail_decode(const cJSON *j, prt_prefix_fail *m, char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
