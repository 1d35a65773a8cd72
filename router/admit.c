// router/admit.c: admission: running slots against capacity, the wait queue and its backpressure (429 queue_full).
// An admitted request's choices are then routed and sent to their workers.
#include <pthread.h>
#include <stdlib.h>

#include "router/server_int.h"


// Admission then dispatch of every choice. 0, or -1 with e (r is then failed/finished by the caller).
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
  int need = r->n_ch;
  int fits = s->running_slots == 0 || s->running_slots + need <= s->capacity;
  if (!(fits && !s->wait_head)) {
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
      if (s->wait_head == r && (s->running_slots == 0 || s->running_slots + need <= s->capacity)) break;
      if ((gone = s->hooks.client_gone(r->fd)) || (late = utl_now_us() > limit)) break;
      struct timespec dl;
      deadline_in(&dl, WAIT_TICK_MS);
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
  r->slots = need;
  s->running_slots += need;
  rtr_metric_set(s->m_running, s->running_slots);
  r->t_admit_us = utl_now_us();
  rtr_metric_observe(s->m_queue, (double)(r->t_admit_us - r->t_arrival_us) / 1e6);
  rtr_metric_add(s->m_prompt, r->n_prompt);
  // pick a worker for every choice
  rtr_sched_worker *w = calloc((size_t)s->n_links + 1, sizeof *w);
  ctl_peer **send_to = calloc((size_t)need * 2, sizeof *send_to);
  cJSON **msgs = calloc((size_t)need * 2, sizeof *msgs);
  int *to = calloc((size_t)need * 2, sizeof *to);
  int n_msgs = 0, rc = 0;
  if (!w || !send_to || !msgs || !to) rc = rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  for (int ci = 0; rc == 0 && ci < need; ci++) {
    int first = n_msgs;
    if ((rc = rtr_route_choice_locked(s, r, ci, w, msgs, to, &n_msgs, e)) < 0) break;
    rtr_choice_to(s, r, ci, RTR_CH_ROUTED); // sent below, outside the lock
    for (int i = first; i < n_msgs; i++) send_to[i] = s->links[to[i]].peer;
    if (r->q.stream) s->hooks.choice_start(r, ci); // the role comes first in every choice's stream
  }
  // the peers stay allocated while the hub lives, so sending outside the lock is safe
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < n_msgs; i++) {
    if (rc == 0 && ctl_peer_send(send_to[i], msgs[i]) < 0) {
      // The link broke after the pick: close it (unless that was seen already) so that the dispatcher fails or retries
      // this request with the link's others, as for a worker that dies later.
      pthread_mutex_lock(&s->mu);
      if (s->links[to[i]].peer == send_to[i]) ctl_peer_close(send_to[i]);
      pthread_mutex_unlock(&s->mu);
    }
    cJSON_Delete(msgs[i]);
  }
  free(w);
  free(send_to);
  free(msgs);
  free(to);
  return rc;
}
