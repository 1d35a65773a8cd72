// cmd/roofline.c: the memory roofline of decode (`dserve generate --bench`): a read-bandwidth probe on the engine's
// own thread pool and the weight bytes one decode step reads.
#include "cmd/roofline.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"

// An MoE's expert counts from the GGUF (<arch>.expert_count, .expert_used_count); 0 for a dense model.
static void expert_counts(const mdl_gguf *g, int64_t *n_expert, int64_t *n_used) {
  mdl_str a;
  char k[96];
  *n_expert = *n_used = 0;
  if (mdl_gguf_get_str(g, "general.architecture", &a) != 0 || a.n > 48) return;
  snprintf(k, sizeof k, "%.*s.expert_count", (int)a.n, a.p);
  if (mdl_gguf_get_i64(g, k, n_expert) != 0) *n_expert = 0;
  snprintf(k, sizeof k, "%.*s.expert_used_count", (int)a.n, a.p);
  if (mdl_gguf_get_i64(g, k, n_used) != 0) *n_used = 0;
  if (*n_expert < 1 || *n_used < 1 || *n_used > *n_expert) *n_expert = *n_used = 0;
}

size_t cmd_decode_weight_bytes(const mdl_gguf *g) {
  size_t total = 0;
  int64_t ne, nu;
  expert_counts(g, &ne, &nu);
  const mdl_gguf_tensor *embd = mdl_gguf_tensor_find(g, "token_embd.weight");
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const mdl_gguf_tensor *t = &g->tensors[i];
    static const char suf[] = "_exps.weight";
    const size_t ns = sizeof suf - 1;
    if (ne && t->name.n > ns && !memcmp(t->name.p + t->name.n - ns, suf, ns)) // a token reads its experts' slices only
      total += t->nbytes / (size_t)ne * (size_t)nu;
    else total += t->nbytes;
  }
  if (embd && mdl_gguf_tensor_find(g, "output.weight")) total -= embd->nbytes;
  return total;
}

typedef struct read_task {
  const uint64_t *buf; // (borrowed) (n)
  size_t n;            // a multiple of 16
  int wide;            // 1: 64-byte vector loads with software prefetch, 0: 8-byte loads
  uint64_t sums[KRN_POOL_MAX_THREADS]; // one per thread, so no thread's reads can be optimized away
} read_task;

typedef uint64_t read_vec __attribute__((vector_size(64)));

// [lo, hi) (multiples of 16 words) in 64-byte vectors, prefetching 8 KiB ahead as the decode matmuls do: the widest
// loads the CPU has (a clone per instruction set, chosen at load time), so that the roofline is not a reader's own limit.
__attribute__((target_clones("avx512f", "avx2", "default")))
static uint64_t read_wide(const uint64_t *buf, size_t lo, size_t hi) {
  read_vec a = {0}, b = {0};
  const read_vec *p = (const read_vec *)(buf + lo);
  for (size_t i = 0; i + 2 <= (hi - lo) / 8; i += 2) {
    __builtin_prefetch((const char *)(p + i) + 8192);
    a += p[i];
    b += p[i + 1];
  }
  a += b;
  uint64_t s = 0;
  for (int l = 0; l < 8; l++) s += a[l];
  return s;
}

static void read_slice(void *arg, int ith, int nth) {
  read_task *t = arg;
  size_t per = t->n / 16 / (size_t)nth * 16, lo = per * (size_t)ith, hi = ith == nth - 1 ? t->n : lo + per;
  if (t->wide) {
    t->sums[ith] = read_wide(t->buf, lo, hi);
    return;
  }
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
  uint64_t *buf = aligned_alloc(64, (bytes + 63) / 64 * 64); // whole vectors for the wide reader
  double best = 0;
  if (t && buf) {
    memset(buf, 1, bytes); // touched: every page is resident before the timing
    t->buf = buf;
    t->n = bytes / sizeof *buf / 16 * 16;
    for (int rep = 0; rep < 10; rep++) { // both readers, alternating: the faster one's best pass counts
      t->wide = rep & 1;
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
