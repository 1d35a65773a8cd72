// util/json.h: one pass over raw JSON text that finds what a parser would silently accept or report without a
// place: a key twice in one object, nesting past a limit, a lone UTF-16 surrogate escape, a NUL in a string, a
// number outside JSON's grammar. The request bodies, the cluster config and JSON Schemas all go through it.
#ifndef DSERVE_UTL_JSON_H
#define DSERVE_UTL_JSON_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum utl_json_problem {
  UTL_JSON_OK = 0,
  UTL_JSON_DUP_KEY,    // path: the key's path ("a.b" for the second "b" in a)
  UTL_JSON_TOO_DEEP,   // path: the container that opened past the limit's parent
  UTL_JSON_SURROGATE,  // path: the string's (a key's path when a key holds it)
  UTL_JSON_NUL,        // path: the string's, as for SURROGATE
  UTL_JSON_BAD_NUMBER, // path: the number's; "01", "1.", "-", ".5", "+1", "1e" and the like
} utl_json_problem;

typedef struct utl_json_issue {
  utl_json_problem what;
  size_t at;       // the byte offset of the key, the bracket, the backslash or the number
  char path[128];  // ".key" joined ("messages[0].content"), array elements "[i]"; "" at the top; truncated
} utl_json_issue;

// Walks text[0..len) once, stopping at the first problem (out->what, out->at, out->path). Containers may nest
// max_depth deep (the top-level value's container is depth 1). Keys are compared after decoding their escapes, so
// "a" and "\u0061" are the same key. Syntax errors it does not look for are left to the parser that follows.
// 0 when nothing was found, 1 with *out filled, -1 when memory ran out.
int utl_json_check(const char *text, size_t len, int max_depth, utl_json_issue *out);

// A short phrase for a problem ("a duplicate key", ...), for messages.
const char *utl_json_problem_name(utl_json_problem p);

// The length of the number literal starting at text[0] (the run of bytes a number may hold: digits, sign, '.',
// 'e', 'E'); 0 when text[0] cannot start one. Number literals are found the same way by every caller.
size_t utl_json_number_len(const char *text, size_t len);

#ifdef __cplusplus
}
#endif
#endif
