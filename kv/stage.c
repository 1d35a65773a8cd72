// kv/stage.c: host staging of KV transfers: a registered host mirror of a device pool, copied per chunk or block.
#include "kv/stage.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

struct kv_stage {
  kv_pool *pool;   // (borrowed)
  krn_ctx *kc;        // (borrowed) the context the pool lives on
  uint8_t *base;      // (borrowed) the pool's buffer
  size_t bytes;       // of the pool and of the mirror
  uint8_t *mirror;    // (owned) kvx_host_alloc: same layout and block ids as the pool
  int pinned;         // the mirror is page-locked by kc's backend
  double out, in;     // bytes copied pool -> mirror, mirror -> pool
};

// 1 when KV of this worker moves through a mirror, 0 when peers reach the pool itself; -1 (err) when the
// setting cannot work. *try_direct: first try to register the pool for GPUDirect (rdma), stage if that fails.
static int want_stage(const cfg_worker *wc, const krn_ctx *kc, int *try_direct, char *err, size_t errlen) {
  const char *mode = wc->kvx_staging[0] ? wc->kvx_staging : "auto";
  const char *be = wc->kvx_backend[0] ? wc->kvx_backend : "auto";
  int on_device = kc->be->ctx_init != NULL; // the cpu backends keep memory on the host (kvpool.c says the same)
  *try_direct = 0;
  if (!strcmp(mode, "on")) {
    if (!strcmp(be, "nccl")) {
      snprintf(err, errlen, "kvxfer staging \"on\" does not work with backend nccl (it moves GPU memory only)");
      return -1;
    }
    return 1;
  }
  if (!strcmp(mode, "off") || !on_device || !strcmp(be, "nccl")) return 0;
  if (!strcmp(be, "rdma")) *try_direct = 1;
  return 1; // tcp, shm and auto (which may pick either for a peer) cannot move GPU memory
}

int kv_stage_open(kvx_agent *a, kv_pool *pool, krn_ctx *kc, const cfg_worker *wc, kv_stage **stage,
                     kvx_region **region, char *err, size_t errlen) {
  *stage = NULL;
  *region = NULL;
  if (!a || !pool || !kc || !kc->be || !wc) {
    snprintf(err, errlen, "kvstage: missing agent, pool, kernel context or worker config");
    return -1;
  }
  size_t bytes;
  void *base = kv_pool_base(pool, &bytes);
  int on_device = kc->be->ctx_init != NULL, try_direct;
  int st = want_stage(wc, kc, &try_direct, err, errlen);
  if (st < 0) return -1;
  if (try_direct) {
    char e[256] = "";
    if (kvx_register(a, base, bytes, KVX_MEM_CUDA, region, e, sizeof e) == 0) return 0; // GPUDirect
    utl_warn(wc->name, "%s; KV goes through host staging instead", e);
  }
  if (!st) return kvx_register(a, base, bytes, on_device ? KVX_MEM_CUDA : KVX_MEM_HOST, region, err, errlen);

  kv_stage *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "kvstage: out of memory");
    return -1;
  }
  s->pool = pool;
  s->kc = kc;
  s->base = base;
  s->bytes = bytes;
  char e[256] = "";
  // memfd-backed, so that a same-host peer can map it (shm backend) as it would a host pool.
  s->mirror = kvx_host_alloc(bytes, e, sizeof e);
  if (!s->mirror) {
    snprintf(err, errlen, "kvstage: cannot allocate a %zu-byte host mirror of the KV pool: %s", bytes, e);
    free(s);
    return -1;
  }
  s->pinned = on_device && krn_host_register(kc, s->mirror, bytes) == 0;
  if (kvx_register(a, s->mirror, bytes, KVX_MEM_HOST, region, err, errlen)) {
    kv_stage_free(s);
    return -1;
  }
  kv_pool_set_stage(pool, s); // kv_wire's layout and writes name the mirror from now on
  utl_log(wc->name, "KV moves through a %.1f MiB host mirror of the %s pool (%s)",
          (double)bytes / (1024.0 * 1024.0), kc->be->name, s->pinned ? "pinned" : "pageable");
  *stage = s;
  return 0;
}

void kv_stage_free(kv_stage *s) {
  if (!s) return;
  if (kv_pool_stage(s->pool) == s) kv_pool_set_stage(s->pool, NULL);
  if (s->pinned) krn_host_unregister(s->kc, s->mirror);
  kvx_host_free(s->mirror, s->bytes);
  free(s);
}

uint64_t kv_stage_addr(const kv_stage *s, const void *p) {
  if (!s) return (uint64_t)(uintptr_t)p;
  return (uint64_t)(uintptr_t)(s->mirror + ((const uint8_t *)p - s->base));
}

static int in_pool(const kv_stage *s, uint64_t addr, uint64_t len) {
  uint64_t b = (uint64_t)(uintptr_t)s->base;
  return addr >= b && len <= s->bytes && addr - b <= s->bytes - len;
}

int kv_stage_out(kv_stage *s, const kvx_desc *ranges, size_t n) {
  if (!s) return 0;
  for (size_t i = 0; i < n; i++)
    if (!in_pool(s, ranges[i].addr, ranges[i].len)) return -1;
  const uint64_t b = (uint64_t)(uintptr_t)s->base;
  for (size_t i = 0; i < n;) {
    uint64_t a0 = ranges[i].addr, len = ranges[i].len;
    size_t j = i + 1;
    while (j < n && ranges[j].addr == a0 + len) len += ranges[j++].len; // one copy for a run of neighbours
    krn_download_ready(s->kc, s->mirror + (a0 - b), s->base + (a0 - b), (size_t)len);
    s->out += (double)len;
    i = j;
  }
  return 0;
}

int kv_stage_in(kv_stage *s, const int32_t *blocks, int n) {
  if (!s || n <= 0) return 0;
  const mdl_llama_cfg *c = kv_pool_cfg(s->pool);
  const mdl_kv *kv = kv_pool_kv(s->pool);
  for (int i = 0; i < n; i++)
    if (blocks[i] < 0 || blocks[i] >= kv->n_blocks) return -1;
  const size_t chunk = mdl_kv_chunk_bytes(c, kv);
  const int parts = mdl_kv_parts(c);
  // Chunks of one (layer, part) are adjacent for consecutive pages: copy each run of them at once. A layer group's
  // page that was given back (a window passed it: -1) received nothing.
  for (int l = 0; l < c->n_layer; l++) {
    const int g = mdl_kv_group_of(kv, l);
    for (int kvi = 0; kvi < parts; kvi++)
      for (int i = 0; i < n;) {
        const int32_t first = mdl_kv_page(kv, blocks[i], g);
        int j = i + 1;
        if (first < 0) {
          i = j;
          continue;
        }
        while (j < n && mdl_kv_page(kv, blocks[j], g) == first + (j - i)) j++;
        uint8_t *dst = mdl_kv_chunk(c, kv, l, kvi, first);
        s->kc->be->upload(s->kc, dst, s->mirror + (dst - s->base), (size_t)(j - i) * chunk);
        s->in += (double)(j - i) * (double)chunk;
        i = j;
      }
  }
  return 0;
}

double kv_stage_bytes_out(const kv_stage *s) { return s ? s->out : 0; }
double kv_stage_bytes_in(const kv_stage *s) { return s ? s->in : 0; }
