// util/vec.c: the growable array's one allocation rule (util/vec.h).
#include "util/vec.h"

#include <stdint.h>
#include <stdlib.h>

int utl_vec_reserve(void **items, int *cap, int need, size_t elem) {
  if (need <= *cap) return 0;
  if (need < 0 || elem == 0) return -1;
  size_t c = *cap > 0 ? (size_t)*cap : 8;
  while (c < (size_t)need) c *= 2;
  if (c > (size_t)INT32_MAX || c > SIZE_MAX / elem) return -1;
  void *p = realloc(*items, c * elem);
  if (!p) return -1;
  *items = p;
  *cap = (int)c;
  return 0;
}
