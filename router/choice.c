// router/choice.c: the names and legal transitions of a choice's states in the router (router/choice.h).
#include "router/choice.h"

static const char *const NAMES[RTR_CH_N_STATES] = {
    [RTR_CH_NEW] = "new",
    [RTR_CH_ROUTED] = "routed",
    [RTR_CH_STREAMING] = "streaming",
    [RTR_CH_DECODE_LOST] = "decode_lost",
    [RTR_CH_WAITING_WORKER] = "waiting_worker",
    [RTR_CH_DONE] = "done",
};

const char *rtr_ch_state_name(rtr_ch_state s) { return s >= 0 && s < RTR_CH_N_STATES ? NAMES[s] : "?"; }

#define B(s) (1u << (s))

// NEXT[from]: the states `from` may go to. DONE from every live state; ROUTED again when it moves (a worker died,
// went silent, drained or refused it) and another worker is up, WAITING_WORKER when none is.
static const unsigned NEXT[RTR_CH_N_STATES] = {
    [RTR_CH_NEW] = B(RTR_CH_ROUTED) | B(RTR_CH_DONE),
    [RTR_CH_ROUTED] = B(RTR_CH_ROUTED) | B(RTR_CH_STREAMING) | B(RTR_CH_DECODE_LOST) | B(RTR_CH_WAITING_WORKER) |
                      B(RTR_CH_DONE),
    [RTR_CH_STREAMING] = B(RTR_CH_ROUTED) | B(RTR_CH_WAITING_WORKER) | B(RTR_CH_DONE),
    [RTR_CH_DECODE_LOST] = B(RTR_CH_ROUTED) | B(RTR_CH_STREAMING) | B(RTR_CH_WAITING_WORKER) | B(RTR_CH_DONE),
    [RTR_CH_WAITING_WORKER] = B(RTR_CH_ROUTED) | B(RTR_CH_DONE),
    [RTR_CH_DONE] = 0,
};

int rtr_ch_state_legal(rtr_ch_state from, rtr_ch_state to) {
  if (from < 0 || from >= RTR_CH_N_STATES || to < 0 || to >= RTR_CH_N_STATES) return 0;
  return (NEXT[from] & B(to)) != 0;
}
