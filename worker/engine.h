// worker/engine.h: continuous batching shared by every worker role: admission, chunked prefill, forward.
#ifndef DSERVE_WRK_ENGINE_H
#define DSERVE_WRK_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "models/llama.h"
#include "worker/kvpool.h"
#include "worker/prefix.h"
#include "worker/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

// A sequence as the engine sees it: the tokens that must be in the KV cache, and how many already are.
typedef struct wrk_seq {
  int32_t *toks;   // (owned) (cap) prompt then generated tokens
  int n_toks, cap;
  int n_done;      // tokens whose K/V are in the cache
  wrk_blocks blocks;
  int n_cached;    // leading tokens whose K/V came from the prefix cache at admission
  int n_inserted;  // leading full blocks already offered to the prefix cache
  void *owner;     // (borrowed) the role's per-request state
} wrk_seq;

int wrk_seq_init(wrk_seq *s, const int32_t *toks, int n, void *owner); // 0, -1 on out of memory
void wrk_seq_fini(wrk_seq *s, wrk_kvpool *kv);                        // releases blocks and tokens
int wrk_seq_push(wrk_seq *s, int32_t tok);

typedef struct wrk_engine {
  wrk_runtime *rt;    // (borrowed)
  wrk_seq **run;      // (owned array) (n_run) admitted sequences in admission order
  int n_run;
  wrk_seq **wait;     // (owned array) (n_wait) FIFO waiting for KV blocks
  int n_wait;
  int cap;
  // The last step: rows of the batch, each with its sequence and chunk; logits (n_batch, n_vocab) for rows
  // with want_logits.
  mdl_seq *batch;      // (owned) (cap)
  wrk_seq **batch_of;  // (owned) (cap)
  int *batch_chunk;    // (owned) (cap)
  int n_batch;
  float *logits;       // (owned) (cap_rows, n_vocab)
  int cap_rows;
  wrk_prefix *prefix;  // (owned) cross-request block store; NULL when the worker's prefix_cache_mb is 0
  int32_t *match_ids;  // (owned) (cap_match) scratch for prefix matches
  int cap_match;
} wrk_engine;

// Also opens the prefix cache sized from the worker's prefix_cache_mb.
int wrk_engine_init(wrk_engine *e, wrk_runtime *rt, char *err, size_t errlen);
void wrk_engine_fini(wrk_engine *e); // the sequences themselves belong to the caller
int wrk_engine_queue(wrk_engine *e, wrk_seq *s);   // waits for admission; -1 on out of memory
int wrk_engine_start(wrk_engine *e, wrk_seq *s);   // joins the batch now (its blocks are already reserved)
void wrk_engine_remove(wrk_engine *e, wrk_seq *s); // from either list; releases its blocks
// Admits waiting sequences while blocks and batch slots last, reusing the longest cached prefix of each
// (its n_done and n_cached start past it) and evicting unused cached blocks when the pool is short.
// A sequence that can never fit (the pool is too small even when idle) is removed and passed to reject.
void wrk_engine_admit(wrk_engine *e, void (*reject)(void *arg, wrk_seq *s, int blocks_needed), void *arg);
// What admission does for one sequence that holds no blocks: take its longest cached prefix (n_done and
// n_cached move past it) and reserve blocks for the rest of its tokens, evicting unused cached blocks if
// needed. 0, or -1 with nothing held when the pool is short. A sequence queued with leading blocks already
// in its table (n_done past them: a prefix a prefill worker fetched from a peer) is not matched again: only
// the rest is reserved (on -1 it holds nothing, and is matched like any other next time).
int wrk_engine_take_blocks(wrk_engine *e, wrk_seq *s);
// Runs one forward step (decode tokens first, then prefill chunks up to max_batch_tokens). Blocks that
// decode growth needs are taken from the newest sequences (recompute preemption). 0 when nothing ran
// (n_batch == 0), 1 after a step, -1 on error.
int wrk_engine_step(wrk_engine *e, mdl_layer_done_fn on_layer, void *arg, char *err, size_t errlen);
// wrk_engine_step in two halves, for callers that look at the planned batch before it runs:
int wrk_engine_plan(wrk_engine *e); // fills batch / batch_of / batch_chunk; returns n_batch
int wrk_engine_forward(wrk_engine *e, mdl_layer_done_fn on_layer, void *arg, char *err, size_t errlen); // 0 / -1
int wrk_engine_busy(const wrk_engine *e);
// Adds the prefix cache's counters to a stats_ok message: prefix_hits / prefix_queries (tokens served from
// the cache / prompt tokens looked up, running totals) and prefix_cached_blocks; with a cache also
// prefix_tiers {"pool"|"host"|"disk": {hits, queries (tokens, running totals), blocks (resident now)}} for
// each configured tier (wrk_prefix_stats.hit_tokens / tier_query_tokens / blocks).
void wrk_engine_add_prefix_stats(const wrk_engine *e, cJSON *msg);

#ifdef __cplusplus
}
#endif
#endif
