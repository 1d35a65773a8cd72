// kvxfer/backends/kvx_rdma.c: the rdma backend's verbs: libibverbs RC queue pairs (set up over the core's tcp connection), one-sided RDMA WRITE/READ, WRITE with immediate ending each write, GPUDirect registration of CUDA memory.
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
  r->priv[KVX_BE_RDMA] = mr;
  r->word[KVX_BE_RDMA] = mr->lkey;
  return 0;
}

static void rdma_dereg(kvx_agent *a, kvx_region *r) {
  (void)a;
  if (r->priv[KVX_BE_RDMA]) ibv_dereg_mr(r->priv[KVX_BE_RDMA]);
  r->priv[KVX_BE_RDMA] = NULL;
  r->word[KVX_BE_RDMA] = 0;
}

// Metadata: the rkey of every region, in the blob's region order (0: not registered with rdma).
static int rdma_pack_md(kvx_agent *a, utl_buf *out, char *err, size_t errlen) {
  (void)err, (void)errlen;
  for (kvx_region *r = a->regions; r; r = r->next) {
    struct ibv_mr *mr = r->priv[KVX_BE_RDMA];
    uint32_t rkey = mr ? mr->rkey : 0;
    utl_buf_add(out, &rkey, sizeof rkey);
  }
  return 0;
}

static int rdma_load_md(kvx_agent *a, kvx_peer *p, const uint8_t *sec, size_t len, char *err, size_t errlen) {
  (void)a;
  if (len != p->n_regions * sizeof(uint32_t)) {
    utl_seterr(err, errlen, "metadata: rdma section of %zu bytes for %zu regions", len, p->n_regions);
    return -1;
  }
  for (size_t i = 0; i < p->n_regions; i++) {
    uint32_t rkey;
    memcpy(&rkey, sec + i * sizeof rkey, sizeof rkey);
    p->regions[i].word[KVX_BE_RDMA] = rkey;
  }
  return 0;
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
  if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint32_t)utl_now_ms();
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
static void *ctl_poll_main(void *p) {
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

// RDMA_QP: the receiving end of a peer's queue pair, connected to the peer's, polled by its own thread.
static int serve_qp(kvx_srv *v, const kvx_hdr *h, char *why, size_t cap) {
  kvx_agent *a = v->a;
  rdma_state *st = a->be_state[KVX_BE_RDMA];
  const char *peer = v->peer;
  kvx_rdma_qpinfo in, me;
  if (h->len != sizeof in) {
    utl_seterr(why, cap, "rdma: malformed queue pair frame (%" PRIu64 " bytes)", h->len);
    return KVX_SRV_REFUSE;
  }
  if (kvx_srv_recv(v, &in, sizeof in, a->timeout_ms, 0)) {
    utl_seterr(why, cap, "rdma: peer died mid-frame");
    return KVX_SRV_LOST;
  }
  rdma_srv_qp *q = calloc(1, sizeof *q);
  void **arg = malloc(2 * sizeof *arg);
  if (!q || !arg || !(q->cq = ibv_create_cq(st->ctx, RDMA_RECVS * 2, NULL, NULL, 0)) || !(q->qp = make_qp(st, q->cq))) {
    if (q && q->cq) ibv_destroy_cq(q->cq);
    free(q);
    free(arg);
    utl_seterr(why, cap, "rdma: cannot create a queue pair: %s", strerror(errno));
    return KVX_SRV_REFUSE;
  }
  snprintf(q->peer, sizeof q->peer, "%s", peer);
  my_info(st, q->qp, &me);
  int ok = connect_qp(st, q->qp, &me, &in) == 0;
  for (int i = 0; ok && i < RDMA_RECVS; i++) ok = post_recv(q->qp, (uint64_t)i) == 0;
  if (!ok || kvx_send_frame(&v->ch, KVX_F_RDMA_QP, 0, h->req, 0, sizeof me, 0, &me, sizeof me, a->timeout_ms)) {
    ibv_destroy_qp(q->qp);
    ibv_destroy_cq(q->cq);
    free(q);
    free(arg);
    utl_seterr(why, cap, "rdma: cannot connect the queue pair: %s", strerror(errno));
    return KVX_SRV_REFUSE;
  }
  pthread_mutex_lock(&st->mu);
  q->next = st->srv;
  st->srv = q;
  pthread_mutex_unlock(&st->mu);
  arg[0] = a;
  arg[1] = q;
  char e[128];
  if (kvx_thread_start(a, ctl_poll_main, arg, e, sizeof e)) {
    free(arg);
    q->stop = 1;
  }
  return KVX_SRV_OK;
}

static const kvx_frame rdma_frames[] = {{KVX_F_RDMA_QP, serve_qp}, {0, NULL}};

// ---- initiator: one QP per connection (c->priv) ----
typedef struct rdma_qp {
  struct ibv_cq *cq;
  struct ibv_qp *qp;
} rdma_qp;

// Waits for `want` signaled completions; <0 on error or timeout.
static int wait_cq(kvx_conn *c, int want, char *why, size_t cap) {
  rdma_qp *r = c->priv;
  int64_t end = utl_now_ms() + c->a->timeout_ms;
  while (want > 0) {
    struct ibv_wc wc[16];
    int n = ibv_poll_cq(r->cq, 16, wc);
    if (n < 0) {
      utl_seterr(why, cap, "ibv_poll_cq failed");
      return -1;
    }
    for (int i = 0; i < n; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        utl_seterr(why, cap, "work completion error: %s", ibv_wc_status_str(wc[i].status));
        return -1;
      }
      want--;
    }
    if (n == 0) {
      if (utl_now_ms() > end) {
        utl_seterr(why, cap, "no completion for %d ms (peer dead or stalled)", c->a->timeout_ms);
        return -1;
      }
      usleep(50);
    }
  }
  return 0;
}

// After the handshake: our queue pair, exchanged with the peer's receiving end over the connection.
static int rdma_open(kvx_conn *c, char *why, size_t cap) {
  rdma_state *st = c->a->be_state[KVX_BE_RDMA];
  int to = c->a->timeout_ms;
  rdma_qp *r = calloc(1, sizeof *r);
  if (!(c->priv = r)) {
    utl_seterr(why, cap, "out of memory");
    return -1;
  }
  if (!(r->cq = ibv_create_cq(st->ctx, RDMA_MAX_WR * 2, NULL, NULL, 0)) || !(r->qp = make_qp(st, r->cq))) {
    utl_seterr(why, cap, "cannot create a queue pair: %s", strerror(errno));
    return -1;
  }
  kvx_rdma_qpinfo me, them;
  kvx_hdr h;
  my_info(st, r->qp, &me);
  if (kvx_send_frame(&c->ch, KVX_F_RDMA_QP, 0, 0, 0, sizeof me, 0, &me, sizeof me, to) ||
      kvx_recv_all(&c->ch, &h, sizeof h, to, 0) || h.magic != KVX_FRAME_MAGIC || h.op != KVX_F_RDMA_QP ||
      h.len != sizeof them || kvx_recv_all(&c->ch, &them, sizeof them, to, 0)) {
    utl_seterr(why, cap, "queue pair exchange failed (peer without rdma?)");
    return -1;
  }
  if (connect_qp(st, r->qp, &me, &them)) {
    utl_seterr(why, cap, "cannot connect the queue pair: %s", strerror(errno));
    return -1;
  }
  return 0;
}

static int rdma_run(kvx_conn *c, kvx_xfer *x, char *why, size_t cap) {
  rdma_qp *r = c->priv;
  for (size_t i = 0; i < x->n_segs; i++)
    if (!x->segs[i].lword || !x->segs[i].rword || x->segs[i].len > UINT32_MAX) {
      utl_seterr(why, cap, "segment %zu: region not registered with rdma, or over 4 GiB", i);
      return -1;
    }
  // Chunks of up to RDMA_MAX_WR/2 work requests, the last of each signaled; the request's last is RDMA WRITE with
  // immediate (the id), so the receiver sees the end of the write in its completion queue.
  size_t chunk = RDMA_MAX_WR / 2;
  for (size_t i = 0; i < x->n_segs; i += chunk) {
    size_t n = x->n_segs - i < chunk ? x->n_segs - i : chunk;
    struct ibv_sge sg[RDMA_MAX_WR / 2];
    struct ibv_send_wr wr[RDMA_MAX_WR / 2], *bad = NULL;
    memset(wr, 0, n * sizeof wr[0]);
    for (size_t k = 0; k < n; k++) {
      const kvx_seg *s = &x->segs[i + k];
      sg[k] = (struct ibv_sge){.addr = s->laddr, .length = (uint32_t)s->len, .lkey = (uint32_t)s->lword};
      wr[k].wr_id = x->id;
      wr[k].sg_list = &sg[k];
      wr[k].num_sge = 1;
      wr[k].opcode = x->op == KVX_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
      wr[k].wr.rdma.remote_addr = s->raddr;
      wr[k].wr.rdma.rkey = (uint32_t)s->rword;
      wr[k].next = k + 1 < n ? &wr[k + 1] : NULL;
    }
    wr[n - 1].send_flags = IBV_SEND_SIGNALED;
    if (x->op == KVX_WRITE && i + n == x->n_segs) {
      wr[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr[n - 1].imm_data = htonl((uint32_t)x->id);
    }
    if (ibv_post_send(r->qp, wr, &bad)) {
      utl_seterr(why, cap, "ibv_post_send: %s", strerror(errno));
      return -2;
    }
    if (wait_cq(c, 1, why, cap)) return -2;
  }
  // The bytes are placed (RC completion): the end of the request and its notification go over the connection;
  // the peer's ACK (taken by the core's reader) finishes it.
  if (kvx_conn_send_end(c, x, 1)) {
    utl_seterr(why, cap, "connection send failed");
    return -2;
  }
  return 0;
}

static void rdma_close(kvx_conn *c) {
  rdma_qp *r = c->priv;
  if (!r) return;
  if (r->qp) ibv_destroy_qp(r->qp);
  if (r->cq) ibv_destroy_cq(r->cq);
  free(r);
}

const kvx_backend kvx_rdma_backend = {
    .name = "rdma",
    .rank = 30,  // auto: wherever both have a device
    .caps = KVX_CAP_LOCAL | KVX_CAP_REMOTE | KVX_CAP_HOST | KVX_CAP_CUDA | KVX_CAP_SOME_REGIONS,
    .listener = KVX_LS_TCP,
    .reader = 1,
    .frames = rdma_frames,
    .init = rdma_init,
    .stop = rdma_stop,
    .fini = rdma_fini,
    .reg = rdma_reg,
    .dereg = rdma_dereg,
    .pack_md = rdma_pack_md,
    .load_md = rdma_load_md,
    .open = rdma_open,
    .run = rdma_run,
    .close = rdma_close,
};
