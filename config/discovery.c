// config/discovery.c: the config's "discovery" section: the etcd endpoints, the cluster's name, the lease TTL and
// etcd's TLS and auth files (configs/README.md, "discovery").
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config/config.h"

static const char *const K_DISCOVERY[] = {"etcd", "cluster", "lease_ttl_s", "ca_file", "cert_file", "key_file",
                                          "user", "password_file", NULL};

static int fail(char *err, size_t errlen, const char *file, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(char *err, size_t errlen, const char *file, const char *field, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (err && errlen) snprintf(err, errlen, "%s: discovery.%s: %s", file && *file ? file : "config", field, msg);
  return -1;
}

// A string key into out (cap bytes); absent leaves out as it is. A file name is resolved against path's folder.
static int str_key(const cJSON *j, const char *key, int is_file, const char *path, const char *file, char *out,
                   size_t cap, char *err, size_t errlen) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v) return 0;
  if (!cJSON_IsString(v) || !v->valuestring[0]) return fail(err, errlen, file, key, "expected a non-empty string");
  const char *slash = is_file && path && v->valuestring[0] != '/' ? strrchr(path, '/') : NULL;
  int n = slash ? snprintf(out, cap, "%.*s/%s", (int)(slash - path), path, v->valuestring)
                : snprintf(out, cap, "%s", v->valuestring);
  if (n < 0 || (size_t)n >= cap) return fail(err, errlen, file, key, "too long (at most %zu bytes)", cap - 1);
  return 0;
}

// A cluster name is one path segment of the keys: letters, digits, '_', '.', '-'.
static int name_ok(const char *s) {
  if (!*s || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || strchr("_.-", *s)))
      return 0;
  return 1;
}

int cfg_parse_discovery(const cJSON *j, const char *path, const char *file, cfg_discovery *d, char *err,
                        size_t errlen) {
  memset(d, 0, sizeof *d);
  d->lease_ttl_s = CFG_DEF_LEASE_TTL_S;
  if (!cJSON_IsObject(j)) return fail(err, errlen, file, "", "expected an object");
  for (const cJSON *it = j->child; it; it = it->next) {
    int ok = 0;
    for (const char *const *k = K_DISCOVERY; *k; k++) ok |= !strcmp(*k, it->string);
    if (!ok)
      return fail(err, errlen, file, it->string,
                  "unknown key (allowed: etcd, cluster, lease_ttl_s, ca_file, cert_file, key_file, user, password_file)");
  }
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "etcd");
  if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) < 1 || cJSON_GetArraySize(e) > CFG_MAX_ETCD)
    return fail(err, errlen, file, "etcd", "expected an array of 1..%d endpoints (\"http://host:port\")", CFG_MAX_ETCD);
  for (const cJSON *it = e->child; it; it = it->next, d->n_etcd++) {
    char f[32];
    snprintf(f, sizeof f, "etcd[%d]", d->n_etcd);
    if (!cJSON_IsString(it) || (strncmp(it->valuestring, "http://", 7) && strncmp(it->valuestring, "https://", 8)))
      return fail(err, errlen, file, f, "expected \"http://host:port\" or \"https://host:port\"");
    if (strlen(it->valuestring) >= sizeof d->etcd[0]) return fail(err, errlen, file, f, "too long");
    snprintf(d->etcd[d->n_etcd], sizeof d->etcd[0], "%s", it->valuestring);
  }
  const cJSON *cl = cJSON_GetObjectItemCaseSensitive(j, "cluster");
  if (!cJSON_IsString(cl) || strlen(cl->valuestring) >= sizeof d->cluster || !name_ok(cl->valuestring))
    return fail(err, errlen, file, "cluster", "expected a name (1..63 of A-Z a-z 0-9 _ . -)");
  snprintf(d->cluster, sizeof d->cluster, "%s", cl->valuestring);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "lease_ttl_s");
  if (t && (!cJSON_IsNumber(t) || t->valuedouble != (int)t->valuedouble || t->valuedouble < 2 || t->valuedouble > 3600))
    return fail(err, errlen, file, "lease_ttl_s", "expected an integer 2..3600 (seconds)");
  if (t) d->lease_ttl_s = (int)t->valuedouble;
  if (str_key(j, "ca_file", 1, path, file, d->ca_file, sizeof d->ca_file, err, errlen) ||
      str_key(j, "cert_file", 1, path, file, d->cert_file, sizeof d->cert_file, err, errlen) ||
      str_key(j, "key_file", 1, path, file, d->key_file, sizeof d->key_file, err, errlen) ||
      str_key(j, "user", 0, path, file, d->user, sizeof d->user, err, errlen) ||
      str_key(j, "password_file", 1, path, file, d->password_file, sizeof d->password_file, err, errlen))
    return -1;
  if (!d->cert_file[0] != !d->key_file[0]) return fail(err, errlen, file, "cert_file", "cert_file and key_file go together");
  if (!d->user[0] != !d->password_file[0]) return fail(err, errlen, file, "user", "user and password_file go together");
  return 0;
}
