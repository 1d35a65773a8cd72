// models/json_lit.h: cJSON trees whose numbers keep their literal text, so a number is read and written exactly as
// the client wrote it (9007199254740993 and 0.30000000000000004 survive; a double does not hold them).
#ifndef DSERVE_MDL_JSON_LIT_H
#define DSERVE_MDL_JSON_LIT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// cJSON_ParseWithLengthOpts(text, len, end, 0), then each number node's valuestring set to its literal's text
// (cJSON frees it with the node and copies it in cJSON_Duplicate; cJSON_IsNumber and valuedouble are as before).
// NULL when the text is not JSON (*end where cJSON stopped) or memory ran out (*end NULL). The caller runs
// utl_json_check first where a malformed number or a duplicate key must be refused rather than parsed.
cJSON *mdl_json_parse(const char *text, size_t len, const char **end);

// A number node's literal text (NULL when v is not a number or was not parsed by mdl_json_parse).
const char *mdl_json_num_text(const cJSON *v);

// v printed unformatted with every number as its literal text (cJSON's %.17g for a number that has none). The
// caller frees it; NULL when memory ran out.
char *mdl_json_print(const cJSON *v);

#ifdef __cplusplus
}
#endif
#endif
