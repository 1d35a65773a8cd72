// models/jinja_int.h: the Jinja interpreter's private types: the arena, values (strings carry request-text spans),
// tokens, the syntax tree, and the render state shared by jinja_eval.c and jinja_builtins.c.
#ifndef DSERVE_MDL_JINJA_INT_H
#define DSERVE_MDL_JINJA_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "models/jinja.h"

// ---- arena ----
// Every syntax node and every value lives in an arena freed at once: a parse's with the template, a render's when it
// returns. Errors unwind with longjmp to the parse or render entry, so no partial structure needs freeing.

typedef struct jj_chunk jj_chunk;
typedef struct jj_arena {
  jj_chunk *head;   // (owned) chunks, newest first
  size_t used;      // bytes handed out over all chunks
  size_t budget;    // most bytes a render may hold (MDL_JINJA_MAX_MEMORY)
  jmp_buf *fail;    // (borrowed) where an exhausted budget or failed malloc unwinds
  char *err;        // (borrowed) the caller's error buffer
  size_t errlen;
} jj_arena;

void *jj_alloc(jj_arena *a, size_t n); // zeroed; unwinds on failure
void jj_arena_free(jj_arena *a);
_Noreturn void jj_fail(jj_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// ---- values ----

typedef enum jj_type {
  JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
  JV_NS,    // namespace(): a dict whose attributes `set` may assign
  JV_LOOP,  // the `loop` variable of a for
  JV_MACRO, // a macro defined by the template
  JV_FUNC,  // a global function (raise_exception, range, namespace, strftime_now, dict)
} jj_type;

typedef struct jj_str {
  size_t n;
  const char *p;    // n bytes (not NUL-terminated)
  size_t nsp;       // request-text spans: (nsp, 2) offset and length into p, ascending, disjoint, merged
  const size_t *sp;
  int markup;       // 1: a markupsafe.Markup (|safe): `+` with a plain string HTML-escapes that string, as jinja2
} jj_str;

typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jj_loop jj_loop;
typedef struct jj_node jj_node;

typedef struct jj_val {
  uint8_t t; // jj_type
  union {
    int b;
    int64_t i;
    double f;
    const jj_str *s;
    jj_list *l;
    jj_dict *d;       // JV_DICT and JV_NS
    const jj_loop *loop;
    const jj_node *macro;
    int fn;           // JV_FUNC: JJ_FN_*
    const char *uname; // JV_UNDEF: the name that was missing, for errors (NULL: unknown)
  };
} jj_val;

struct jj_list {
  size_t n, cap;
  jj_val *v;   // (n)
  int tuple;   // 1: printed as a Python tuple
  int gen;     // 1: a generator (what map, select, reject, items, reverse return in jinja2): always true, iterated
               // once, with no length, index or JSON form
  int spent;   // a generator already iterated
  int view;    // 1 dict_keys, 2 dict_values, 3 dict_items (d.keys() ...): printed so, no index, no JSON
};

struct jj_dict {
  size_t n, cap;
  jj_val *k, *v; // (n) keys (strings from JSON; any scalar from a literal) and values, in insertion order
};

struct jj_loop {
  const jj_list *items; // what the loop iterates (after its `if` filter)
  size_t i;             // this iteration's index
};

#define JJ_BODY "\x01body" // the name a filter block's output is bound to (no template can spell it)

enum { JJ_FN_RAISE, JJ_FN_RANGE, JJ_FN_NAMESPACE, JJ_FN_STRFTIME, JJ_FN_DICT };

static inline jj_val jj_undef(void) { return (jj_val){.t = JV_UNDEF}; }
static inline jj_val jj_none(void) { return (jj_val){.t = JV_NONE}; }
static inline jj_val jj_bool(int b) { return (jj_val){.t = JV_BOOL, .b = !!b}; }
static inline jj_val jj_int(int64_t i) { return (jj_val){.t = JV_INT, .i = i}; }
static inline jj_val jj_float(double f) { return (jj_val){.t = JV_FLOAT, .f = f}; }
static inline jj_val jj_strv(const jj_str *s) { return (jj_val){.t = JV_STR, .s = s}; }

// Strings and containers (jinja_value.c).
const jj_str *jj_str_new(jj_arena *a, const char *p, size_t n, int req); // req: the whole string is request text
const jj_str *jj_str_cat(jj_arena *a, const jj_str *x, const jj_str *y); // spans kept exactly
const jj_str *jj_markup_cat(jj_arena *a, const jj_str *x, const jj_str *y); // Markup's + (one side is Markup)
jj_list *jj_list_new(jj_arena *a, size_t cap);
void jj_list_push(jj_arena *a, jj_list *l, jj_val v);
jj_dict *jj_dict_new(jj_arena *a, size_t cap);
void jj_dict_set(jj_arena *a, jj_dict *d, jj_val k, jj_val v); // replaces an equal key in place (Python's order)
int jj_dict_get(const jj_dict *d, const char *key, size_t kn, jj_val *out); // 1 when found
int jj_dict_find(const jj_dict *d, jj_val k, jj_val *out);

// Semantics shared by the evaluator and the builtins (jinja_value.c).
int jj_truthy(jj_val v);
int jj_equal(jj_val x, jj_val y);
int jj_has_req(jj_val v); // the value holds request text anywhere
const char *jj_type_name(jj_val v);
// str(v) as Python prints it (what {{ v }} writes): undefined "", None "None", lists and dicts as repr.
const jj_str *jj_to_str(jj_arena *a, jj_val v);
// json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys=0) as HF's tojson.
const jj_str *jj_to_json(jj_arena *a, jj_val v, int indent, int ascii); // ascii: ensure_ascii=True
// json.loads of a context: strings below the top level are request text.
jj_val jj_from_json(jj_arena *a, const char *p, size_t n);

// A growable byte buffer with spans (output, and strings built piecewise).
typedef struct jj_sbuf {
  char *p;
  size_t n, cap;
  size_t *sp; // (nsp, 2)
  size_t nsp, spcap;
  size_t limit; // most bytes (MDL_JINJA_MAX_OUTPUT)
} jj_sbuf;
void jj_sb_put(jj_arena *a, jj_sbuf *b, const char *p, size_t n, int req);
void jj_sb_str(jj_arena *a, jj_sbuf *b, const jj_str *s); // with its spans
const jj_str *jj_sb_done(jj_arena *a, jj_sbuf *b);
void jj_sb_utf8(jj_arena *a, jj_sbuf *b, uint32_t c); // one code point as UTF-8

int jj_isspace_at(const char *p, size_t n, size_t i, int back, size_t *len); // Python's str.isspace on one code point

// ---- tokens (jinja_lex.c) ----

typedef enum jj_tok_kind {
  JT_EOF, JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
  JT_NAME, JT_STR, JT_INT, JT_FLOAT, JT_OP,
} jj_tok_kind;

typedef struct jj_tok {
  uint8_t kind;
  int line, col;
  const char *p; // JT_TEXT, JT_NAME, JT_OP: the bytes; JT_STR: the decoded value
  size_t n;
  int64_t i;
  double f;
} jj_tok;

typedef struct jj_toks {
  jj_tok *v;
  size_t n, cap;
} jj_toks;

// Splits normalized template text into tokens, applying whitespace control (trim_blocks, lstrip_blocks, "-" and "+").
void jj_lex(jj_arena *a, const char *src, size_t n, jj_toks *out);

// ---- syntax tree (jinja_parse.c) ----

typedef enum jj_kind {
  // expressions
  JE_LIT, JE_NAME, JE_ATTR, JE_ITEM, JE_SLICE, JE_CALL, JE_FILTER, JE_TEST, JE_BIN, JE_NOT, JE_NEG, JE_COND,
  JE_LIST, JE_TUPLE, JE_DICT,
  // statements
  JS_TEXT, JS_OUT, JS_IF, JS_FOR, JS_SET, JS_SETBLOCK, JS_MACRO, JS_BREAK, JS_CONTINUE,
  JS_FILTERBLOCK, // {% filter f %}: a = the filters over JE_NAME JJ_BODY, the body's output
} jj_kind;

typedef struct jj_nodes {
  jj_node **v;
  size_t n, cap;
} jj_nodes;

struct jj_node {
  uint8_t kind;   // jj_kind
  uint8_t neg;    // JE_TEST: `is not`
  int line;
  const char *op; // JE_BIN: "+", "==", "and", "in", "not in", ...
  const char *name; // JE_NAME, JE_ATTR, JE_FILTER, JE_TEST: the name; JS_SET, JS_SETBLOCK, JS_MACRO: the target;
  const char *attr; // JS_SET on a namespace: the attribute
  jj_val lit;       // JE_LIT
  jj_node *a, *b, *c, *d; // operands; JE_SLICE: a[b:c:d]; JE_COND: b if a else c; JS_FOR: a iterable, b filter
  jj_nodes args;    // call and filter arguments, list/tuple items, dict keys; JS_FOR / JS_SET: target names as JE_NAME
  jj_nodes kw;      // keyword arguments as JE_NAME-tagged nodes: name = keyword, a = value; dict values; macro params
  jj_nodes body;    // statements
  jj_nodes els;     // else / elif branch statements
  const char **shadow; // JS_FOR, JS_MACRO: (nshadow) names its frame starts as undefined (jinja_frames.c)
  size_t nshadow;
};

struct mdl_jinja {
  jj_arena arena;  // owns the tree
  jj_nodes body;
  const char **vars; // (nvars) top-level names the template reads
  size_t nvars;
  const char **shadow; // (nshadow) names the template's own frame starts as undefined (jinja_frames.c)
  size_t nshadow;
};

// Parses tokens into t->body (jinja_parse.c); unwinds through the arena on error.
void jj_parse(mdl_jinja *t, const jj_toks *toks);
// Finds each frame's shadowed names as jinja2's compiler does (jinja_frames.c): t->shadow and the loops' and macros'.
void jj_frames(mdl_jinja *t);

// ---- render (jinja_access.c below jinja_builtins.c below jinja_eval.c) ----

typedef struct jj_scope jj_scope;
struct jj_scope {
  jj_scope *up;
  const char **names; // (n)
  jj_val *vals;
  size_t n, cap;
};

typedef struct jj_render {
  jj_arena *a;
  const mdl_jinja *t;
  int64_t now;
  jj_scope *globals; // the context and the global functions
  jj_scope *top;     // the template's own scope (its top-level sets), parent of every macro call
  size_t steps;      // loop iterations plus macro calls (MDL_JINJA_MAX_STEPS)
  int depth;         // nested macro calls
  int line;          // the statement being run, for errors
  int raised;        // raise_exception was called: the error buffer holds its message
  int brk;           // 1 break, 2 continue pending
} jj_render;

_Noreturn void jj_rfail(jj_render *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jj_val jj_eval(jj_render *r, jj_scope *s, const jj_node *e);
jj_val jj_call_macro(jj_render *r, const jj_node *m, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv,
                     size_t nkw);
// Value access (jinja_access.c)
jj_val jj_attr(jj_render *r, jj_val v, const char *name, size_t n);
jj_val jj_item(jj_render *r, jj_val v, jj_val k);
jj_list *jj_iterate(jj_render *r, jj_val v); // what `for` walks: a list, a dict's keys, a string's characters
jj_val jj_slice(jj_render *r, jj_val v, jj_val start, jj_val stop, jj_val step); // none: the default
_Noreturn void jj_undefined_err(jj_render *r, jj_val v); // "'name' is undefined"
size_t jj_cp_offsets(jj_render *r, const jj_str *s, size_t **offs); // code points; (n + 1) byte offsets
const jj_str *jj_derived(jj_render *r, const jj_str *from, const char *p, size_t n); // a piece of from
int jj_compare(jj_render *r, const char *op, jj_val x, jj_val y, int fold); // -1, 0, 1 as Python orders x and y

// Builtins (jinja_builtins.c): a filter, a test, a method on a string/dict, a global function.
jj_val jj_filter(jj_render *r, const char *name, jj_val v, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv,
                 size_t nkw);
int jj_test(jj_render *r, const char *name, jj_val v, jj_val *args, size_t nargs);
int jj_method(jj_render *r, jj_val self, const char *name, jj_val *args, size_t nargs, jj_val *out);
jj_val jj_call_fn(jj_render *r, int fn, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv, size_t nkw);

#endif
