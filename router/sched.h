// router/sched.h: the scheduling policy: which worker(s) a request choice goes to (by load, or KV-aware).
#ifndef DSERVE_RTR_SCHED_H
#define DSERVE_RTR_SCHED_H

#include <stdint.h>

#include "config/config.h"
#include "router/kvindex.h"

#ifdef __cplusplus
extern "C" {
#endif

// What the router knows of one worker when it picks.
typedef struct rtr_sched_worker {
  int up;          // link connected and hello_ok received
  cfg_role role;
  int running;     // from its last stats
  int waiting;
  int free_blocks, total_blocks;
  int inflight;    // choices the router has sent it and not seen finish
  int block_size;  // its KV block size (hello_ok kv_layout.block_size); < 1 means 16
  int kv_type;     // its pool's kv_type (hello_ok kv_layout.type, ggml's numbering): a prefill worker is paired only
                   // with a decode worker of the same type and block size (their link refuses any other)
  int n_layer, kv_parts, kv_width, kv_groups; // hello_ok kv_layout's shape (0 when absent): paired only when equal,
                   // as their link refuses another (a latent cache of an MLA model is never read as K and V)
} rtr_sched_worker;

typedef struct rtr_sched_target {
  int decode;  // index of the worker that generates (a both worker, or a decode worker)
  int prefill; // index of the prefill worker, or -1: the decode/both worker prefills itself (mode "local")
} rtr_sched_target;

// Conditional disaggregation (docs/design.md "When disaggregation pays"): whether a prompt that a decode worker could
// prefill itself goes to a prefill worker instead. Both policies need at least min_tokens uncached prompt tokens
// (fewer cost less to compute where they are than to hand off). policy "threshold" asks nothing more; "auto" also
// asks that the decode worker be busy (sequences running, waiting or sent to it: an idle one prefills as fast as the
// prefill worker and skips the transfer) and that the prefill worker's queue (inflight + waiting) be at most
// max_prefill_queue (a longer one makes the prompt wait longer than local prefill chunks delay the decode steps).
typedef struct rtr_disagg_rule {
  cfg_disagg_policy policy;
  int min_tokens;        // router.disagg_threshold
  int max_prefill_queue; // router.disagg_max_prefill_queue (policy auto)
} rtr_disagg_rule;

// 1 when a prompt with n_uncached tokens not cached on decode worker dec goes to prefill worker pre (both up).
int rtr_sched_disagg(const rtr_disagg_rule *rule, int n_uncached, const rtr_sched_worker *dec,
                     const rtr_sched_worker *pre);

// Picks for a prompt of n_prompt tokens among w (n). A `both` worker with the least load (inflight + running +
// waiting) when there is one; otherwise the decode worker with the fewest running sequences (ties: most free blocks),
// paired with the prefill worker with the shortest queue when one is up and rtr_sched_disagg says so for the whole
// prompt. 0 with *out, -1 when no worker that can generate is up.
int rtr_sched_pick(const rtr_sched_worker *w, int n, int n_prompt, const rtr_disagg_rule *rule,
                   rtr_sched_target *out);

// KV-aware: the same shape of choice as rtr_sched_pick (both worker if any is up; else decode worker, with a
// prefill worker when one is up and rtr_sched_disagg says so for the prompt less what the decode worker that would
// prefill it locally holds in cache), but the worker that prefills (the both
// worker; the prefill worker of a pair; the decode worker in mode local) is the eligible one with the best
// rtr_kvindex_score: x holds worker i's keys under id i, the prompt's keys come from kv_blockhash_chain with
// that worker's block size, queue = inflight + running + waiting (prefill: inflight + waiting). Ties: shorter
// queue, then lower index. The decode side of a pair stays by load. x NULL, or no memory for the keys: load
// only (rtr_sched_pick). wt NULL: rtr_kvindex_weights_default. *overlap_out (may be NULL): the chosen
// worker's cached overlap in blocks. 0 with *out, -1 when no worker that can generate is up.
int rtr_sched_pick_kv(const rtr_sched_worker *w, int n, const int32_t *prompt /* (n_prompt) */, int n_prompt,
                      const rtr_disagg_rule *rule, const rtr_kvindex *x, const rtr_kvindex_weights *wt,
                      rtr_sched_target *out, int *overlap_out);

// Prefix fetch (router.prefix_fetch): when prefill worker `chosen` (role prefill) is to compute the prompt, the
// other up prefill worker with the same block size whose index overlap with the prompt is the longest, if it
// exceeds chosen's own overlap by at least min_blocks. Returns its index and *blocks_out its overlap in blocks
// (at most (n_prompt - 1) / block_size: the last token is always computed), or -1 (*blocks_out 0) when no
// peer is worth asking, x is NULL, or memory for the prompt's keys is short.
int rtr_sched_prefix_peer(const rtr_sched_worker *w, int n, const int32_t *prompt /* (n_prompt) */, int n_prompt,
                          const rtr_kvindex *x, int chosen, int min_blocks, int *blocks_out);

#ifdef __cplusplus
}
#endif
#endif
