// util/repeat.c: "once a minute per key" for log lines that would repeat forever (util/repeat.h).
#include "util/repeat.h"

#include <stdio.h>
#include <string.h>

int utl_repeat_pass(utl_repeat *r, const char *key, int64_t now_ms, long *held) {
  char k[UTL_REPEAT_KEY];
  snprintf(k, sizeof k, "%s", key ? key : "");
  utl_repeat_slot *e = NULL, *oldest = &r->slot[0];
  for (int i = 0; i < UTL_REPEAT_SLOTS && !e; i++) {
    utl_repeat_slot *x = &r->slot[i];
    if (x->key[0] && !strcmp(x->key, k)) e = x;
    else if (!x->key[0] || (oldest->key[0] && x->last_ms < oldest->last_ms)) oldest = x;
  }
  *held = 0;
  if (!e) { // first time (or forgotten): log it, and remember it in a free slot or the stalest one
    e = oldest;
    snprintf(e->key, sizeof e->key, "%s", k);
    e->last_ms = now_ms;
    e->held = 0;
    return 1;
  }
  if (r->period_ms > 0 && now_ms - e->last_ms < r->period_ms) {
    e->held++;
    return 0;
  }
  *held = e->held;
  e->held = 0;
  e->last_ms = now_ms;
  return 1;
}
