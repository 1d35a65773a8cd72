// server/engine.h: continuous batching shared by every worker role: admission, chunked prefill, forward.
#ifndef DSERVE_SRV_ENGINE_H
#define DSERVE_SRV_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "models/llama.h"
#include "server/kvpool.h"
#include "server/prefix.h"
#include "server/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

// A sequence as the engine sees it: the tokens that must be in the KV cache, and how many already are.
typedef struct srv_seq {
  int32_t *toks;   // (owned) (cap) prompt then generated tokens
  int n_toks, cap;
  int n_done;      // tokens whose K/V are in the cache
  srv_blocks blocks;
  int n_cached;    // leading tokens whose K/V came from the prefix cache at admission
  int n_inserted;  // leading full blocks already offered to the prefix cache
  void *owner;     // (borrowed) the role's per-request state
} srv_seq;

int srv_seq_init(srv_seq *s, const int32_t *toks, int n, void *owner); // 0, -1 on out of memory
void srv_seq_fini(srv_seq *s, srv_kvpool *kv);                        // releases blocks and tokens
int srv_seq_push(srv_seq *s, int32_t tok);

typedef struct srv_engine {
  srv_runtime *rt;    // (borrowed)
  srv_seq **run;      // (owned array) (n_run) admitted sequences in admission order
  int n_run;
  srv_seq **wait;     // (owned array) (n_wait) FIFO waiting for KV blocks
  int n_wait;
  int cap;
  // The last step: rows of the batch, each with its sequence and chunk; logits (n_batch, n_vocab) for rows
  // with want_logits.
  mdl_seq *batch;      // (owned) (cap)
  srv_seq **batch_of;  // (owned) (cap)
  int *batch_chunk;    // (owned) (cap)
  int n_batch;
  float *logits;       // (owned) (cap_rows, n_vocab)
  int cap_rows;
  srv_prefix *prefix;  // (owned) cross-request block store; NULL when the worker's prefix_cache_mb is 0
  int32_t *match_ids;  // (owned) (cap_match) scratch for prefix matches
  int cap_match;
} srv_engine;

// Also opens the prefix cache sized from the worker's prefix_cache_mb.
int srv_engine_init(srv_engine *e, srv_runtime *rt, char *err, size_t errlen);
void srv_engine_fini(srv_engine *e); // the sequences themselves belong to the caller
int srv_engine_queue(srv_engine *e, srv_seq *s);   // waits for admission; -1 on out of memory
int srv_engine_start(srv_engine *e, srv_seq *s);   // joins the batch now (its blocks are already reserved)
void srv_engine_remove(srv_engine *e, srv_seq *s); // from either list; releases its blocks
// Admits waiting sequences while blocks and batch slots last, reusing the longest cached prefix of each
// (its n_done and n_cached start past it) and evicting unused cached blocks when the pool is short.
// A sequence that can never fit (the pool is too small even when idle) is removed and passed to reject.
void srv_engine_admit(srv_engine *e, void (*reject)(void *arg, srv_seq *s, int blocks_needed), void *arg);
// What admission does for one sequence that holds no blocks: take its longest cached prefix (n_done and
// n_cached move past it) and reserve blocks for the rest of its tokens, evicting unused cached blocks if
// needed. 0, or -1 with nothing held when the pool is short. A sequence queued with leading blocks already
// in its table (n_done past them: a prefix a prefill worker fetched from a peer) is not matched again: only
// the rest is reserved (on -1 it holds nothing, and is matched like any other next time).
int srv_engine_take_blocks(srv_engine *e, srv_seq *s);
// Runs one forward step (decode tokens first, then prefill chunks up to max_batch_tokens). Blocks that
// decode growth needs are taken from the newest sequences (recompute preemption). 0 when nothing ran
// (n_batch == 0), 1 after a step, -1 on error.
int srv_engine_step(srv_engine *e, mdl_layer_done_fn on_layer, void *arg, char *err, size_t errlen);
// srv_engine_step in two halves, for callers that look at the planned batch before it runs:
int srv_engine_plan(srv_engine *e); // fills batch / batch_of / batch_chunk; returns n_batch
int srv_engine_forward(srv_engine *e, mdl_layer_done_fn on_layer, void *arg, char *err, size_t errlen); // 0 / -1
int srv_engine_busy(const srv_engine *e);
// Adds the prefix cache's counters to a stats_ok message: prefix_hits / prefix_queries (tokens served from
// the cache / prompt tokens looked up, running totals) and prefix_cached_blocks; with a cache also
// prefix_tiers {"pool"|"host"|"disk": {hits, queries (tokens, running totals), blocks (resident now)}} for
// each configured tier (srv_prefix_stats.hit_tokens / tier_query_tokens / blocks).
void srv_engine_add_prefix_stats(const srv_engine *e, cJSON *msg);

#ifdef __cplusplus
}
#endif
#endif
