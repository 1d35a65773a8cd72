// kv/events.h: a worker's side of KV-aware routing: the routers it tells, and the kv_events messages it sends them.
#ifndef DSERVE_KV_EVENTS_H
#define DSERVE_KV_EVENTS_H

#include "ctl/hub.h"
#include "kv/prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

// The connected peers with role "router". Single-threaded (the worker's loop). Zero-initialise.
typedef struct kv_events {
  ctl_peer **routers; // (owned references) (n)
  int n, cap;
} kv_events;

// Feeds a hub event: a "hello" from a router adds it, a closed connection of one removes it; others are
// ignored. A router that says hello is sent what p (the worker's store; NULL: nothing) holds now, so a
// router that connects late (or reconnects) starts with this worker's keys: the pending events go to the
// routers first (kv_events_flush), then the new one gets kv_events_snapshot. Out of memory: the router
// is not added, or gets no snapshot (it only misses keys; routing stays correct).
void kv_events_on_event(kv_events *k, const ctl_event *ev, kv_prefix *p);

// Drains every pending event of p (NULL: nothing) and sends them to every router as
// {"op":"kv_events","events":[[kind, "key as decimal string"], ...]} (at most 512 events a message).
// Events are drained even with no router connected (a router that connects later starts from nothing).
// Returns the number of events drained.
int kv_events_flush(kv_events *k, kv_prefix *p);

// Sends to one router every key p holds now: kv_events messages whose first event is [3] (cleared: forget
// this worker's keys) followed by [1, key] for each key (kv_prefix_keys order, at most 512 events a
// message). Returns the number of keys sent, -1 on out of memory (the messages sent so far stand).
int kv_events_snapshot(ctl_peer *to, const kv_prefix *p);

void kv_events_fini(kv_events *k); // drops the references; no-op on a zeroed struct

#ifdef __cplusplus
}
#endif
#endif
