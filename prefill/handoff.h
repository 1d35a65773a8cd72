// prefill/handoff.h: the states of a prefill worker's request (docs/protocol.md, "Handoff states"): their names and
// which transitions are legal. worker.c's pfl_req_to is the one place a request changes state; it asks here first.
// Where the engine holds the request (waiting for a prefix fetch, queued, in the batch) is the engine's, not a state.
#ifndef DSERVE_PFL_HANDOFF_H
#define DSERVE_PFL_HANDOFF_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pfl_state {
  PFL_NEW,         // built from its generate, not accepted yet (0: a calloc'd request starts here)
  PFL_WAIT_TABLE,  // accepted (fetching a prefix, queued or computing); the decode worker's kv_table not known
  PFL_COMPUTED,    // the prompt is computed and the first token sampled; still no table: waits for it
  PFL_TABLE,       // the table is known: what is computed is pushed; kv_started not sent (no step computed it yet)
  PFL_PUSHING,     // kv_started sent: each step pushes its layers as they finish
  PFL_PUSH_FAILED, // a WRITE could not be posted during a step: the step fails the request when it ends
  PFL_HANDED_OFF,  // notification and kv_first sent: the posted writes finish, then reap frees it
  PFL_STOPPING,    // stopped (failed, cancelled, the decode worker's kv_fail) with writes in flight: once they
                   // finished, reap tells the decode worker (kv_fail / kv_freed: pfl_req.tell) and frees it
  PFL_DONE,        // freed (terminal)
  PFL_N_STATES
} pfl_state;

const char *pfl_state_name(pfl_state s);
// 1 when a request may go from `from` to `to` (the table in docs/protocol.md), else 0.
int pfl_state_legal(pfl_state from, pfl_state to);
// The decode worker's table is known and the request is still being handed: its KV is pushed as it is computed.
static inline int pfl_state_pushes(pfl_state s) { return s == PFL_TABLE || s == PFL_PUSHING; }
// Nothing left but letting the posted writes finish (reap frees it): no longer found by cancel or a table.
static inline int pfl_state_draining(pfl_state s) { return s == PFL_HANDED_OFF || s == PFL_STOPPING; }

#ifdef __cplusplus
}
#endif
#endif
