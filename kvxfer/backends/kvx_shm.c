// kvxfer/backends/kvx_shm.c: the shm backend's verbs: same-host peers; the receiver passes its kvx_host_alloc memfds over the core's unix socket (SCM_RIGHTS), the sender maps them and memcpy's directly.
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

typedef struct shm_export {  // a registered region that spans a whole kvx_host_alloc allocation (r->priv)
  int fd;        // its memfd (borrowed from the allocation)
  uint64_t off;  // file offset of the region's first byte
} shm_export;

static int shm_reg(kvx_agent *a, kvx_region *r, char *err, size_t errlen) {
  (void)a;
  int fd;
  uint64_t off;
  if (r->mem != KVX_MEM_HOST || !kvx_host_lookup(r->addr, r->len, &fd, &off)) return 0;  // not mappable: tcp only
  shm_export *e = malloc(sizeof *e);
  if (!e) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  *e = (shm_export){fd, off};
  r->priv[KVX_BE_SHM] = e;
  return 0;
}

static void shm_dereg(kvx_agent *a, kvx_region *r) {
  (void)a;
  free(r->priv[KVX_BE_SHM]);
  r->priv[KVX_BE_SHM] = NULL;
}

// ---- receiver: FDS_REQ answered with one FD frame (and its fd) per exportable region, then FDS_END ----
static int send_fd_frame(int fd, const kvx_region *r, const shm_export *e) {
  kvx_hdr h = {.magic = KVX_FRAME_MAGIC, .op = KVX_F_FD, .req = e->off, .addr = r->addr, .len = r->len, .key = r->key};
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
  memcpy(CMSG_DATA(c), &e->fd, sizeof(int));
  ssize_t w;
  do w = sendmsg(fd, &m, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  return w == (ssize_t)sizeof h ? 0 : -1;  // a unix stream socket takes 40 bytes whole or fails
}

static int serve_fds(kvx_srv *v, const kvx_hdr *h, char *why, size_t cap) {
  (void)h;
  kvx_agent *a = v->a;
  int bad = 0;
  pthread_rwlock_rdlock(&a->reg_lock);
  for (kvx_region *r = a->regions; r && !bad; r = r->next)
    if (r->priv[KVX_BE_SHM] && send_fd_frame(v->ch.fd, r, r->priv[KVX_BE_SHM])) bad = 1;
  pthread_rwlock_unlock(&a->reg_lock);
  if (bad || kvx_send_frame(&v->ch, KVX_F_FDS_END, 0, 0, 0, 0, 0, NULL, 0, a->timeout_ms)) {
    utl_seterr(why, cap, "could not pass region fds");
    return KVX_SRV_LOST;
  }
  return KVX_SRV_OK;
}

static const kvx_frame shm_frames[] = {{KVX_F_FDS_REQ, serve_fds}, {0, NULL}};

// ---- sender: the peer's regions mapped here (c->priv) ----
typedef struct shm_map {
  uint64_t key, addr, len;  // the peer's region
  uint8_t *base;            // where its first byte is mapped here
  void *map;                // (owned) mmap of map_len bytes
  size_t map_len;
} shm_map;

typedef struct shm_maps {
  shm_map *m;  // (n) (owned)
  size_t n;
} shm_maps;

static void unmap_all(shm_maps *s) {
  for (size_t i = 0; i < s->n; i++) munmap(s->m[i].map, s->m[i].map_len);
  free(s->m);
  s->m = NULL;
  s->n = 0;
}

// Asks the peer for its exportable regions and maps them all (replacing earlier maps).
static int fetch_maps(kvx_conn *c, char *why, size_t cap) {
  shm_maps *s = c->priv;
  unmap_all(s);
  if (kvx_send_frame(&c->ch, KVX_F_FDS_REQ, 0, 0, 0, 0, 0, NULL, 0, c->a->timeout_ms)) {
    utl_seterr(why, cap, "send failed");
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
    do r = recvmsg(c->ch.fd, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (r < 0 && errno == EINTR);
    for (struct cmsghdr *cm = r >= 0 ? CMSG_FIRSTHDR(&m) : NULL; cm; cm = CMSG_NXTHDR(&m, cm))
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) memcpy(&rfd, CMSG_DATA(cm), sizeof(int));
    if (r != (ssize_t)sizeof h || h.magic != KVX_FRAME_MAGIC) {
      if (rfd >= 0) close(rfd);
      utl_seterr(why, cap, "bad answer to the region request");
      return -1;
    }
    if (h.op == KVX_F_FDS_END) {
      if (rfd >= 0) close(rfd);
      return 0;
    }
    if (h.op != KVX_F_FD || rfd < 0 || h.len == 0 || h.req > (1ull << 47) || h.len > (1ull << 47)) {
      if (rfd >= 0) close(rfd);
      utl_seterr(why, cap, "bad region fd frame");
      return -1;
    }
    size_t ml = (size_t)(h.req + h.len);
    void *mp = mmap(NULL, ml, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, rfd, 0);
    close(rfd);
    if (mp == MAP_FAILED) {
      utl_seterr(why, cap, "mmap of the peer's region failed: %s", strerror(errno));
      return -1;
    }
    shm_map *nm = realloc(s->m, (s->n + 1) * sizeof *nm);
    if (!nm) {
      munmap(mp, ml);
      utl_seterr(why, cap, "out of memory");
      return -1;
    }
    s->m = nm;
    s->m[s->n++] = (shm_map){h.key, h.addr, h.len, (uint8_t *)mp + h.req, mp, ml};
  }
}

static uint8_t *map_ptr(const shm_maps *s, uint64_t key, uint64_t addr, uint64_t len) {
  for (size_t i = 0; i < s->n; i++) {
    const shm_map *m = &s->m[i];
    if (m->key != key) continue;
    if (addr >= m->addr && len <= m->len && addr - m->addr <= m->len - len) return m->base + (addr - m->addr);
    return NULL;
  }
  return NULL;
}

static int shm_check(const kvx_xfer *x, char *err, size_t errlen) {
  for (size_t i = 0; i < x->n_segs; i++)
    if (x->segs[i].lmem != KVX_MEM_HOST || x->segs[i].rmem != KVX_MEM_HOST) {
      utl_seterr(err, errlen, "shm: CUDA memory needs the rdma or nccl backend");
      return -1;
    }
  return 0;
}

static int shm_connect(kvx_conn *c, char *why, size_t cap) {
  if (!(c->priv = calloc(1, sizeof(shm_maps)))) {
    utl_seterr(why, cap, "out of memory");
    return -1;
  }
  // The fd list is read with blocking recvmsg: bound it.
  struct timeval tv = {.tv_sec = c->a->timeout_ms / 1000, .tv_usec = (c->a->timeout_ms % 1000) * 1000};
  setsockopt(c->ch.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fetch_maps(c, why, cap);
}

static int shm_run(kvx_conn *c, kvx_xfer *x, char *why, size_t cap) {
  const shm_maps *s = c->priv;
  for (int pass = 0; pass < 2; pass++) {  // a region the peer registered since: map again, once
    size_t i = 0;
    while (i < x->n_segs && map_ptr(s, x->segs[i].rkey, x->segs[i].raddr, x->segs[i].len)) i++;
    if (i == x->n_segs) break;
    if (pass == 1) {
      utl_seterr(why, cap,
                 "region of remote 0x%" PRIx64 " is not shm-exportable (allocate it with kvx_host_alloc and register it whole)",
                 x->segs[i].raddr);
      return -1;
    }
    if (fetch_maps(c, why, cap)) return -2;
  }
  for (size_t i = 0; i < x->n_segs; i++) {
    const kvx_seg *g = &x->segs[i];
    uint8_t *rp = map_ptr(s, g->rkey, g->raddr, g->len);
    if (x->op == KVX_WRITE)
      memcpy(rp, (void *)(uintptr_t)g->laddr, g->len);
    else
      memcpy((void *)(uintptr_t)g->laddr, rp, g->len);
  }
  // The bytes are in place: the notification follows them (nothing to acknowledge: this side never reads answers).
  if (x->has_notif && kvx_conn_send_end(c, x, 0)) {
    utl_seterr(why, cap, "notification could not be sent (peer gone?)");
    return -2;
  }
  return 0;
}

static void shm_disconnect(kvx_conn *c) {
  if (!c->priv) return;
  unmap_all(c->priv);
  free(c->priv);
}

static int shm_init(kvx_agent *a, char *err, size_t errlen) {
  (void)a, (void)err, (void)errlen;
  return 0;  // the core runs the unix listener
}

const kvx_backend kvx_shm_backend = {
    .name = "shm",
    .rank = 40,  // auto: first on one host
    .caps = KVX_CAP_LOCAL | KVX_CAP_HOST,
    .listener = KVX_LS_UNIX,
    .frames = shm_frames,
    .init = shm_init,
    .reg = shm_reg,
    .dereg = shm_dereg,
    .check = shm_check,
    .open = shm_connect,
    .run = shm_run,
    .close = shm_disconnect,
};
