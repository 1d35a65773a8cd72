// decode/handoff.h: the states of a decode worker's sequence (docs/protocol.md, "Handoff states"): their names and
// which transitions are legal. worker.c's dec_seq_to is the one place a sequence changes state; it asks here first.
#ifndef DSERVE_DEC_HANDOFF_H
#define DSERVE_DEC_HANDOFF_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dec_state {
  DEC_NEW,        // built from its generate, not placed yet (0: a calloc'd sequence starts here)
  DEC_WAIT_TABLE, // mode decode: waiting for blocks or for the prefill worker's link to send kv_table
  DEC_TABLE_SENT, // kv_table sent; the request may wait in the prefill worker's queue (queue bound)
  DEC_KV_ARRIVING, // kv_started came: the prefill worker computes it; the KV-arrival timer runs
  DEC_GOT_NOTIF,  // the kvxfer notification came (every write landed); kv_first awaited
  DEC_GOT_FIRST,  // kv_first came; the notification awaited (writes may still land)
  DEC_RUNNING,    // in the engine (queued or in the batch): mode local from the start, mode decode once both came
  DEC_HELD,       // given up while the prefill worker may still write: blocks kept until kv_freed (or a bound)
  DEC_FAILED,     // the prefill worker said kv_fail: it writes nothing more; freed at once
  DEC_DONE,       // finished, failed or dropped: freed (terminal)
  DEC_N_STATES
} dec_state;

const char *dec_state_name(dec_state s);
// 1 when a sequence may go from `from` to `to` (the table in docs/protocol.md), else 0.
int dec_state_legal(dec_state from, dec_state to);
// States of a handoff still waiting for its KV (in the worker's handoffs list).
static inline int dec_state_in_handoff(dec_state s) { return s >= DEC_WAIT_TABLE && s <= DEC_GOT_FIRST; }
// States in which the prefill worker may hold our table and still write: giving up holds the blocks.
static inline int dec_state_may_write(dec_state s) {
  return s == DEC_TABLE_SENT || s == DEC_KV_ARRIVING || s == DEC_GOT_FIRST;
}

#ifdef __cplusplus
}
#endif
#endif
