// models/jinja_value.c: the Jinja interpreter's arena and values: strings with request-text spans, lists, dicts,
// Python's truth, equality and str(), and JSON in (the render context) and out (tojson) as Python's json module.
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/jinja_int.h"
#include "util/err.h"

struct jj_chunk {
  jj_chunk *next;
  size_t size, used;
  _Alignas(16) char data[];
};

_Noreturn void jj_fail(jj_arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (a->err && a->errlen) vsnprintf(a->err, a->errlen, fmt, ap);
  va_end(ap);
  longjmp(*a->fail, 1);
}

void *jj_alloc(jj_arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n == 0) n = 16;
  if (a->budget && a->used + n > a->budget) jj_fail(a, "render holds more than %zu MiB", a->budget >> 20);
  jj_chunk *c = a->head;
  if (!c || c->size - c->used < n) {
    size_t sz = n > (64u << 10) ? n : (64u << 10);
    c = malloc(sizeof(*c) + sz);
    if (!c) jj_fail(a, "out of memory");
    c->size = sz;
    c->used = 0;
    c->next = a->head;
    a->head = c;
  }
  void *p = c->data + c->used;
  c->used += n;
  a->used += n;
  memset(p, 0, n);
  return p;
}

void jj_arena_free(jj_arena *a) {
  for (jj_chunk *c = a->head, *nx; c; c = nx) {
    nx = c->next;
    free(c);
  }
  a->head = NULL;
  a->used = 0;
}

// ---- strings ----

const jj_str *jj_str_new(jj_arena *a, const char *p, size_t n, int req) {
  jj_str *s = jj_alloc(a, sizeof(*s) + n + 1);
  char *d = (char *)(s + 1);
  if (n) memcpy(d, p, n);
  s->p = d;
  s->n = n;
  if (req && n) {
    size_t *sp = jj_alloc(a, 2 * sizeof(size_t));
    sp[0] = 0;
    sp[1] = n;
    s->sp = sp;
    s->nsp = 1;
  }
  return s;
}

static void sb_grow(jj_arena *a, jj_sbuf *b, size_t add) {
  if (b->limit && b->n + add > b->limit) jj_fail(a, "output longer than %zu bytes", b->limit);
  if (b->n + add + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap * 2 : 256;
  while (cap < b->n + add + 1) cap *= 2;
  char *p = jj_alloc(a, cap);
  if (b->n) memcpy(p, b->p, b->n);
  b->p = p;
  b->cap = cap;
}

static void sb_span(jj_arena *a, jj_sbuf *b, size_t off, size_t len) {
  if (!len) return;
  if (b->nsp && b->sp[2 * b->nsp - 2] + b->sp[2 * b->nsp - 1] == off) {
    b->sp[2 * b->nsp - 1] += len; // adjacent: merge
    return;
  }
  if (b->nsp == b->spcap) {
    size_t cap = b->spcap ? b->spcap * 2 : 8;
    size_t *sp = jj_alloc(a, cap * 2 * sizeof(size_t));
    if (b->nsp) memcpy(sp, b->sp, b->nsp * 2 * sizeof(size_t));
    b->sp = sp;
    b->spcap = cap;
  }
  b->sp[2 * b->nsp] = off;
  b->sp[2 * b->nsp + 1] = len;
  b->nsp++;
}

void jj_sb_put(jj_arena *a, jj_sbuf *b, const char *p, size_t n, int req) {
  sb_grow(a, b, n);
  if (n) memcpy(b->p + b->n, p, n);
  if (req) sb_span(a, b, b->n, n);
  b->n += n;
  b->p[b->n] = 0;
}

void jj_sb_str(jj_arena *a, jj_sbuf *b, const jj_str *s) {
  size_t base = b->n;
  jj_sb_put(a, b, s->p, s->n, 0);
  for (size_t i = 0; i < s->nsp; i++) sb_span(a, b, base + s->sp[2 * i], s->sp[2 * i + 1]);
}

const jj_str *jj_sb_done(jj_arena *a, jj_sbuf *b) {
  jj_str *s = jj_alloc(a, sizeof(*s));
  s->p = b->p ? b->p : "";
  s->n = b->n;
  s->sp = b->sp;
  s->nsp = b->nsp;
  return s;
}

const jj_str *jj_str_cat(jj_arena *a, const jj_str *x, const jj_str *y) {
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  jj_sb_str(a, &b, x);
  jj_sb_str(a, &b, y);
  return jj_sb_done(a, &b);
}

// markupsafe.escape: & < > ' " as HTML entities (a request string stays request text whole).
static const jj_str *html_escape(jj_arena *a, const jj_str *s) {
  if (s->markup) return s;
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  for (size_t i = 0; i < s->n; i++) {
    const char *e = NULL;
    switch (s->p[i]) {
    case '&': e = "&amp;"; break;
    case '<': e = "&lt;"; break;
    case '>': e = "&gt;"; break;
    case '\'': e = "&#39;"; break;
    case '"': e = "&#34;"; break;
    default: break;
    }
    if (e) jj_sb_put(a, &b, e, strlen(e), 0);
    else jj_sb_put(a, &b, s->p + i, 1, 0);
  }
  return jj_str_new(a, b.p ? b.p : "", b.n, s->nsp != 0);
}

const jj_str *jj_markup_cat(jj_arena *a, const jj_str *x, const jj_str *y) {
  jj_str *s = (jj_str *)jj_str_cat(a, html_escape(a, x), html_escape(a, y));
  s->markup = 1;
  return s;
}

// The code point whose UTF-8 starts at byte i (*len its bytes; a bad or cut sequence reads as its first byte).
static uint32_t utf8_at(const char *p, size_t n, size_t i, size_t *len) {
  const unsigned char *u = (const unsigned char *)p + i;
  uint32_t c = u[0];
  size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  if (i + l > n) l = 1;
  *len = l;
  if (l == 4) return (c & 7u) << 18 | (u[1] & 63u) << 12 | (u[2] & 63u) << 6 | (u[3] & 63u);
  if (l == 3) return (c & 15u) << 12 | (u[1] & 63u) << 6 | (u[2] & 63u);
  if (l == 2) return (c & 31u) << 6 | (u[1] & 63u);
  return c;
}

// Python's str.isspace for the code point at byte i (back: the one ending just before i); *len its UTF-8 length.
int jj_isspace_at(const char *p, size_t n, size_t i, int back, size_t *len) {
  size_t s = i;
  if (back) {
    if (i == 0) return 0;
    s = i - 1;
    while (s > 0 && ((unsigned char)p[s] & 0xC0) == 0x80 && i - s < 4) s--;
  } else if (i >= n) {
    return 0;
  }
  size_t l;
  uint32_t c = utf8_at(p, n, s, &l);
  if (back && s + l != i) return 0;
  *len = l;
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// Not str.isprintable(): controls, format characters, separators but the space, private use, surrogates (what
// repr() escapes; unassigned code points, which Python escapes too, are not known here and print as they are).
static int unprintable(uint32_t c) {
  return c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad || (c >= 0x600 && c <= 0x605) || c == 0x61c ||
         c == 0x6dd || c == 0x70f || c == 0x8e2 || c == 0x1680 || c == 0x180e || (c >= 0x2000 && c <= 0x200f) ||
         (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x2064) || (c >= 0x2066 && c <= 0x206f) ||
         c == 0x3000 || (c >= 0xd800 && c <= 0xf8ff) || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb) ||
         (c >= 0xe0000 && c <= 0xe007f) || c >= 0xf0000;
}

// ---- containers ----

jj_list *jj_list_new(jj_arena *a, size_t cap) {
  jj_list *l = jj_alloc(a, sizeof(*l));
  l->cap = cap ? cap : 4;
  l->v = jj_alloc(a, l->cap * sizeof(jj_val));
  return l;
}

void jj_list_push(jj_arena *a, jj_list *l, jj_val v) {
  if (l->n == l->cap) {
    jj_val *nv = jj_alloc(a, l->cap * 2 * sizeof(jj_val));
    memcpy(nv, l->v, l->n * sizeof(jj_val));
    l->v = nv;
    l->cap *= 2;
  }
  l->v[l->n++] = v;
}

jj_dict *jj_dict_new(jj_arena *a, size_t cap) {
  jj_dict *d = jj_alloc(a, sizeof(*d));
  d->cap = cap ? cap : 4;
  d->k = jj_alloc(a, d->cap * sizeof(jj_val));
  d->v = jj_alloc(a, d->cap * sizeof(jj_val));
  return d;
}

void jj_dict_set(jj_arena *a, jj_dict *d, jj_val k, jj_val v) {
  for (size_t i = 0; i < d->n; i++) {
    if (jj_equal(d->k[i], k)) {
      d->v[i] = v;
      return;
    }
  }
  if (d->n == d->cap) {
    jj_val *nk = jj_alloc(a, d->cap * 2 * sizeof(jj_val)), *nv = jj_alloc(a, d->cap * 2 * sizeof(jj_val));
    memcpy(nk, d->k, d->n * sizeof(jj_val));
    memcpy(nv, d->v, d->n * sizeof(jj_val));
    d->k = nk;
    d->v = nv;
    d->cap *= 2;
  }
  d->k[d->n] = k;
  d->v[d->n++] = v;
}

int jj_dict_get(const jj_dict *d, const char *key, size_t kn, jj_val *out) {
  for (size_t i = 0; i < d->n; i++) {
    const jj_val *k = &d->k[i];
    if (k->t == JV_STR && k->s->n == kn && memcmp(k->s->p, key, kn) == 0) {
      *out = d->v[i];
      return 1;
    }
  }
  return 0;
}

int jj_dict_find(const jj_dict *d, jj_val k, jj_val *out) {
  for (size_t i = 0; i < d->n; i++) {
    if (jj_equal(d->k[i], k)) {
      *out = d->v[i];
      return 1;
    }
  }
  return 0;
}

// ---- Python semantics ----

int jj_truthy(jj_val v) {
  switch (v.t) {
  case JV_UNDEF: case JV_NONE: return 0;
  case JV_BOOL: return v.b;
  case JV_INT: return v.i != 0;
  case JV_FLOAT: return v.f != 0;
  case JV_STR: return v.s->n != 0;
  case JV_LIST: return v.l->gen || v.l->n != 0;
  case JV_DICT: return v.d->n != 0;
  default: return 1;
  }
}

static int is_num(jj_val v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static double num_f(jj_val v) { return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : (double)v.b; }

int jj_equal(jj_val x, jj_val y) {
  if (is_num(x) && is_num(y)) {
    if (x.t != JV_FLOAT && y.t != JV_FLOAT) return (x.t == JV_INT ? x.i : x.b) == (y.t == JV_INT ? y.i : y.b);
    return num_f(x) == num_f(y);
  }
  if (x.t != y.t) return 0;
  switch (x.t) {
  case JV_UNDEF: case JV_NONE: return 1;
  case JV_STR: return x.s->n == y.s->n && memcmp(x.s->p, y.s->p, x.s->n) == 0;
  case JV_LIST:
    if (x.l->gen || y.l->gen || x.l->view || y.l->view) return x.l == y.l;
    if (x.l->n != y.l->n) return 0;
    for (size_t i = 0; i < x.l->n; i++)
      if (!jj_equal(x.l->v[i], y.l->v[i])) return 0;
    return 1;
  case JV_DICT:
    if (x.d->n != y.d->n) return 0;
    for (size_t i = 0; i < x.d->n; i++) {
      jj_val o;
      if (!jj_dict_find(y.d, x.d->k[i], &o) || !jj_equal(x.d->v[i], o)) return 0;
    }
    return 1;
  case JV_NS: return x.d == y.d;
  case JV_LOOP: return x.loop == y.loop;
  case JV_MACRO: return x.macro == y.macro;
  case JV_FUNC: return x.fn == y.fn;
  default: return 0;
  }
}

int jj_has_req(jj_val v) {
  if (v.t == JV_STR) return v.s->nsp != 0;
  if (v.t == JV_LIST) {
    for (size_t i = 0; i < v.l->n; i++)
      if (jj_has_req(v.l->v[i])) return 1;
  }
  if (v.t == JV_DICT || v.t == JV_NS) {
    for (size_t i = 0; i < v.d->n; i++)
      if (jj_has_req(v.d->k[i]) || jj_has_req(v.d->v[i])) return 1;
  }
  return 0;
}

const char *jj_type_name(jj_val v) {
  static const char *names[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                "Namespace", "LoopContext", "Macro", "function"};
  if (v.t == JV_LIST && v.l->tuple) return "tuple";
  if (v.t == JV_LIST && v.l->gen) return "generator";
  if (v.t == JV_LIST && v.l->view) return v.l->view == 1 ? "dict_keys" : v.l->view == 2 ? "dict_values" : "dict_items";
  return names[v.t];
}

// Python's repr(float): the shortest digits that read back the same, fixed notation for exponents in [-4, 16).
static void float_repr(double f, char *out, size_t cap) {
  if (isnan(f)) { snprintf(out, cap, "nan"); return; }
  if (isinf(f)) { snprintf(out, cap, f < 0 ? "-inf" : "inf"); return; }
  char e[40];
  for (int p = 1; p <= 17; p++) {
    snprintf(e, sizeof e, "%.*e", p - 1, f);
    if (strtod(e, NULL) == f) break;
  }
  // e: [-]d[.ddd]e[+-]xx
  char digits[24];
  size_t nd = 0;
  const char *q = e;
  int neg = *q == '-';
  if (neg) q++;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[nd++] = *q;
  int exp = atoi(q + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  char *o = out;
  size_t left = cap;
#define PUT(...) do { int k_ = snprintf(o, left, __VA_ARGS__); if (k_ > 0 && (size_t)k_ < left) { o += k_; left -= (size_t)k_; } } while (0)
  if (neg) PUT("-");
  if (exp >= 16 || exp < -4) {
    PUT("%c", digits[0]);
    if (nd > 1) PUT(".%.*s", (int)nd - 1, digits + 1);
    PUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  } else if (exp < 0) {
    PUT("0.");
    for (int i = -1; i > exp; i--) PUT("0");
    PUT("%.*s", (int)nd, digits);
  } else {
    for (int i = 0; i <= exp; i++) PUT("%c", (size_t)i < nd ? digits[i] : '0');
    PUT(".");
    if ((size_t)exp + 1 < nd) PUT("%.*s", (int)(nd - (size_t)exp - 1), digits + exp + 1);
    else PUT("0");
  }
#undef PUT
}

static void put_repr_str(jj_arena *a, jj_sbuf *b, const jj_str *s) {
  int dq = memchr(s->p, '\'', s->n) && !memchr(s->p, '"', s->n);
  char q = dq ? '"' : '\'';
  jj_sb_put(a, b, &q, 1, 0);
  for (size_t i = 0; i < s->n; i++) {
    unsigned char c = (unsigned char)s->p[i];
    char tmp[12];
    if (c == '\\' || c == (unsigned char)q) { tmp[0] = '\\'; tmp[1] = (char)c; jj_sb_put(a, b, tmp, 2, 0); }
    else if (c == '\n') jj_sb_put(a, b, "\\n", 2, 0);
    else if (c == '\r') jj_sb_put(a, b, "\\r", 2, 0);
    else if (c == '\t') jj_sb_put(a, b, "\\t", 2, 0);
    else {
      size_t l;
      uint32_t cp = utf8_at(s->p, s->n, i, &l);
      if (!unprintable(cp)) jj_sb_put(a, b, s->p + i, l, 0);
      else jj_sb_put(a, b, tmp, (size_t)snprintf(tmp, sizeof tmp, cp <= 0xff ? "\\x%02x" : cp <= 0xffff ? "\\u%04x" : "\\U%08x", cp), 0);
      i += l - 1;
    }
  }
  jj_sb_put(a, b, &q, 1, 0);
}

static void put_repr(jj_arena *a, jj_sbuf *b, jj_val v, int top, int depth) {
  char tmp[48];
  if (depth > 256) jj_fail(a, "value nested too deeply to print");
  switch (v.t) {
  case JV_UNDEF:
    if (!top) jj_sb_put(a, b, "Undefined", 9, 0); // repr(Undefined) inside a container
    break;
  case JV_NONE: jj_sb_put(a, b, "None", 4, 0); break;
  case JV_BOOL: jj_sb_put(a, b, v.b ? "True" : "False", v.b ? 4 : 5, 0); break;
  case JV_INT: jj_sb_put(a, b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%lld", (long long)v.i), 0); break;
  case JV_FLOAT: float_repr(v.f, tmp, sizeof tmp); jj_sb_put(a, b, tmp, strlen(tmp), 0); break;
  case JV_STR:
    if (top) jj_sb_str(a, b, v.s);
    else put_repr_str(a, b, v.s);
    break;
  case JV_LIST:
    if (v.l->gen) jj_fail(a, "cannot print a generator (jinja2 prints its address): apply |list");
    if (v.l->view) jj_sb_put(a, b, jj_type_name(v), strlen(jj_type_name(v)), 0), jj_sb_put(a, b, "(", 1, 0);
    jj_sb_put(a, b, v.l->tuple ? "(" : "[", 1, 0);
    for (size_t i = 0; i < v.l->n; i++) {
      if (i) jj_sb_put(a, b, ", ", 2, 0);
      put_repr(a, b, v.l->v[i], 0, depth + 1);
    }
    if (v.l->tuple && v.l->n == 1) jj_sb_put(a, b, ",", 1, 0);
    jj_sb_put(a, b, v.l->tuple ? ")" : "]", 1, 0);
    if (v.l->view) jj_sb_put(a, b, ")", 1, 0);
    break;
  case JV_DICT:
    jj_sb_put(a, b, "{", 1, 0);
    for (size_t i = 0; i < v.d->n; i++) {
      if (i) jj_sb_put(a, b, ", ", 2, 0);
      put_repr(a, b, v.d->k[i], 0, depth + 1);
      jj_sb_put(a, b, ": ", 2, 0);
      put_repr(a, b, v.d->v[i], 0, depth + 1);
    }
    jj_sb_put(a, b, "}", 1, 0);
    break;
  default: jj_fail(a, "cannot print a %s", jj_type_name(v));
  }
}

const jj_str *jj_to_str(jj_arena *a, jj_val v) {
  if (v.t == JV_STR) return v.s;
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  put_repr(a, &b, v, 1, 0);
  const jj_str *s = jj_sb_done(a, &b);
  if (s->n && jj_has_req(v)) return jj_str_new(a, s->p, s->n, 1); // a repr of request text is request text whole
  return s;
}

// ---- JSON out: json.dumps(ensure_ascii=False) ----

static void put_json_str(jj_arena *a, jj_sbuf *b, const jj_str *s, int ascii) {
  jj_sb_put(a, b, "\"", 1, 0);
  for (size_t i = 0; i < s->n; i++) {
    unsigned char c = (unsigned char)s->p[i];
    char tmp[12];
    if (c == '"' || c == '\\') { tmp[0] = '\\'; tmp[1] = (char)c; jj_sb_put(a, b, tmp, 2, 0); }
    else if (c == '\n') jj_sb_put(a, b, "\\n", 2, 0);
    else if (c == '\r') jj_sb_put(a, b, "\\r", 2, 0);
    else if (c == '\t') jj_sb_put(a, b, "\\t", 2, 0);
    else if (c == '\b') jj_sb_put(a, b, "\\b", 2, 0);
    else if (c == '\f') jj_sb_put(a, b, "\\f", 2, 0);
    else if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); jj_sb_put(a, b, tmp, 6, 0); }
    else if (c >= 0x80 && ascii) { // \uXXXX, as a surrogate pair above the BMP
      size_t l;
      uint32_t cp = utf8_at(s->p, s->n, i, &l);
      i += l - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        snprintf(tmp, sizeof tmp, "\\u%04x", 0xD800 + (cp >> 10));
        jj_sb_put(a, b, tmp, 6, 0);
        cp = 0xDC00 + (cp & 0x3FF);
      }
      snprintf(tmp, sizeof tmp, "\\u%04x", cp);
      jj_sb_put(a, b, tmp, 6, 0);
    }
    else jj_sb_put(a, b, (const char *)&c, 1, 0);
  }
  jj_sb_put(a, b, "\"", 1, 0);
}

static void json_nl(jj_arena *a, jj_sbuf *b, int indent, int level) {
  jj_sb_put(a, b, "\n", 1, 0);
  for (int i = 0; i < indent * level; i++) jj_sb_put(a, b, " ", 1, 0);
}

static void put_json(jj_arena *a, jj_sbuf *b, jj_val v, int indent, int ascii, int level) {
  char tmp[48];
  if (level > 256) jj_fail(a, "value nested too deeply for tojson");
  switch (v.t) {
  case JV_NONE: jj_sb_put(a, b, "null", 4, 0); break;
  case JV_BOOL: jj_sb_put(a, b, v.b ? "true" : "false", v.b ? 4 : 5, 0); break;
  case JV_INT: jj_sb_put(a, b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%lld", (long long)v.i), 0); break;
  case JV_FLOAT:
    if (isnan(v.f)) jj_sb_put(a, b, "NaN", 3, 0);
    else if (isinf(v.f)) jj_sb_put(a, b, v.f < 0 ? "-Infinity" : "Infinity", v.f < 0 ? 9 : 8, 0);
    else { float_repr(v.f, tmp, sizeof tmp); jj_sb_put(a, b, tmp, strlen(tmp), 0); }
    break;
  case JV_STR: put_json_str(a, b, v.s, ascii); break;
  case JV_LIST:
    if (v.l->gen || v.l->view) jj_fail(a, "tojson: Object of type %s is not JSON serializable", jj_type_name(v));
    if (!v.l->n) { jj_sb_put(a, b, "[]", 2, 0); break; }
    jj_sb_put(a, b, "[", 1, 0);
    for (size_t i = 0; i < v.l->n; i++) {
      if (i) jj_sb_put(a, b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2, 0);
      if (indent >= 0) json_nl(a, b, indent, level + 1);
      put_json(a, b, v.l->v[i], indent, ascii, level + 1);
    }
    if (indent >= 0) json_nl(a, b, indent, level);
    jj_sb_put(a, b, "]", 1, 0);
    break;
  case JV_DICT:
    if (!v.d->n) { jj_sb_put(a, b, "{}", 2, 0); break; }
    jj_sb_put(a, b, "{", 1, 0);
    for (size_t i = 0; i < v.d->n; i++) {
      if (i) jj_sb_put(a, b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2, 0);
      if (indent >= 0) json_nl(a, b, indent, level + 1);
      jj_val k = v.d->k[i];
      if (k.t == JV_STR) put_json_str(a, b, k.s, ascii);
      else if (k.t == JV_NONE || k.t == JV_BOOL || k.t == JV_INT || k.t == JV_FLOAT) {
        jj_sb_put(a, b, "\"", 1, 0); // json.dumps writes a scalar key as its JSON text in quotes
        put_json(a, b, k, -1, ascii, level + 1);
        jj_sb_put(a, b, "\"", 1, 0);
      } else jj_fail(a, "tojson: keys must be str, int, float, bool or None, not %s", jj_type_name(k));
      jj_sb_put(a, b, ": ", 2, 0);
      put_json(a, b, v.d->v[i], indent, ascii, level + 1);
    }
    if (indent >= 0) json_nl(a, b, indent, level);
    jj_sb_put(a, b, "}", 1, 0);
    break;
  default: jj_fail(a, "tojson: a %s is not JSON serializable", jj_type_name(v));
  }
}

const jj_str *jj_to_json(jj_arena *a, jj_val v, int indent, int ascii) {
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  put_json(a, &b, v, indent, ascii, 0);
  return jj_str_new(a, b.p, b.n, jj_has_req(v));
}

// ---- JSON in: json.loads, ints exact (int64), strings below the top level marked as request text ----

typedef struct jin {
  jj_arena *a;
  const char *p, *e;
} jin;

static void ws(jin *j) {
  while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static unsigned hex4(jin *j) {
  if (j->e - j->p < 4) jj_fail(j->a, "context: bad \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = *j->p++;
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else jj_fail(j->a, "context: bad \\u escape");
  }
  return v;
}

void jj_sb_utf8(jj_arena *a, jj_sbuf *b, uint32_t c) {
  char t[4];
  size_t n;
  if (c < 0x80) t[0] = (char)c, n = 1;
  else if (c < 0x800) t[0] = (char)(0xC0 | c >> 6), t[1] = (char)(0x80 | (c & 63)), n = 2;
  else if (c < 0x10000) t[0] = (char)(0xE0 | c >> 12), t[1] = (char)(0x80 | (c >> 6 & 63)), t[2] = (char)(0x80 | (c & 63)), n = 3;
  else t[0] = (char)(0xF0 | c >> 18), t[1] = (char)(0x80 | (c >> 12 & 63)), t[2] = (char)(0x80 | (c >> 6 & 63)),
       t[3] = (char)(0x80 | (c & 63)), n = 4;
  jj_sb_put(a, b, t, n, 0);
}

static const jj_str *jstring(jin *j, int req) {
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  j->p++;
  for (;;) {
    if (j->p >= j->e) jj_fail(j->a, "context: unterminated string");
    unsigned char c = (unsigned char)*j->p++;
    if (c == '"') break;
    if (c < 0x20) jj_fail(j->a, "context: control character in a string");
    if (c != '\\') { jj_sb_put(j->a, &b, (const char *)&c, 1, 0); continue; }
    if (j->p >= j->e) jj_fail(j->a, "context: unterminated string");
    c = (unsigned char)*j->p++;
    const char *m = strchr("\"\\/bfnrt", c);
    if (c && m) { jj_sb_put(j->a, &b, &"\"\\/\b\f\n\r\t"[m - "\"\\/bfnrt"], 1, 0); continue; }
    if (c != 'u') jj_fail(j->a, "context: bad escape '\\%c'", c);
    uint32_t u = hex4(j);
    if (u >= 0xD800 && u < 0xDC00 && j->e - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') {
      const char *save = j->p;
      j->p += 2;
      uint32_t lo = hex4(j);
      if (lo >= 0xDC00 && lo < 0xE000) u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
      else j->p = save;
    }
    if (u >= 0xD800 && u < 0xE000) jj_fail(j->a, "context: lone surrogate in a string");
    jj_sb_utf8(j->a, &b, u);
  }
  return jj_str_new(j->a, b.p ? b.p : "", b.n, req);
}

static jj_val jvalue(jin *j, int depth) {
  if (depth > 200) jj_fail(j->a, "context: nested deeper than 200");
  ws(j);
  if (j->p >= j->e) jj_fail(j->a, "context: unexpected end of JSON");
  char c = *j->p;
  if (c == '"') return jj_strv(jstring(j, depth > 1)); // the top object's own strings are the caller's
  if (c == '{') {
    jj_dict *d = jj_dict_new(j->a, 4);
    j->p++;
    ws(j);
    if (j->p < j->e && *j->p == '}') { j->p++; return (jj_val){.t = JV_DICT, .d = d}; }
    for (;;) {
      ws(j);
      if (j->p >= j->e || *j->p != '"') jj_fail(j->a, "context: expected a key");
      jj_val k = jj_strv(jstring(j, depth > 0));
      ws(j);
      if (j->p >= j->e || *j->p != ':') jj_fail(j->a, "context: expected ':'");
      j->p++;
      jj_dict_set(j->a, d, k, jvalue(j, depth + 1));
      ws(j);
      if (j->p < j->e && *j->p == ',') { j->p++; continue; }
      if (j->p < j->e && *j->p == '}') { j->p++; break; }
      jj_fail(j->a, "context: expected ',' or '}'");
    }
    return (jj_val){.t = JV_DICT, .d = d};
  }
  if (c == '[') {
    jj_list *l = jj_list_new(j->a, 4);
    j->p++;
    ws(j);
    if (j->p < j->e && *j->p == ']') { j->p++; return (jj_val){.t = JV_LIST, .l = l}; }
    for (;;) {
      jj_list_push(j->a, l, jvalue(j, depth + 1));
      ws(j);
      if (j->p < j->e && *j->p == ',') { j->p++; continue; }
      if (j->p < j->e && *j->p == ']') { j->p++; break; }
      jj_fail(j->a, "context: expected ',' or ']'");
    }
    return (jj_val){.t = JV_LIST, .l = l};
  }
  static const struct { const char *w; uint8_t t; int b; } words[] = {
      {"true", JV_BOOL, 1}, {"false", JV_BOOL, 0}, {"null", JV_NONE, 0}};
  for (size_t i = 0; i < 3; i++) {
    size_t n = strlen(words[i].w);
    if ((size_t)(j->e - j->p) >= n && memcmp(j->p, words[i].w, n) == 0) {
      j->p += n;
      return (jj_val){.t = words[i].t, .b = words[i].b};
    }
  }
  const char *s = j->p;
  if (j->p < j->e && *j->p == '-') j->p++;
  if (j->p >= j->e || *j->p < '0' || *j->p > '9') jj_fail(j->a, "context: unexpected character '%c'", c);
  int isf = 0;
  while (j->p < j->e && ((*j->p >= '0' && *j->p <= '9') || *j->p == '.' || *j->p == 'e' || *j->p == 'E' ||
                         ((*j->p == '+' || *j->p == '-') && (j->p[-1] == 'e' || j->p[-1] == 'E')))) {
    if (*j->p == '.' || *j->p == 'e' || *j->p == 'E') isf = 1;
    j->p++;
  }
  char buf[64];
  size_t n = (size_t)(j->p - s);
  if (n >= sizeof buf) jj_fail(j->a, "context: number too long");
  memcpy(buf, s, n);
  buf[n] = 0;
  char *end;
  if (!isf) {
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (*end || errno == ERANGE) jj_fail(j->a, "context: integer %s out of range", buf);
    return jj_int(v);
  }
  double f = strtod(buf, &end);
  if (*end) jj_fail(j->a, "context: bad number '%s'", buf);
  return jj_float(f);
}

jj_val jj_from_json(jj_arena *a, const char *p, size_t n) {
  jin j = {a, p, p + n};
  jj_val v = jvalue(&j, 0);
  ws(&j);
  if (j.p != j.e) jj_fail(a, "context: trailing bytes after the JSON value");
  return v;
}
