// cmd/cmd_serve.c: `dserve serve MODEL.gguf [flags]`: one colocated worker and the router on this machine, no config
// file: the flags (cmd/overrides.c, llama-server's names) apply to a built-in single-node config, then it launches.
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cmd/cmds.h"
#include "cmd/model.h"
#include "cmd/overrides.h"
#include "config/config.h"
#include "launch/launch.h"
#include "models/null.h"

static void serve_usage(FILE *f) {
  fprintf(f,
          "usage: dserve serve MODEL.gguf [options]\n"
          "  serves MODEL on this machine: the OpenAI-compatible router (default http://127.0.0.1:8080) and one\n"
          "  colocated prefill+decode worker, supervised as `dserve launch` does; SIGTERM/SIGINT stop both.\n"
          "  No config file is needed; each option sets one key of the config it builds (shown in brackets; see\n"
          "  configs/README.md). --print-config prints that config instead of serving.\n"
          "options:\n"
          "  %-34s %s\n"
          "  %-34s %s\n"
          "  %-34s %s\n"
          "  %-34s %s\n",
          "-m, --model FILE", "the GGUF (or give it first, without -m); null: the null model (docs/design.md)",
          "--print-config", "print the config these options make, then exit", "--worker-port N",
          "the worker's control port (default: a free one) [workers[0].port]", "--kvstore redis://HOST:PORT",
          "share KV blocks through this Redis server [kvstore]");
  cmd_overrides_usage(f);
}

// Binds a loopback TCP port (0: any free one) and lets it go: the port it got, or -1 with errno (EADDRINUSE: another
// process listens there). SO_REUSEADDR as the worker's own listener, so a port in TIME_WAIT is not "in use".
static int probe_port(int want) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)want),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  int port = -1;
  if (!bind(fd, (struct sockaddr *)&a, sizeof a) && !listen(fd, 1) && !getsockname(fd, (struct sockaddr *)&a, &n))
    port = ntohs(a.sin_port);
  int saved = errno;
  close(fd);
  errno = saved;
  return port;
}

// --kvstore redis://HOST:PORT as the JSON of a "kvstore" section (out, cap); -1 when url is not of that form.
static int kvstore_json(const char *url, char *out, size_t cap) {
  const char *hp = strncmp(url, "redis://", 8) ? NULL : url + 8;
  if (!hp || !*hp || strpbrk(hp, "/\"\\@ ") || !strrchr(hp, ':') || strlen(hp) > 255) return -1;
  int n = snprintf(out, cap, "{\"type\": \"redis\", \"endpoints\": [\"%s\"]}", hp);
  return n > 0 && (size_t)n < cap ? 0 : -1; // the section's parser checks the host and port
}

int cmd_serve(int argc, char **argv) {
  cmd_overrides ov = CMD_OVERRIDES_INIT;
  char kvstore[320] = "";
  const char *model = NULL;
  int print_only = 0, wport = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int t = cmd_overrides_take(&ov, "dserve serve", argc, argv, &i);
    if (t < 0) return 2;
    if (t) continue;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      serve_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--print-config")) {
      print_only = 1;
    } else if (!strcmp(a, "--kvstore") && i + 1 < argc) {
      if (kvstore_json(argv[++i], kvstore, sizeof kvstore)) {
        fprintf(stderr, "dserve serve: --kvstore '%s': expected redis://HOST:PORT\n", argv[i]);
        return 2;
      }
    } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
      model = argv[++i];
    } else if (a[0] != '-' && !model) {
      model = a;
    } else if (!strcmp(a, "--worker-port") && i + 1 < argc) {
      if (cmd_parse_int(argv[++i], 1, 65535, &wport)) {
        fprintf(stderr, "dserve serve: --worker-port: expected a port in 1..65535, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(a, "--kvxfer-port")) { // a colocated worker has no kvxfer agent (decode/worker.c)
      fprintf(stderr, "dserve serve: --kvxfer-port: the serve worker prefills and decodes itself and moves no KV, so "
                      "it listens on no kvxfer port; a config's workers[].kvxfer.port fixes a prefill or decode "
                      "worker's (see dserve serve --help)\n");
      return 2;
    } else if (i + 1 >= argc && (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--worker-port"))) {
      fprintf(stderr, "dserve serve: %s needs a value (see dserve serve --help)\n", a);
      return 2;
    } else {
      cmd_overrides_refuse("dserve serve", a);
      return 2;
    }
  }
  if (!model) {
    fprintf(stderr, "dserve serve: no model: give the GGUF file, e.g. dserve serve models/weights/x.gguf\n");
    serve_usage(stderr);
    return 2;
  }
  char abs_model[PATH_MAX];
  if (mdl_is_null_path(model)) // asked for by name: the null model (a file called null is ./null)
    snprintf(abs_model, sizeof abs_model, "%s", model);
  else if (!realpath(model, abs_model) || access(abs_model, R_OK)) {
    fprintf(stderr, "dserve serve: %s: cannot read the model: %s\n", model, strerror(errno));
    return 2;
  }
  if (cmd_overrides_model_ctx(&ov, abs_model, "dserve serve") || cmd_overrides_finish(&ov, "dserve serve")) return 2;
  if (wport) { // a fixed port (a firewall's rule): one another process holds is an error now, not a restart loop
    if (probe_port(wport) != wport) {
      fprintf(stderr, "dserve serve: --worker-port %d: 127.0.0.1:%d %s\n", wport, wport,
              errno == EADDRINUSE ? "is in use by another process" : strerror(errno));
      return 2;
    }
  } else if ((wport = probe_port(0)) <= 0) {
    fprintf(stderr, "dserve serve: no free loopback port for the worker: %s\n", strerror(errno));
    return 2;
  }
  // the built-in single-node config; the model path is a JSON string: set it as an override, never pasted in
  char base[512];
  snprintf(base, sizeof base,
           "{\"nodes\": {\"local\": {\"host\": \"127.0.0.1\"}},"
           " \"router\": {\"node\": \"local\", \"host\": \"127.0.0.1\", \"port\": 8080},"
           " \"workers\": [{\"name\": \"w0\", \"node\": \"local\", \"role\": \"both\", \"host\": \"127.0.0.1\","
           " \"port\": %d}]}",
           wport);
  cfg_set sets[CMD_MAX_OVERRIDES + 2];
  sets[0] = (cfg_set){"model", abs_model, CFG_SET_STRING};
  memcpy(sets + 1, ov.sets, (size_t)ov.n * sizeof *sets);
  int n_sets = ov.n + 1;
  if (kvstore[0]) sets[n_sets++] = (cfg_set){"kvstore", kvstore, CFG_SET_JSON};
  char err[1024], *json = NULL;
  if (cfg_effective_json(NULL, base, sets, n_sets, &json, err, sizeof err)) {
    fprintf(stderr, "dserve serve: %s\n", err);
    return 2;
  }
  if (print_only) {
    printf("%s\n", json);
    free(json);
    return 0;
  }
  cfg_cluster *cfg = NULL;
  if (cfg_load_text(json, strlen(json), "dserve serve", &cfg, err, sizeof err)) {
    fprintf(stderr, "%s\n", err); // "dserve serve: workers[0].threads: ..." names the key the flag sets
    free(json);
    return 2;
  }
  lch_opts o;
  lch_defaults(&o);
  o.config_path = "dserve serve";
  o.config_json = json;
  o.node = "local";
  lch_grace_for_drain(&o, cfg);
  err[0] = 0;
  int rc = lch_run(cfg, &o, err, sizeof err);
  if (rc == 2 && err[0]) fprintf(stderr, "dserve serve: %s\n", err);
  cfg_free(cfg);
  free(json);
  return rc;
}
