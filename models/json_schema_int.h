// models/json_schema_int.h: the JSON Schema compiler's state and the grammar pieces json_rules.c gives json_schema.c.
#ifndef DSERVE_MDL_JSON_SCHEMA_INT_H
#define DSERVE_MDL_JSON_SCHEMA_INT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "models/grammar.h"

#define MDL_JS_WS_MAX 20 // spaces or tabs after the optional newline between two JSON tokens

typedef struct mdl_js_target {
  const cJSON *node; // (borrowed) a $ref's target
  int rule;
} mdl_js_target;

typedef struct mdl_js_ctx {
  mdl_grammar_builder *b; // (borrowed)
  const cJSON *root;      // (borrowed) the whole schema: local $refs resolve in it
  char *err;              // (borrowed) (errlen) the first error
  size_t errlen;
  int status;             // 0, -1 (invalid schema) or MDL_GRAMMAR_UNSUPPORTED
  char path[256];         // where the compiler is, as a JSON pointer ("#/properties/a")
  int depth;
  // shared rules, made on first use (-1: not yet)
  int ws, chr, chars, string, number, integer, any, any_obj;
  mdl_js_target *refs;      // (owned) (n_refs) $ref targets compiled so far, so recursion closes on itself
  int n_refs, cap_refs;
} mdl_js_ctx;

// Records the first error (status -1: invalid, MDL_GRAMMAR_UNSUPPORTED) with the path; always returns -1.
int mdl_js_fail(mdl_js_ctx *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void mdl_js_lit(mdl_js_ctx *c, mdl_grammar_seq *s, const char *text); // literal bytes
void mdl_js_ref(mdl_grammar_seq *s, int rule);
int mdl_js_rule_of(mdl_js_ctx *c, mdl_grammar_seq *s); // a new rule with the one alternative s (freed); -1 failed

// Shared rules (made once per compile): bounded whitespace; one string character (raw or escaped); a whole string;
// a number (integer: no fraction or exponent); any JSON value (also sets any_obj: any object).
int mdl_js_ws(mdl_js_ctx *c);
int mdl_js_chr(mdl_js_ctx *c);
int mdl_js_string(mdl_js_ctx *c);
int mdl_js_number(mdl_js_ctx *c, int integer);
int mdl_js_any(mdl_js_ctx *c);
int mdl_js_literal(mdl_js_ctx *c, const char *text);
// JSON Schema's numeric keywords (minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf; json_schema_num.c):
// 1 when k is one of them.
int mdl_js_is_num_keyword(const char *k);
// The integer (integer 1) or number rule under s's numeric keywords (mdl_js_number when it has none); -1 with the
// error recorded (unsatisfiable bounds: invalid; what the grammar cannot enforce: unsupported, naming the keyword).
int mdl_js_number_bounded(mdl_js_ctx *c, const cJSON *s, int integer);
// 1 when the number node v satisfies s's numeric keywords (an enum / const value does), 0 when not, compared exactly
// on the literals (models/json_lit.h); -1 with the error recorded when a value cannot be held exactly.
int mdl_js_num_in_bounds(mdl_js_ctx *c, const cJSON *s, const cJSON *v);
// 1 when the number node v is an integer (1.0 and 1e2 are), exactly; 0 when not; -1 with the error recorded.
int mdl_js_num_is_int(mdl_js_ctx *c, const cJSON *v);
// "{" ws "}" | "{" ws M (ws "," ws M)* ws "}", M = string ws ":" ws value: an object of any keys.
int mdl_js_map(mdl_js_ctx *c, int value);
// "[" ws "]" (min 0) | "[" ws item (ws "," ws item){min-1..max-1} ws "]" (max < 0: no bound).
int mdl_js_list(mdl_js_ctx *c, int item, int min, int max);
// The contents (between the quotes) of a string matching regular expression re (the subset in docs/openai.md),
// appended to s. 0, or -1 with the error recorded (param names the keyword in the message: "pattern", "format").
int mdl_js_regex(mdl_js_ctx *c, const char *re, const char *param, mdl_grammar_seq *s);

#endif
