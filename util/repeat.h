// util/repeat.h: "once a minute per key" for a log line that would otherwise repeat forever (a peer refused every few
// seconds): which keys may log now, and how many lines each held back since it last did.
#ifndef DSERVE_UTL_REPEAT_H
#define DSERVE_UTL_REPEAT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { UTL_REPEAT_SLOTS = 32, UTL_REPEAT_KEY = 96 };

typedef struct utl_repeat_slot {
  char key[UTL_REPEAT_KEY]; // "" when unused
  int64_t last_ms;          // when its line was last let through
  long held;                // lines held back since then
} utl_repeat_slot;

// Not thread-safe: the owner guards it. Zeroed, then period_ms set. More keys than slots: the key let through
// longest ago gives up its slot (a forgotten key logs again at once, never silently).
typedef struct utl_repeat {
  int64_t period_ms; // a key logs at most once per period (<= 0: always)
  utl_repeat_slot slot[UTL_REPEAT_SLOTS];
} utl_repeat;

// 1 when key's line should be logged now, with *held the lines held back since its last one (0 the first time; say
// so in the line); 0 when it is held back (and counted).
int utl_repeat_pass(utl_repeat *r, const char *key, int64_t now_ms, long *held);

#ifdef __cplusplus
}
#endif
#endif
