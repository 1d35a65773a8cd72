// cmd/cmd_worker.c: `dserve both|prefill|decode --config FILE --name WORKER [--device D]`: load the config, check
// the worker's role and serve it until SIGTERM.
#include <stdio.h>
#include <string.h>

#include "cmd/cmds.h"
#include "config/config.h"
#include "ctl/secret.h"
#include "decode/worker.h"
#include "prefill/worker.h"
#include "util/log.h"

typedef int (*worker_fn)(const cfg_cluster *cfg, const cfg_worker *w, char *err, size_t errlen);

// Parses the arguments, loads the config, checks the worker's role and calls run. Returns the exit status.
static int worker_cmd(int argc, char **argv, cfg_role role, worker_fn run) {
  const char *config = NULL, *name = NULL, *device = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: dserve %s --config FILE --name WORKER [--device cpu|cuda:N]\n"
             "  serves worker WORKER of the cluster config FILE (its role there must be '%s') until SIGTERM, which\n"
             "  drains it (workers[].drain_timeout_s, default %d s). `dserve launch` starts it for you.\n"
             "  --config FILE    the cluster config (configs/README.md)\n"
             "  --name WORKER    the worker's name in workers[]\n"
             "  --device D       overrides the worker's \"device\" (default: the config's, else cpu)\n",
             argv[0], argv[0], CFG_DEF_DRAIN_TIMEOUT_S);
      return 0;
    }
    if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
    else if (!strcmp(argv[i], "--name") && i + 1 < argc) name = argv[++i];
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else {
      fprintf(stderr,
              "dserve %s: unknown argument '%s'\nusage: dserve %s --config FILE --name WORKER [--device cpu|cuda:N]\n",
              argv[0], argv[i], argv[0]);
      return 2;
    }
  }
  if (!config || !name) {
    fprintf(stderr, "usage: dserve %s --config FILE --name WORKER [--device cpu|cuda:N]\n", argv[0]);
    return 2;
  }
  char err[1024];
  cfg_cluster *cfg = NULL;
  if (cfg_load(config, &cfg, err, sizeof err)) {
    fprintf(stderr, "dserve %s: %s\n", argv[0], err);
    return 2;
  }
  utl_log_format_default(cfg->logging.format); // unless the environment said (a launcher's children inherit its)
  const cfg_worker *w = cfg_find_worker(cfg, name);
  int rc = 0;
  if (cfg_require_secret(cfg, err, sizeof err)) { // nothing listens without authentication
    fprintf(stderr, "dserve %s: %s\n", argv[0], err);
    rc = 2;
  } else if (w && device && cfg_set_device(cfg, name, device, err, sizeof err)) { // overrides the config's "device"
    fprintf(stderr, "dserve %s: --device: %s\n", argv[0], err);
    rc = 2;
  } else if (!w) {
    fprintf(stderr, "dserve %s: %s has no worker named '%s'\n", argv[0], config, name);
    rc = 2;
  } else if (w->role != role) {
    fprintf(stderr, "dserve %s: worker '%s' has role '%s' in %s\n", argv[0], name, cfg_role_name(w->role), config);
    rc = 2;
  } else if (run(cfg, w, err, sizeof err)) {
    fprintf(stderr, "dserve %s: %s\n", argv[0], err);
    rc = 1;
  }
  cfg_free(cfg);
  return rc;
}

int cmd_prefill(int argc, char **argv) { return worker_cmd(argc, argv, CFG_ROLE_PREFILL, pfl_worker_run); }
int cmd_both(int argc, char **argv) { return worker_cmd(argc, argv, CFG_ROLE_BOTH, dec_worker_run); }
int cmd_decode(int argc, char **argv) { return worker_cmd(argc, argv, CFG_ROLE_DECODE, dec_worker_run); }
