// router/reqtab.h: the router's requests by id: an open-addressing hash table from a request id to its request, so a
// worker's message finds its request in O(1) whatever the number of streams (links.c).
#ifndef DSERVE_RTR_REQTAB_H
#define DSERVE_RTR_REQTAB_H

#include <stddef.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rtr_reqtab_slot {
  const char *key; // (borrowed: the value's own id, which lives as long as it is in the table) NULL: empty
  void *val;
} rtr_reqtab_slot;

typedef struct rtr_reqtab {
  rtr_reqtab_slot *slots; // (owned) (cap) linear probing, no tombstones (deletion shifts the run back)
  size_t cap, n;          // cap a power of two (0 before the first put); n keys held, at most cap * 3/4
} rtr_reqtab;

// key must be unique and outlive its entry. 0, or -1 on out of memory (the table is as it was).
int rtr_reqtab_put(rtr_reqtab *t, const char *key, void *val) UTL_WARN_UNUSED;
// The value of the key whose first len bytes are key[0..len) and that is exactly len long; NULL when absent.
void *rtr_reqtab_get(const rtr_reqtab *t, const char *key, size_t len);
// Removes key (no-op when absent).
void rtr_reqtab_del(rtr_reqtab *t, const char *key);
void rtr_reqtab_free(rtr_reqtab *t);

// A choice id's request id: "<rid>-<index>" or a moved choice's "<rid>-<index>-r<k>" -> the length of <rid> and
// *index; 0 when id has neither shape.
size_t rtr_choice_id_split(const char *id, int *index);

#ifdef __cplusplus
}
#endif
#endif
