// decode/spec.c: speculative decoding on a decode or both worker: which sequences draft and how much, and the verdict
// on a drafted row (docs/design.md, "Speculative decoding").
#include <string.h>

#include "decode/worker_int.h"
#include "util/log.h"

// The prompt tokens a finished request leaves in the suffix index beside its output.
#define SPEC_PROMPT_TAIL 256

int dec__spec_open(dec_worker *w, char *err, size_t errlen) {
  const cfg_worker *wc = w->sh.wc;
  if (!strcmp(wc->spec, "off")) return 0; // anything else is "auto" (a config made without the file: CFG_DEF_SPEC)
  // Exactness rests on a row's logits not depending on its step: the cpu tables compute each row alone; amx rounds
  // prefill-sized matmuls differently from decode rows, and the cuda table's batch invariance is not tested, so there
  // auto drafts nothing rather than risk a different answer.
  const char *be = w->sh.rt->kc.be->name;
  if (!strcmp(be, "amx") || !strcmp(be, "cuda")) {
    utl_log(wc->name, "speculative decoding off: the %s kernels do not give a row the same logits in every step", be);
    return 0;
  }
  spc_cfg sc;
  spc_cfg_default(&sc);
  return spc_index_new(&sc, &w->spec, err, errlen);
}

void dec__spec_seq_init(dec_worker *w, dec_seq *s) {
  s->spec_on = w->spec && !s->req.no_spec;
  if (w->spec) spc_seq_init(&s->spc, spc_index_cfg(w->spec));
}

// As long as its own length (spc_want), what it may still emit and the step's cost allow: wrk_spec_pays keeps the
// drafts whose acceptance so far beats what a drafted token costs this step (wrk_engine_draft_rho: under load, little
// or nothing).
void dec__spec_propose(dec_worker *w) {
  if (!w->spec) return;
  int k_max = spc_index_cfg(w->spec)->k_max;
  double rho = wrk_engine_draft_rho(&w->eng);
  for (int i = 0; i < w->eng.n_run; i++) {
    wrk_seq *sq = w->eng.run[i];
    dec_seq *s = OWNER(sq);
    if (!s->spec_on || sq->n_toks - sq->n_done != 1) continue;
    int cap = wrk_spec_pays(s->spc.drafted, s->spc.accepted, rho, k_max);
    int room = s->req.max_tokens - s->n_gen - 1, ctx = w->sh.rt->n_ctx - sq->n_toks - 1; // never past max_tokens
    if (room < cap) cap = room;
    if (ctx < cap) cap = ctx;
    if (wrk_spec_draft(w->spec, sq, spc_want(&s->spc, cap > 0 ? cap : 0)) == 0)
      spc_seq_update(&s->spc, 0, 0); // a step without a draft: counts towards the next probe (spec/spec.h)
  }
}

void dec__spec_verdict(dec_seq *s, const float *logits, int n_vocab, wrk_verdict *v) {
  wrk_seq *sq = &s->seq;
  int k = sq->n_draft;
  int32_t draft[SPC_K_LIMIT];
  memcpy(draft, sq->toks + sq->n_done, (size_t)k * sizeof *draft);
  wrk_seq_drop_draft(sq); // emission pushes the accepted tokens again, then the correction or bonus
  wrk_spec_verify(s->sampler, logits, n_vocab, draft, k, v);
  spc_seq_update(&s->spc, k, v->accepted); // its counts go to the router in done: the access line and the counters
}

void dec__spec_remember(dec_worker *w, const dec_seq *s) {
  if (!w->spec) return;
  int from = s->req.n_prompt > SPEC_PROMPT_TAIL ? s->req.n_prompt - SPEC_PROMPT_TAIL : 0;
  spc_index_add(w->spec, s->seq.toks + from, s->seq.n_toks - from);
}
