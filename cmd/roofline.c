// cmd/roofline.c: the memory roofline of decode (`dserve generate --bench`): a read-bandwidth probe on the engine's
// own thread pool and the weight bytes one decode step reads.
#include "cmd/roofline.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"

size_t cmd_decode_weight_bytes(const mdl_gguf *g) {
  size_t total = 0;
  const mdl_gguf_tensor *embd = mdl_gguf_tensor_find(g, "token_embd.weight");
  for (uint64_t i = 0; i < g->n_tensors; i++) total += g->tensors[i].nbytes;
  if (embd && mdl_gguf_tensor_find(g, "output.weight")) total -= embd->nbytes;
  return total;
}

typedef struct read_task {
  const uint64_t *buf; // (borrowed) (n)
  size_t n;
  uint64_t sums[KRN_POOL_MAX_THREADS]; // one per thread, so no thread's reads can be optimized away
} read_task;

static void read_slice(void *arg, int ith, int nth) {
  read_task *t = arg;
  size_t per = t->n / (size_t)nth, lo = per * (size_t)ith, hi = ith == nth - 1 ? t->n : lo + per;
  uint64_t a = 0, b = 0, c = 0, d = 0; // four chains: the loads, not the adds, bound the loop
  size_t i = lo;
  for (; i + 4 <= hi; i += 4) {
    a += t->buf[i];
    b += t->buf[i + 1];
    c += t->buf[i + 2];
    d += t->buf[i + 3];
  }
  for (; i < hi; i++) a += t->buf[i];
  t->sums[ith] = a + b + c + d;
}

double cmd_read_gbps(krn_pool *pool, size_t bytes) {
  read_task *t = calloc(1, sizeof *t);
  uint64_t *buf = malloc(bytes);
  double best = 0;
  if (t && buf) {
    memset(buf, 1, bytes); // touched: every page is resident before the timing
    t->buf = buf;
    t->n = bytes / sizeof *buf;
    for (int rep = 0; rep < 5; rep++) {
      double t0 = utl_now_s();
      krn_pool_run(pool, read_slice, t);
      double s = utl_now_s() - t0;
      if (s > 0 && bytes / s / 1e9 > best) best = bytes / s / 1e9;
    }
  }
  free(buf);
  free(t);
  return best;
}
