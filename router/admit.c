// router/admit.c: admission: running slots against capacity, the wait queue and its backpressure (429 queue_full).
// An admitted request's choices are then routed and sent to their workers as slots free up (links.c).
#include <pthread.h>
#include <stdlib.h>

#include "router/server_int.h"


// Admission, then the request's choices are sent as slots allow (links.c, rtr_send_new_locked: fairly across
// requests). A request waits in the queue (429 beyond queue_limit) until one slot is free for its first choice. 0, or
// -1 with e (r is then failed/finished by the caller).
int rtr_admit_and_send(rtr_server *s, rtr_req *r, rtr_error *e) {
  pthread_mutex_lock(&s->mu);
  int up = 0;
  for (int i = 0; i < s->n_links; i++) up += s->links[i].up;
  if (s->stopping || s->draining) {
    pthread_mutex_unlock(&s->mu);
    return rtr_fail(e, 503, "server_error", NULL, "shutting_down", "the router is shutting down");
  }
  if (!up) {
    pthread_mutex_unlock(&s->mu);
    return rtr_fail(e, 503, "server_error", NULL, "no_worker", "no worker is available");
  }
  if (!(s->running_slots < s->capacity && !s->wait_head)) {
    if (s->n_waiting >= s->rc->queue_limit) {
      pthread_mutex_unlock(&s->mu);
      return rtr_fail(e, 429, "rate_limit_error", NULL, "queue_full",
                      "the server is busy (%d requests waiting); retry later", s->rc->queue_limit);
    }
    r->waiting = 1;
    if (s->wait_tail) s->wait_tail->wnext = r;
    else s->wait_head = r;
    s->wait_tail = r;
    s->n_waiting++;
    rtr_metric_set(s->m_waiting, s->n_waiting);
    int gone = 0, late = 0;
    int64_t limit = r->t_arrival_us + (int64_t)s->rc->request_timeout_ms * 1000;
    while (!s->stopping && !s->draining) {
      if (s->wait_head == r && s->running_slots < s->capacity) break;
      if ((gone = s->hooks.client_gone(r->fd)) || (late = utl_now_us() > limit)) break;
      struct timespec dl = utl_deadline_ms(WAIT_TICK_MS);
      pthread_cond_timedwait(&s->admit_cv, &s->mu, &dl);
    }
    for (rtr_req **pp = &s->wait_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->wnext)
      if (*pp == r) {
        *pp = r->wnext;
        if (s->wait_tail == r) s->wait_tail = prev;
        break;
      }
    r->wnext = NULL;
    r->waiting = 0;
    s->n_waiting--;
    rtr_metric_set(s->m_waiting, s->n_waiting);
    pthread_cond_broadcast(&s->admit_cv);
    if (gone || late || s->stopping || s->draining) { // 499 is not answered (nobody to answer); 504 is
      pthread_mutex_unlock(&s->mu);
      if (late)
        return rtr_fail(e, 504, "server_error", NULL, "timeout", "the request passed its deadline while queued");
      return rtr_fail(e, gone ? 499 : 503, "server_error", NULL, gone ? "cancelled" : "shutting_down",
                      gone ? "the client disconnected while the request was queued" : "shutting down");
    }
  }
  r->admitted = 1;
  s->n_unsent += r->n_ch;
  r->t_admit_us = utl_now_us();
  rtr_metric_observe(s->m_queue, (double)(r->t_admit_us - r->t_arrival_us) / 1e6);
  rtr_metric_add(s->m_prompt, r->n_prompt);
  // its first choice takes the free slot, more go as the fair share allows
  rtr_req *who = NULL;
  int rc = 0;
  if (rtr_send_new_locked(s, r, &who, e) < 0 && who == r && r->slots == 0) rc = -1; // not one of its choices went out
  pthread_mutex_unlock(&s->mu);
  return rc;
}
