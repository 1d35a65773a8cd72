// config/secret.c: where a role finds its credentials: the cluster's shared secret (the config's secret_file, the
// environment, the inline "secret") and whether the config may start with it, and the router's api_keys_file.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "ctl/secret.h"

int cfg_resolve_secret(cfg_cluster *c, char *err, size_t errlen) {
  const char *cf = c->path[0] ? c->path : "config";
  const char *remote = c->remote_field[0] ? c->remote_field : NULL;
  char e[1200], why[400];
  if (c->secret_file[0] && c->secret[0]) {
    snprintf(err, errlen, "%s: secret: give either \"secret\" or \"secret_file\", not both", cf);
    return -1;
  }
  const char *env_file = getenv(CTL_SECRET_FILE_ENV), *env = getenv(CTL_SECRET_ENV_VAR);
  const char *where = NULL; // the file the secret came from, for messages
  if (c->secret_file[0]) {
    if (ctl_secret_read_file(c->secret_file, c->secret, sizeof c->secret, e, sizeof e)) {
      snprintf(err, errlen, "%s: secret_file: %s", cf, e);
      return -1;
    }
    c->secret_from = CTL_SECRET_CONFIG_FILE;
    where = c->secret_file;
  } else if (env_file && *env_file) {
    if (ctl_secret_read_file(env_file, c->secret, sizeof c->secret, e, sizeof e)) {
      snprintf(err, errlen, "%s: %s", CTL_SECRET_FILE_ENV, e);
      return -1;
    }
    c->secret_from = CTL_SECRET_ENV_FILE;
    where = env_file;
  } else if (env && *env) {
    if (strlen(env) >= sizeof c->secret) {
      snprintf(err, errlen, "%s: too long (at most %d bytes)", CTL_SECRET_ENV_VAR, CTL_SECRET_MAX_LEN);
      return -1;
    }
    snprintf(c->secret, sizeof c->secret, "%s", env);
    c->secret_from = CTL_SECRET_ENV;
  } else {
    c->secret_from = c->secret[0] ? CTL_SECRET_INLINE : CTL_SECRET_NONE;
  }
  if (c->secret_from == CTL_SECRET_NONE) {
    if (!remote) return 0;
    snprintf(err, errlen,
             "%s: %s is not a loopback address, so the cluster needs a shared secret from a file: set \"secret_file\" "
             "(or %s / %s in the environment) on every node; make one with "
             "head -c 32 /dev/urandom | xxd -p -c 64 > secret && chmod 600 secret",
             cf, remote, CTL_SECRET_FILE_ENV, CTL_SECRET_ENV_VAR);
    return -1;
  }
  if (remote && c->secret_from == CTL_SECRET_INLINE) {
    snprintf(err, errlen,
             "%s: secret: an inline secret is refused because %s is not a loopback address (a config file is copied "
             "and shown around): move it to a file named by \"secret_file\" (chmod 600) or to %s",
             cf, remote, CTL_SECRET_FILE_ENV);
    ctl_secret_wipe(c->secret, sizeof c->secret);
    return -1;
  }
  if (ctl_secret_check(c->secret, remote != NULL, why, sizeof why)) {
    const char *src = ctl_secret_from_name(c->secret_from);
    if (where) snprintf(err, errlen, "%s: %s (%s): refused: %s", cf, src, where, why);
    else snprintf(err, errlen, "%s: %s: refused: %s", cf, src, why);
    ctl_secret_wipe(c->secret, sizeof c->secret);
    c->secret_from = CTL_SECRET_NONE;
    return -1;
  }
  return 0;
}

int cfg_require_secret(const cfg_cluster *c, char *err, size_t errlen) {
  if (c && c->secret[0]) return 0;
  snprintf(err, errlen,
           "%s: no shared secret, and nothing listens without authentication: start the cluster with "
           "`dserve launch` (it makes a per-launch secret), or give one with \"secret_file\" in the config, %s or %s",
           c && c->path[0] ? c->path : "config", CTL_SECRET_FILE_ENV, CTL_SECRET_ENV_VAR);
  return -1;
}

int cfg_read_api_keys(cfg_cluster *c, char *err, size_t errlen) {
  cfg_router *r = &c->router;
  if (!r->api_keys_file[0]) return 0;
  FILE *f = fopen(r->api_keys_file, "r");
  if (!f) {
    snprintf(err, errlen, "%s: router.api_keys_file: cannot open %s: %s", c->path[0] ? c->path : "config",
             r->api_keys_file, strerror(errno));
    return -1;
  }
  char line[1024];
  int added = 0, rc = 0;
  while (!rc && fgets(line, sizeof line, f)) {
    char *s = line, *e = line + strlen(line);
    while (*s == ' ' || *s == '\t') s++;
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) *--e = 0;
    if (!*s || *s == '#') continue;
    char **grown = realloc(r->api_keys, (size_t)(r->n_api_keys + 1) * sizeof *grown);
    char *key = strdup(s);
    if (grown) r->api_keys = grown;
    if (!grown || !key) {
      free(key);
      snprintf(err, errlen, "out of memory");
      rc = -1;
      break;
    }
    r->api_keys[r->n_api_keys++] = key;
    added++;
  }
  ctl_secret_wipe(line, sizeof line);
  fclose(f);
  if (!rc && !added) {
    snprintf(err, errlen, "%s: router.api_keys_file: %s holds no key (one per line)", c->path[0] ? c->path : "config",
             r->api_keys_file);
    rc = -1;
  }
  return rc;
}
