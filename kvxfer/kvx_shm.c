// kvxfer/kvx_shm.c: the shm backend: same-host peers; the receiver's memfd regions are passed over a unix socket (SCM_RIGHTS) and mapped by the sender, which memcpy's directly.
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

const char *kvx_shm_path(kvx_agent *a);

typedef struct shm_srv {
  int fd;
  struct shm_srv *next;
} shm_srv;

typedef struct shm_state {
  int lfd;
  char dir[108];   // private folder (0700) holding the socket
  char path[108];  // the socket (0600)
  pthread_mutex_t mu;  // conns
  shm_srv *conns;
} shm_state;

const char *kvx_shm_path(kvx_agent *a) {
  shm_state *st = a->be_state[KVX_BE_SHM];
  return st ? st->path : "";
}

// ---- receiver side ----
static int send_fd_frame(int fd, const kvx_region *r, int timeout_ms) {
  kvx_hdr h = {.magic = KVX_FRAME_MAGIC, .op = KVX_F_FD, .req = r->shm_off, .addr = r->addr, .len = r->len,
               .key = r->key};
  struct iovec v = {&h, sizeof h};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &r->shm_fd, sizeof(int));
  (void)timeout_ms;
  for (;;) {
    ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w != (ssize_t)sizeof h) return -1;  // a unix stream socket takes 40 bytes whole or fails
    return 0;
  }
}

typedef struct shm_serve_arg {
  kvx_agent *a;
  shm_srv *c;
} shm_serve_arg;

static void *shm_serve_main(void *p) {
  shm_serve_arg s = *(shm_serve_arg *)p;
  free(p);
  kvx_agent *a = s.a;
  shm_state *st = a->be_state[KVX_BE_SHM];
  int fd = s.c->fd, to = a->timeout_ms;
  char peer[KVX_MAX_NAME] = "?", why[300] = "";
  uint8_t *nbuf = malloc(KVX_MAX_NOTIF);
  // Only this user's processes may even try the handshake: the socket's folder and mode already keep others out,
  // and the kernel's credentials of the connecting process say who it is.
  struct ucred cr = {0};
  socklen_t cl = sizeof cr;
  int cred_ok = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0 && cr.uid == geteuid();
  if (!nbuf) {
    snprintf(why, sizeof why, "out of memory");
  } else if (!cred_ok) {
    if (!a->closing)
      kvx_auth_refused(a, "shm: refused connection from pid %d uid %d: not this agent's user (uid %d)", (int)cr.pid,
                       (int)cr.uid, (int)geteuid());
  } else if (kvx_handshake_server(fd, a->secret, a->secret_len, to, peer, why, sizeof why)) {
    if (!a->closing) kvx_auth_refused(a, "shm: refused connection from pid %d: %s", (int)cr.pid, why);
  } else {
    for (;;) {
      kvx_hdr h;
      int rc = kvx_recv_all(fd, &h, sizeof h, 1000, 1);
      if (rc == 1) continue;
      if (rc < 0) break;
      int bad = 0;
      if (h.magic != KVX_FRAME_MAGIC) {
        snprintf(why, sizeof why, "malformed frame (bad magic)");
        bad = 1;
      } else if (h.op == KVX_F_FDS_REQ) {
        pthread_rwlock_rdlock(&a->reg_lock);
        for (kvx_region *r = a->regions; r && !bad; r = r->next)
          if (r->shm_fd >= 0 && send_fd_frame(fd, r, to)) bad = 2;
        pthread_rwlock_unlock(&a->reg_lock);
        if (!bad && kvx_send_frame(fd, KVX_F_FDS_END, 0, 0, 0, 0, 0, NULL, 0, to)) bad = 2;
        if (bad) snprintf(why, sizeof why, "could not pass region fds");
      } else if (h.op == KVX_F_NOTIF || h.op == KVX_F_WRITE_END || h.op == KVX_F_READ_END) {
        if (h.len > KVX_MAX_NOTIF) {
          snprintf(why, sizeof why, "notification of %" PRIu64 " bytes exceeds %d", h.len, KVX_MAX_NOTIF);
          bad = 1;
        } else if (kvx_recv_all(fd, nbuf, h.len, to, 0)) {
          snprintf(why, sizeof why, "peer died mid-notification");
          bad = 2;
        } else if (h.op == KVX_F_NOTIF || (h.flags & KVX_FL_NOTIF)) {
          kvx_push_notif(a, peer, nbuf, h.len);
        }
      } else {
        snprintf(why, sizeof why, "malformed frame (op %u on the shm socket)", h.op);
        bad = 1;
      }
      if (bad) {
        kvx_log(a, "shm: closing connection from '%s': %s", peer, why);
        if (bad == 1) kvx_send_frame(fd, KVX_F_ERR, 0, 0, 0, strlen(why), 0, why, strlen(why), 200);
        break;
      }
    }
  }
  free(nbuf);
  pthread_mutex_lock(&st->mu);
  for (shm_srv **pp = &st->conns; *pp; pp = &(*pp)->next)
    if (*pp == s.c) {
      *pp = s.c->next;
      break;
    }
  pthread_mutex_unlock(&st->mu);
  close(fd);
  free(s.c);
  kvx_thread_exit(a);
  return NULL;
}

static void *shm_accept_main(void *p) {
  kvx_agent *a = p;
  shm_state *st = a->be_state[KVX_BE_SHM];
  for (;;) {
    int fd = accept4(st->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      break;
    }
    shm_srv *c = calloc(1, sizeof *c);
    shm_serve_arg *s = calloc(1, sizeof *s);
    int ok = c && s;
    if (ok) {
      c->fd = fd;
      s->a = a;
      s->c = c;
      pthread_mutex_lock(&st->mu);
      ok = !a->closing;
      if (ok) {
        c->next = st->conns;
        st->conns = c;
      }
      pthread_mutex_unlock(&st->mu);
      char e[128];
      if (ok && kvx_thread_start(a, shm_serve_main, s, e, sizeof e)) {
        pthread_mutex_lock(&st->mu);
        st->conns = c->next;
        pthread_mutex_unlock(&st->mu);
        ok = 0;
      }
    }
    if (!ok) {
      close(fd);
      free(c);
      free(s);
    }
  }
  kvx_thread_exit(a);
  return NULL;
}

static int shm_init(kvx_agent *a, char *err, size_t errlen) {
  shm_state *st = calloc(1, sizeof *st);
  if (!st) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  // A fresh folder only this user can enter (mkdtemp makes it 0700), the socket inside it 0600: another user can
  // neither connect nor replace it. Bound before the chmod, but nobody else can reach it in between.
  int n = snprintf(st->dir, sizeof st->dir, "%s/kvx-%d-XXXXXX", a->shm_dir, (int)getpid());
  int m = n < 0 ? -1 : snprintf(st->path, sizeof st->path, "%s/s.sock", st->dir);
  if (n < 0 || (size_t)n >= sizeof st->dir || m < 0 || (size_t)m >= sizeof st->path) {
    utl_seterr(err, errlen, "shm: socket path under '%s' is too long", a->shm_dir);
    free(st);
    return -1;
  }
  if (!mkdtemp(st->dir) || chmod(st->dir, 0700)) {
    utl_seterr(err, errlen, "shm: cannot make a private folder under '%s': %s", a->shm_dir, strerror(errno));
    free(st);
    return -1;
  }
  memcpy(st->path, st->dir, (size_t)n); // mkdtemp filled in the XXXXXX; the length (checked above) is the same
  memcpy(st->path + n, "/s.sock", 8);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, st->path, strlen(st->path) + 1);
  st->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (st->lfd < 0 || bind(st->lfd, (struct sockaddr *)&sa, sizeof sa) || chmod(st->path, 0600) ||
      listen(st->lfd, 64)) {
    utl_seterr(err, errlen, "shm: listen on %s: %s", st->path, strerror(errno));
    if (st->lfd >= 0) close(st->lfd);
    unlink(st->path);
    rmdir(st->dir);
    free(st);
    return -1;
  }
  pthread_mutex_init(&st->mu, NULL);
  a->be_state[KVX_BE_SHM] = st;
  if (kvx_thread_start(a, shm_accept_main, a, err, errlen)) {
    unlink(st->path);
    rmdir(st->dir);
    close(st->lfd);
    pthread_mutex_destroy(&st->mu);
    free(st);
    a->be_state[KVX_BE_SHM] = NULL;
    return -1;
  }
  return 0;
}

static void shm_stop(kvx_agent *a) {
  shm_state *st = a->be_state[KVX_BE_SHM];
  if (!st) return;
  pthread_mutex_lock(&st->mu);
  shutdown(st->lfd, SHUT_RDWR);
  for (shm_srv *c = st->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
  pthread_mutex_unlock(&st->mu);
}

static void shm_fini(kvx_agent *a) {
  shm_state *st = a->be_state[KVX_BE_SHM];
  if (!st) return;
  unlink(st->path);
  rmdir(st->dir);
  close(st->lfd);
  pthread_mutex_destroy(&st->mu);
  free(st);
  a->be_state[KVX_BE_SHM] = NULL;
}

// ---- sender side: one connection per peer, one worker thread doing the copies ----
typedef struct shm_map {
  uint64_t key, addr, len;  // the peer's region
  uint8_t *base;            // where its first byte is mapped here
  void *map;                // (owned) mmap of map_len bytes
  size_t map_len;
} shm_map;

typedef struct shm_conn {
  kvx_agent *a;  // (borrowed)
  char peer[KVX_MAX_NAME];
  char path[108];
  KVX_ATOMIC(int) refs;  // the peer, the worker
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int fd, dead;
  kvx_xfer *q, *q_tail;
  shm_map *maps;  // (n_maps) (owned; worker only)
  size_t n_maps;
} shm_conn;

static void unmap_all(shm_conn *c) {
  for (size_t i = 0; i < c->n_maps; i++) munmap(c->maps[i].map, c->maps[i].map_len);
  free(c->maps);
  c->maps = NULL;
  c->n_maps = 0;
}

static void shm_conn_unref(shm_conn *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  unmap_all(c);
  if (c->fd >= 0) close(c->fd);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static void shm_conn_fail(shm_conn *c, const char *why) {
  pthread_mutex_lock(&c->mu);
  if (c->dead) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  c->dead = 1;
  kvx_xfer *q = c->q;
  c->q = c->q_tail = NULL;
  if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  int n = 0;
  for (kvx_xfer *x = q, *nx; x; x = nx) {
    nx = x->qnext;
    kvx_xfer_finish(x, KVX_ERR_PEER, "shm: peer '%s': %s", c->peer, why);
    n++;
  }
  if (n) kvx_log(c->a, "shm: connection to '%s' closed: %s (%d requests failed)", c->peer, why, n);
}

// Asks the peer for its exportable regions and maps them all (replacing earlier maps).
static int fetch_maps(shm_conn *c, char *why, size_t cap) {
  int to = c->a->timeout_ms;
  unmap_all(c);
  if (kvx_send_frame(c->fd, KVX_F_FDS_REQ, 0, 0, 0, 0, 0, NULL, 0, to)) {
    snprintf(why, cap, "send failed");
    return -1;
  }
  for (;;) {
    kvx_hdr h;
    struct iovec v = {&h, sizeof h};
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } u;
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    int rfd = -1;
    ssize_t r;
    do r = recvmsg(c->fd, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (r < 0 && errno == EINTR);
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) memcpy(&rfd, CMSG_DATA(cm), sizeof(int));
    if (r != (ssize_t)sizeof h || h.magic != KVX_FRAME_MAGIC) {
      if (rfd >= 0) close(rfd);
      snprintf(why, cap, "bad answer to the region request");
      return -1;
    }
    if (h.op == KVX_F_FDS_END) {
      if (rfd >= 0) close(rfd);
      return 0;
    }
    if (h.op != KVX_F_FD || rfd < 0 || h.len == 0 || h.req > (1ull << 47) || h.len > (1ull << 47)) {
      if (rfd >= 0) close(rfd);
      snprintf(why, cap, "bad region fd frame");
      return -1;
    }
    size_t ml = (size_t)(h.req + h.len);
    void *mp = mmap(NULL, ml, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, rfd, 0);
    close(rfd);
    if (mp == MAP_FAILED) {
      snprintf(why, cap, "mmap of the peer's region failed: %s", strerror(errno));
      return -1;
    }
    shm_map *nm = realloc(c->maps, (c->n_maps + 1) * sizeof *nm);
    if (!nm) {
      munmap(mp, ml);
      snprintf(why, cap, "out of memory");
      return -1;
    }
    c->maps = nm;
    c->maps[c->n_maps++] = (shm_map){h.key, h.addr, h.len, (uint8_t *)mp + h.req, mp, ml};
  }
}

static uint8_t *map_ptr(shm_conn *c, uint64_t key, uint64_t addr, uint64_t len) {
  for (size_t i = 0; i < c->n_maps; i++) {
    shm_map *m = &c->maps[i];
    if (m->key != key) continue;
    if (addr >= m->addr && len <= m->len && addr - m->addr <= m->len - len) return m->base + (addr - m->addr);
    return NULL;
  }
  return NULL;
}

// 0 done, -1 request error (why), -2 connection error (why).
static int run_xfer(shm_conn *c, kvx_xfer *x, char *why, size_t cap) {
  int to = c->a->timeout_ms;
  if (x->op != KVX_OP_NOTIFY) {
    for (int pass = 0; pass < 2; pass++) {
      size_t i = 0;
      for (; i < x->n_segs; i++)
        if (!map_ptr(c, x->segs[i].rkey, x->segs[i].raddr, x->segs[i].len)) break;
      if (i == x->n_segs) break;
      if (pass == 1) {
        snprintf(why, cap, "region of remote 0x%" PRIx64 " is not shm-exportable (allocate it with kvx_host_alloc and register it whole)",
                 x->segs[i].raddr);
        return -1;
      }
      if (fetch_maps(c, why, cap)) return -2;
    }
    for (size_t i = 0; i < x->n_segs; i++) {
      const kvx_seg *s = &x->segs[i];
      uint8_t *rp = map_ptr(c, s->rkey, s->raddr, s->len);
      if (x->op == KVX_WRITE)
        memcpy(rp, (void *)(uintptr_t)s->laddr, s->len);
      else
        memcpy((void *)(uintptr_t)s->laddr, rp, s->len);
    }
  }
  if (x->has_notif) {
    uint16_t op = x->op == KVX_WRITE ? KVX_F_WRITE_END : x->op == KVX_READ ? KVX_F_READ_END : KVX_F_NOTIF;
    if (kvx_send_frame(c->fd, op, KVX_FL_NOTIF, x->id, 0, x->notif_len, 0, x->notif, x->notif_len, to)) {
      snprintf(why, cap, "notification could not be sent (peer gone?)");
      return -2;
    }
  }
  return 0;
}

static void *shm_worker_main(void *p) {
  shm_conn *c = p;
  kvx_agent *a = c->a;
  char e[300];
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", c->path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    snprintf(e, sizeof e, "connect %s: %s", c->path, strerror(errno));
    if (fd >= 0) close(fd);
    fd = -1;
  } else if (kvx_handshake_client(fd, a->name, a->secret, a->secret_len, a->timeout_ms, e, sizeof e)) {
    close(fd);
    fd = -1;
  }
  if (fd >= 0) {  // the fd list is read with blocking recvmsg: bound it
    struct timeval tv = {.tv_sec = a->timeout_ms / 1000, .tv_usec = (a->timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  pthread_mutex_lock(&c->mu);
  c->fd = fd;
  pthread_mutex_unlock(&c->mu);
  if (fd < 0 || fetch_maps(c, e, sizeof e)) shm_conn_fail(c, e);
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
    pthread_mutex_unlock(&c->mu);
    int rc = run_xfer(c, x, e, sizeof e);
    if (rc == 0)
      kvx_xfer_finish(x, 0, NULL);
    else
      kvx_xfer_finish(x, rc == -1 ? KVX_ERR : KVX_ERR_PEER, "shm: peer '%s': %s", c->peer, e);
    if (rc == -2) {
      shm_conn_fail(c, e);
      break;
    }
  }
  shm_conn_unref(c);
  kvx_thread_exit(a);
  return NULL;
}

static int shm_post(kvx_agent *a, kvx_peer *p, kvx_xfer *x, char *err, size_t errlen) {
  for (size_t i = 0; i < x->n_segs; i++)
    if (x->segs[i].lmem != KVX_MEM_HOST || x->segs[i].rmem != KVX_MEM_HOST) {
      utl_seterr(err, errlen, "shm: CUDA memory needs the rdma or nccl backend");
      return -1;
    }
  shm_conn *c = p->conn[KVX_BE_SHM];
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
      pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (queued) return 0;
    shm_conn_unref(c);
    c = p->conn[KVX_BE_SHM] = NULL;
  }
  if (!c) {
    if (!p->shm_path[0]) {
      utl_seterr(err, errlen, "shm: peer '%s' has no shm endpoint", p->name);
      return -1;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
      utl_seterr(err, errlen, "out of memory");
      return -1;
    }
    c->a = a;
    snprintf(c->peer, sizeof c->peer, "%s", p->name);
    snprintf(c->path, sizeof c->path, "%s", p->shm_path);
    c->fd = -1;
    atomic_init(&c->refs, 2);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    x->qnext = NULL;
    c->q = c->q_tail = x;  // queued before the thread runs: a failed connect fails x with its reason
    if (kvx_thread_start(a, shm_worker_main, c, err, errlen)) {
      pthread_cond_destroy(&c->cv);
      pthread_mutex_destroy(&c->mu);
      free(c);
      return -1;
    }
    p->conn[KVX_BE_SHM] = c;
  }
  return 0;
}

static void shm_drop(kvx_agent *a, kvx_peer *p, const char *why) {
  (void)a;
  shm_conn *c = p->conn[KVX_BE_SHM];
  if (!c) return;
  p->conn[KVX_BE_SHM] = NULL;
  shm_conn_fail(c, why);
  shm_conn_unref(c);
}

const kvx_backend kvx_shm_backend = {
    .name = "shm",
    .init = shm_init,
    .stop = shm_stop,
    .fini = shm_fini,
    .reg = kvx_no_reg,
    .dereg = kvx_no_dereg,
    .post = shm_post,
    .drop = shm_drop,
};
