// router/req.c: a request's life at the bottom of the router: its references, its end (finish, fail, cancel), its
// admission slots and the bounded wait of the connection that holds it. The layers above reach in through
// s->hooks (server_int.h): the workers hear a cancel through links.c, the stream trailer is the OpenAI layer's
// (relay.c), and whether the client is still there is the HTTP layer's question.
#include <assert.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "router/server_int.h"
#include "util/log.h"

// A request that held at least this many bytes gives the heap back to the system when it goes: libmicrohttpd runs
// a thread per connection, and glibc's per-thread arenas keep what a large answer (n 64 with top_logprobs) freed.
#define TRIM_AFTER_BYTES (4u << 20)

void rtr_req_unref_locked(rtr_req *r) {
  if (--r->refs > 0) return;
  if (--r->s->n_live == 0) pthread_cond_broadcast(&r->s->admit_cv); // rtr_server_drain waits for this
  size_t freed = r->out.cap + r->pend.cap + r->taken.cap;
  for (int i = 0; i < r->n_ch && r->ch; i++) {
    freed += r->ch[i].text.cap;
    utl_buf_free(&r->ch[i].text);
    utl_buf_free(&r->ch[i].held);
    for (int k = 0; k < 4; k++) {
      freed += r->ch[i].lp_text[k].cap;
      utl_buf_free(&r->ch[i].lp_text[k]);
    }
    free(r->ch[i].gen);
    free(r->ch[i].embd);
  }
  free(r->ch);
  free(r->prompt);
  utl_buf_free(&r->out);
  utl_buf_free(&r->pend);
  utl_buf_free(&r->taken);
  rtr_resp_stream_free(&r->resp);
  rtr_request_free(&r->q);
  pthread_cond_destroy(&r->cv);
  free(r);
  if (freed >= TRIM_AFTER_BYTES) malloc_trim(0);
}

int rtr_req_list_locked(rtr_server *s, rtr_req *r) {
  if (rtr_reqtab_put(&s->reqtab, r->id, r) < 0) return -1;
  r->listed = 1;
  r->refs++;
  r->prev = NULL;
  r->next = s->reqs;
  if (s->reqs) s->reqs->prev = r;
  s->reqs = r;
  return 0;
}

rtr_req *rtr_req_find_locked(rtr_server *s, const char *id, int *ci) {
  int i;
  size_t k = rtr_choice_id_split(id, &i);
  rtr_req *r = k ? rtr_reqtab_get(&s->reqtab, id, k) : NULL;
  if (!r || i < 0 || i >= r->n_ch || strcmp(r->ch[i].id, id)) return NULL; // an id the choice moved away from
  *ci = i;
  return r;
}

static void unlist_locked(rtr_server *s, rtr_req *r) {
  if (!r->listed) return;
  if (r->prev) r->prev->next = r->next;
  else s->reqs = r->next;
  if (r->next) r->next->prev = r->prev;
  r->next = r->prev = NULL;
  rtr_reqtab_del(&s->reqtab, r->id);
  r->listed = 0;
  rtr_req_unref_locked(r);
}

// Gives back whatever slots a request still holds (none once every choice is done) and wakes the queue.
void rtr_release_slots_locked(rtr_server *s, rtr_req *r) {
  if (r->admitted && r->slots) {
    s->running_slots -= r->slots;
    r->slots = 0;
    rtr_metric_set(s->m_running, s->running_slots);
    pthread_cond_broadcast(&s->admit_cv);
  }
}

// Marks the request finished: stream trailer (the OpenAI layer's hook), metrics, admission slots, out of the active
// list.
void rtr_finish_locked(rtr_server *s, rtr_req *r) {
  if (r->finished) return;
  r->finished = 1;
  if (r->q.stream && s->hooks.stream_end) s->hooks.stream_end(r); // the OpenAI layer writes the trailer
  if (!r->failed) {
    int64_t t = utl_now_us();
    rtr_metric_observe(s->m_e2e, (double)(t - r->t_arrival_us) / 1e6);
    for (int i = 0; i < r->n_ch; i++)
      rtr_metric_add(!strcmp(r->ch[i].finish, "length") ? s->m_ok_length : s->m_ok_stop, 1);
  } else {
    rtr_metric_add(s->m_fail, 1);
  }
  rtr_release_slots_locked(s, r);
  pthread_cond_broadcast(&r->cv);
  unlist_locked(s, r);
}

void rtr_choice_unlink_locked(rtr_server *s, rtr_choice *c) {
  if (c->link >= 0 && s->links[c->link].inflight > 0) s->links[c->link].inflight--;
  if (c->plink >= 0 && !rtr_choice_handed_off(c) && s->links[c->plink].inflight > 0) s->links[c->plink].inflight--;
}

int rtr_choice_to(rtr_server *s, rtr_req *r, int ci, rtr_ch_state next) {
  rtr_choice *c = &r->ch[ci];
  rtr_ch_state from = c->state;
  if (!rtr_ch_state_legal(from, next)) {
    utl_err(LOGC, "%s: illegal choice transition %s -> %s refused", c->id, rtr_ch_state_name(from),
            rtr_ch_state_name(next));
    assert(!"illegal router choice transition");
    return -1;
  }
  // the handoff is over: the prefill worker is free of this choice
  if (next == RTR_CH_STREAMING && c->plink >= 0 && s->links[c->plink].inflight > 0) s->links[c->plink].inflight--;
  c->until_ms = next == RTR_CH_DECODE_LOST      ? utl_now_ms() + RTR_DECODE_LOST_MS
                : next == RTR_CH_WAITING_WORKER ? utl_now_ms() + s->rc->migration_wait_ms
                                                : 0;
  if (next == RTR_CH_DONE) r->n_done++;
  s->n_held += (next == RTR_CH_DECODE_LOST || next == RTR_CH_WAITING_WORKER) -
               (from == RTR_CH_DECODE_LOST || from == RTR_CH_WAITING_WORKER);
  // admission slots are per choice: taken when it is first sent, given back when it ends (admit.c, links.c)
  if (from == RTR_CH_NEW && r->admitted) s->n_unsent--;
  if (from == RTR_CH_NEW && next != RTR_CH_DONE) {
    r->slots++;
    s->running_slots++;
    rtr_metric_set(s->m_running, s->running_slots);
  } else if (from != RTR_CH_NEW && next == RTR_CH_DONE && r->slots > 0) {
    r->slots--;
    s->running_slots--;
    rtr_metric_set(s->m_running, s->running_slots);
    pthread_cond_broadcast(&s->admit_cv);
  }
  c->state = next;
  return 0;
}

void rtr_choice_end_locked(rtr_server *s, rtr_req *r, int ci) {
  rtr_choice *c = &r->ch[ci];
  if (c->state == RTR_CH_DONE) return;
  rtr_choice_unlink_locked(s, c); // before DONE: a handed-off choice's prefill worker no longer counts it
  rtr_choice_to(s, r, ci, RTR_CH_DONE);
}

// Fails the whole request (other choices are cancelled at their workers).
void rtr_fail_locked(rtr_server *s, rtr_req *r, const rtr_error *e) {
  if (r->finished) return;
  r->failed = 1;
  r->err = *e;
  for (int i = 0; i < r->n_ch; i++)
    if (r->ch[i].state != RTR_CH_DONE) {
      s->hooks.cancel_choice(s, r, i);
      rtr_choice_end_locked(s, r, i);
    }
  rtr_finish_locked(s, r);
}

// The client went away: cancel whatever still runs; nothing more is sent.
void rtr_cancel_locked(rtr_server *s, rtr_req *r) {
  if (r->finished) return;
  for (int i = 0; i < r->n_ch; i++)
    if (r->ch[i].state != RTR_CH_DONE && r->admitted) {
      s->hooks.cancel_choice(s, r, i);
      rtr_choice_end_locked(s, r, i);
    }
  r->failed = 1;
  rtr_fail(&r->err, 499, "invalid_request_error", NULL, "cancelled", "the client disconnected");
  r->q.stream = 0; // no trailer for nobody
  rtr_finish_locked(s, r);
}

void rtr_wake_reader_locked(rtr_server *s, rtr_req *r) {
  if (r->wake_queued || r->paced) return; // one wake does (a batch with several of its choices); a paced reader
                                          // wakes at its own time
  if (s->defer_wake && s->n_wake == s->cap_wake) {
    int cap = s->cap_wake ? 2 * s->cap_wake : 256;
    rtr_req **w = realloc(s->wake, (size_t)cap * sizeof *w);
    if (w) s->wake = w, s->cap_wake = cap;
  }
  if (!s->defer_wake || s->n_wake == s->cap_wake) { // not collecting, or out of memory: now, under the lock
    pthread_cond_broadcast(&r->cv);
    return;
  }
  r->refs++; // (until rtr_wake_flush) the wake must not find r freed
  r->wake_queued = 1;
  s->wake[s->n_wake++] = r;
}

// A broadcast without the mutex loses no wake: the reader tests r->pend under s->mu before it waits, and the
// records were queued under s->mu before it was let go.
void rtr_wake_flush(rtr_server *s) {
  int n = s->n_wake; // only the dispatcher adds to s->wake, and it is here
  if (!n) return;
  for (int i = 0; i < n; i++) pthread_cond_broadcast(&s->wake[i]->cv);
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < n; i++) {
    s->wake[i]->wake_queued = 0;
    rtr_req_unref_locked(s->wake[i]);
  }
  s->n_wake = 0;
  pthread_mutex_unlock(&s->mu);
}

rtr_wait rtr_wait_locked(rtr_server *s, rtr_req *r) {
  if (s->hooks.client_gone(r->fd)) {
    rtr_cancel_locked(s, r);
    return RTR_WAIT_GONE;
  }
  // The router's own bound: the request timeout (10 min when none is set) and 5 s for its error to reach the client.
  int64_t limit = r->t_arrival_us +
                  (int64_t)s->rc->request_timeout_ms * 1000 + 5000000;
  if (utl_now_us() > limit) {
    rtr_error e;
    rtr_fail(&e, 504, "server_error", NULL, "timeout", "the request passed its deadline");
    rtr_fail_locked(s, r, &e);
    return RTR_WAIT_TIMEOUT;
  }
  struct timespec dl = utl_deadline_ms(WAIT_TICK_MS);
  pthread_cond_timedwait(&r->cv, &s->mu, &dl);
  return RTR_WAIT_MORE;
}
