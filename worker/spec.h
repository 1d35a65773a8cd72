// worker/spec.h: speculative decoding in the step: proposing a sequence's draft and verifying it against its logits.
#ifndef DSERVE_WRK_SPEC_H
#define DSERVE_WRK_SPEC_H

#include <stdint.h>

#include "models/sampler.h"
#include "spec/spec.h"
#include "worker/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

// Proposes up to k tokens after s's tokens (spc_propose over ix, which may be NULL: prompt lookup only) and appends
// them to s as its draft (s->n_draft): the next step computes them with its decode token. Returns how many.
int wrk_spec_draft(const spc_index *ix, wrk_seq *s, int k);

// The longest draft (0..k_max) that pays for itself: with a per-token acceptance p (accepted / drafted so far; a
// sequence with fewer than WRK_SPEC_PAYS_MIN_DRAFTED drafted tokens counts as p = 1), a draft of k is expected to keep
// E(k) = p + p^2 + ... + p^k tokens, and pays while E(k) / k > rho (wrk_draft_rho). rho >= 1: 0.
#define WRK_SPEC_PAYS_MIN_DRAFTED 8
int wrk_spec_pays(int64_t drafted, int64_t accepted, double rho, int k_max);

// What verification of one sequence's draft decided: the tokens to emit in order, exactly those plain decode would
// have sampled one step at a time.
typedef struct wrk_verdict {
  mdl_sampled tok[SPC_K_LIMIT + 1]; // (n)
  uint8_t grammar_done[SPC_K_LIMIT + 1]; // (n) mdl_sampler_grammar_done right after tok[i] was sampled
  int n;          // tokens to emit (0 only when the first sample found the grammar too costly)
  int accepted;   // drafted tokens among them (n, or n - 1 when the last is the correction or the bonus token)
  int too_costly; // the grammar proved too costly sampling token n: after emitting the n before it, the request fails
} wrk_verdict;

// Verifies draft (k tokens) with the k + 1 rows of logits (k + 1, n_vocab) the step computed for the sequence's
// decode token and its draft: for j = 0..k, samples row j with sp (its state is plain decode's: grammar, penalties,
// the draw of that output position); when j < k and the sample is draft[j] it is accepted and row j + 1 is next,
// else the sample ends the run as the correction (j < k) or the bonus token (j == k). Also ends after a sample that
// completes the grammar. Only emitted tokens are ever sampled, so sp is left as plain decode leaves it.
void wrk_spec_verify(mdl_sampler *sp, const float *logits, int n_vocab, const int32_t *draft, int k, wrk_verdict *v);

#ifdef __cplusplus
}
#endif
#endif
