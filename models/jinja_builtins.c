// models/jinja_builtins.c: the Jinja filters, tests, string and dict methods and global functions the chat templates
// call, each as jinja2 (and Python's str) defines it. A result computed from request text is request text as a whole.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/jinja_int.h"

#define NAME_IS(n, w) (strcmp((n), (w)) == 0)

static jj_val str_of(jj_render *r, const jj_str *from, const char *p, size_t n) {
  return jj_strv(jj_str_new(r->a, p, n, from->nsp != 0));
}

static const jj_str *need_str(jj_render *r, jj_val v, const char *what) {
  if (v.t != JV_STR) jj_rfail(r, "%s expects a string, not %s", what, jj_type_name(v));
  return v.s;
}

static jj_val kwarg(const char **kwn, jj_val *kwv, size_t nkw, const char *name, jj_val *args, size_t nargs,
                    size_t pos, jj_val dflt) {
  for (size_t i = 0; i < nkw; i++)
    if (NAME_IS(kwn[i], name)) return kwv[i];
  return pos < nargs ? args[pos] : dflt;
}

// ---- strip, split, case ----

static size_t cp_len(const char *p, size_t n, size_t i) {
  unsigned char c = (unsigned char)p[i];
  size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  return i + l <= n ? l : n - i;
}

static int in_chars(const jj_str *chars, const char *p, size_t l) {
  for (size_t i = 0; i < chars->n; i += cp_len(chars->p, chars->n, i))
    if (cp_len(chars->p, chars->n, i) == l && memcmp(chars->p + i, p, l) == 0) return 1;
  return 0;
}

// Python's str.strip / lstrip / rstrip: whitespace, or the code points of chars.
static jj_val strip(jj_render *r, const jj_str *s, const jj_str *chars, int left, int right) {
  size_t b = 0, e = s->n, k;
  if (left) {
    while (b < e) {
      size_t l = cp_len(s->p, e, b);
      if (chars ? !in_chars(chars, s->p + b, l) : !jj_isspace_at(s->p, e, b, 0, &k)) break;
      b += l;
    }
  }
  if (right) {
    while (e > b) {
      size_t s0 = e - 1;
      while (s0 > b && ((unsigned char)s->p[s0] & 0xC0) == 0x80) s0--;
      if (chars ? !in_chars(chars, s->p + s0, e - s0) : !jj_isspace_at(s->p, e, e, 1, &k)) break;
      e = s0;
    }
  }
  return str_of(r, s, s->p + b, e - b);
}

static jj_val split(jj_render *r, const jj_str *s, const jj_str *sep, int64_t maxsplit) {
  jj_list *l = jj_list_new(r->a, 4);
  size_t i = 0, k;
  if (!sep) { // runs of whitespace, no empty parts
    for (;;) {
      while (i < s->n && jj_isspace_at(s->p, s->n, i, 0, &k)) i += k;
      if (i >= s->n) break;
      size_t st = i;
      if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
        size_t e = s->n;
        while (e > st && jj_isspace_at(s->p, s->n, e, 1, &k)) e -= k;
        jj_list_push(r->a, l, str_of(r, s, s->p + st, e - st));
        break;
      }
      while (i < s->n && !jj_isspace_at(s->p, s->n, i, 0, &k)) i += cp_len(s->p, s->n, i);
      jj_list_push(r->a, l, str_of(r, s, s->p + st, i - st));
    }
    return (jj_val){.t = JV_LIST, .l = l};
  }
  if (!sep->n) jj_rfail(r, "split: empty separator");
  size_t st = 0;
  const char *hit;
  while ((maxsplit < 0 || (int64_t)l->n < maxsplit) && (hit = memmem(s->p + st, s->n - st, sep->p, sep->n))) {
    jj_list_push(r->a, l, str_of(r, s, s->p + st, (size_t)(hit - s->p) - st));
    st = (size_t)(hit - s->p) + sep->n;
  }
  jj_list_push(r->a, l, str_of(r, s, s->p + st, s->n - st));
  return (jj_val){.t = JV_LIST, .l = l};
}

// Case mapping: ASCII only; Python maps every script, so other text is refused rather than rendered differently.
// mode 3 is str.title (a word starts after any non-letter), 4 jinja2's title filter (after - ( { [ < or whitespace).
static jj_val recase(jj_render *r, const jj_str *s, int mode /* 0 lower 1 upper 2 capitalize 3, 4 title */) {
  char *p = jj_alloc(r->a, s->n + 1);
  int start = 1;
  for (size_t i = 0; i < s->n; i++) {
    char c = s->p[i];
    if ((unsigned char)c >= 0x80) jj_rfail(r, "changing the case of non-ASCII text is not supported");
    int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (mode == 4) start = i == 0 || strchr("-({[< \t\n\r\v\f\x1c\x1d\x1e\x1f", s->p[i - 1]);
    int up = mode == 1 || (mode == 2 && i == 0) || (mode >= 3 && start);
    if (alpha) c = up ? (char)(c & ~0x20) : (char)(c | 0x20);
    start = mode == 3 ? !alpha : 0;
    p[i] = c;
  }
  return str_of(r, s, p, s->n);
}

static jj_val replace(jj_render *r, const jj_str *s, const jj_str *old, const jj_str *nw, int64_t count) {
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  size_t i = 0;
  int64_t done = 0;
  int req = s->nsp || nw->nsp || old->nsp;
  while (old->n && i < s->n && (count < 0 || done < count)) { // memmem: linear, where a scan per byte is not
    const char *hit = memmem(s->p + i, s->n - i, old->p, old->n);
    if (!hit) break;
    jj_sb_put(r->a, &b, s->p + i, (size_t)(hit - s->p) - i, 0);
    jj_sb_put(r->a, &b, nw->p, nw->n, 0);
    done++;
    i = (size_t)(hit - s->p) + old->n;
  }
  if (old->n) {
    jj_sb_put(r->a, &b, s->p + i, s->n - i, 0);
    return jj_strv(jj_str_new(r->a, b.p ? b.p : "", b.n, req));
  }
  while (i <= s->n) { // an empty pattern matches before every code point and at the end
    if (count < 0 || done < count) {
      jj_sb_put(r->a, &b, nw->p, nw->n, 0);
      done++;
    }
    if (i == s->n) break;
    size_t l = cp_len(s->p, s->n, i);
    jj_sb_put(r->a, &b, s->p + i, l, 0);
    i += l;
  }
  return jj_strv(jj_str_new(r->a, b.p ? b.p : "", b.n, req));
}

static int affix(const jj_str *s, const jj_str *a, int end) {
  if (a->n > s->n) return 0;
  return memcmp(s->p + (end ? s->n - a->n : 0), a->p, a->n) == 0;
}

// ---- methods ----

int jj_method(jj_render *r, jj_val self, const char *name, jj_val *args, size_t nargs, jj_val *out) {
  if (self.t == JV_STR) {
    const jj_str *s = self.s;
    if (NAME_IS(name, "strip") || NAME_IS(name, "lstrip") || NAME_IS(name, "rstrip")) {
      const jj_str *chars = nargs && args[0].t != JV_NONE ? need_str(r, args[0], name) : NULL;
      *out = strip(r, s, chars, name[0] != 'r', name[0] != 'l');
      return 1;
    }
    if (NAME_IS(name, "split")) {
      const jj_str *sep = nargs && args[0].t != JV_NONE ? need_str(r, args[0], "split") : NULL;
      int64_t maxsplit = nargs > 1 ? (args[1].t == JV_INT ? args[1].i : -1) : -1;
      *out = split(r, s, sep, maxsplit);
      return 1;
    }
    if (NAME_IS(name, "startswith") || NAME_IS(name, "endswith")) {
      if (nargs != 1) jj_rfail(r, "%s takes one argument", name);
      int end = name[0] == 'e', hit = 0;
      if (args[0].t == JV_LIST) {
        for (size_t i = 0; i < args[0].l->n; i++) hit |= affix(s, need_str(r, args[0].l->v[i], name), end);
      } else {
        hit = affix(s, need_str(r, args[0], name), end);
      }
      *out = jj_bool(hit);
      return 1;
    }
    if (NAME_IS(name, "replace")) {
      if (nargs < 2) jj_rfail(r, "replace takes two arguments");
      *out = replace(r, s, need_str(r, args[0], "replace"), need_str(r, args[1], "replace"),
                     nargs > 2 && args[2].t == JV_INT ? args[2].i : -1);
      return 1;
    }
    if (NAME_IS(name, "find")) {
      const jj_str *sub = nargs ? need_str(r, args[0], "find") : NULL;
      if (!sub) jj_rfail(r, "find takes one argument");
      const char *hit = memmem(s->p, s->n, sub->p, sub->n);
      int64_t at = 0; // in code points, as Python counts
      for (const char *q = s->p; hit && q < hit; q++) at += ((unsigned char)*q & 0xC0) != 0x80;
      *out = jj_int(hit ? at : -1);
      return 1;
    }
    static const char *cases[] = {"lower", "upper", "capitalize", "title"};
    for (int m = 0; m < 4; m++) {
      if (NAME_IS(name, cases[m])) {
        *out = recase(r, s, m);
        return 1;
      }
    }
    return 0;
  }
  if (self.t == JV_DICT) {
    if (NAME_IS(name, "items") || NAME_IS(name, "keys") || NAME_IS(name, "values")) {
      jj_list *l = jj_list_new(r->a, self.d->n);
      for (size_t i = 0; i < self.d->n; i++) {
        if (name[0] == 'k') jj_list_push(r->a, l, self.d->k[i]);
        else if (name[0] == 'v') jj_list_push(r->a, l, self.d->v[i]);
        else {
          jj_list *pair = jj_list_new(r->a, 2);
          pair->tuple = 1;
          jj_list_push(r->a, pair, self.d->k[i]);
          jj_list_push(r->a, pair, self.d->v[i]);
          jj_list_push(r->a, l, (jj_val){.t = JV_LIST, .l = pair});
        }
      }
      l->view = name[0] == 'k' ? 1 : name[0] == 'v' ? 2 : 3;
      *out = (jj_val){.t = JV_LIST, .l = l};
      return 1;
    }
    if (NAME_IS(name, "get")) {
      if (!nargs) jj_rfail(r, "get takes a key");
      if (!jj_dict_find(self.d, args[0], out)) *out = nargs > 1 ? args[1] : jj_none();
      return 1;
    }
  }
  return 0;
}

// ---- tests ----

int jj_test(jj_render *r, const char *name, jj_val v, jj_val *args, size_t nargs) {
  if (NAME_IS(name, "defined")) return v.t != JV_UNDEF;
  if (NAME_IS(name, "undefined")) return v.t == JV_UNDEF;
  if (NAME_IS(name, "none")) return v.t == JV_NONE;
  if (NAME_IS(name, "string")) return v.t == JV_STR;
  if (NAME_IS(name, "mapping")) return v.t == JV_DICT;
  if (NAME_IS(name, "iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF ||
                                        v.t == JV_LOOP;
  if (NAME_IS(name, "sequence"))
    return v.t == JV_STR || (v.t == JV_LIST && !v.l->gen && !v.l->view) || v.t == JV_DICT || v.t == JV_UNDEF;
  if (NAME_IS(name, "number")) return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
  if (NAME_IS(name, "integer")) return v.t == JV_INT;
  if (NAME_IS(name, "float")) return v.t == JV_FLOAT;
  if (NAME_IS(name, "boolean")) return v.t == JV_BOOL;
  if (NAME_IS(name, "true")) return v.t == JV_BOOL && v.b;
  if (NAME_IS(name, "false")) return v.t == JV_BOOL && !v.b;
  if (NAME_IS(name, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_UNDEF; // Undefined has __call__
  if (NAME_IS(name, "odd") || NAME_IS(name, "even") || NAME_IS(name, "divisibleby")) { // value % d as Python
    jj_val d = name[0] == 'd' ? (nargs ? args[0] : jj_undef()) : jj_int(2);
    if (v.t != JV_INT && v.t != JV_BOOL && v.t != JV_FLOAT)
      jj_rfail(r, "test '%s' expects a number, not %s", name, jj_type_name(v));
    if (d.t != JV_INT && d.t != JV_BOOL && d.t != JV_FLOAT) jj_rfail(r, "divisibleby expects a number");
    double x = v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : v.b, y = d.t == JV_FLOAT ? d.f : d.t == JV_INT ? (double)d.i : d.b;
    if (y == 0) jj_rfail(r, "integer division or modulo by zero");
    if (v.t != JV_FLOAT && d.t != JV_FLOAT) { // exact on integers
      int64_t xi = v.t == JV_INT ? v.i : v.b, yi = d.t == JV_INT ? d.i : d.b, m = yi == -1 ? 0 : xi % yi;
      if (m != 0 && ((m < 0) != (yi < 0))) m += yi;
      return name[0] == 'o' ? m == 1 : m == 0;
    }
    double m = fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return name[0] == 'o' ? m == 1 : m == 0;
  }
  static const char *const eqs[] = {"eq", "equalto", "==", "sameas"}, *const nes[] = {"ne", "!="};
  for (size_t i = 0; i < 4; i++) {
    if (NAME_IS(name, eqs[i])) {
      if (nargs != 1) jj_rfail(r, "test '%s' takes one argument", name);
      if (i == 3 && v.t != args[0].t) return 0; // sameas: `is`, so 1 is not True
      return jj_equal(v, args[0]);
    }
  }
  for (size_t i = 0; i < 2; i++) {
    if (NAME_IS(name, nes[i])) {
      if (nargs != 1) jj_rfail(r, "test '%s' takes one argument", name);
      return !jj_equal(v, args[0]);
    }
  }
  if (NAME_IS(name, "in")) {
    if (nargs != 1) jj_rfail(r, "test 'in' takes one argument");
    jj_list *l = jj_iterate(r, args[0]);
    if (args[0].t == JV_STR) {
      const jj_str *h = args[0].s, *n = need_str(r, v, "in");
      return memmem(h->p, h->n, n->p, n->n) != NULL;
    }
    for (size_t i = 0; i < l->n; i++)
      if (jj_equal(l->v[i], v)) return 1;
    return 0;
  }
  jj_rfail(r, "no test named '%s'", name);
}

// ---- filters ----

static jj_val attr_path(jj_render *r, jj_val v, const jj_str *path) {
  size_t i = 0;
  while (i <= path->n) {
    size_t e = i;
    while (e < path->n && path->p[e] != '.') e++;
    if (v.t == JV_UNDEF) return v;
    int digits = e > i;
    for (size_t k = i; k < e; k++) digits &= path->p[k] >= '0' && path->p[k] <= '9';
    if (digits && v.t == JV_LIST) v = jj_item(r, v, jj_int(strtoll(path->p + i, NULL, 10)));
    else v = jj_item(r, v, jj_strv(jj_str_new(r->a, path->p + i, e - i, 0)));
    i = e + 1;
  }
  return v;
}

static jj_val select_filter(jj_render *r, const char *name, jj_val v, jj_val *args, size_t nargs) {
  int by_attr = strstr(name, "attr") != NULL, keep = name[0] == 's';
  jj_list *out = jj_list_new(r->a, 4);
  out->gen = 1;
  if (!jj_truthy(v)) return (jj_val){.t = JV_LIST, .l = out}; // jinja2: `if value:` (none selects nothing)
  jj_list *in = jj_iterate(r, v);
  if (by_attr && !nargs) jj_rfail(r, "%s needs an attribute name", name);
  size_t ti = by_attr ? 1 : 0;
  const char *test = NULL;
  if (nargs > ti) test = need_str(r, args[ti], name)->p;
  for (size_t i = 0; i < in->n; i++) {
    jj_val x = by_attr ? attr_path(r, in->v[i], need_str(r, args[0], name)) : in->v[i];
    int ok = test ? jj_test(r, test, x, args + ti + 1, nargs - ti - 1) : jj_truthy(x);
    if (ok == keep) jj_list_push(r->a, out, in->v[i]);
  }
  return (jj_val){.t = JV_LIST, .l = out};
}

static jj_val dictsort(jj_render *r, jj_val v, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv, size_t nkw) {
  if (v.t != JV_DICT) jj_rfail(r, "dictsort expects a mapping, not %s", jj_type_name(v));
  int fold = !jj_truthy(kwarg(kwn, kwv, nkw, "case_sensitive", args, nargs, 0, jj_bool(0)));
  jj_val by = kwarg(kwn, kwv, nkw, "by", args, nargs, 1, jj_strv(jj_str_new(r->a, "key", 3, 0)));
  int rev = jj_truthy(kwarg(kwn, kwv, nkw, "reverse", args, nargs, 2, jj_bool(0)));
  if (by.t != JV_STR || (strcmp(by.s->p, "key") != 0 && strcmp(by.s->p, "value") != 0))
    jj_rfail(r, "you can only sort by either \"key\" or \"value\"");
  int pos = by.s->p[0] == 'v';
  jj_val items;
  jj_method(r, v, "items", NULL, 0, &items);
  jj_list *l = items.l;
  l->view = 0; // sorted() gives a list
  for (size_t i = 1; i < l->n; i++) { // insertion sort: stable, as Python's sorted (dicts here are small)
    jj_val x = l->v[i];
    size_t j = i;
    for (; j > 0; j--) {
      int c = jj_compare(r, "<", l->v[j - 1].l->v[pos], x.l->v[pos], fold);
      if (rev ? c >= 0 : c <= 0) break;
    }
    memmove(l->v + j + 1, l->v + j, (i - j) * sizeof(jj_val));
    l->v[j] = x;
  }
  return items;
}

static jj_val min_max(jj_render *r, int max, jj_val v, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv,
                      size_t nkw) {
  int fold = !jj_truthy(kwarg(kwn, kwv, nkw, "case_sensitive", args, nargs, 0, jj_bool(0)));
  jj_val attr = kwarg(kwn, kwv, nkw, "attribute", args, nargs, 1, jj_none());
  jj_list *in = jj_iterate(r, v);
  if (!in->n) return jj_undef();
  size_t best = 0;
  for (size_t i = 1; i < in->n; i++) {
    jj_val a = in->v[i], b = in->v[best];
    if (attr.t != JV_NONE) {
      a = attr_path(r, a, jj_to_str(r->a, attr));
      b = attr_path(r, b, jj_to_str(r->a, attr));
    }
    int c = jj_compare(r, "<", a, b, fold);
    if (max ? c > 0 : c < 0) best = i;
  }
  return in->v[best];
}

// Python's str.splitlines boundaries: the length of the line break at i, 0 if none.
static size_t line_break(const char *p, size_t n, size_t i) {
  unsigned char c = (unsigned char)p[i];
  if (c == '\r') return i + 1 < n && p[i + 1] == '\n' ? 2 : 1;
  if (c == '\n' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e)) return 1;
  if (c == 0xC2 && i + 1 < n && (unsigned char)p[i + 1] == 0x85) return 2;
  if (c == 0xE2 && i + 2 < n && (unsigned char)p[i + 1] == 0x80 && ((unsigned char)p[i + 2] & 0xFE) == 0xA8) return 3;
  return 0;
}

// jinja2's indent: every line after the first (and the first with first=True) gets the indentation; blank lines
// only with blank=True.
static jj_val indent(jj_render *r, jj_val v, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv, size_t nkw) {
  jj_val w = kwarg(kwn, kwv, nkw, "width", args, nargs, 0, jj_int(4));
  int first = jj_truthy(kwarg(kwn, kwv, nkw, "first", args, nargs, 1, jj_bool(0)));
  int blank = jj_truthy(kwarg(kwn, kwv, nkw, "blank", args, nargs, 2, jj_bool(0)));
  const jj_str *s = need_str(r, v, "indent"), *ind = w.t == JV_STR ? w.s : NULL; // jinja2 appends "\n" to it
  if (!ind) {
    if (w.t != JV_INT || w.i < 0 || w.i > 1024) jj_rfail(r, "indent: width must be a string or 0 to 1024");
    jj_sbuf sp = {.limit = MDL_JINJA_MAX_OUTPUT};
    for (int64_t k = 0; k < w.i; k++) jj_sb_put(r->a, &sp, " ", 1, 0);
    ind = jj_sb_done(r->a, &sp);
  }
  jj_sbuf t = {.limit = MDL_JINJA_MAX_OUTPUT}, b = {.limit = MDL_JINJA_MAX_OUTPUT};
  jj_sb_put(r->a, &t, s->p, s->n, 0);
  jj_sb_put(r->a, &t, "\n", 1, 0); // as jinja2, which appends a newline before splitlines()
  for (size_t i = 0, line = 0; i < t.n; line++) {
    size_t e = i, k;
    while (!(k = line_break(t.p, t.n, e))) e++;
    if (line) jj_sb_put(r->a, &b, "\n", 1, 0);
    if (line ? blank || e > i : first) jj_sb_str(r->a, &b, ind);
    jj_sb_put(r->a, &b, t.p + i, e - i, 0);
    i = e + k;
  }
  return jj_strv(jj_str_new(r->a, b.p ? b.p : "", b.n, s->nsp || ind->nsp));
}

jj_val jj_filter(jj_render *r, const char *name, jj_val v, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv,
                 size_t nkw) {
  if (NAME_IS(name, "default") || NAME_IS(name, "d")) {
    jj_val dflt = kwarg(kwn, kwv, nkw, "default_value", args, nargs, 0, jj_strv(jj_str_new(r->a, "", 0, 0)));
    int boolean = jj_truthy(kwarg(kwn, kwv, nkw, "boolean", args, nargs, 1, jj_bool(0)));
    return v.t == JV_UNDEF || (boolean && !jj_truthy(v)) ? dflt : v;
  }
  if (NAME_IS(name, "safe")) {
    jj_str *s = jj_alloc(r->a, sizeof(*s));
    *s = *jj_to_str(r->a, v);
    s->markup = 1;
    return jj_strv(s);
  }
  if (NAME_IS(name, "string")) return jj_strv(jj_to_str(r->a, v));
  if (NAME_IS(name, "trim")) {
    jj_val chars = kwarg(kwn, kwv, nkw, "chars", args, nargs, 0, jj_none());
    return strip(r, jj_to_str(r->a, v), chars.t == JV_NONE ? NULL : need_str(r, chars, "trim"), 1, 1);
  }
  if (NAME_IS(name, "length") || NAME_IS(name, "count")) {
    if (v.t == JV_STR) {
      int64_t n = 0;
      for (size_t i = 0; i < v.s->n; i++) n += ((unsigned char)v.s->p[i] & 0xC0) != 0x80;
      return jj_int(n);
    }
    if (v.t == JV_LIST && !v.l->gen) return jj_int((int64_t)v.l->n);
    if (v.t == JV_DICT) return jj_int((int64_t)v.d->n);
    if (v.t == JV_UNDEF) return jj_int(0);
    jj_rfail(r, "object of type '%s' has no len()", jj_type_name(v));
  }
  if (NAME_IS(name, "tojson")) {
    jj_val ind = kwarg(kwn, kwv, nkw, "indent", NULL, 0, 0, jj_none());
    int ascii = jj_truthy(kwarg(kwn, kwv, nkw, "ensure_ascii", args, nargs, 0, jj_bool(0)));
    if (jj_truthy(kwarg(kwn, kwv, nkw, "sort_keys", NULL, 0, 0, jj_bool(0))) ||
        kwarg(kwn, kwv, nkw, "separators", NULL, 0, 0, jj_none()).t != JV_NONE)
      jj_rfail(r, "tojson: separators and sort_keys are not supported");
    if (ind.t != JV_NONE && (ind.t != JV_INT || ind.i < 0 || ind.i > 64)) jj_rfail(r, "tojson: bad indent");
    if (v.t == JV_UNDEF) jj_rfail(r, "tojson: %s%s%s is undefined", v.uname ? "'" : "", v.uname ? v.uname : "value",
                                  v.uname ? "'" : "");
    return jj_strv(jj_to_json(r->a, v, ind.t == JV_INT ? (int)ind.i : -1, ascii));
  }
  if (NAME_IS(name, "items")) {
    jj_val out = {.t = JV_LIST, .l = jj_list_new(r->a, 1)};
    if (v.t != JV_UNDEF && v.t != JV_DICT) jj_rfail(r, "can only get item pairs from a mapping");
    if (v.t == JV_DICT) jj_method(r, v, "items", NULL, 0, &out);
    out.l->gen = 1;
    out.l->view = 0;
    return out;
  }
  if (NAME_IS(name, "dictsort")) return dictsort(r, v, args, nargs, kwn, kwv, nkw);
  if (NAME_IS(name, "min") || NAME_IS(name, "max")) return min_max(r, name[1] == 'a', v, args, nargs, kwn, kwv, nkw);
  if (NAME_IS(name, "indent")) return indent(r, v, args, nargs, kwn, kwv, nkw);
  if (NAME_IS(name, "list")) {
    jj_list *in = jj_iterate(r, v), *l = jj_list_new(r->a, in->n);
    for (size_t i = 0; i < in->n; i++) jj_list_push(r->a, l, in->v[i]);
    return (jj_val){.t = JV_LIST, .l = l};
  }
  if (NAME_IS(name, "join")) {
    jj_val sep = kwarg(kwn, kwv, nkw, "d", args, nargs, 0, jj_strv(jj_str_new(r->a, "", 0, 0)));
    jj_val attr = kwarg(kwn, kwv, nkw, "attribute", args, nargs, 1, jj_none());
    jj_list *in = jj_iterate(r, v);
    jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
    for (size_t i = 0; i < in->n; i++) {
      if (i) jj_sb_str(r->a, &b, jj_to_str(r->a, sep));
      jj_val x = attr.t == JV_NONE ? in->v[i] : attr_path(r, in->v[i], jj_to_str(r->a, attr));
      jj_sb_str(r->a, &b, jj_to_str(r->a, x));
    }
    return jj_strv(jj_sb_done(r->a, &b));
  }
  if (NAME_IS(name, "selectattr") || NAME_IS(name, "rejectattr") || NAME_IS(name, "select") ||
      NAME_IS(name, "reject"))
    return select_filter(r, name, v, args, nargs);
  if (NAME_IS(name, "map")) {
    jj_val attr = kwarg(kwn, kwv, nkw, "attribute", NULL, 0, 0, jj_none());
    jj_val dflt = kwarg(kwn, kwv, nkw, "default", NULL, 0, 0, jj_undef());
    jj_list *in = jj_truthy(v) ? jj_iterate(r, v) : jj_list_new(r->a, 1), *l = jj_list_new(r->a, in->n);
    l->gen = 1;
    if (attr.t == JV_NONE && !nargs) jj_rfail(r, "map needs a filter name or attribute=");
    for (size_t i = 0; i < in->n; i++) {
      jj_val x;
      if (attr.t != JV_NONE) {
        x = attr_path(r, in->v[i], jj_to_str(r->a, attr));
        if (x.t == JV_UNDEF && dflt.t != JV_UNDEF) x = dflt;
      } else {
        x = jj_filter(r, need_str(r, args[0], "map")->p, in->v[i], args + 1, nargs - 1, kwn, kwv, nkw);
      }
      jj_list_push(r->a, l, x);
    }
    return (jj_val){.t = JV_LIST, .l = l};
  }
  if (NAME_IS(name, "first") || NAME_IS(name, "last")) {
    jj_list *in = jj_iterate(r, v);
    if (!in->n) return jj_undef();
    return in->v[name[0] == 'f' ? 0 : in->n - 1];
  }
  if (NAME_IS(name, "reverse")) {
    int gen = v.t == JV_LIST && v.l->gen; // reversed() of a generator fails: jinja2 lists it instead
    jj_list *in = jj_iterate(r, v), *l = jj_list_new(r->a, in->n);
    for (size_t i = in->n; i > 0; i--) jj_list_push(r->a, l, in->v[i - 1]);
    l->gen = !gen; // a list_reverseiterator
    if (v.t != JV_STR) return (jj_val){.t = JV_LIST, .l = l};
    jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
    for (size_t i = 0; i < l->n; i++) jj_sb_put(r->a, &b, l->v[i].s->p, l->v[i].s->n, 0);
    return str_of(r, v.s, b.p ? b.p : "", b.n);
  }
  static const char *cases[] = {"lower", "upper", "capitalize", "title"};
  for (int m = 0; m < 4; m++)
    if (NAME_IS(name, cases[m])) return recase(r, jj_to_str(r->a, v), m == 3 ? 4 : m);
  if (NAME_IS(name, "replace")) {
    if (nargs < 2) jj_rfail(r, "replace takes two arguments");
    const jj_str *s = jj_to_str(r->a, v);
    return replace(r, s, jj_to_str(r->a, args[0]), jj_to_str(r->a, args[1]),
                   nargs > 2 && args[2].t == JV_INT ? args[2].i : -1);
  }
  if (NAME_IS(name, "abs")) {
    if (v.t == JV_INT) {
      if (v.i == INT64_MIN) jj_rfail(r, "integer overflow");
      return jj_int(v.i < 0 ? -v.i : v.i);
    }
    if (v.t == JV_BOOL) return jj_int(v.b);
    if (v.t == JV_FLOAT) return jj_float(fabs(v.f));
    jj_rfail(r, "bad operand type for abs(): '%s'", jj_type_name(v));
  }
  if (NAME_IS(name, "int") || NAME_IS(name, "float")) {
    int isint = name[0] == 'i';
    if (v.t == JV_UNDEF) jj_undefined_err(r, v); // int(Undefined) raises in jinja2, no default
    jj_val dflt = kwarg(kwn, kwv, nkw, "default", args, nargs, 0, isint ? jj_int(0) : jj_float(0));
    if (v.t == JV_INT || v.t == JV_BOOL) return isint ? jj_int(v.t == JV_INT ? v.i : v.b) : jj_float(v.t == JV_INT ? (double)v.i : v.b);
    if (v.t == JV_FLOAT) {
      if (!isint) return v;
      if (!isfinite(v.f) || fabs(v.f) >= 9.2e18) return dflt;
      return jj_int((int64_t)v.f);
    }
    if (v.t != JV_STR) return dflt;
    char buf[64];
    const jj_str *s = v.s;
    jj_val t = strip(r, s, NULL, 1, 1);
    if (!t.s->n || t.s->n >= sizeof buf) return dflt;
    memcpy(buf, t.s->p, t.s->n);
    buf[t.s->n] = 0;
    char *end;
    if (isint) {
      long long x = strtoll(buf, &end, 10);
      if (!*end) return jj_int(x);
    }
    double f = strtod(buf, &end);
    if (*end || !isfinite(f)) return dflt;
    return isint ? (fabs(f) < 9.2e18 ? jj_int((int64_t)f) : dflt) : jj_float(f);
  }
  if (NAME_IS(name, "round")) {
    jj_val prec = kwarg(kwn, kwv, nkw, "precision", args, nargs, 0, jj_int(0));
    jj_val method = kwarg(kwn, kwv, nkw, "method", args, nargs, 1, jj_none());
    if (v.t != JV_INT && v.t != JV_FLOAT && v.t != JV_BOOL) jj_rfail(r, "round expects a number");
    if (prec.t != JV_INT || prec.i < 0 || prec.i > 15) jj_rfail(r, "round: bad precision");
    double x = v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : v.b, m = pow(10, (double)prec.i);
    const char *how = method.t == JV_STR ? method.s->p : "common";
    if (NAME_IS(how, "common")) {
      if (v.t != JV_FLOAT) return jj_int(v.t == JV_INT ? v.i : v.b); // Python's round(int, n) is the int
      char buf[400]; // round(x, n): the exact binary value to n decimals, ties to even, as printf rounds it
      snprintf(buf, sizeof buf, "%.*f", (int)prec.i, x);
      return jj_float(strtod(buf, NULL));
    }
    if (NAME_IS(how, "floor")) x = floor(x * m) / m;
    else if (NAME_IS(how, "ceil")) x = ceil(x * m) / m;
    else jj_rfail(r, "round: method must be common, ceil or floor");
    return jj_float(x);
  }
  jj_rfail(r, "no filter named '%s'", name);
}

// ---- global functions ----

jj_val jj_call_fn(jj_render *r, int fn, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv, size_t nkw) {
  switch (fn) {
  case JJ_FN_RAISE: {
    const jj_str *m = nargs ? jj_to_str(r->a, args[0]) : jj_str_new(r->a, "", 0, 0);
    if (r->a->err && r->a->errlen) snprintf(r->a->err, r->a->errlen, "%.*s", (int)m->n, m->p);
    r->raised = 1;
    longjmp(*r->a->fail, 1);
  }
  case JJ_FN_RANGE: {
    int64_t a = 0, b, st = 1;
    for (size_t i = 0; i < nargs; i++)
      if (args[i].t != JV_INT) jj_rfail(r, "range expects integers, not %s", jj_type_name(args[i]));
    if (nargs == 1) b = args[0].i;
    else if (nargs == 2 || nargs == 3) a = args[0].i, b = args[1].i, st = nargs == 3 ? args[2].i : 1;
    else jj_rfail(r, "range expects 1 to 3 arguments");
    if (st == 0) jj_rfail(r, "range() arg 3 must not be zero");
    jj_list *l = jj_list_new(r->a, 8);
    for (int64_t i = a; st > 0 ? i < b : i > b; i += st) {
      if (l->n >= MDL_JINJA_MAX_STEPS) jj_rfail(r, "range longer than %u", MDL_JINJA_MAX_STEPS);
      jj_list_push(r->a, l, jj_int(i));
    }
    return (jj_val){.t = JV_LIST, .l = l};
  }
  case JJ_FN_NAMESPACE: case JJ_FN_DICT: {
    jj_dict *d = jj_dict_new(r->a, nkw + 1);
    for (size_t i = 0; i < nargs; i++) {
      if (args[i].t != JV_DICT) jj_rfail(r, "%s() takes keyword arguments or a dict", fn == JJ_FN_DICT ? "dict" : "namespace");
      for (size_t k = 0; k < args[i].d->n; k++) jj_dict_set(r->a, d, args[i].d->k[k], args[i].d->v[k]);
    }
    for (size_t i = 0; i < nkw; i++) jj_dict_set(r->a, d, jj_strv(jj_str_new(r->a, kwn[i], strlen(kwn[i]), 0)), kwv[i]);
    return (jj_val){.t = fn == JJ_FN_DICT ? JV_DICT : JV_NS, .d = d};
  }
  case JJ_FN_STRFTIME: {
    if (nargs != 1 || args[0].t != JV_STR) jj_rfail(r, "strftime_now expects a format string");
    char fmt[256], buf[512];
    if (args[0].s->n >= sizeof fmt) jj_rfail(r, "strftime_now: format too long");
    memcpy(fmt, args[0].s->p, args[0].s->n);
    fmt[args[0].s->n] = 0;
    time_t now = (time_t)r->now;
    struct tm tm;
    gmtime_r(&now, &tm);
    size_t n = strftime(buf, sizeof buf, fmt, &tm);
    return jj_strv(jj_str_new(r->a, buf, n, 0));
  }
  default: jj_rfail(r, "not a function");
  }
}
