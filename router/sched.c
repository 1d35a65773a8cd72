// router/sched.c: the scheduling policy: least-loaded both worker, or decode worker + shortest-queue prefill worker.
#include "router/sched.h"

int rtr_sched_pick(const rtr_sched_worker *w, int n, int n_prompt, int disagg_threshold, rtr_sched_target *out) {
  int best_both = -1, best_dec = -1, best_pre = -1;
  long both_load = 0, dec_load = 0, pre_load = 0;
  for (int i = 0; i < n; i++) {
    if (!w[i].up) continue;
    if (w[i].role == SRV_ROLE_BOTH) {
      long load = (long)w[i].inflight + w[i].running + w[i].waiting;
      if (best_both < 0 || load < both_load) best_both = i, both_load = load;
    } else if (w[i].role == SRV_ROLE_DECODE) {
      long load = (long)(w[i].inflight > w[i].running ? w[i].inflight : w[i].running);
      if (best_dec < 0 || load < dec_load || (load == dec_load && w[i].free_blocks > w[best_dec].free_blocks))
        best_dec = i, dec_load = load;
    } else if (w[i].role == SRV_ROLE_PREFILL) {
      long load = (long)w[i].inflight + w[i].waiting;
      if (best_pre < 0 || load < pre_load) best_pre = i, pre_load = load;
    }
  }
  if (best_both >= 0) {
    out->decode = best_both;
    out->prefill = -1;
    return 0;
  }
  if (best_dec < 0) return -1;
  out->decode = best_dec;
  out->prefill = (best_pre >= 0 && n_prompt >= disagg_threshold) ? best_pre : -1;
  return 0;
}
