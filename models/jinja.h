// models/jinja.h: a Jinja interpreter for the subset the popular GGUF chat templates use (tokenizer.chat_template),
// rendering byte-for-byte what Python's jinja2 renders in Hugging Face's apply_chat_template environment
// (ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, loopcontrols, default Undefined, one trailing
// newline dropped; tojson is json.dumps(ensure_ascii=False): no HTML escaping, as HF and llama.cpp both override
// jinja2's; raise_exception and strftime_now as globals). tests/models/jinja/test_jinja_oracle.py checks it against
// jinja2 on the published templates of tests/models/templates.
//
// Supported: text, {{ }}, {% %}, {# #}, "-" whitespace control; for (else, loop.*, tuple unpacking, dict iteration),
// if/elif/else, set (and block set), macro (defaults, keyword arguments), filter blocks, break/continue, namespace();
// literals, attribute and subscript access, slices, arithmetic, ~, comparisons, and/or/not, in, is tests, ternaries;
// the filters, tests and string and dict methods those templates call (models/jinja_builtins.c). Anything else
// (str.format, call blocks, includes, changing the case of non-ASCII text) is a parse or runtime error naming its
// line, never a silent difference.
#ifndef DSERVE_MDL_JINJA_H
#define DSERVE_MDL_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Bounds a render may not pass (a template that loops or recurses without end fails with an error, never hangs):
#define MDL_JINJA_MAX_OUTPUT (16u << 20)    // bytes of output, and of any one string value built on the way
#define MDL_JINJA_MAX_STEPS (1u << 24)      // loop iterations plus macro calls over the whole render
#define MDL_JINJA_MAX_DEPTH 64              // nested macro calls (and expression nesting at parse time: 256)
#define MDL_JINJA_MAX_TEMPLATE (1u << 20)   // bytes of template text
#define MDL_JINJA_MAX_MEMORY ((size_t)256 << 20) // bytes a render may allocate (values, scopes, strings)

typedef struct mdl_jinja mdl_jinja; // a parsed template: immutable, render may run on several threads at once

// Parses template text (n bytes). 0, or -1 with err naming line:column and what is wrong
// ("line 12:5: unknown tag 'foo'").
int mdl_jinja_parse(const char *text, size_t n, mdl_jinja **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void mdl_jinja_free(mdl_jinja *t);

// 1 when the template reads the top-level variable `name` anywhere, else 0 (e.g. "tools": a template that never reads
// it cannot express tools, so the caller refuses a request with tools).
int mdl_jinja_uses_var(const mdl_jinja *t, const char *name);

enum { MDL_JINJA_RAISED = -2 }; // render's status when the template called raise_exception(msg): err = msg

typedef struct mdl_jinja_opts {
  int64_t now; // unix seconds that strftime_now() formats (UTC); tests fix it
} mdl_jinja_opts;

// Renders t with the variables of ctx_json (a JSON object, ctx_len bytes: messages, tools, add_generation_prompt,
// bos_token, eos_token, ...). *out malloc'ed, NUL-terminated, *out_len bytes.
// Strings at the object's top level (bos_token, eos_token) are the caller's; every string nested deeper (message
// contents, tool declarations, call arguments, names) is request text. When spans is non-NULL, *spans (malloc'ed,
// (n_spans, 2): offset and length into *out, ascending, non-overlapping, adjacent ranges merged) covers every output
// byte that came from request text, through concatenation, filters and string methods (a method's or filter's result
// on request text is request text as a whole; tojson of a value holding request text too).
// Returns 0, -1 with err (bad context JSON, or a runtime error: "line N: ..."), or MDL_JINJA_RAISED with the
// template's message. On failure *out and *spans are NULL.
int mdl_jinja_render(const mdl_jinja *t, const char *ctx_json, size_t ctx_len, const mdl_jinja_opts *o, char **out,
                     size_t *out_len, size_t **spans, size_t *n_spans, char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif

#endif
