// config/fields.c: the config parser's field readers (each names the field it refuses), shared by the sections.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config/config_int.h"

int cfg_fail(cfg_ctx *x, const char *field, const char *fmt, ...) {
  if (!x->err || !x->errlen) return -1;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *f = x->file && *x->file ? x->file : "config";
  if (field && *field) snprintf(x->err, x->errlen, "%s: %s: %s", f, field, msg);
  else snprintf(x->err, x->errlen, "%s: %s", f, msg);
  return -1;
}

void cfg_join(char *out, size_t cap, const char *path, const char *key) {
  if (path && *path) snprintf(out, cap, "%s.%s", path, key);
  else snprintf(out, cap, "%s", key);
}

const char *cfg_type_name(const cJSON *v) {
  if (cJSON_IsObject(v)) return "an object";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  return "an invalid value";
}

// Every key of obj must be in allowed (NULL-terminated); that none appears twice cfg_parse's pre-pass checked.
int cfg_check_keys(cfg_ctx *x, const cJSON *obj, const char *path, const char *const *allowed) {
  char field[256];
  for (const cJSON *it = obj->child; it; it = it->next) {
    int ok = 0;
    for (const char *const *a = allowed; *a; a++)
      if (!strcmp(*a, it->string)) ok = 1;
    cfg_join(field, sizeof field, path, it->string);
    if (!ok) {
      char list[512] = "";
      size_t n = 0;
      for (const char *const *a = allowed; *a && n < sizeof list; a++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", a == allowed ? "" : ", ", *a);
      return cfg_fail(x, field, "unknown key (allowed: %s)", list);
    }
  }
  return 0;
}

const cJSON *cfg_item(const cJSON *obj, const char *key) {
  return obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

// String field: missing -> def (or an error when def is NULL); must fit in cap-1 bytes.
int cfg_str(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, char *dst, size_t cap,
                   const char *def) {
  char field[256];
  cfg_join(field, sizeof field, path, key);
  const cJSON *v = cfg_item(obj, key);
  const char *s;
  if (!v) {
    if (!def) return cfg_fail(x, field, "missing (required string)");
    s = def;
  } else {
    if (!cJSON_IsString(v)) return cfg_fail(x, field, "expected a string, got %s", cfg_type_name(v));
    s = v->valuestring;
  }
  size_t n = strlen(s);
  if (n >= cap) return cfg_fail(x, field, "too long (%zu bytes; at most %zu)", n, cap - 1);
  memcpy(dst, s, n + 1);
  return 0;
}

// Integer field in lo..hi: missing -> def (or an error when required).
int cfg_int(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, long long *dst, long long lo,
                   long long hi, long long def, int required) {
  char field[256];
  cfg_join(field, sizeof field, path, key);
  const cJSON *v = cfg_item(obj, key);
  if (!v) {
    if (required) return cfg_fail(x, field, "missing (required integer %lld..%lld)", lo, hi);
    *dst = def;
    return 0;
  }
  double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
  if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi)
    return cfg_fail(x, field, "expected an integer %lld..%lld", lo, hi);
  *dst = (long long)d;
  return 0;
}

int cfg_int32(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, int *dst, long long lo,
                     long long hi, long long def, int required) {
  long long v;
  if (cfg_int(x, obj, path, key, &v, lo, hi, def, required)) return -1;
  *dst = (int)v;
  return 0;
}

// Boolean field: missing -> def.
int cfg_bool(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, int *dst, int def) {
  char field[256];
  cfg_join(field, sizeof field, path, key);
  const cJSON *v = cfg_item(obj, key);
  if (!v) {
    *dst = def;
    return 0;
  }
  if (!cJSON_IsBool(v)) return cfg_fail(x, field, "expected true or false, got %s", cfg_type_name(v));
  *dst = cJSON_IsTrue(v);
  return 0;
}

// Number field; min_exclusive: value must be > lo, else >= lo.
int cfg_num(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, double *dst, double lo,
                   int min_exclusive, double hi, double def) {
  char field[256];
  cfg_join(field, sizeof field, path, key);
  const cJSON *v = cfg_item(obj, key);
  if (!v) {
    *dst = def;
    return 0;
  }
  double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
  if (!cJSON_IsNumber(v) || !isfinite(d) || (min_exclusive ? d <= lo : d < lo) || d > hi)
  {
    char upper[48] = "";
    if (hi < 1e300) snprintf(upper, sizeof upper, " and <= %g", hi);
    return cfg_fail(x, field, "expected a number %s %g%s", min_exclusive ? ">" : ">=", lo, upper);
  }
  *dst = d;
  return 0;
}

// Optional object field: returns 0 and *out = the object or NULL when missing.
int cfg_obj(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, const cJSON **out) {
  char field[256];
  cfg_join(field, sizeof field, path, key);
  const cJSON *v = cfg_item(obj, key);
  *out = NULL;
  if (!v) return 0;
  if (!cJSON_IsObject(v)) return cfg_fail(x, field, "expected an object, got %s", cfg_type_name(v));
  *out = v;
  return 0;
}

int cfg_one_of(cfg_ctx *x, const char *path, const char *key, const char *val, const char *const *set) {
  for (const char *const *s = set; *s; s++)
    if (!strcmp(*s, val)) return 0;
  char field[256], list[256] = "";
  size_t n = 0;
  for (const char *const *s = set; *s && n < sizeof list; s++)
    n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", s == set ? "" : ", ", *s);
  cfg_join(field, sizeof field, path, key);
  return cfg_fail(x, field, "\"%s\" is not one of: %s", val, list);
}
