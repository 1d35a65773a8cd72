// proto/request.c: a request's messages between the router and the workers: generate, token, done, error, cancel.
#include "proto/request.h"

#include <string.h>

#include "proto/prt_int.h"
#include "util/err.h"

static cJSON *oom(cJSON *m, char *err, size_t errlen) {
  cJSON_Delete(m);
  utl_seterr(err, errlen, "out of memory");
  return NULL;
}

cJSON *prt_error_encode(const prt_error *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_ERROR);
  if (!j || !PRT_ADD_STR(j, "id", m->id) || !PRT_ADD_STR(j, "message", m->message ? m->message : "") ||
      !PRT_ADD_STR(j, "code", m->code))
    return oom(j, err, errlen);
  return j;
}

int prt_error_decode(const cJSON *j, prt_error *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_ERROR, "id", 0, &m->id, err, errlen) ||
                 prt__str(j, PRT_OP_ERROR, "message", 1, &m->message, err, errlen) ||
                 prt__str(j, PRT_OP_ERROR, "code", 0, &m->code, err, errlen)
             ? -1
             : 0;
}

cJSON *prt_cancel_encode(const prt_cancel *m, char *err, size_t errlen) {
  cJSON *j = prt_new(PRT_OP_CANCEL);
  if (!j || !PRT_ADD_STR(j, "id", m->id)) return oom(j, err, errlen);
  return j;
}

int prt_cancel_decode(const cJSON *j, prt_cancel *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  return prt__str(j, PRT_OP_CANCEL, "id", 1, &m->id, err, errlen);
}
