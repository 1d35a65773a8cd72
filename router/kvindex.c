// router/kvindex.c: the router's KV-aware index: per-worker hash sets of block keys with FIFO caps, overlap and scoring.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/kvindex.h"

typedef struct kx_ent {
  uint64_t key;
  int32_t hnext;      // bucket chain; free-list link when unused
  int32_t prev, next; // age list: prev older, next newer
} kx_ent;

typedef struct kx_worker {
  kx_ent *ents;      // (owned) (cap)
  int32_t *buckets;  // (owned) (bmask + 1) first entry per bucket, -1 empty
  uint64_t bmask;
  int oldest, newest; // -1 when empty
  int n, n_used, free_ent;
} kx_worker;

struct rtr_kvindex {
  kx_worker *w; // (owned) (max_workers)
  int max_workers, cap;
};

int rtr_kvindex_new(int max_workers, int cap_per_worker, rtr_kvindex **out, char *err, size_t errlen) {
  *out = NULL;
  if (max_workers < 1 || max_workers > 65536) {
    snprintf(err, errlen, "kvindex: max_workers %d out of range [1, 65536]", max_workers);
    return -1;
  }
  if (cap_per_worker < 1 || cap_per_worker > (1 << 26)) {
    snprintf(err, errlen, "kvindex: cap_per_worker %d out of range [1, %d]", cap_per_worker, 1 << 26);
    return -1;
  }
  rtr_kvindex *x = calloc(1, sizeof *x);
  if (x) x->w = calloc((size_t)max_workers, sizeof *x->w);
  if (!x || !x->w) {
    free(x);
    snprintf(err, errlen, "kvindex: out of memory");
    return -1;
  }
  x->max_workers = max_workers;
  x->cap = cap_per_worker;
  *out = x;
  return 0;
}

int rtr_kvindex_grow(rtr_kvindex *x, int max_workers) {
  if (max_workers <= x->max_workers) return 0;
  kx_worker *nw = realloc(x->w, (size_t)max_workers * sizeof *nw);
  if (!nw) return -1;
  memset(nw + x->max_workers, 0, (size_t)(max_workers - x->max_workers) * sizeof *nw);
  x->w = nw;
  x->max_workers = max_workers;
  return 0;
}

static void kx_worker_fini(kx_worker *w) {
  free(w->ents);
  free(w->buckets);
  memset(w, 0, sizeof *w);
}

void rtr_kvindex_free(rtr_kvindex *x) {
  if (!x) return;
  for (int i = 0; i < x->max_workers; i++) kx_worker_fini(&x->w[i]);
  free(x->w);
  free(x);
}

static int kx_worker_init(kx_worker *w, int cap) {
  uint64_t nb = 16;
  while (nb < 2 * (uint64_t)cap) nb *= 2;
  w->ents = malloc((size_t)cap * sizeof *w->ents);
  w->buckets = malloc(nb * sizeof *w->buckets);
  if (!w->ents || !w->buckets) {
    kx_worker_fini(w);
    return -1;
  }
  for (uint64_t i = 0; i < nb; i++) w->buckets[i] = -1;
  w->bmask = nb - 1;
  w->oldest = w->newest = w->free_ent = -1;
  w->n = w->n_used = 0;
  return 0;
}

static uint64_t kx_bucket(const kx_worker *w, uint64_t key) { return (key ^ (key >> 31)) & w->bmask; }

static int kx_find(const kx_worker *w, uint64_t key) {
  if (!w->ents) return -1;
  for (int i = w->buckets[kx_bucket(w, key)]; i >= 0; i = w->ents[i].hnext)
    if (w->ents[i].key == key) return i;
  return -1;
}

static void age_unlink(kx_worker *w, int i) {
  kx_ent *e = &w->ents[i];
  if (e->prev >= 0) w->ents[e->prev].next = e->next;
  else w->oldest = e->next;
  if (e->next >= 0) w->ents[e->next].prev = e->prev;
  else w->newest = e->prev;
  e->prev = e->next = -1;
}

static void age_push_newest(kx_worker *w, int i) {
  kx_ent *e = &w->ents[i];
  e->prev = w->newest;
  e->next = -1;
  if (w->newest >= 0) w->ents[w->newest].next = i;
  w->newest = i;
  if (w->oldest < 0) w->oldest = i;
}

static void kx_remove(kx_worker *w, int i) {
  int32_t *pp = &w->buckets[kx_bucket(w, w->ents[i].key)];
  while (*pp >= 0 && *pp != i) pp = &w->ents[*pp].hnext;
  if (*pp == i) *pp = w->ents[i].hnext;
  age_unlink(w, i);
  w->ents[i].hnext = w->free_ent;
  w->free_ent = i;
  w->n--;
}

static int kx_add(kx_worker *w, int cap, uint64_t key) {
  if (!w->ents && kx_worker_init(w, cap) != 0) return -1;
  int i = kx_find(w, key);
  if (i >= 0) { // refreshed: now the newest
    age_unlink(w, i);
    age_push_newest(w, i);
    return 0;
  }
  if (w->n == cap) kx_remove(w, w->oldest);
  if (w->free_ent >= 0) {
    i = w->free_ent;
    w->free_ent = w->ents[i].hnext;
  } else {
    i = w->n_used++;
  }
  kx_ent *e = &w->ents[i];
  e->key = key;
  uint64_t b = kx_bucket(w, key);
  e->hnext = w->buckets[b];
  w->buckets[b] = i;
  age_push_newest(w, i);
  w->n++;
  return 0;
}

int rtr_kvindex_apply(rtr_kvindex *x, int worker, const kv_event *ev, int n) {
  if (!x || worker < 0 || worker >= x->max_workers) return -1;
  if (n > 0 && !ev) return -1;
  kx_worker *w = &x->w[worker];
  for (int k = 0; k < n; k++) {
    switch (ev[k].kind) {
    case KV_EVENT_ADDED:
      if (kx_add(w, x->cap, ev[k].key) != 0) return -1;
      break;
    case KV_EVENT_REMOVED: {
      int i = kx_find(w, ev[k].key);
      if (i >= 0) kx_remove(w, i);
      break;
    }
    case KV_EVENT_CLEARED:
      kx_worker_fini(w);
      break;
    default:
      break;
    }
  }
  return 0;
}

void rtr_kvindex_remove_worker(rtr_kvindex *x, int worker) {
  if (!x || worker < 0 || worker >= x->max_workers) return;
  kx_worker_fini(&x->w[worker]);
}

int rtr_kvindex_count(const rtr_kvindex *x, int worker) {
  if (!x || worker < 0 || worker >= x->max_workers) return 0;
  return x->w[worker].n;
}

int rtr_kvindex_overlap(const rtr_kvindex *x, int worker, const uint64_t *prompt_keys, int n) {
  if (!x || worker < 0 || worker >= x->max_workers || !prompt_keys) return 0;
  const kx_worker *w = &x->w[worker];
  int k = 0;
  while (k < n && kx_find(w, prompt_keys[k]) >= 0) k++;
  return k;
}

rtr_kvindex_weights rtr_kvindex_weights_default(void) { return (rtr_kvindex_weights){2.0, 1.0, 1.0}; }

double rtr_kvindex_score(const rtr_kvindex_weights *w, int overlap, int n_prompt_blocks, int queue_len,
                         int free_blocks, int total_blocks) {
  rtr_kvindex_weights d = rtr_kvindex_weights_default();
  if (!w) w = &d;
  if (n_prompt_blocks < 0) n_prompt_blocks = 0;
  if (overlap < 0) overlap = 0;
  if (overlap > n_prompt_blocks) overlap = n_prompt_blocks;
  if (queue_len < 0) queue_len = 0;
  if (total_blocks < 0) total_blocks = 0;
  if (free_blocks < 0) free_blocks = 0;
  if (free_blocks > total_blocks) free_blocks = total_blocks;
  double o = (double)overlap / (double)(n_prompt_blocks > 0 ? n_prompt_blocks : 1);
  double q = 1.0 / (1.0 + (double)queue_len);
  double f = (double)free_blocks / (double)(total_blocks > 0 ? total_blocks : 1);
  return w->overlap * o + w->queue * q + w->free * f;
}

int rtr_kvindex_pick(const rtr_kvindex *x, const rtr_kvindex_weights *w, const uint64_t *keys, int n,
                     const rtr_kvindex_load *cands, int n_cands, int *overlap_out) {
  if (overlap_out) *overlap_out = 0;
  if (!cands || n_cands < 1) return -1;
  int best = -1, best_ov = 0;
  double best_s = 0;
  for (int c = 0; c < n_cands; c++) {
    int ov = rtr_kvindex_overlap(x, cands[c].worker, keys, n);
    double s = rtr_kvindex_score(w, ov, n, cands[c].queue_len, cands[c].free_blocks, cands[c].total_blocks);
    if (best < 0 || s > best_s || (s == best_s && cands[c].queue_len < cands[best].queue_len)) {
      best = c;
      best_s = s;
      best_ov = ov;
    }
  }
  if (overlap_out) *overlap_out = best_ov;
  return best;
}
