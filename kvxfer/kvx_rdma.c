// kvxfer/kvx_rdma.c: the rdma backend: libibverbs RC queue pairs (set up over the tcp side channel), one-sided RDMA WRITE/READ, WRITE with immediate ending each write, GPUDirect registration of CUDA memory.
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

#ifdef DSERVE_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>
#endif

#define RDMA_PORT 1
#define RDMA_MAX_WR 256   // send queue depth
#define RDMA_RECVS 256    // receives kept posted for write-with-immediate

typedef struct kvx_rdma_qpinfo {
  uint32_t qpn, psn;
  uint16_t lid;
  uint8_t mtu, pad;
  uint8_t gid[16];
} kvx_rdma_qpinfo;

typedef struct rdma_srv_qp {  // the receiving end of a peer's QP
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  char peer[KVX_MAX_NAME];
  volatile int stop;
  struct rdma_srv_qp *next;
} rdma_srv_qp;

typedef struct rdma_state {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_port_attr port;
  union ibv_gid gid;
  int gid_index;
  char dev[64];
  pthread_mutex_t mu;  // srv
  rdma_srv_qp *srv;
} rdma_state;

static int rdma_init(kvx_agent *a, char *err, size_t errlen) {
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  if (!l || n == 0) {
    if (l) ibv_free_device_list(l);
    utl_seterr(err, errlen, "rdma: no RDMA device found (ibv_get_device_list returned 0 devices)");
    return -1;
  }
  rdma_state *st = calloc(1, sizeof *st);
  if (!st) {
    ibv_free_device_list(l);
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  snprintf(st->dev, sizeof st->dev, "%s", ibv_get_device_name(l[0]));
  st->ctx = ibv_open_device(l[0]);
  ibv_free_device_list(l);
  const char *gi = getenv("KVX_RDMA_GID_INDEX");
  st->gid_index = gi ? atoi(gi) : 0;
  if (!st->ctx || !(st->pd = ibv_alloc_pd(st->ctx)) || ibv_query_port(st->ctx, RDMA_PORT, &st->port) ||
      ibv_query_gid(st->ctx, RDMA_PORT, st->gid_index, &st->gid)) {
    utl_seterr(err, errlen, "rdma: cannot open %s: %s", st->dev, strerror(errno));
    if (st->pd) ibv_dealloc_pd(st->pd);
    if (st->ctx) ibv_close_device(st->ctx);
    free(st);
    return -1;
  }
  if (st->port.state != IBV_PORT_ACTIVE) {
    utl_seterr(err, errlen, "rdma: port %d of %s is not active", RDMA_PORT, st->dev);
    ibv_dealloc_pd(st->pd);
    ibv_close_device(st->ctx);
    free(st);
    return -1;
  }
  pthread_mutex_init(&st->mu, NULL);
  a->be_state[KVX_BE_RDMA] = st;
  return 0;
}

static void rdma_stop(kvx_agent *a) {
  rdma_state *st = a->be_state[KVX_BE_RDMA];
  if (!st) return;
  pthread_mutex_lock(&st->mu);
  for (rdma_srv_qp *q = st->srv; q; q = q->next) q->stop = 1;
  pthread_mutex_unlock(&st->mu);
}

static void rdma_fini(kvx_agent *a) {
  rdma_state *st = a->be_state[KVX_BE_RDMA];
  if (!st) return;
  while (st->srv) {
    rdma_srv_qp *q = st->srv;
    st->srv = q->next;
    ibv_destroy_qp(q->qp);
    ibv_destroy_cq(q->cq);
    free(q);
  }
  ibv_dealloc_pd(st->pd);
  ibv_close_device(st->ctx);
  pthread_mutex_destroy(&st->mu);
  free(st);
  a->be_state[KVX_BE_RDMA] = NULL;
}

static int rdma_reg(kvx_agent *a, kvx_region *r, char *err, size_t errlen) {
  rdma_state *st = a->be_state[KVX_BE_RDMA];
  int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  struct ibv_mr *mr = NULL;
  if (r->mem == KVX_MEM_CUDA) {
#ifdef DSERVE_HAVE_CUDA
    // GPUDirect: a dma-buf of the device range first, then plain ibv_reg_mr (nvidia-peermem).
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        fn &&
        q == cudaDriverEntryPointSuccess) {
      CUresult (*get)(void *, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long) = fn;
      uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
      uint64_t base = r->addr & ~(pg - 1), end = (r->addr + r->len + pg - 1) & ~(pg - 1);
      int fd = -1;
      if (get(&fd, (CUdeviceptr)base, end - base, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) == CUDA_SUCCESS && fd >= 0) {
        mr = ibv_reg_dmabuf_mr(st->pd, r->addr - base, r->len, r->addr, fd, acc);
        close(fd);
      }
    }
    if (!mr) mr = ibv_reg_mr(st->pd, (void *)(uintptr_t)r->addr, r->len, acc);
    if (!mr) {
      utl_seterr(err, errlen, "rdma: cannot register CUDA memory for GPUDirect (no dma-buf support and no nvidia-peermem): %s",
                  strerror(errno));
      return -1;
    }
#else
    utl_seterr(err, errlen, "rdma: CUDA memory needs a CUDA build");
    return -1;
#endif
  } else {
    mr = ibv_reg_mr(st->pd, (void *)(uintptr_t)r->addr, r->len, acc);
    if (!mr) {
      utl_seterr(err, errlen, "rdma: ibv_reg_mr(%" PRIu64 " bytes): %s", r->len, strerror(errno));
      return -1;
    }
  }
  r->rdma_mr = mr;
  r->rkey = mr->rkey;
  r->lkey = mr->lkey;
  return 0;
}

static void rdma_dereg(kvx_agent *a, kvx_region *r) {
  (void)a;
  if (r->rdma_mr) ibv_dereg_mr(r->rdma_mr);
  r->rdma_mr = NULL;
}

// ---- queue pairs ----
static struct ibv_qp *make_qp(rdma_state *st, struct ibv_cq *cq) {
  struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = RDMA_MAX_WR, .max_recv_wr = RDMA_RECVS, .max_send_sge = 1,
                                        .max_recv_sge = 1}};
  struct ibv_qp *qp = ibv_create_qp(st->pd, &ia);
  if (!qp) return NULL;
  struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = RDMA_PORT,
                           .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE};
  if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    return NULL;
  }
  return qp;
}

static void my_info(rdma_state *st, struct ibv_qp *qp, kvx_rdma_qpinfo *in) {
  memset(in, 0, sizeof *in);
  in->qpn = qp->qp_num;
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint32_t)kvx_now_ms();
  in->psn = r & 0xffffff;
  in->lid = st->port.lid;
  in->mtu = (uint8_t)st->port.active_mtu;
  memcpy(in->gid, st->gid.raw, 16);
}

static int connect_qp(rdma_state *st, struct ibv_qp *qp, const kvx_rdma_qpinfo *me, const kvx_rdma_qpinfo *peer) {
  struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTR,
                           .path_mtu = peer->mtu < st->port.active_mtu ? peer->mtu : st->port.active_mtu,
                           .dest_qp_num = peer->qpn, .rq_psn = peer->psn, .max_dest_rd_atomic = 16,
                           .min_rnr_timer = 12};
  at.ah_attr.dlid = peer->lid;
  at.ah_attr.port_num = RDMA_PORT;
  if (st->port.link_layer == IBV_LINK_LAYER_ETHERNET || peer->lid == 0) {
    at.ah_attr.is_global = 1;
    memcpy(at.ah_attr.grh.dgid.raw, peer->gid, 16);
    at.ah_attr.grh.sgid_index = (uint8_t)st->gid_index;
    at.ah_attr.grh.hop_limit = 64;
  }
  if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return -1;
  struct ibv_qp_attr rts = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
                            .sq_psn = me->psn, .max_rd_atomic = 16};
  return ibv_modify_qp(qp, &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                     IBV_QP_MAX_QP_RD_ATOMIC);
}

static int post_recv(struct ibv_qp *qp, uint64_t id) {
  struct ibv_recv_wr wr = {.wr_id = id, .num_sge = 0}, *bad;
  return ibv_post_recv(qp, &wr, &bad);
}

// Receiver: consumes write-with-immediate completions and keeps receives posted.
static void *srv_poll_main(void *p) {
  kvx_agent *a = ((void **)p)[0];
  rdma_srv_qp *q = ((void **)p)[1];
  free(p);
  while (!q->stop && !a->closing) {
    struct ibv_wc wc[16];
    int n = ibv_poll_cq(q->cq, 16, wc);
    if (n < 0) break;
    for (int i = 0; i < n; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        kvx_log(a, "rdma: completion error from '%s': %s", q->peer, ibv_wc_status_str(wc[i].status));
        q->stop = 1;
        break;
      }
      if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) post_recv(q->qp, wc[i].wr_id);
    }
    if (n == 0) usleep(200);
  }
  kvx_thread_exit(a);
  return NULL;
}

int kvx_rdma_serve_qp(kvx_agent *a, const char *peer, int fd, const kvx_hdr *h, char *why, size_t cap) {
  rdma_state *st = a->be_state[KVX_BE_RDMA];
  kvx_rdma_qpinfo in, me;
  if (h->len != sizeof in) {
    utl_seterr(why, cap, "rdma: malformed queue pair frame (%" PRIu64 " bytes)", h->len);
    return -1;
  }
  if (kvx_recv_all(fd, &in, sizeof in, a->timeout_ms, 0)) {
    utl_seterr(why, cap, "rdma: peer died mid-frame");
    return -1;
  }
  if (!st) {
    utl_seterr(why, cap, "rdma: not enabled on this agent");
    return -1;
  }
  rdma_srv_qp *q = calloc(1, sizeof *q);
  void **arg = malloc(2 * sizeof *arg);
  if (!q || !arg || !(q->cq = ibv_create_cq(st->ctx, RDMA_RECVS * 2, NULL, NULL, 0)) || !(q->qp = make_qp(st, q->cq))) {
    if (q && q->cq) ibv_destroy_cq(q->cq);
    free(q);
    free(arg);
    utl_seterr(why, cap, "rdma: cannot create a queue pair: %s", strerror(errno));
    return -1;
  }
  snprintf(q->peer, sizeof q->peer, "%s", peer);
  my_info(st, q->qp, &me);
  int ok = connect_qp(st, q->qp, &me, &in) == 0;
  for (int i = 0; ok && i < RDMA_RECVS; i++) ok = post_recv(q->qp, (uint64_t)i) == 0;
  if (!ok || kvx_send_frame(fd, KVX_F_RDMA_QP, 0, h->req, 0, sizeof me, 0, &me, sizeof me, a->timeout_ms)) {
    ibv_destroy_qp(q->qp);
    ibv_destroy_cq(q->cq);
    free(q);
    free(arg);
    utl_seterr(why, cap, "rdma: cannot connect the queue pair: %s", strerror(errno));
    return -1;
  }
  pthread_mutex_lock(&st->mu);
  q->next = st->srv;
  st->srv = q;
  pthread_mutex_unlock(&st->mu);
  arg[0] = a;
  arg[1] = q;
  char e[128];
  if (kvx_thread_start(a, srv_poll_main, arg, e, sizeof e)) {
    free(arg);
    q->stop = 1;
  }
  return 0;
}

// ---- initiator: one QP per peer, a worker thread ----
typedef struct rdma_conn {
  kvx_agent *a;
  char peer[KVX_MAX_NAME], host[64];
  int port;
  KVX_ATOMIC(int) refs;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int dead, fd;
  kvx_xfer *q, *q_tail;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
} rdma_conn;

static void rconn_unref(rdma_conn *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  if (c->qp) ibv_destroy_qp(c->qp);
  if (c->cq) ibv_destroy_cq(c->cq);
  if (c->fd >= 0) close(c->fd);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static void rconn_fail(rdma_conn *c, const char *why) {
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
    kvx_xfer_finish(x, KVX_ERR_PEER, "rdma: peer '%s': %s", c->peer, why);
  }
}

// Waits for `want` signaled completions; <0 on error or timeout.
static int wait_cq(rdma_conn *c, int want, char *why, size_t cap) {
  int64_t end = kvx_now_ms() + c->a->timeout_ms;
  while (want > 0) {
    struct ibv_wc wc[16];
    int n = ibv_poll_cq(c->cq, 16, wc);
    if (n < 0) {
      snprintf(why, cap, "ibv_poll_cq failed");
      return -1;
    }
    for (int i = 0; i < n; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        snprintf(why, cap, "work completion error: %s", ibv_wc_status_str(wc[i].status));
        return -1;
      }
      want--;
    }
    if (n == 0) {
      if (kvx_now_ms() > end) {
        snprintf(why, cap, "no completion for %d ms (peer dead or stalled)", c->a->timeout_ms);
        return -1;
      }
      usleep(50);
    }
  }
  return 0;
}

static int rdma_run(rdma_conn *c, kvx_xfer *x, char *why, size_t cap) {
  int to = c->a->timeout_ms;
  if (x->op != KVX_OP_NOTIFY) {
    for (size_t i = 0; i < x->n_segs; i++)
      if (!x->segs[i].lmr || !x->segs[i].rmr || x->segs[i].len > UINT32_MAX) {
        snprintf(why, cap, "segment %zu: region not registered with rdma, or over 4 GiB", i);
        return -1;
      }
    // Chunks of up to RDMA_MAX_WR/2 work requests, the last of each signaled; the request's last is
    // RDMA WRITE with immediate (the id), so the receiver sees the end of the write in its completion queue.
    size_t chunk = RDMA_MAX_WR / 2;
    for (size_t i = 0; i < x->n_segs; i += chunk) {
      size_t n = x->n_segs - i < chunk ? x->n_segs - i : chunk;
      struct ibv_sge sg[RDMA_MAX_WR / 2];
      struct ibv_send_wr wr[RDMA_MAX_WR / 2], *bad = NULL;
      memset(wr, 0, n * sizeof wr[0]);
      for (size_t k = 0; k < n; k++) {
        const kvx_seg *s = &x->segs[i + k];
        sg[k] = (struct ibv_sge){.addr = s->laddr, .length = (uint32_t)s->len, .lkey = s->lmr};
        wr[k].wr_id = x->id;
        wr[k].sg_list = &sg[k];
        wr[k].num_sge = 1;
        wr[k].opcode = x->op == KVX_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
        wr[k].wr.rdma.remote_addr = s->raddr;
        wr[k].wr.rdma.rkey = s->rmr;
        wr[k].next = k + 1 < n ? &wr[k + 1] : NULL;
      }
      wr[n - 1].send_flags = IBV_SEND_SIGNALED;
      if (x->op == KVX_WRITE && i + n == x->n_segs) {
        wr[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr[n - 1].imm_data = htonl((uint32_t)x->id);
      }
      if (ibv_post_send(c->qp, wr, &bad)) {
        snprintf(why, cap, "ibv_post_send: %s", strerror(errno));
        return -2;
      }
      if (wait_cq(c, 1, why, cap)) return -2;
    }
  }
  // The bytes are placed (RC completion); now the notification and the end marker over the side channel.
  uint16_t op = x->op == KVX_WRITE ? KVX_F_WRITE_END : x->op == KVX_READ ? KVX_F_READ_END : KVX_F_NOTIF;
  if (kvx_send_frame(c->fd, op, x->has_notif ? KVX_FL_NOTIF : 0, x->id, 0, x->notif_len, 0, x->notif, x->notif_len,
                     to)) {
    snprintf(why, cap, "side channel send failed");
    return -2;
  }
  if (op == KVX_F_NOTIF) return 0;
  kvx_hdr h;
  if (kvx_recv_all(c->fd, &h, sizeof h, to, 0) || h.magic != KVX_FRAME_MAGIC || h.op != KVX_F_ACK || h.req != x->id) {
    snprintf(why, cap, "no acknowledgement on the side channel");
    return -2;
  }
  return 0;
}

static void *rdma_worker_main(void *p) {
  rdma_conn *c = p;
  kvx_agent *a = c->a;
  rdma_state *st = a->be_state[KVX_BE_RDMA];
  char e[300] = "";
  int to = a->timeout_ms;
  kvx_rdma_qpinfo me, them;
  kvx_hdr h;
  int fd = kvx_tcp_connect(c->host, c->port, to, e, sizeof e);
  int ok = fd >= 0 && !kvx_handshake_client(fd, a->name, a->secret, a->secret_len, to, e, sizeof e);
  pthread_mutex_lock(&c->mu);
  c->fd = fd;
  pthread_mutex_unlock(&c->mu);
  if (ok && (!(c->cq = ibv_create_cq(st->ctx, RDMA_MAX_WR * 2, NULL, NULL, 0)) || !(c->qp = make_qp(st, c->cq)))) {
    snprintf(e, sizeof e, "cannot create a queue pair: %s", strerror(errno));
    ok = 0;
  }
  if (ok) {
    my_info(st, c->qp, &me);
    ok = !kvx_send_frame(fd, KVX_F_RDMA_QP, 0, 0, 0, sizeof me, 0, &me, sizeof me, to) &&
         !kvx_recv_all(fd, &h, sizeof h, to, 0) && h.magic == KVX_FRAME_MAGIC && h.op == KVX_F_RDMA_QP &&
         h.len == sizeof them && !kvx_recv_all(fd, &them, sizeof them, to, 0);
    if (!ok) snprintf(e, sizeof e, "queue pair exchange failed (peer without rdma?)");
    if (ok && connect_qp(st, c->qp, &me, &them)) {
      snprintf(e, sizeof e, "cannot connect the queue pair: %s", strerror(errno));
      ok = 0;
    }
  }
  if (!ok) rconn_fail(c, e);
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
    int rc = rdma_run(c, x, e, sizeof e);
    if (rc == 0)
      kvx_xfer_finish(x, 0, NULL);
    else
      kvx_xfer_finish(x, rc == -1 ? KVX_ERR : KVX_ERR_PEER, "rdma: peer '%s': %s", c->peer, e);
    if (rc == -2) {
      rconn_fail(c, e);
      break;
    }
  }
  rconn_unref(c);
  kvx_thread_exit(a);
  return NULL;
}

static int rdma_post(kvx_agent *a, kvx_peer *p, kvx_xfer *x, char *err, size_t errlen) {
  rdma_conn *c = p->conn[KVX_BE_RDMA];
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
    rconn_unref(c);
    c = p->conn[KVX_BE_RDMA] = NULL;
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
    if (kvx_thread_start(a, rdma_worker_main, c, err, errlen)) {
      pthread_cond_destroy(&c->cv);
      pthread_mutex_destroy(&c->mu);
      free(c);
      return -1;
    }
    p->conn[KVX_BE_RDMA] = c;
  }
  return 0;
}

static void rdma_drop(kvx_agent *a, kvx_peer *p, const char *why) {
  (void)a;
  rdma_conn *c = p->conn[KVX_BE_RDMA];
  if (!c) return;
  p->conn[KVX_BE_RDMA] = NULL;
  rconn_fail(c, why);
  rconn_unref(c);
}

const kvx_backend kvx_rdma_backend = {
    .name = "rdma",
    .init = rdma_init,
    .stop = rdma_stop,
    .fini = rdma_fini,
    .reg = rdma_reg,
    .dereg = rdma_dereg,
    .post = rdma_post,
    .drop = rdma_drop,
};
