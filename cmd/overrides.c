// cmd/overrides.c: the llama-server-style flags of `dserve serve` and `dserve launch`: one table, each flag one
// config key (config/override.c applies them), so a flag means exactly what the key does in a config file.
#include "cmd/overrides.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/gguf.h"
#include "models/null.h"

// OVR_CTX and OVR_UNIFIED set no key themselves: cmd_overrides_finish turns -c, -np and --kv-unified into two.
typedef enum ovr_kind { OVR_INT, OVR_NUM, OVR_STR, OVR_PATH, OVR_APPEND, OVR_CTX, OVR_UNIFIED } ovr_kind;

typedef struct ovr_flag {
  const char *name;  // --long
  const char *alias; // llama-server's short or other spelling (NULL = none)
  const char *key;   // config key (config/override.c syntax)
  ovr_kind kind;
  const char *meta;  // the value's name in --help
  const char *help;  // with the default
} ovr_flag;

static const ovr_flag FLAGS[] = {
    {"--host", NULL, "router.host", OVR_STR, "ADDR", "HTTP bind address (default 127.0.0.1)"},
    {"--port", NULL, "router.port", OVR_INT, "N", "HTTP port (serve: 8080; launch: the config's)"},
    {"--api-key", NULL, "router.api_keys", OVR_APPEND, "KEY", "accept this API key (repeatable; default: none)"},
    {"--api-key-file", NULL, "router.api_keys_file", OVR_PATH, "FILE", "API keys, one per line (safer than --api-key)"},
    {"--alias", "--served-model-name", "model_name", OVR_STR, "NAME", "model id in /v1/models (default: the file name)"},
    {"--chat-template", NULL, "chat_template", OVR_STR, "NAME", "chat template family (wins over the Jinja ones)"},
    {"--chat-template-file", NULL, "chat_template_file", OVR_PATH, "FILE", "Jinja chat template (default: the GGUF's)"},
    {"--threads", "-t", "workers.*.threads", OVR_INT, "N", "compute threads per worker (default: the CPUs)"},
    {"--ctx-size", "-c", "max_model_len, workers.*.kv_budget_tokens", OVR_CTX, "N",
     "context: per sequence with -np, all of it with --kv-unified"},
    {"--ctx", NULL, "max_model_len, workers.*.kv_budget_tokens", OVR_CTX, "N", "the same as --ctx-size"},
    {"--kv-unified", "-kvu", "max_model_len", OVR_UNIFIED, "",
     "a sequence may use the whole context (default without -np)"},
    {"--no-kv-unified", "-no-kvu", "max_model_len", OVR_UNIFIED, "", "-c split among the -np slots (default with -np)"},
    {"--kv-budget-mb", NULL, "workers.*.kv_budget_mb", OVR_NUM, "MB", "KV cache size in MiB (default 256)"},
    {"--parallel", "-np", "workers.*.max_seqs", OVR_INT, "N",
     "sequences decoded together at most (default 64); the context's slots"},
    {"--batch-size", "-b", "workers.*.max_batch_tokens", OVR_INT, "N", "tokens per forward step at most (default 512)"},
    {"--kv-type", NULL, "workers.*.kv_type", OVR_STR, "T", "KV cache element type (default f16)"},
    {"--device", NULL, "workers.*.device", OVR_STR, "D", "cpu, cuda or cuda:N (default cpu)"},
    {"--kernels", NULL, "workers.*.kernels", OVR_STR, "K", "CPU kernels: auto, scalar, avx2, avx2vnni, avx512, amx"},
    {"--spec", NULL, "workers.*.spec", OVR_STR, "MODE", "speculative decoding: auto (default) or off"},
    {"--prefix-cache-mb", NULL, "workers.*.prefix_cache_mb", OVR_NUM, "MB", "KV kept for prefix reuse (default: half)"},
    {"--temp", NULL, "sampling.temperature", OVR_NUM, "T", "default temperature (default: GGUF's, else 0.8)"},
    {"--top-k", NULL, "sampling.top_k", OVR_INT, "K", "default top_k (default: GGUF's, else 40)"},
    {"--top-p", NULL, "sampling.top_p", OVR_NUM, "P", "default top_p (default: GGUF's, else 0.95)"},
    {"--min-p", NULL, "sampling.min_p", OVR_NUM, "P", "default min_p (default: GGUF's, else 0.05)"},
    {"--repeat-penalty", NULL, "sampling.repetition_penalty", OVR_NUM, "R", "default repetition penalty (1 = off)"},
    {"--max-tokens-limit", NULL, "router.max_tokens_limit", OVR_INT, "N", "largest max_tokens accepted"},
    {"--timeout", NULL, "router.request_timeout_ms", OVR_INT, "MS", "a request's deadline (default 600000)"},
    {"--log-format", NULL, "logging.format", OVR_STR, "F", "every role's log: text or json (JSON lines)"},
};
enum { N_FLAGS = sizeof FLAGS / sizeof FLAGS[0] };

static int ovr_number(const char *v, int integer) {
  char *end = NULL;
  errno = 0;
  if (integer) (void)strtoll(v, &end, 10);
  else (void)strtod(v, &end);
  return *v && end && !*end && !errno;
}

int cmd_overrides_take(cmd_overrides *o, const char *prog, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  const ovr_flag *f = NULL;
  for (int k = 0; k < N_FLAGS && !f; k++)
    if (!strcmp(a, FLAGS[k].name) || (FLAGS[k].alias && !strcmp(a, FLAGS[k].alias))) f = &FLAGS[k];
  if (!f) return 0;
  if (f->kind == OVR_UNIFIED) {
    o->unified = strncmp(f->name, "--no", 4) ? 1 : 0;
    return 1;
  }
  if (*i + 1 >= argc) {
    fprintf(stderr, "%s: %s needs a value (%s)\n", prog, a, f->meta);
    return -1;
  }
  const char *v = argv[*i + 1];
  if ((f->kind == OVR_INT || f->kind == OVR_NUM || f->kind == OVR_CTX) && !ovr_number(v, f->kind != OVR_NUM)) {
    fprintf(stderr, "%s: %s: expected %s, got '%s'\n", prog, a, f->kind == OVR_NUM ? "a number" : "an integer", v);
    return -1;
  }
  if (f->kind == OVR_CTX) {
    long long c = strtoll(v, NULL, 10);
    if (c < 0 || c > (1 << 24)) {
      fprintf(stderr, "%s: %s: %s is not a context in tokens (0: the model's; at most %d)\n", prog, a, v, 1 << 24);
      return -1;
    }
    o->ctx = (int)c;
    *i += 1;
    return 1;
  }
  if (!strcmp(f->key, "workers.*.max_seqs")) o->np = (int)strtoll(v, NULL, 10);
  if (!*v && f->kind != OVR_INT && f->kind != OVR_NUM) {
    fprintf(stderr, "%s: %s: must not be empty\n", prog, a);
    return -1;
  }
  if (o->n >= CMD_MAX_OVERRIDES) {
    fprintf(stderr, "%s: more than %d overrides\n", prog, CMD_MAX_OVERRIDES);
    return -1;
  }
  if (f->kind == OVR_PATH && v[0] != '/') { // a path on the command line is relative to the working directory
    if (o->n_paths >= (int)(sizeof o->paths / sizeof o->paths[0])) {
      fprintf(stderr, "%s: too many path flags\n", prog);
      return -1;
    }
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
      fprintf(stderr, "%s: %s: cannot read the working directory: %s\n", prog, a, strerror(errno));
      return -1;
    }
    char *p = o->paths[o->n_paths];
    if (snprintf(p, sizeof o->paths[0], "%s/%s", cwd, v) >= (int)sizeof o->paths[0]) {
      fprintf(stderr, "%s: %s: path too long\n", prog, a);
      return -1;
    }
    o->n_paths++;
    v = p;
  }
  o->sets[o->n++] = (cfg_set){f->key, v, f->kind == OVR_APPEND ? CFG_SET_APPEND : f->kind == OVR_INT ||
                                                  f->kind == OVR_NUM ? CFG_SET_JSON : CFG_SET_STRING};
  *i += 1;
  return 1;
}

// llama-server's padding of a context (cparams.n_ctx, and each slot's share): up to a multiple of 256 tokens.
static long long ovr_pad256(long long n) { return (n + 255) / 256 * 256; }

int cmd_overrides_model_ctx(cmd_overrides *o, const char *model, const char *prog) {
  if (o->ctx > 0 || o->np <= 0 || o->unified == 1) return 0; // -c given, or nothing to split
  if (mdl_is_null_path(model)) {
    o->ctx = MDL_NULL_CTX;
    return 0;
  }
  mdl_gguf *g = NULL;
  char err[256];
  if (mdl_gguf_open(model, &g, err, sizeof err)) {
    fprintf(stderr, "%s: %s: %s\n", prog, model, err);
    return -1;
  }
  mdl_str arch = {0};
  int64_t n = 0;
  char key[160];
  if (mdl_gguf_get_str(g, "general.architecture", &arch) == 0 && arch.n < 100) {
    snprintf(key, sizeof key, "%.*s.context_length", (int)arch.n, arch.p);
    if (mdl_gguf_get_i64(g, key, &n)) n = 0;
  }
  mdl_gguf_close(g);
  o->ctx = n > 0 && n <= (1 << 30) ? (int)n : 2048; // the worker's fallback for a GGUF without it (worker/runtime.c)
  return 0;
}

int cmd_overrides_finish(cmd_overrides *o, const char *prog) {
  if (o->ctx <= 0) return 0; // no -c, or -c 0: the model's context; the pool stays kv_budget_mb's
  // As llama-server: -c is the KV cache in tokens (padded to 256). With a unified cache (--kv-unified, or -np not
  // given: llama-server's auto slots) one request may use all of it; otherwise each of the -np slots gets c / np
  // (padded to 256) and the pool is that times np.
  int unified = o->unified >= 0 ? o->unified : o->np <= 0;
  long long pool = ovr_pad256(o->ctx), bound = pool;
  if (!unified && o->np > 0) {
    bound = ovr_pad256(pool / o->np);
    pool = bound * o->np;
  }
  if (pool > (1 << 30)) {
    fprintf(stderr, "%s: -c %d with -np %d: a KV pool of %lld tokens is too large\n", prog, o->ctx, o->np, pool);
    return -1;
  }
  if (o->n + 2 > CMD_MAX_OVERRIDES) {
    fprintf(stderr, "%s: more than %d overrides\n", prog, CMD_MAX_OVERRIDES);
    return -1;
  }
  snprintf(o->nums[0], sizeof o->nums[0], "%lld", pool);
  snprintf(o->nums[1], sizeof o->nums[1], "%lld", bound);
  o->sets[o->n++] = (cfg_set){"workers.*.kv_budget_tokens", o->nums[0], CFG_SET_JSON};
  o->sets[o->n++] = (cfg_set){"max_model_len", o->nums[1], CFG_SET_JSON};
  return 0;
}

// llama-server flags dserve does not take, each with what to do instead (one line, never the usage).
static const struct {
  const char *names[4];
  const char *hint;
} HINTS[] = {
    {{"-ngl", "--n-gpu-layers", "--gpu-layers"},
     "dserve has no layer offload: --device cuda puts the whole model on the GPU"},
    {{"-sm", "--split-mode", "-ts", "--tensor-split"}, "one worker uses one GPU: --device cuda:N picks it"},
    {{"-mg", "--main-gpu", "-dev"}, "one worker uses one GPU: --device cuda:N picks it"},
    {{"--jinja", "--no-jinja"}, "chats render with the GGUF's Jinja template by default: --chat-template-file F for "
                                "another, --chat-template NAME for a built-in family"},
    {{"-fa", "--flash-attn", "--no-flash-attn"}, "flash attention is always on"},
    {{"--mlock", "--no-mmap", "--mmap"}, "the GGUF is always memory-mapped and never locked"},
    {{"-ctk", "--cache-type-k", "-ctv", "--cache-type-v"}, "--kv-type T sets the K and V cache types together"},
    {{"-cb", "--cont-batching", "-nocb", "--no-cont-batching"}, "continuous batching is always on"},
    {{"-ub", "--ubatch-size"}, "dserve has one batch size: -b/--batch-size"},
    {{"-tb", "--threads-batch"}, "one thread count for prompt and generation: -t/--threads"},
    {{"-a"}, "the model's id is --alias NAME"},
    {{"-n", "--n-predict", "--predict"}, "a request's max_tokens bounds it; --max-tokens-limit N caps it"},
    {{"--metrics"}, "GET /metrics is always on"},
    {{"--cache-reuse", "--swa-full"}, "prefix reuse is on by default: --prefix-cache-mb MB sizes it"},
    {{"-md", "--model-draft", "--draft-max", "--draft"}, "speculative decoding needs no draft model: on by default, "
                                                          "--spec off turns it off"},
    {{"-hf", "--hf-repo", "-hfr", "--hf-file"}, "dserve downloads nothing: give the path of a local GGUF"},
    {{"-to"}, "--timeout MS is a request's whole deadline, in milliseconds"},
    {{"--lora", "--lora-scaled"}, "LoRA adapters are not supported"},
    {{"--slots", "--props", "--no-webui", "--path"}, "dserve serves the OpenAI API only (docs/openai.md)"},
    {{"--rope-scaling", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx"}, "RoPE settings are the GGUF's"},
    {{"--numa"}, "dserve has no NUMA options"},
    {{"-s", "--seed"}, "a request's seed field sets it (docs/openai.md)"},
    {{"--embedding", "--embeddings", "--pooling"}, "/v1/embeddings is always served, pooled as the GGUF's pooling_type "
                                                   "says (mean without it; docs/openai.md)"},
};

void cmd_overrides_refuse(const char *prog, const char *a) {
  for (size_t k = 0; k < sizeof HINTS / sizeof HINTS[0]; k++)
    for (int j = 0; j < 4 && HINTS[k].names[j]; j++)
      if (!strcmp(a, HINTS[k].names[j])) {
        fprintf(stderr, "%s: %s: %s (see %s --help)\n", prog, a, HINTS[k].hint, prog);
        return;
      }
  fprintf(stderr, "%s: unknown option '%s' (see %s --help)\n", prog, a, prog);
}

void cmd_overrides_usage(FILE *f) {
  for (int k = 0; k < N_FLAGS; k++) {
    char names[64];
    snprintf(names, sizeof names, "%s%s%s%s%s", FLAGS[k].name, FLAGS[k].alias ? ", " : "",
             FLAGS[k].alias ? FLAGS[k].alias : "", FLAGS[k].meta[0] ? " " : "", FLAGS[k].meta);
    fprintf(f, "  %-34s %s [%s]\n", names, FLAGS[k].help, FLAGS[k].key);
  }
}
