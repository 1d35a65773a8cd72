// worker/peers.c: a worker's view of the cluster's other workers as etcd has them (config "discovery"), for a role
// that links to peers by name (a prefill worker to its decode workers and prefix peers).
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "worker/shell.h"

// One member: its etcd key (what a leave names; the watcher lets one key at a time hold a name) and its settings.
typedef struct peer {
  char key[256];
  cfg_worker w;
} peer;

struct wrk_peers {
  pthread_mutex_t mu;    // guards w, n
  peer *w;               // (owned) (n, cap) the members now
  int n, cap;
  dsc_fingerprint fp;    // ours: a member of another model is not a peer
  char name[64];         // ours (the log's component)
  dsc_watcher *watcher;  // (owned)
};

// The member under key leaves the table (none: a no-op). Called with mu held.
static void remove_locked(wrk_peers *p, const char *key) {
  for (int i = 0; i < p->n; i++)
    if (!strcmp(p->w[i].key, key)) {
      p->w[i] = p->w[--p->n];
      return;
    }
}

static int on_join(void *arg, const char *key, int64_t lease, const dsc_member *m) {
  (void)lease;
  wrk_peers *p = arg;
  pthread_mutex_lock(&p->mu);
  if (!dsc_same_model(&m->fp, &p->fp)) {
    remove_locked(p, key); // its record changed to another model: no longer a peer
    pthread_mutex_unlock(&p->mu);
    utl_warn(p->name, "worker %s serves another model (%s %s); not a peer", m->name, m->fp.arch, m->fp.file_hash);
    return 1;
  }
  int i = 0;
  while (i < p->n && strcmp(p->w[i].key, key)) i++;
  if (i == p->n && p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    peer *nw = realloc(p->w, (size_t)cap * sizeof *nw);
    if (nw) {
      p->w = nw;
      p->cap = cap;
    }
  }
  if (i < p->cap) {
    snprintf(p->w[i].key, sizeof p->w[i].key, "%s", key);
    dsc_member_to_cfg(m, &p->w[i].w);
    if (i == p->n) p->n++;
  }
  pthread_mutex_unlock(&p->mu);
  return 0;
}

static void on_leave(void *arg, const char *key, const dsc_member *m) {
  (void)m;
  wrk_peers *p = arg;
  pthread_mutex_lock(&p->mu);
  remove_locked(p, key);
  pthread_mutex_unlock(&p->mu);
}

int wrk_peers_open(const cfg_discovery *d, const dsc_fingerprint *fp, const char *name, wrk_peers **out, char *err,
                   size_t errlen) {
  wrk_peers *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  pthread_mutex_init(&p->mu, NULL);
  p->fp = *fp;
  snprintf(p->name, sizeof p->name, "%s", name);
  dsc_watch_fns fns = {.join = on_join, .leave = on_leave, .arg = p};
  if (dsc_watcher_start(d, &fns, name, &p->watcher, err, errlen)) {
    wrk_peers_close(p);
    return -1;
  }
  *out = p;
  return 0;
}

void wrk_peers_close(wrk_peers *p) {
  if (!p) return;
  dsc_watcher_stop(p->watcher);
  pthread_mutex_destroy(&p->mu);
  free(p->w);
  free(p);
}

int wrk_peers_find(wrk_peers *p, const char *name, cfg_worker *out) {
  int found = 0;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->n && !found; i++)
    if (!strcmp(p->w[i].w.name, name)) {
      *out = p->w[i].w;
      found = 1;
    }
  pthread_mutex_unlock(&p->mu);
  return found;
}
