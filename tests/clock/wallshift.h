// tests/clock/wallshift.h: the fake wall clock of test_clock (wallshift.c): steps CLOCK_REALTIME as the process reads it.
#ifndef DSERVE_TESTS_CLOCK_WALLSHIFT_H
#define DSERVE_TESTS_CLOCK_WALLSHIFT_H

#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

// From now on CLOCK_REALTIME (and gettimeofday, time) read ns later than the real wall clock (earlier when negative).
void wallshift_set(int64_t ns);
// The real wall clock, unshifted: 0, or -1 with errno.
int wallshift_real(struct timespec *ts);

#ifdef __cplusplus
}
#endif
#endif
