// models/jinja_access.c: reading Jinja values at render time as jinja2 does: a runtime error naming the line,
// attributes and items (a missing one is undefined, a read of undefined an error), slices by code point, and what a
// for loop walks. Below both the evaluator (jinja_eval.c) and the builtins (jinja_builtins.c).
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "models/jinja_int.h"

_Noreturn void jj_rfail(jj_render *r, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  jj_fail(r->a, "line %d: %s", r->line, msg);
}

_Noreturn void jj_undefined_err(jj_render *r, jj_val v) {
  if (v.uname) jj_rfail(r, "'%s' is undefined", v.uname);
  jj_rfail(r, "an undefined value was used");
}

// ---- code points (Python indexes strings by code point) ----

size_t jj_cp_offsets(jj_render *r, const jj_str *s, size_t **offs) {
  size_t n = 0;
  for (size_t i = 0; i < s->n; i++) n += ((unsigned char)s->p[i] & 0xC0) != 0x80;
  size_t *o = jj_alloc(r->a, (n + 1) * sizeof(size_t));
  size_t k = 0;
  for (size_t i = 0; i < s->n; i++)
    if (((unsigned char)s->p[i] & 0xC0) != 0x80) o[k++] = i;
  o[n] = s->n;
  *offs = o;
  return n;
}

const jj_str *jj_derived(jj_render *r, const jj_str *from, const char *p, size_t n) {
  return jj_str_new(r->a, p, n, from->nsp != 0); // a part of request text is request text
}

jj_list *jj_iterate(jj_render *r, jj_val v) {
  jj_list *l;
  switch (v.t) {
  case JV_UNDEF: return jj_list_new(r->a, 1);
  case JV_LIST:
    if (!v.l->gen) return v.l;
    if (v.l->spent) return jj_list_new(r->a, 1); // a generator yields its items once
    v.l->spent = 1;
    return v.l;
  case JV_DICT:
    l = jj_list_new(r->a, v.d->n);
    for (size_t i = 0; i < v.d->n; i++) jj_list_push(r->a, l, v.d->k[i]);
    return l;
  case JV_STR: {
    size_t *o, n = jj_cp_offsets(r, v.s, &o);
    l = jj_list_new(r->a, n);
    for (size_t i = 0; i < n; i++) jj_list_push(r->a, l, jj_strv(jj_derived(r, v.s, v.s->p + o[i], o[i + 1] - o[i])));
    return l;
  }
  default: jj_rfail(r, "'%s' object is not iterable", jj_type_name(v));
  }
}

// ---- attribute, item, slice ----

jj_val jj_attr(jj_render *r, jj_val v, const char *name, size_t n) {
  jj_val out = jj_undef();
  switch (v.t) {
  case JV_UNDEF: jj_undefined_err(r, v);
  case JV_DICT: case JV_NS:
    if (jj_dict_get(v.d, name, n, &out)) return out;
    break;
  case JV_LOOP: {
    const jj_loop *L = v.loop;
    size_t len = L->items->n, i = L->i;
#define IS(w) (n == strlen(w) && memcmp(name, w, n) == 0)
    if (IS("index")) return jj_int((int64_t)i + 1);
    if (IS("index0")) return jj_int((int64_t)i);
    if (IS("revindex")) return jj_int((int64_t)(len - i));
    if (IS("revindex0")) return jj_int((int64_t)(len - i - 1));
    if (IS("first")) return jj_bool(i == 0);
    if (IS("last")) return jj_bool(i + 1 == len);
    if (IS("length")) return jj_int((int64_t)len);
    if (IS("depth")) return jj_int(1);
    if (IS("depth0")) return jj_int(0);
    if (IS("previtem")) return i > 0 ? L->items->v[i - 1] : out;
    if (IS("nextitem")) return i + 1 < len ? L->items->v[i + 1] : out;
#undef IS
    break;
  }
  default: break;
  }
  char *nm = jj_alloc(r->a, n + 1);
  memcpy(nm, name, n);
  out.uname = nm;
  return out;
}

jj_val jj_item(jj_render *r, jj_val v, jj_val k) {
  if (v.t == JV_UNDEF) jj_undefined_err(r, v);
  if (v.t == JV_LIST && (v.l->gen || v.l->view)) jj_rfail(r, "'%s' object is not subscriptable", jj_type_name(v));
  if ((v.t == JV_LIST || v.t == JV_STR) && (k.t == JV_INT || k.t == JV_BOOL)) {
    int64_t i = k.t == JV_INT ? k.i : k.b;
    size_t *o = NULL;
    size_t n = v.t == JV_LIST ? v.l->n : jj_cp_offsets(r, v.s, &o);
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (size_t)i >= n) return jj_undef();
    if (v.t == JV_LIST) return v.l->v[i];
    return jj_strv(jj_derived(r, v.s, v.s->p + o[i], o[i + 1] - o[i]));
  }
  if (v.t == JV_DICT || v.t == JV_NS) {
    jj_val out;
    if (jj_dict_find(v.d, k, &out)) return out;
  }
  if (k.t == JV_STR) return jj_attr(r, v, k.s->p, k.s->n);
  return jj_undef();
}

static int64_t slice_arg(jj_render *r, jj_val v, int64_t dflt) {
  if (v.t == JV_NONE || v.t == JV_UNDEF) return dflt;
  if (v.t == JV_INT) return v.i;
  if (v.t == JV_BOOL) return v.b;
  jj_rfail(r, "slice indices must be integers or None, not %s", jj_type_name(v));
}

jj_val jj_slice(jj_render *r, jj_val v, jj_val b, jj_val c, jj_val d) {
  if (v.t == JV_UNDEF) jj_undefined_err(r, v);
  if ((v.t != JV_LIST && v.t != JV_STR) || (v.t == JV_LIST && (v.l->gen || v.l->view)))
    jj_rfail(r, "'%s' object is not subscriptable", jj_type_name(v));
  size_t *o = NULL;
  int64_t n = (int64_t)(v.t == JV_LIST ? v.l->n : jj_cp_offsets(r, v.s, &o));
  int64_t step = slice_arg(r, d, 1);
  if (step == 0) jj_rfail(r, "slice step cannot be zero");
  int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1; // Python's PySlice_AdjustIndices
  int64_t start = slice_arg(r, b, step > 0 ? 0 : n - 1), stop = slice_arg(r, c, step > 0 ? n : -n - 1);
  if (start < 0) start = start + n < lo ? lo : start + n;
  else if (start > hi) start = hi;
  if (stop < 0) stop = stop + n < lo ? lo : stop + n;
  else if (stop > hi) stop = hi;
  jj_list *l = jj_list_new(r->a, 4);
  jj_sbuf sb = {.limit = MDL_JINJA_MAX_OUTPUT};
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (v.t == JV_LIST) jj_list_push(r->a, l, v.l->v[i]);
    else jj_sb_put(r->a, &sb, v.s->p + o[i], o[i + 1] - o[i], 0);
  }
  if (v.t == JV_LIST) {
    l->tuple = v.l->tuple;
    return (jj_val){.t = JV_LIST, .l = l};
  }
  return jj_strv(jj_derived(r, v.s, sb.p ? sb.p : "", sb.n));
}

// Python's ordering: numbers (ints exactly), strings by code point, lists with lists and tuples with tuples item by
// item. fold: jinja2's ignore_case for sorting filters (str.lower on a string key; refused beyond ASCII).
int jj_compare(jj_render *r, const char *op, jj_val x, jj_val y, int fold) {
  int xl = x.t == JV_LIST && !x.l->gen && !x.l->view, yl = y.t == JV_LIST && !y.l->gen && !y.l->view;
  if (xl && yl && x.l->tuple == y.l->tuple) {
    size_t i = 0;
    while (i < x.l->n && i < y.l->n && jj_equal(x.l->v[i], y.l->v[i])) i++;
    if (i < x.l->n && i < y.l->n) return jj_compare(r, op, x.l->v[i], y.l->v[i], 0);
    return x.l->n < y.l->n ? -1 : x.l->n > y.l->n;
  }
  int xn = x.t == JV_INT || x.t == JV_BOOL || x.t == JV_FLOAT, yn = y.t == JV_INT || y.t == JV_BOOL || y.t == JV_FLOAT;
  if (xn && yn) {
    if (x.t != JV_FLOAT && y.t != JV_FLOAT) {
      int64_t a = x.t == JV_INT ? x.i : x.b, b = y.t == JV_INT ? y.i : y.b;
      return a < b ? -1 : a > b;
    }
    double a = x.t == JV_FLOAT ? x.f : x.t == JV_INT ? (double)x.i : x.b;
    double b = y.t == JV_FLOAT ? y.f : y.t == JV_INT ? (double)y.i : y.b;
    return a < b ? -1 : a > b ? 1 : 0;
  }
  if (x.t != JV_STR || y.t != JV_STR)
    jj_rfail(r, "'%s' not supported between instances of '%s' and '%s'", op, jj_type_name(x), jj_type_name(y));
  size_t n = x.s->n < y.s->n ? x.s->n : y.s->n;
  for (size_t i = 0; i < n; i++) {
    unsigned char a = (unsigned char)x.s->p[i], b = (unsigned char)y.s->p[i];
    if (fold && (a >= 0x80 || b >= 0x80)) jj_rfail(r, "case-insensitive ordering of non-ASCII text is not supported");
    if (fold && a >= 'A' && a <= 'Z') a |= 0x20;
    if (fold && b >= 'A' && b <= 'Z') b |= 0x20;
    if (a != b) return a < b ? -1 : 1;
  }
  return x.s->n < y.s->n ? -1 : x.s->n > y.s->n;
}
