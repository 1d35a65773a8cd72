// kvxfer/kvx_base.c: the services every layer of kvxfer and every backend uses: log, threads, wake-ups, the look-up of regions and peers, a request's completion, the agent's notification queue.
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"
#include "util/log.h"

// ---- log, wake-ups, threads ----
void kvx_log(kvx_agent *a, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (a->log)
    a->log(a->log_ud, line);
  else
    utl_log("kvx", "%s: %s", a->name, line); // no hook: the tree's one log path
}

void kvx_auth_refused(kvx_agent *a, const char *fmt, ...) {
  char line[480];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  uint64_t n = atomic_fetch_add(&a->auth_failures, 1) + 1;
  kvx_log(a, "%s (%" PRIu64 " refused so far)", line, n);
}

uint64_t kvx_auth_failures(kvx_agent *a) { return a ? atomic_load(&a->auth_failures) : 0; }

void kvx_signal_fd(kvx_agent *a) {
  uint64_t one = 1;
  ssize_t r = write(a->efd, &one, sizeof one);
  (void)r;
}

// The flag, and the eventfd until kvx_progress clears them: later signals find the flag set and skip the write.
// The write (a syscall, and the wakeup of a sleeping thread) is skipped too while nobody can be asleep on the fd:
// it was never handed out (kvx_agent_fd) and no kvx_progress sleeps; a spinning one sees the flag. The flag and
// the sleeper count are both sequentially consistent: either the signal sees the sleeper, or the sleeper sees the
// flag before it sleeps.
void kvx_signal(kvx_agent *a) {
  if (atomic_exchange(&a->woken, 1)) return;
  if (atomic_load(&a->fd_out) || atomic_load(&a->sleepers)) kvx_signal_fd(a);
}

int kvx_no_init(kvx_agent *a, char *err, size_t errlen) {
  (void)a;
  utl_seterr(err, errlen, "backend not available in this build");
  return -1;
}
int kvx_no_run(kvx_conn *c, kvx_xfer *x, char *why, size_t cap) {
  (void)c, (void)x;
  utl_seterr(why, cap, "backend cannot transfer");
  return -1;
}

typedef struct thread_arg {
  void *(*fn)(void *);
  void *arg;
} thread_arg;

static void *thread_main(void *p) {
  thread_arg t = *(thread_arg *)p;
  free(p);
  return t.fn(t.arg);
}

int kvx_thread_start(kvx_agent *a, void *(*fn)(void *), void *arg, char *err, size_t errlen) {
  thread_arg *t = malloc(sizeof *t);
  if (!t) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  t->fn = fn;
  t->arg = arg;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_mutex_lock(&a->thr_mu);
  a->threads++;
  pthread_mutex_unlock(&a->thr_mu);
  pthread_t th;
  int rc = pthread_create(&th, &at, thread_main, t);
  pthread_attr_destroy(&at);
  if (rc) {
    free(t);
    kvx_thread_exit(a);
    utl_seterr(err, errlen, "pthread_create: %s", strerror(rc));
    return -1;
  }
  return 0;
}

void kvx_thread_exit(kvx_agent *a) {
  // libcrypto's per-thread state goes now, not as the detached thread ends after kvx_agent_free stopped waiting for it
  // (a leak report at exit, once, under LeakSanitizer)
  utl_crypto_thread_done();
  pthread_mutex_lock(&a->thr_mu);
  a->threads--;
  pthread_cond_broadcast(&a->thr_cv);
  pthread_mutex_unlock(&a->thr_mu);
}

// ---- regions and peers (the caller holds the lock that guards them) ----
kvx_region *kvx_find_local(kvx_agent *a, uint64_t addr, uint64_t len) {
  for (kvx_region *r = a->regions; r; r = r->next)
    if (addr >= r->addr && len <= r->len && addr - r->addr <= r->len - len) return r;
  return NULL;
}

kvx_region *kvx_check_access(kvx_agent *a, uint64_t key, uint64_t addr, uint64_t len, char *why, size_t cap) {
  for (kvx_region *r = a->regions; r; r = r->next) {
    if (r->key != key) continue;
    if (addr >= r->addr && len <= r->len && addr - r->addr <= r->len - len) return r;
    utl_seterr(why, cap, "out-of-range access 0x%" PRIx64 "+%" PRIu64 " outside region 0x%" PRIx64 "+%" PRIu64, addr,
               len, r->addr, r->len);
    return NULL;
  }
  utl_seterr(why, cap, "unknown region key 0x%016" PRIx64, key);
  return NULL;
}

kvx_peer *kvx_peer_find(kvx_agent *a, const char *name) {
  for (kvx_peer *p = a->peers; p; p = p->next)
    if (!strcmp(p->name, name)) return p;
  return NULL;
}

void kvx_peer_free(kvx_peer *p) {
  if (!p) return;
  free(p->regions);
  free(p);
}

// ---- requests: completion (made and posted by kvx_xfer.c, run by kvx_conn.c and the backends) ----
void kvx_xfer_unref(kvx_xfer *x) {
  if (!x) return;
  if (atomic_fetch_sub(&x->refs, 1) != 1) return;
  pthread_mutex_destroy(&x->mu);
  free(x->segs);
  free(x->notif);
  free(x);
}

void kvx_xfer_finish(kvx_xfer *x, int rc, const char *fmt, ...) {
  pthread_mutex_lock(&x->mu);
  if (atomic_load(&x->state) == KVX_PENDING) {
    if (rc < 0 && fmt) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(x->err, sizeof x->err, fmt, ap);
      va_end(ap);
    }
    atomic_store(&x->state, rc < 0 ? rc : KVX_DONE);
  }
  pthread_mutex_unlock(&x->mu);
  kvx_signal(x->a);
  kvx_xfer_unref(x);
}

// ---- notifications: the agent's queue (filled by the listeners and backends, drained by kvx_get_notifs) ----
void kvx_push_notif(kvx_agent *a, const char *peer, const void *msg, size_t len) {
  uint8_t *m = malloc(len ? len : 1);
  if (!m) {
    kvx_log(a, "dropped a notification from %s: out of memory", peer);
    return;
  }
  if (len) memcpy(m, msg, len);
  pthread_mutex_lock(&a->mu);
  if (a->n_notifs == a->cap_notifs) {
    size_t nc = a->cap_notifs ? a->cap_notifs * 2 : 64;
    kvx_notif *q = malloc(nc * sizeof *q);
    if (!q) {
      pthread_mutex_unlock(&a->mu);
      free(m);
      kvx_log(a, "dropped a notification from %s: out of memory", peer);
      return;
    }
    for (size_t k = 0; k < a->n_notifs; k++) q[k] = a->notifs[(a->head_notifs + k) % a->cap_notifs];
    free(a->notifs);
    a->notifs = q;
    a->cap_notifs = nc;
    a->head_notifs = 0;
  }
  kvx_notif *n = &a->notifs[(a->head_notifs + a->n_notifs) % a->cap_notifs];
  snprintf(n->peer, sizeof n->peer, "%s", peer);
  n->msg = m;
  n->len = len;
  a->n_notifs++;
  pthread_mutex_unlock(&a->mu);
  kvx_signal(a);
}

int kvx_get_notifs(kvx_agent *a, kvx_notif *out, int max) {
  int n = 0;
  pthread_mutex_lock(&a->mu);
  while (n < max && a->n_notifs) {
    out[n++] = a->notifs[a->head_notifs];
    a->head_notifs = (a->head_notifs + 1) % a->cap_notifs;
    a->n_notifs--;
  }
  pthread_mutex_unlock(&a->mu);
  return n;
}

void kvx_notifs_free(kvx_agent *a) {
  for (size_t k = 0; k < a->n_notifs; k++) free(a->notifs[(a->head_notifs + k) % a->cap_notifs].msg);
  free(a->notifs);
  a->notifs = NULL;
  a->n_notifs = a->cap_notifs = a->head_notifs = 0;
}
