// worker/peers.c: a worker's view of the cluster's other workers as etcd has them (config "discovery"), for a role
// that links to peers by name (a prefill worker to its decode workers and prefix peers).
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "worker/shell.h"

struct wrk_peers {
  pthread_mutex_t mu;    // guards w, n
  cfg_worker *w;         // (owned) (n, cap) the members now
  int n, cap;
  dsc_fingerprint fp;    // ours: a member of another model is not a peer
  char name[64];         // ours (the log's component)
  dsc_watcher *watcher;  // (owned)
};

static void on_join(void *arg, const dsc_member *m) {
  wrk_peers *p = arg;
  if (!dsc_same_model(&m->fp, &p->fp)) {
    utl_warn(p->name, "worker %s serves another model (%s %s); not a peer", m->name, m->fp.arch, m->fp.file_hash);
    return;
  }
  cfg_worker w;
  dsc_member_to_cfg(m, &w);
  pthread_mutex_lock(&p->mu);
  int i = 0;
  while (i < p->n && strcmp(p->w[i].name, m->name)) i++;
  if (i == p->n && p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    cfg_worker *nw = realloc(p->w, (size_t)cap * sizeof *nw);
    if (nw) {
      p->w = nw;
      p->cap = cap;
    }
  }
  if (i < p->cap) {
    p->w[i] = w;
    if (i == p->n) p->n++;
  }
  pthread_mutex_unlock(&p->mu);
}

static void on_leave(void *arg, const dsc_member *m) {
  wrk_peers *p = arg;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->n;)
    if (!strcmp(p->w[i].name, m->name) && p->w[i].role == m->role) p->w[i] = p->w[--p->n];
    else i++;
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
    if (!strcmp(p->w[i].name, name)) {
      *out = p->w[i];
      found = 1;
    }
  pthread_mutex_unlock(&p->mu);
  return found;
}
