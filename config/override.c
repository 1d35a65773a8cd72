// config/override.c: a config with command-line overrides applied (dserve serve / launch flags), as JSON text that
// means the same from any folder: every relative path in it is made absolute against the file's folder.
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "config/config_int.h"
#include "util/json.h"

// The keys whose string values are paths (resolved against the config file's folder, as cfg_parse does).
static const char *const PATH_KEYS[] = {"model", "secret_file", "router.api_keys_file", "workers.*.prefix_disk_path",
                                        "discovery.ca_file", "discovery.cert_file", "discovery.key_file",
                                        "discovery.password_file", "kvstore.password_file", "kvstore.tls_ca",
                                        "kvstore.tls_cert", "kvstore.tls_key", NULL};

// Sets key (dotted; '*' = every element of an array) in obj to a copy of v, creating objects on the way. 0, or -1
// with err when a step is not an object (or, for '*', not an array).
static int ovr_put(cJSON *obj, const char *key, const cJSON *v, const char *full, char *err, size_t errlen) {
  const char *dot = strchr(key, '.');
  size_t n = dot ? (size_t)(dot - key) : strlen(key);
  char name[128];
  if (n == 0 || n >= sizeof name) {
    snprintf(err, errlen, "override %s: bad key", full);
    return -1;
  }
  memcpy(name, key, n);
  name[n] = 0;
  if (!strcmp(name, "*")) {
    if (!cJSON_IsArray(obj) || !dot) {
      snprintf(err, errlen, "override %s: '*' must stand for the elements of an array", full);
      return -1;
    }
    for (cJSON *e = obj->child; e; e = e->next)
      if (ovr_put(e, dot + 1, v, full, err, errlen)) return -1;
    return 0;
  }
  if (!cJSON_IsObject(obj)) {
    snprintf(err, errlen, "override %s: \"%s\" is inside something that is not an object", full, name);
    return -1;
  }
  if (!dot) {
    cJSON *copy = cJSON_Duplicate(v, 1);
    if (!copy) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    if (cJSON_GetObjectItemCaseSensitive(obj, name)) cJSON_ReplaceItemInObjectCaseSensitive(obj, name, copy);
    else cJSON_AddItemToObject(obj, name, copy);
    return 0;
  }
  cJSON *child = cJSON_GetObjectItemCaseSensitive(obj, name);
  if (!child) {
    child = cJSON_AddObjectToObject(obj, name);
    if (!child) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
  }
  return ovr_put(child, dot + 1, v, full, err, errlen);
}

// The value at a dotted key without '*' (NULL when absent).
static cJSON *ovr_get(cJSON *obj, const char *key) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", key);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ".", &save); tok && obj; tok = strtok_r(NULL, ".", &save))
    obj = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, tok) : NULL;
  return obj;
}

// Makes the string at key (dotted, '*' allowed) absolute against dir; absent keys and non-strings are left for
// cfg_parse to judge.
static int ovr_absolute(cJSON *obj, const char *key, const char *dir, char *err, size_t errlen) {
  const char *dot = strchr(key, '.');
  size_t n = dot ? (size_t)(dot - key) : strlen(key);
  if (n == 1 && key[0] == '*') {
    if (!cJSON_IsArray(obj)) return 0;
    for (cJSON *e = obj->child; e; e = e->next)
      if (ovr_absolute(e, dot + 1, dir, err, errlen)) return -1;
    return 0;
  }
  if (!cJSON_IsObject(obj)) return 0;
  cJSON *child = NULL;
  for (cJSON *e = obj->child; e && !child; e = e->next)
    if (e->string && strlen(e->string) == n && !strncmp(e->string, key, n)) child = e;
  if (!child) return 0;
  if (dot) return ovr_absolute(child, dot + 1, dir, err, errlen);
  if (!cJSON_IsString(child) || !child->valuestring[0] || child->valuestring[0] == '/') return 0;
  if (!strcmp(key, "model") && !strcmp(child->valuestring, "null")) return 0; // the null model's name, no path
  char path[PATH_MAX + 1100];
  snprintf(path, sizeof path, "%s/%s", dir, child->valuestring);
  if (strlen(path) >= 1024) {
    snprintf(err, errlen, "%s: path too long once made absolute (%s)", key, path);
    return -1;
  }
  return cJSON_SetValuestring(child, path) ? 0 : -1;
}

int cfg_effective_json(const char *path, const char *base_json, const cfg_set *sets, int n_sets, char **out,
                       char *err, size_t errlen) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  if (path) {
    if (cfg_read_text(path, &text, &len, err, errlen)) return -1;
  } else {
    text = strdup(base_json ? base_json : "{}");
    if (!text) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    len = strlen(text);
  }
  utl_json_issue is; // what the pre-pass finds, cfg_parse below reports with its place
  cJSON *root = utl_json_check(text, len, CJSON_NESTING_LIMIT, &is) == 0 ? cJSON_ParseWithLength(text, len) : NULL;
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    cfg_cluster *c = NULL; // cfg_parse of the same text says where it breaks (line and column)
    if (cfg_parse(text, len, path ? path : "configuration", &c, err, errlen) == 0) {
      cfg_free(c);
      snprintf(err, errlen, "%s: expected a JSON object", path ? path : "configuration");
    }
    free(text);
    return -1;
  }
  free(text);
  // the folder relative paths are resolved against: the file's (as cfg_parse does), else the working directory
  char dir[PATH_MAX];
  const char *slash = path ? strrchr(path, '/') : NULL;
  char folder[PATH_MAX];
  if (slash) snprintf(folder, sizeof folder, "%.*s", (int)(slash - path) > 0 ? (int)(slash - path) : 1, path);
  else snprintf(folder, sizeof folder, ".");
  if (!realpath(folder, dir)) {
    snprintf(err, errlen, "%s: cannot resolve its folder: %s", path ? path : ".", strerror(errno));
    cJSON_Delete(root);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < n_sets && !rc; i++) {
    cJSON *v = sets[i].kind == CFG_SET_JSON ? cJSON_ParseWithOpts(sets[i].value, NULL, 1) : cJSON_CreateString(sets[i].value);
    if (!v) {
      snprintf(err, errlen, "%s: \"%s\" is not a valid value", sets[i].key, sets[i].value);
      rc = -1;
      break;
    }
    if (sets[i].kind == CFG_SET_APPEND) { // the array at key, with the config's own elements first
      cJSON *arr = ovr_get(root, sets[i].key);
      cJSON *grown = cJSON_IsArray(arr) ? cJSON_Duplicate(arr, 1) : cJSON_CreateArray();
      if (!grown) {
        cJSON_Delete(v);
        snprintf(err, errlen, "out of memory");
        rc = -1;
        break;
      }
      cJSON_AddItemToArray(grown, v);
      v = grown;
    }
    cJSON *workers = cJSON_GetObjectItemCaseSensitive(root, "workers");
    if (!strncmp(sets[i].key, "workers.*.", 10) && (!cJSON_IsArray(workers) || !workers->child)) {
      snprintf(err, errlen, "%s: the config has no workers to apply it to", sets[i].key);
      rc = -1;
    } else {
      rc = ovr_put(root, sets[i].key, v, sets[i].key, err, errlen);
    }
    cJSON_Delete(v);
  }
  for (int i = 0; PATH_KEYS[i] && !rc; i++) rc = ovr_absolute(root, PATH_KEYS[i], dir, err, errlen);
  if (!rc) {
    *out = cJSON_Print(root);
    if (!*out) {
      snprintf(err, errlen, "out of memory");
      rc = -1;
    }
  }
  cJSON_Delete(root);
  return rc;
}
