// util/clock.h: the one monotonic clock every module reads (milliseconds, microseconds, nanoseconds, seconds), the one
// deadline helper for timed waits on it, and the process's CPU time for benchmarks.
#ifndef DSERVE_UTL_CLOCK_H
#define DSERVE_UTL_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

// CLOCK_MONOTONIC: never jumps with the wall clock, so every timeout and duration in the tree is read from here.
static inline int64_t utl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static inline int64_t utl_now_us(void) { return utl_now_ns() / 1000; }
static inline int64_t utl_now_ms(void) { return utl_now_ns() / 1000000; }
static inline double utl_now_ms_f(void) { return (double)utl_now_ns() / 1e6; } // fractional, for step timings
static inline double utl_now_s(void) { return (double)utl_now_ns() / 1e9; }
// The deadline of a timed wait timeout_ms from now, on CLOCK_MONOTONIC: the clock of every condition variable that
// utl_cond_init_monotonic made, which is every one the tree waits on with pthread_cond_timedwait. On CLOCK_REALTIME a
// wall clock stepped back (NTP, an operator) would stretch the wait by the step, and one stepped forward cut it short.
static inline struct timespec utl_deadline_ms(int64_t timeout_ms) {
  int64_t t = utl_now_ns() + (timeout_ms > 0 ? timeout_ms : 0) * 1000000;
  struct timespec ts = {(time_t)(t / 1000000000), (long)(t % 1000000000)};
  return ts;
}
// Initialises cv to time its waits on CLOCK_MONOTONIC (pair with utl_deadline_ms). No status: glibc's
// pthread_condattr_setclock fails only for a clock other than CLOCK_REALTIME/MONOTONIC, and pthread_cond_init never.
static inline void utl_cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}
// CLOCK_REALTIME in ns since the Unix epoch: only for timestamps other processes read (trace spans), never durations.
static inline int64_t utl_unix_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
// A utl_now_ns() reading as Unix-epoch ns (the two clocks' offset now).
static inline int64_t utl_unix_ns_of(int64_t mono_ns) { return mono_ns + (utl_unix_ns() - utl_now_ns()); }
// CPU seconds this process's threads have run (CLOCK_PROCESS_CPUTIME_ID): a benchmark's cost on a shared machine,
// where wall time also counts the other processes' turns on the cores.
static inline double utl_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#ifdef __cplusplus
}
#endif
#endif
