// decode/handoff.c: the names and legal transitions of a decode worker's sequence states (decode/handoff.h).
#include "decode/handoff.h"

static const char *const NAMES[DEC_N_STATES] = {
    [DEC_NEW] = "new",           [DEC_WAIT_TABLE] = "wait_table", [DEC_TABLE_SENT] = "table_sent",
    [DEC_KV_ARRIVING] = "kv_arriving", [DEC_GOT_NOTIF] = "got_notif",  [DEC_GOT_FIRST] = "got_first",
    [DEC_RUNNING] = "running",   [DEC_HELD] = "held",             [DEC_FAILED] = "failed",
    [DEC_DONE] = "done",
};

const char *dec_state_name(dec_state s) { return s >= 0 && s < DEC_N_STATES ? NAMES[s] : "?"; }

#define B(s) (1u << (s))

// NEXT[from]: the states `from` may go to. DONE is reachable from every live state (finished, cancelled, deadline,
// handoff timeout, router or prefill link gone, drain, out of memory); HELD only where the prefill worker may still
// write; a kv_started that comes after the notification or kv_first restarts the timer in place (GOT_* -> itself).
static const unsigned NEXT[DEC_N_STATES] = {
    [DEC_NEW] = B(DEC_WAIT_TABLE) | B(DEC_RUNNING) | B(DEC_DONE),
    [DEC_WAIT_TABLE] = B(DEC_TABLE_SENT) | B(DEC_FAILED) | B(DEC_DONE),
    [DEC_TABLE_SENT] = B(DEC_KV_ARRIVING) | B(DEC_GOT_NOTIF) | B(DEC_GOT_FIRST) | B(DEC_HELD) | B(DEC_FAILED) |
                       B(DEC_DONE),
    [DEC_KV_ARRIVING] = B(DEC_GOT_NOTIF) | B(DEC_GOT_FIRST) | B(DEC_HELD) | B(DEC_FAILED) | B(DEC_DONE),
    [DEC_GOT_NOTIF] = B(DEC_GOT_NOTIF) | B(DEC_RUNNING) | B(DEC_FAILED) | B(DEC_DONE),
    [DEC_GOT_FIRST] = B(DEC_GOT_FIRST) | B(DEC_RUNNING) | B(DEC_HELD) | B(DEC_FAILED) | B(DEC_DONE),
    [DEC_RUNNING] = B(DEC_DONE),
    [DEC_HELD] = B(DEC_DONE),
    [DEC_FAILED] = B(DEC_DONE),
    [DEC_DONE] = 0,
};

int dec_state_legal(dec_state from, dec_state to) {
  if (from < 0 || from >= DEC_N_STATES || to < 0 || to >= DEC_N_STATES) return 0;
  return (NEXT[from] & B(to)) != 0;
}
