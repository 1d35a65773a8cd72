// worker/shell.h: the bring-up, teardown and control-message dispatch every worker process shares.
//
// Signals, runtime, kvxfer agent and staging, hub, router kv_events: opened in one order and closed in the
// reverse, the same for every role. A role (prefill/worker.c, decode/worker.c) embeds one wrk_shell in its
// worker struct, opens it first and closes it last, and keeps only its own callbacks and protocol: the
// hello_ok fields it adds, a table of the control ops it serves, and what a closed connection means to it.
#ifndef DSERVE_WRK_SHELL_H
#define DSERVE_WRK_SHELL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "config/config.h"
#include "ctl/hub.h"
#include "disco/disco.h"
#include "kv/events.h"
#include "kv/prefix.h"
#include "kv/stage.h"
#include "kvxfer/kvx.h"
#include "proto/stats.h"
#include "util/err.h"
#include "util/trace.h"
#include "worker/genreq.h"
#include "worker/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

// One control op a role serves. fn NULL: the op is expected and needs nothing from the role (it is neither
// handled nor logged as ignored; e.g. a prefill worker's "hello", which only kv_events cares about).
typedef struct wrk_op {
  const char *op;
  void (*fn)(void *worker, ctl_peer *from, const cJSON *msg);
} wrk_op;

// worker/peers.c: the cluster's other workers as etcd has them (a watcher's table; those of another model left out).
typedef struct wrk_peers wrk_peers;
int wrk_peers_open(const cfg_discovery *d, const dsc_fingerprint *fp, const char *name, wrk_peers **out, char *err,
                   size_t errlen) UTL_WARN_UNUSED;
void wrk_peers_close(wrk_peers *p);                               // NULL is a no-op
int wrk_peers_find(wrk_peers *p, const char *name, cfg_worker *out); // 1 and *out when name is a member now

typedef struct wrk_shell_opts {
  const char *role;  // the hub's role in hello messages ("prefill", "decode", "both")
  int shareable_kv;  // the KV pool goes where a same-host peer may map it (wrk_runtime_open)
  int kvxfer;        // open a kvxfer agent and register the pool (or its staging mirror) with it
  int watch_peers;   // with a "discovery" section: keep the cluster's members (wrk_shell_peer finds them by name)
  // Fields the role adds to every hello_ok after the shared ones (n_ctx, n_vocab, total_blocks, kv_layout).
  // Called from the hub's connection threads, possibly before wrk_shell_open returns; may be NULL.
  void (*hello_extra)(void *worker, cJSON *hello_ok);
  const wrk_op *ops; // (borrowed) (n_ops) the control ops the role serves; every other op is logged and ignored
  size_t n_ops;
  void (*on_close)(void *worker, ctl_peer *peer); // a peer's connection closed; may be NULL
  void *worker;      // (borrowed) the role's worker, first argument of every callback above
} wrk_shell_opts;

// What every worker process holds. Zeroed by wrk_shell_open. The signal thread keeps a pointer to sig, so
// a shell must not move once open (it lives in the role's worker struct for the whole run).
typedef struct wrk_shell {
  const cfg_cluster *cfg;     // (borrowed)
  const cfg_worker *wc;  // (borrowed) this worker's section
  wrk_shell_opts o;          // a copy; its pointers stay borrowed
  wrk_runtime *rt;           // (owned)
  kvx_agent *kvx;            // (owned) NULL without kvxfer (a both worker)
  kvx_region *kv_region;     // (owned by kvx) the pool, or its mirror, as peers reach it
  kv_stage *stage;        // (owned) host mirror of the pool when it is out of kvxfer's reach; or NULL
  ctl_hub *hub;              // (owned)
  kv_events kvev;         // connected routers, told of the prefix store's changes (kv_events)
  wrk_signals sig;           // sig.stop is set once SIGTERM/SIGINT arrives
  utl_tracer *tracer;        // (owned) the span exporter (worker/trace.h); NULL when the config has no "tracing"
  dsc_registrar *reg;        // (owned) its record in etcd (config "discovery"); NULL without
  wrk_peers *peers;          // (owned) the members etcd knows (o.watch_peers with discovery); NULL without
} wrk_shell;

// Brings worker wc of cfg up, in this order: blocks SIGTERM/SIGINT (before any thread starts), opens the
// runtime, then the kvxfer agent and staging (o->kvxfer), the hub (listening on wc's host:port), the
// signal thread, and with a "discovery" section its registration in etcd (disco/disco.h: from then on routers
// find it; an etcd that does not answer yet is no error, the registrar keeps trying). 0, or -1 with err and everything opened so far closed again.
int wrk_shell_open(wrk_shell *sh, const cfg_cluster *cfg, const cfg_worker *wc, const wrk_shell_opts *o,
                   char *err, size_t errlen) UTL_WARN_UNUSED;
// Tears down in reverse order: the etcd registration (its lease revoked: the role has drained by now, so this is
// the last thing a router hears before the link closes), kv_events' router references, hub (every connection and peer with it),
// kvxfer agent, staging mirror (after the agent: its threads may still write into it), runtime. A zeroed
// shell: no-op.
void wrk_shell_close(wrk_shell *sh);

// The settings of worker name, another worker of this cluster: from the config file, else (discovery with
// o.watch_peers) from its record in etcd. 1 with *out, or 0 when neither knows it.
int wrk_shell_peer(const wrk_shell *sh, const char *name, cfg_worker *out);

// "... INFO  NAME: ROLE worker listening on HOST:PORT (...)" (util/log.h): the line a person reads for where it is.
void wrk_shell_announce(const wrk_shell *sh);

// Drains the hub's events: the first waits up to wait_ms (0 = poll), then only what has already arrived.
// Each event goes to kv_events_on_event (with prefix, the role's store; may be NULL) first, then to
// o.on_close (a closed connection) or to the table's handler for its op. Returns the events handled.
int wrk_shell_drain(wrk_shell *sh, int wait_ms, kv_prefix *prefix);

// A stats_ok reply holding st (the role's counts: running, waiting and its own counters; prt_stats_ok_init leaves
// the others out) and what every worker reports (free_blocks, total_blocks, auth_failures: refused control + kvxfer
// connections since start, filled in st); the role fills its prefix counts first (wrk_engine_prefix_stats).
// Owned by the caller; NULL on out of memory.
cJSON *wrk_shell_stats_new(const wrk_shell *sh, prt_stats_ok *st);


#ifdef __cplusplus
}
#endif
#endif
