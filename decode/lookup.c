// decode/lookup.c: finding a decode worker's requests (running, waiting, in handoff) by predicate or by id.
#include "decode/worker_int.h"

#include <stdint.h>
#include <string.h>

// Calls fn on every request that matches (running, waiting, or in handoff); fn may drop it.
void dec__for_each(dec_worker *w, dec_seq_pred match, const void *arg, void (*fn)(dec_worker *, dec_seq *, void *),
                   void *fn_arg) {
  for (int i = w->n_handoffs - 1; i >= 0; i--)
    if (i < w->n_handoffs && match(w->handoffs[i], arg)) fn(w, w->handoffs[i], fn_arg);
  for (int l = 0; l < 2; l++) {
    wrk_seq **arr = l ? w->eng.wait : w->eng.run;
    int *n = l ? &w->eng.n_wait : &w->eng.n_run;
    for (int i = *n - 1; i >= 0; i--)
      if (i < *n && match(OWNER(arr[i]), arg)) fn(w, OWNER(arr[i]), fn_arg);
  }
}

int dec__has_id(const dec_seq *s, const void *arg) {
  const dec_id_key *k = arg;
  return !strcmp(s->req.id, k->id) && (!k->router || s->router == k->router) &&
         (!k->prefill || !strcmp(s->req.prefill, k->prefill));
}
int dec__routed_to(const dec_seq *s, const void *peer) { return s->router == peer; }
int dec__from_prefill(const dec_seq *s, const void *name) {
  return dec_state_in_handoff(s->state) && !strcmp(s->req.prefill, name);
}
int dec__any(const dec_seq *s, const void *arg) { (void)s; (void)arg; return 1; }
int dec__past_deadline(const dec_seq *s, const void *now) {
  return s->deadline_ms && *(const int64_t *)now > s->deadline_ms;
}
int dec__kv_overdue(const dec_seq *s, const void *now) {
  return dec_state_in_handoff(s->state) && *(const int64_t *)now > s->handoff_deadline_ms;
}

static void first_fn(dec_worker *w, dec_seq *s, void *out) {
  (void)w;
  if (!*(dec_seq **)out) *(dec_seq **)out = s;
}

dec_seq *dec__find(dec_worker *w, const dec_id_key *k) {
  dec_seq *found = NULL;
  dec__for_each(w, dec__has_id, k, first_fn, &found);
  return found;
}
