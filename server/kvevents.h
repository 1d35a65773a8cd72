// server/kvevents.h: a worker's side of KV-aware routing: the routers it tells, and the kv_events messages it sends them.
#ifndef DSERVE_SRV_KVEVENTS_H
#define DSERVE_SRV_KVEVENTS_H

#include "server/hub.h"
#include "server/prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

// The connected peers with role "router". Single-threaded (the worker's loop). Zero-initialise.
typedef struct srv_kvevents {
  srv_peer **routers; // (owned references) (n)
  int n, cap;
} srv_kvevents;

// Feeds a hub event: a "hello" from a router adds it, a closed connection of one removes it; others are
// ignored. Out of memory: the router is not added (it only misses events; routing stays correct).
void srv_kvevents_on_event(srv_kvevents *k, const srv_event *ev);

// Drains every pending event of p (NULL: nothing) and sends them to every router as
// {"op":"kv_events","events":[[kind, "key as decimal string"], ...]} (at most 512 events a message).
// Events are drained even with no router connected (a router that connects later starts from nothing).
// Returns the number of events drained.
int srv_kvevents_flush(srv_kvevents *k, srv_prefix *p);

void srv_kvevents_fini(srv_kvevents *k); // drops the references; no-op on a zeroed struct

#ifdef __cplusplus
}
#endif
#endif
