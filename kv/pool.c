// kv/pool.c: the paged KV block pool: one buffer of pages sized from a byte budget, a locked free list, and the
// local layer groups' pages that a sequence's sliding window has passed, given back least recently used first.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kv/pool.h"

#include "kvxfer/kvx.h"

// Pages and blocks. kv.n_blocks pages, each one layer group's KV parts (K and V, or MLA's latent row: mdl_kv_parts)
// for block_size positions (mdl_kv). A block is n_groups pages: its id is its group-0 page, and page_map holds the
// others. With one group a page is a block.
// Window pages: the pages of a block's local groups (sliding-window layers). A table that may still read them pins
// them (pins); unpinned window pages stay attached, so the prefix store can still serve the block, but are
// reclaimable: in the window LRU (oldest first), they go back to the free list when a new block finds it short.
struct kv_pool {
  mdl_llama_cfg cfg;
  krn_ctx *kc;       // (borrowed) where base was allocated
  mdl_kv kv;         // kv.base (owned) from kc->be->alloc, or kvx_host_alloc when shared; its maps point below
  size_t bytes;      // size of kv.base
  int shared;        // kv.base is shareable host memory (kvx_host_alloc)
  int unread;        // opts.unread: kv_pool_discard gives pages back (host memory only)
  kv_stage *stage; // (borrowed) host mirror peers reach instead, or NULL
  int n_groups;      // kv.n_groups, at least 1
  int n_global;      // groups 0 .. n_global - 1 are global, the rest local
  int window;        // the local groups' sliding window in tokens (0: no local group)
  int16_t *layer_group, *layer_slot; // (owned) (n_layer)
  int32_t *page_map; // (owned) (n_blocks, n_groups) when n_groups > 1, else NULL
  pthread_mutex_t mu;
  int32_t *free_ids; // (owned) (n_blocks) stack of free pages; [0, n_free) are free
  int32_t *refs;     // (owned) (n_blocks) reference count per block id; 0 = free or a page of another block
  int n_free;
  int32_t *pins;     // (owned) (n_blocks) tables pinning the block's window pages
  int32_t *lru_prev, *lru_next; // (owned) (n_blocks) window LRU links; -2: not in it, -1: list end
  int32_t lru_head, lru_tail;   // oldest, newest (-1: empty)
  int n_lru_pages;   // window pages on the LRU (reclaimable)
};

static void pool_free_arrays(kv_pool *p) {
  free(p->free_ids);
  free(p->refs);
  free(p->pins);
  free(p->lru_prev);
  free(p->lru_next);
  free(p->page_map);
  free(p->layer_group);
  free(p->layer_slot);
  free(p);
}

int kv_pool_new(const mdl_llama_cfg *cfg, krn_ctx *kc, const kv_pool_opts *o, kv_pool **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!cfg || !kc || !kc->be || !o) {
    snprintf(err, errlen, "kvpool: missing model config, kernel context or options");
    return -1;
  }
  char why[200];
  if (mdl_kv_type_check(cfg, kc->be, o->type, why, sizeof why)) {
    snprintf(err, errlen, "kvpool: %s", why);
    return -1;
  }
  int bs = o->block_size ? o->block_size : 16;
  if (bs < 1 || bs > 4096) {
    snprintf(err, errlen, "kvpool: block size %d out of range", bs);
    return -1;
  }
  if (cfg->n_layer < 1 || mdl_kv_parts(cfg) < 1 || mdl_kv_width(cfg) < 1) {
    snprintf(err, errlen, "kvpool: model config has no layers or no KV values per position");
    return -1;
  }
  if (o->shareable && kc->be->ctx_init) {
    snprintf(err, errlen, "kvpool: a shareable pool lives in host memory; backend %s keeps KV on its device",
             kc->be->name);
    return -1;
  }
  kv_pool *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "kvpool: out of memory");
    return -1;
  }
  p->layer_group = malloc((size_t)cfg->n_layer * sizeof *p->layer_group);
  p->layer_slot = malloc((size_t)cfg->n_layer * sizeof *p->layer_slot);
  if (!p->layer_group || !p->layer_slot) {
    pool_free_arrays(p);
    snprintf(err, errlen, "kvpool: out of memory");
    return -1;
  }
  p->n_groups = o->plain ? 1 : mdl_kv_plan_groups(cfg, p->layer_group, p->layer_slot);
  size_t bb = mdl_kv_block_bytes(cfg, o->type, bs), page = bb / (size_t)p->n_groups;
  size_t nb = o->budget_bytes / page;
  if (nb > INT32_MAX / 2) nb = INT32_MAX / 2;
  if (nb < (size_t)p->n_groups) {
    snprintf(err, errlen, "kvpool: budget of %zu bytes holds no block (one block is %zu bytes)", o->budget_bytes, bb);
    pool_free_arrays(p);
    return -1;
  }
  p->cfg = *cfg;
  p->kc = kc;
  p->kv.type = o->type;
  p->kv.n_blocks = (int)nb;
  p->kv.block_size = bs;
  p->bytes = nb * page;
  p->free_ids = malloc(nb * sizeof *p->free_ids);
  p->refs = calloc(nb, sizeof *p->refs);
  p->pins = calloc(nb, sizeof *p->pins);
  p->lru_prev = malloc(nb * sizeof *p->lru_prev);
  p->lru_next = malloc(nb * sizeof *p->lru_next);
  if (p->n_groups > 1) {
    p->page_map = malloc(nb * (size_t)p->n_groups * sizeof *p->page_map);
    p->kv.n_groups = p->n_groups;
    p->kv.layer_group = p->layer_group;
    p->kv.layer_slot = p->layer_slot;
    p->kv.page_map = p->page_map;
    while (p->n_global < p->n_groups && mdl_kv_group_window(cfg, &p->kv, p->n_global) == 0) p->n_global++;
    for (int g = p->n_global; g < p->n_groups; g++) {
      int w = mdl_kv_group_window(cfg, &p->kv, g);
      if (w > p->window) p->window = w;
    }
  } else {
    p->n_global = 1;
  }
  char aerr[256] = "";
  p->shared = o->shareable;
  p->unread = o->unread && !kc->be->ctx_init; // a backend with a context (cuda) keeps the pool on its device
  // A shareable pool is memfd-backed, so a prefill worker on this host can map it (kvxfer's shm backend).
  if (p->free_ids && p->refs && p->pins && p->lru_prev && p->lru_next && (p->n_groups == 1 || p->page_map))
    p->kv.base = p->shared ? kvx_host_alloc(p->bytes, aerr, sizeof aerr) : kc->be->alloc(kc, p->bytes);
  if (!p->kv.base) {
    snprintf(err, errlen, "kvpool: cannot allocate %zu bytes for %zu KV pages on %s%s%s", p->bytes, nb,
             p->shared ? "shareable host memory" : kc->be->name, aerr[0] ? ": " : "", aerr);
    pool_free_arrays(p);
    return -1;
  }
  // Hand out low ids first: the stack top is page 0.
  for (size_t i = 0; i < nb; i++) {
    p->free_ids[i] = (int32_t)(nb - 1 - i);
    p->lru_prev[i] = p->lru_next[i] = -2;
  }
  for (size_t i = 0; p->page_map && i < nb * (size_t)p->n_groups; i++) p->page_map[i] = -1;
  p->n_free = (int)nb;
  p->lru_head = p->lru_tail = -1;
  pthread_mutex_init(&p->mu, NULL);
  *out = p;
  return 0;
}

void kv_pool_free(kv_pool *p) {
  if (!p) return;
  if (p->shared) kvx_host_free(p->kv.base, p->bytes);
  else p->kc->be->free(p->kc, p->kv.base);
  pthread_mutex_destroy(&p->mu);
  pool_free_arrays(p);
}

const mdl_kv *kv_pool_kv(const kv_pool *p) { return &p->kv; }

void *kv_pool_base(const kv_pool *p, size_t *bytes) {
  if (bytes) *bytes = p->bytes;
  return p->kv.base;
}

int kv_pool_free_blocks(const kv_pool *p) {
  kv_pool *q = (kv_pool *)p; // the lock is not part of the pool's logical state
  pthread_mutex_lock(&q->mu);
  int n = (q->n_free + q->n_lru_pages) / q->n_groups;
  pthread_mutex_unlock(&q->mu);
  return n;
}

int kv_pool_free_pages(const kv_pool *p, int *reclaimable) {
  kv_pool *q = (kv_pool *)p;
  pthread_mutex_lock(&q->mu);
  int n = q->n_free;
  if (reclaimable) *reclaimable = q->n_lru_pages;
  pthread_mutex_unlock(&q->mu);
  return n;
}

int kv_pool_total_blocks(const kv_pool *p) { return p->kv.n_blocks / p->n_groups; }

int kv_pool_groups(const kv_pool *p) { return p->n_groups; }

int kv_pool_window(const kv_pool *p) { return p->window; }

const mdl_llama_cfg *kv_pool_cfg(const kv_pool *p) { return &p->cfg; }

void kv_pool_set_stage(kv_pool *p, kv_stage *s) { p->stage = s; }
kv_stage *kv_pool_stage(const kv_pool *p) { return p->stage; }

size_t kv_pool_block_bytes(const kv_pool *p) {
  return mdl_kv_block_bytes(&p->cfg, p->kv.type, p->kv.block_size);
}

// ---- window LRU (caller holds p->mu) ----

static int32_t *map_row(const kv_pool *p, int32_t b) { return p->page_map + (size_t)b * (size_t)p->n_groups; }

// Window pages block b has attached.
static int window_pages_locked(const kv_pool *p, int32_t b) {
  int n = 0;
  for (int g = p->n_global; g < p->n_groups; g++) n += map_row(p, b)[g] >= 0;
  return n;
}

static void lru_remove_locked(kv_pool *p, int32_t b) {
  if (p->lru_prev[b] == -2) return;
  int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
  if (pr >= 0) p->lru_next[pr] = nx;
  else p->lru_head = nx;
  if (nx >= 0) p->lru_prev[nx] = pr;
  else p->lru_tail = pr;
  p->lru_prev[b] = p->lru_next[b] = -2;
  p->n_lru_pages -= window_pages_locked(p, b);
}

static void lru_push_locked(kv_pool *p, int32_t b) {
  int n = window_pages_locked(p, b);
  if (n == 0 || p->lru_prev[b] != -2) return;
  p->lru_prev[b] = p->lru_tail;
  p->lru_next[b] = -1;
  if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
  else p->lru_head = b;
  p->lru_tail = b;
  p->n_lru_pages += n;
}

// Gives block b's window pages back to the free list (b stays, with holes where they were).
static void detach_window_locked(kv_pool *p, int32_t b) {
  lru_remove_locked(p, b);
  int32_t *row = map_row(p, b);
  for (int g = p->n_global; g < p->n_groups; g++)
    if (row[g] >= 0) {
      p->free_ids[p->n_free++] = row[g];
      row[g] = -1;
    }
}

// Frees pages until n are free, reclaiming unpinned window pages oldest first. 0 when n are free.
static int reclaim_locked(kv_pool *p, int n) {
  while (p->n_free < n && p->lru_head >= 0) detach_window_locked(p, p->lru_head);
  return p->n_free >= n ? 0 : -1;
}

static void pin_locked(kv_pool *p, int32_t b) {
  if (p->n_groups == 1 || p->pins[b]++ > 0) return;
  lru_remove_locked(p, b);
}

static void unpin_locked(kv_pool *p, int32_t b) {
  if (p->n_groups == 1 || p->pins[b] <= 0) return;
  if (--p->pins[b] == 0 && p->refs[b] > 0) lru_push_locked(p, b);
}

// Takes one block's pages off the free list (the caller checked that enough are free): every group's, or with
// window 0 only the global groups' (a block the table's window has already passed).
static int32_t take_block_locked(kv_pool *p, int window) {
  int32_t b = p->free_ids[--p->n_free];
  p->refs[b] = 1;
  if (p->n_groups > 1) {
    int32_t *row = map_row(p, b);
    row[0] = b;
    for (int g = 1; g < p->n_groups; g++) row[g] = g < p->n_global || window ? p->free_ids[--p->n_free] : -1;
  }
  return b;
}

// Caller holds p->mu.
static void kvpool_drop_locked(kv_pool *p, int32_t id) {
  if (id < 0 || id >= p->kv.n_blocks || p->refs[id] <= 0) return;
  if (--p->refs[id] > 0) return;
  if (p->n_groups > 1) {
    lru_remove_locked(p, id);
    p->pins[id] = 0;
    int32_t *row = map_row(p, id);
    for (int g = 1; g < p->n_groups; g++)
      if (row[g] >= 0) p->free_ids[p->n_free++] = row[g];
    for (int g = 0; g < p->n_groups; g++) row[g] = -1;
  }
  p->free_ids[p->n_free++] = id;
}

void kv_pool_ref(kv_pool *p, int32_t block) {
  if (!p || block < 0 || block >= p->kv.n_blocks) return;
  pthread_mutex_lock(&p->mu);
  if (p->refs[block] > 0 && p->refs[block] < INT32_MAX) p->refs[block]++;
  pthread_mutex_unlock(&p->mu);
}

void kv_pool_unref(kv_pool *p, int32_t block) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  kvpool_drop_locked(p, block);
  pthread_mutex_unlock(&p->mu);
}

int kv_pool_refcount(const kv_pool *p, int32_t block) {
  if (!p || block < 0 || block >= p->kv.n_blocks) return 0;
  kv_pool *q = (kv_pool *)p; // the lock is not part of the pool's logical state
  pthread_mutex_lock(&q->mu);
  int n = q->refs[block];
  pthread_mutex_unlock(&q->mu);
  return n;
}

int kv_pool_alloc(kv_pool *p, int32_t *ids, int n) {
  if (!p || n < 0 || (n > 0 && !ids)) return -1;
  pthread_mutex_lock(&p->mu);
  if (reclaim_locked(p, n * p->n_groups)) {
    pthread_mutex_unlock(&p->mu);
    return -1;
  }
  for (int i = 0; i < n; i++) ids[i] = take_block_locked(p, 1);
  pthread_mutex_unlock(&p->mu);
  return 0;
}

int kv_pool_blocks_needed(const kv_pool *p, int n_tokens, int chunk) {
  int bs = p->kv.block_size, nb = (int)(((int64_t)n_tokens + bs - 1) / bs);
  if (p->n_groups == 1 || nb < 1) return nb;
  // a step of chunk positions from pos0 pins the window's blocks from first_live(pos0) up to its end
  int64_t win = ((int64_t)p->window + (chunk > 1 ? chunk : 1)) / bs + 2;
  if (win > nb) win = nb;
  int64_t pages = (int64_t)nb * p->n_global + win * (p->n_groups - p->n_global);
  return (int)((pages + p->n_groups - 1) / p->n_groups);
}

int kv_pool_whole(const kv_pool *p, int32_t block) {
  if (!p || block < 0 || block >= p->kv.n_blocks) return 0;
  if (p->n_groups == 1) return kv_pool_refcount(p, block) > 0;
  kv_pool *q = (kv_pool *)p;
  pthread_mutex_lock(&q->mu);
  int ok = q->refs[block] > 0 && window_pages_locked(q, block) == q->n_groups - q->n_global;
  pthread_mutex_unlock(&q->mu);
  return ok;
}

int kv_pool_usable_prefix(const kv_pool *p, const int32_t *ids, int n) {
  if (!p || n <= 0 || p->n_groups == 1) return n > 0 ? n : 0;
  int run = 0, best = 0; // run: whole blocks ending at block i
  for (int i = 0; i < n; i++) {
    run = kv_pool_whole(p, ids[i]) ? run + 1 : 0;
    int m = i + 1, live = mdl_kv_first_live_block(p->window, m * p->kv.block_size, p->kv.block_size);
    if (run >= m - live) best = m;
  }
  return best;
}

static int kvpool_copy_block(const kv_pool *p, int32_t block, void *host, int to_host) {
  if (!p || !host || block < 0 || block >= p->kv.n_blocks) return -1;
  if (!kv_pool_whole(p, block)) return -1; // a block without its window pages is not one block's bytes
  size_t chunk = mdl_kv_chunk_bytes(&p->cfg, &p->kv);
  char *h = host;
  int parts = mdl_kv_parts(&p->cfg);
  for (int l = 0; l < p->cfg.n_layer; l++)
    for (int kvi = 0; kvi < parts; kvi++, h += chunk) {
      void *dev = mdl_kv_chunk(&p->cfg, &p->kv, l, kvi, mdl_kv_page(&p->kv, block, mdl_kv_group_of(&p->kv, l)));
      if (to_host) {
        if (p->kc->be->download) p->kc->be->download(p->kc, h, dev, chunk);
        else memcpy(h, dev, chunk);
      } else {
        if (p->kc->be->upload) p->kc->be->upload(p->kc, dev, h, chunk);
        else memcpy(dev, h, chunk);
      }
    }
  if (p->kc->be->sync) p->kc->be->sync(p->kc);
  return 0;
}

int kv_pool_read_block(const kv_pool *p, int32_t block, void *host_dst) {
  return kvpool_copy_block(p, block, host_dst, 1);
}

int kv_pool_write_block(kv_pool *p, int32_t block, const void *host_src) {
  return kvpool_copy_block(p, block, (void *)host_src, 0);
}

static int blocks_grow(kv_blocks *b, int need) {
  if (need <= b->cap) return 0;
  int cap = b->cap ? b->cap : 4;
  while (cap < need) cap *= 2;
  int32_t *ids = realloc(b->ids, (size_t)cap * sizeof *ids);
  if (!ids) return -1;
  b->ids = ids;
  b->cap = cap;
  return 0;
}

int kv_blocks_reserve(kv_pool *p, kv_blocks *b, int n_tokens) {
  if (n_tokens < 0) return -1;
  int bs = p->kv.block_size;
  int need = (int)(((int64_t)n_tokens + bs - 1) / bs);
  if (need <= b->n) return 0;
  int pages = 0;
  for (int i = b->n; i < need; i++) pages += i >= b->slid ? p->n_groups : p->n_global;
  if (blocks_grow(b, need)) return -1;
  pthread_mutex_lock(&p->mu);
  if (reclaim_locked(p, pages)) {
    pthread_mutex_unlock(&p->mu);
    if (b->n == 0) { // an empty table stays without memory, so a caller that drops it leaks nothing
      free(b->ids);
      b->ids = NULL;
      b->cap = 0;
    }
    return -1;
  }
  for (int i = b->n; i < need; i++) { // blocks the window has passed (slid) get no window pages, nor a pin
    b->ids[i] = take_block_locked(p, i >= b->slid);
    if (i >= b->slid) pin_locked(p, b->ids[i]);
  }
  pthread_mutex_unlock(&p->mu);
  b->n = need;
  return 0;
}

// Also frees b->ids, so a table that is released is never leaked.
void kv_blocks_release(kv_pool *p, kv_blocks *b) {
  if (!b) return;
  if (p && b->n > 0) {
    pthread_mutex_lock(&p->mu);
    for (int i = b->n - 1; i >= 0; i--) {
      if (i >= b->slid) unpin_locked(p, b->ids[i]);
      kvpool_drop_locked(p, b->ids[i]);
    }
    pthread_mutex_unlock(&p->mu);
  }
  free(b->ids);
  b->ids = NULL;
  b->n = b->cap = b->slid = 0;
}

void kv_blocks_truncate(kv_pool *p, kv_blocks *b, int n_tokens) {
  if (!p || !b || n_tokens < 0) return;
  int bs = p->kv.block_size, keep = (int)(((int64_t)n_tokens + bs - 1) / bs);
  if (keep >= b->n) return;
  pthread_mutex_lock(&p->mu);
  for (int i = b->n - 1; i >= keep; i--) {
    if (i >= b->slid) unpin_locked(p, b->ids[i]);
    kvpool_drop_locked(p, b->ids[i]);
  }
  pthread_mutex_unlock(&p->mu);
  b->n = keep;
}

int kv_blocks_append(kv_pool *p, kv_blocks *b, const int32_t *ids, int n) {
  if (!p || !b || n < 0 || (n > 0 && !ids)) return -1;
  if (n == 0) return 0;
  if (b->n > INT32_MAX / 2 - n) return -1;
  if (blocks_grow(b, b->n + n)) return -1;
  memcpy(b->ids + b->n, ids, (size_t)n * sizeof *ids);
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < n; i++)
    if (b->n + i >= b->slid) pin_locked(p, ids[i]);
  pthread_mutex_unlock(&p->mu);
  b->n += n;
  return 0;
}

int kv_blocks_slide(kv_pool *p, kv_blocks *b, int n_pos) {
  if (!p || !b || p->n_groups == 1) return 0;
  int live = mdl_kv_first_live_block(p->window, n_pos, p->kv.block_size);
  if (live <= b->slid) return 0;
  int upto = live < b->n ? live : b->n, n = upto > b->slid ? upto - b->slid : 0;
  pthread_mutex_lock(&p->mu);
  for (int i = b->slid; i < upto; i++) unpin_locked(p, b->ids[i]);
  pthread_mutex_unlock(&p->mu);
  b->slid = live;
  return n;
}

void kv_pool_discard(kv_pool *p, const int32_t *ids, int n) {
  if (!p->unread) return;
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  size_t chunk = mdl_kv_chunk_bytes(&p->cfg, &p->kv);
  int parts = mdl_kv_parts(&p->cfg);
  pthread_mutex_lock(&p->mu); // page_map
  for (int i = 0; i < n; i++)
    for (int l = 0; l < p->cfg.n_layer; l++) {
      int32_t b = ids[i], page = b < 0 || b >= p->kv.n_blocks ? -1 : mdl_kv_page(&p->kv, b, mdl_kv_group_of(&p->kv, l));
      for (int part = 0; part < parts && page >= 0; part++) {
        uintptr_t a = (uintptr_t)mdl_kv_chunk(&p->cfg, &p->kv, l, part, page);
        uintptr_t lo = (a + pg - 1) & ~(pg - 1), hi = (a + chunk) & ~(pg - 1);
        // a memfd's pages go back with MADV_REMOVE (DONTNEED would only unmap them); others' with DONTNEED
        if (hi > lo) madvise((void *)lo, hi - lo, p->shared ? MADV_REMOVE : MADV_DONTNEED);
      }
    }
  pthread_mutex_unlock(&p->mu);
}
