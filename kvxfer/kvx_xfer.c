// kvxfer/kvx_xfer.c: transfer requests (new, post, poll, free) handed to the connection core, standalone notifications, and waiting for either (kvx_progress, kvx_agent_fd).
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

// ---- requests ----
static kvx_xfer *xfer_alloc(kvx_agent *a, int op, const char *peer) {
  kvx_xfer *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->a = a;
  x->op = op;
  snprintf(x->peer, sizeof x->peer, "%s", peer);
  pthread_mutex_init(&x->mu, NULL);
  atomic_init(&x->state, KVX_DONE);
  atomic_init(&x->refs, 1);
  return x;
}

int kvx_xfer_new(kvx_agent *a, int op, const kvx_desc *local, size_t n_local, const kvx_desc *remote,
                 size_t n_remote, const char *peer, const void *notif, size_t notif_len, kvx_xfer **out,
                 char *err, size_t errlen) {
  *out = NULL;
  if (op != KVX_WRITE && op != KVX_READ) {
    utl_seterr(err, errlen, "kvx_xfer_new: op must be KVX_WRITE or KVX_READ");
    return -1;
  }
  if (!peer || !local || !remote || !n_local || !n_remote) {
    utl_seterr(err, errlen, "kvx_xfer_new: empty descriptor list or no peer");
    return -1;
  }
  if (notif_len > KVX_MAX_NOTIF || (notif_len && !notif)) {
    utl_seterr(err, errlen, "kvx_xfer_new: notification of %zu bytes (max %d)", notif_len, KVX_MAX_NOTIF);
    return -1;
  }
  uint64_t tl = 0, tr = 0;
  for (size_t i = 0; i < n_local; i++) {
    if (!local[i].len || tl + local[i].len < tl) {
      utl_seterr(err, errlen, "kvx_xfer_new: local descriptor %zu has a bad length", i);
      return -1;
    }
    tl += local[i].len;
  }
  for (size_t i = 0; i < n_remote; i++) {
    if (!remote[i].len || tr + remote[i].len < tr) {
      utl_seterr(err, errlen, "kvx_xfer_new: remote descriptor %zu has a bad length", i);
      return -1;
    }
    tr += remote[i].len;
  }
  if (tl != tr) {
    utl_seterr(err, errlen, "kvx_xfer_new: local lists %" PRIu64 " bytes, remote %" PRIu64, tl, tr);
    return -1;
  }
  kvx_xfer *x = xfer_alloc(a, op, peer);
  size_t cap = n_local + n_remote;
  if (!x || !(x->segs = calloc(cap, sizeof *x->segs)) || (notif_len && !(x->notif = malloc(notif_len)))) {
    kvx_xfer_free(x);
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  if (notif_len) memcpy(x->notif, notif, notif_len);
  x->notif_len = notif_len;
  x->has_notif = notif != NULL;
  x->total = tl;
  // Resolve every descriptor to its region, then walk both lists splitting at the boundaries of either.
  int rc = 0;
  pthread_rwlock_rdlock(&a->reg_lock);
  pthread_mutex_lock(&a->mu);
  kvx_peer *p = kvx_peer_find(a, peer);
  if (!p) {
    utl_seterr(err, errlen, "kvx_xfer_new: unknown peer '%s' (load its metadata first)", peer);
    rc = -1;
  }
  size_t li = 0, ri = 0;
  uint64_t lo = 0, ro = 0;
  const kvx_region *lr = NULL;
  const kvx_rregion *rr = NULL;
  while (!rc && li < n_local) {
    if (lo == 0) {
      lr = kvx_find_local(a, local[li].addr, local[li].len);
      if (!lr) {
        utl_seterr(err, errlen, "kvx_xfer_new: local descriptor %zu (0x%" PRIx64 "+%" PRIu64 ") is not in a registered region",
                    li, local[li].addr, local[li].len);
        rc = -1;
        break;
      }
    }
    if (ro == 0) {
      rr = NULL;
      for (size_t k = 0; k < p->n_regions; k++) {
        const kvx_rregion *q = &p->regions[k];
        if (remote[ri].addr >= q->addr && remote[ri].len <= q->len && remote[ri].addr - q->addr <= q->len - remote[ri].len) {
          rr = q;
          break;
        }
      }
      if (!rr) {
        utl_seterr(err, errlen, "kvx_xfer_new: remote descriptor %zu (0x%" PRIx64 "+%" PRIu64 ") is not in a region '%s' exported",
                    ri, remote[ri].addr, remote[ri].len, peer);
        rc = -1;
        break;
      }
    }
    uint64_t n = local[li].len - lo < remote[ri].len - ro ? local[li].len - lo : remote[ri].len - ro;
    if (x->n_segs == cap) break;  // cannot happen: each step ends a local or a remote descriptor
    kvx_seg *s = &x->segs[x->n_segs++];
    s->laddr = local[li].addr + lo;
    s->raddr = remote[ri].addr + ro;
    s->len = n;
    s->rkey = rr->key;
    s->lword = lr->word[p->be];
    s->rword = rr->word[p->be];
    s->lmem = lr->mem;
    s->rmem = (int)rr->mem;
    lo += n;
    ro += n;
    if (lo == local[li].len) li++, lo = 0;
    if (ro == remote[ri].len) ri++, ro = 0;
  }
  pthread_mutex_unlock(&a->mu);
  pthread_rwlock_unlock(&a->reg_lock);
  if (rc) {
    kvx_xfer_free(x);
    return -1;
  }
  *out = x;
  return 0;
}

// Hands x to its peer's connection; the connection holds one reference until it finishes x. A request that may
// start at once does so here, after the agent's lock is let go (other threads need it meanwhile).
static int xfer_submit(kvx_xfer *x) {
  kvx_agent *a = x->a;
  char e[256] = "";
  int rc = 0;
  kvx_conn *now = NULL;
  atomic_fetch_add(&x->refs, 1);
  pthread_mutex_lock(&a->mu);
  kvx_peer *p = a->closing ? NULL : kvx_peer_find(a, x->peer);
  if (!p) {
    snprintf(e, sizeof e, "%s: unknown peer '%s'", a->closing ? "agent closing" : "post", x->peer);
    rc = KVX_ERR_PEER;
  } else if (kvx_conn_post(a, p, x, &now, e, sizeof e)) {
    rc = KVX_ERR;
  }
  pthread_mutex_unlock(&a->mu);
  if (rc) kvx_xfer_finish(x, rc, "%s", e);
  if (now) kvx_conn_start(now, x);
  return rc;
}

int kvx_xfer_post(kvx_xfer *x) {
  if (!x) return KVX_ERR;
  pthread_mutex_lock(&x->mu);
  if (atomic_load(&x->state) == KVX_PENDING) {
    pthread_mutex_unlock(&x->mu);
    return KVX_ERR;  // still in flight; the request keeps its state
  }
  x->err[0] = 0;
  x->cursor = 0;
  x->sent = 0;
  x->id = atomic_fetch_add(&x->a->next_id, 1);
  atomic_store(&x->state, KVX_PENDING);
  pthread_mutex_unlock(&x->mu);
  return xfer_submit(x);
}

int kvx_xfer_poll(kvx_xfer *x) { return x ? atomic_load(&x->state) : KVX_ERR; }

const char *kvx_xfer_error(kvx_xfer *x) {
  if (!x) return "no request";
  int st = atomic_load(&x->state);
  if (st == KVX_PENDING) return "";
  return x->err;  // written before the state left PENDING; stable until the next post
}

void kvx_xfer_free(kvx_xfer *x) { kvx_xfer_unref(x); }

// ---- notifications ----
int kvx_notify(kvx_agent *a, const char *peer, const void *msg, size_t len, char *err, size_t errlen) {
  if (!peer || len > KVX_MAX_NOTIF || (len && !msg)) {
    utl_seterr(err, errlen, "kvx_notify: bad arguments (%zu bytes, max %d)", len, KVX_MAX_NOTIF);
    return -1;
  }
  kvx_xfer *x = xfer_alloc(a, KVX_OP_NOTIFY, peer);
  if (!x || (len && !(x->notif = malloc(len)))) {
    kvx_xfer_free(x);
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  if (len) memcpy(x->notif, msg, len);
  x->notif_len = len;
  x->has_notif = 1;
  x->id = atomic_fetch_add(&a->next_id, 1);
  atomic_store(&x->state, KVX_PENDING);
  int rc = xfer_submit(x);
  if (rc) utl_seterr(err, errlen, "%s", x->err);
  kvx_xfer_unref(x);
  return rc ? -1 : 0;
}

int kvx_agent_fd(kvx_agent *a) {
  if (!atomic_exchange(&a->fd_out, 1) && atomic_load(&a->woken)) kvx_signal_fd(a);  // a signal that skipped it
  return a->efd;
}

int kvx_progress(kvx_agent *a, int timeout_ms) {
  struct pollfd p = {.fd = a->efd, .events = POLLIN};
  int r;
  // A caller that may wait watches the flag first, about twice as long as recent waits lasted, when they were
  // short (KVX_SPIN_NS): such a wait is cheaper spun than slept, while spinning through long ones would only take
  // the CPU from the threads doing the work.
  int64_t t0 = utl_now_ns(), avg = atomic_load(&a->wait_ns);
  int64_t spin = !timeout_ms || avg > KVX_SPIN_NS ? 0 : 2 * avg + 5000 < KVX_SPIN_NS ? 2 * avg + 5000 : KVX_SPIN_NS;
  while (!atomic_load(&a->woken) && utl_now_ns() - t0 < spin) kvx_cpu_relax();
  int slept = 0;
  atomic_fetch_add(&a->sleepers, 1);
  if (!atomic_load(&a->woken)) {
    do r = poll(&p, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    slept = 1;
  }
  atomic_fetch_sub(&a->sleepers, 1);
  uint64_t v;
  if (slept || atomic_load(&a->fd_out)) {  // otherwise nobody needed the fd: a count left there only wakes once
    ssize_t got = read(a->efd, &v, sizeof v);
    (void)got;
  }
  // Cleared after the read: a signal in between skipped its write, but what it announced happened before this
  // returns, so the caller's next look at its requests and notifications sees it.
  int was = atomic_exchange(&a->woken, 0);
  if (was && timeout_ms) atomic_store(&a->wait_ns, avg + (utl_now_ns() - t0 - avg) / 4);
  return was;
}
