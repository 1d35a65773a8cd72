// cmd/bench_steps.h: `dserve generate --bench-chunks`: what one engine step costs as its prefill chunk grows.
#ifndef DSERVE_CMD_BENCH_STEPS_H
#define DSERVE_CMD_BENCH_STEPS_H

#include <stddef.h>

#include "cmd/model.h"

// Times single forward steps of a continuous-batching engine (median of reps each): `batch` decode rows at context
// ctx alone; and for each chunk size C in chunks (n_chunks, each 1..4096), one prefill chunk of C tokens at position
// 0 (a prompt's first chunk) and at position ctx (the chunk after a ctx-token prefix: its attention reads the whole
// prefix), each alone and together with the decode rows, and a whole ctx-token prompt in chunks of C (median of 3),
// alone and with the decode rows in each of its steps. Prints one table row per C, with what the step scheduler's
// cost model (worker/engine.h, wrk_stepcost: fixed + per-token + per-attention-pair, fitted over every mixed and
// decode-only step timed here) predicts for the mixed steps, and the same with tokens alone. 0, or -1 with err.
int cmd_bench_steps(cmd_model *e, const int *chunks, int n_chunks, int batch, int ctx, int reps, char *err,
                    size_t errlen);

#endif
