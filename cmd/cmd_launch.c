// cmd/cmd_launch.c: `dserve launch --config F --node N`: load the cluster config and supervise this node's roles.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmds.h"
#include "cmd/overrides.h"
#include "config/config.h"
#include "launch/launch.h"

static void launch_usage(FILE *f) {
  fprintf(f,
          "usage: dserve launch --config FILE --node NAME [--dserve PATH] [--grace-s S] [--backoff-ms MS]\n"
          "  starts the router and workers FILE assigns to node NAME, waits for their health, restarts a crashed\n"
          "  one with back-off (at most 5 restarts a minute), stops all on SIGTERM/SIGINT.\n"
          "  --dserve PATH    binary the children run (default: this one)\n"
          "  --grace-s S      seconds between SIGTERM and SIGKILL when stopping (default 10, or the router's drain_timeout_s + 5)\n"
          "  --backoff-ms MS  first restart delay, doubled per restart (default 250)\n"
          "  --print-config   print the config with the options below applied, then exit\n"
          "overrides (each sets one config key, in brackets, on top of FILE; '*' = every worker):\n");
  cmd_overrides_usage(f);
}

static int launch_num(const char *flag, const char *v, double lo, double hi, double *out) {
  char *end = NULL;
  double d = v ? strtod(v, &end) : 0;
  if (!v || !*v || *end || !(d >= lo && d <= hi)) {
    fprintf(stderr, "dserve launch: %s: expected a number %g..%g\n", flag, lo, hi);
    return -1;
  }
  *out = d;
  return 0;
}

int cmd_launch(int argc, char **argv) {
  lch_opts o;
  lch_defaults(&o);
  int grace_given = 0, print_only = 0;
  cmd_overrides ov = CMD_OVERRIDES_INIT;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    double d;
    int t = cmd_overrides_take(&ov, "dserve launch", argc, argv, &i);
    if (t < 0) return 2;
    if (t) continue;
    if (!strcmp(a, "--print-config")) {
      print_only = 1;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      launch_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--config") && v) {
      o.config_path = v, i++;
    } else if (!strcmp(a, "--node") && v) {
      o.node = v, i++;
    } else if (!strcmp(a, "--dserve") && v) {
      o.dserve = v, i++;
    } else if (!strcmp(a, "--grace-s")) {
      if (launch_num(a, v, 0, 3600, &d)) return 2;
      o.grace_ms = (int)(d * 1000), i++;
      grace_given = 1;
    } else if (!strcmp(a, "--backoff-ms")) {
      if (launch_num(a, v, 1, 60000, &d)) return 2;
      o.backoff_ms = (int)d, i++;
    } else if (!v && (!strcmp(a, "--config") || !strcmp(a, "--node") || !strcmp(a, "--dserve"))) {
      fprintf(stderr, "dserve launch: %s needs a value (see dserve launch --help)\n", a);
      return 2;
    } else {
      cmd_overrides_refuse("dserve launch", a);
      return 2;
    }
  }
  if (!o.config_path || (!o.node && !print_only)) {
    fprintf(stderr, "dserve launch: --config and --node are required\n");
    launch_usage(stderr);
    return 2;
  }
  cfg_cluster *cfg = NULL;
  char err[1024], *json = NULL;
  if (!ov.ctx && ov.np > 0 && ov.unified != 1) { // -np without -c: the config's model's context, split (serve's rule)
    if (cfg_load(o.config_path, &cfg, err, sizeof err)) {
      fprintf(stderr, "dserve launch: %s\n", err);
      return 2;
    }
    int bad = cmd_overrides_model_ctx(&ov, cfg->model_null ? "null" : cfg->model_path, "dserve launch");
    cfg_free(cfg);
    cfg = NULL;
    if (bad) return 2;
  }
  if (cmd_overrides_finish(&ov, "dserve launch")) return 2;
  // with overrides the children read the effective config, relative paths made absolute (cfg_effective_json)
  if ((ov.n || print_only) && cfg_effective_json(o.config_path, NULL, ov.sets, ov.n, &json, err, sizeof err)) {
    fprintf(stderr, "dserve launch: %s\n", err);
    return 2;
  }
  if (print_only) {
    printf("%s\n", json);
    free(json);
    return 0;
  }
  o.config_json = json;
  if (json ? cfg_load_text(json, strlen(json), o.config_path, &cfg, err, sizeof err)
           : cfg_load(o.config_path, &cfg, err, sizeof err)) {
    fprintf(stderr, "dserve launch: %s\n", err);
    free(json);
    return 2;
  }
  if (!cfg->model_null && access(cfg->model_path, R_OK))
    fprintf(stderr, "dserve launch: warning: model %s is not readable here (%s); its workers will fail to start\n",
            cfg->model_path, strerror(errno));
  // by default the router gets its whole drain (router.drain_timeout_s) plus 5 s before it is killed
  if (!grace_given) lch_grace_for_drain(&o, cfg);
  err[0] = 0;
  int rc = lch_run(cfg, &o, err, sizeof err);
  if (rc == 2 && err[0]) fprintf(stderr, "dserve launch: %s\n", err);
  cfg_free(cfg);
  free(json);
  return rc;
}
