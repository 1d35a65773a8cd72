// cmd/bench_steps.c: `dserve generate --bench-chunks`: step time against prefill chunk size, with decode rows or not.
#include "cmd/bench_steps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "worker/engine.h"

typedef struct steps_ctx {
  cmd_model *e;
  float *logits; // (batch + 1, n_vocab) scratch
  int32_t *toks; // (n_toks) random tokens every sequence reads from
  int n_toks;
  int reps;
} steps_ctx;

// Untimed forward over positions [from, to) of a sequence whose table is bt (n_blocks), in chunks of 512.
static int fill(steps_ctx *c, int32_t *bt, int n_blocks, int from, int to, char *err, size_t errlen) {
  for (int at = from; at < to; at += 512) {
    int len = to - at < 512 ? to - at : 512;
    mdl_seq s = {c->toks + at % (c->n_toks - 512), len, at, bt, n_blocks, 1};
    if (mdl_llama_forward(c->e->m, &c->e->kv, &s, 1, c->logits, NULL, NULL, err, errlen)) return -1;
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// The median wall time (ms) of prefilling a whole prompt of positions [0, n) in chunks of C (alone, or as the
// last row of steps whose first rows are dec (n_dec, each step writes them again)): what the prompt's TTFT is made of.
static int time_prompt(steps_ctx *c, mdl_seq *dec, int n_dec, int32_t *bt, int n_blocks, int n, int C, double *out,
                       char *err, size_t errlen) {
  double t[3];
  for (int r = 0; r < 3; r++) {
    double t0 = utl_now_ms_f();
    for (int at = 0; at < n; at += C) {
      dec[n_dec] = (mdl_seq){c->toks + at, n - at < C ? n - at : C, at, bt, n_blocks, 1};
      if (mdl_llama_forward(c->e->m, &c->e->kv, dec, n_dec + 1, c->logits, NULL, NULL, err, errlen)) return -1;
    }
    t[r] = utl_now_ms_f() - t0;
  }
  qsort(t, 3, sizeof *t, cmp_double);
  *out = t[1];
  return 0;
}

// The median wall time (ms) of reps forwards of the rows ms (n): every rep writes the same positions again.
static int time_step(steps_ctx *c, const mdl_seq *ms, int n, double *out, char *err, size_t errlen) {
  double t[64];
  int reps = c->reps < 64 ? c->reps : 64;
  for (int r = 0; r < reps; r++) {
    double t0 = utl_now_ms_f();
    if (mdl_llama_forward(c->e->m, &c->e->kv, ms, n, c->logits, NULL, NULL, err, errlen)) return -1;
    t[r] = utl_now_ms_f() - t0;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  *out = t[reps / 2];
  return 0;
}

int cmd_bench_steps(cmd_model *e, const int *chunks, int n_chunks, int batch, int ctx, int reps, char *err,
                    size_t errlen) {
  int max_c = 1;
  for (int i = 0; i < n_chunks; i++) max_c = chunks[i] > max_c ? chunks[i] : max_c;
  // Blocks: a shared prefix of ctx tokens (whole blocks), then each decode row's and the prompt's own tail, and a
  // fresh table for the prompt's first chunk.
  int shared = ctx / CMD_KV_BLOCK, tail = (ctx - shared * CMD_KV_BLOCK + max_c + 1 + CMD_KV_BLOCK - 1) / CMD_KV_BLOCK;
  int first = ((max_c > ctx ? max_c : ctx) + CMD_KV_BLOCK - 1) / CMD_KV_BLOCK; // also the whole prompt's table
  int per_seq = shared + tail, nb = shared + (batch + 1) * tail + first;
  if (cmd_model_kv(e, nb, err, errlen)) return -1;
  int V = e->cfg->n_vocab, rc = -1;
  steps_ctx c = {e, NULL, NULL, ctx + max_c + 1024, reps};
  int32_t *bt = malloc((size_t)(batch + 1) * per_seq * sizeof *bt), *first_bt = malloc((size_t)first * sizeof *bt);
  mdl_seq *ms = calloc((size_t)batch + 1, sizeof *ms);
  c.logits = malloc((size_t)(batch + 1) * V * sizeof *c.logits);
  c.toks = malloc((size_t)c.n_toks * sizeof *c.toks);
  wrk_stepcost cost, tok_only; // the scheduler's model, and the same fitted without the attention pairs
  wrk_stepcost_init(&cost, 1.0);
  wrk_stepcost_init(&tok_only, 1.0);
  double (*row)[6] = calloc((size_t)n_chunks, sizeof *row); // per chunk: prefill first/after, mixed first/after,
                                                            // whole prompt alone/with the decode rows
  if (!bt || !first_bt || !ms || !c.logits || !c.toks || !row) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  uint64_t x = 12345;
  for (int i = 0; i < c.n_toks; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c.toks[i] = (int32_t)((x >> 33) % (uint64_t)(V - 256)) + 256;
  }
  // sequence s (0..batch-1: decode rows, batch: the prompt) reads the shared blocks, then its own tail
  for (int s = 0; s <= batch; s++) {
    for (int i = 0; i < shared; i++) bt[s * per_seq + i] = i;
    for (int i = 0; i < tail; i++) bt[s * per_seq + shared + i] = shared + s * tail + i;
  }
  for (int i = 0; i < first; i++) first_bt[i] = shared + (batch + 1) * tail + i;
  if (fill(&c, bt, per_seq, 0, ctx, err, errlen)) goto done; // the prefix, and sequence 0's tail
  for (int s = 1; s <= batch; s++)
    if (fill(&c, bt + s * per_seq, per_seq, shared * CMD_KV_BLOCK, ctx, err, errlen)) goto done;
  for (int s = 0; s < batch; s++) ms[s] = (mdl_seq){c.toks + s, 1, ctx, bt + s * per_seq, per_seq, 1};
  double dec;
  if (time_step(&c, ms, batch, &dec, err, errlen)) goto done;
  double dec_kpairs = batch * wrk_row_kpairs(ctx, 1);
  wrk_stepcost_observe(&cost, batch, dec_kpairs, dec);
  wrk_stepcost_observe(&tok_only, batch, 0, dec);
  for (int k = 0; k < n_chunks; k++) {
    int C = chunks[k];
    for (int at = 0; at < 2; at++) { // at 0: a prompt's first chunk; at 1: the chunk after the ctx-token prefix
      mdl_seq p = at ? (mdl_seq){c.toks, C, ctx, bt + batch * per_seq, per_seq, 1}
                     : (mdl_seq){c.toks, C, 0, first_bt, first, 1};
      ms[batch] = p;
      if (time_step(&c, &p, 1, &row[k][at], err, errlen)) goto done;
      if (time_step(&c, ms, batch + 1, &row[k][2 + at], err, errlen)) goto done;
      wrk_stepcost_observe(&cost, batch + C, dec_kpairs + wrk_row_kpairs(at ? ctx : 0, C), row[k][2 + at]);
      wrk_stepcost_observe(&tok_only, batch + C, 0, row[k][2 + at]);
    }
    if (time_prompt(&c, ms + batch, 0, first_bt, first, ctx, C, &row[k][4], err, errlen) ||
        time_prompt(&c, ms, batch, first_bt, first, ctx, C, &row[k][5], err, errlen))
      goto done;
  }
  printf("steps: %d decode rows at context %d, one prefill chunk of C tokens at position 0 (first) or %d (after "
         "the prefix); median of %d forwards each (%s, %d threads)\n",
         batch, ctx, ctx, reps, e->kc.be->name, e->pool ? krn_pool_threads(e->pool) : 1);
  printf("decode rows alone: %.1f ms\n", dec);
  printf("cost model fitted to the decode and mixed steps: %.1f ms + %.3f ms/token + %.4f ms/1000 attention pairs "
         "(tokens alone: %.1f ms + %.3f ms/token)\n", cost.fixed_ms, cost.per_tok_ms, cost.per_kpair_ms,
         tok_only.fixed_ms, tok_only.per_tok_ms);
  printf("| chunk | prefill alone ms first / after | with %d decode rows ms first / after | prefill tok/s after | "
         "measured/model first / after | measured/model, tokens alone | %d-token prompt ms alone / with the decode "
         "rows |\n|---|---|---|---|---|---|---|\n", batch, ctx);
  for (int k = 0; k < n_chunks; k++) {
    int C = chunks[k];
    double p0 = wrk_stepcost_predict(&cost, batch + C, dec_kpairs + wrk_row_kpairs(0, C));
    double p1 = wrk_stepcost_predict(&cost, batch + C, dec_kpairs + wrk_row_kpairs(ctx, C));
    double pt = wrk_stepcost_predict(&tok_only, batch + C, 0);
    printf("| %d | %.1f / %.1f | %.1f / %.1f | %.0f | %.2f / %.2f | %.2f / %.2f | %.0f / %.0f |\n", C, row[k][0],
           row[k][1], row[k][2], row[k][3], C * 1000.0 / row[k][3], row[k][2] / p0, row[k][3] / p1,
           row[k][2] / pt, row[k][3] / pt, row[k][4], row[k][5]);
  }
  rc = 0;
done:
  free(bt);
  free(first_bt);
  free(ms);
  free(c.logits);
  free(c.toks);
  free(row);
  return rc;
}
