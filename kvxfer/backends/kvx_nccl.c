// kvxfer/backends/kvx_nccl.c: the nccl backend's verbs: GPU-to-GPU ncclSend/ncclRecv of descriptor-listed device memory between two processes, the communicator bootstrapped over the core's tcp connection.
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

// Never served (the backend cannot be enabled); listed so that a refusal names the backend.
static int nccl_serve(kvx_srv *v, const kvx_hdr *h, char *why, size_t cap) {
  (void)v, (void)h;
  utl_seterr(why, cap, "nccl: not built in this agent");
  return KVX_SRV_REFUSE;
}

static const kvx_frame nccl_frames[] = {{KVX_F_NCCL_INIT, nccl_serve}, {KVX_F_NCCL_XFER, nccl_serve}, {0, NULL}};

const kvx_backend kvx_nccl_backend = {
    .name = "nccl",
    .rank = 0,  // only when asked
    .caps = KVX_CAP_LOCAL | KVX_CAP_REMOTE | KVX_CAP_CUDA,
    .listener = KVX_LS_TCP,
    .frames = nccl_frames,
    .init = nccl_init,
    .run = kvx_no_run,
};

#else
#include <cuda_runtime.h>
#include <nccl.h>

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
static int run_group(nccl_side *s, int send, const kvx_vdesc *d, size_t n, int other, char *why, size_t cap) {
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

// NCCL_INIT: this connection's end of a two-rank communicator (rank 1); NCCL_XFER: one request's descriptors,
// validated before this side posts its grouped recvs (or sends, for READ). The communicator is the connection's
// state (v->state), freed by nccl_serve_end.
static int nccl_serve(kvx_srv *v, const kvx_hdr *h, char *why, size_t cap) {
  kvx_agent *a = v->a;
  const char *peer = v->peer;
  void **state = &v->state[KVX_BE_NCCL];
  int to = a->timeout_ms;
  if (h->op == KVX_F_NCCL_INIT) {
    ncclUniqueId id;
    if (h->len != sizeof id || *state || kvx_srv_recv(v, &id, sizeof id, to, 0)) {
      utl_seterr(why, cap, "nccl: malformed communicator frame");
      return KVX_SRV_REFUSE;
    }
    nccl_side *s = calloc(1, sizeof *s);
    if (!s) {
      utl_seterr(why, cap, "out of memory");
      return KVX_SRV_REFUSE;
    }
    cudaSetDevice(a->cuda_device);
    ncclResult_t r = ncclCommInitRank(&s->comm, 2, id, 1);
    if (r != ncclSuccess || cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess) {
      utl_seterr(why, cap, "nccl: communicator init: %s", ncclGetErrorString(r));
      side_free(s);
      return KVX_SRV_REFUSE;
    }
    *state = s;
    if (kvx_send_frame(&v->ch, KVX_F_ACK, 0, h->req, 0, 0, 0, NULL, 0, to)) {
      utl_seterr(why, cap, "nccl: could not answer the communicator frame");
      return KVX_SRV_LOST;
    }
    return KVX_SRV_OK;
  }
  // NCCL_XFER: key = descriptor count, len = payload (kvx_vdesc descriptors, then the notification),
  // flags = KVX_WRITE|KVX_READ, addr = 1 when a notification travels with it.
  nccl_side *s = *state;
  uint64_t n = h->key;
  if (!s || n == 0 || n > (1u << 20) || h->len < n * sizeof(kvx_vdesc) ||
      h->len - n * sizeof(kvx_vdesc) > KVX_MAX_NOTIF || (h->flags != KVX_WRITE && h->flags != KVX_READ)) {
    utl_seterr(why, cap, "nccl: malformed transfer frame");
    return KVX_SRV_REFUSE;
  }
  uint8_t *buf = malloc(h->len);
  if (!buf || kvx_srv_recv(v, buf, h->len, to, 0)) {
    free(buf);
    utl_seterr(why, cap, "nccl: peer died mid-frame");
    return KVX_SRV_LOST;
  }
  kvx_vdesc *d = (kvx_vdesc *)buf;
  pthread_rwlock_rdlock(&a->reg_lock);
  for (uint64_t i = 0; i < n; i++) {
    kvx_region *r = kvx_check_access(a, d[i].key, d[i].addr, d[i].len, why, cap);
    if (!r || r->mem != KVX_MEM_CUDA) {
      if (r) utl_seterr(why, cap, "nccl: region 0x%016" PRIx64 " is not CUDA memory", d[i].key);
      pthread_rwlock_unlock(&a->reg_lock);
      free(buf);
      return KVX_SRV_REFUSE;
    }
  }
  // Ready: the initiator posts its side only after this, so a refused request never leaves it blocked in NCCL.
  if (kvx_send_frame(&v->ch, KVX_F_ACK, 0, h->req, 0, 0, 0, NULL, 0, to)) {
    pthread_rwlock_unlock(&a->reg_lock);
    free(buf);
    utl_seterr(why, cap, "nccl: could not answer the transfer frame");
    return KVX_SRV_LOST;
  }
  cudaSetDevice(a->cuda_device);
  int rc = run_group(s, h->flags == KVX_READ, d, (size_t)n, 0, why, cap);
  pthread_rwlock_unlock(&a->reg_lock);
  size_t nl = h->len - n * sizeof(kvx_vdesc);
  if (!rc && h->addr) kvx_push_notif(a, peer, buf + n * sizeof(kvx_vdesc), nl);
  free(buf);
  if (rc) return KVX_SRV_LOST;  // the initiator is inside its group: only closing tells it
  if (kvx_send_frame(&v->ch, KVX_F_ACK, 0, h->req, 0, 0, 0, NULL, 0, to)) {
    utl_seterr(why, cap, "nccl: could not acknowledge request %" PRIu64, h->req);
    return KVX_SRV_LOST;
  }
  return KVX_SRV_OK;
}

static void nccl_serve_end(kvx_agent *a, void *state) {
  (void)a;
  side_free(state);
}

static const kvx_frame nccl_frames[] = {{KVX_F_NCCL_INIT, nccl_serve}, {KVX_F_NCCL_XFER, nccl_serve}, {0, NULL}};

// ---- initiator ----
// Per request: NCCL_XFER frame -> ACK (receiver validated, posting its side) -> both run their grouped
// sends/recvs -> ACK (receiver's stream done, notification queued). A peer that dies inside the NCCL group is not
// detected by kvxfer's timeout (NCCL has none by default). The communicator is the connection's (c->priv).
static int wait_ack(kvx_conn *c, uint64_t id) {
  kvx_hdr h;
  return kvx_recv_all(&c->ch, &h, sizeof h, c->a->timeout_ms, 0) || h.magic != KVX_FRAME_MAGIC || h.op != KVX_F_ACK ||
                 h.req != id
             ? -1
             : 0;
}

static int nccl_open(kvx_conn *c, char *why, size_t cap) {
  kvx_agent *a = c->a;
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  nccl_side *s = calloc(1, sizeof *s);
  c->priv = s;
  int ok = s && r == ncclSuccess &&
           !kvx_send_frame(&c->ch, KVX_F_NCCL_INIT, 0, 0, 0, sizeof id, 0, &id, sizeof id, a->timeout_ms);
  if (ok) {
    cudaSetDevice(a->cuda_device);
    r = ncclCommInitRank(&s->comm, 2, id, 0);
    ok = r == ncclSuccess && cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) == cudaSuccess &&
         !wait_ack(c, 0);
  }
  if (!ok) utl_seterr(why, cap, "communicator set-up failed: %s", ncclGetErrorString(r));
  return ok ? 0 : -1;
}

static int nccl_run(kvx_conn *c, kvx_xfer *x, char *why, size_t cap) {
  int to = c->a->timeout_ms;
  for (size_t i = 0; i < x->n_segs; i++)
    if (x->segs[i].lmem != KVX_MEM_CUDA || x->segs[i].rmem != KVX_MEM_CUDA) {
      utl_seterr(why, cap, "nccl moves CUDA memory only (segment %zu is host memory)", i);
      return -1;
    }
  size_t dl = x->n_segs * sizeof(kvx_vdesc);
  uint8_t *buf = malloc(dl + x->notif_len);
  kvx_vdesc *loc = malloc(dl);
  if (!buf || !loc) {
    free(buf);
    free(loc);
    utl_seterr(why, cap, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < x->n_segs; i++) {
    ((kvx_vdesc *)buf)[i] = (kvx_vdesc){x->segs[i].raddr, x->segs[i].len, x->segs[i].rkey};
    loc[i] = (kvx_vdesc){x->segs[i].laddr, x->segs[i].len, 0};
  }
  if (x->notif_len) memcpy(buf + dl, x->notif, x->notif_len);
  // The receiver posts matching recvs (or sends, for READ) when this frame arrives; we run ours at once.
  int rc = kvx_send_frame(&c->ch, KVX_F_NCCL_XFER, (uint16_t)x->op, x->id, (uint64_t)x->has_notif, dl + x->notif_len,
                          x->n_segs, buf, dl + x->notif_len, to)
               ? -2
               : 0;
  free(buf);
  if (!rc && wait_ack(c, x->id)) {  // the receiver validated the descriptors and is posting its side
    utl_seterr(why, cap, "peer refused the transfer (see its log)");
    rc = -2;
  }
  if (!rc) {
    cudaSetDevice(c->a->cuda_device);
    rc = run_group(c->priv, x->op == KVX_WRITE, loc, x->n_segs, 1, why, cap) ? -2 : 0;
  }
  free(loc);
  if (!rc && wait_ack(c, x->id)) {
    utl_seterr(why, cap, "no acknowledgement on the connection");
    rc = -2;
  }
  if (rc == -2 && !why[0]) utl_seterr(why, cap, "connection failed");
  return rc;
}

static void nccl_close(kvx_conn *c) { side_free(c->priv); }

const kvx_backend kvx_nccl_backend = {
    .name = "nccl",
    .rank = 0,  // only when asked
    .caps = KVX_CAP_LOCAL | KVX_CAP_REMOTE | KVX_CAP_CUDA,
    .listener = KVX_LS_TCP,
    .frames = nccl_frames,
    .init = nccl_init,
    .open = nccl_open,
    .run = nccl_run,
    .close = nccl_close,
    .serve_end = nccl_serve_end,
};
#endif
