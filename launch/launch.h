// launch/launch.h: the launcher: starts the roles a cluster config gives one node, supervises them, stops them.
#ifndef DSERVE_LCH_LAUNCH_H
#define DSERVE_LCH_LAUNCH_H

#include <stddef.h>

#include "config/config.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lch_opts {
  const char *config_path; // (borrowed) passed to every child as --config; names the config in messages
  const char *config_json; // (borrowed) NULL, or the effective config (overrides applied, config/config.h
                           // cfg_effective_json): written to the launcher's private folder, which the children read
  const char *node;        // (borrowed) this node's name
  const char *dserve;      // (borrowed) binary the children run; NULL = /proc/self/exe
  int grace_ms;            // after SIGTERM to the children, SIGKILL at this deadline (10000)
  int backoff_ms;          // first restart delay, doubled per restart in the window (250)
  int max_restarts;        // restarts of one child per window at most; one more exit = permanently failed (5)
  int restart_window_ms;   // (60000)
  int probe_ms;            // health probe period while a child is not yet up (200)
} lch_opts;

void lch_defaults(lch_opts *o);
// The stop grace a node running cfg's router needs: at least the router's whole drain (router.drain_timeout_s) plus
// 5 s, so SIGKILL never cuts a drain short; o->grace_ms raised to it when cfg has a router.
void lch_grace_for_drain(lch_opts *o, const cfg_cluster *cfg);

// Runs the supervisor until SIGTERM/SIGINT (returns 0 after stopping every child) or until every child has
// failed permanently (returns 1). Blocks SIGTERM, SIGINT and SIGCHLD in the calling thread. Setup errors
// (node not in the file, nothing to run, binary not found) return 2 with err filled.
int lch_run(const cfg_cluster *cfg, const lch_opts *o, char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
