// worker/runtime.c: opens a worker's model, tokenizer, compute backend and KV block pool from its config.
#include "worker/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/null.h"

static const krn_backend *pick_backend(const cfg_worker *w, char *err, size_t errlen) {
  if (!strncmp(w->device, "cuda", 4)) {
    const krn_backend *be = krn_cuda();
    if (!be) snprintf(err, errlen, "device %s: this build has no CUDA backend", w->device);
    else if (krn_cuda_device_count() == 0) {
      snprintf(err, errlen, "device %s: no CUDA device present", w->device);
      be = NULL;
    }
    return be;
  }
  if (!w->kernels[0] || !strcmp(w->kernels, "auto")) return krn_cpu_best();
  const krn_backend *be = krn_cpu_by_name(w->kernels);
  if (!be) snprintf(err, errlen, "kernels '%s' are not supported on this CPU", w->kernels);
  return be;
}

int wrk_runtime_open(const cfg_cluster *cfg, const cfg_worker *w, int shareable_kv, wrk_runtime **out, char *err,
                     size_t errlen) {
  *out = NULL;
  wrk_runtime *rt = calloc(1, sizeof *rt);
  if (!rt) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  rt->cfg = cfg;
  rt->w_own = *w;
  cfg_worker_defaults(&rt->w_own);
  rt->w = w = &rt->w_own;
  char e[512] = "";
  const krn_backend *be = pick_backend(w, e, sizeof e);
  if (!be) goto fail;
  mdl_null_opts no = {w->null_step_ms, w->null_prefill_us_per_token, w->null_kv_bytes_per_token};
  if (mdl_model_open(cfg->model_path, cfg->model_null ? &no : NULL, &rt->gguf, e, sizeof e)) goto fail;
  if (mdl_tok_load(rt->gguf, &rt->tok, e, sizeof e)) goto fail;
  rt->pool = krn_pool_new(w->threads > 0 ? w->threads : 1, e, sizeof e);
  if (!rt->pool) goto fail;
  rt->kc.be = be;
  rt->kc.pool = rt->pool;
  if (be->ctx_init) {
    int dev = 0;
    if (!strncmp(w->device, "cuda:", 5)) dev = atoi(w->device + 5);
    if (be->ctx_init(&rt->kc, dev, e, sizeof e)) goto fail;
  }
  if (mdl_llama_load(rt->gguf, &rt->kc, &rt->model, e, sizeof e)) goto fail;
  if (!strcmp(w->cuda_graphs, "on") && mdl_llama_set_graphs(rt->model, 1, e, sizeof e)) goto fail;
  const mdl_llama_cfg *mc = mdl_llama_config(rt->model);
  rt->n_ctx = mc->n_ctx_train > 0 ? mc->n_ctx_train : 2048;
  // config max_model_len (`dserve serve -c`): each request's bound, never past the training context (the router caps
  // it the same way and says so)
  if (cfg->max_model_len > 0 && cfg->max_model_len < rt->n_ctx) rt->n_ctx = cfg->max_model_len;
  // LongRoPE (phi3) picks its factors by the sequence context, as llama.cpp does by n_ctx_seq
  if (rt->n_ctx == cfg->max_model_len && mdl_llama_set_ctx(rt->model, rt->n_ctx, e, sizeof e)) goto fail;
  kv_pool_opts ko = {
      .budget_bytes = (size_t)(w->kv_budget_mb * 1024.0 * 1024.0),
      .type = (krn_type)krn_kv_type_parse(w->kv_type), // config checked the name: f16, f32 or q8_0
      .block_size = w->block_size,
      .shareable = shareable_kv,
      .unread = cfg->model_null, // the null model never reads its KV: moved pages need not stay resident
  };
  if (w->kv_budget_tokens > 0) // sized in tokens (llama-server's -c): whole blocks of every layer group
    ko.budget_bytes = (size_t)((w->kv_budget_tokens + w->block_size - 1) / w->block_size) *
                      mdl_kv_block_bytes(mc, ko.type, w->block_size);
  if (kv_pool_new(mc, &rt->kc, &ko, &rt->kv, e, sizeof e)) goto fail;
  // A max_model_len the config asks for that this pool cannot hold one request of would admit such a request and then
  // refuse it (or leave it waiting forever): said now, naming both. Without max_model_len (the model's context) a
  // pool smaller than the context is the ordinary case: longer requests are refused one by one.
  int need = kv_pool_blocks_needed(rt->kv, rt->n_ctx, w->max_batch_tokens), have = kv_pool_total_blocks(rt->kv);
  if (cfg->max_model_len > 0 && need > have) {
    char pool[64];
    if (w->kv_budget_tokens > 0) snprintf(pool, sizeof pool, "kv_budget_tokens %d", w->kv_budget_tokens);
    else snprintf(pool, sizeof pool, "kv_budget_mb %g", w->kv_budget_mb);
    snprintf(e, sizeof e,
             "max_model_len %d needs %d KV blocks of %d tokens for one request, but the pool of %s holds %d (%d "
             "tokens): raise %s or lower max_model_len",
             rt->n_ctx, need, w->block_size, pool, have, have * w->block_size,
             w->kv_budget_tokens > 0 ? "kv_budget_tokens" : "kv_budget_mb");
    goto fail;
  }
  *out = rt;
  return 0;
fail:
  snprintf(err, errlen, "worker %s: %s", w->name, e);
  wrk_runtime_close(rt);
  return -1;
}

void wrk_runtime_close(wrk_runtime *rt) {
  if (!rt) return;
  kv_pool_free(rt->kv);
  mdl_llama_free(rt->model);
  if (rt->kc.be && rt->kc.be->ctx_fini && rt->kc.dev) rt->kc.be->ctx_fini(&rt->kc);
  krn_pool_free(rt->pool);
  mdl_tok_free(rt->tok);
  mdl_gguf_close(rt->gguf);
  free(rt);
}
