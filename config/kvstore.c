// config/kvstore.c: the config's "kvstore" section: the shared KV block tier on Redis (configs/README.md, "kvstore").
#include <stdio.h>
#include <string.h>

#include "config/config_int.h"

static const char *const K_KVSTORE[] = {"type", "endpoints", "cluster", "password_file", "tls_ca", "tls_cert",
                                        "tls_key", "read_timeout_ms", "ttl_s", "write_queue_mb", NULL};
static const char *const S_TYPE[] = {"redis", NULL};

// "host:port" with a port 1..65535 and a host of letters, digits, '.', '-', '_' (an IPv6 address in brackets too).
static int endpoint_ok(const char *s) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s) return 0;
  for (const char *p = s; p < colon; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr(".-_[]:", *p)))
      return 0;
  long port = 0;
  const char *p = colon + 1;
  if (!*p) return 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9' || (port = port * 10 + (*p - '0')) > 65535) return 0;
  }
  return port >= 1;
}

// A file name resolved against the config file's folder (as every other *_file key).
static int file_key(cfg_ctx *x, const cJSON *j, const char *key, const char *path, char *out, size_t cap) {
  char v[1024] = "", field[64];
  snprintf(field, sizeof field, "kvstore.%s", key);
  if (cfg_str(x, j, "kvstore", key, v, sizeof v, "")) return -1;
  if (cfg_item(j, key) && !v[0]) return cfg_fail(x, field, "expected a non-empty file name");
  const char *slash = v[0] && v[0] != '/' && path ? strrchr(path, '/') : NULL;
  int n = slash ? snprintf(out, cap, "%.*s/%s", (int)(slash - path), path, v) : snprintf(out, cap, "%s", v);
  if (n < 0 || (size_t)n >= cap) return cfg_fail(x, field, "too long (at most %zu bytes)", cap - 1);
  return 0;
}

int cfg_parse_kvstore(cfg_ctx *x, const cJSON *j, const char *path, cfg_kvstore *k) {
  memset(k, 0, sizeof *k);
  if (!cJSON_IsObject(j)) return cfg_fail(x, "kvstore", "expected an object, got %s", cfg_type_name(j));
  if (cfg_check_keys(x, j, "kvstore", K_KVSTORE)) return -1;
  char type[256]; // wide enough that a wrong name is answered with the names allowed, not with its length
  if (cfg_str(x, j, "kvstore", "type", type, sizeof type, NULL) || cfg_one_of(x, "kvstore", "type", type, S_TYPE))
    return -1;
  memcpy(k->type, "redis", sizeof "redis"); // the one type S_TYPE allows
  const cJSON *e = cfg_item(j, "endpoints");
  if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) < 1 || cJSON_GetArraySize(e) > CFG_MAX_KVSTORE_ENDPOINTS)
    return cfg_fail(x, "kvstore.endpoints", "expected an array of 1..%d \"host:port\" (with cluster: seed nodes)",
                    CFG_MAX_KVSTORE_ENDPOINTS);
  for (const cJSON *it = e->child; it; it = it->next, k->n_endpoints++) {
    char f[48];
    snprintf(f, sizeof f, "kvstore.endpoints[%d]", k->n_endpoints);
    if (!cJSON_IsString(it) || strlen(it->valuestring) >= sizeof k->endpoints[0] || !endpoint_ok(it->valuestring))
      return cfg_fail(x, f, "expected \"host:port\" (port 1..65535)");
    snprintf(k->endpoints[k->n_endpoints], sizeof k->endpoints[0], "%s", it->valuestring);
  }
  if (cfg_bool(x, j, "kvstore", "cluster", &k->cluster, 0) ||
      file_key(x, j, "password_file", path, k->password_file, sizeof k->password_file) ||
      file_key(x, j, "tls_ca", path, k->tls_ca, sizeof k->tls_ca) ||
      file_key(x, j, "tls_cert", path, k->tls_cert, sizeof k->tls_cert) ||
      file_key(x, j, "tls_key", path, k->tls_key, sizeof k->tls_key) ||
      cfg_int32(x, j, "kvstore", "read_timeout_ms", &k->read_timeout_ms, 1, 10000, CFG_DEF_KVSTORE_READ_TIMEOUT_MS, 0) ||
      cfg_int32(x, j, "kvstore", "ttl_s", &k->ttl_s, 0, 365 * 86400, 0, 0) ||
      cfg_num(x, j, "kvstore", "write_queue_mb", &k->write_queue_mb, 0, 1, 65536, CFG_DEF_KVSTORE_WRITE_QUEUE_MB))
    return -1;
  if (!k->tls_cert[0] != !k->tls_key[0]) return cfg_fail(x, "kvstore.tls_cert", "tls_cert and tls_key go together");
  return 0;
}
