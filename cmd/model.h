// cmd/model.h: the local model the one-machine subcommands (generate, perplexity) run on: backend, pool, weights, KV.
#ifndef DSERVE_CMD_MODEL_H
#define DSERVE_CMD_MODEL_H

#include <stddef.h>

#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"

// What --f32-weights and --f32-kv change (zeroed: the file's weights in place, an F16 KV cache): the exact
// reference bench/accuracy.sh scores against.
typedef struct cmd_model_load {
  int f32_weights; // mdl_llama_opts.f32_weights (cpu kernels only)
  int f32_kv;      // the KV cache in F32 rather than F16 (--kv-type f32)
  int kv_type;     // --kv-type: 1 + the KRN_* type of the KV cache (krn_kv_type_parse); 0: F16 (or F32 with f32_kv)
} cmd_model_load;

// The usage lines of the two flags, and their parser: 1 when a is one of them (set in *lo), else 0.
#define CMD_MODEL_LOAD_USAGE                                                                                        \
  "  --f32-weights       dequantize every weight to F32 at load (the scalar reference's dequantization) and\n"      \
  "                      multiply by that: a scoring reference, 4 bytes a weight; cpu kernels only\n"              \
  "  --f32-kv            keep the KV cache in F32 (default F16, as llama.cpp)\n"                                 \
  "  --kv-type T         the KV cache's type: f16 (default), f32, q8_0 (llama.cpp's -ctk/-ctv q8_0)\n"
int cmd_model_load_flag(const char *a, cmd_model_load *lo);
// --kv-type's value into lo: 0, or -1 for a name krn_kv_type_parse does not know.
int cmd_model_kv_type(const char *v, cmd_model_load *lo);

// The backend, thread pool, model and a KV cache of its own (all owned; zeroed when closed).
typedef struct cmd_model {
  mdl_gguf *g;
  krn_pool *pool;
  krn_ctx kc;
  int kc_init;
  mdl_llama *m;
  const mdl_llama_cfg *cfg; // (borrowed from m)
  mdl_kv kv;
  cmd_model_load lo;
} cmd_model;

// The names --kernels takes, for usage lines and errors.
#define CMD_KERNELS "scalar, avx2, avx2vnni, avx512, amx, auto, cuda"
// The options every local-model subcommand checks: --kernels names one of CMD_KERNELS (whether this machine has it is
// found at open) and --model is given. 0, or -1 after saying which on stderr as "dserve CMD: ...".
int cmd_model_opts_ok(const char *cmd, const char *model, const char *kernels);

// Opens the model on the named kernels with threads cpu threads, as lo says (NULL: the defaults). -1 with err.
int cmd_model_open(cmd_model *e, const char *model, const char *kernels, int threads, const cmd_model_load *lo,
                    char *err, size_t errlen);
void cmd_model_close(cmd_model *e);
#define CMD_KV_BLOCK 16 // tokens per block of the KV cache cmd_model_kv allocates (what every tool sizes its tables by)
// Allocates the KV cache: n_blocks blocks of CMD_KV_BLOCK tokens, F16 (or --f32-kv, --kv-type) (once per model).
int cmd_model_kv(cmd_model *e, int n_blocks, char *err, size_t errlen);

// Parses a whole decimal integer in [lo, hi]; -1 on anything else.
int cmd_parse_int(const char *s, long lo, long hi, int *out);

#endif
