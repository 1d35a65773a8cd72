// prefill/serve.h: the serving side of a prefix fetch: a peer prefill worker asks (prefix_pull) for prompt
// blocks this worker's prefix store holds, and they are written into the peer's pool over kvxfer.
#ifndef DSERVE_PFL_SERVE_H
#define DSERVE_PFL_SERVE_H

#include <cjson/cJSON.h>

#include "ctl/hub.h"
#include "kv/pool.h"
#include "kv/prefix.h"
#include "kvxfer/kvx.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pfl_sink pfl_sink;       // a peer we write to: its pool layout and kvxfer name
typedef struct pfl_sending pfl_sending; // one pull being written

// One per prefill worker; every call comes from its event-loop thread.
typedef struct pfl_serve {
  kvx_agent *kvx;         // (borrowed)
  kv_pool *kv;         // (borrowed)
  kv_prefix *prefix;     // (borrowed) NULL: every pull misses
  const char *name;       // (borrowed) this worker's name, for log lines
  pfl_sink *sinks;        // (owned list) one per control connection that pulled
  pfl_sending *sending;   // (owned list) writes in flight; their pool blocks stay pinned until each finishes
  int n_sending;
  double served_blocks;   // blocks written to peers (running total, stats_ok prefix_served_blocks)
} pfl_serve;

void pfl_serve_init(pfl_serve *s, kvx_agent *kvx, kv_pool *kv, kv_prefix *prefix, const char *name);
// Frees everything; writes still in flight are abandoned (called when the worker stops).
void pfl_serve_fini(pfl_serve *s);
// A prefix_pull from a peer (docs/protocol.md, "Prefix fetch"): matches the store, pins the matched blocks
// and posts one WRITE of every layer into the peer's blocks, with the notification "pull:<id>". A miss, or a
// pull that cannot be served, is answered at once (prefix_pulled with n_blocks 0, or prefix_fail).
void pfl_serve_on_pull(pfl_serve *s, ctl_peer *from, const cJSON *msg);
// That control connection closed: forget its pool (writes in flight still finish, unanswered).
void pfl_serve_on_close(pfl_serve *s, ctl_peer *peer);
// Answers the pulls whose writes finished (prefix_pulled after success, prefix_fail after an error) and
// unpins their blocks.
void pfl_serve_poll(pfl_serve *s);

#ifdef __cplusplus
}
#endif
#endif
