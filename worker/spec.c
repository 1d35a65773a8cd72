// worker/spec.c: a sequence's draft into the step, and the verification of its rows (docs/design.md, "Speculative
// decoding").
#include "worker/spec.h"

#include <string.h>

int wrk_spec_draft(const spc_index *ix, wrk_seq *s, int k) {
  int32_t d[SPC_K_LIMIT];
  if (k > SPC_K_LIMIT) k = SPC_K_LIMIT;
  if (k < 1 || s->n_draft || s->n_toks - s->n_done != 1) return 0;
  int n = spc_propose(ix, s->toks, s->n_toks, k, d);
  for (int i = 0; i < n; i++)
    if (wrk_seq_push(s, d[i])) { // no room: no draft
      s->n_toks -= i;
      return 0;
    }
  s->n_draft = n;
  return n;
}

int wrk_spec_pays(int64_t drafted, int64_t accepted, double rho, int k_max) {
  if (!(rho < 1) || k_max < 1) return 0;
  double p = drafted < WRK_SPEC_PAYS_MIN_DRAFTED ? 1 : (double)accepted / (double)drafted, e = 0, pk = 1;
  int best = 0;
  for (int k = 1; k <= k_max; k++) {
    pk *= p;
    e += pk;
    if (e / k > rho) best = k; // E(k) / k falls with k: the last that passes is the longest
    else break;
  }
  return best;
}

void wrk_spec_verify(mdl_sampler *sp, const float *logits, int n_vocab, const int32_t *draft, int k, wrk_verdict *v) {
  memset(v, 0, sizeof *v);
  if (k < 0) k = 0;
  if (k > SPC_K_LIMIT) k = SPC_K_LIMIT;
  for (int j = 0; j <= k; j++) {
    mdl_sampled *t = &v->tok[j];
    mdl_sampler_sample(sp, logits + (size_t)j * (size_t)n_vocab, t);
    if (mdl_sampler_grammar_too_costly(sp)) { // plain decode would fail here, after emitting the tokens before it
      v->too_costly = 1;
      return;
    }
    v->grammar_done[j] = (uint8_t)mdl_sampler_grammar_done(sp);
    v->n = j + 1;
    if (j == k || t->token != draft[j]) return; // the bonus token, or the correction: the rest is rejected
    v->accepted++;
    if (v->grammar_done[j]) return; // the output is complete: nothing follows it
  }
}
