// tests/router/sched_util.h: the disaggregation rules the scheduling tests pick with.
#ifndef DSERVE_TESTS_ROUTER_SCHED_UTIL_H
#define DSERVE_TESTS_ROUTER_SCHED_UTIL_H

extern "C" {
#include "router/sched.h"
}

// Length alone decides (policy threshold): what the tests written before policy auto assume.
inline const rtr_disagg_rule *Thr(int min_tokens) {
  static thread_local rtr_disagg_rule r;
  r = {CFG_DISAGG_THRESHOLD, min_tokens, 0};
  return &r;
}

#endif
