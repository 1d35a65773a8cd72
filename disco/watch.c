// disco/watch.c: a router's view of the membership: range the workers' prefix, then watch it; one key at a time holds
// a name; through an etcd outage the last membership stands, and a fresh range when etcd is back tells what changed.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disco/disco.h"
#include "disco/disco_int.h"
#include "disco/etcd.h"
#include "util/err.h"
#include "util/log.h"

#define RETRY_MS 500 // etcd unreachable: how often a range is tried again

// What the watcher holds of a key: a member (the consumer took it: it holds its name), a record refused because
// another key's member holds its name (considered again when that one leaves), or one the consumer refused.
typedef enum { K_MEMBER, K_BLOCKED, K_REFUSED } known_state;

typedef struct known {
  char key[256];
  int64_t lease;
  dsc_member m;
  known_state state;
  int64_t created;   // its key's create_revision: of two records naming one worker, the older holds the name, and
                     // blocked ones are considered again oldest first
  int seen;          // in the latest range (resync)
} known;

struct dsc_watcher {
  dsc_etcd *etcd;        // (owned)
  char prefix[128];
  dsc_watch_fns fns;
  char log_as[64];
  known *k;              // (owned) (n_k, cap_k) the records as last seen, by key
  int n_k, cap_k;
  pthread_t thread;
  int has_thread;
  pthread_mutex_t mu;    // guards stop
  pthread_cond_t cv;
  int stop;
};

static int stopped(void *arg) {
  dsc_watcher *w = arg;
  pthread_mutex_lock(&w->mu);
  int s = w->stop;
  pthread_mutex_unlock(&w->mu);
  return s;
}

static known *find(dsc_watcher *w, const char *key) {
  for (int i = 0; i < w->n_k; i++)
    if (!strcmp(w->k[i].key, key)) return &w->k[i];
  return NULL;
}

// The member (another key than not's) that holds name, or NULL.
static known *holder(dsc_watcher *w, const char *name, const known *not) {
  for (int i = 0; i < w->n_k; i++)
    if (&w->k[i] != not && w->k[i].state == K_MEMBER && !strcmp(w->k[i].m.name, name)) return &w->k[i];
  return NULL;
}

// Offers k's record to the consumer, unless another key's member holds its name: then it is refused, loudly, and
// that member is left as it is (a second record naming a live worker must not take its link away).
static void offer(dsc_watcher *w, known *k, int again) {
  known *h = holder(w, k->m.name, k);
  if (h) {
    if (k->state != K_BLOCKED)
      utl_err(w->log_as, "REFUSING etcd record %s (%s:%d): its name %s is the member under %s (%s:%d), which keeps its "
              "link; this record gets none until that member leaves", k->key, k->m.host, k->m.port, k->m.name,
              h->key, h->m.host, h->m.port);
    k->state = K_BLOCKED;
    return;
  }
  if (again)
    utl_log(w->log_as, "etcd record %s: the member that held the name %s left; considering this one", k->key,
            k->m.name);
  k->state = w->fns.join(w->fns.arg, k->key, k->lease, &k->m) ? K_REFUSED : K_MEMBER;
}

// name has no member any more: the records refused for it are considered again, oldest first, until one is taken.
static void reconsider(dsc_watcher *w, const char *name) {
  for (;;) {
    known *first = NULL;
    for (int i = 0; i < w->n_k; i++)
      if (w->k[i].state == K_BLOCKED && !strcmp(w->k[i].m.name, name) && (!first || w->k[i].created < first->created))
        first = &w->k[i];
    if (!first) return;
    offer(w, first, 1);
    if (first->state == K_MEMBER) return;
  }
}

// A put of key: offered when the record (or its lease) is new or changed. Records that do not decode are logged and
// ignored.
static void on_put(dsc_watcher *w, const dsc_kv *kv) {
  const char *key = kv->key;
  int64_t lease = kv->lease;
  dsc_member m;
  char err[256];
  if (strlen(key) >= sizeof w->k[0].key) return;
  if (dsc_member_decode(kv->value, kv->value_len, &m, err, sizeof err)) {
    utl_warn(w->log_as, "etcd key %s: %s; ignored", key, err);
    return;
  }
  known *k = find(w, key);
  if (k) {
    k->seen = 1;
    if (k->lease == lease && !memcmp(&k->m, &m, sizeof m)) return;
    dsc_member old = k->m;
    k->m = m;
    k->lease = lease;
    if (k->state != K_MEMBER) {
      offer(w, k, 0); // a refused record that changed: a new chance
    } else if (strcmp(old.name, m.name)) { // the member took another name: it leaves under the old one
      w->fns.leave(w->fns.arg, key, &old);
      k->state = K_REFUSED;
      offer(w, k, 0);
      reconsider(w, old.name);
    } else if (w->fns.join(w->fns.arg, key, lease, &m)) { // refused now (and dropped by the consumer)
      k->state = K_REFUSED;
      reconsider(w, m.name);
    }
    return;
  }
  if (w->n_k == w->cap_k) {
    int cap = w->cap_k ? 2 * w->cap_k : 16;
    known *nk = realloc(w->k, (size_t)cap * sizeof *nk);
    if (!nk) {
      utl_err(w->log_as, "out of memory: member %s not added", key);
      return;
    }
    w->k = nk;
    w->cap_k = cap;
  }
  k = &w->k[w->n_k++];
  memset(k, 0, sizeof *k);
  snprintf(k->key, sizeof k->key, "%s", key);
  k->lease = lease;
  k->m = m;
  k->created = kv->create_revision;
  k->seen = 1;
  k->state = K_REFUSED;
  offer(w, k, 0);
}

// k's key went away: a member leaves (and the records refused for its name are considered again).
static void drop(dsc_watcher *w, known *k) {
  known gone = *k;
  *k = w->k[--w->n_k];
  if (gone.state == K_REFUSED) w->fns.leave(w->fns.arg, gone.key, &gone.m); // the consumer may keep refused records
  if (gone.state != K_MEMBER) return;
  w->fns.leave(w->fns.arg, gone.key, &gone.m);
  reconsider(w, gone.m.name);
}

static int on_event(void *arg, const dsc_event *ev) {
  dsc_watcher *w = arg;
  if (!ev->is_delete) {
    on_put(w, &ev->kv);
  } else {
    known *k = find(w, ev->kv.key);
    if (k) drop(w, k);
  }
  return 0;
}

static int by_creation(const void *a, const void *b) {
  int64_t x = ((const dsc_kv *)a)->create_revision, y = ((const dsc_kv *)b)->create_revision;
  return x < y ? -1 : x > y;
}

// A fresh range: joins for what is new or changed, leaves for what is gone. 0, or the client's status.
static int resync(dsc_watcher *w, int64_t *revision, char *err, size_t errlen) {
  dsc_kv *kvs;
  int n;
  int rc = dsc_range(w->etcd, w->prefix, 1, &kvs, &n, revision, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < w->n_k; i++) w->k[i].seen = 0;
  // oldest key first: a router that starts (or resyncs) gives a name to the record a running one gave it to
  if (n > 1) qsort(kvs, (size_t)n, sizeof *kvs, by_creation); // (kvs is NULL when n is 0)
  for (int i = 0; i < n; i++) on_put(w, &kvs[i]);
  for (int i = 0; i < w->n_k;)
    if (!w->k[i].seen) drop(w, &w->k[i]);
    else i++;
  dsc_kvs_free(kvs, n);
  return 0;
}

static void *watcher_main(void *arg) {
  dsc_watcher *w = arg;
  char err[512];
  int down = 0;
  while (!stopped(w)) {
    int64_t rev = 0, last;
    int rc = resync(w, &rev, err, sizeof err);
    if (rc) {
      if (!down)
        utl_warn(w->log_as, "etcd %s (%s); serving with the last membership (%d workers) until it answers",
                 rc == DSC_EUNAVAIL ? "unreachable" : "refused the range", err, w->n_k);
      down = 1;
      if (dsc_nap(&w->mu, &w->cv, &w->stop, RETRY_MS)) break;
      continue;
    }
    if (down) utl_log(w->log_as, "etcd is back; membership resynced (%d workers)", w->n_k);
    down = 0;
    rc = dsc_watch(w->etcd, w->prefix, rev + 1, on_event, stopped, w, &last, err, sizeof err);
    if (rc == DSC_ESTOPPED) break;
    utl_debug(w->log_as, "etcd watch ended (%s); resyncing", err);
  }
  return NULL;
}

int dsc_watcher_start(const cfg_discovery *d, const dsc_watch_fns *fns, const char *log_as, dsc_watcher **out,
                      char *err, size_t errlen) {
  *out = NULL;
  dsc_watcher *w = calloc(1, sizeof *w);
  if (!w) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  const char *eps[CFG_MAX_ETCD];
  dsc_etcd_opts o;
  dsc_etcd_opts_of(d, eps, &o);
  if (dsc_etcd_new(&o, &w->etcd, err, errlen)) {
    free(w);
    return -1;
  }
  dsc_workers_prefix(d->cluster, w->prefix, sizeof w->prefix);
  w->fns = *fns;
  snprintf(w->log_as, sizeof w->log_as, "%s", log_as);
  pthread_mutex_init(&w->mu, NULL);
  utl_cond_init_monotonic(&w->cv); // dsc_nap waits on it
  if (pthread_create(&w->thread, NULL, watcher_main, w)) {
    utl_seterr(err, errlen, "cannot start the etcd watch thread");
    dsc_watcher_stop(w);
    return -1;
  }
  w->has_thread = 1;
  *out = w;
  return 0;
}

void dsc_watcher_stop(dsc_watcher *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->has_thread) pthread_join(w->thread, NULL);
  dsc_etcd_free(w->etcd);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w->k);
  free(w);
}
