// models/json_rules.c: the grammar pieces of JSON texts (whitespace, strings, numbers, any value) and a small
// regular-expression compiler for a string's `pattern` and `format`, written inside a JSON string.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/json_schema_int.h"
#include "util/vec.h"

int mdl_js_fail(mdl_js_ctx *c, int status, const char *fmt, ...) {
  if (c->status) return -1;
  c->status = status;
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(c->err, c->errlen, "%s (at %s)", msg, c->path);
  return -1;
}

// ---- small grammar helpers ----

void mdl_js_lit(mdl_js_ctx *c, mdl_grammar_seq *s, const char *text) { mdl_grammar_seq_bytes(c->b, s, text, strlen(text)); }
void mdl_js_ref(mdl_grammar_seq *s, int rule) { mdl_grammar_seq_push(s, MDL_GRAMMAR_REF(rule)); }

// A new rule with one alternative s; s is freed. -1 on failure (the builder remembers it).
int mdl_js_rule_of(mdl_js_ctx *c, mdl_grammar_seq *s) {
  int r = mdl_grammar_rule_new(c->b);
  if (r >= 0) mdl_grammar_alt(c->b, r, s);
  mdl_grammar_seq_free(s);
  return r;
}

static void set_range(uint8_t *set, unsigned lo, unsigned hi) {
  for (unsigned x = lo; x <= hi; x++) set[x >> 3] |= (uint8_t)(1u << (x & 7));
}

// ---- code point classes as UTF-8 byte sequences, written inside a JSON string ----

typedef struct cp_range {
  uint32_t lo, hi;
} cp_range;

typedef struct cp_class {
  cp_range *r; // (owned) (n)
  int n, cap;
  int oom;
} cp_class;

static void cls_add(cp_class *k, uint32_t lo, uint32_t hi) {
  if (k->oom || lo > hi) return;
  if (UTL_VEC_PUSH(k->r, k->n, k->cap, ((cp_range){lo, hi}))) k->oom = 1;
}

static int range_cmp(const void *a, const void *b) {
  const cp_range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void cls_normalize(cp_class *k) { // sorted, merged
  if (k->n < 2) return;
  qsort(k->r, (size_t)k->n, sizeof *k->r, range_cmp);
  int m = 0;
  for (int i = 1; i < k->n; i++) {
    if (k->r[i].lo <= k->r[m].hi + 1) {
      if (k->r[i].hi > k->r[m].hi) k->r[m].hi = k->r[i].hi;
    } else
      k->r[++m] = k->r[i];
  }
  k->n = m + 1;
}

static void cls_negate(cp_class *k) {
  cls_normalize(k);
  cp_class o = {0};
  uint32_t at = 0;
  for (int i = 0; i < k->n; i++) {
    if (k->r[i].lo > at) cls_add(&o, at, k->r[i].lo - 1);
    at = k->r[i].hi + 1;
  }
  if (at <= 0x10FFFF) cls_add(&o, at, 0x10FFFF);
  o.oom |= k->oom;
  free(k->r);
  *k = o;
}

static int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

static void utf8_put(uint32_t cp, uint8_t *o) {
  int n = utf8_len(cp);
  if (n == 1) o[0] = (uint8_t)cp;
  else if (n == 2) o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 0x3F));
  else if (n == 3)
    o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), o[2] = (uint8_t)(0x80 | (cp & 0x3F));
  else
    o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F)),
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), o[3] = (uint8_t)(0x80 | (cp & 0x3F));
}

// Alternatives of rule for the multi-byte code points lo..hi (>= 0x80, no surrogates): split until every byte of
// the encoding ranges independently (the classic UTF-8 range split), then one byte range per position.
static void utf8_alts(mdl_js_ctx *c, int rule, uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) { // surrogates are not characters
    if (lo < 0xD800) utf8_alts(c, rule, lo, 0xD7FF);
    if (hi > 0xDFFF) utf8_alts(c, rule, 0xE000, hi);
    return;
  }
  static const uint32_t tops[3] = {0x7F, 0x7FF, 0xFFFF};
  for (int i = 0; i < 3; i++)
    if (lo <= tops[i] && hi > tops[i]) {
      utf8_alts(c, rule, lo, tops[i]);
      utf8_alts(c, rule, tops[i] + 1, hi);
      return;
    }
  int n = utf8_len(lo);
  for (int i = 1; i < n; i++) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if (lo & m) {
        utf8_alts(c, rule, lo, lo | m);
        utf8_alts(c, rule, (lo | m) + 1, hi);
        return;
      }
      if ((hi & m) != m) {
        utf8_alts(c, rule, lo, (hi & ~m) - 1);
        utf8_alts(c, rule, hi & ~m, hi);
        return;
      }
    }
  }
  uint8_t a[4], z[4];
  utf8_put(lo, a);
  utf8_put(hi, z);
  mdl_grammar_seq s = {0};
  for (int i = 0; i < n; i++) mdl_grammar_seq_range(c->b, &s, a[i], z[i]);
  mdl_grammar_alt(c->b, rule, &s);
  mdl_grammar_seq_free(&s);
}

// How code point cp is written inside a JSON string when it must be escaped ("\\n", "\\u0001", ...); NULL when it
// is written as itself.
static const char *json_escape(uint32_t cp, char *buf) {
  switch (cp) {
  case '"': return "\\\"";
  case '\\': return "\\\\";
  case '\n': return "\\n";
  case '\t': return "\\t";
  case '\r': return "\\r";
  case '\b': return "\\b";
  case '\f': return "\\f";
  }
  if (cp < 0x20) {
    snprintf(buf, 8, "\\u%04x", (unsigned)cp);
    return buf;
  }
  return NULL;
}

// One symbol for "one code point of class k, as written in a JSON string": a byte set when k is plain ASCII,
// else a rule: the plain ASCII members as one byte set, the escaped members after one backslash, the rest as UTF-8.
static uint32_t class_sym(mdl_js_ctx *c, cp_class *k) {
  cls_normalize(k);
  if (k->oom) {
    mdl_js_fail(c, -1, "out of memory");
    return MDL_GRAMMAR_REF(0);
  }
  uint8_t ascii[32] = {0};
  int n_ascii = 0, n_esc = 0, multi = 0;
  for (int i = 0; i < k->n; i++)
    for (uint32_t x = k->r[i].lo; x <= k->r[i].hi && x < 0x80; x++) {
      char b[8];
      if (json_escape(x, b)) n_esc++;
      else set_range(ascii, x, x), n_ascii++;
    }
  for (int i = 0; i < k->n; i++) multi |= k->r[i].hi >= 0x80;
  if (!n_esc && !multi && n_ascii) return (uint32_t)mdl_grammar_set(c->b, ascii);
  int r = mdl_grammar_rule_new(c->b);
  mdl_grammar_seq s = {0};
  if (n_ascii) {
    mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(c->b, ascii));
    mdl_grammar_alt(c->b, r, &s);
  }
  if (n_esc) {
    int tail = mdl_grammar_rule_new(c->b); // after the backslash: one stack for every escaped member
    for (int i = 0; i < k->n; i++)
      for (uint32_t x = k->r[i].lo; x <= k->r[i].hi && x < 0x80; x++) {
        char b[8];
        const char *e = json_escape(x, b);
        if (!e) continue;
        s.n = 0;
        mdl_js_lit(c, &s, e + 1);
        mdl_grammar_alt(c->b, tail, &s);
      }
    s.n = 0;
    mdl_js_lit(c, &s, "\\");
    mdl_js_ref(&s, tail);
    mdl_grammar_alt(c->b, r, &s);
  }
  for (int i = 0; i < k->n; i++)
    if (k->r[i].hi >= 0x80) utf8_alts(c, r, k->r[i].lo < 0x80 ? 0x80 : k->r[i].lo, k->r[i].hi);
  mdl_grammar_seq_free(&s);
  if (k->n == 0) mdl_js_fail(c, -1, "a character class that matches nothing");
  return MDL_GRAMMAR_REF(r);
}

// ---- shared rules ----

int mdl_js_ws(mdl_js_ctx *c) {
  if (c->ws >= 0) return c->ws;
  uint8_t sp[32] = {0};
  set_range(sp, ' ', ' ');
  set_range(sp, '\t', '\t');
  mdl_grammar_seq item = {0}, s = {0};
  mdl_grammar_seq_push(&item, (uint32_t)mdl_grammar_set(c->b, sp));
  int spaces = mdl_grammar_repeat(c->b, &item, NULL, 0, MDL_JS_WS_MAX);
  mdl_grammar_seq_free(&item);
  c->ws = mdl_grammar_rule_new(c->b);
  mdl_js_ref(&s, spaces);
  mdl_grammar_alt(c->b, c->ws, &s);
  s.n = 0;
  mdl_js_lit(c, &s, "\n");
  mdl_js_ref(&s, spaces);
  mdl_grammar_alt(c->b, c->ws, &s);
  mdl_grammar_seq_free(&s);
  return c->ws;
}

// One character of a JSON string: any character but '"', '\\' and controls as itself, or an escape (\uXXXX not a
// surrogate: a lone one is not a character).
int mdl_js_chr(mdl_js_ctx *c) {
  if (c->chr >= 0) return c->chr;
  int r = c->chr = mdl_grammar_rule_new(c->b);
  uint8_t set[32] = {0};
  set_range(set, 0x20, 0x7F);
  set[0x22 >> 3] &= (uint8_t) ~(1u << (0x22 & 7));
  set[0x5C >> 3] &= (uint8_t) ~(1u << (0x5C & 7));
  mdl_grammar_seq s = {0};
  mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(c->b, set));
  mdl_grammar_alt(c->b, r, &s);
  utf8_alts(c, r, 0x80, 0x10FFFF);
  uint8_t hex[32] = {0}, nosur[32] = {0}, lo8[32] = {0};
  set_range(hex, '0', '9'), set_range(hex, 'a', 'f'), set_range(hex, 'A', 'F');
  memcpy(nosur, hex, 32);
  nosur['d' >> 3] &= (uint8_t) ~(1u << ('d' & 7));
  nosur['D' >> 3] &= (uint8_t) ~(1u << ('D' & 7));
  set_range(lo8, '0', '7');
  uint32_t H = (uint32_t)mdl_grammar_set(c->b, hex);
  int tail = mdl_grammar_rule_new(c->b); // after the backslash
  s.n = 0;
  uint8_t one[32] = {0};
  for (const char *p = "\"\\/bfnrt"; *p; p++) set_range(one, (uint8_t)*p, (uint8_t)*p);
  mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(c->b, one));
  mdl_grammar_alt(c->b, tail, &s);
  s.n = 0;
  mdl_js_lit(c, &s, "u");
  mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(c->b, nosur));
  for (int i = 0; i < 3; i++) mdl_grammar_seq_push(&s, H);
  mdl_grammar_alt(c->b, tail, &s);
  s.n = 0;
  mdl_js_lit(c, &s, "u");
  mdl_grammar_seq_range(c->b, &s, 'd', 'd');
  mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(c->b, lo8));
  mdl_grammar_seq_push(&s, H), mdl_grammar_seq_push(&s, H);
  mdl_grammar_alt(c->b, tail, &s);
  s.n = 0;
  mdl_js_lit(c, &s, "u");
  mdl_grammar_seq_range(c->b, &s, 'D', 'D');
  mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(c->b, lo8));
  mdl_grammar_seq_push(&s, H), mdl_grammar_seq_push(&s, H);
  mdl_grammar_alt(c->b, tail, &s);
  s.n = 0;
  mdl_js_lit(c, &s, "\\");
  mdl_js_ref(&s, tail);
  mdl_grammar_alt(c->b, r, &s);
  mdl_grammar_seq_free(&s);
  return r;
}

static int chars_rule(mdl_js_ctx *c) { // any number of string characters
  if (c->chars >= 0) return c->chars;
  mdl_grammar_seq item = {0};
  mdl_js_ref(&item, mdl_js_chr(c));
  c->chars = mdl_grammar_repeat(c->b, &item, NULL, 0, -1);
  mdl_grammar_seq_free(&item);
  return c->chars;
}

int mdl_js_string(mdl_js_ctx *c) {
  if (c->string >= 0) return c->string;
  mdl_grammar_seq s = {0};
  mdl_js_lit(c, &s, "\"");
  mdl_js_ref(&s, chars_rule(c));
  mdl_js_lit(c, &s, "\"");
  return c->string = mdl_js_rule_of(c, &s);
}

// -?(0|[1-9][0-9]{0,15}), then for a number (\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?
int mdl_js_number(mdl_js_ctx *c, int integer) {
  int *slot = integer ? &c->integer : &c->number;
  if (*slot >= 0) return *slot;
  mdl_grammar_seq d = {0}, s = {0};
  mdl_grammar_seq_range(c->b, &d, '0', '9');
  int r = *slot = mdl_grammar_rule_new(c->b);
  int sign = mdl_grammar_rule_new(c->b), frac = -1, exp = -1;
  mdl_grammar_alt(c->b, sign, &s);
  mdl_js_lit(c, &s, "-");
  mdl_grammar_alt(c->b, sign, &s);
  int lead = mdl_grammar_rule_new(c->b);
  s.n = 0;
  mdl_js_lit(c, &s, "0");
  mdl_grammar_alt(c->b, lead, &s);
  s.n = 0;
  mdl_grammar_seq_range(c->b, &s, '1', '9');
  mdl_js_ref(&s, mdl_grammar_repeat(c->b, &d, NULL, 0, 15));
  mdl_grammar_alt(c->b, lead, &s);
  if (!integer) {
    frac = mdl_grammar_rule_new(c->b);
    s.n = 0;
    mdl_grammar_alt(c->b, frac, &s);
    mdl_js_lit(c, &s, ".");
    mdl_js_ref(&s, mdl_grammar_repeat(c->b, &d, NULL, 1, 16));
    mdl_grammar_alt(c->b, frac, &s);
    exp = mdl_grammar_rule_new(c->b);
    int esign = mdl_grammar_rule_new(c->b);
    s.n = 0;
    mdl_grammar_alt(c->b, esign, &s);
    mdl_grammar_seq_range(c->b, &s, '+', '+');
    mdl_grammar_alt(c->b, esign, &s);
    s.n = 0;
    mdl_grammar_seq_range(c->b, &s, '-', '-');
    mdl_grammar_alt(c->b, esign, &s);
    s.n = 0;
    mdl_grammar_alt(c->b, exp, &s);
    uint8_t e[32] = {0};
    set_range(e, 'e', 'e'), set_range(e, 'E', 'E');
    mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(c->b, e));
    mdl_js_ref(&s, esign);
    mdl_js_ref(&s, mdl_grammar_repeat(c->b, &d, NULL, 1, 3));
    mdl_grammar_alt(c->b, exp, &s);
  }
  s.n = 0;
  mdl_js_ref(&s, sign);
  mdl_js_ref(&s, lead);
  if (!integer) mdl_js_ref(&s, frac), mdl_js_ref(&s, exp);
  mdl_grammar_alt(c->b, r, &s);
  mdl_grammar_seq_free(&s);
  mdl_grammar_seq_free(&d);
  return r;
}

int mdl_js_literal(mdl_js_ctx *c, const char *text) {
  mdl_grammar_seq s = {0};
  mdl_js_lit(c, &s, text);
  return mdl_js_rule_of(c, &s);
}

// "{" ws "}" | "{" ws M (ws "," ws M)* ws "}" with M = string ws ":" ws value: an object of any keys.
int mdl_js_map(mdl_js_ctx *c, int value) {
  int r = mdl_grammar_rule_new(c->b), ws = mdl_js_ws(c);
  mdl_grammar_seq s = {0}, m = {0}, sep = {0};
  mdl_js_lit(c, &s, "{");
  mdl_js_ref(&s, ws);
  mdl_js_lit(c, &s, "}");
  mdl_grammar_alt(c->b, r, &s);
  mdl_js_ref(&m, mdl_js_string(c));
  mdl_js_ref(&m, ws);
  mdl_js_lit(c, &m, ":");
  mdl_js_ref(&m, ws);
  mdl_js_ref(&m, value);
  mdl_js_ref(&sep, ws);
  mdl_js_lit(c, &sep, ",");
  mdl_js_ref(&sep, ws);
  s.n = 0;
  mdl_js_lit(c, &s, "{");
  mdl_js_ref(&s, ws);
  mdl_js_ref(&s, mdl_grammar_repeat(c->b, &m, &sep, 1, -1));
  mdl_js_ref(&s, ws);
  mdl_js_lit(c, &s, "}");
  mdl_grammar_alt(c->b, r, &s);
  mdl_grammar_seq_free(&s);
  mdl_grammar_seq_free(&m);
  mdl_grammar_seq_free(&sep);
  return r;
}

// "[" ws "]" (when min is 0) | "[" ws item (ws "," ws item){min-1..max-1} ws "]"
int mdl_js_list(mdl_js_ctx *c, int item, int min, int max) {
  int r = mdl_grammar_rule_new(c->b), ws = mdl_js_ws(c);
  mdl_grammar_seq s = {0}, it = {0}, sep = {0};
  if (min == 0) {
    mdl_js_lit(c, &s, "[");
    mdl_js_ref(&s, ws);
    mdl_js_lit(c, &s, "]");
    mdl_grammar_alt(c->b, r, &s);
  }
  if (max != 0) {
    mdl_js_ref(&it, item);
    mdl_js_ref(&sep, ws);
    mdl_js_lit(c, &sep, ",");
    mdl_js_ref(&sep, ws);
    s.n = 0;
    mdl_js_lit(c, &s, "[");
    mdl_js_ref(&s, ws);
    mdl_js_ref(&s, mdl_grammar_repeat(c->b, &it, &sep, min > 0 ? min : 1, max));
    mdl_js_ref(&s, ws);
    mdl_js_lit(c, &s, "]");
    mdl_grammar_alt(c->b, r, &s);
  }
  mdl_grammar_seq_free(&s);
  mdl_grammar_seq_free(&it);
  mdl_grammar_seq_free(&sep);
  return r;
}

int mdl_js_any(mdl_js_ctx *c) { // any JSON value
  if (c->any >= 0) return c->any;
  int r = c->any = mdl_grammar_rule_new(c->b);
  int alts[7] = {mdl_js_map(c, r), mdl_js_list(c, r, 0, -1), mdl_js_string(c), mdl_js_number(c, 0), mdl_js_literal(c, "true"),
                 mdl_js_literal(c, "false"), mdl_js_literal(c, "null")};
  c->any_obj = alts[0];
  mdl_grammar_seq s = {0};
  for (int i = 0; i < 7; i++) {
    s.n = 0;
    mdl_js_ref(&s, alts[i]);
    mdl_grammar_alt(c->b, r, &s);
  }
  mdl_grammar_seq_free(&s);
  return r;
}


// ---- regular expressions (ECMA-262 subset) for pattern and format ----
// Literals, classes [...] with ranges and negation, ., \d \w \s \D \W \S, escapes, groups (capturing, (?:...),
// named), alternation, ? * + {m} {m,} {m,n} (lazy forms read as greedy: same language), and ^ / $ at the start / end
// of a top-level alternative. Unanchored ends match anything there, as JSON Schema's search semantics say.

#define RX_MAX_DEPTH 32
#define RX_MAX_COUNT 1000 // largest {m,n} count taken as is; a larger n is generated as this (still valid)

typedef struct rx {
  mdl_js_ctx *c;
  const char *p; // (borrowed) the expression, n bytes
  size_t n, i;
  const char *param; // the keyword, for messages
  int depth;
} rx;

__attribute__((format(printf, 3, 4))) static int rx_fail(rx *x, int status, const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mdl_js_fail(x->c, status, "'%s' \"%.80s\": %s (at offset %zu)", x->param, x->p, msg, x->i);
}

// One UTF-8 code point at x->i; -1 when the bytes are not UTF-8.
static int rx_cp(rx *x, uint32_t *cp) {
  const uint8_t *s = (const uint8_t *)x->p + x->i;
  size_t left = x->n - x->i;
  uint32_t c = s[0];
  int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (!len || (size_t)len > left) return rx_fail(x, -1, "not UTF-8");
  if (len > 1) c &= 0x3Fu >> (len - 1);
  for (int k = 1; k < len; k++) {
    if ((s[k] & 0xC0) != 0x80) return rx_fail(x, -1, "not UTF-8");
    c = c << 6 | (s[k] & 0x3F);
  }
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF) || utf8_len(c) != len) return rx_fail(x, -1, "not UTF-8");
  x->i += (size_t)len;
  *cp = c;
  return 0;
}

static int hexval(char ch) {
  return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

static void add_shorthand(cp_class *k, char ch) { // \d \w \s and their complements
  cp_class t = {0};
  char lo = (char)(ch | 0x20);
  if (lo == 'd') cls_add(&t, '0', '9');
  else if (lo == 'w') cls_add(&t, '0', '9'), cls_add(&t, 'A', 'Z'), cls_add(&t, 'a', 'z'), cls_add(&t, '_', '_');
  else cls_add(&t, '\t', '\r'), cls_add(&t, ' ', ' '), cls_add(&t, 0xA0, 0xA0), cls_add(&t, 0xFEFF, 0xFEFF);
  if (ch != lo) cls_negate(&t);
  for (int i = 0; i < t.n; i++) cls_add(k, t.r[i].lo, t.r[i].hi);
  k->oom |= t.oom;
  free(t.r);
}

// After a backslash: a shorthand class (added to k, *cp = ~0u) or one code point (*cp).
static int rx_escape(rx *x, cp_class *k, uint32_t *cp) {
  if (x->i >= x->n) return rx_fail(x, -1, "a trailing backslash");
  char ch = x->p[x->i];
  *cp = ~0u;
  if (strchr("dwsDWS", ch)) {
    x->i++;
    add_shorthand(k, ch);
    return 0;
  }
  if (strchr("bB", ch)) return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "word boundaries are not supported");
  if (ch >= '1' && ch <= '9') return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "backreferences are not supported");
  if (strchr("kpPc", ch)) return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "\\%c is not supported", ch);
  static const char from[] = "ntrfv0", to[] = "\n\t\r\f\v";
  const char *at = strchr(from, ch);
  if (at) {
    x->i++;
    *cp = (uint32_t)(unsigned char)to[at - from]; // "0" maps to the terminating NUL
    return 0;
  }
  if (ch == 'x' || ch == 'u') {
    int digits = ch == 'x' ? 2 : 4;
    uint32_t v = 0;
    if (x->i + (size_t)digits >= x->n) return rx_fail(x, -1, "a short \\%c escape", ch);
    for (int d = 1; d <= digits; d++) {
      int h = hexval(x->p[x->i + (size_t)d]);
      if (h < 0) return rx_fail(x, -1, "a bad \\%c escape", ch);
      v = v << 4 | (uint32_t)h;
    }
    if (v >= 0xD800 && v <= 0xDFFF) return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "surrogate escapes are not supported");
    x->i += (size_t)digits + 1;
    *cp = v;
    return 0;
  }
  return rx_cp(x, cp); // an escaped punctuation character is itself
}

// [...] after the '['. As ECMA-262 reads it, a ']' right after '[' or '[^' ends the class: "[]" matches nothing
// (a pattern that needs it is unsatisfiable) and "[^]" any character.
static int rx_class(rx *x, cp_class *k) {
  int neg = 0;
  if (x->i < x->n && x->p[x->i] == '^') neg = 1, x->i++;
  for (;;) {
    if (x->i >= x->n) return rx_fail(x, -1, "an unterminated [");
    if (x->p[x->i] == ']') {
      x->i++;
      break;
    }
    uint32_t lo, hi;
    if (x->p[x->i] == '\\') {
      x->i++;
      if (rx_escape(x, k, &lo)) return -1;
      if (lo == ~0u) continue;
    } else if (rx_cp(x, &lo))
      return -1;
    if (x->i + 1 < x->n && x->p[x->i] == '-' && x->p[x->i + 1] != ']') {
      x->i++;
      if (x->p[x->i] == '\\') {
        x->i++;
        if (rx_escape(x, k, &hi)) return -1;
        if (hi == ~0u) return rx_fail(x, -1, "a range ending in a class");
      } else if (rx_cp(x, &hi))
        return -1;
      if (hi < lo) return rx_fail(x, -1, "a range out of order");
      cls_add(k, lo, hi);
    } else
      cls_add(k, lo, lo);
  }
  if (neg) cls_negate(k);
  return 0;
}

static int rx_alt(rx *x, int top);

// One atom into s: a group, a class, '.', an escape or a literal character.
static int rx_atom(rx *x, mdl_grammar_seq *s) {
  char ch = x->p[x->i];
  cp_class k = {0};
  int rc = 0;
  if (ch == '(') {
    x->i++;
    if (x->i + 1 < x->n && x->p[x->i] == '?') {
      if (x->p[x->i + 1] == ':') x->i += 2;
      else if (x->p[x->i + 1] == '<' || x->p[x->i + 1] == 'P') { // a named group: the name does not matter
        const char *gt = memchr(x->p + x->i, '>', x->n - x->i);
        if (!gt || (x->p[x->i + 1] == '<' && (x->p[x->i + 2] == '=' || x->p[x->i + 2] == '!')))
          return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "lookbehind is not supported");
        x->i = (size_t)(gt - x->p) + 1;
      } else
        return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "lookahead and group flags are not supported");
    }
    if (++x->depth > RX_MAX_DEPTH) return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "groups nested too deeply");
    int r = rx_alt(x, 0);
    x->depth--;
    if (r < 0 && x->c->status) return -1;
    if (x->i >= x->n || x->p[x->i] != ')') return rx_fail(x, -1, "an unbalanced (");
    x->i++;
    mdl_js_ref(s, r);
    return 0;
  }
  if (ch == '[') {
    x->i++;
    rc = rx_class(x, &k);
  } else if (ch == '.') {
    x->i++;
    cls_add(&k, '\n', '\n'), cls_add(&k, '\r', '\r'), cls_add(&k, 0x2028, 0x2029);
    cls_negate(&k);
  } else if (ch == '\\') {
    x->i++;
    uint32_t cp;
    rc = rx_escape(x, &k, &cp);
    if (!rc && cp != ~0u) cls_add(&k, cp, cp);
  } else if (strchr("*+?{", ch)) {
    rc = rx_fail(x, -1, "nothing to repeat");
  } else {
    uint32_t cp;
    rc = rx_cp(x, &cp);
    if (!rc) cls_add(&k, cp, cp);
  }
  if (!rc) mdl_grammar_seq_push(s, class_sym(x->c, &k));
  free(k.r);
  return rc || x->c->status ? -1 : 0;
}

// A quantifier at x->i into *min / *max (max -1: none); 0 when there is none, 1 when read, -1 on error.
static int rx_quant(rx *x, int *min, int *max) {
  if (x->i >= x->n) return 0;
  char ch = x->p[x->i];
  if (ch == '*') *min = 0, *max = -1;
  else if (ch == '+') *min = 1, *max = -1;
  else if (ch == '?') *min = 0, *max = 1;
  else if (ch == '{') {
    size_t j = x->i + 1;
    long m = 0, n;
    if (j >= x->n || x->p[j] < '0' || x->p[j] > '9') return rx_fail(x, -1, "a bad {m,n}");
    while (j < x->n && x->p[j] >= '0' && x->p[j] <= '9' && m < 100000) m = m * 10 + (x->p[j++] - '0');
    n = m;
    if (j < x->n && x->p[j] == ',') {
      j++;
      n = -1;
      if (j < x->n && x->p[j] >= '0' && x->p[j] <= '9')
        for (n = 0; j < x->n && x->p[j] >= '0' && x->p[j] <= '9' && n < 100000;) n = n * 10 + (x->p[j++] - '0');
    }
    if (j >= x->n || x->p[j] != '}') return rx_fail(x, -1, "a bad {m,n}");
    if (n >= 0 && n < m) return rx_fail(x, -1, "{m,n} with n < m");
    if (m > RX_MAX_COUNT) return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "counts over %d are not supported", RX_MAX_COUNT);
    *min = (int)m;
    *max = n > RX_MAX_COUNT ? RX_MAX_COUNT : (int)n;
    x->i = j;
  } else
    return 0;
  x->i++;
  if (x->i < x->n && x->p[x->i] == '?') x->i++; // lazy: the same language
  if (x->i < x->n && strchr("*+?{", x->p[x->i])) return rx_fail(x, -1, "nothing to repeat");
  return 1;
}

// One alternative into s. At the top level a leading ^ / trailing $ anchors it; without them anything may come
// before / after.
static int rx_concat(rx *x, int top, mdl_grammar_seq *s) {
  int end_anchor = 0;
  if (top) {
    if (x->i < x->n && x->p[x->i] == '^') x->i++;
    else mdl_js_ref(s, chars_rule(x->c));
  }
  while (x->i < x->n && x->p[x->i] != '|' && x->p[x->i] != ')') {
    if (x->p[x->i] == '$') {
      x->i++;
      if (!top || (x->i < x->n && x->p[x->i] != '|'))
        return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "'$' is supported only at the end");
      end_anchor = 1;
      break;
    }
    if (x->p[x->i] == '^') return rx_fail(x, MDL_GRAMMAR_UNSUPPORTED, "'^' is supported only at the start");
    mdl_grammar_seq atom = {0};
    int min = 1, max = 1, q;
    if (rx_atom(x, &atom) || (q = rx_quant(x, &min, &max)) < 0) {
      mdl_grammar_seq_free(&atom);
      return -1;
    }
    if (q) mdl_js_ref(s, mdl_grammar_repeat(x->c->b, &atom, NULL, min, max));
    else mdl_grammar_seq_append(s, &atom);
    mdl_grammar_seq_free(&atom);
  }
  if (top && !end_anchor) mdl_js_ref(s, chars_rule(x->c));
  return 0;
}

static int rx_alt(rx *x, int top) {
  int r = mdl_grammar_rule_new(x->c->b);
  for (;;) {
    mdl_grammar_seq s = {0};
    int rc = rx_concat(x, top, &s);
    if (!rc) mdl_grammar_alt(x->c->b, r, &s);
    mdl_grammar_seq_free(&s);
    if (rc) return -1;
    if (x->i < x->n && x->p[x->i] == '|') {
      x->i++;
      continue;
    }
    return r;
  }
}

int mdl_js_regex(mdl_js_ctx *c, const char *re, const char *param, mdl_grammar_seq *s) {
  rx x = {c, re, strlen(re), 0, param, 0};
  int r = rx_alt(&x, 1);
  if (r < 0 || c->status) return -1;
  if (x.i < x.n) return rx_fail(&x, -1, "an unbalanced )");
  mdl_js_ref(s, r);
  return 0;
}
