// kernels/cpu/pool.c: the fixed thread pool: persistent workers that spin briefly, then sleep on a condvar.
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/krn.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KRN_RELAX() _mm_pause()
#else
#define KRN_RELAX() ((void)0)
#endif

// Pause iterations a waiting worker spins before it sleeps (a few tens of microseconds), and that
// the caller spins before it starts yielding the core while workers finish.
#define KRN_POOL_SPIN 4096
#define KRN_POOL_SPIN_DONE 2048

typedef struct krn_worker {
  struct krn_pool *pool; // (borrowed)
  int ith;
} krn_worker;

struct krn_pool {
  int n;                 // threads including the caller
  pthread_t *th;         // (owned) (n - 1)
  krn_worker *wk;        // (owned) (n - 1)
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int sleepers;          // workers waiting on cv (under mu)
  atomic_uint gen;       // bumped once per run (and once at shutdown)
  atomic_int pending;    // workers not yet done with the current run
  atomic_int stop;
  krn_task_fn fn;        // current run's task (written before gen is bumped)
  void *arg;
};

static void *krn_pool_main(void *vp) {
  krn_worker *w = vp;
  krn_pool *p = w->pool;
  unsigned seen = 0;
  for (;;) {
    int spins = 0;
    while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) {
      if (++spins < KRN_POOL_SPIN) { KRN_RELAX(); continue; }
      pthread_mutex_lock(&p->mu);
      while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) {
        p->sleepers++;
        pthread_cond_wait(&p->cv, &p->mu);
        p->sleepers--;
      }
      pthread_mutex_unlock(&p->mu);
    }
    seen = atomic_load_explicit(&p->gen, memory_order_acquire);
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
    p->fn(p->arg, w->ith, p->n);
    atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
  }
  return NULL;
}

static void krn_pool_wake(krn_pool *p) {
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
  if (p->sleepers) pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

krn_pool *krn_pool_new(int n_threads, char *err, size_t errlen) {
  if (n_threads < 1 || n_threads > KRN_POOL_MAX_THREADS) {
    if (err && errlen)
      snprintf(err, errlen, "thread pool: %d threads is out of range 1..%d", n_threads, KRN_POOL_MAX_THREADS);
    return NULL;
  }
  krn_pool *p = calloc(1, sizeof *p);
  if (!p) goto oom;
  p->n = n_threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  atomic_init(&p->gen, 0);
  atomic_init(&p->pending, 0);
  atomic_init(&p->stop, 0);
  if (n_threads == 1) return p;
  p->th = calloc((size_t)n_threads - 1, sizeof *p->th);
  p->wk = calloc((size_t)n_threads - 1, sizeof *p->wk);
  if (!p->th || !p->wk) { free(p->th); free(p->wk); pthread_cond_destroy(&p->cv); pthread_mutex_destroy(&p->mu); free(p); goto oom; }
  for (int i = 0; i < n_threads - 1; i++) {
    p->wk[i].pool = p;
    p->wk[i].ith = i + 1;
    int rc = pthread_create(&p->th[i], NULL, krn_pool_main, &p->wk[i]);
    if (rc != 0) {
      p->n = i + 1; // the started workers, plus the caller
      krn_pool_free(p);
      if (err && errlen) snprintf(err, errlen, "thread pool: cannot start thread %d: %s", i + 1, strerror(rc));
      return NULL;
    }
  }
  return p;
oom:
  if (err && errlen) snprintf(err, errlen, "thread pool: out of memory");
  return NULL;
}

void krn_pool_free(krn_pool *p) {
  if (!p) return;
  if (p->n > 1) {
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    krn_pool_wake(p);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->th[i], NULL);
  }
  free(p->th);
  free(p->wk);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

int krn_pool_threads(const krn_pool *p) { return p ? p->n : 1; }

void krn_pool_run(krn_pool *p, krn_task_fn fn, void *arg) {
  if (!p || p->n == 1) { fn(arg, 0, 1); return; }
  p->fn = fn;
  p->arg = arg;
  atomic_store_explicit(&p->pending, p->n - 1, memory_order_release);
  krn_pool_wake(p);
  fn(arg, 0, p->n);
  int spins = 0;
  while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
    if (++spins < KRN_POOL_SPIN_DONE) KRN_RELAX();
    else sched_yield(); // a worker may be descheduled on a busy machine: give it the core
  }
}
