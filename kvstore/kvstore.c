// kvstore/kvstore.c: the store's life: kvs_open (config checks, a first probe), the write-behind thread (batches and
// probes), kvs_write's bounded queue, kvs_flush, kvs_stats_get, kvs_close.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvstore/kvs_int.h"
#include "util/clock.h"
#include "util/crypto.h"
#include "util/log.h"

#define OPEN_PROBE_MS 500 // kvs_open's one synchronous look at the store, so that a store down at start is logged

static size_t item_bytes(const kvs *s) { return s->c.block_bytes + 4 * (size_t)s->c.block_tokens; }

static void *writer(void *arg) {
  kvs *s = arg;
  pthread_mutex_lock(&s->mu);
  while (!s->stop) {
    // the next probe due, if a node is down (or the cluster map is missing)
    int64_t now = utl_now_ms(), next = -1;
    for (int i = 0; i < s->topo.n_nodes; i++)
      if (s->topo.nodes[i]->down && (next < 0 || s->topo.nodes[i]->next_probe_ms < next))
        next = s->topo.nodes[i]->next_probe_ms;
    int64_t refresh = s->refresh_ms + KVS_BACKOFF_MIN_MS;
    if (s->c.cluster && (s->need_refresh || !s->topo.have_map) && (next < 0 || next > refresh)) next = refresh;
    if (next >= 0 && next <= now) {
      pthread_mutex_unlock(&s->mu);
      kvs_probe_due(s, s->write_timeout_ms);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    if (!s->head) {
      if (next < 0) {
        pthread_cond_wait(&s->cv, &s->mu);
      } else {
        struct timespec ts = utl_deadline_ms(next - now);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
      }
      continue;
    }
    kvs_item *items[KVS_BATCH];
    int n = 0;
    while (s->head && n < KVS_BATCH) {
      items[n++] = s->head;
      s->head = s->head->next;
    }
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    kvs_write_batch(s, items, n);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  utl_crypto_thread_done();
  return NULL;
}

static int check_config(const kvs_config *c, char *err, size_t errlen) {
  if (!c->endpoints || c->n_endpoints < 1) {
    utl_seterr(err, errlen, "kvstore: endpoints: none given");
    return -1;
  }
  if (!c->cluster && c->n_endpoints != 1) {
    utl_seterr(err, errlen, "kvstore: endpoints: %d given for a single server (set cluster for seed nodes)",
               c->n_endpoints);
    return -1;
  }
  if (c->n_endpoints > KVS_MAX_NODES) {
    utl_seterr(err, errlen, "kvstore: endpoints: %d given, at most %d", c->n_endpoints, KVS_MAX_NODES);
    return -1;
  }
  for (int i = 0; i < c->n_endpoints; i++) {
    char host[256];
    int port;
    if (!c->endpoints[i] || kvs_split_endpoint(c->endpoints[i], host, sizeof host, &port) < 0) {
      utl_seterr(err, errlen, "kvstore: endpoints[%d]: '%s' is not host:port (port 1-65535)", i,
                 c->endpoints[i] ? c->endpoints[i] : "(null)");
      return -1;
    }
  }
  if (c->password && !c->password[0]) {
    utl_seterr(err, errlen, "kvstore: password: empty (NULL for no AUTH)");
    return -1;
  }
  if (c->read_timeout_ms < 0 || c->read_timeout_ms > 60000) {
    utl_seterr(err, errlen, "kvstore: read_timeout_ms: %d is not in 0..60000", c->read_timeout_ms);
    return -1;
  }
  if (c->ttl_s < 0) {
    utl_seterr(err, errlen, "kvstore: ttl_s: %d is negative", c->ttl_s);
    return -1;
  }
  if (c->block_tokens < 1 || c->block_tokens > 65536) {
    utl_seterr(err, errlen, "kvstore: block_tokens: %d is not in 1..65536", c->block_tokens);
    return -1;
  }
  if (c->block_bytes < 1 || c->block_bytes > ((size_t)512 << 20) - kvs_value_len(c->block_tokens, 0)) {
    utl_seterr(err, errlen, "kvstore: block_bytes: %zu is not in 1..512 MiB (a Redis value's limit)", c->block_bytes);
    return -1;
  }
  size_t one = c->block_bytes + 4 * (size_t)c->block_tokens;
  if (c->write_queue_bytes && c->write_queue_bytes < one) {
    utl_seterr(err, errlen, "kvstore: write_queue_bytes: %zu holds not one block (%zu bytes)", c->write_queue_bytes,
               one);
    return -1;
  }
  return 0;
}

int kvs_open(const kvs_config *c, kvs **out, char *err, size_t errlen) {
  *out = NULL;
  if (!c) {
    utl_seterr(err, errlen, "kvstore: no config");
    return -1;
  }
  if (check_config(c, err, errlen) < 0) return -1;
  kvs *s = calloc(1, sizeof *s);
  if (!s) {
    utl_seterr(err, errlen, "kvstore: out of memory");
    return -1;
  }
  s->c = *c;
  s->c.tls_ca = s->c.tls_cert = s->c.tls_key = NULL; // loaded into s->tls below; the paths are not kept
  if ((c->tls_ca || c->tls_cert || c->tls_key) && !(s->tls = kvs_tls_ctx_new(c->tls_ca, c->tls_cert, c->tls_key,
                                                                             err, errlen))) {
    free(s);
    return -1;
  }
  if (!s->c.read_timeout_ms) s->c.read_timeout_ms = KVS_DEFAULT_READ_TIMEOUT_MS;
  if (!s->c.write_queue_bytes) s->c.write_queue_bytes = KVS_DEFAULT_WRITE_QUEUE_BYTES;
  // A write batch moves far more bytes than a read run waits for, and nobody waits on it: a longer budget.
  s->write_timeout_ms = s->c.read_timeout_ms * 20 > 1000 ? s->c.read_timeout_ms * 20 : 1000;
  // A GET's reply is a value; CLUSTER SLOTS of a big cluster is the other large one (4 MiB holds thousands of ranges).
  size_t v = kvs_value_len(c->block_tokens, c->block_bytes) + 64;
  s->max_reply = v > ((size_t)4 << 20) ? v : (size_t)4 << 20;
  s->password = c->password ? strdup(c->password) : NULL;
  s->endpoints = calloc((size_t)c->n_endpoints, sizeof *s->endpoints);
  int ok = s->endpoints && (!c->password || s->password);
  for (int i = 0; ok && i < c->n_endpoints; i++) ok = (s->endpoints[i] = strdup(c->endpoints[i])) != NULL;
  s->c.endpoints = (const char *const *)s->endpoints;
  s->c.password = s->password;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->read_mu, NULL);
  utl_cond_init_monotonic(&s->cv);
  utl_cond_init_monotonic(&s->done_cv);
  for (int i = 0; i < KVS_SLOTS; i++) s->topo.slot[i] = -1;
  for (int i = 0; ok && i < c->n_endpoints; i++) {
    char host[256];
    int port = 0;
    utl_ignore_status(kvs_split_endpoint(c->endpoints[i], host, sizeof host, &port)); // checked above
    int nd = kvs_topo_node(&s->topo, host, port);
    if (nd < 0) {
      ok = 0;
      break;
    }
    s->topo.nodes[nd]->down = 1; // until the probe below reaches it
  }
  if (!ok) {
    utl_seterr(err, errlen, "kvstore: out of memory");
    kvs_close(s);
    return -1;
  }
  // One look now, so that a store that is down (or refuses the password) is logged as the server starts; the
  // write-behind thread keeps probing after.
  kvs_probe_due(s, OPEN_PROBE_MS);
  if (pthread_create(&s->thr, NULL, writer, s) != 0) {
    utl_seterr(err, errlen, "kvstore: cannot start the write-behind thread");
    kvs_close(s);
    return -1;
  }
  s->thr_started = 1;
  *out = s;
  return 0;
}

void kvs_close(kvs *s) {
  if (!s) return;
  if (s->thr_started) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thr, NULL);
  }
  while (s->head) {
    kvs_item *it = s->head;
    s->head = it->next;
    free(it);
  }
  kvs_topo_free(&s->topo);
  kvs_tls_ctx_free(s->tls);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->read_mu);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->done_cv);
  if (s->endpoints)
    for (int i = 0; i < s->c.n_endpoints; i++) free(s->endpoints[i]);
  free(s->endpoints);
  if (s->password) utl_wipe(s->password, strlen(s->password));
  free(s->password);
  utl_wipe(s->c.mac_key, sizeof s->c.mac_key);
  free(s);
}

int kvs_write(kvs *s, const kvs_block *b, const void *payload) {
  if (!s || !b || !payload) return -1;
  char name[KVS_KEY_LEN + 1];
  kvs_key_name(s->c.space, b->key, name);
  uint64_t h = kvs_name_hash(name);
  size_t bytes = item_bytes(s);
  pthread_mutex_lock(&s->mu);
  if (kvs_recent_has(s, h, utl_now_ms())) {
    s->st.write_skipped++;
    pthread_mutex_unlock(&s->mu);
    return 0;
  }
  int nd = kvs_route(s, name);
  if (nd < 0 || s->topo.nodes[nd]->down || s->q_bytes + bytes > s->c.write_queue_bytes) {
    s->st.queue_drops++;
    pthread_mutex_unlock(&s->mu);
    return -1;
  }
  s->q_bytes += bytes; // held before the copy, so that two writers cannot both pass the bound
  pthread_mutex_unlock(&s->mu);
  kvs_item *it = malloc(sizeof *it + bytes);
  if (it) {
    *it = (kvs_item){.b = *b, .bytes = bytes};
    int32_t *toks = (int32_t *)(it + 1);
    memcpy(toks, b->toks, 4 * (size_t)s->c.block_tokens);
    it->b.toks = toks;
    it->payload = (uint8_t *)(toks + s->c.block_tokens);
    memcpy(it->payload, payload, s->c.block_bytes);
    memcpy(it->name, name, sizeof name);
  }
  pthread_mutex_lock(&s->mu);
  if (!it) {
    s->q_bytes -= bytes;
    s->st.queue_drops++;
  } else {
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    s->enq++;
    pthread_cond_signal(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return it ? 1 : -1;
}

int kvs_flush(kvs *s, int timeout_ms) {
  if (!s) return 0;
  struct timespec ts = utl_deadline_ms(timeout_ms);
  pthread_mutex_lock(&s->mu);
  uint64_t want = s->enq;
  int rc = 0;
  while (s->done < want && rc == 0) rc = pthread_cond_timedwait(&s->done_cv, &s->mu, &ts);
  int ok = s->done >= want;
  pthread_mutex_unlock(&s->mu);
  return ok ? 0 : -1;
}

void kvs_stats_get(kvs *s, kvs_stats *out) {
  if (!s) {
    memset(out, 0, sizeof *out);
    return;
  }
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  pthread_mutex_unlock(&s->mu);
}
