// cmd/engine.h: the local engine the one-machine subcommands (generate, perplexity) run on: backend, pool, model, KV.
#ifndef DSERVE_CMD_ENGINE_H
#define DSERVE_CMD_ENGINE_H

#include <stddef.h>

#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"

// The backend, thread pool, model and a KV cache of its own (all owned; zeroed when closed).
typedef struct cmd_engine {
  mdl_gguf *g;
  krn_pool *pool;
  krn_ctx kc;
  int kc_init;
  mdl_llama *m;
  const mdl_llama_cfg *cfg; // (borrowed from m)
  mdl_kv kv;
} cmd_engine;

// The names --kernels takes, for usage lines and errors.
#define CMD_KERNELS "scalar, avx2, avx2vnni, avx512, auto, cuda"
// The options every engine subcommand checks: --kernels names one of CMD_KERNELS (whether this machine has it is
// found at open) and --model is given. 0, or -1 after saying which on stderr as "dserve CMD: ...".
int cmd_engine_opts_ok(const char *cmd, const char *model, const char *kernels);

// Opens the model on the named kernels with threads cpu threads. -1 with err.
int cmd_engine_open(cmd_engine *e, const char *model, const char *kernels, int threads, char *err, size_t errlen);
void cmd_engine_close(cmd_engine *e);
// Allocates the KV cache: n_blocks blocks of 16 tokens, F16 (once per engine).
int cmd_engine_kv(cmd_engine *e, int n_blocks, char *err, size_t errlen);

// Parses a whole decimal integer in [lo, hi]; -1 on anything else.
int cmd_parse_int(const char *s, long lo, long hi, int *out);

#endif
