// kvxfer/kvx_conn.c: the connection core: one authenticated connection per peer and backend, its request queue, worker and reader threads, failing and dropping it.
//
// A request is in exactly one place, and whoever takes it from there finishes it: the queue (posted), the worker's
// hands (running), or the pending list (sent, answer awaited: only reader backends). kvx_conn_fail empties the
// queue and the pending list. Whoever runs a request (the worker, or the posting thread starting it: kvx_conn_start)
// holds an extra reference on it, so that the answer (or a failure) may finish it, and its owner free it, while the
// backend still reads its segments; a start left unfinished passes that reference to the worker (c->resume).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

static void conn_unref(kvx_conn *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  if (c->be->close) c->be->close(c);
  if (c->ch.fd >= 0) close(c->ch.fd);
  kvx_ch_free(&c->ch);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void kvx_conn_fail(kvx_conn *c, const char *why) {
  pthread_mutex_lock(&c->mu);
  if (c->dead) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  c->dead = 1;
  kvx_xfer *q = c->q, *pend = c->pend;
  c->q = c->q_tail = c->pend = c->pend_tail = NULL;
  if (c->ch.fd >= 0) shutdown(c->ch.fd, SHUT_RDWR);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  int n = 0;
  for (kvx_xfer *lists[2] = {pend, q}, **l = lists; l < lists + 2; l++)
    for (kvx_xfer *x = *l, *nx; x; x = nx) {
      nx = x->qnext;
      kvx_xfer_finish(x, KVX_ERR_PEER, "%s: peer '%s': %s", c->be->name, c->peer, why);
      n++;
    }
  if (n) kvx_log(c->a, "%s: connection to '%s' closed: %s (%d requests failed)", c->be->name, c->peer, why, n);
}

// The pending requests up to and including the one with this id, unlinked as a list (c->mu held), or NULL when
// it is not pending. An ACK answers its request and every one sent before it: the peer serves them in order.
static kvx_xfer *pend_take_upto(kvx_conn *c, uint64_t id) {
  kvx_xfer *x = c->pend;
  while (x && x->id != id) x = x->qnext;
  if (!x) return NULL;
  kvx_xfer *done = c->pend;
  c->pend = x->qnext;
  if (!c->pend) c->pend_tail = NULL;
  x->qnext = NULL;
  return done;
}

// The pending request with this id, unlinked (c->mu held), or NULL.
static kvx_xfer *pend_take(kvx_conn *c, uint64_t id) {
  kvx_xfer *prev = NULL;
  for (kvx_xfer *x = c->pend; x; prev = x, x = x->qnext) {
    if (x->id != id) continue;
    if (prev)
      prev->qnext = x->qnext;
    else
      c->pend = x->qnext;
    if (c->pend_tail == x) c->pend_tail = prev;
    x->qnext = NULL;
    return x;
  }
  return NULL;
}

kvx_xfer *kvx_conn_pending(kvx_conn *c, uint64_t id) {
  pthread_mutex_lock(&c->mu);
  kvx_xfer *x = c->pend;
  while (x && x->id != id) x = x->qnext;
  if (x) atomic_fetch_add(&x->refs, 1);
  pthread_mutex_unlock(&c->mu);
  return x;
}

int kvx_conn_send_end(kvx_conn *c, const kvx_xfer *x, int ack) {
  uint16_t op = x->op == KVX_WRITE ? KVX_F_WRITE_END : KVX_F_READ_END;
  uint16_t fl = (uint16_t)((x->has_notif ? KVX_FL_NOTIF : 0) | (ack ? 0 : KVX_FL_NOACK));
  return kvx_send_frame(&c->ch, op, fl, x->id, 0, x->notif_len, 0, x->notif, x->notif_len, c->a->timeout_ms);
}

// ---- the reader: answers of reader backends ----
static void *reader_main(void *p) {
  kvx_conn *c = p;
  kvx_agent *a = c->a;
  char why[300];
  for (;;) {
    kvx_hdr h;
    int rc = kvx_recv_all(&c->ch, &h, sizeof h, 100, 1);
    if (rc == 1) {
      pthread_mutex_lock(&c->mu);
      int dead = c->dead;
      int stalled = (c->pend || c->q) && !c->busy && utl_now_ms() - c->last_act > a->timeout_ms;
      pthread_mutex_unlock(&c->mu);
      if (dead) break;
      if (stalled) {
        snprintf(why, sizeof why, "no response for %d ms (peer dead or stalled)", a->timeout_ms);
        kvx_conn_fail(c, why);
        break;
      }
      continue;
    }
    if (rc < 0) {
      kvx_conn_fail(c, rc == -1 ? "connection closed by peer" : rc == KVX_IO_SEAL ? kvx_io_why(rc) : "connection lost");
      break;
    }
    pthread_mutex_lock(&c->mu);
    c->last_act = utl_now_ms();
    pthread_mutex_unlock(&c->mu);
    if (h.magic != KVX_FRAME_MAGIC) {
      kvx_conn_fail(c, "malformed frame from peer");
      break;
    }
    if (h.op == KVX_F_ACK) {
      pthread_mutex_lock(&c->mu);
      kvx_xfer *x = pend_take_upto(c, h.req);
      pthread_mutex_unlock(&c->mu);
      if (!x) {
        kvx_conn_fail(c, "acknowledgement for an unknown request");
        break;
      }
      for (kvx_xfer *nx; x; x = nx) {
        nx = x->qnext;
        kvx_xfer_finish(x, 0, NULL);
      }
    } else if (h.op == KVX_F_ERR) {
      char msg[256] = "";
      size_t n = h.len < sizeof msg - 1 ? h.len : sizeof msg - 1;
      if (kvx_recv_all(&c->ch, msg, n, 500, 0)) msg[0] = 0;
      msg[n] = 0;
      snprintf(why, sizeof why, "peer refused: %s", msg);
      kvx_conn_fail(c, why);
      break;
    } else if (c->be->answer) {
      why[0] = 0;
      if (c->be->answer(c, &h, why, sizeof why)) {
        kvx_conn_fail(c, why[0] ? why : "bad answer from peer");
        break;
      }
    } else {
      snprintf(why, sizeof why, "unexpected frame op %u from peer", h.op);
      kvx_conn_fail(c, why);
      break;
    }
  }
  conn_unref(c);
  kvx_thread_exit(a);
  return NULL;
}

// ---- the worker: connects, then runs the queue in order ----
// Connects and authenticates into ch: sealed through the tcp listener when the agent seals (a unix socket stays on
// this host, between processes of this user: plain). 0, or -1 with e (ch.fd -1).
static int conn_connect(kvx_conn *c, kvx_chan *ch, char *e, size_t cap) {
  kvx_agent *a = c->a;
  int un = c->be->listener == KVX_LS_UNIX;
  kvx_ch_init(ch, un ? kvx_unix_connect(c->path, e, cap) : kvx_tcp_connect(c->host, c->port, a->timeout_ms, e, cap));
  ch->fails = &a->auth_failures;
  if (ch->fd >= 0 &&
      kvx_handshake_client(ch, a->name, a->secret, a->secret_len, !un && a->seal, a->timeout_ms, e, cap)) {
    close(ch->fd);
    kvx_ch_free(ch);
    ch->fd = -1;
  }
  return ch->fd >= 0 ? 0 : -1;
}

static int send_notify(kvx_conn *c, const kvx_xfer *x, char *why, size_t cap) {
  int rc = kvx_send_frame(&c->ch, KVX_F_NOTIF, 0, x->id, 0, x->notif_len, 0, x->notif, x->notif_len,
                          c->a->timeout_ms);
  if (rc) snprintf(why, cap, "notification could not be sent (%s)", kvx_io_why(rc));
  return rc ? -2 : 0;
}

static void pend_add(kvx_conn *c, kvx_xfer *x) {  // c->mu held
  x->qnext = NULL;
  if (c->pend_tail)
    c->pend_tail->qnext = x;
  else
    c->pend = x;
  c->pend_tail = x;
}

// After run (worker) or start (posting thread) returned rc for x, which the caller holds a reference on and marked
// c->busy for: hands x on (finished, pending, or to the worker to resume) and lets the queue move. Returns rc.
static int ran(kvx_conn *c, kvx_xfer *x, int answered, int rc, const char *why) {
  pthread_mutex_lock(&c->mu);
  c->busy = 0;
  if (rc == 1 && !c->dead) {  // started: the worker goes on with it, with our reference
    c->resume = x;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return rc;
  }
  if (!rc) c->last_act = utl_now_ms();  // a failed send keeps the old mark: the reader judges the stall
  // An answered request stays pending unless it failed on its own: when the connection failed, the peer's reason
  // (an ERR frame the reader takes) or ours fails it with the rest.
  int mine = !answered || (rc == -1 && pend_take(c, x->id));
  if (c->q) pthread_cond_signal(&c->cv);  // requests queued behind one that started on the posting thread
  pthread_mutex_unlock(&c->mu);
  if (mine && !rc)
    kvx_xfer_finish(x, 0, NULL);
  else if (mine)
    kvx_xfer_finish(x, rc == -1 ? KVX_ERR : KVX_ERR_PEER, "%s: peer '%s': %s", c->be->name, c->peer, why);
  kvx_xfer_unref(x);
  return rc;
}

static void *worker_main(void *p) {
  kvx_conn *c = p;
  kvx_agent *a = c->a;
  const kvx_backend *be = c->be;
  char e[300] = "";
  kvx_chan ch;
  int ok = conn_connect(c, &ch, e, sizeof e) == 0;
  pthread_mutex_lock(&c->mu);
  c->ch = ch;
  c->last_act = utl_now_ms();
  pthread_mutex_unlock(&c->mu);
  ok = ok && (!be->open || be->open(c, e, sizeof e) == 0);
  if (ok && be->reader) {
    atomic_fetch_add(&c->refs, 1);
    if (kvx_thread_start(a, reader_main, c, e, sizeof e)) {
      conn_unref(c);
      ok = 0;
    }
  }
  if (!ok) kvx_conn_fail(c, e);
  pthread_mutex_lock(&c->mu);
  c->ready = ok;
  pthread_mutex_unlock(&c->mu);
  for (;;) {
    pthread_mutex_lock(&c->mu);
    while (!c->resume && (!c->q || c->busy) && !c->dead) pthread_cond_wait(&c->cv, &c->mu);
    if (c->dead) {
      pthread_mutex_unlock(&c->mu);
      break;
    }
    kvx_xfer *x = c->resume;
    int answered = 1;  // a started request is always answered, and already pending
    if (x) {
      c->resume = NULL;
    } else {
      x = c->q;
      c->q = x->qnext;
      if (!c->q) c->q_tail = NULL;
      x->qnext = NULL;
      // Answered requests go to the pending list before their first byte leaves, so the answer always finds them.
      answered = be->reader && x->op != KVX_OP_NOTIFY;
      if (answered) pend_add(c, x);
      atomic_fetch_add(&x->refs, 1);  // ours while we run it, whatever the answer or a failure does meanwhile
    }
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);
    e[0] = 0;
    int rc = x->op == KVX_OP_NOTIFY ? send_notify(c, x, e, sizeof e) : be->run(c, x, e, sizeof e);
    if (ran(c, x, answered, rc, e) == -2) {
      // The peer may have closed with a reason (an ERR frame) that its reader is about to pick up: give it a moment.
      int64_t end = utl_now_ms() + 1000;
      pthread_mutex_lock(&c->mu);
      while (be->reader && !c->dead && utl_now_ms() < end) {
        pthread_mutex_unlock(&c->mu);
        usleep(5000);
        pthread_mutex_lock(&c->mu);
      }
      pthread_mutex_unlock(&c->mu);
      kvx_conn_fail(c, e);
      break;
    }
  }
  // A request started on the posting thread and left to us: it was pending, so the failure finished it.
  pthread_mutex_lock(&c->mu);
  kvx_xfer *left = c->resume;
  c->resume = NULL;
  pthread_mutex_unlock(&c->mu);
  kvx_xfer_unref(left);
  conn_unref(c);
  kvx_thread_exit(a);
  return NULL;
}

int kvx_conn_post(kvx_agent *a, kvx_peer *p, kvx_xfer *x, kvx_conn **now, char *err, size_t errlen) {
  const kvx_backend *be = a->table[p->be];
  *now = NULL;
  if (be->check && be->check(x, err, errlen)) return -1;
  kvx_conn *c = p->conn[p->be];
  if (c) {  // queue on the live connection (or start on it), or replace a dead one
    pthread_mutex_lock(&c->mu);
    int queued = !c->dead;
    if (queued && be->start && be->reader && x->op != KVX_OP_NOTIFY && c->ready && !c->q && !c->busy &&
        !c->resume) {
      c->busy = 1;  // ours: the worker waits, later posts queue behind it
      pend_add(c, x);
      c->last_act = utl_now_ms();
      atomic_fetch_add(&c->refs, 1);
      *now = c;
    } else if (queued) {
      if (!c->pend && !c->q && !c->busy) c->last_act = utl_now_ms();  // idle until now: the stall clock starts
      x->qnext = NULL;
      if (c->q_tail)
        c->q_tail->qnext = x;
      else
        c->q = x;
      c->q_tail = x;
      pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (queued) return 0;
    conn_unref(c);
    p->conn[p->be] = NULL;
  }
  if (be->listener == KVX_LS_TCP ? !p->tcp_port : !p->unix_path[0]) {
    utl_seterr(err, errlen, "%s: peer '%s' has no %s endpoint", be->name, p->name, be->name);
    return -1;
  }
  c = calloc(1, sizeof *c);
  if (!c) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  c->a = a;
  c->be = be;
  snprintf(c->peer, sizeof c->peer, "%s", p->name);
  snprintf(c->host, sizeof c->host, "%s", p->tcp_host);
  c->port = p->tcp_port;
  snprintf(c->path, sizeof c->path, "%s", p->unix_path);
  kvx_ch_init(&c->ch, -1);
  atomic_init(&c->refs, 2);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  x->qnext = NULL;
  c->q = c->q_tail = x;  // queued before the thread runs: a failed connect fails x with its reason
  c->last_act = utl_now_ms();
  if (kvx_thread_start(a, worker_main, c, err, errlen)) {
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return -1;
  }
  p->conn[p->be] = c;
  return 0;
}

void kvx_conn_start(kvx_conn *c, kvx_xfer *x) {
  char e[300] = "";
  atomic_fetch_add(&x->refs, 1);  // ours while starting (handed to the worker if it is to go on)
  ran(c, x, 1, c->be->start(c, x, e, sizeof e), e);
  conn_unref(c);
}

void kvx_conn_drop(kvx_agent *a, kvx_peer *p, const char *why) {
  (void)a;
  for (int i = 0; i < KVX_NBE; i++) {
    kvx_conn *c = p->conn[i];
    if (!c) continue;
    p->conn[i] = NULL;
    kvx_conn_fail(c, why);
    conn_unref(c);
  }
}
