// kvstore/kvs_topo.c: the nodes of a store and, for Redis Cluster, which node serves each slot: CRC16 key slots with
// {hash tags}, CLUSTER SLOTS answers, MOVED/ASK redirections.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvstore/kvs_int.h"

// CRC16-CCITT, the XMODEM variant (polynomial 0x1021, initial 0, no reflection), which Redis Cluster hashes keys with;
// bitwise, since a key is 68 bytes and a table would be 512 bytes of constants for nothing measurable.
uint16_t kvs_crc16(const void *p, size_t n) {
  const uint8_t *b = p;
  uint16_t crc = 0;
  for (size_t i = 0; i < n; i++) {
    crc ^= (uint16_t)(b[i] << 8);
    for (int k = 0; k < 8; k++) crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

int kvs_key_slot(const char *key, size_t n) {
  // As Redis does: when the key has a '{' followed later by a '}' with at least one byte between, only those bytes
  // are hashed (the first '{' and the first '}' after it).
  const char *open = memchr(key, '{', n);
  if (open) {
    size_t o = (size_t)(open - key);
    const char *close = memchr(open + 1, '}', n - o - 1);
    if (close && close > open + 1) return kvs_crc16(open + 1, (size_t)(close - open - 1)) & (KVS_SLOTS - 1);
  }
  return kvs_crc16(key, n) & (KVS_SLOTS - 1);
}

int kvs_split_endpoint(const char *ep, char *host, size_t hostlen, int *port) {
  const char *colon = strrchr(ep, ':');
  if (!colon || colon == ep || (size_t)(colon - ep) >= hostlen) return -1;
  char *end = NULL;
  long p = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || p < 1 || p > 65535) return -1;
  memcpy(host, ep, (size_t)(colon - ep));
  host[colon - ep] = '\0';
  *port = (int)p;
  return 0;
}

int kvs_topo_node(kvs_topo *t, const char *host, int port) {
  for (int i = 0; i < t->n_nodes; i++)
    if (t->nodes[i]->port == port && !strcmp(t->nodes[i]->host, host)) return i;
  if (t->n_nodes >= KVS_MAX_NODES || strlen(host) >= sizeof t->nodes[0]->host) return -1;
  kvs_node *n = calloc(1, sizeof *n);
  if (!n) return -1;
  snprintf(n->host, sizeof n->host, "%s", host);
  n->port = port;
  n->backoff_ms = 0;
  t->nodes[t->n_nodes] = n;
  return t->n_nodes++;
}

void kvs_topo_free(kvs_topo *t) {
  for (int i = 0; i < t->n_nodes; i++) {
    kvs_conn_close(t->nodes[i]->rc);
    kvs_conn_close(t->nodes[i]->wc);
    kvs_conn_close(t->nodes[i]->spare);
    free(t->nodes[i]);
  }
  t->n_nodes = 0;
}

int kvs_topo_load(kvs_topo *t, const redisReply *r, const char *host, char *err, size_t errlen) {
  if (r->type != REDIS_REPLY_ARRAY) {
    utl_seterr(err, errlen, "CLUSTER SLOTS: %s", r->type == REDIS_REPLY_ERROR ? r->str : "not an array");
    return -1;
  }
  int16_t slot[KVS_SLOTS];
  for (int i = 0; i < KVS_SLOTS; i++) slot[i] = -1;
  for (size_t i = 0; i < r->elements; i++) {
    // [start, end, [ip, port, id, ...] of the master, then its replicas]
    const redisReply *e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
        e->element[2]->elements < 2 || e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
        e->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      utl_seterr(err, errlen, "CLUSTER SLOTS: entry %zu is malformed", i);
      return -1;
    }
    long long a = e->element[0]->integer, b = e->element[1]->integer;
    const redisReply *m = e->element[2];
    const char *ip = m->element[0]->len ? m->element[0]->str : host; // empty: the node we asked
    long long port = m->element[1]->integer;
    if (a < 0 || b >= KVS_SLOTS || a > b || port < 1 || port > 65535) {
      utl_seterr(err, errlen, "CLUSTER SLOTS: entry %zu has slots %lld-%lld port %lld", i, a, b, port);
      return -1;
    }
    int node = kvs_topo_node(t, ip, (int)port);
    if (node < 0) {
      utl_seterr(err, errlen, "CLUSTER SLOTS: more than %d nodes (or a name too long)", KVS_MAX_NODES);
      return -1;
    }
    for (long long s = a; s <= b; s++) slot[s] = (int16_t)node;
  }
  memcpy(t->slot, slot, sizeof slot);
  t->have_map = 1;
  return 0;
}

int kvs_redirect(const redisReply *r, char *host, size_t hostlen, int *port) {
  if (r->type != REDIS_REPLY_ERROR || !r->str) return 0;
  int kind = !strncmp(r->str, "MOVED ", 6) ? 1 : !strncmp(r->str, "ASK ", 4) ? 2 : 0;
  if (!kind) return 0;
  const char *sp = strchr(r->str + (kind == 1 ? 6 : 4), ' '); // after the slot
  if (!sp || kvs_split_endpoint(sp + 1, host, hostlen, port) < 0) return 0;
  return kind;
}
