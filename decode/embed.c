// decode/embed.c: the decode worker's embeddings: a prompt run through the engine for its pooled hidden states, not
// generated from (generate's "embed", docs/openai.md and docs/protocol.md).
#include <stdlib.h>

#include "decode/worker_int.h"
#include "util/clock.h"
#include "worker/trace.h"

const char *dec__embed_init(dec_worker *w, dec_seq *s) {
  s->seq.pool = s->req.embed; // the forward pass pools the prompt's rows and returns no logits (mdl_pool_out)
  s->spec_on = 0;             // nothing is decoded
  s->seq.embd = calloc((size_t)mdl_llama_config(w->sh.rt->model)->n_embd, sizeof *s->seq.embd);
  return s->seq.embd ? NULL : "out of memory";
}

void dec__embed_answer(dec_worker *w, dec_seq *s) {
  const int n = mdl_llama_config(w->sh.rt->model)->n_embd;
  s->t_run_us = utl_now_us(); // the whole request was its prefill phase
  s->prefill_ms = (double)(s->t_run_us - s->t_recv_us) / 1000.0;
  wrk_trace_span(&w->sh, &s->req, "prefill", s->t_recv_us, s->t_run_us, "dserve.cached_tokens", 0);
  mdl_pool_finish(s->seq.embd, n, s->seq.pool, s->seq.n_toks);
  prt_done d = {.id = s->req.id, .prompt_tokens = s->req.n_prompt, .completion_tokens = 0, .cached_tokens = 0,
                .kv_bytes = 0, .kv_ms = 0, .prefill_ms = s->prefill_ms, .embedding = s->seq.embd, .n_embedding = n};
  cJSON *m = prt_done_encode(&d, NULL, 0);
  if (m) ctl_peer_send(s->router, m);
  else wrk_send_error(s->router, s->req.id, "internal_error", "out of memory");
  cJSON_Delete(m);
}
