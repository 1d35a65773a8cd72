// worker/kvwire.c: KV pool layout, kvxfer metadata and sampled-token fields (kv_first, token logprobs) on the wire.
#include "worker/kvwire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/kvstage.h"

void wrk_kvwire_add_layout(cJSON *msg, const wrk_kvpool *kv) {
  const mdl_llama_cfg *c = wrk_kvpool_cfg(kv);
  const mdl_kv *v = wrk_kvpool_kv(kv);
  char base[32];
  snprintf(base, sizeof base, "%" PRIu64, wrk_kvstage_addr(wrk_kvpool_stage(kv), v->base)); // the mirror, if staged
  cJSON *l = cJSON_AddObjectToObject(msg, "kv_layout");
  cJSON_AddNumberToObject(l, "n_layer", c->n_layer);
  cJSON_AddNumberToObject(l, "kv_dim", c->n_kv_head * c->head_dim);
  cJSON_AddNumberToObject(l, "type", v->type);
  cJSON_AddNumberToObject(l, "block_size", v->block_size);
  cJSON_AddNumberToObject(l, "n_blocks", v->n_blocks);
  cJSON_AddNumberToObject(l, "n_groups", mdl_kv_groups(v));
  cJSON_AddStringToObject(l, "base", base);
}

static int num(const cJSON *o, const char *k, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(v)) return -1;
  *out = v->valuedouble;
  return 0;
}

int wrk_kvwire_read_layout(const cJSON *msg, const wrk_kvpool *local, wrk_kv_remote *out, char *err, size_t errlen) {
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(msg, "kv_layout");
  const cJSON *base = cJSON_GetObjectItemCaseSensitive(l, "base");
  double n_layer, kv_dim, type, bs, nb;
  if (!cJSON_IsObject(l) || num(l, "n_layer", &n_layer) || num(l, "kv_dim", &kv_dim) || num(l, "type", &type) ||
      num(l, "block_size", &bs) || num(l, "n_blocks", &nb) || !cJSON_IsString(base)) {
    snprintf(err, errlen, "the peer sent no usable kv_layout");
    return -1;
  }
  const mdl_llama_cfg *c = wrk_kvpool_cfg(local);
  const mdl_kv *v = wrk_kvpool_kv(local);
  double ng = 1; // a peer that does not say has one group
  const cJSON *ngj = cJSON_GetObjectItemCaseSensitive(l, "n_groups");
  if (cJSON_IsNumber(ngj)) ng = ngj->valuedouble;
  if ((int)ng != mdl_kv_groups(v)) {
    snprintf(err, errlen,
             "KV layouts differ: the peer keeps %d layer groups, this worker %d: both workers must serve the same model",
             (int)ng, mdl_kv_groups(v));
    return -1;
  }
  if ((int)n_layer != c->n_layer || (int)kv_dim != c->n_kv_head * c->head_dim || (int)type != (int)v->type ||
      (int)bs != v->block_size) {
    snprintf(err, errlen,
             "KV layouts differ (peer: %d layers, kv_dim %d, type %d, block %d; here: %d, %d, %d, %d): "
             "both workers must serve the same model with the same kv_type and block_size",
             (int)n_layer, (int)kv_dim, (int)type, (int)bs, c->n_layer, c->n_kv_head * c->head_dim, (int)v->type,
             v->block_size);
    return -1;
  }
  out->base = strtoull(base->valuestring, NULL, 10);
  out->n_blocks = (int)nb;
  out->n_groups = (int)ng;
  out->chunk_bytes = mdl_kv_chunk_bytes(c, v);
  return 0;
}

uint64_t wrk_kv_remote_chunk(const wrk_kv_remote *r, int slot, int kv, int page) {
  return r->base + (((uint64_t)slot * 2 + (uint64_t)kv) * (uint64_t)r->n_blocks + (uint64_t)page) * r->chunk_bytes;
}

void wrk_kvwire_add_table(cJSON *msg, const wrk_kvpool *kv, const int32_t *ids, int n) {
  const mdl_kv *v = wrk_kvpool_kv(kv);
  cJSON *b = cJSON_AddArrayToObject(msg, "blocks");
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber(ids[i]));
  if (mdl_kv_groups(v) == 1) return;
  cJSON *p = cJSON_AddArrayToObject(msg, "pages");
  for (int i = 0; i < n; i++)
    for (int g = 0; g < mdl_kv_groups(v); g++) cJSON_AddItemToArray(p, cJSON_CreateNumber(mdl_kv_page(v, ids[i], g)));
}

int wrk_kvwire_read_table(const cJSON *msg, const wrk_kv_remote *r, int32_t **pages_out, int *n_out) {
  *pages_out = NULL;
  *n_out = 0;
  int ng = r->n_groups > 1 ? r->n_groups : 1;
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(msg, ng > 1 ? "pages" : "blocks");
  int len = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
  if (len < 1 || len % ng) return -1;
  int32_t *pages = malloc((size_t)len * sizeof *pages);
  if (!pages) return -1;
  int i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, arr) {
    // a block's id (group 0) always exists; a window page may have been given back (-1)
    double lo = i % ng ? -1 : 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble >= r->n_blocks ||
        v->valuedouble != (int32_t)v->valuedouble) {
      free(pages);
      return -1;
    }
    pages[i++] = (int32_t)v->valuedouble;
  }
  *pages_out = pages;
  *n_out = len / ng;
  return 0;
}

int wrk_kvwire_first_live_block(const mdl_llama_cfg *c, int layer, int n_prompt, int block_size) {
  return mdl_kv_first_live_block(mdl_llama_layer_window(c, layer), n_prompt, block_size);
}

double wrk_kvwire_handoff_bytes(const wrk_kvpool *kv, int n_prompt, int skip, int *dead_out) {
  const mdl_llama_cfg *c = wrk_kvpool_cfg(kv);
  int bs = wrk_kvpool_kv(kv)->block_size, n = (n_prompt + bs - 1) / bs, dead = 0;
  long chunks = 0; // (layer, block) pairs sent
  for (int l = 0; l < c->n_layer; l++) {
    int from = wrk_kvwire_first_live_block(c, l, n_prompt, bs);
    if (from > skip) dead = 1;
    from = from > skip ? from : skip;
    if (n > from) chunks += n - from;
  }
  if (dead_out) *dead_out = dead;
  return (double)chunks * (double)wrk_kvpool_block_bytes(kv) / (double)c->n_layer;
}

int wrk_kvwire_write_blocks(kvx_agent *a, const wrk_kvpool *kv, const char *peer, const wrk_kv_remote *remote,
                            const int32_t *local_ids, const int32_t *remote_pages, int n, int l0, int l1,
                            const void *notif, size_t notif_len, kvx_xfer **out, char *err, size_t errlen) {
  *out = NULL;
  int k = (l1 - l0) * 2 * n;
  if (n < 1 || l1 <= l0) return 0;
  const mdl_llama_cfg *c = wrk_kvpool_cfg(kv);
  const mdl_kv *v = wrk_kvpool_kv(kv);
  size_t chunk = mdl_kv_chunk_bytes(c, v);
  kvx_desc *loc = malloc((size_t)k * sizeof *loc), *rem = malloc((size_t)k * sizeof *rem);
  if (!loc || !rem) {
    free(loc);
    free(rem);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int i = 0, ng = mdl_kv_groups(v);
  for (int l = l0; l < l1; l++) { // (layer, K|V, block) order: each layer's K blocks, then its V blocks
    int g = mdl_kv_group_of(v, l), slot = v->n_groups > 1 ? v->layer_slot[l] : l;
    for (int kvi = 0; kvi < 2; kvi++)
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
  wrk_kvstage *st = wrk_kvpool_stage(kv);
  if (st && wrk_kvstage_out(st, loc, (size_t)k)) {
    free(loc);
    free(rem);
    snprintf(err, errlen, "a KV chunk lies outside the pool");
    return -1;
  }
  for (int j = 0; st && j < k; j++) loc[j].addr = wrk_kvstage_addr(st, (const void *)(uintptr_t)loc[j].addr);
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

int wrk_kvwire_add_md(cJSON *msg, kvx_agent *a) {
  void *blob = NULL;
  size_t len = 0;
  char err[256];
  if (kvx_pack_md(a, &blob, &len, err, sizeof err)) return -1;
  char *b64 = wrk_base64_encode(blob, len);
  free(blob);
  if (!b64) return -1;
  cJSON_AddStringToObject(msg, "kvx_md", b64);
  free(b64);
  return 0;
}

int wrk_kvwire_load_md(const cJSON *msg, kvx_agent *a, char *peer, size_t cap, char *err, size_t errlen) {
  const cJSON *md = cJSON_GetObjectItemCaseSensitive(msg, "kvx_md");
  uint8_t *blob = NULL;
  size_t len = 0;
  if (!cJSON_IsString(md) || wrk_base64_decode(md->valuestring, &blob, &len)) {
    snprintf(err, errlen, "the peer sent no usable kvx_md");
    return -1;
  }
  int rc = kvx_load_remote_md(a, blob, len, peer, cap, err, errlen);
  free(blob);
  return rc;
}

void wrk_kvwire_add_sampled(cJSON *msg, const mdl_sampled *s) {
  cJSON_AddNumberToObject(msg, "token", s->token);
  cJSON_AddNumberToObject(msg, "logprob", s->logprob);
  cJSON *top = cJSON_AddArrayToObject(msg, "top");
  for (int i = 0; i < s->n_top; i++) {
    cJSON *pair = cJSON_CreateArray();
    cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->top[i].token));
    cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->top[i].logprob));
    cJSON_AddItemToArray(top, pair);
  }
}

cJSON *wrk_kvwire_sampled_new(const mdl_sampled *s) {
  cJSON *e = cJSON_CreateObject();
  if (e) wrk_kvwire_add_sampled(e, s);
  return e;
}

int wrk_kvwire_read_sampled(const cJSON *msg, mdl_sampled *s) {
  memset(s, 0, sizeof *s);
  double tok, lp;
  if (num(msg, "token", &tok) || tok < 0 || tok > INT32_MAX) return -1;
  s->token = (int32_t)tok;
  s->logprob = num(msg, "logprob", &lp) ? 0.0f : (float)lp; // -inf travels as null
  const cJSON *top = cJSON_GetObjectItemCaseSensitive(msg, "top"), *pair;
  cJSON_ArrayForEach(pair, top) {
    if (s->n_top >= (int)(sizeof s->top / sizeof s->top[0])) break;
    const cJSON *t = cJSON_GetArrayItem(pair, 0), *l = cJSON_GetArrayItem(pair, 1);
    if (!cJSON_IsNumber(t) || !cJSON_IsNumber(l)) return -1;
    s->top[s->n_top++] = (mdl_logprob){(int32_t)t->valuedouble, (float)l->valuedouble};
  }
  return 0;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *wrk_base64_encode(const void *data, size_t len) {
  const uint8_t *p = data;
  char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
  if (!out) return NULL;
  for (size_t i = 0; i < len; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < len ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < len ? p[i + 2] : 0);
    *o++ = B64[v >> 18 & 63];
    *o++ = B64[v >> 12 & 63];
    *o++ = i + 1 < len ? B64[v >> 6 & 63] : '=';
    *o++ = i + 2 < len ? B64[v & 63] : '=';
  }
  *o = 0;
  return out;
}

int wrk_base64_decode(const char *s, uint8_t **out, size_t *len) {
  size_t n = strlen(s);
  *out = NULL;
  *len = 0;
  if (n % 4) return -1;
  uint8_t *b = malloc(n / 4 * 3 + 1);
  if (!b) return -1;
  size_t k = 0;
  for (size_t i = 0; i < n; i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int j = 0; j < 4; j++) {
      char c = s[i + j];
      const char *at = c ? strchr(B64, c) : NULL;
      if (c == '=' && i + 4 == n && j >= 2) {
        pad++;
        v <<= 6;
        continue;
      }
      if (!at || pad) {
        free(b);
        return -1;
      }
      v = v << 6 | (uint32_t)(at - B64);
    }
    b[k++] = (uint8_t)(v >> 16);
    if (pad < 2) b[k++] = (uint8_t)(v >> 8);
    if (pad < 1) b[k++] = (uint8_t)v;
  }
  *out = b;
  *len = k;
  return 0;
}
