// proto/stats.h: a worker's load and counters (stats_ok, the answer to the router's stats).
#ifndef DSERVE_PRT_STATS_H
#define DSERVE_PRT_STATS_H

#include "proto/proto.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Tiers of a prefix store, in prefix_tiers order; "store" is the shared KV tier on Redis (kvstore), whose blocks are
// the store's (its blocks count is 0; refused: blocks its write-behind queue dropped).
enum { PRT_TIER_POOL, PRT_TIER_HOST, PRT_TIER_DISK, PRT_TIER_STORE, PRT_N_TIERS };
extern const char *const prt_tier_names[PRT_N_TIERS]; // "pool", "host", "disk", "store"

typedef struct prt_tier_stats {
  int present;                  // the worker has this tier
  double hits, queries, blocks; // running totals in tokens; blocks resident now
  double refused;               // blocks the tier could not store (running total; kv_prefix_stats.refused); 0 when a
                                // worker does not send it
} prt_tier_stats;

// Every count is a number >= 0, or -1 when the worker did not send it (a role that has no such count). A tier of
// prefix_tiers that is not an object is absent (present 0), as the router always read it.
typedef struct prt_stats_ok {
  double running, waiting, free_blocks, total_blocks, finished;
  double prefix_hits, prefix_queries, prefix_cached_blocks;
  double evictable_blocks; // KV blocks only the prefix store holds (cached, no sequence uses them): free_blocks
                           // leaves them out, so total - free - evictable is what running sequences hold
  prt_tier_stats tiers[PRT_N_TIERS]; // prefix_tiers
  double kv_bytes_pushed, prefix_fetches, prefix_fetched_blocks, prefix_fetch_misses, prefix_served_blocks;
  double auth_failures;
  double trace_spans_dropped; // spans the worker's exporter dropped on a full queue (running total; with tracing)
  // The shared KV tier (a worker with a "kvstore" section; running totals but kvstore_up, 1 when its last round trip
  // succeeded): blocks and bytes read and written, errors (connections, AUTH), reads past read_timeout_ms, values
  // refused for their MAC or for another space, key or length, and blocks the write-behind queue dropped.
  double kvstore_read_blocks, kvstore_read_bytes, kvstore_write_blocks, kvstore_write_bytes, kvstore_errors;
  double kvstore_timeouts, kvstore_mac_failures, kvstore_mismatches, kvstore_queue_drops, kvstore_up;
} prt_stats_ok;
// A prt_stats_ok with every count absent (-1).
void prt_stats_ok_init(prt_stats_ok *m);
// Writes the counts that are >= 0 (and the present tiers) into msg (a stats_ok message); 0, -1 on out of memory.
int prt_stats_ok_add(cJSON *msg, const prt_stats_ok *m) UTL_WARN_UNUSED;
cJSON *prt_stats_ok_encode(const prt_stats_ok *m, char *err, size_t errlen);
int prt_stats_ok_decode(const cJSON *j, prt_stats_ok *m, char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
