// tests/clock/wallshift.c: a fake wall clock linked into test_clock: clock_gettime(CLOCK_REALTIME*), gettimeofday and
// time read the real wall clock plus the offset wallshift_set last gave, while the kernel's own CLOCK_REALTIME (what a
// futex with an absolute realtime deadline is compared against) stays put. A deadline computed from the shifted clock
// is then off by the shift, exactly as one computed just before an NTP or operator step of the wall clock would be.
//
// Linked into the executable rather than LD_PRELOADed: the executable's definitions interpose on libc's for every
// caller in the process all the same, and this also holds under ASan, whose runtime must come first in an
// LD_PRELOAD list (it would refuse to start with a shim there). The real clocks are read with the raw syscall, so no
// lookup of libc's (or ASan's) symbol is needed and nothing can recurse.
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tests/clock/wallshift.h"

// The one offset of this test process (a test double: the tree's own code keeps no global state).
static _Atomic int64_t shift_ns;

void wallshift_set(int64_t ns) { atomic_store(&shift_ns, ns); }

int wallshift_real(struct timespec *ts) { return (int)syscall(SYS_clock_gettime, CLOCK_REALTIME, ts); }

int clock_gettime(clockid_t c, struct timespec *ts) {
  int rc = (int)syscall(SYS_clock_gettime, c, ts);
  if (rc == 0 && (c == CLOCK_REALTIME || c == CLOCK_REALTIME_COARSE)) {
    int64_t t = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + atomic_load(&shift_ns);
    ts->tv_sec = (time_t)(t / 1000000000);
    ts->tv_nsec = (long)(t % 1000000000);
  }
  return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
  (void)tz;
  struct timespec ts;
  int rc = clock_gettime(CLOCK_REALTIME, &ts);
  if (rc == 0) { // tv is declared nonnull
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return rc;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
