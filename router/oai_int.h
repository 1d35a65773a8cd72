// router/oai_int.h: what the OpenAI layer's request files (openai.c, oai_tools.c) share: the error shorthands and
// the field readers.
#ifndef DSERVE_RTR_OAI_INT_H
#define DSERVE_RTR_OAI_INT_H

#include <cjson/cJSON.h>

#include "router/openai.h"

#define BAD(e, param, ...) rtr_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM(e) rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory")
#define UNSUP(e, param, ...) rtr_fail(e, 400, "invalid_request_error", param, "unsupported_parameter", __VA_ARGS__)
#define INVAL(e, param, ...) rtr_fail(e, 400, "invalid_request_error", param, "invalid_value", __VA_ARGS__)

// A request body checked (not empty, UTF-8, no NUL character in a string, one JSON object and nothing after it) and
// parsed; NULL with e (400) otherwise.
cJSON *rtr_oai_parse_body(const char *body, size_t len, rtr_error *e);
// The field name of root, NULL when absent or null (OpenAI treats null as "not given").
const cJSON *rtr_oai_field(const cJSON *root, const char *name);
// A JSON boolean into *out; 1 when present, 0 when absent, -1 with e on another type.
int rtr_oai_get_bool(const cJSON *root, const char *name, int *out, rtr_error *e);
// A string field (absent is fine); -1 with e on another type.
int rtr_oai_check_str(const cJSON *root, const char *name, rtr_error *e);
// The chat-only fields: documented no-ops, tools, tool_choice, functions (deprecated) and response_format
// (oai_tools.c). 0, or -1 with e.
int rtr_oai_check_chat_extras(const cJSON *root, rtr_request *r, rtr_error *e);
// tools, tool_choice and parallel_tool_calls (rtr_oai_check_chat_extras reads them for chat; /tokenize takes tools).
int rtr_oai_parse_tools(const cJSON *root, rtr_request *r, rtr_error *e);

#endif
