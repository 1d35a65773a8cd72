// util/vec.h: the one growable array: makes room for one more element of any array that carries a count and a capacity.
#ifndef DSERVE_UTL_VEC_H
#define DSERVE_UTL_VEC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Makes *items (elements of elem bytes, *cap of them allocated) hold at least need elements, doubling (from 8) so
// appends cost O(1) amortized. 0, or -1 when memory ran out or the size overflows (then *items and *cap are as
// they were: nothing is lost).
int utl_vec_reserve(void **items, int *cap, int need, size_t elem);

// UTL_VEC_PUSH(arr, n, cap, value): appends value to arr (a T * with int counters n and cap); evaluates to 0, or -1
// when memory ran out (arr unchanged).
#define UTL_VEC_PUSH(arr, n, cap, value)                                                                    \
  (utl_vec_reserve((void **)&(arr), &(cap), (n) + 1, sizeof *(arr)) ? -1 : ((arr)[(n)++] = (value), 0))

#ifdef __cplusplus
}
#endif
#endif
