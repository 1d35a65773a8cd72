// kvxfer/kvx_md.c: metadata blobs: what a peer needs to reach this agent (name, host, listeners, regions) and each backend's own section.
//
// Layout (little-endian, 8-byte aligned): md_head, n_regions md_region, then n_sections sections, each an md_sec
// followed by len bytes (padded to 8) that only the backend it names reads (kvx_backend.pack_md / load_md).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/kvx_int.h"

#define MD_MAGIC 0x4d58564bu  // "KVXM"
#define MD_VERSION 2u
typedef struct md_head {
  uint32_t magic, version;
  char name[KVX_MAX_NAME];
  char host_id[96];
  uint32_t backends;  // bit per KVX_BE_* enabled
  uint32_t tcp_port;  // the tcp listener, 0 when none
  char tcp_host[64];
  char unix_path[108];  // the unix listener, "" when none
  uint32_t n_regions;
  uint32_t n_sections;
  uint32_t pad;
} md_head;
_Static_assert(sizeof(md_head) % 8 == 0, "regions after the header stay 8-byte aligned");
typedef struct md_region {
  uint64_t key, addr, len;
  uint32_t mem, pad;
} md_region;
typedef struct md_sec {
  uint32_t be;   // KVX_BE_*
  uint32_t len;  // bytes that follow (then padding to 8)
} md_sec;

static const uint8_t zeros[8];

int kvx_pack_md(kvx_agent *a, void **blob, size_t *len, char *err, size_t errlen) {
  *blob = NULL;
  *len = 0;
  utl_buf b = {0};
  md_head h = {.magic = MD_MAGIC, .version = MD_VERSION, .backends = a->enabled,
               .tcp_port = (uint32_t)kvx_agent_port(a)};
  snprintf(h.name, sizeof h.name, "%s", a->name);
  snprintf(h.host_id, sizeof h.host_id, "%s", a->host_id);
  snprintf(h.tcp_host, sizeof h.tcp_host, "%s", a->advertise_host);
  snprintf(h.unix_path, sizeof h.unix_path, "%s", kvx_unix_path(a));
  pthread_rwlock_rdlock(&a->reg_lock);
  for (kvx_region *r = a->regions; r; r = r->next) h.n_regions++;
  for (int i = 0; i < KVX_NBE; i++) h.n_sections += (a->enabled & (1u << i)) && a->table[i]->pack_md;
  utl_buf_add(&b, &h, sizeof h);
  for (kvx_region *r = a->regions; r; r = r->next) {
    md_region m = {r->key, r->addr, r->len, (uint32_t)r->mem, 0};
    utl_buf_add(&b, &m, sizeof m);
  }
  int rc = 0;
  for (int i = 0; i < KVX_NBE && !rc; i++) {
    if (!(a->enabled & (1u << i)) || !a->table[i]->pack_md) continue;
    size_t at = b.n;
    md_sec s = {(uint32_t)i, 0};
    utl_buf_add(&b, &s, sizeof s);
    rc = a->table[i]->pack_md(a, &b, err, errlen);
    if (!rc && !b.oom) {
      s.len = (uint32_t)(b.n - at - sizeof s);
      memcpy(b.p + at, &s, sizeof s);
      utl_buf_add(&b, zeros, (8 - b.n % 8) % 8);
    }
  }
  pthread_rwlock_unlock(&a->reg_lock);
  if (!rc && b.oom) {
    utl_seterr(err, errlen, "out of memory");
    rc = -1;
  }
  size_t n = b.n;
  char *p = rc ? NULL : utl_buf_take(&b);
  utl_buf_free(&b);
  if (rc || !p) return -1;
  *blob = p;
  *len = n;
  return 0;
}

static int str_ok(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

// Parses a blob into a new peer (not yet linked); NULL with err when malformed.
static kvx_peer *md_parse(kvx_agent *a, const uint8_t *b, size_t len, char *err, size_t errlen) {
  md_head h;
  if (!b || len < sizeof h) {
    utl_seterr(err, errlen, "metadata: truncated (%zu bytes)", len);
    return NULL;
  }
  memcpy(&h, b, sizeof h);
  if (h.magic != MD_MAGIC || h.version != MD_VERSION) {
    utl_seterr(err, errlen, "metadata: not a kvxfer v%u blob", MD_VERSION);
    return NULL;
  }
  if (!str_ok(h.name, sizeof h.name) || !kvx_valid_name(h.name) || !str_ok(h.host_id, sizeof h.host_id) ||
      !str_ok(h.tcp_host, sizeof h.tcp_host) || !str_ok(h.unix_path, sizeof h.unix_path) || h.tcp_port > 65535 ||
      (h.backends >> KVX_NBE) || h.n_sections > KVX_NBE) {
    utl_seterr(err, errlen, "metadata: malformed header");
    return NULL;
  }
  size_t rest = len - sizeof h;
  if (h.n_regions > rest / sizeof(md_region)) {
    utl_seterr(err, errlen, "metadata: length %zu does not match %u regions", len, h.n_regions);
    return NULL;
  }
  kvx_peer *p = calloc(1, sizeof *p);
  if (!p || !(p->regions = calloc(h.n_regions ? h.n_regions : 1, sizeof *p->regions))) {
    kvx_peer_free(p);
    utl_seterr(err, errlen, "out of memory");
    return NULL;
  }
  memcpy(p->name, h.name, sizeof p->name);
  memcpy(p->host_id, h.host_id, sizeof p->host_id);
  memcpy(p->tcp_host, h.tcp_host, sizeof p->tcp_host);
  memcpy(p->unix_path, h.unix_path, sizeof p->unix_path);
  p->tcp_port = (int)h.tcp_port;
  p->backends = h.backends;
  p->n_regions = h.n_regions;
  const uint8_t *q = b + sizeof h;
  for (uint32_t i = 0; i < h.n_regions; i++, q += sizeof(md_region)) {
    md_region m;
    memcpy(&m, q, sizeof m);
    if (m.len == 0 || m.addr + m.len < m.addr || m.mem > KVX_MEM_CUDA) {
      kvx_peer_free(p);
      utl_seterr(err, errlen, "metadata: region %u is malformed", i);
      return NULL;
    }
    p->regions[i] = (kvx_rregion){.key = m.key, .addr = m.addr, .len = m.len, .mem = m.mem};
  }
  // Sections: each read by its backend when it runs here; a peer's section for a backend we lack is skipped.
  uint32_t seen = 0;
  for (uint32_t k = 0; k < h.n_sections; k++) {
    md_sec s;
    size_t left = len - (size_t)(q - b);
    if (left < sizeof s) break;
    memcpy(&s, q, sizeof s);
    size_t padded = ((size_t)s.len + 7) / 8 * 8;
    if (s.be >= KVX_NBE || !(h.backends & (1u << s.be)) || (seen & (1u << s.be)) || padded > left - sizeof s) {
      kvx_peer_free(p);
      utl_seterr(err, errlen, "metadata: section %u is malformed", k);
      return NULL;
    }
    seen |= 1u << s.be;
    const kvx_backend *be = a->table[s.be];
    if ((a->enabled & (1u << s.be)) && be->load_md && be->load_md(a, p, q + sizeof s, s.len, err, errlen)) {
      kvx_peer_free(p);
      return NULL;
    }
    q += sizeof s + padded;
  }
  if ((size_t)(q - b) != len) {
    kvx_peer_free(p);
    utl_seterr(err, errlen, "metadata: length %zu does not match %u regions and %u sections", len, h.n_regions,
               h.n_sections);
    return NULL;
  }
  return p;
}

int kvx_load_remote_md(kvx_agent *a, const void *blob, size_t len, char *peer_name_out, size_t cap, char *err,
                       size_t errlen) {
  kvx_peer *p = md_parse(a, blob, len, err, errlen);
  if (!p) return -1;
  if (!strcmp(p->name, a->name)) {
    utl_seterr(err, errlen, "metadata: that is this agent's own blob ('%s')", a->name);
    kvx_peer_free(p);
    return -1;
  }
  char name[KVX_MAX_NAME];
  memcpy(name, p->name, sizeof name);
  pthread_mutex_lock(&a->mu);
  int be = kvx_choose_backend(a, p, err, errlen);
  if (be < 0) {
    pthread_mutex_unlock(&a->mu);
    kvx_peer_free(p);
    return -1;
  }
  p->be = be;
  kvx_peer *old = kvx_peer_find(a, p->name);
  if (old) {
    // Same endpoints and backend: keep the connections, take the new region list.
    if (old->be == p->be && !strcmp(old->tcp_host, p->tcp_host) && old->tcp_port == p->tcp_port &&
        !strcmp(old->unix_path, p->unix_path)) {
      kvx_rregion *t = old->regions;
      old->regions = p->regions;
      old->n_regions = p->n_regions;
      p->regions = t;
      memcpy(old->host_id, p->host_id, sizeof old->host_id);
      old->backends = p->backends;
      kvx_peer_free(p);
      p = NULL;
    } else {
      for (kvx_peer **pp = &a->peers; *pp; pp = &(*pp)->next)
        if (*pp == old) {
          *pp = old->next;
          break;
        }
      kvx_conn_drop(a, old, "peer metadata replaced");
      kvx_peer_free(old);
    }
  }
  if (p) {
    p->next = a->peers;
    a->peers = p;
  }
  pthread_mutex_unlock(&a->mu);
  if (peer_name_out && cap) snprintf(peer_name_out, cap, "%s", name);
  return 0;
}
