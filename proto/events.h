// proto/events.h: kv_events, a worker's prefix-store changes as the router's KV-aware index reads them.
#ifndef DSERVE_PRT_EVENTS_H
#define DSERVE_PRT_EVENTS_H

#include "proto/proto.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { PRT_KV_ADDED = 1, PRT_KV_REMOVED = 2, PRT_KV_CLEARED = 3 }; // the same values as kv/blockhash.h's

typedef struct prt_kv_event {
  uint64_t key; // the block's hash-chain key: a decimal string on the wire (a uint64 does not fit a JSON number)
  int kind;     // PRT_KV_*
} prt_kv_event;

typedef struct prt_kv_events {
  prt_kv_event *ev; // (owned by decode; borrowed by encode) (n) in the order they happened
  int n;
  int skipped;      // decode: malformed entries left out (the index is a hint: a lost event costs recomputation)
} prt_kv_events;
cJSON *prt_kv_events_encode(const prt_kv_events *m, char *err, size_t errlen);
// Refuses a message whose events is not an array; an entry that is not [kind, "key"] (a clear may have any key) is
// skipped and counted, as the router always did.
int prt_kv_events_decode(const cJSON *j, prt_kv_events *m, char *err, size_t errlen) UTL_WARN_UNUSED;
void prt_kv_events_free(prt_kv_events *m);

#ifdef __cplusplus
}
#endif
#endif
