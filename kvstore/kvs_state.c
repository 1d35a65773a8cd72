// kvstore/kvs_state.c: the store's shared state: routing a key to its node, the recent-keys set, marking a node down
// (logged once, backed off) and the probes that bring it back, the cluster map.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvstore/kvs_int.h"
#include "util/clock.h"
#include "util/log.h"

uint64_t kvs_name_hash(const char *name) { // the first 16 hex digits of the key's digest, as a number
  uint64_t h = 0;
  for (int i = 4; i < 20; i++) h = h << 4 | (uint64_t)(name[i] <= '9' ? name[i] - '0' : name[i] - 'a' + 10);
  return h | 1; // never 0, which marks an empty entry
}

// Under mu. Known present: written or seen by us lately (with a TTL, within half of it: it may have expired since).
int kvs_recent_has(kvs *s, uint64_t h, int64_t now) {
  const kvs_recent *r = &s->recent[h % KVS_RECENT];
  return r->h == h && !r->bad && (s->c.ttl_s <= 0 || now - r->t_ms < (int64_t)s->c.ttl_s * 500);
}
void kvs_recent_add(kvs *s, uint64_t h, int64_t now) { s->recent[h % KVS_RECENT] = (kvs_recent){h, now, 0}; }
void kvs_recent_bad(kvs *s, uint64_t h) { s->recent[h % KVS_RECENT] = (kvs_recent){h, 0, 1}; }
int kvs_recent_is_bad(kvs *s, uint64_t h) { return s->recent[h % KVS_RECENT].h == h && s->recent[h % KVS_RECENT].bad; }

// Under mu: the node that serves key, -1 when none is known.
int kvs_route(kvs *s, const char *name) {
  if (!s->c.cluster) return 0;
  return s->topo.have_map ? s->topo.slot[kvs_key_slot(name, KVS_KEY_LEN)] : -1;
}

// Under mu: node i failed (why); reads and writes skip it until a probe reaches it again. Logged once per outage.
void kvs_mark_down(kvs *s, int i, const char *why) {
  kvs_node *n = s->topo.nodes[i];
  int64_t now = utl_now_ms();
  // a node down since open has no back-off yet: it starts at the least
  int b = n->down && n->backoff_ms ? n->backoff_ms * 2 : KVS_BACKOFF_MIN_MS;
  n->backoff_ms = b > KVS_BACKOFF_MAX_MS ? KVS_BACKOFF_MAX_MS : b;
  n->down = 1;
  n->epoch++;
  n->next_probe_ms = now + n->backoff_ms;
  s->st.up = 0;
  if (!n->logged) {
    utl_warn(KVS_LOGC, "store %s:%d unavailable (%s): its blocks are misses until a background probe reaches it",
             n->host, n->port, why);
    n->logged = 1;
  }
  pthread_cond_signal(&s->cv); // the thread recomputes when to probe
}

// Under mu: a connection attempt to node i failed with rc and err.
void kvs_conn_failed(kvs *s, int i, kvs_conn_rc rc, const char *err) {
  kvs_node *n = s->topo.nodes[i];
  if (rc == KVS_C_AUTH) {
    s->st.auth_failures++;
    if (!n->auth_logged) {
      utl_err(KVS_LOGC, "store %s:%d refused the password (%s); check password_file", n->host, n->port, err);
      n->auth_logged = n->logged = 1; // the warning of mark_down would say it twice
    }
  } else {
    s->st.errors++;
  }
  kvs_mark_down(s, i, err);
}

// ---- probes and the cluster map (the write-behind thread, and kvs_open once)

// Reaches node i with a fresh connection (AUTH, PING) and keeps it as its write connection: 0, or -1 (marked down).
int kvs_probe_node(kvs *s, int i, int64_t deadline) {
  kvs_node *n = s->topo.nodes[i]; // host and port never change; fields under mu are read under it
  char err[256] = "";
  kvs_conn *c = NULL;
  kvs_conn_rc rc = kvs_conn_open(n->host, n->port, s->tls, s->password, s->max_reply, deadline, &c, err, sizeof err);
  if (rc == KVS_C_OK) {
    redisReply *r = NULL;
    const char *argv[1] = {"PING"};
    size_t lens[1] = {4};
    rc = kvs_conn_call(c, 1, argv, lens, deadline, &r);
    if (rc == KVS_C_OK && r->type == REDIS_REPLY_ERROR) { // NOAUTH: the store wants a password we do not have
      snprintf(err, sizeof err, "PING: %s", r->str);
      rc = !strncmp(r->str, "NOAUTH", 6) ? KVS_C_AUTH : KVS_C_IO;
    } else if (rc != KVS_C_OK) {
      snprintf(err, sizeof err, "PING: %s", rc == KVS_C_TIMEOUT ? "timed out" : "I/O error");
    }
    if (r) freeReplyObject(r);
  }
  // A second connection for the readers, so that a read after an outage spends its budget on GETs rather than on a
  // connect, a TLS handshake and AUTH (which, over a slow link, could alone outlast it and mark the node down again).
  // Without one the readers connect themselves.
  kvs_conn *spare = NULL;
  char err2[256];
  if (rc == KVS_C_OK &&
      kvs_conn_open(n->host, n->port, s->tls, s->password, s->max_reply, deadline, &spare, err2, sizeof err2))
    spare = NULL;
  pthread_mutex_lock(&s->mu);
  if (rc != KVS_C_OK) {
    kvs_conn_failed(s, i, rc, err);
  } else {
    kvs_conn_close(n->spare); // an older one the readers never took
    n->spare = spare;
    n->spare_epoch = n->epoch;
    if (n->logged) utl_log(KVS_LOGC, "store %s:%d reachable again", n->host, n->port);
    // It may have restarted empty: what we knew present may be gone, so writes check again (EXISTS) from now.
    if (n->logged) memset(s->recent, 0, sizeof s->recent);
    if (s->c.cluster && n->down) s->need_refresh = 1; // a node's return may come with a failover: ask again
    n->down = n->logged = n->auth_logged = 0;
    n->backoff_ms = 0;
    s->st.up = 1;
  }
  pthread_mutex_unlock(&s->mu);
  if (rc != KVS_C_OK) {
    kvs_conn_close(c);
    return -1;
  }
  kvs_conn_close(n->wc);
  n->wc = c;
  return 0;
}

// Cluster: asks the first node that answers for CLUSTER SLOTS and loads the map.
static void refresh_map(kvs *s, int64_t deadline) {
  pthread_mutex_lock(&s->mu);
  s->refresh_ms = utl_now_ms();
  int nn = s->topo.n_nodes;
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < nn; i++) {
    kvs_node *n = s->topo.nodes[i];
    pthread_mutex_lock(&s->mu);
    int down = n->down;
    pthread_mutex_unlock(&s->mu);
    if (down || (!n->wc && kvs_probe_node(s, i, deadline) < 0)) continue;
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    size_t lens[2] = {7, 5};
    redisReply *r = NULL;
    kvs_conn_rc rc = kvs_conn_call(n->wc, 2, argv, lens, deadline, &r);
    char err[256] = "";
    pthread_mutex_lock(&s->mu);
    int ok = rc == KVS_C_OK && kvs_topo_load(&s->topo, r, n->host, err, sizeof err) == 0;
    if (ok) {
      s->need_refresh = 0;
      s->st.map_loads++;
    } else if (rc != KVS_C_OK) {
      s->st.errors++;
      kvs_mark_down(s, i, "CLUSTER SLOTS failed");
    } else {
      s->st.errors++;
      utl_warn(KVS_LOGC, "store %s:%d: %s", n->host, n->port, err);
    }
    pthread_mutex_unlock(&s->mu);
    if (r) freeReplyObject(r);
    if (rc != KVS_C_OK) {
      kvs_conn_close(n->wc);
      n->wc = NULL;
    }
    if (ok) return;
  }
}

// Probes every node whose back-off has passed, then (cluster) reloads the map when it is missing or stale.
void kvs_probe_due(kvs *s, int timeout_ms) {
  int64_t now = utl_now_ms(), deadline = now + timeout_ms;
  pthread_mutex_lock(&s->mu);
  int nn = s->topo.n_nodes;
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < nn; i++) {
    pthread_mutex_lock(&s->mu);
    int due = s->topo.nodes[i]->down && s->topo.nodes[i]->next_probe_ms <= now;
    pthread_mutex_unlock(&s->mu);
    if (due) utl_ignore_status(kvs_probe_node(s, i, deadline)); // a failure is marked and logged inside
  }
  pthread_mutex_lock(&s->mu);
  int refresh = s->c.cluster && (s->need_refresh || !s->topo.have_map);
  pthread_mutex_unlock(&s->mu);
  if (refresh) refresh_map(s, deadline);
}

