// kvxfer/kvx_tcp.c: the tcp backend: one authenticated connection per peer, a sender and a reader thread, pipelined scatter-gather frames; the validating server side.
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

// ---- server side: accepted connections ----
typedef struct srv_conn {
  int fd;
  struct srv_conn *next;
} srv_conn;

typedef struct tcp_state {
  int lfd;
  pthread_mutex_t mu;  // conns
  srv_conn *conns;
} tcp_state;

typedef struct serve_arg {
  kvx_agent *a;
  srv_conn *c;
  char from[64];
} serve_arg;

static void srv_refuse(kvx_agent *a, int fd, const char *peer, const char *why) {
  kvx_log(a, "closing connection from '%s': %s", peer, why);
  kvx_send_frame(fd, KVX_F_ERR, 0, 0, 0, strlen(why), 0, why, strlen(why), 200);
  // Lingering close: stop sending, discard what the peer still sends for a moment, so that it reads the reason
  // (a close with unread data would reset the connection and could drop the ERR frame).
  shutdown(fd, SHUT_WR);
  char sink[16384];
  int64_t end = kvx_now_ms() + 200;
  while (kvx_now_ms() < end && !a->closing) {
    int rc = kvx_recv_all(fd, sink, 1, 50, 1);
    if (rc < 0) break;
    if (rc == 0) {
      ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      (void)n;
    }
  }
}

// Serves one authenticated peer until it closes or misbehaves. Returns with the reason in why ("" = clean close).
static void serve_frames(kvx_agent *a, int fd, const char *peer, char *why, size_t cap) {
  int to = a->timeout_ms;
  uint8_t *nbuf = malloc(KVX_MAX_NOTIF);
  void *nccl = NULL;
  if (!nbuf) {
    snprintf(why, cap, "out of memory");
    return;
  }
  for (;;) {
    kvx_hdr h;
    int rc = kvx_recv_all(fd, &h, sizeof h, 1000, 1);
    if (rc == 1) continue;
    if (rc == -1) break;  // clean close at a frame boundary
    if (rc < 0) {
      snprintf(why, cap, "connection lost%s (%s)", rc == -2 ? " mid-header" : "", rc == -2 ? "stalled" : strerror(errno));
      break;
    }
    if (h.magic != KVX_FRAME_MAGIC) {
      snprintf(why, cap, "malformed frame (bad magic 0x%08x)", h.magic);
      srv_refuse(a, fd, peer, why);
      break;
    }
    int bad = 0;
    switch (h.op) {
      case KVX_F_WRITE:
      case KVX_F_READ: {
        pthread_rwlock_rdlock(&a->reg_lock);
        kvx_region *r = kvx_check_access(a, h.key, h.addr, h.len, why, cap);
        if (r && r->mem != KVX_MEM_HOST) {
          snprintf(why, cap, "region 0x%016" PRIx64 " is CUDA memory: tcp moves host memory only", h.key);
          r = NULL;
        }
        if (!r) {
          pthread_rwlock_unlock(&a->reg_lock);
          srv_refuse(a, fd, peer, why);
          bad = 1;
          break;
        }
        if (h.op == KVX_F_WRITE) {
          rc = kvx_recv_all(fd, (void *)(uintptr_t)h.addr, h.len, to, 0);
        } else {
          rc = kvx_send_frame(fd, KVX_F_READ_DATA, 0, h.req, h.addr, h.len, h.key, (void *)(uintptr_t)h.addr, h.len, to);
        }
        pthread_rwlock_unlock(&a->reg_lock);
        if (rc) {
          snprintf(why, cap, "peer died or stalled mid-%s (%s)", h.op == KVX_F_WRITE ? "write" : "read",
                   rc == -1 ? "closed" : rc == -2 ? "timed out" : strerror(errno));
          bad = 1;
        }
        break;
      }
      case KVX_F_WRITE_END:
      case KVX_F_READ_END:
      case KVX_F_NOTIF:
        if (h.len > KVX_MAX_NOTIF) {
          snprintf(why, cap, "notification of %" PRIu64 " bytes exceeds %d", h.len, KVX_MAX_NOTIF);
          srv_refuse(a, fd, peer, why);
          bad = 1;
          break;
        }
        if ((rc = kvx_recv_all(fd, nbuf, h.len, to, 0))) {
          snprintf(why, cap, "peer died mid-notification");
          bad = 1;
          break;
        }
        if (h.op == KVX_F_NOTIF || (h.flags & KVX_FL_NOTIF)) kvx_push_notif(a, peer, nbuf, h.len);
        if (h.op != KVX_F_NOTIF && kvx_send_frame(fd, KVX_F_ACK, 0, h.req, 0, 0, 0, NULL, 0, to)) {
          snprintf(why, cap, "could not acknowledge request %" PRIu64, h.req);
          bad = 1;
        }
        break;
      case KVX_F_RDMA_QP:
        if (kvx_rdma_serve_qp(a, peer, fd, &h, why, cap)) {
          srv_refuse(a, fd, peer, why);
          bad = 1;
        }
        break;
      case KVX_F_NCCL_INIT:
      case KVX_F_NCCL_XFER:
        if (kvx_nccl_serve(a, peer, fd, &h, &nccl, why, cap)) {
          srv_refuse(a, fd, peer, why);
          bad = 1;
        }
        break;
      default:
        snprintf(why, cap, "malformed frame (unknown op %u)", h.op);
        srv_refuse(a, fd, peer, why);
        bad = 1;
    }
    if (bad) break;
  }
  kvx_nccl_serve_end(a, nccl);
  free(nbuf);
}

static void *serve_main(void *p) {
  serve_arg s = *(serve_arg *)p;
  free(p);
  kvx_agent *a = s.a;
  tcp_state *st = a->be_state[KVX_BE_TCP];
  char peer[KVX_MAX_NAME] = "?", why[300] = "";
  kvx_sock_timeouts(s.c->fd, a->timeout_ms);
  if (kvx_handshake_server(s.c->fd, a->secret, a->secret_len, a->timeout_ms, peer, why, sizeof why)) {
    if (!a->closing) kvx_auth_refused(a, "refused connection from %s: %s", s.from, why);
  } else {
    serve_frames(a, s.c->fd, peer, why, sizeof why);
  }
  pthread_mutex_lock(&st->mu);
  for (srv_conn **pp = &st->conns; *pp; pp = &(*pp)->next)
    if (*pp == s.c) {
      *pp = s.c->next;
      break;
    }
  pthread_mutex_unlock(&st->mu);
  close(s.c->fd);
  free(s.c);
  kvx_thread_exit(a);
  return NULL;
}

static void *accept_main(void *p) {
  kvx_agent *a = p;
  tcp_state *st = a->be_state[KVX_BE_TCP];
  for (;;) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(st->lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (!a->closing) kvx_log(a, "tcp: accept: %s; no longer accepting", strerror(errno));
      break;
    }
    srv_conn *c = calloc(1, sizeof *c);
    serve_arg *s = calloc(1, sizeof *s);
    if (!c || !s) {
      free(c);
      free(s);
      close(fd);
      continue;
    }
    c->fd = fd;
    s->a = a;
    s->c = c;
    char ip[32];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(s->from, sizeof s->from, "%s:%d", ip, ntohs(sa.sin_port));
    pthread_mutex_lock(&st->mu);
    int closing = a->closing;
    if (!closing) {
      c->next = st->conns;
      st->conns = c;
    }
    pthread_mutex_unlock(&st->mu);
    char e[128];
    if (closing || kvx_thread_start(a, serve_main, s, e, sizeof e)) {
      if (!closing) {
        pthread_mutex_lock(&st->mu);
        st->conns = c->next;
        pthread_mutex_unlock(&st->mu);
      }
      close(fd);
      free(c);
      free(s);
    }
  }
  kvx_thread_exit(a);
  return NULL;
}

static int tcp_init(kvx_agent *a, char *err, size_t errlen) {
  tcp_state *st = calloc(1, sizeof *st);
  if (!st) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  pthread_mutex_init(&st->mu, NULL);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->listen_port)};
  if (inet_pton(AF_INET, a->listen_host, &sa.sin_addr) != 1) {
    utl_seterr(err, errlen, "tcp: bad listen address '%s' (numeric IPv4)", a->listen_host);
    free(st);
    return -1;
  }
  st->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (st->lfd >= 0) setsockopt(st->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t sl = sizeof sa;
  if (st->lfd < 0 || bind(st->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(st->lfd, 128) ||
      getsockname(st->lfd, (struct sockaddr *)&sa, &sl)) {
    utl_seterr(err, errlen, "tcp: listen on %s:%d: %s", a->listen_host, a->listen_port, strerror(errno));
    if (st->lfd >= 0) close(st->lfd);
    free(st);
    return -1;
  }
  a->listen_port = ntohs(sa.sin_port);
  a->be_state[KVX_BE_TCP] = st;
  if (kvx_thread_start(a, accept_main, a, err, errlen)) {
    close(st->lfd);
    free(st);
    a->be_state[KVX_BE_TCP] = NULL;
    return -1;
  }
  return 0;
}

static void tcp_stop(kvx_agent *a) {
  tcp_state *st = a->be_state[KVX_BE_TCP];
  if (!st) return;
  pthread_mutex_lock(&st->mu);
  shutdown(st->lfd, SHUT_RDWR);
  for (srv_conn *c = st->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
  pthread_mutex_unlock(&st->mu);
}

static void tcp_fini(kvx_agent *a) {
  tcp_state *st = a->be_state[KVX_BE_TCP];
  if (!st) return;
  close(st->lfd);
  pthread_mutex_destroy(&st->mu);
  free(st);
  a->be_state[KVX_BE_TCP] = NULL;
}

// ---- client side: one connection per peer ----
typedef struct tcp_conn {
  kvx_agent *a;  // (borrowed)
  char peer[KVX_MAX_NAME];
  char host[64];
  int port;
  _Atomic int refs;  // the peer, the sender thread, the reader thread
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int fd;  // -1 until connected; closed with the last reference
  int dead;
  int sending;      // the sender is inside a request
  int64_t last_act; // last byte received or request sent (ms)
  kvx_xfer *q, *q_tail;  // posted, not yet sent (references held)
  kvx_xfer *pend;        // sent, waiting for ACK / READ_DATA
} tcp_conn;

static void conn_unref(tcp_conn *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  if (c->fd >= 0) close(c->fd);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static void conn_fail(tcp_conn *c, const char *why) {
  pthread_mutex_lock(&c->mu);
  if (c->dead) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  c->dead = 1;
  kvx_xfer *q = c->q, *pend = c->pend;
  c->q = c->q_tail = c->pend = NULL;
  if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  int n = 0;
  for (kvx_xfer *lists[2] = {pend, q}, **l = lists; l < lists + 2; l++)
    for (kvx_xfer *x = *l, *nx; x; x = nx) {
      nx = x->qnext;
      kvx_xfer_finish(x, KVX_ERR_PEER, "tcp: peer '%s': %s", c->peer, why);
      n++;
    }
  if (n) kvx_log(c->a, "tcp: connection to '%s' closed: %s (%d requests failed)", c->peer, why, n);
}

static kvx_xfer *pend_find(tcp_conn *c, uint64_t id, int unlink) {
  for (kvx_xfer **pp = &c->pend; *pp; pp = &(*pp)->qnext)
    if ((*pp)->id == id) {
      kvx_xfer *x = *pp;
      if (unlink) *pp = x->qnext;
      return x;
    }
  return NULL;
}

static void *reader_main(void *p) {
  tcp_conn *c = p;
  kvx_agent *a = c->a;
  char why[300];
  for (;;) {
    kvx_hdr h;
    int rc = kvx_recv_all(c->fd, &h, sizeof h, 100, 1);
    if (rc == 1) {
      pthread_mutex_lock(&c->mu);
      int dead = c->dead;
      int stalled = (c->pend || c->q) && !c->sending && kvx_now_ms() - c->last_act > a->timeout_ms;
      pthread_mutex_unlock(&c->mu);
      if (dead) break;
      if (stalled) {
        snprintf(why, sizeof why, "no response for %d ms (peer dead or stalled)", a->timeout_ms);
        conn_fail(c, why);
        break;
      }
      continue;
    }
    if (rc < 0) {
      conn_fail(c, rc == -1 ? "connection closed by peer" : "connection lost");
      break;
    }
    pthread_mutex_lock(&c->mu);
    c->last_act = kvx_now_ms();
    pthread_mutex_unlock(&c->mu);
    if (h.magic != KVX_FRAME_MAGIC) {
      conn_fail(c, "malformed frame from peer");
      break;
    }
    if (h.op == KVX_F_ACK) {
      pthread_mutex_lock(&c->mu);
      kvx_xfer *x = pend_find(c, h.req, 1);
      pthread_mutex_unlock(&c->mu);
      if (!x) {
        conn_fail(c, "acknowledgement for an unknown request");
        break;
      }
      kvx_xfer_finish(x, 0, NULL);
    } else if (h.op == KVX_F_READ_DATA) {
      pthread_mutex_lock(&c->mu);
      kvx_xfer *x = pend_find(c, h.req, 0);
      if (x) atomic_fetch_add(&x->refs, 1);
      pthread_mutex_unlock(&c->mu);
      const kvx_seg *s = x && x->op == KVX_READ && x->cursor < x->n_segs ? &x->segs[x->cursor] : NULL;
      if (!s || s->raddr != h.addr || s->len != h.len) {
        kvx_xfer_unref(x);
        conn_fail(c, "read data that matches no outstanding read");
        break;
      }
      rc = kvx_recv_all(c->fd, (void *)(uintptr_t)s->laddr, s->len, a->timeout_ms, 0);
      x->cursor++;
      kvx_xfer_unref(x);
      if (rc) {
        conn_fail(c, "peer died mid-read");
        break;
      }
    } else if (h.op == KVX_F_ERR) {
      char msg[256] = "";
      size_t n = h.len < sizeof msg - 1 ? h.len : sizeof msg - 1;
      if (kvx_recv_all(c->fd, msg, n, 500, 0)) msg[0] = 0;
      msg[n] = 0;
      snprintf(why, sizeof why, "peer refused: %s", msg);
      conn_fail(c, why);
      break;
    } else {
      snprintf(why, sizeof why, "unexpected frame op %u from peer", h.op);
      conn_fail(c, why);
      break;
    }
  }
  conn_unref(c);
  kvx_thread_exit(a);
  return NULL;
}

#define BATCH 64  // segments per sendmsg

static int send_xfer(tcp_conn *c, kvx_xfer *x) {
  int to = c->a->timeout_ms;
  kvx_hdr hs[BATCH];
  struct iovec iov[2 * BATCH];
  int wr = x->op == KVX_WRITE;
  for (size_t i = 0; i < x->n_segs; i += BATCH) {
    int n = 0, k = 0;
    for (size_t j = i; j < x->n_segs && k < BATCH; j++, k++) {
      const kvx_seg *s = &x->segs[j];
      hs[k] = (kvx_hdr){.magic = KVX_FRAME_MAGIC, .op = wr ? KVX_F_WRITE : KVX_F_READ, .req = x->id,
                        .addr = s->raddr, .len = s->len, .key = s->rkey};
      iov[n++] = (struct iovec){&hs[k], sizeof hs[k]};
      if (wr) iov[n++] = (struct iovec){(void *)(uintptr_t)s->laddr, s->len};
    }
    int rc = kvx_sendv_all(c->fd, iov, n, to);
    if (rc) return rc;
  }
  uint16_t op = x->op == KVX_WRITE ? KVX_F_WRITE_END : x->op == KVX_READ ? KVX_F_READ_END : KVX_F_NOTIF;
  return kvx_send_frame(c->fd, op, x->has_notif ? KVX_FL_NOTIF : 0, x->id, 0, x->notif_len, 0, x->notif, x->notif_len,
                        to);
}

static void *sender_main(void *p) {
  tcp_conn *c = p;
  kvx_agent *a = c->a;
  char e[300];
  int fd = kvx_tcp_connect(c->host, c->port, a->timeout_ms, e, sizeof e);
  if (fd >= 0 && kvx_handshake_client(fd, a->name, a->secret, a->secret_len, a->timeout_ms, e, sizeof e)) {
    close(fd);
    fd = -1;
  }
  pthread_mutex_lock(&c->mu);
  c->fd = fd;
  c->last_act = kvx_now_ms();
  pthread_mutex_unlock(&c->mu);
  if (fd < 0) {
    conn_fail(c, e);
  } else {
    atomic_fetch_add(&c->refs, 1);
    if (kvx_thread_start(a, reader_main, c, e, sizeof e)) {
      conn_unref(c);
      conn_fail(c, e);
    }
  }
  for (;;) {
    pthread_mutex_lock(&c->mu);
    while (!c->q && !c->dead) pthread_cond_wait(&c->cv, &c->mu);
    if (c->dead) {
      pthread_mutex_unlock(&c->mu);
      break;
    }
    kvx_xfer *x = c->q;
    c->q = x->qnext;
    if (!c->q) c->q_tail = NULL;
    x->qnext = NULL;
    int notify = x->op == KVX_OP_NOTIFY;
    if (!notify) {  // to the pending list before the first byte goes out, so the answer always finds it
      kvx_xfer **pp = &c->pend;
      while (*pp) pp = &(*pp)->qnext;
      *pp = x;
    }
    atomic_fetch_add(&x->refs, 1);  // ours while sending, whatever the reader or a failure does
    c->sending = 1;
    pthread_mutex_unlock(&c->mu);
    int rc = send_xfer(c, x);
    pthread_mutex_lock(&c->mu);
    c->sending = 0;
    c->last_act = kvx_now_ms();
    pthread_mutex_unlock(&c->mu);
    if (notify) {
      if (rc) kvx_xfer_finish(x, KVX_ERR_PEER, "tcp: notify '%s': send failed", c->peer);
      else kvx_xfer_finish(x, 0, NULL);
    }
    kvx_xfer_unref(x);
    if (rc) {
      snprintf(e, sizeof e, "send failed (%s)", rc == -1 ? "connection closed" : rc == -2 ? "peer stalled past the timeout" : strerror(errno));
      if (rc == -1) {  // the peer closed: give the reader a moment to pick up its reason (an ERR frame)
        int64_t end = kvx_now_ms() + 1000;
        pthread_mutex_lock(&c->mu);
        while (!c->dead && kvx_now_ms() < end) {
          pthread_mutex_unlock(&c->mu);
          usleep(5000);
          pthread_mutex_lock(&c->mu);
        }
        pthread_mutex_unlock(&c->mu);
      }
      conn_fail(c, e);
      break;
    }
  }
  conn_unref(c);
  kvx_thread_exit(a);
  return NULL;
}

static int tcp_post(kvx_agent *a, kvx_peer *p, kvx_xfer *x, char *err, size_t errlen) {
  for (size_t i = 0; i < x->n_segs; i++)
    if (x->segs[i].lmem != KVX_MEM_HOST || x->segs[i].rmem != KVX_MEM_HOST) {
      utl_seterr(err, errlen, "tcp: CUDA memory needs the rdma or nccl backend");
      return -1;
    }
  tcp_conn *c = p->conn[KVX_BE_TCP];
  if (c) {  // queue on the live connection, or replace a dead one
    pthread_mutex_lock(&c->mu);
    int queued = !c->dead;
    if (queued) {
      x->qnext = NULL;
      if (c->q_tail)
        c->q_tail->qnext = x;
      else
        c->q = x;
      c->q_tail = x;
      if (!c->pend && !c->sending) c->last_act = kvx_now_ms();
      pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (queued) return 0;
    conn_unref(c);
    c = p->conn[KVX_BE_TCP] = NULL;
  }
  if (!c) {
    if (!p->tcp_port) {
      utl_seterr(err, errlen, "tcp: peer '%s' has no tcp endpoint", p->name);
      return -1;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
      utl_seterr(err, errlen, "out of memory");
      return -1;
    }
    c->a = a;
    snprintf(c->peer, sizeof c->peer, "%s", p->name);
    snprintf(c->host, sizeof c->host, "%s", p->tcp_host);
    c->port = p->tcp_port;
    c->fd = -1;
    atomic_init(&c->refs, 2);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    x->qnext = NULL;
    c->q = c->q_tail = x;  // queued before the thread runs: a failed connect fails x with its reason
    c->last_act = kvx_now_ms();
    if (kvx_thread_start(a, sender_main, c, err, errlen)) {
      pthread_mutex_destroy(&c->mu);
      pthread_cond_destroy(&c->cv);
      free(c);
      return -1;
    }
    p->conn[KVX_BE_TCP] = c;
  }
  return 0;
}

static void tcp_drop(kvx_agent *a, kvx_peer *p, const char *why) {
  (void)a;
  tcp_conn *c = p->conn[KVX_BE_TCP];
  if (!c) return;
  p->conn[KVX_BE_TCP] = NULL;
  conn_fail(c, why);
  conn_unref(c);
}

const kvx_backend kvx_tcp_backend = {
    .name = "tcp",
    .init = tcp_init,
    .stop = tcp_stop,
    .fini = tcp_fini,
    .reg = kvx_no_reg,
    .dereg = kvx_no_dereg,
    .post = tcp_post,
    .drop = tcp_drop,
};
