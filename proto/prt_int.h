// proto/prt_int.h: field readers the codecs share (not for use outside proto/).
#ifndef DSERVE_PRT_INT_H
#define DSERVE_PRT_INT_H

#include <stdint.h>

#include <cjson/cJSON.h>

// Each returns 0, or -1 with err naming the message and the field ("<op>: <field> must be ...").
// A required field must be present; an optional one (req 0) leaves *out as it is when absent or null.
int prt__str(const cJSON *o, const char *op, const char *k, int req, const char **out, char *err, size_t errlen);
// A number within [lo, hi] (finite).
int prt__num(const cJSON *o, const char *op, const char *k, int req, double lo, double hi, double *out, char *err,
             size_t errlen);
// An integer within [lo, hi].
int prt__int(const cJSON *o, const char *op, const char *k, int req, int64_t lo, int64_t hi, int64_t *out, char *err,
             size_t errlen);
// An array of integers within [lo, hi] into *out (malloc'ed, NULL when empty) and *n.
int prt__ints(const cJSON *o, const char *op, const char *k, int req, int64_t lo, int64_t hi, int32_t **out, int *n,
              char *err, size_t errlen);
// Adds a number array of n ints; 0, -1 on out of memory.
int prt__add_ints(cJSON *o, const char *k, const int32_t *v, int n);
// An optional object (or, with any_json, any JSON value) kept as a borrowed pointer into o.
int prt__obj(const cJSON *o, const char *op, const char *k, int req, const cJSON **out, char *err, size_t errlen);
// 1 when the string is set (non-NULL).
#define PRT_ADD_STR(m, k, v) ((v) ? cJSON_AddStringToObject((m), (k), (v)) != NULL : 1)

#endif
