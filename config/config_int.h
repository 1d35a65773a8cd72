// config/config_int.h: what the files of config/ share (not for other modules): reading the file, the parser's
// field readers (fields.c), the observability sections (observe.c).
#ifndef DSERVE_CFG_CONFIG_INT_H
#define DSERVE_CFG_CONFIG_INT_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "config/config.h"

// The whole file at path (at most 64 MiB) in *text (malloc'd, NUL-terminated), its length in *len; -1 with err
// ("PATH: why") otherwise.
int cfg_read_text(const char *path, char **text, size_t *len, char *err, size_t errlen);

typedef struct cfg_ctx {
  const char *file; // (borrowed) prefix of every message; may be NULL
  char *err;        // (borrowed) (errlen)
  size_t errlen;
  int null_model;   // the file's model is "null": the workers' null_* keys apply (else each is refused)
} cfg_ctx;

// fields.c: each returns 0, or -1 with x->err naming the field ("file: path.key: what is wrong").
int cfg_fail(cfg_ctx *x, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void cfg_join(char *out, size_t cap, const char *path, const char *key); // out = path.key (key when path is empty)
const char *cfg_type_name(const cJSON *v);                                // "an object", "a string", ...
int cfg_check_keys(cfg_ctx *x, const cJSON *obj, const char *path, const char *const *allowed); // known, once each
const cJSON *cfg_item(const cJSON *obj, const char *key);                                       // NULL obj: NULL
int cfg_str(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, char *dst, size_t cap, const char *def);
int cfg_int(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, long long *dst, long long lo,
            long long hi, long long def, int required);
int cfg_int32(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, int *dst, long long lo, long long hi,
              long long def, int required);
int cfg_bool(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, int *dst, int def);
int cfg_num(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, double *dst, double lo,
            int min_exclusive, double hi, double def);
int cfg_obj(cfg_ctx *x, const cJSON *obj, const char *path, const char *key, const cJSON **out);
int cfg_one_of(cfg_ctx *x, const char *path, const char *key, const char *val, const char *const *set);

// observe.c: the top-level "logging" and "tracing" sections into c->logging and c->tracing.
int cfg_parse_observe(cfg_ctx *x, const cJSON *root, cfg_cluster *c);

// kvstore.c: the "kvstore" section j into k (path: the config file, relative file names resolve against its folder).
int cfg_parse_kvstore(cfg_ctx *x, const cJSON *j, const char *path, cfg_kvstore *k);

#endif
