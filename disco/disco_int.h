// disco/disco_int.h: what disco's own threads share: the one timed wait that a stop request cuts short.
#ifndef DSERVE_DSC_DISCO_INT_H
#define DSERVE_DSC_DISCO_INT_H

#include <pthread.h>
#include <time.h>

#include "util/clock.h"

// Waits on cv (made by utl_cond_init_monotonic; the caller does not hold mu) up to ms, or until *stop is set (under mu, with cv broadcast); returns *stop.
static inline int dsc_nap(pthread_mutex_t *mu, pthread_cond_t *cv, const int *stop, int ms) {
  pthread_mutex_lock(mu);
  struct timespec dl = utl_deadline_ms(ms);
  while (!*stop && pthread_cond_timedwait(cv, mu, &dl) == 0) {
  }
  int s = *stop;
  pthread_mutex_unlock(mu);
  return s;
}

#endif
