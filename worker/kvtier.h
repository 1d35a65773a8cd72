// worker/kvtier.h: the shared KV block tier (kvstore/) as a prefill or both worker uses it: read a prompt's next full
// blocks before recomputing them, write the blocks a step computed behind (docs/design.md, "The shared KV tier").
#ifndef DSERVE_WRK_KVTIER_H
#define DSERVE_WRK_KVTIER_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "kv/pool.h"
#include "kv/prefix.h"
#include "proto/stats.h"
#include "util/err.h"
#include "worker/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wrk_kvtier wrk_kvtier;

// Opens the store of the "kvstore" section of rt's config for rt's worker and pool: the MAC key is derived from the cluster secret
// (HKDF, a label of its own), the space from the model file's fingerprint, kv_type, the KV layout (parts, width,
// layers) and the block size, so that a value of another model, type, layout or size never matches. An unreachable
// store is not an error (kvstore logs it and retries). 0 with *out, or -1 with err (a bad section, an unreadable
// password file, no secret).
int wrk_kvtier_open(const wrk_runtime *rt, wrk_kvtier **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void wrk_kvtier_close(wrk_kvtier *t); // NULL is fine

// Reads the longest run of toks' full blocks after the first n_have (the last token always stays to compute) into
// newly allocated pool blocks (prefix, when not NULL, gives back unused cached blocks when the pool is short), writes
// their ids into ids_out (max) each with a reference for the caller, and returns how many (0: none, the store is
// down, slow or the pool has no room). Counts the lookup for the tier's stats.
int wrk_kvtier_read(wrk_kvtier *t, kv_pool *pool, kv_prefix *prefix, const int32_t *toks, int n_toks, int n_have,
                    int32_t *ids_out, int max);

// Queues blocks [from, to) of a sequence's table (ids; toks its tokens, at least to * block_size) for writing
// behind; never waits on the network. A block that is not whole (a window page already given back) is skipped.
void wrk_kvtier_write(wrk_kvtier *t, kv_pool *pool, const int32_t *toks, const int32_t *ids, int from, int to);

// The tier's counts for stats_ok: tiers[PRT_TIER_STORE] (hits and queries in tokens) and the kvstore_* counters.
void wrk_kvtier_stats(wrk_kvtier *t, prt_stats_ok *out);

#ifdef __cplusplus
}
#endif
#endif
