// kv/events.c: a worker's side of KV-aware routing: the routers it tells, and the kv_events messages it sends them.
#include "kv/events.h"
#include "proto/events.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVEV_CHUNK 512

void kv_events_on_event(kv_events *k, const ctl_event *ev, kv_prefix *p) {
  if (!ev->peer || strcmp(ctl_peer_role(ev->peer), "router")) return;
  if (!ev->msg) { // closed
    for (int i = 0; i < k->n; i++)
      if (k->routers[i] == ev->peer) {
        ctl_peer_unref(k->routers[i]);
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
    ctl_peer **np = realloc(k->routers, (size_t)cap * sizeof *np);
    if (!np) return;
    k->routers = np;
    k->cap = cap;
  }
  kv_events_flush(k, p); // what the other routers have not heard yet; the snapshot covers it for this one
  ctl_peer_ref(ev->peer);
  k->routers[k->n++] = ev->peer;
  if (p) kv_events_snapshot(ev->peer, p);
}

// kv_events for ev (n); NULL on out of memory.
static cJSON *kvev_msg(const kv_event *ev, int n) {
  prt_kv_event *pe = n ? malloc((size_t)n * sizeof *pe) : NULL;
  if (n && !pe) return NULL;
  for (int i = 0; i < n; i++) pe[i] = (prt_kv_event){.key = ev[i].key, .kind = ev[i].kind};
  cJSON *m = prt_kv_events_encode(&(prt_kv_events){.ev = pe, .n = n}, NULL, 0);
  free(pe);
  return m;
}

int kv_events_flush(kv_events *k, kv_prefix *p) {
  if (!p) return 0;
  kv_event ev[KVEV_CHUNK];
  int total = 0, n;
  while ((n = kv_prefix_drain_events(p, ev, KVEV_CHUNK)) > 0) {
    total += n;
    if (!k->n) continue;
    cJSON *m = kvev_msg(ev, n);
    for (int i = 0; m && i < k->n; i++) ctl_peer_send(k->routers[i], m);
    cJSON_Delete(m);
  }
  return total;
}

int kv_events_snapshot(ctl_peer *to, const kv_prefix *p) {
  int total = kv_prefix_keys(p, NULL, 0);
  uint64_t *keys = malloc(((size_t)total + 1) * sizeof *keys);
  if (!keys) return -1;
  kv_prefix_keys(p, keys, total);
  kv_event ev[KVEV_CHUNK];
  int n = 0, rc = total;
  ev[n++] = (kv_event){0, KV_EVENT_CLEARED};
  for (int i = 0; i <= total; i++) {
    if (n == KVEV_CHUNK || (i == total && n > 0)) {
      cJSON *m = kvev_msg(ev, n);
      if (!m) {
        rc = -1;
        break;
      }
      ctl_peer_send(to, m);
      cJSON_Delete(m);
      n = 0;
    }
    if (i < total) ev[n++] = (kv_event){keys[i], KV_EVENT_ADDED};
  }
  free(keys);
  return rc;
}

void kv_events_fini(kv_events *k) {
  for (int i = 0; i < k->n; i++) ctl_peer_unref(k->routers[i]);
  free(k->routers);
  k->routers = NULL;
  k->n = k->cap = 0;
}
