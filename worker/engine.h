// worker/engine.h: continuous batching shared by every worker role: admission, chunked prefill, forward.
#ifndef DSERVE_WRK_ENGINE_H
#define DSERVE_WRK_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kv/pool.h"
#include "kv/prefix.h"
#include "models/llama.h"
#include "proto/stats.h"
#include "util/err.h"
#include "worker/kvtier.h"
#include "worker/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

// A sequence as the engine sees it: the tokens that must be in the KV cache, and how many already are.
typedef struct wrk_seq {
  int32_t *toks;   // (owned) (cap) prompt then generated tokens
  int n_toks, cap;
  int n_done;      // tokens whose K/V are in the cache
  kv_blocks blocks;
  int n_cached;    // leading tokens whose K/V came from the prefix cache at admission
  int n_inserted;  // leading full blocks already offered to the prefix cache
  int no_reuse;    // 1: some blocks lack KV of layers that never read them again (a window-only handoff,
                   // kv/wire.h): none is offered to the prefix cache
  int kv_from_peer; // 1: the prompt's K and V come from a peer (a handoff): its whole table is taken at once, and
                    // with layer groups the blocks before the window get no window pages (kv/pool.h)
  int cannot_grow; // set by wrk_engine_plan: its next step needs more KV blocks than the whole pool holds, so no
                   // eviction or preemption can make room; it stays in run, computing nothing, until the role ends
                   // it (a decode worker: finish_reason "length", as at the model's context length)
  int n_draft;     // speculative decoding: the last n_draft of toks are a draft the role proposed after the token to
                   // decode (n_toks == n_done + 1 + n_draft); the step computes all 1 + n_draft rows and returns their
                   // logits; n_done then passes the decoded token only, until wrk_engine_accept (docs/design.md)
  // The shared KV tier (worker/kvtier.h), set at admission: blocks [n_stored, store_upto / block_size) are written
  // behind once computed (store_upto: the tokens known at admission, a prompt's; never the decode's output);
  // store_tokens of n_cached came from the store, read over [store_t0_us, store_t1_us] (0: no read).
  int n_stored, store_upto, store_tokens;
  int64_t store_t0_us, store_t1_us;
  int pool;        // an embedding (MDL_POOL_*, 0: none): its prompt's steps pool their hidden states into embd and
                   // return no logits; it neither reuses nor offers cached prefix blocks (a cached prefix has no
                   // hidden states to pool, and an embedding is one step of no later use)
  float *embd;     // (owned) (n_embd) when pool: the pooled rows so far (mdl_pool_out)
  void *owner;     // (borrowed) the role's per-request state
} wrk_seq;

int wrk_seq_init(wrk_seq *s, const int32_t *toks, int n, void *owner) UTL_WARN_UNUSED; // 0, -1 on out of memory
void wrk_seq_fini(wrk_seq *s, kv_pool *kv);                        // releases blocks and tokens
int wrk_seq_push(wrk_seq *s, int32_t tok) UTL_WARN_UNUSED;

// The step-cost model of the step scheduler: the predicted wall time of one engine step is
// fixed_ms + per_tok_ms * tokens + per_kpair_ms * kpairs, where tokens are its rows' tokens (decode tokens plus
// prefill chunk tokens) and kpairs its attention's query-key pairs in thousands (wrk_row_kpairs). The pair term is
// the attention, whose cost grows with the position: a chunk after a 1000-token prefix costs 1.5-2.7x the same chunk
// at a prompt's start (SmolLM2, `dserve generate --bench-chunks`, bench/README.md "Issue 32"), which a per-token
// cost alone cannot say. Fitted by exponentially weighted least squares over the worker's own measured steps, so
// recent steps weigh most and the fit follows a machine whose load changes. Pure arithmetic: tests feed it
// synthetic timings.
typedef struct wrk_stepcost {
  double decay;                // weight an observation keeps per later one (0.98: about the last 50 steps)
  double sw, sx, sz, sy;       // weighted sums of 1, tokens, kpairs, ms
  double sxx, sxz, szz, sxy, szy; // and of their products
  int n;                       // steps observed
  double fixed_ms, per_tok_ms, per_kpair_ms; // the current fit (all >= 0; per_tok_ms > 0 once n > 0)
} wrk_stepcost;

#define WRK_STEPCOST_DECAY 0.98
#define WRK_MIN_PREFILL_CHUNK 32 // prefill tokens a step always gets, so prompts progress under any target

// The attention's query-key pairs (thousands) of a row of n tokens from position pos0: each token reads every
// position before it and itself.
double wrk_row_kpairs(int pos0, int n);
void wrk_stepcost_init(wrk_stepcost *c, double decay);
void wrk_stepcost_observe(wrk_stepcost *c, int tokens, double kpairs, double ms);
double wrk_stepcost_predict(const wrk_stepcost *c, int tokens, double kpairs); // ms; 0 before any observation
// The prefill chunk of a prompt at position pos with `pending` prompt tokens left, in a step that already holds
// `tokens` tokens and `kpairs` pairs, with room tokens left under max_batch_tokens (the hard cap): the most tokens
// whose step is predicted to fit in target_ms, but at least min_chunk (the step's first prefill row; 0 for later
// ones) and never more than pending or room. min(pending, room) when the target is off (<= 0: also what the
// caller passes when nothing decodes, as there is no token latency to protect) or before the first observation.
// Decode rows are never cut by it: the planner gives every decode row its token whatever the target.
int wrk_step_chunk(const wrk_stepcost *c, double target_ms, int tokens, double kpairs, int pos, int pending, int room,
                   int min_chunk);

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
  mdl_pool_out *batch_pool; // (owned) (cap) each row's embedding output (wrk_seq.pool); read when batch_pooled
  int batch_pooled;
  int n_batch;
  float *logits;       // (owned) (cap_rows, n_vocab)
  int cap_rows;
  kv_prefix *prefix;  // (owned) cross-request block store; NULL when the worker's prefix_cache_mb is 0
  wrk_kvtier *kvt;     // (owned) the shared KV tier (config "kvstore", prefill and both workers); NULL without
  int32_t *match_ids;  // (owned) (cap_match) scratch for prefix matches
  int cap_match;
  // Step scheduler (the worker's tpot_target_ms): each step's cycle, from the start of its forward to the start
  // of the next one (so sampling, streaming and admission count too: that interval is the time per output
  // token), feeds the cost model; a gap with no step in it (idle) is not measured.
  wrk_stepcost cost;
  double step_t0_ms;   // monotonic ms when the last forward began; 0 = no step to time
  int step_tokens;     // tokens of that step
  double step_kpairs;  // and its attention pairs (thousands)
} wrk_engine;

// Also opens the prefix cache sized from the worker's prefix_cache_mb, with its host and disk tiers: -1 with err
// (naming the worker and the tier's error) when one cannot be opened; the worker must not start without it. With a
// "kvstore" section a prefill or both worker also opens the shared KV tier (an unreachable store is only a warning).
int wrk_engine_init(wrk_engine *e, wrk_runtime *rt, char *err, size_t errlen) UTL_WARN_UNUSED;
void wrk_engine_fini(wrk_engine *e); // the sequences themselves belong to the caller
int wrk_engine_queue(wrk_engine *e, wrk_seq *s) UTL_WARN_UNUSED;   // waits for admission; -1 on out of memory
// Joins the batch now (its blocks are already reserved)
int wrk_engine_start(wrk_engine *e, wrk_seq *s) UTL_WARN_UNUSED;
void wrk_engine_remove(wrk_engine *e, wrk_seq *s); // from either list; releases its blocks
// Admits waiting sequences while blocks and batch slots last, reusing the longest cached prefix of each
// (its n_done and n_cached start past it) and evicting unused cached blocks when the pool is short.
// A sequence that can never fit (the pool is too small even when idle) is removed and passed to reject; one that
// fits an empty pool waits, in order, while anything but the prefix store holds blocks (running sequences,
// handoffs waiting for their KV, pushes in flight): it is never refused for what others hold.
void wrk_engine_admit(wrk_engine *e, void (*reject)(void *arg, wrk_seq *s, int blocks_needed), void *arg);
// What admission does for one sequence that holds no blocks: take its longest cached prefix (n_done and
// n_cached move past it) and reserve blocks for the rest of its tokens, evicting unused cached blocks if
// needed; after the pool, host and disk tiers (and a peer's fetched blocks), the shared KV tier's run of the next full
// blocks. 0, or -1 with nothing held when the pool is short. A sequence queued with leading blocks already
// in its table (n_done past them: a prefix a prefill worker fetched from a peer) is not matched again: only
// the rest is reserved (on -1 it holds nothing, and is matched like any other next time).
int wrk_engine_take_blocks(wrk_engine *e, wrk_seq *s) UTL_WARN_UNUSED;
// Runs one forward step (decode tokens first, then prefill chunks in admission order up to max_batch_tokens, and
// with tpot_target_ms while sequences decode what wrk_step_chunk allows). Blocks that decode growth needs are taken from the newest
// sequences (recompute preemption); a sequence that needs more than the whole pool gets cannot_grow instead (and
// takes nothing from the others). 0 when nothing ran (n_batch == 0), 1 after a step, -1 on error.
int wrk_engine_step(wrk_engine *e, mdl_layer_done_fn on_layer, void *arg, char *err, size_t errlen) UTL_WARN_UNUSED;
// wrk_engine_step in two halves, for callers that look at the planned batch before it runs:
int wrk_engine_plan(wrk_engine *e); // fills batch / batch_of / batch_chunk; returns n_batch
// 0 / -1
int wrk_engine_forward(wrk_engine *e, mdl_layer_done_fn on_layer, void *arg, char *err, size_t errlen) UTL_WARN_UNUSED;
int wrk_engine_busy(const wrk_engine *e);
// Speculative decoding: what drafting costs the next step. A drafted token adds per_tok_ms to a step that produces
// n_decode tokens in T0 = predict(base_tokens) ms (base: the decode tokens and the prefill the step computes
// anyway), so drafts raise the step's output rate only when they are accepted at a rate above
// rho = per_tok_ms * n_decode / T0 (tokens out per ms before and after: n / T0 < (n + a) / (T0 + per_tok_ms k) iff
// a / k > rho). Returns rho in [0, 1]: near 0 where a step is memory-bound (a GPU at small batch: extra rows are
// almost free), near 1 where it is compute-bound (many sequences, prefill rows, a CPU): then drafting pays only for
// drafts that nearly always hold. Before the model separates a fixed cost from the per-token one (no observation, or
// a fit through the origin because every step had the same size), rho is 0 under light load (base_tokens <= 8:
// drafting also gives the fit steps of other sizes) and 1 otherwise. Pure arithmetic over the cost model.
double wrk_draft_rho(const wrk_stepcost *c, int base_tokens, int n_decode);
double wrk_engine_draft_rho(const wrk_engine *e);
// After the role verified s's draft (its 1 + n_draft rows of logits): the draft is taken out of toks (n_draft 0) and
// the role pushes what it emits. Then wrk_engine_accept(e, s, m): the first m drafted tokens (which the role has
// pushed again, as emitted) were accepted, their K and V from the step stand (n_done moves past them); the blocks
// only rejected positions needed go back to the pool, and the prefix store sees accepted positions only.
void wrk_seq_drop_draft(wrk_seq *s);
void wrk_engine_accept(wrk_engine *e, wrk_seq *s, int m);
// The prefix cache's counters for stats_ok (proto/stats.h): prefix_hits / prefix_queries (tokens served from the
// cache / prompt tokens looked up, running totals) and prefix_cached_blocks; with a cache also each configured
// tier's hits, queries (tokens, running totals) and blocks (resident now) (kv_prefix_stats).
void wrk_engine_prefix_stats(const wrk_engine *e, prt_stats_ok *out);

#ifdef __cplusplus
}
#endif
#endif
