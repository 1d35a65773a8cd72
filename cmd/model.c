// cmd/model.c: the local model of `dserve generate` and `dserve perplexity` (see model.h).
#include "cmd/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "models/null.h"

int cmd_model_opts_ok(const char *cmd, const char *model, const char *kernels) {
  static const char *const known[] = {"auto", "scalar", "avx2", "avx2vnni", "avx512", "amx", "cuda"};
  size_t i = 0;
  while (i < sizeof known / sizeof known[0] && strcmp(kernels, known[i])) i++;
  if (i == sizeof known / sizeof known[0]) {
    fprintf(stderr, "dserve %s: unknown --kernels '%s' (" CMD_KERNELS ")\n", cmd, kernels);
    return -1;
  }
  if (!model) {
    fprintf(stderr, "dserve %s: --model is required\n", cmd);
    return -1;
  }
  return 0;
}

int cmd_model_load_flag(const char *a, cmd_model_load *lo) {
  if (!strcmp(a, "--f32-weights")) lo->f32_weights = 1;
  else if (!strcmp(a, "--f32-kv")) lo->f32_kv = 1;
  else return 0;
  return 1;
}

int cmd_model_kv_type(const char *v, cmd_model_load *lo) {
  int t = krn_kv_type_parse(v);
  if (t < 0) return -1;
  lo->kv_type = 1 + t;
  return 0;
}

void cmd_model_close(cmd_model *e) {
  if (e->kv.base) e->kc.be->free(&e->kc, e->kv.base);
  mdl_llama_free(e->m);
  if (e->kc_init && e->kc.be->ctx_fini) e->kc.be->ctx_fini(&e->kc);
  krn_pool_free(e->pool);
  mdl_gguf_close(e->g);
  memset(e, 0, sizeof *e);
}

int cmd_model_open(cmd_model *e, const char *model, const char *kernels, int threads, const cmd_model_load *lo,
                    char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  if (lo) e->lo = *lo;
  const krn_backend *be = NULL;
  if (!strcmp(kernels, "auto")) be = krn_cpu_best();
  else if (!strcmp(kernels, "cuda")) be = krn_cuda();
  else be = krn_cpu_by_name(kernels);
  if (!be) {
    snprintf(err, errlen, "kernels '%s' are not available on this machine (%s)", kernels, CMD_KERNELS);
    return -1;
  }
  mdl_null_opts no = {CFG_DEF_NULL_STEP_MS, CFG_DEF_NULL_PREFILL_US_PER_TOKEN, CFG_DEF_NULL_KV_BYTES_PER_TOKEN};
  if (mdl_model_open(model, &no, &e->g, err, errlen) != 0) return -1; // "null": the null model, its defaults
  e->pool = krn_pool_new(threads, err, errlen);
  if (!e->pool) goto fail;
  e->kc.be = be;
  e->kc.pool = e->pool;
  if (be->ctx_init) {
    if (be->ctx_init(&e->kc, 0, err, errlen) != 0) goto fail;
    e->kc_init = 1;
  }
  mdl_llama_opts mo = {.f32_weights = e->lo.f32_weights};
  if (mdl_llama_load_opts(e->g, &e->kc, &mo, &e->m, err, errlen) != 0) goto fail;
  e->cfg = mdl_llama_config(e->m);
  return 0;
fail:
  cmd_model_close(e);
  return -1;
}

int cmd_model_kv(cmd_model *e, int n_blocks, char *err, size_t errlen) {
  e->kv.type = e->lo.kv_type ? (krn_type)(e->lo.kv_type - 1) : e->lo.f32_kv ? KRN_F32 : KRN_F16;
  if (mdl_kv_type_check(e->cfg, e->kc.be, e->kv.type, err, errlen)) return -1;
  e->kv.block_size = CMD_KV_BLOCK;
  e->kv.n_blocks = n_blocks;
  size_t bytes = mdl_kv_block_bytes(e->cfg, e->kv.type, e->kv.block_size) * (size_t)n_blocks;
  e->kv.base = e->kc.be->alloc(&e->kc, bytes);
  if (!e->kv.base) {
    snprintf(err, errlen, "cannot allocate %zu bytes of KV cache", bytes);
    return -1;
  }
  return 0;
}

int cmd_parse_int(const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}
