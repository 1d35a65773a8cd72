// kv/wire.c: KV pool layout, kvxfer metadata and sampled-token fields (kv_first, token logprobs) on the wire.
#include "kv/wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/stage.h"
#include "proto/hello.h"
#include "util/crypto.h"

prt_kv_layout kv_wire_layout(const kv_pool *kv) {
  const mdl_llama_cfg *c = kv_pool_cfg(kv);
  const mdl_kv *v = kv_pool_kv(kv);
  return (prt_kv_layout){.n_layer = c->n_layer, .parts = mdl_kv_parts(c), .width = mdl_kv_width(c),
                         .type = (int)v->type, .block_size = v->block_size, .n_blocks = v->n_blocks,
                         .n_groups = mdl_kv_groups(v),
                         .base = kv_stage_addr(kv_pool_stage(kv), v->base)}; // the mirror, if staged
}

int kv_wire_check_layout(const prt_kv_layout *peer, const kv_pool *local, wrk_kv_remote *out, char *err,
                         size_t errlen) {
  if (!peer) {
    snprintf(err, errlen, "the peer sent no kv_layout");
    return -1;
  }
  prt_kv_layout l = *peer;
  const mdl_llama_cfg *c = kv_pool_cfg(local);
  const mdl_kv *v = kv_pool_kv(local);
  if (l.n_groups != mdl_kv_groups(v)) {
    snprintf(err, errlen,
             "KV layouts differ: the peer keeps %d layer groups, this worker %d: both workers must serve the same model",
             l.n_groups, mdl_kv_groups(v));
    return -1;
  }
  if (l.type != (int)v->type) { // the blocks' bytes mean different things: refused, never read as the other type
    snprintf(err, errlen,
             "KV types differ: the peer's pool holds kv_type %s, this worker's %s: give both workers the same kv_type",
             krn_kv_type_str(l.type), krn_kv_type_str(v->type));
    return -1;
  }
  int parts = mdl_kv_parts(c), width = mdl_kv_width(c);
  if (l.n_layer != c->n_layer || l.parts != parts || l.width != width || l.block_size != v->block_size) {
    // parts and width: a latent cache (one row of kv_lora_rank + rope values) is never read as K and V, nor back
    snprintf(err, errlen,
             "KV layouts differ: the peer's pool holds %d layers x %d part%s of %d values per position in blocks of "
             "%d, this worker's %d layers x %d part%s of %d in blocks of %d: both workers must serve the same model "
             "with the same block_size",
             l.n_layer, l.parts, l.parts == 1 ? "" : "s", l.width, l.block_size, c->n_layer, parts,
             parts == 1 ? "" : "s", width, v->block_size);
    return -1;
  }
  out->base = l.base;
  out->n_blocks = l.n_blocks;
  out->n_groups = l.n_groups;
  out->n_parts = l.parts;
  out->chunk_bytes = mdl_kv_chunk_bytes(c, v);
  return 0;
}

uint64_t wrk_kv_remote_chunk(const wrk_kv_remote *r, int slot, int part, int page) {
  uint64_t np = r->n_parts > 0 ? (uint64_t)r->n_parts : 2; // as mdl_kv_chunk lays them out
  return r->base + (((uint64_t)slot * np + (uint64_t)part) * (uint64_t)r->n_blocks + (uint64_t)page) * r->chunk_bytes;
}

int kv_wire_table(const kv_pool *kv, const int32_t *ids, int n, prt_kv_table *t) {
  const mdl_kv *v = kv_pool_kv(kv);
  int ng = mdl_kv_groups(v);
  t->blocks = (int32_t *)ids;
  t->n_blocks = n;
  t->pages = NULL;
  t->n_pages = 0;
  if (ng == 1 || n == 0) return 0;
  if (!(t->pages = malloc((size_t)n * (size_t)ng * sizeof *t->pages))) return -1;
  for (int i = 0; i < n; i++)
    for (int g = 0; g < ng; g++) t->pages[t->n_pages++] = mdl_kv_page(v, ids[i], g);
  return 0;
}

int kv_wire_read_table(const prt_kv_table *t, const wrk_kv_remote *r, int32_t **pages_out, int *n_out) {
  *pages_out = NULL;
  *n_out = 0;
  int ng = r->n_groups > 1 ? r->n_groups : 1;
  const int32_t *arr = ng > 1 ? t->pages : t->blocks;
  int len = ng > 1 ? t->n_pages : t->n_blocks;
  if (len < 1 || len % ng) return -1;
  int32_t *pages = malloc((size_t)len * sizeof *pages);
  if (!pages) return -1;
  for (int i = 0; i < len; i++) {
    // a block's id (group 0) always exists; a window page may have been given back (-1)
    if (arr[i] < (i % ng ? -1 : 0) || arr[i] >= r->n_blocks) {
      free(pages);
      return -1;
    }
    pages[i] = arr[i];
  }
  *pages_out = pages;
  *n_out = len / ng;
  return 0;
}

int kv_wire_first_live_block(const mdl_llama_cfg *c, int layer, int n_prompt, int block_size) {
  return mdl_kv_first_live_block(mdl_llama_layer_window(c, layer), n_prompt, block_size);
}

double kv_wire_handoff_bytes(const kv_pool *kv, int n_prompt, int skip, int *dead_out) {
  const mdl_llama_cfg *c = kv_pool_cfg(kv);
  int bs = kv_pool_kv(kv)->block_size, n = (n_prompt + bs - 1) / bs, dead = 0;
  long chunks = 0; // (layer, block) pairs sent
  for (int l = 0; l < c->n_layer; l++) {
    int from = kv_wire_first_live_block(c, l, n_prompt, bs);
    if (from > skip) dead = 1;
    from = from > skip ? from : skip;
    if (n > from) chunks += n - from;
  }
  if (dead_out) *dead_out = dead;
  return (double)chunks * (double)kv_pool_block_bytes(kv) / (double)c->n_layer;
}

int kv_wire_write_blocks(kvx_agent *a, const kv_pool *kv, const char *peer, const wrk_kv_remote *remote,
                            const int32_t *local_ids, const int32_t *remote_pages, int n, int l0, int l1,
                            const void *notif, size_t notif_len, kvx_xfer **out, char *err, size_t errlen) {
  *out = NULL;
  if (n < 1 || l1 <= l0) return 0;
  const mdl_llama_cfg *c = kv_pool_cfg(kv);
  const mdl_kv *v = kv_pool_kv(kv);
  int parts = mdl_kv_parts(c), k = (l1 - l0) * parts * n;
  size_t chunk = mdl_kv_chunk_bytes(c, v);
  kvx_desc *loc = malloc((size_t)k * sizeof *loc), *rem = malloc((size_t)k * sizeof *rem);
  if (!loc || !rem) {
    free(loc);
    free(rem);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int i = 0, ng = mdl_kv_groups(v);
  for (int l = l0; l < l1; l++) { // (layer, part, block) order: a layer's K blocks, then its V blocks (or its latent)
    int g = mdl_kv_group_of(v, l), slot = v->n_groups > 1 ? v->layer_slot[l] : l;
    for (int kvi = 0; kvi < parts; kvi++)
      for (int b = 0; b < n; b++) {
        int32_t ours = mdl_kv_page(v, local_ids[b], g), theirs = remote_pages[(size_t)b * (size_t)ng + (size_t)g];
        if (ours < 0 || theirs < 0) {
          free(loc);
          free(rem);
          snprintf(err, errlen, "layer %d of block %d has no page %s (its window passed it)", l, b,
                   ours < 0 ? "here" : "on the peer");
          return -1;
        }
        loc[i] = (kvx_desc){(uint64_t)(uintptr_t)mdl_kv_chunk(c, v, l, kvi, ours), chunk};
        rem[i] = (kvx_desc){wrk_kv_remote_chunk(remote, slot, kvi, theirs), chunk};
        i++;
      }
  }
  // Staging: the chunks go out of their host mirror slots, copied there now (the caller knows they are written).
  kv_stage *st = kv_pool_stage(kv);
  if (st && kv_stage_out(st, loc, (size_t)k)) {
    free(loc);
    free(rem);
    snprintf(err, errlen, "a KV chunk lies outside the pool");
    return -1;
  }
  for (int j = 0; st && j < k; j++) loc[j].addr = kv_stage_addr(st, (const void *)(uintptr_t)loc[j].addr);
  kvx_xfer *x = NULL;
  int rc = kvx_xfer_new(a, KVX_WRITE, loc, (size_t)k, rem, (size_t)k, peer, notif, notif_len, &x, err, errlen);
  free(loc);
  free(rem);
  if (!rc && kvx_xfer_post(x)) {
    snprintf(err, errlen, "%s", kvx_xfer_error(x));
    rc = -1;
  }
  if (rc) {
    kvx_xfer_free(x);
    return -1;
  }
  *out = x;
  return 0;
}

char *kv_wire_pack_md(kvx_agent *a) {
  void *blob = NULL;
  size_t len = 0;
  char err[256];
  if (kvx_pack_md(a, &blob, &len, err, sizeof err)) return NULL;
  char *b64 = utl_base64_encode(blob, len);
  free(blob);
  return b64;
}

int kv_wire_load_md(const char *kvx_md, kvx_agent *a, char *peer, size_t cap, char *err, size_t errlen) {
  uint8_t *blob = NULL;
  size_t len = 0;
  if (!kvx_md || utl_base64_decode(kvx_md, strlen(kvx_md), &blob, &len)) {
    snprintf(err, errlen, "the peer sent no usable kvx_md");
    return -1;
  }
  int rc = kvx_load_remote_md(a, blob, len, peer, cap, err, errlen);
  free(blob);
  return rc;
}

void kv_wire_sampled_to(const mdl_sampled *s, prt_sampled *out) {
  memset(out, 0, sizeof *out);
  out->token = s->token;
  out->logprob = s->logprob;
  for (int i = 0; i < s->n_top && i < PRT_MAX_TOP; i++) out->top[out->n_top++] = (prt_top){s->top[i].token, s->top[i].logprob};
}

void kv_wire_sampled_from(const prt_sampled *p, mdl_sampled *out) {
  memset(out, 0, sizeof *out);
  out->token = p->token;
  out->logprob = p->logprob;
  int cap = (int)(sizeof out->top / sizeof out->top[0]);
  for (int i = 0; i < p->n_top && i < cap; i++) out->top[out->n_top++] = (mdl_logprob){p->top[i].token, p->top[i].logprob};
}
