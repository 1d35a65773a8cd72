// kvxfer/kvx_listen.c: the connection core's listeners (tcp; a private unix socket for shm): accept, make the peer prove the shared secret (and, on the unix socket, be this user), then hand each frame to the backend that registered its op.
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

typedef struct lconn {  // a served connection, kept so that closing the agent can shut it down
  int fd;
  struct lconn *next;
} lconn;

struct kvx_listener {
  kvx_agent *a;  // (borrowed)
  int kind;      // KVX_LS_*
  int lfd;
  char dir[108];   // unix: the private folder (0700) holding the socket
  char path[108];  // unix: the socket (0600)
  pthread_mutex_t mu;  // conns
  lconn *conns;
};

// Names in log lines: the unix socket exists for shm peers (and operators grep for "shm: refused").
static const char *ls_name(int kind) { return kind == KVX_LS_TCP ? "tcp" : "shm"; }

// ---- reading a served connection ----
int kvx_srv_flush(kvx_srv *v) {
  if (!v->ack) return 0;
  uint64_t req = v->ack;
  v->ack = 0;
  return kvx_send_frame(&v->ch, KVX_F_ACK, 0, req, 0, 0, 0, NULL, 0, v->a->timeout_ms);
}

void kvx_srv_ack(kvx_srv *v, uint64_t req) { v->ack = req; }

int kvx_srv_recvv(kvx_srv *v, struct iovec *iov, int n, int timeout_ms, int idle_ok) {
  n = kvx_iov_advance(&iov, n, 0);
  size_t left = 0, got = 0;
  for (int i = 0; i < n; i++) left += iov[i].iov_len;
  while (n > 0) {
    if (v->rpos < v->rlen) {  // what arrived with an earlier read first
      size_t k = v->rlen - v->rpos < iov->iov_len ? v->rlen - v->rpos : iov->iov_len;
      memcpy(iov->iov_base, v->rbuf + v->rpos, k);
      v->rpos += k, got += k, left -= k;
      n = kvx_iov_advance(&iov, n, k);
      continue;
    }
    int64_t r;
    // Small: read ahead whatever is there (a sealed channel reads ahead itself: its opened records).
    if (left < KVX_SRV_RBUF && !kvx_ch_sealed(&v->ch)) {
      struct iovec b = {v->rbuf, KVX_SRV_RBUF};
      r = kvx_recvv_now(&v->ch, &b, 1);
      if (r > 0) v->rpos = 0, v->rlen = (size_t)r;
    } else {  // large: straight into place; a deferred ACK goes first when this takes a while (the peer waits)
      if (left > KVX_SRV_ACK_HOLD && kvx_srv_flush(v)) return -1;
      r = kvx_recvv_now(&v->ch, iov, n);
      if (r > 0) {
        got += (size_t)r, left -= (size_t)r;
        n = kvx_iov_advance(&iov, n, (size_t)r);
      }
    }
    if (r < 0) return (int)r;
    if (r > 0) continue;
    // Nothing there: the peer is not sending, so what was deferred goes out before we wait.
    if (kvx_srv_flush(v)) return -1;
    int w = kvx_wait_in(&v->ch, timeout_ms);
    if (w == -2 && idle_ok && got == 0) return 1;
    if (w < 0) return w;
  }
  return 0;
}

int kvx_srv_recv(kvx_srv *v, void *p, size_t n, int timeout_ms, int idle_ok) {
  struct iovec b = {p, n};
  return kvx_srv_recvv(v, &b, 1, timeout_ms, idle_ok);
}

// ---- frames every connection carries: notifications and the ends of requests ----
static int serve_end(kvx_srv *v, const kvx_hdr *h, char *why, size_t cap) {
  if (h->len > KVX_MAX_NOTIF) {
    utl_seterr(why, cap, "notification of %" PRIu64 " bytes exceeds %d", h->len, KVX_MAX_NOTIF);
    return KVX_SRV_REFUSE;
  }
  if (kvx_srv_recv(v, v->nbuf, h->len, v->a->timeout_ms, 0)) {
    utl_seterr(why, cap, "peer died mid-notification");
    return KVX_SRV_LOST;
  }
  if (h->op == KVX_F_NOTIF || (h->flags & KVX_FL_NOTIF)) kvx_push_notif(v->a, v->peer, v->nbuf, h->len);
  if (h->op != KVX_F_NOTIF && !(h->flags & KVX_FL_NOACK)) kvx_srv_ack(v, h->req);
  return KVX_SRV_OK;
}

static const kvx_frame core_frames[] = {
    {KVX_F_WRITE_END, serve_end}, {KVX_F_READ_END, serve_end}, {KVX_F_NOTIF, serve_end}, {0, NULL}};

// The handler of op on this connection: the core's, or an enabled backend's that listens here.
static const kvx_frame *find_frame(kvx_srv *v, uint16_t op, char *why, size_t cap) {
  for (const kvx_frame *f = core_frames; f->serve; f++)
    if (f->op == op) return f;
  const char *owner = NULL;
  for (int i = 0; i < KVX_NBE; i++) {
    const kvx_backend *b = v->a->table[i];
    for (const kvx_frame *f = b->frames; f && f->serve; f++) {
      if (f->op != op) continue;
      if ((v->a->enabled & (1u << i)) && b->listener == v->ls) return f;
      owner = b->name;
    }
  }
  if (owner)
    utl_seterr(why, cap, "malformed frame (op %u belongs to the %s backend, not served here)", op, owner);
  else
    utl_seterr(why, cap, "malformed frame (unknown op %u)", op);
  return NULL;
}

static void ctl_refuse(kvx_srv *v, const char *why) {
  kvx_agent *a = v->a;
  kvx_log(a, "closing connection from '%s': %s", v->peer, why);
  kvx_send_frame(&v->ch, KVX_F_ERR, 0, 0, 0, strlen(why), 0, why, strlen(why), 200);
  // Lingering close: stop sending, discard what the peer still sends for a moment, so that it reads the reason
  // (a close with unread data would reset the connection and could drop the ERR frame). Raw reads: what is
  // discarded need not open.
  int fd = v->ch.fd;
  shutdown(fd, SHUT_WR);
  char sink[16384];
  int64_t end = utl_now_ms() + 200;
  while (utl_now_ms() < end && !a->closing) {
    int rc = kvx_fd_recv_all(fd, sink, 1, 50, 1);
    if (rc < 0) break;
    if (rc == 0) {
      ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      (void)n;
    }
  }
}

// Serves one authenticated peer until it closes or misbehaves.
static void serve_frames(kvx_srv *v) {
  kvx_agent *a = v->a;
  char why[300];
  for (;;) {
    kvx_hdr h;
    int rc = kvx_srv_recv(v, &h, sizeof h, 1000, 1);
    if (rc == 1) continue;
    if (rc == KVX_IO_SEAL) {  // the peer learns why; the count is the channel's
      ctl_refuse(v, kvx_io_why(rc));
      break;
    }
    if (rc < 0) break;  // closed, or lost mid-header: nothing was written
    why[0] = 0;
    const kvx_frame *f = NULL;
    if (h.magic != KVX_FRAME_MAGIC)
      utl_seterr(why, sizeof why, "malformed frame (bad magic 0x%08x)", h.magic);
    else
      f = find_frame(v, h.op, why, sizeof why);
    rc = f ? f->serve(v, &h, why, sizeof why) : KVX_SRV_REFUSE;
    if (rc != KVX_SRV_OK && v->ch.bad) {  // a record of the frame failed to open: say so, whatever the backend saw
      ctl_refuse(v, kvx_io_why(KVX_IO_SEAL));
      break;
    }
    if (rc == KVX_SRV_REFUSE) {
      ctl_refuse(v, why);
      break;
    }
    if (rc != KVX_SRV_OK) {
      if (!a->closing) kvx_log(a, "closing connection from '%s': %s", v->peer, why);
      break;
    }
  }
}

// The peer proves the shared secret (and on the unix socket that it runs as this user) before any frame.
static int prove(kvx_srv *v, const char *from) {
  kvx_agent *a = v->a;
  char who[64], why[300];
  snprintf(who, sizeof who, "%s", from);
  if (v->ls == KVX_LS_UNIX) {
    // The socket's folder and mode already keep other users out; the kernel's credentials of the connecting
    // process say who it is, in case one got in anyway.
    struct ucred cr = {0};
    socklen_t cl = sizeof cr;
    if (getsockopt(v->ch.fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) || cr.uid != geteuid()) {
      if (!a->closing)
        kvx_auth_refused(a, "shm: refused connection from pid %d uid %d: not this agent's user (uid %d)",
                         (int)cr.pid, (int)cr.uid, (int)geteuid());
      return 0;
    }
    snprintf(who, sizeof who, "pid %d", (int)cr.pid);
  } else {
    kvx_sock_timeouts(v->ch.fd, a->timeout_ms);
  }
  // Sealed through the tcp listener when this agent seals; a unix socket stays on this host and user: plain.
  int seal = v->ls == KVX_LS_TCP && a->seal;
  if (kvx_handshake_server(&v->ch, a->secret, a->secret_len, seal, a->timeout_ms, v->peer, why, sizeof why)) {
    if (!a->closing) kvx_auth_refused(a, "%s: refused connection from %s: %s", ls_name(v->ls), who, why);
    return 0;
  }
  return 1;
}

typedef struct serve_arg {
  kvx_listener *l;
  lconn *c;
  char from[64];
} serve_arg;

static void *serve_main(void *p) {
  serve_arg s = *(serve_arg *)p;
  free(p);
  kvx_listener *l = s.l;
  kvx_agent *a = l->a;
  kvx_srv v = {.a = a, .ls = l->kind, .peer = "?"};
  kvx_ch_init(&v.ch, s.c->fd);
  v.ch.fails = &a->auth_failures;
  v.nbuf = malloc(KVX_MAX_NOTIF);
  v.rbuf = malloc(KVX_SRV_RBUF);
  if (v.nbuf && v.rbuf && prove(&v, s.from)) serve_frames(&v);
  for (int i = 0; i < KVX_NBE; i++)
    if (v.state[i] && a->table[i]->serve_end) a->table[i]->serve_end(a, v.state[i]);
  free(v.nbuf);
  free(v.rbuf);
  kvx_ch_free(&v.ch);
  pthread_mutex_lock(&l->mu);
  for (lconn **pp = &l->conns; *pp; pp = &(*pp)->next)
    if (*pp == s.c) {
      *pp = s.c->next;
      break;
    }
  pthread_mutex_unlock(&l->mu);
  close(s.c->fd);
  free(s.c);
  kvx_thread_exit(a);
  return NULL;
}

static void *accept_main(void *p) {
  kvx_listener *l = p;
  kvx_agent *a = l->a;
  for (;;) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(l->lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (!a->closing) kvx_log(a, "%s: accept: %s; no longer accepting", ls_name(l->kind), strerror(errno));
      break;
    }
    lconn *c = calloc(1, sizeof *c);
    serve_arg *s = calloc(1, sizeof *s);
    if (!c || !s) {
      free(c);
      free(s);
      close(fd);
      continue;
    }
    c->fd = fd;
    s->l = l;
    s->c = c;
    if (sa.ss_family == AF_INET) {
      const struct sockaddr_in *in = (const struct sockaddr_in *)&sa;
      char ip[32];
      inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
      snprintf(s->from, sizeof s->from, "%s:%d", ip, ntohs(in->sin_port));
    }
    pthread_mutex_lock(&l->mu);
    int closing = a->closing;
    if (!closing) {
      c->next = l->conns;
      l->conns = c;
    }
    pthread_mutex_unlock(&l->mu);
    char e[128];
    if (closing || kvx_thread_start(a, serve_main, s, e, sizeof e)) {
      if (!closing) {
        pthread_mutex_lock(&l->mu);
        for (lconn **pp = &l->conns; *pp; pp = &(*pp)->next)
          if (*pp == c) {
            *pp = c->next;
            break;
          }
        pthread_mutex_unlock(&l->mu);
      }
      close(fd);
      free(c);
      free(s);
    }
  }
  kvx_thread_exit(a);
  return NULL;
}

// ---- starting and stopping ----
static int open_tcp(kvx_agent *a, kvx_listener *l, const char *who, char *err, size_t errlen) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->listen_port)};
  if (inet_pton(AF_INET, a->listen_host, &sa.sin_addr) != 1) {
    utl_seterr(err, errlen, "%s: bad listen address '%s' (numeric IPv4)", who, a->listen_host);
    return -1;
  }
  l->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (l->lfd >= 0) setsockopt(l->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t sl = sizeof sa;
  if (l->lfd < 0 || bind(l->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(l->lfd, 128) ||
      getsockname(l->lfd, (struct sockaddr *)&sa, &sl)) {
    utl_seterr(err, errlen, "%s: listen on %s:%d: %s", who, a->listen_host, a->listen_port, strerror(errno));
    return -1;
  }
  a->listen_port = ntohs(sa.sin_port);
  return 0;
}

static int open_unix(kvx_agent *a, kvx_listener *l, const char *who, char *err, size_t errlen) {
  // A fresh folder only this user can enter (mkdtemp makes it 0700), the socket inside it 0600: another user can
  // neither connect nor replace it. Bound before the chmod, but nobody else can reach it in between.
  int n = snprintf(l->dir, sizeof l->dir, "%s/kvx-%d-XXXXXX", a->shm_dir, (int)getpid());
  int m = n < 0 ? -1 : snprintf(l->path, sizeof l->path, "%s/s.sock", l->dir);
  if (n < 0 || (size_t)n >= sizeof l->dir || m < 0 || (size_t)m >= sizeof l->path) {
    utl_seterr(err, errlen, "%s: socket path under '%s' is too long", who, a->shm_dir);
    l->dir[0] = l->path[0] = 0;
    return -1;
  }
  if (!mkdtemp(l->dir) || chmod(l->dir, 0700)) {
    utl_seterr(err, errlen, "%s: cannot make a private folder under '%s': %s", who, a->shm_dir, strerror(errno));
    l->dir[0] = l->path[0] = 0;
    return -1;
  }
  memcpy(l->path, l->dir, (size_t)n);  // mkdtemp filled in the XXXXXX; the length (checked above) is the same
  memcpy(l->path + n, "/s.sock", 8);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, l->path, strlen(l->path) + 1);
  l->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->lfd < 0 || bind(l->lfd, (struct sockaddr *)&sa, sizeof sa) || chmod(l->path, 0600) || listen(l->lfd, 64)) {
    utl_seterr(err, errlen, "%s: listen on %s: %s", who, l->path, strerror(errno));
    return -1;
  }
  return 0;
}

static void listener_free(kvx_listener *l) {
  if (!l) return;
  if (l->lfd >= 0) close(l->lfd);
  if (l->path[0]) unlink(l->path);
  if (l->dir[0]) rmdir(l->dir);
  pthread_mutex_destroy(&l->mu);
  free(l);
}

int kvx_listen_start(kvx_agent *a, int ls, const char *who, char *err, size_t errlen) {
  kvx_listener *l = calloc(1, sizeof *l);
  if (!l) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  l->a = a;
  l->kind = ls;
  l->lfd = -1;
  pthread_mutex_init(&l->mu, NULL);
  if ((ls == KVX_LS_TCP ? open_tcp : open_unix)(a, l, who, err, errlen) ||
      kvx_thread_start(a, accept_main, l, err, errlen)) {
    listener_free(l);
    return -1;
  }
  a->ls[ls] = l;
  return 0;
}

void kvx_listen_stop(kvx_agent *a) {
  for (int i = 0; i < KVX_NLS; i++) {
    kvx_listener *l = a->ls[i];
    if (!l) continue;
    pthread_mutex_lock(&l->mu);
    shutdown(l->lfd, SHUT_RDWR);
    for (lconn *c = l->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&l->mu);
  }
}

void kvx_listen_free(kvx_agent *a) {
  for (int i = 0; i < KVX_NLS; i++) {
    listener_free(a->ls[i]);
    a->ls[i] = NULL;
  }
}

const char *kvx_unix_path(kvx_agent *a) { return a->ls[KVX_LS_UNIX] ? a->ls[KVX_LS_UNIX]->path : ""; }
