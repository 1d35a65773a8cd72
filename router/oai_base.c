// router/oai_base.c: the OpenAI layer's floor: the error object every route answers with, and the request field
// readers openai.c and oai_tools.c share.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/oai_int.h"
#include "router/openai.h"

int rtr_fail(rtr_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
  if (!e) return -1;
  e->status = status;
  snprintf(e->type, sizeof e->type, "%s", type ? type : "invalid_request_error");
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  snprintf(e->code, sizeof e->code, "%s", code ? code : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return -1;
}

char *rtr_error_json(const rtr_error *e) {
  cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
  if (!o) {
    cJSON_Delete(root);
    return NULL;
  }
  cJSON_AddStringToObject(o, "message", e->message);
  cJSON_AddStringToObject(o, "type", e->type[0] ? e->type : "invalid_request_error");
  if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
  else cJSON_AddNullToObject(o, "param");
  if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
  else cJSON_AddNullToObject(o, "code");
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

const cJSON *rtr_oai_field(const cJSON *root, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  return cJSON_IsNull(v) ? NULL : v; // null means "not given", as OpenAI treats it
}

int rtr_oai_get_bool(const cJSON *root, const char *name, int *out, rtr_error *e) {
  const cJSON *v = rtr_oai_field(root, name);
  if (!v) return 0;
  if (!cJSON_IsBool(v)) return BAD(e, name, "'%s' must be a boolean", name);
  *out = cJSON_IsTrue(v);
  return 1;
}

int rtr_oai_check_str(const cJSON *root, const char *name, rtr_error *e) {
  const cJSON *v = rtr_oai_field(root, name);
  if (v && !cJSON_IsString(v)) return BAD(e, name, "'%s' must be a string", name);
  return 0;
}
