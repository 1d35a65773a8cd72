// cmd/cmd_router.c: `dserve router --config FILE`: serves the router section of a cluster config until SIGTERM.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cmd/cmds.h"
#include "config/config.h"
#include "ctl/secret.h"
#include "models/gguf.h"
#include "models/null.h"
#include "models/tokenizer.h"
#include "router/router.h"
#include "util/log.h"

// The model's context length from `{general.architecture}.context_length`. 0, or -1 with err.
static int context_length(const mdl_gguf *g, int *out, char *err, size_t errlen) {
  mdl_str arch;
  if (mdl_gguf_get_str(g, "general.architecture", &arch) < 0) {
    snprintf(err, errlen, "the GGUF has no general.architecture");
    return -1;
  }
  char key[160];
  snprintf(key, sizeof key, "%.*s.context_length", (int)(arch.n > 100 ? 100 : arch.n), arch.p);
  int64_t v;
  if (mdl_gguf_get_i64(g, key, &v) < 0 || v <= 1 || v > (1 << 24)) {
    snprintf(err, errlen, "the GGUF has no usable %s", key);
    return -1;
  }
  *out = (int)v;
  return 0;
}

int cmd_router(int argc, char **argv) {
  const char *config = NULL, *node = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: dserve router --config FILE [--node NAME]\n"
             "  serves the OpenAI-compatible HTTP API of the cluster config FILE's \"router\" section (default\n"
             "  http://127.0.0.1:%d) until SIGTERM, which drains it (router.drain_timeout_s, default %d s).\n"
             "  `dserve launch` starts it for you.\n"
             "  --config FILE    the cluster config (configs/README.md)\n"
             "  --node NAME      refuse to start unless router.node is NAME (a check for hand-started nodes)\n",
             CFG_DEF_ROUTER_PORT, CFG_DEF_DRAIN_TIMEOUT_S);
      return 0;
    }
    if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
    else if (!strcmp(argv[i], "--node") && i + 1 < argc) node = argv[++i];
    else {
      fprintf(stderr, "dserve router: unknown or incomplete option '%s'\nusage: dserve router --config FILE [--node NAME]\n", argv[i]);
      return 2;
    }
  }
  if (!config) {
    fprintf(stderr, "usage: dserve router --config FILE [--node NAME]\n");
    return 2;
  }
  char err[512];
  cfg_cluster *cfg = NULL;
  if (cfg_load(config, &cfg, err, sizeof err) < 0) {
    fprintf(stderr, "dserve router: %s\n", err);
    return 2;
  }
  utl_log_format_default(cfg->logging.format); // unless the environment said (a launcher's children inherit its)
  if (cfg_require_secret(cfg, err, sizeof err)) {
    fprintf(stderr, "dserve router: %s\n", err);
    cfg_free(cfg);
    return 2;
  }
  if (node && strcmp(node, cfg->router.node)) {
    fprintf(stderr, "dserve router: --node %s: %s puts the router on node \"%s\"\n", node, config, cfg->router.node);
    cfg_free(cfg);
    return 2;
  }
  if (!cfg->has_router) {
    fprintf(stderr, "dserve router: %s has no router section\n", config);
    cfg_free(cfg);
    return 2;
  }
  mdl_gguf *g = NULL;
  mdl_tok *tok = NULL;
  int n_ctx = 0, rc = 1;
  rtr_server *s = NULL;
  if (mdl_model_open(cfg->model_path, NULL, &g, err, sizeof err) < 0 || mdl_tok_load(g, &tok, err, sizeof err) < 0 ||
      context_length(g, &n_ctx, err, sizeof err) < 0) {
    fprintf(stderr, "dserve router: %s: %s\n", cfg->model_path, err);
    goto out;
  }
  // the id: the config's model_name (--alias), else the file's name without .gguf (llama-server names it by its
  // path; general.name is often a title with spaces that no client would type)
  char name[128];
  snprintf(name, sizeof name, "%s", cfg->model_name);
  if (!name[0]) {
    const char *base = strrchr(cfg->model_path, '/');
    base = base ? base + 1 : cfg->model_path;
    size_t n = strlen(base);
    if (n > 5 && !strcasecmp(base + n - 5, ".gguf")) n -= 5;
    snprintf(name, sizeof name, "%.*s", (int)(n > 120 ? 120 : n), base);
  }
  if (!name[0]) snprintf(name, sizeof name, "model");
  if (cfg->max_model_len > n_ctx)
    utl_log("router", "max_model_len %d exceeds the model's training context (%d): capped to %d, as llama-server does",
            cfg->max_model_len, n_ctx, n_ctx);
  else if (cfg->max_model_len > 0)
    n_ctx = cfg->max_model_len;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL); // every thread started below inherits the mask; sigwait takes them
  signal(SIGPIPE, SIG_IGN);
  rtr_server_opts o = {.cfg = cfg, .gguf = g, .tok = tok, .n_ctx = n_ctx, .model_name = name};
  // Answers of a few MB (n 64 with top_logprobs: ~12 MB of JSON, copied once more by libmicrohttpd) are mmapped and
  // go back to the system when freed: glibc would otherwise raise its mmap threshold to their size after the first
  // one and keep every later one in the heap of whichever connection thread made it.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  if (rtr_server_new(&o, &s, err, sizeof err) < 0) {
    fprintf(stderr, "dserve router: %s\n", err);
    goto out;
  }
  utl_log("router", "serving %s (context %d) on http://%s:%d with %d worker(s)", name, n_ctx,
          cfg->router.host[0] ? cfg->router.host : "127.0.0.1", rtr_server_port(s), cfg->n_workers);
  int sig = 0;
  sigwait(&set, &sig);
  utl_log("router", "signal %d: draining (new requests get 503; at most %d s for running ones)", sig,
          cfg->router.drain_timeout_s);
  int left = rtr_server_drain(s, cfg->router.drain_timeout_s * 1000);
  if (left) utl_log("router", "drain bound reached: failed %d running request(s)", left);
  utl_log("router", "stopping");
  rc = 0;
out:
  rtr_server_free(s);
  mdl_tok_free(tok);
  mdl_gguf_close(g);
  cfg_free(cfg);
  return rc;
}
