// router/sched.h: the scheduling policy: which worker(s) a request choice goes to (KV-aware routing comes later).
#ifndef DSERVE_RTR_SCHED_H
#define DSERVE_RTR_SCHED_H

#include "server/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// What the router knows of one worker when it picks.
typedef struct rtr_sched_worker {
  int up;          // link connected and hello_ok received
  srv_role role;
  int running;     // from its last stats
  int waiting;
  int free_blocks, total_blocks;
  int inflight;    // choices the router has sent it and not seen finish
} rtr_sched_worker;

typedef struct rtr_sched_target {
  int decode;  // index of the worker that generates (a both worker, or a decode worker)
  int prefill; // index of the prefill worker, or -1: the decode/both worker prefills itself (mode "local")
} rtr_sched_target;

// Picks for a prompt of n_prompt tokens among w (n). A `both` worker with the least load (inflight + running +
// waiting) when there is one; otherwise the decode worker with the fewest running sequences (ties: most free blocks),
// paired with the prefill worker with the shortest queue when n_prompt >= disagg_threshold and one is up.
// 0 with *out, -1 when no worker that can generate is up.
int rtr_sched_pick(const rtr_sched_worker *w, int n, int n_prompt, int disagg_threshold, rtr_sched_target *out);

#ifdef __cplusplus
}
#endif
#endif
