// kvxfer/backends/kvx_tcp.c: the tcp backend's verbs: a request's descriptors and payloads in one WRITEV/READV frame and one writev, at most one ACK per request; the validating receiver of those frames.
//
// Sender: per request, frames of up to KVX_MAX_VEC descriptors (usually one frame), each a single gather send of
// header, descriptor list, payloads and, on the last, the notification. Requests pipeline on the connection; the
// core's reader thread takes the ACKs and READ_DATA. A small request starts on the posting thread (tcp_start).
// Receiver: the whole descriptor list is checked against the registered regions before a byte lands, then the
// payloads are received straight into place (scatter receives; a small frame comes in whole with one recv into
// the connection's read-ahead), and the ACK may wait to cover the requests right behind it (kvx_srv_ack).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/kvx_int.h"

// ---- receiver ----
// Checks n descriptors against this agent's host regions (reg_lock held); fills iov with where each lands and
// total with their bytes. KVX_SRV_OK or KVX_SRV_REFUSE with why.
static int check_descs(kvx_agent *a, const kvx_vdesc *d, size_t n, struct iovec *iov, uint64_t *total, char *why,
                       size_t cap) {
  uint64_t t = 0;
  for (size_t i = 0; i < n; i++) {
    kvx_region *r = kvx_check_access(a, d[i].key, d[i].addr, d[i].len, why, cap);
    if (r && r->mem != KVX_MEM_HOST) {
      utl_seterr(why, cap, "region 0x%016" PRIx64 " is CUDA memory: tcp moves host memory only", d[i].key);
      r = NULL;
    }
    if (!r) return KVX_SRV_REFUSE;
    if (t + d[i].len < t) {
      utl_seterr(why, cap, "descriptor lengths overflow");
      return KVX_SRV_REFUSE;
    }
    t += d[i].len;
    iov[i] = (struct iovec){(void *)(uintptr_t)d[i].addr, d[i].len};
  }
  *total = t;
  return KVX_SRV_OK;
}

static int lost(int rc, const char *what, char *why, size_t cap) {
  utl_seterr(why, cap, "peer died or stalled mid-%s (%s)", what, kvx_io_why(rc));
  return KVX_SRV_LOST;
}

// WRITE and READ: one descriptor in the header (the request's end comes as a separate *_END frame).
static int serve_one(kvx_srv *v, const kvx_hdr *h, char *why, size_t cap) {
  kvx_agent *a = v->a;
  kvx_vdesc d = {h->addr, h->len, h->key};
  struct iovec iov[2];
  uint64_t total;
  pthread_rwlock_rdlock(&a->reg_lock);
  int rc = check_descs(a, &d, 1, iov + 1, &total, why, cap);
  if (rc == KVX_SRV_OK && h->op == KVX_F_WRITE) {
    if ((rc = kvx_srv_recvv(v, iov + 1, 1, a->timeout_ms, 0))) rc = lost(rc, "write", why, cap);
  } else if (rc == KVX_SRV_OK) {
    kvx_hdr o = {.magic = KVX_FRAME_MAGIC, .op = KVX_F_READ_DATA, .req = h->req, .addr = 1, .len = h->len};
    iov[0] = (struct iovec){&o, sizeof o};
    if ((rc = kvx_sendv_all(&v->ch, iov, 2, a->timeout_ms))) rc = lost(rc, "read", why, cap);
  }
  pthread_rwlock_unlock(&a->reg_lock);
  return rc;
}

// WRITEV and READV: a descriptor list; with KVX_FL_END the request ends here (notification, ACK).
static int serve_vec(kvx_srv *v, const kvx_hdr *h, char *why, size_t cap) {
  kvx_agent *a = v->a;
  int end = (h->flags & KVX_FL_END) != 0, wr = h->op == KVX_F_WRITEV;
  uint64_t n = h->addr, nl = h->key;
  if (n == 0 || n > KVX_MAX_VEC || nl > (end ? KVX_MAX_NOTIF : 0)) {
    utl_seterr(why, cap, "malformed %s frame (%" PRIu64 " descriptors, %" PRIu64 " notification bytes)",
               wr ? "write" : "read", n, nl);
    return KVX_SRV_REFUSE;
  }
  kvx_vdesc d[KVX_MAX_VEC];
  struct iovec iov[KVX_MAX_VEC + 3];
  int rc = kvx_srv_recv(v, d, n * sizeof *d, a->timeout_ms, 0);
  if (!rc && !wr && nl) rc = kvx_srv_recv(v, v->nbuf, nl, a->timeout_ms, 0);
  if (rc) return lost(rc, wr ? "write" : "read", why, cap);
  uint64_t total = 0; // check_descs leaves it unset on a refusal, and the reply header is built either way
  pthread_rwlock_rdlock(&a->reg_lock);
  rc = check_descs(a, d, n, iov + 1, &total, why, cap);
  if (rc == KVX_SRV_OK && total != h->len) {
    utl_seterr(why, cap, "frame length %" PRIu64 " does not match its descriptors (%" PRIu64 ")", h->len, total);
    rc = KVX_SRV_REFUSE;
  }
  kvx_hdr o = {.magic = KVX_FRAME_MAGIC, .op = KVX_F_READ_DATA, .req = h->req, .addr = n, .len = total};
  if (rc == KVX_SRV_OK && wr) {  // payloads straight into place, then the notification
    iov[n + 1] = (struct iovec){v->nbuf, nl};
    if ((rc = kvx_srv_recvv(v, iov + 1, (int)n + 1, a->timeout_ms, 0))) rc = lost(rc, "write", why, cap);
  } else if (rc == KVX_SRV_OK) {  // READ_DATA with every payload in one send
    iov[0] = (struct iovec){&o, sizeof o};
    if ((rc = kvx_sendv_all(&v->ch, iov, (int)n + 1, a->timeout_ms))) rc = lost(rc, "read", why, cap);
  }
  pthread_rwlock_unlock(&a->reg_lock);
  if (rc != KVX_SRV_OK || !end) return rc;
  if (h->flags & KVX_FL_NOTIF) kvx_push_notif(a, v->peer, v->nbuf, nl);
  kvx_srv_ack(v, h->req);
  return KVX_SRV_OK;
}

static const kvx_frame tcp_frames[] = {{KVX_F_WRITE, serve_one},
                                       {KVX_F_READ, serve_one},
                                       {KVX_F_WRITEV, serve_vec},
                                       {KVX_F_READV, serve_vec},
                                       {0, NULL}};

// ---- sender ----
static int tcp_check(const kvx_xfer *x, char *err, size_t errlen) {
  for (size_t i = 0; i < x->n_segs; i++)
    if (x->segs[i].lmem != KVX_MEM_HOST || x->segs[i].rmem != KVX_MEM_HOST) {
      utl_seterr(err, errlen, "tcp: CUDA memory needs the rdma or nccl backend");
      return -1;
    }
  return 0;
}

// Frame f of x (descriptors [f * KVX_MAX_VEC, ...)) as gather entries over h, d and x's memory; returns how many,
// and the frame's bytes in *bytes.
static int tcp_frame(const kvx_xfer *x, size_t f, kvx_hdr *h, kvx_vdesc *d, struct iovec *iov, uint64_t *bytes) {
  int wr = x->op == KVX_WRITE, k = 0;
  size_t i = f * KVX_MAX_VEC, n = x->n_segs - i < KVX_MAX_VEC ? x->n_segs - i : KVX_MAX_VEC;
  int end = i + n == x->n_segs;
  uint64_t pay = 0;
  for (size_t j = 0; j < n; j++) {
    const kvx_seg *s = &x->segs[i + j];
    d[j] = (kvx_vdesc){s->raddr, s->len, s->rkey};
    pay += s->len;
  }
  uint16_t fl = (uint16_t)(end ? KVX_FL_END | (x->has_notif ? KVX_FL_NOTIF : 0) : 0);
  *h = (kvx_hdr){.magic = KVX_FRAME_MAGIC, .op = wr ? KVX_F_WRITEV : KVX_F_READV, .flags = fl, .req = x->id,
                 .addr = n, .len = pay, .key = end ? x->notif_len : 0};
  iov[k++] = (struct iovec){h, sizeof *h};
  iov[k++] = (struct iovec){d, n * sizeof *d};
  for (size_t j = 0; wr && j < n; j++) iov[k++] = (struct iovec){(void *)(uintptr_t)x->segs[i + j].laddr, d[j].len};
  if (end) iov[k++] = (struct iovec){x->notif, x->notif_len};
  *bytes = sizeof *h + n * sizeof *d + (wr ? pay : 0) + (end ? x->notif_len : 0);
  return k;
}

// Sends x's frames from byte x->sent of them on: waiting as long as the peer drains them (wait), or only what the
// socket takes now. 0: all sent; 1: the socket is full (x->sent says how far); <0: kvx_sendv_all's error.
// x->sent is written only while x cannot be answered yet: once its last byte is out, the peer's ACK may finish x
// and its owner post it again at any moment.
static int tcp_send(kvx_conn *c, kvx_xfer *x, int wait) {
  kvx_hdr h;
  kvx_vdesc d[KVX_MAX_VEC];
  struct iovec iov[KVX_MAX_VEC + 3];
  uint64_t sent = x->sent, at = 0, bytes;  // where frame f starts in the stream of x's frames, and its size
  size_t n_segs = x->n_segs;
  for (size_t f = 0; f * KVX_MAX_VEC < n_segs; f++, at += bytes) {
    int k = tcp_frame(x, f, &h, d, iov, &bytes);
    if (sent >= at + bytes) continue;
    struct iovec *v = iov;
    k = kvx_iov_advance(&v, k, sent - at);
    if (wait) {
      int rc = kvx_sendv_all(&c->ch, v, k, c->a->timeout_ms);
      if (rc) return rc;
      sent = at + bytes;
    } else {
      int64_t w = kvx_sendv_now(&c->ch, v, k);
      if (w < 0) return (int)w;
      sent += (uint64_t)w;
      if (sent < at + bytes) {
        x->sent = sent;
        return 1;
      }
    }
  }
  return 0;
}

static int tcp_run(kvx_conn *c, kvx_xfer *x, char *why, size_t cap) {
  int rc = tcp_send(c, x, 1);
  if (rc) utl_seterr(why, cap, "send failed (%s)", rc == -2 ? "peer stalled past the timeout" : kvx_io_why(rc));
  return rc ? -2 : 0;
}

// On the posting thread: what the socket takes at once. Large requests go to the worker whole: copying megabytes
// into the socket is the worker's time, not the caller's.
#define TCP_START_MAX (256u << 10)

static int tcp_start(kvx_conn *c, kvx_xfer *x, char *why, size_t cap) {
  (void)why, (void)cap;
  if (x->total > TCP_START_MAX) return 1;
  return tcp_send(c, x, 0) ? 1 : 0;  // a send error too is the worker's to meet (and to wait for the peer's reason)
}

// READ_DATA: the payloads of the next h->addr segments of a pending READ, received straight into place.
static int tcp_answer(kvx_conn *c, const kvx_hdr *h, char *why, size_t cap) {
  if (h->op != KVX_F_READ_DATA) {
    utl_seterr(why, cap, "unexpected frame op %u from peer", h->op);
    return -1;
  }
  kvx_xfer *x = kvx_conn_pending(c, h->req);
  uint64_t n = h->addr, bytes = 0;
  int ok = x && x->op == KVX_READ && n >= 1 && n <= KVX_MAX_VEC && x->cursor + n <= x->n_segs;
  struct iovec iov[KVX_MAX_VEC];
  for (uint64_t j = 0; ok && j < n; j++) {
    const kvx_seg *s = &x->segs[x->cursor + j];
    iov[j] = (struct iovec){(void *)(uintptr_t)s->laddr, s->len};
    bytes += s->len;
  }
  if (!ok || bytes != h->len) {
    kvx_xfer_unref(x);
    utl_seterr(why, cap, "read data that matches no outstanding read");
    return -1;
  }
  int rc = kvx_recvv_all(&c->ch, iov, (int)n, c->a->timeout_ms);
  x->cursor += n;
  kvx_xfer_unref(x);
  if (rc) utl_seterr(why, cap, "peer died mid-read (%s)", kvx_io_why(rc));
  return rc ? -1 : 0;
}

static int tcp_init(kvx_agent *a, char *err, size_t errlen) {
  (void)a, (void)err, (void)errlen;
  return 0;  // the core runs the listener
}

const kvx_backend kvx_tcp_backend = {
    .name = "tcp",
    .rank = 10,  // auto: the fallback, below every faster path
    .caps = KVX_CAP_LOCAL | KVX_CAP_REMOTE | KVX_CAP_HOST | KVX_CAP_FALLBACK,
    .listener = KVX_LS_TCP,
    .reader = 1,
    .frames = tcp_frames,
    .init = tcp_init,
    .check = tcp_check,
    .run = tcp_run,
    .start = tcp_start,
    .answer = tcp_answer,
};
