// kvxfer/kvx_nccl.c: the nccl backend: GPU-to-GPU ncclSend/ncclRecv of descriptor-listed device memory between two processes, the communicator bootstrapped over the tcp side channel.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

#if !defined(DSERVE_HAVE_CUDA) || !defined(DSERVE_HAVE_NCCL)

static int nccl_init(kvx_agent *a, char *err, size_t errlen) {
  (void)a;
  utl_seterr(err, errlen, "nccl: not built (no CUDA toolkit or NCCL at build time)");
  return -1;
}

int kvx_nccl_serve(kvx_agent *a, const char *peer, int fd, const kvx_hdr *h, void **state, char *why, size_t cap) {
  (void)a, (void)peer, (void)fd, (void)h, (void)state;
  utl_seterr(why, cap, "nccl: not built in this agent");
  return -1;
}
void kvx_nccl_serve_end(kvx_agent *a, void *state) { (void)a, (void)state; }

const kvx_backend kvx_nccl_backend = {"nccl", nccl_init, kvx_no_stop, kvx_no_fini, kvx_no_reg, kvx_no_dereg, kvx_no_post,
                                      kvx_no_drop};

#else
#include <cuda_runtime.h>
#include <nccl.h>

typedef struct nccl_wire_desc {  // one descriptor in a NCCL_XFER frame
  uint64_t addr, len, key;
} nccl_wire_desc;

static int nccl_init(kvx_agent *a, char *err, size_t errlen) {
  int n = 0;
  cudaError_t ce = cudaGetDeviceCount(&n);
  if (ce != cudaSuccess || n == 0) {
    utl_seterr(err, errlen, "nccl: no CUDA device (cudaGetDeviceCount: %s)",
                ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    return -1;
  }
  if (a->cuda_device < 0 || a->cuda_device >= n) {
    utl_seterr(err, errlen, "nccl: CUDA device %d does not exist (%d devices)", a->cuda_device, n);
    return -1;
  }
  return 0;
}

typedef struct nccl_side {  // one end of a two-rank communicator
  ncclComm_t comm;
  cudaStream_t stream;
} nccl_side;

static void side_free(nccl_side *s) {
  if (!s) return;
  if (s->comm) ncclCommDestroy(s->comm);
  if (s->stream) cudaStreamDestroy(s->stream);
  free(s);
}

// Runs every descriptor as a send or recv with the other rank, grouped, and waits for the stream.
static int run_group(nccl_side *s, int send, const nccl_wire_desc *d, size_t n, int other, char *why, size_t cap) {
  ncclResult_t r = ncclGroupStart();
  for (size_t i = 0; r == ncclSuccess && i < n; i++)
    r = send ? ncclSend((void *)(uintptr_t)d[i].addr, d[i].len, ncclUint8, other, s->comm, s->stream)
             : ncclRecv((void *)(uintptr_t)d[i].addr, d[i].len, ncclUint8, other, s->comm, s->stream);
  ncclResult_t r2 = ncclGroupEnd();
  if (r == ncclSuccess) r = r2;
  cudaError_t ce = r == ncclSuccess ? cudaStreamSynchronize(s->stream) : cudaSuccess;
  if (r != ncclSuccess || ce != cudaSuccess) {
    utl_seterr(why, cap, "nccl: %s", r != ncclSuccess ? ncclGetErrorString(r) : cudaGetErrorString(ce));
    return -1;
  }
  return 0;
}

int kvx_nccl_serve(kvx_agent *a, const char *peer, int fd, const kvx_hdr *h, void **state, char *why, size_t cap) {
  (void)peer;
  int to = a->timeout_ms;
  if (!(a->enabled & (1u << KVX_BE_NCCL))) {
    utl_seterr(why, cap, "nccl: not enabled on this agent");
    return -1;
  }
  if (h->op == KVX_F_NCCL_INIT) {
    ncclUniqueId id;
    if (h->len != sizeof id || *state || kvx_recv_all(fd, &id, sizeof id, to, 0)) {
      utl_seterr(why, cap, "nccl: malformed communicator frame");
      return -1;
    }
    nccl_side *s = calloc(1, sizeof *s);
    if (!s) return -1;
    cudaSetDevice(a->cuda_device);
    ncclResult_t r = ncclCommInitRank(&s->comm, 2, id, 1);
    if (r != ncclSuccess || cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess) {
      utl_seterr(why, cap, "nccl: communicator init: %s", ncclGetErrorString(r));
      side_free(s);
      return -1;
    }
    *state = s;
    return kvx_send_frame(fd, KVX_F_ACK, 0, h->req, 0, 0, 0, NULL, 0, to) ? -1 : 0;
  }
  // NCCL_XFER: key = descriptor count, len = payload (descriptors then notification), flags = KVX_WRITE|KVX_READ,
  // addr = 1 when a notification travels with it.
  nccl_side *s = *state;
  uint64_t n = h->key;
  if (!s || n == 0 || n > (1u << 20) || h->len < n * sizeof(nccl_wire_desc) ||
      h->len - n * sizeof(nccl_wire_desc) > KVX_MAX_NOTIF || (h->flags != KVX_WRITE && h->flags != KVX_READ)) {
    utl_seterr(why, cap, "nccl: malformed transfer frame");
    return -1;
  }
  uint8_t *buf = malloc(h->len);
  if (!buf || kvx_recv_all(fd, buf, h->len, to, 0)) {
    free(buf);
    utl_seterr(why, cap, "nccl: peer died mid-frame");
    return -1;
  }
  nccl_wire_desc *d = (nccl_wire_desc *)buf;
  pthread_rwlock_rdlock(&a->reg_lock);
  for (uint64_t i = 0; i < n; i++) {
    kvx_region *r = kvx_check_access(a, d[i].key, d[i].addr, d[i].len, why, cap);
    if (!r || r->mem != KVX_MEM_CUDA) {
      if (r) utl_seterr(why, cap, "nccl: region 0x%016" PRIx64 " is not CUDA memory", d[i].key);
      pthread_rwlock_unlock(&a->reg_lock);
      free(buf);
      return -1;
    }
  }
  // Ready: the initiator posts its side only after this, so a refused request never leaves it blocked in NCCL.
  if (kvx_send_frame(fd, KVX_F_ACK, 0, h->req, 0, 0, 0, NULL, 0, to)) {
    pthread_rwlock_unlock(&a->reg_lock);
    free(buf);
    utl_seterr(why, cap, "nccl: could not answer the transfer frame");
    return -1;
  }
  cudaSetDevice(a->cuda_device);
  int rc = run_group(s, h->flags == KVX_READ, d, (size_t)n, 0, why, cap);
  pthread_rwlock_unlock(&a->reg_lock);
  size_t nl = h->len - n * sizeof(nccl_wire_desc);
  if (!rc && h->addr) kvx_push_notif(a, peer, buf + n * sizeof(nccl_wire_desc), nl);
  free(buf);
  if (rc) return -1;
  return kvx_send_frame(fd, KVX_F_ACK, 0, h->req, 0, 0, 0, NULL, 0, to) ? -1 : 0;
}

void kvx_nccl_serve_end(kvx_agent *a, void *state) {
  (void)a;
  side_free(state);
}

// ---- initiator ----
// Per request: NCCL_XFER frame -> ACK (receiver validated, posting its side) -> both run their grouped
// sends/recvs -> ACK (receiver's stream done, notification queued). A peer that dies inside the NCCL group is not
// detected by kvxfer's timeout (NCCL has none by default).
typedef struct nccl_conn {
  kvx_agent *a;
  char peer[KVX_MAX_NAME], host[64];
  int port;
  KVX_ATOMIC(int) refs;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int dead, fd;
  kvx_xfer *q, *q_tail;
  nccl_side *side;
} nccl_conn;

static void nconn_unref(nccl_conn *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  side_free(c->side);
  if (c->fd >= 0) close(c->fd);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static void nconn_fail(nccl_conn *c, const char *why) {
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
  for (kvx_xfer *x = q, *nx; x; x = nx) {
    nx = x->qnext;
    kvx_xfer_finish(x, KVX_ERR_PEER, "nccl: peer '%s': %s", c->peer, why);
  }
}

static int wait_ack(nccl_conn *c, uint64_t id) {
  kvx_hdr h;
  return kvx_recv_all(c->fd, &h, sizeof h, c->a->timeout_ms, 0) || h.magic != KVX_FRAME_MAGIC || h.op != KVX_F_ACK ||
                 h.req != id
             ? -1
             : 0;
}

static int nccl_run(nccl_conn *c, kvx_xfer *x, char *why, size_t cap) {
  int to = c->a->timeout_ms;
  if (x->op == KVX_OP_NOTIFY) {
    if (kvx_send_frame(c->fd, KVX_F_NOTIF, 0, x->id, 0, x->notif_len, 0, x->notif, x->notif_len, to)) {
      snprintf(why, cap, "side channel send failed");
      return -2;
    }
    return 0;
  }
  for (size_t i = 0; i < x->n_segs; i++)
    if (x->segs[i].lmem != KVX_MEM_CUDA || x->segs[i].rmem != KVX_MEM_CUDA) {
      snprintf(why, cap, "nccl moves CUDA memory only (segment %zu is host memory)", i);
      return -1;
    }
  size_t dl = x->n_segs * sizeof(nccl_wire_desc);
  uint8_t *buf = malloc(dl + x->notif_len);
  nccl_wire_desc *loc = malloc(dl);
  if (!buf || !loc) {
    free(buf);
    free(loc);
    snprintf(why, cap, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < x->n_segs; i++) {
    ((nccl_wire_desc *)buf)[i] = (nccl_wire_desc){x->segs[i].raddr, x->segs[i].len, x->segs[i].rkey};
    loc[i] = (nccl_wire_desc){x->segs[i].laddr, x->segs[i].len, 0};
  }
  if (x->notif_len) memcpy(buf + dl, x->notif, x->notif_len);
  // The receiver posts matching recvs (or sends, for READ) when this frame arrives; we run ours at once.
  int rc = kvx_send_frame(c->fd, KVX_F_NCCL_XFER, (uint16_t)x->op, x->id, (uint64_t)x->has_notif, dl + x->notif_len, x->n_segs, buf,
                          dl + x->notif_len, to)
               ? -2
               : 0;
  free(buf);
  if (!rc && wait_ack(c, x->id)) {  // the receiver validated the descriptors and is posting its side
    snprintf(why, cap, "peer refused the transfer (see its log)");
    rc = -2;
  }
  if (!rc) {
    cudaSetDevice(c->a->cuda_device);
    rc = run_group(c->side, x->op == KVX_WRITE, loc, x->n_segs, 1, why, cap) ? -2 : 0;
  }
  free(loc);
  if (!rc && wait_ack(c, x->id)) {
    snprintf(why, cap, "no acknowledgement on the side channel");
    rc = -2;
  }
  if (rc == -2 && !why[0]) snprintf(why, cap, "side channel failed");
  return rc;
}

static void *nccl_worker_main(void *p) {
  nccl_conn *c = p;
  kvx_agent *a = c->a;
  char e[300] = "";
  int to = a->timeout_ms;
  int fd = kvx_tcp_connect(c->host, c->port, to, e, sizeof e);
  int ok = fd >= 0 && !kvx_handshake_client(fd, a->name, a->secret, a->secret_len, to, e, sizeof e);
  pthread_mutex_lock(&c->mu);
  c->fd = fd;
  pthread_mutex_unlock(&c->mu);
  if (ok) {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    ok = r == ncclSuccess && !kvx_send_frame(fd, KVX_F_NCCL_INIT, 0, 0, 0, sizeof id, 0, &id, sizeof id, to);
    if (ok && (c->side = calloc(1, sizeof *c->side))) {
      cudaSetDevice(a->cuda_device);
      r = ncclCommInitRank(&c->side->comm, 2, id, 0);
      ok = r == ncclSuccess && cudaStreamCreateWithFlags(&c->side->stream, cudaStreamNonBlocking) == cudaSuccess &&
           !wait_ack(c, 0);
    } else {
      ok = 0;
    }
    if (!ok) snprintf(e, sizeof e, "communicator set-up failed: %s", ncclGetErrorString(r));
  }
  if (!ok) nconn_fail(c, e);
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
    pthread_mutex_unlock(&c->mu);
    e[0] = 0;
    int rc = nccl_run(c, x, e, sizeof e);
    if (rc == 0)
      kvx_xfer_finish(x, 0, NULL);
    else
      kvx_xfer_finish(x, rc == -1 ? KVX_ERR : KVX_ERR_PEER, "nccl: peer '%s': %s", c->peer, e);
    if (rc == -2) {
      nconn_fail(c, e);
      break;
    }
  }
  nconn_unref(c);
  kvx_thread_exit(a);
  return NULL;
}

static int nccl_post(kvx_agent *a, kvx_peer *p, kvx_xfer *x, char *err, size_t errlen) {
  nccl_conn *c = p->conn[KVX_BE_NCCL];
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
    nconn_unref(c);
    c = p->conn[KVX_BE_NCCL] = NULL;
  }
  if (!c) {
    if (!(c = calloc(1, sizeof *c))) {
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
    if (kvx_thread_start(a, nccl_worker_main, c, err, errlen)) {
      pthread_cond_destroy(&c->cv);
      pthread_mutex_destroy(&c->mu);
      free(c);
      return -1;
    }
    p->conn[KVX_BE_NCCL] = c;
  }
  return 0;
}

static void nccl_drop(kvx_agent *a, kvx_peer *p, const char *why) {
  (void)a;
  nccl_conn *c = p->conn[KVX_BE_NCCL];
  if (!c) return;
  p->conn[KVX_BE_NCCL] = NULL;
  nconn_fail(c, why);
  nconn_unref(c);
}

const kvx_backend kvx_nccl_backend = {
    .name = "nccl",
    .init = nccl_init,
    .stop = kvx_no_stop,
    .fini = kvx_no_fini,
    .reg = kvx_no_reg,
    .dereg = kvx_no_dereg,
    .post = nccl_post,
    .drop = nccl_drop,
};
#endif
