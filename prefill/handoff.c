// prefill/handoff.c: the names and legal transitions of a prefill worker's request states (prefill/handoff.h).
#include "prefill/handoff.h"

static const char *const NAMES[PFL_N_STATES] = {
    [PFL_NEW] = "new",         [PFL_WAIT_TABLE] = "wait_table",   [PFL_COMPUTED] = "computed",
    [PFL_TABLE] = "table",     [PFL_PUSHING] = "pushing",         [PFL_PUSH_FAILED] = "push_failed",
    [PFL_HANDED_OFF] = "handed_off", [PFL_STOPPING] = "stopping", [PFL_DONE] = "done",
};

const char *pfl_state_name(pfl_state s) { return s >= 0 && s < PFL_N_STATES ? NAMES[s] : "?"; }

#define B(s) (1u << (s))

// NEXT[from]: the states `from` may go to. DONE (freed) is reachable from every live state; STOPPING only where writes
// may be in flight (the table is known); STOPPING goes to itself when a later stop raises what it will tell.
static const unsigned NEXT[PFL_N_STATES] = {
    [PFL_NEW] = B(PFL_WAIT_TABLE) | B(PFL_DONE),
    [PFL_WAIT_TABLE] = B(PFL_TABLE) | B(PFL_COMPUTED) | B(PFL_DONE),
    [PFL_COMPUTED] = B(PFL_HANDED_OFF) | B(PFL_STOPPING) | B(PFL_DONE),
    [PFL_TABLE] = B(PFL_PUSHING) | B(PFL_HANDED_OFF) | B(PFL_PUSH_FAILED) | B(PFL_STOPPING) | B(PFL_DONE),
    [PFL_PUSHING] = B(PFL_HANDED_OFF) | B(PFL_PUSH_FAILED) | B(PFL_STOPPING) | B(PFL_DONE),
    [PFL_PUSH_FAILED] = B(PFL_STOPPING) | B(PFL_DONE),
    [PFL_HANDED_OFF] = B(PFL_STOPPING) | B(PFL_DONE),
    [PFL_STOPPING] = B(PFL_STOPPING) | B(PFL_DONE),
    [PFL_DONE] = 0,
};

int pfl_state_legal(pfl_state from, pfl_state to) {
  if (from < 0 || from >= PFL_N_STATES || to < 0 || to >= PFL_N_STATES) return 0;
  return (NEXT[from] & B(to)) != 0;
}
