// worker/runtime.h: what every worker loads from its config: model file, tokenizer, weights, kernels, KV pool.
#ifndef DSERVE_WRK_RUNTIME_H
#define DSERVE_WRK_RUNTIME_H

#include <stddef.h>

#include "config/config.h"
#include "kernels/krn.h"
#include "kv/pool.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "models/tokenizer.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wrk_runtime {
  const cfg_cluster *cfg;       // (borrowed)
  const cfg_worker *w;          // = &w_own
  cfg_worker w_own;             // this worker's section with cfg_worker_defaults applied
  mdl_gguf *gguf;              // (owned)
  mdl_tok *tok;                // (owned)
  krn_pool *pool;              // (owned) compute threads
  krn_ctx kc;                  // backend and its state
  mdl_llama *model;            // (owned)
  kv_pool *kv;              // (owned)
  int n_ctx;                   // context length served
} wrk_runtime;

// Loads everything worker w needs; shareable_kv puts the pool in memory a same-host peer may map.
int wrk_runtime_open(const cfg_cluster *cfg, const cfg_worker *w, int shareable_kv, wrk_runtime **out, char *err,
                     size_t errlen) UTL_WARN_UNUSED;
void wrk_runtime_close(wrk_runtime *rt);

#ifdef __cplusplus
}
#endif
#endif
