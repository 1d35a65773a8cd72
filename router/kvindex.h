// router/kvindex.h: the router's KV-aware index: which worker holds which block keys, and a worker score combining cached overlap, queue and free blocks.
#ifndef DSERVE_RTR_KVINDEX_H
#define DSERVE_RTR_KVINDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kv/blockhash.h"

#ifdef __cplusplus
extern "C" {
#endif

// Per worker (a small integer id in [0, max_workers)) the set of block keys it reported (kv_event
// from its kv_prefix store). The index is a hint: a key it wrongly believes present (lost REMOVED) or
// absent (lost ADDED, cap eviction) costs a recomputation on the worker, never a wrong answer, because the
// worker's store compares tokens itself. Memory is bounded: at most cap_per_worker keys per worker; adding
// to a full worker forgets its oldest key (oldest by last ADDED). Thread-compatible (one owner, e.g. the
// router's scheduling thread). Keys come from kv_blockhash_chain over the prompt's token ids with the
// workers' block size.
typedef struct rtr_kvindex rtr_kvindex;

// max_workers in [1, 65536], cap_per_worker in [1, 1 << 26]. A worker's table is allocated on its first
// ADDED event (32 to 40 bytes per key of cap_per_worker).
int rtr_kvindex_new(int max_workers, int cap_per_worker, rtr_kvindex **out, char *err, size_t errlen);
void rtr_kvindex_free(rtr_kvindex *x);
// Room for workers [0, max_workers) (a router whose links grow); the workers' tables stay. 0, or -1 out of memory
// (the index is as it was).
int rtr_kvindex_grow(rtr_kvindex *x, int max_workers);

// Applies a worker's events in order (ADDED, REMOVED, CLEARED; unknown kinds are skipped). -1 when the
// worker id is out of range or its table cannot be allocated (the events from there on are not applied).
int rtr_kvindex_apply(rtr_kvindex *x, int worker, const kv_event *ev /* (n) */, int n);
// A worker that died or left: all its keys are dropped (its table freed). Out-of-range ids are ignored.
void rtr_kvindex_remove_worker(rtr_kvindex *x, int worker);
int rtr_kvindex_count(const rtr_kvindex *x, int worker); // keys held; 0 for unknown workers

// The number of leading prompt blocks the worker holds: keys[0..k) all present, keys[k] absent.
int rtr_kvindex_overlap(const rtr_kvindex *x, int worker, const uint64_t *prompt_keys /* (n) */, int n);

// Weights of the score (all >= 0; config keys in the router's config). Defaults: rtr_kvindex_weights_default.
typedef struct rtr_kvindex_weights {
  double overlap; // weight of the cached fraction of the prompt (llm-d's prefix scorer)
  double queue;   // weight of the queue term (llm-d's queue scorer)
  double free;    // weight of the free-KV fraction (llm-d's kv-cache utilization scorer)
} rtr_kvindex_weights;
rtr_kvindex_weights rtr_kvindex_weights_default(void); // {2, 1, 1}

// score = w.overlap * overlap / max(n_prompt_blocks, 1)
//       + w.queue   * 1 / (1 + queue_len)
//       + w.free    * free_blocks / max(total_blocks, 1)
// Each term lies in [0, 1] (inputs are clamped: negatives to 0, overlap to n_prompt_blocks, free to total);
// higher is better. With the defaults a worker holding the whole prompt beats an idle worker holding none
// unless it is heavily queued: full overlap is worth 2, an empty queue 1 versus 0.5 with one waiting.
double rtr_kvindex_score(const rtr_kvindex_weights *w, int overlap, int n_prompt_blocks, int queue_len,
                         int free_blocks, int total_blocks);

// One candidate worker's load, as the router last heard it (stats_ok).
typedef struct rtr_kvindex_load {
  int worker;       // index id
  int queue_len;    // running + waiting
  int free_blocks;
  int total_blocks;
} rtr_kvindex_load;

// The best of cands (n_cands) for a prompt with keys (n): highest score; ties go to the shorter queue,
// then the earlier candidate. Returns its position in cands (-1 when n_cands < 1) and, when overlap_out
// is not NULL, its overlap in blocks. w NULL: the defaults.
int rtr_kvindex_pick(const rtr_kvindex *x, const rtr_kvindex_weights *w, const uint64_t *keys, int n,
                     const rtr_kvindex_load *cands, int n_cands, int *overlap_out);

#ifdef __cplusplus
}
#endif
#endif
