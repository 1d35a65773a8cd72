// worker/kvpool.c: the paged KV block pool: one buffer of blocks sized from a byte budget, a locked free list.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/kvpool.h"

#include "kvxfer/kvx.h"

struct wrk_kvpool {
  mdl_llama_cfg cfg;
  krn_ctx *kc;       // (borrowed) where base was allocated
  mdl_kv kv;         // kv.base (owned) from kc->be->alloc, or kvx_host_alloc when shared
  size_t bytes;      // size of kv.base
  int shared;        // kv.base is shareable host memory (kvx_host_alloc)
  wrk_kvstage *stage; // (borrowed) host mirror peers reach instead, or NULL
  pthread_mutex_t mu;
  int32_t *free_ids; // (owned) (n_blocks) stack of free block ids; [0, n_free) are free
  int32_t *refs;     // (owned) (n_blocks) reference count per block; 0 = on the free list
  int n_free;
};

int wrk_kvpool_new(const mdl_llama_cfg *cfg, krn_ctx *kc, const wrk_kvpool_opts *o, wrk_kvpool **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!cfg || !kc || !kc->be || !o) {
    snprintf(err, errlen, "kvpool: missing model config, kernel context or options");
    return -1;
  }
  if (o->type != KRN_F16 && o->type != KRN_F32) {
    snprintf(err, errlen, "kvpool: KV type %s not supported (F16 or F32)", krn_type_name(o->type));
    return -1;
  }
  int bs = o->block_size ? o->block_size : 16;
  if (bs < 1 || bs > 4096) {
    snprintf(err, errlen, "kvpool: block size %d out of range", bs);
    return -1;
  }
  if (cfg->n_layer < 1 || cfg->n_kv_head < 1 || cfg->head_dim < 1) {
    snprintf(err, errlen, "kvpool: model config has no layers or KV heads");
    return -1;
  }
  size_t bb = mdl_kv_block_bytes(cfg, o->type, bs);
  size_t nb = o->budget_bytes / bb;
  if (nb < 1) {
    snprintf(err, errlen, "kvpool: budget of %zu bytes holds no block (one block is %zu bytes)", o->budget_bytes, bb);
    return -1;
  }
  if (nb > INT32_MAX / 2) nb = INT32_MAX / 2;
  if (o->shareable && kc->be->ctx_init) {
    snprintf(err, errlen, "kvpool: a shareable pool lives in host memory; backend %s keeps KV on its device",
             kc->be->name);
    return -1;
  }
  wrk_kvpool *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "kvpool: out of memory");
    return -1;
  }
  p->cfg = *cfg;
  p->kc = kc;
  p->kv.type = o->type;
  p->kv.n_blocks = (int)nb;
  p->kv.block_size = bs;
  p->bytes = nb * bb;
  p->free_ids = malloc(nb * sizeof *p->free_ids);
  p->refs = calloc(nb, sizeof *p->refs);
  char aerr[256] = "";
  p->shared = o->shareable;
  // A shareable pool is memfd-backed, so a prefill worker on this host can map it (kvxfer's shm backend).
  if (p->free_ids && p->refs)
    p->kv.base = p->shared ? kvx_host_alloc(p->bytes, aerr, sizeof aerr) : kc->be->alloc(kc, p->bytes);
  if (!p->kv.base) {
    snprintf(err, errlen, "kvpool: cannot allocate %zu bytes for %zu KV blocks on %s%s%s", p->bytes, nb,
             p->shared ? "shareable host memory" : kc->be->name, aerr[0] ? ": " : "", aerr);
    free(p->free_ids);
    free(p->refs);
    free(p);
    return -1;
  }
  // Hand out low ids first: the stack top is block 0.
  for (size_t i = 0; i < nb; i++) p->free_ids[i] = (int32_t)(nb - 1 - i);
  p->n_free = (int)nb;
  pthread_mutex_init(&p->mu, NULL);
  *out = p;
  return 0;
}

void wrk_kvpool_free(wrk_kvpool *p) {
  if (!p) return;
  if (p->shared) kvx_host_free(p->kv.base, p->bytes);
  else p->kc->be->free(p->kc, p->kv.base);
  pthread_mutex_destroy(&p->mu);
  free(p->free_ids);
  free(p->refs);
  free(p);
}

const mdl_kv *wrk_kvpool_kv(const wrk_kvpool *p) { return &p->kv; }

void *wrk_kvpool_base(const wrk_kvpool *p, size_t *bytes) {
  if (bytes) *bytes = p->bytes;
  return p->kv.base;
}

int wrk_kvpool_free_blocks(const wrk_kvpool *p) {
  wrk_kvpool *q = (wrk_kvpool *)p; // the lock is not part of the pool's logical state
  pthread_mutex_lock(&q->mu);
  int n = q->n_free;
  pthread_mutex_unlock(&q->mu);
  return n;
}

int wrk_kvpool_total_blocks(const wrk_kvpool *p) { return p->kv.n_blocks; }

const mdl_llama_cfg *wrk_kvpool_cfg(const wrk_kvpool *p) { return &p->cfg; }

void wrk_kvpool_set_stage(wrk_kvpool *p, wrk_kvstage *s) { p->stage = s; }
wrk_kvstage *wrk_kvpool_stage(const wrk_kvpool *p) { return p->stage; }

size_t wrk_kvpool_block_bytes(const wrk_kvpool *p) {
  return mdl_kv_block_bytes(&p->cfg, p->kv.type, p->kv.block_size);
}

// Caller holds p->mu.
static void kvpool_drop_locked(wrk_kvpool *p, int32_t id) {
  if (id < 0 || id >= p->kv.n_blocks || p->refs[id] <= 0) return;
  if (--p->refs[id] == 0 && p->n_free < p->kv.n_blocks) p->free_ids[p->n_free++] = id;
}

void wrk_kvpool_ref(wrk_kvpool *p, int32_t block) {
  if (!p || block < 0 || block >= p->kv.n_blocks) return;
  pthread_mutex_lock(&p->mu);
  if (p->refs[block] > 0 && p->refs[block] < INT32_MAX) p->refs[block]++;
  pthread_mutex_unlock(&p->mu);
}

void wrk_kvpool_unref(wrk_kvpool *p, int32_t block) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  kvpool_drop_locked(p, block);
  pthread_mutex_unlock(&p->mu);
}

int wrk_kvpool_refcount(const wrk_kvpool *p, int32_t block) {
  if (!p || block < 0 || block >= p->kv.n_blocks) return 0;
  wrk_kvpool *q = (wrk_kvpool *)p; // the lock is not part of the pool's logical state
  pthread_mutex_lock(&q->mu);
  int n = q->refs[block];
  pthread_mutex_unlock(&q->mu);
  return n;
}

int wrk_kvpool_alloc(wrk_kvpool *p, int32_t *ids, int n) {
  if (!p || n < 0 || (n > 0 && !ids)) return -1;
  pthread_mutex_lock(&p->mu);
  if (p->n_free < n) {
    pthread_mutex_unlock(&p->mu);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    ids[i] = p->free_ids[--p->n_free];
    p->refs[ids[i]] = 1;
  }
  pthread_mutex_unlock(&p->mu);
  return 0;
}

static int kvpool_copy_block(const wrk_kvpool *p, int32_t block, void *host, int to_host) {
  if (!p || !host || block < 0 || block >= p->kv.n_blocks) return -1;
  size_t chunk = mdl_kv_chunk_bytes(&p->cfg, &p->kv);
  char *h = host;
  for (int l = 0; l < p->cfg.n_layer; l++)
    for (int kvi = 0; kvi < 2; kvi++, h += chunk) {
      void *dev = mdl_kv_chunk(&p->cfg, &p->kv, l, kvi, block);
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

int wrk_kvpool_read_block(const wrk_kvpool *p, int32_t block, void *host_dst) {
  return kvpool_copy_block(p, block, host_dst, 1);
}

int wrk_kvpool_write_block(wrk_kvpool *p, int32_t block, const void *host_src) {
  return kvpool_copy_block(p, block, (void *)host_src, 0);
}

int wrk_blocks_reserve(wrk_kvpool *p, wrk_blocks *b, int n_tokens) {
  if (n_tokens < 0) return -1;
  int bs = p->kv.block_size;
  int need = (int)(((int64_t)n_tokens + bs - 1) / bs);
  if (need <= b->n) return 0;
  int add = need - b->n;
  if (need > b->cap) {
    int cap = b->cap ? b->cap : 4;
    while (cap < need) cap *= 2;
    int32_t *ids = realloc(b->ids, (size_t)cap * sizeof *ids);
    if (!ids) return -1;
    b->ids = ids;
    b->cap = cap;
  }
  pthread_mutex_lock(&p->mu);
  if (p->n_free < add) {
    pthread_mutex_unlock(&p->mu);
    if (b->n == 0) { // an empty table stays without memory, so a caller that drops it leaks nothing
      free(b->ids);
      b->ids = NULL;
      b->cap = 0;
    }
    return -1;
  }
  for (int i = 0; i < add; i++) {
    b->ids[b->n + i] = p->free_ids[--p->n_free];
    p->refs[b->ids[b->n + i]] = 1;
  }
  pthread_mutex_unlock(&p->mu);
  b->n = need;
  return 0;
}

// Also frees b->ids, so a table that is released is never leaked.
void wrk_blocks_release(wrk_kvpool *p, wrk_blocks *b) {
  if (!b) return;
  if (p && b->n > 0) {
    pthread_mutex_lock(&p->mu);
    for (int i = b->n - 1; i >= 0; i--) kvpool_drop_locked(p, b->ids[i]);
    pthread_mutex_unlock(&p->mu);
  }
  free(b->ids);
  b->ids = NULL;
  b->n = b->cap = 0;
}

int wrk_blocks_append(wrk_blocks *b, const int32_t *ids, int n) {
  if (!b || n < 0 || (n > 0 && !ids)) return -1;
  if (n == 0) return 0;
  if (b->n > INT32_MAX / 2 - n) return -1;
  int need = b->n + n;
  if (need > b->cap) {
    int cap = b->cap ? b->cap : 4;
    while (cap < need) cap *= 2;
    int32_t *nid = realloc(b->ids, (size_t)cap * sizeof *nid);
    if (!nid) return -1;
    b->ids = nid;
    b->cap = cap;
  }
  memcpy(b->ids + b->n, ids, (size_t)n * sizeof *ids);
  b->n = need;
  return 0;
}
