// worker/kvevents.c: a worker's side of KV-aware routing: the routers it tells, and the kv_events messages it sends them.
#include "worker/kvevents.h"
#include "proto/events.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVEV_CHUNK 512

void wrk_kvevents_on_event(wrk_kvevents *k, const srv_event *ev, wrk_prefix *p) {
  if (!ev->peer || strcmp(srv_peer_role(ev->peer), "router")) return;
  if (!ev->msg) { // closed
    for (int i = 0; i < k->n; i++)
      if (k->routers[i] == ev->peer) {
        srv_peer_unref(k->routers[i]);
        k->routers[i] = k->routers[--k->n];
        return;
      }
    return;
  }
  if (!prt_is(ev->msg, PRT_OP_HELLO)) return;
  for (int i = 0; i < k->n; i++)
    if (k->routers[i] == ev->peer) return;
  if (k->n == k->cap) {
    int cap = k->cap ? k->cap * 2 : 4;
    srv_peer **np = realloc(k->routers, (size_t)cap * sizeof *np);
    if (!np) return;
    k->routers = np;
    k->cap = cap;
  }
  wrk_kvevents_flush(k, p); // what the other routers have not heard yet; the snapshot covers it for this one
  srv_peer_ref(ev->peer);
  k->routers[k->n++] = ev->peer;
  if (p) wrk_kvevents_snapshot(ev->peer, p);
}

// kv_events for ev (n); NULL on out of memory.
static cJSON *kvev_msg(const srv_kv_event *ev, int n) {
  prt_kv_event *pe = n ? malloc((size_t)n * sizeof *pe) : NULL;
  if (n && !pe) return NULL;
  for (int i = 0; i < n; i++) pe[i] = (prt_kv_event){.key = ev[i].key, .kind = ev[i].kind};
  cJSON *m = prt_kv_events_encode(&(prt_kv_events){.ev = pe, .n = n}, NULL, 0);
  free(pe);
  return m;
}

int wrk_kvevents_flush(wrk_kvevents *k, wrk_prefix *p) {
  if (!p) return 0;
  srv_kv_event ev[KVEV_CHUNK];
  int total = 0, n;
  while ((n = wrk_prefix_drain_events(p, ev, KVEV_CHUNK)) > 0) {
    total += n;
    if (!k->n) continue;
    cJSON *m = kvev_msg(ev, n);
    for (int i = 0; m && i < k->n; i++) srv_peer_send(k->routers[i], m);
    cJSON_Delete(m);
  }
  return total;
}

int wrk_kvevents_snapshot(srv_peer *to, const wrk_prefix *p) {
  int total = wrk_prefix_keys(p, NULL, 0);
  uint64_t *keys = malloc(((size_t)total + 1) * sizeof *keys);
  if (!keys) return -1;
  wrk_prefix_keys(p, keys, total);
  srv_kv_event ev[KVEV_CHUNK];
  int n = 0, rc = total;
  ev[n++] = (srv_kv_event){0, SRV_KV_CLEARED};
  for (int i = 0; i <= total; i++) {
    if (n == KVEV_CHUNK || (i == total && n > 0)) {
      cJSON *m = kvev_msg(ev, n);
      if (!m) {
        rc = -1;
        break;
      }
      srv_peer_send(to, m);
      cJSON_Delete(m);
      n = 0;
    }
    if (i < total) ev[n++] = (srv_kv_event){keys[i], SRV_KV_ADDED};
  }
  free(keys);
  return rc;
}

void wrk_kvevents_fini(wrk_kvevents *k) {
  for (int i = 0; i < k->n; i++) srv_peer_unref(k->routers[i]);
  free(k->routers);
  k->routers = NULL;
  k->n = k->cap = 0;
}
