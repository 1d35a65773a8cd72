// spec/spec.h: model-free drafts for speculative decoding: prompt lookup in the sequence itself and a suffix index over
// recent requests' outputs, and how many tokens each sequence should draft from its recent acceptance.
#ifndef DSERVE_SPC_SPEC_H
#define DSERVE_SPC_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Threads: nothing here locks. A worker keeps one spc_index and calls every function below from its step thread.
// spc_propose only reads the index, so several proposals may run at once (e.g. on the step's thread pool) as long as
// no spc_index_add runs beside them; an spc_seq belongs to its sequence and is touched by one thread at a time.
// Nothing here allocates after spc_index_new: propose, add, want and update are O(n) or better and cannot fail.

// Defaults, the one place they are set (config/ and the CLI read these).
#define SPC_DEF_K_MAX 8                       // drafted tokens per sequence per step, at most
#define SPC_DEF_INDEX_BYTES ((size_t)8 << 20) // the suffix index's memory, all of it (table and tokens)
#define SPC_DEF_NGRAM_MIN 2                   // the shortest suffix that may propose (1 proposes on any repeated token)
#define SPC_DEF_NGRAM_MAX 5                   // the longest suffix looked for (longer matches win)
#define SPC_K_LIMIT 32                        // k_max's ceiling (a step's verification rows grow with it)
#define SPC_NGRAM_LIMIT 16                    // ngram_max's ceiling
#define SPC_INDEX_MIN_BYTES ((size_t)64 << 10) // the smallest index_bytes accepted (0: no suffix index)

typedef struct spc_cfg {
  int k_max;          // 1..SPC_K_LIMIT
  size_t index_bytes; // 0 (prompt lookup only) or >= SPC_INDEX_MIN_BYTES; the index never holds more than this
  int ngram_min;      // 1..ngram_max
  int ngram_max;      // ngram_min..SPC_NGRAM_LIMIT
} spc_cfg;

// c = the defaults above.
void spc_cfg_default(spc_cfg *c);
// 0, or -1 with err naming the field and its allowed range.
int spc_cfg_check(const spc_cfg *c, char *err, size_t errlen) UTL_WARN_UNUSED;

// One per worker: the outputs (and prompt tails) of its recent requests, in a token ring with a hashed n-gram table
// beside it (n-gram -> where its most recent occurrence ended). Memory is allocated once by spc_index_new and never
// grows: the oldest tokens are overwritten first, and a table slot keeps the most recent n-gram that hashed to it.
typedef struct spc_index spc_index;

// Checks c (spc_cfg_check) and allocates the index. 0, or -1 with err.
int spc_index_new(const spc_cfg *c, spc_index **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void spc_index_free(spc_index *ix); // NULL is a no-op
size_t spc_index_bytes(const spc_index *ix); // what it holds in memory, all of it (<= cfg.index_bytes)
const spc_cfg *spc_index_cfg(const spc_index *ix);

// A finished request's tokens (its prompt's tail and its output) into the index, as one document: a draft never runs
// from one document into the next. Beyond the index's capacity the oldest documents' tokens are evicted first; a
// document longer than the whole ring keeps its last tokens. Token ids are >= 0 (a negative id is skipped over as a
// boundary). n <= 0 or a NULL ix or toks: nothing.
void spc_index_add(spc_index *ix, const int32_t *toks, int n);

// Up to k tokens that may follow toks (n of them: the prompt and the output so far). The suffix of toks of the
// longest length L in [ngram_max .. ngram_min] that occurred earlier proposes what followed it:
// - prompt lookup: its most recent earlier occurrence in toks itself; the draft stops at toks' end (it never proposes
//   a token that is not in toks[0..n-1]);
// - the suffix index (ix may be NULL: prompt lookup only, with the default n-gram lengths): its most recent occurrence in a recent document; the draft
//   stops at that document's end.
// The longer match wins; on equal lengths prompt lookup. Writes draft[0..ret-1] and returns ret (0..k; 0: nothing to
// propose). k <= 0, n < 1, a NULL toks or draft: 0.
int spc_propose(const spc_index *ix, const int32_t *toks, int n, int k, int32_t *draft);

// Per sequence (flat, embedded in the worker's sequence): how well its drafts have done, and so how many to draft.
// k doubles after a draft accepted whole, falls to about the recent accepted length after a partial one; after
// SPC_OFF_AFTER drafts in a row with nothing accepted the sequence stops drafting, then probes with SPC_PROBE_K tokens
// after `interval` steps (doubling up to SPC_PROBE_MAX_STEPS while probes keep failing; one accepted token resets it).
#define SPC_OFF_AFTER 3
#define SPC_PROBE_K 2
#define SPC_PROBE_MIN_STEPS 8
#define SPC_PROBE_MAX_STEPS 256
typedef struct spc_seq {
  int k_max;        // from the config
  int k;            // tokens to draft now; 0 while off (probing instead)
  int fails;        // drafts in a row with nothing accepted
  int quiet;        // steps since it went off or last probed (counted while off)
  int interval;     // steps between probes while off
  float acc_ewma;   // accepted tokens per draft, exponentially weighted (weight 1/4 on the newest)
  int64_t drafts;   // verified drafts (drafted > 0), tokens drafted and accepted: for the access line and counters
  int64_t drafted;
  int64_t accepted;
} spc_seq;

// A new sequence starts drafting min(4, c->k_max) tokens.
void spc_seq_init(spc_seq *s, const spc_cfg *c);

// How many tokens to draft for s in this step (0..k_cap): s->k while on; while off SPC_PROBE_K once `interval` steps
// have passed, else 0. k_cap is the step scheduler's budget for this sequence (0 under load: no drafting).
int spc_want(const spc_seq *s, int k_cap);

// After each decode step of the sequence: drafted tokens and how many of them verification accepted (0 <= accepted <=
// drafted). drafted 0 (no draft this step) counts a step towards the next probe; out-of-range values are clamped.
void spc_seq_update(spc_seq *s, int drafted, int accepted);

#ifdef __cplusplus
}
#endif
#endif
