// decode/batch.c: a step's tokens, one token_batch message per router (docs/protocol.md): collected while the step
// samples, sent when it ends or before a done or error to the same router.
#include "decode/worker_int.h"
#include "proto/request.h"
#include "util/vec.h"

// Sends the step's batch for router p (all routers' when p is NULL).
void dec__flush_tokens(dec_worker *w, ctl_peer *p) {
  for (int i = 0; i < w->n_batches; i++) {
    struct dec_tok_batch *b = &w->batches[i];
    if (!b->msg || (p && b->to != p)) continue;
    if (prt_tokens_count(b->msg) > 0) ctl_peer_send(b->to, b->msg);
    cJSON_Delete(b->msg);
    b->msg = NULL;
  }
  if (!p) w->n_batches = 0;
}

// Adds tm to the step's batch for s's router: 0, or -1 (out of memory: the caller sends it alone).
int dec__batch_token(dec_worker *w, dec_seq *s, const prt_token *tm) {
  struct dec_tok_batch *b = NULL;
  for (int i = 0; i < w->n_batches && !b; i++)
    if (w->batches[i].to == s->router) b = &w->batches[i];
  if (!b) {
    if (UTL_VEC_PUSH(w->batches, w->n_batches, w->cap_batches, ((struct dec_tok_batch){s->router, NULL}))) return -1;
    b = &w->batches[w->n_batches - 1];
  }
  if (!b->msg && !(b->msg = prt_tokens_new())) return -1;
  return prt_tokens_add(b->msg, tm);
}
