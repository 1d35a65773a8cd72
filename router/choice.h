// router/choice.h: the states of a choice in the router (docs/protocol.md, "Handoff states"): their names and which
// transitions are legal. req.c's rtr_choice_to is the one place a choice changes state; it asks here first.
#ifndef DSERVE_RTR_CHOICE_H
#define DSERVE_RTR_CHOICE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rtr_ch_state {
  RTR_CH_NEW,            // not routed yet (0: a calloc'd choice starts here)
  RTR_CH_ROUTED,         // generate sent to its worker(s) (prefill + decode, or one local); no token from it yet
  RTR_CH_STREAMING,      // a token came: its decode/both worker holds all the KV (the prefill worker is done with it)
  RTR_CH_DECODE_LOST,    // its prefill worker lost the decode worker while our link to it is up: waits
                         // RTR_DECODE_LOST_MS for that link to go down too (then moves), else is sent again
  RTR_CH_WAITING_WORKER, // moved with no worker up: no worker holds it; waits router.migration_wait_ms for one
  RTR_CH_DONE,           // done, error or cancelled (terminal)
  RTR_CH_N_STATES
} rtr_ch_state;

const char *rtr_ch_state_name(rtr_ch_state s);
// 1 when a choice may go from `from` to `to` (the table in docs/protocol.md), else 0.
int rtr_ch_state_legal(rtr_ch_state from, rtr_ch_state to);

#ifdef __cplusplus
}
#endif
#endif
