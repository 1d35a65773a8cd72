// cmd/overrides.c: the llama-server-style flags of `dserve serve` and `dserve launch`: one table, each flag one
// config key (config/override.c applies them), so a flag means exactly what the key does in a config file.
#include "cmd/overrides.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum ovr_kind { OVR_INT, OVR_NUM, OVR_STR, OVR_PATH, OVR_APPEND } ovr_kind;

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
    {"--alias", "--served-model-name", "model_name", OVR_STR, "NAME", "model id in /v1/models (default: general.name)"},
    {"--chat-template", NULL, "chat_template", OVR_STR, "NAME", "chat template family (wins over the Jinja ones)"},
    {"--chat-template-file", NULL, "chat_template_file", OVR_PATH, "FILE", "Jinja chat template (default: the GGUF's)"},
    {"--threads", "-t", "workers.*.threads", OVR_INT, "N", "compute threads per worker (default: the CPUs)"},
    {"--ctx", "-c", "workers.*.kv_budget_tokens", OVR_INT, "N", "KV cache size in tokens, all sequences together"},
    {"--kv-budget-mb", NULL, "workers.*.kv_budget_mb", OVR_NUM, "MB", "KV cache size in MiB (default 256)"},
    {"--parallel", "-np", "workers.*.max_seqs", OVR_INT, "N", "sequences decoded together at most (default 64)"},
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
  if (*i + 1 >= argc) {
    fprintf(stderr, "%s: %s needs a value (%s)\n", prog, a, f->meta);
    return -1;
  }
  const char *v = argv[*i + 1];
  if ((f->kind == OVR_INT || f->kind == OVR_NUM) && !ovr_number(v, f->kind == OVR_INT)) {
    fprintf(stderr, "%s: %s: expected %s, got '%s'\n", prog, a, f->kind == OVR_INT ? "an integer" : "a number", v);
    return -1;
  }
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

void cmd_overrides_usage(FILE *f) {
  for (int k = 0; k < N_FLAGS; k++) {
    char names[64];
    snprintf(names, sizeof names, "%s%s%s %s", FLAGS[k].name, FLAGS[k].alias ? ", " : "",
             FLAGS[k].alias ? FLAGS[k].alias : "", FLAGS[k].meta);
    fprintf(f, "  %-34s %s [%s]\n", names, FLAGS[k].help, FLAGS[k].key);
  }
}
