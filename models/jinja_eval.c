// models/jinja_eval.c: runs a parsed Jinja template: scopes as jinja2 keeps them (a loop iteration, a macro call, a
// block set's body are scopes, an if is not; names a frame writes first start undefined: jinja_frames.c), statements,
// expressions with Python's semantics, and the public entry points.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/jinja_int.h"

// ---- scopes ----

static jj_scope *scope_new(jj_render *r, jj_scope *up) {
  jj_scope *s = jj_alloc(r->a, sizeof(*s));
  s->up = up;
  return s;
}

static void scope_set(jj_render *r, jj_scope *s, const char *name, jj_val v) {
  for (size_t i = 0; i < s->n; i++) {
    if (strcmp(s->names[i], name) == 0) {
      s->vals[i] = v;
      return;
    }
  }
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 4;
    const char **nn = jj_alloc(r->a, cap * sizeof(*nn));
    jj_val *nv = jj_alloc(r->a, cap * sizeof(*nv));
    if (s->n) {
      memcpy(nn, s->names, s->n * sizeof(*nn));
      memcpy(nv, s->vals, s->n * sizeof(*nv));
    }
    s->names = nn;
    s->vals = nv;
    s->cap = cap;
  }
  s->names[s->n] = name;
  s->vals[s->n++] = v;
}

// A frame's names that jinja2 starts undefined (jinja_frames.c): bound so that a read stops here, not outside.
static void shadow(jj_render *r, jj_scope *s, const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++) {
    size_t k = 0;
    while (k < s->n && strcmp(s->names[k], names[i]) != 0) k++;
    if (k < s->n) continue; // a parameter
    jj_val u = jj_undef();
    u.uname = names[i];
    scope_set(r, s, names[i], u);
  }
}

static jj_val lookup(const jj_scope *s, const char *name) {
  for (; s; s = s->up)
    for (size_t i = 0; i < s->n; i++)
      if (strcmp(s->names[i], name) == 0) return s->vals[i];
  jj_val u = jj_undef();
  u.uname = name;
  return u;
}

// ---- operators ----

static int plain_list(jj_val v) { return v.t == JV_LIST && !v.l->gen && !v.l->view; } // a list or tuple
static int is_num(jj_val v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static int is_intish(jj_val v) { return v.t == JV_BOOL || v.t == JV_INT; }
static int64_t as_i(jj_val v) { return v.t == JV_INT ? v.i : v.b; }
static double as_f(jj_val v) { return v.t == JV_FLOAT ? v.f : (double)as_i(v); }

_Noreturn static void bad_operands(jj_render *r, const char *op, jj_val x, jj_val y) {
  if (x.t == JV_UNDEF) jj_undefined_err(r, x);
  if (y.t == JV_UNDEF) jj_undefined_err(r, y);
  jj_rfail(r, "unsupported operand type(s) for %s: '%s' and '%s'", op, jj_type_name(x), jj_type_name(y));
}

static jj_val repeat(jj_render *r, jj_val seq, int64_t k) {
  if (k < 0) k = 0;
  if (seq.t == JV_STR) {
    if (seq.s->n && (uint64_t)k > MDL_JINJA_MAX_OUTPUT / seq.s->n) jj_rfail(r, "string repetition too long");
    jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
    for (int64_t i = 0; i < k; i++) jj_sb_str(r->a, &b, seq.s);
    return jj_strv(jj_sb_done(r->a, &b));
  }
  if (seq.l->n && (uint64_t)k > MDL_JINJA_MAX_STEPS / seq.l->n) jj_rfail(r, "list repetition too long");
  jj_list *l = jj_list_new(r->a, seq.l->n * (size_t)k);
  for (int64_t i = 0; i < k; i++)
    for (size_t j = 0; j < seq.l->n; j++) jj_list_push(r->a, l, seq.l->v[j]);
  return (jj_val){.t = JV_LIST, .l = l};
}

static jj_val arith(jj_render *r, const char *op, jj_val x, jj_val y) {
  int64_t res;
  if (op[0] == '+') {
    if (x.t == JV_STR && y.t == JV_STR)
      return jj_strv(x.s->markup || y.s->markup ? jj_markup_cat(r->a, x.s, y.s) : jj_str_cat(r->a, x.s, y.s));
    if (plain_list(x) && plain_list(y)) {
      jj_list *l = jj_list_new(r->a, x.l->n + y.l->n);
      for (size_t i = 0; i < x.l->n; i++) jj_list_push(r->a, l, x.l->v[i]);
      for (size_t i = 0; i < y.l->n; i++) jj_list_push(r->a, l, y.l->v[i]);
      return (jj_val){.t = JV_LIST, .l = l};
    }
  }
  if (op[0] == '*' && !op[1]) {
    if ((x.t == JV_STR || plain_list(x)) && is_intish(y)) return repeat(r, x, as_i(y));
    if ((y.t == JV_STR || plain_list(y)) && is_intish(x)) return repeat(r, y, as_i(x));
  }
  if (!is_num(x) || !is_num(y)) bad_operands(r, op, x, y);
  int ints = is_intish(x) && is_intish(y);
  int64_t a = as_i(x), b = as_i(y);
  double fa = as_f(x), fb = as_f(y);
  switch (op[0]) {
  case '+':
    if (!ints) return jj_float(fa + fb);
    if (__builtin_add_overflow(a, b, &res)) jj_rfail(r, "integer overflow");
    return jj_int(res);
  case '-':
    if (!ints) return jj_float(fa - fb);
    if (__builtin_sub_overflow(a, b, &res)) jj_rfail(r, "integer overflow");
    return jj_int(res);
  case '*':
    if (op[1] == '*') {
      if (ints && b >= 0) {
        res = 1;
        for (int64_t i = 0; i < b && res != 0; i++)
          if (__builtin_mul_overflow(res, a, &res)) jj_rfail(r, "integer overflow");
        return jj_int(res);
      }
      if (fa == 0 && fb < 0) jj_rfail(r, "0.0 cannot be raised to a negative power");
      return jj_float(pow(fa, fb));
    }
    if (!ints) return jj_float(fa * fb);
    if (__builtin_mul_overflow(a, b, &res)) jj_rfail(r, "integer overflow");
    return jj_int(res);
  case '/':
    if (op[1] == '/') {
      if (ints) {
        if (b == 0) jj_rfail(r, "integer division or modulo by zero");
        if (a == INT64_MIN && b == -1) jj_rfail(r, "integer overflow");
        int64_t q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
        return jj_int(q);
      }
      if (fb == 0) jj_rfail(r, "float floor division by zero");
      return jj_float(floor(fa / fb));
    }
    if (fb == 0) jj_rfail(r, "division by zero");
    return jj_float(fa / fb);
  case '%':
    if (ints) {
      if (b == 0) jj_rfail(r, "integer division or modulo by zero");
      if (b == -1) return jj_int(0);
      int64_t m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return jj_int(m);
    }
    if (fb == 0) jj_rfail(r, "float modulo");
    {
      double m = fmod(fa, fb);
      if (m != 0 && ((m < 0) != (fb < 0))) m += fb;
      return jj_float(m);
    }
  default: jj_rfail(r, "unknown operator %s", op);
  }
}

static int contains(jj_render *r, jj_val hay, jj_val needle) {
  switch (hay.t) {
  case JV_UNDEF: return 0;
  case JV_STR:
    if (needle.t != JV_STR) jj_rfail(r, "'in <string>' requires string as left operand, not %s", jj_type_name(needle));
    return memmem(hay.s->p, hay.s->n, needle.s->p, needle.s->n) != NULL;
  case JV_LIST:
    for (size_t i = 0; i < hay.l->n; i++)
      if (jj_equal(hay.l->v[i], needle)) return 1;
    return 0;
  case JV_DICT: {
    jj_val o;
    if (needle.t == JV_DICT || (needle.t == JV_LIST && !needle.l->tuple))
      jj_rfail(r, "unhashable type: '%s'", jj_type_name(needle));
    return jj_dict_find(hay.d, needle, &o);
  }
  default: jj_rfail(r, "argument of type '%s' is not iterable", jj_type_name(hay));
  }
}

static int order(jj_render *r, const char *op, jj_val x, jj_val y) {
  if (x.t == JV_UNDEF) jj_undefined_err(r, x);
  if (y.t == JV_UNDEF) jj_undefined_err(r, y);
  int c = jj_compare(r, op, x, y, 0);
  if (op[0] == '<') return op[1] ? c <= 0 : c < 0;
  return op[1] ? c >= 0 : c > 0;
}

// ---- expressions ----

static void eval_args(jj_render *r, jj_scope *s, const jj_node *e, jj_val **args, const char ***kwn, jj_val **kwv) {
  *args = jj_alloc(r->a, (e->args.n + 1) * sizeof(jj_val));
  *kwn = jj_alloc(r->a, (e->kw.n + 1) * sizeof(char *));
  *kwv = jj_alloc(r->a, (e->kw.n + 1) * sizeof(jj_val));
  for (size_t i = 0; i < e->args.n; i++) (*args)[i] = jj_eval(r, s, e->args.v[i]);
  for (size_t i = 0; i < e->kw.n; i++) {
    (*kwn)[i] = e->kw.v[i]->name;
    (*kwv)[i] = jj_eval(r, s, e->kw.v[i]->a);
  }
}

static jj_val call(jj_render *r, jj_scope *s, const jj_node *e) {
  jj_val *args, *kwv;
  const char **kwn;
  if (e->a->kind == JE_ATTR) { // a method: "x".startswith(...), d.items(), ...
    jj_val self = jj_eval(r, s, e->a->a);
    if (self.t == JV_UNDEF) jj_undefined_err(r, self);
    eval_args(r, s, e, &args, &kwn, &kwv);
    jj_val out;
    if (e->kw.n == 0 && jj_method(r, self, e->a->name, args, e->args.n, &out)) return out;
    jj_val f = jj_attr(r, self, e->a->name, strlen(e->a->name));
    if (f.t == JV_MACRO) return jj_call_macro(r, f.macro, args, e->args.n, kwn, kwv, e->kw.n);
    jj_rfail(r, "'%s' object has no method '%s'", jj_type_name(self), e->a->name);
  }
  jj_val f = jj_eval(r, s, e->a);
  eval_args(r, s, e, &args, &kwn, &kwv);
  if (f.t == JV_MACRO) return jj_call_macro(r, f.macro, args, e->args.n, kwn, kwv, e->kw.n);
  if (f.t == JV_FUNC) return jj_call_fn(r, f.fn, args, e->args.n, kwn, kwv, e->kw.n);
  if (f.t == JV_UNDEF) jj_undefined_err(r, f);
  jj_rfail(r, "'%s' object is not callable", jj_type_name(f));
}

jj_val jj_eval(jj_render *r, jj_scope *s, const jj_node *e) {
  switch (e->kind) {
  case JE_LIT: return e->lit;
  case JE_NAME: return lookup(s, e->name);
  case JE_ATTR: return jj_attr(r, jj_eval(r, s, e->a), e->name, strlen(e->name));
  case JE_ITEM: {
    jj_val v = jj_eval(r, s, e->a);
    return jj_item(r, v, jj_eval(r, s, e->b));
  }
  case JE_SLICE: {
    jj_val v = jj_eval(r, s, e->a), b = jj_none(), c = jj_none(), d = jj_none();
    if (e->b) b = jj_eval(r, s, e->b);
    if (e->c) c = jj_eval(r, s, e->c);
    if (e->d) d = jj_eval(r, s, e->d);
    return jj_slice(r, v, b, c, d);
  }
  case JE_CALL: return call(r, s, e);
  case JE_FILTER: {
    jj_val v = jj_eval(r, s, e->a), *args, *kwv;
    const char **kwn;
    eval_args(r, s, e, &args, &kwn, &kwv);
    return jj_filter(r, e->name, v, args, e->args.n, kwn, kwv, e->kw.n);
  }
  case JE_TEST: {
    jj_val v = jj_eval(r, s, e->a), *args, *kwv;
    const char **kwn;
    eval_args(r, s, e, &args, &kwn, &kwv);
    return jj_bool(jj_test(r, e->name, v, args, e->args.n) != e->neg);
  }
  case JE_BIN: {
    const char *op = e->op;
    jj_val x = jj_eval(r, s, e->a);
    if (strcmp(op, "and") == 0) return jj_truthy(x) ? jj_eval(r, s, e->b) : x;
    if (strcmp(op, "or") == 0) return jj_truthy(x) ? x : jj_eval(r, s, e->b);
    jj_val y = jj_eval(r, s, e->b);
    if (strcmp(op, "==") == 0) return jj_bool(jj_equal(x, y));
    if (strcmp(op, "!=") == 0) return jj_bool(!jj_equal(x, y));
    if (strcmp(op, "in") == 0) return jj_bool(contains(r, y, x));
    if (strcmp(op, "not in") == 0) return jj_bool(!contains(r, y, x));
    if (op[0] == '<' || op[0] == '>') return jj_bool(order(r, op, x, y));
    if (op[0] == '~') {
      jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
      jj_sb_str(r->a, &b, jj_to_str(r->a, x));
      jj_sb_str(r->a, &b, jj_to_str(r->a, y));
      return jj_strv(jj_sb_done(r->a, &b));
    }
    return arith(r, op, x, y);
  }
  case JE_NOT: return jj_bool(!jj_truthy(jj_eval(r, s, e->a)));
  case JE_NEG: {
    jj_val v = jj_eval(r, s, e->a);
    if (v.t == JV_UNDEF) jj_undefined_err(r, v);
    if (!is_num(v)) jj_rfail(r, "bad operand type for unary %s: '%s'", e->op, jj_type_name(v));
    if (e->op[0] == '+') return v.t == JV_BOOL ? jj_int(v.b) : v;
    if (v.t == JV_FLOAT) return jj_float(-v.f);
    if (as_i(v) == INT64_MIN) jj_rfail(r, "integer overflow");
    return jj_int(-as_i(v));
  }
  case JE_COND:
    if (jj_truthy(jj_eval(r, s, e->a))) return jj_eval(r, s, e->b);
    return e->c ? jj_eval(r, s, e->c) : jj_undef();
  case JE_LIST: case JE_TUPLE: {
    jj_list *l = jj_list_new(r->a, e->args.n);
    for (size_t i = 0; i < e->args.n; i++) jj_list_push(r->a, l, jj_eval(r, s, e->args.v[i]));
    l->tuple = e->kind == JE_TUPLE;
    return (jj_val){.t = JV_LIST, .l = l};
  }
  case JE_DICT: {
    jj_dict *d = jj_dict_new(r->a, e->args.n);
    for (size_t i = 0; i < e->args.n; i++) {
      jj_val k = jj_eval(r, s, e->args.v[i]);
      if (k.t == JV_LIST || k.t == JV_DICT || k.t == JV_UNDEF) jj_rfail(r, "unhashable type: '%s'", jj_type_name(k));
      jj_dict_set(r->a, d, k, jj_eval(r, s, e->kw.v[i]));
    }
    return (jj_val){.t = JV_DICT, .d = d};
  }
  default: jj_rfail(r, "not an expression");
  }
}

// ---- statements ----

static void exec_body(jj_render *r, jj_scope *s, const jj_nodes *body, jj_sbuf *out);

static void step(jj_render *r) {
  if (++r->steps > MDL_JINJA_MAX_STEPS) jj_rfail(r, "more than %u loop iterations and macro calls", MDL_JINJA_MAX_STEPS);
}

static void bind_targets(jj_render *r, jj_scope *s, const jj_nodes *targets, jj_val v) {
  if (targets->n == 1) {
    scope_set(r, s, targets->v[0]->name, v);
    return;
  }
  jj_list *l = v.t == JV_LIST ? v.l : jj_iterate(r, v);
  if (l->n != targets->n)
    jj_rfail(r, "cannot unpack %zu values into %zu names", l->n, targets->n);
  for (size_t i = 0; i < targets->n; i++) scope_set(r, s, targets->v[i]->name, l->v[i]);
}

static void exec_for(jj_render *r, jj_scope *s, const jj_node *st, jj_sbuf *out) {
  jj_list *items = jj_iterate(r, jj_eval(r, s, st->a));
  if (st->b) { // the loop's `if`: filtered before loop.* counts
    jj_list *kept = jj_list_new(r->a, items->n);
    jj_scope *t = scope_new(r, s);
    for (size_t i = 0; i < items->n; i++) {
      step(r);
      t->n = 0;
      bind_targets(r, t, &st->args, items->v[i]);
      if (jj_truthy(jj_eval(r, t, st->b))) jj_list_push(r->a, kept, items->v[i]);
    }
    items = kept;
  }
  // One scope and one loop object serve every iteration (emptied, moved on), so a long loop holds no memory per
  // iteration; jinja2's LoopContext is one object that moves on too.
  jj_scope *t = scope_new(r, s);
  jj_loop *L = jj_alloc(r->a, sizeof(*L));
  L->items = items;
  for (size_t i = 0; i < items->n; i++) {
    step(r);
    t->n = 0;
    L->i = i;
    bind_targets(r, t, &st->args, items->v[i]);
    scope_set(r, t, "loop", (jj_val){.t = JV_LOOP, .loop = L});
    shadow(r, t, st->shadow, st->nshadow);
    exec_body(r, t, &st->body, out);
    if (r->brk == 1) {
      r->brk = 0;
      break;
    }
    r->brk = 0;
  }
  if (!items->n) exec_body(r, scope_new(r, s), &st->els, out); // a frame of its own, as in jinja2
}

// The text a {% set %}...{% endset %} or {% filter %} block renders, its body run in a frame of its own.
static jj_val block_text(jj_render *r, jj_scope *s, const jj_node *st) {
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  jj_scope *t = scope_new(r, s);
  shadow(r, t, st->shadow, st->nshadow);
  exec_body(r, t, &st->body, &b);
  return jj_strv(jj_sb_done(r->a, &b));
}

static void exec_body(jj_render *r, jj_scope *s, const jj_nodes *body, jj_sbuf *out) {
  for (size_t i = 0; i < body->n && !r->brk; i++) {
    const jj_node *st = body->v[i];
    r->line = st->line;
    switch (st->kind) {
    case JS_TEXT: jj_sb_str(r->a, out, st->lit.s); break;
    case JS_OUT: {
      jj_val v = jj_eval(r, s, st->a);
      r->line = st->line;
      if (v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_NS || v.t == JV_LOOP)
        jj_rfail(r, "cannot print a %s", jj_type_name(v));
      jj_sb_str(r->a, out, jj_to_str(r->a, v));
      break;
    }
    case JS_IF:
      if (jj_truthy(jj_eval(r, s, st->a))) exec_body(r, s, &st->body, out);
      else exec_body(r, s, &st->els, out);
      break;
    case JS_FOR: exec_for(r, s, st, out); break;
    case JS_SET: {
      jj_val v = jj_eval(r, s, st->b);
      if (st->attr) {
        jj_val ns = lookup(s, st->name);
        if (ns.t != JV_NS) jj_rfail(r, "cannot assign attribute on non-namespace object");
        jj_dict_set(r->a, ns.d, jj_strv(jj_str_new(r->a, st->attr, strlen(st->attr), 0)), v);
      } else {
        bind_targets(r, s, &st->args, v);
      }
      break;
    }
    case JS_FILTERBLOCK: {
      jj_scope *t = scope_new(r, s);
      scope_set(r, t, JJ_BODY, block_text(r, s, st));
      jj_sb_str(r->a, out, jj_to_str(r->a, jj_eval(r, t, st->a)));
      break;
    }
    case JS_SETBLOCK:
      scope_set(r, s, st->name, block_text(r, s, st));
      break;
    case JS_MACRO: scope_set(r, s, st->name, (jj_val){.t = JV_MACRO, .macro = st}); break;
    case JS_BREAK: case JS_CONTINUE: r->brk = st->kind == JS_BREAK ? 1 : 2; break;
    default: jj_rfail(r, "not a statement");
    }
  }
}

jj_val jj_call_macro(jj_render *r, const jj_node *m, jj_val *args, size_t nargs, const char **kwn, jj_val *kwv,
                     size_t nkw) {
  step(r);
  if (r->depth >= MDL_JINJA_MAX_DEPTH) jj_rfail(r, "macro calls nested deeper than %d", MDL_JINJA_MAX_DEPTH);
  if (nargs > m->kw.n) jj_rfail(r, "macro '%s' takes not more than %zu argument(s)", m->name, m->kw.n);
  int line = r->line;
  jj_scope *s = scope_new(r, r->top);
  for (size_t i = 0; i < m->kw.n; i++) {
    const jj_node *p = m->kw.v[i];
    jj_val v = jj_undef();
    v.uname = p->name;
    int set = 0;
    if (i < nargs) v = args[i], set = 1;
    for (size_t k = 0; k < nkw; k++) {
      if (strcmp(kwn[k], p->name) == 0) {
        if (set) jj_rfail(r, "macro '%s' got multiple values for argument '%s'", m->name, p->name);
        v = kwv[k], set = 1;
      }
    }
    if (!set && p->a) v = jj_eval(r, s, p->a);
    scope_set(r, s, p->name, v);
  }
  shadow(r, s, m->shadow, m->nshadow);
  for (size_t k = 0; k < nkw; k++) {
    size_t i = 0;
    while (i < m->kw.n && strcmp(kwn[k], m->kw.v[i]->name) != 0) i++;
    if (i == m->kw.n) jj_rfail(r, "macro '%s' takes no keyword argument '%s'", m->name, kwn[k]);
  }
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  r->depth++;
  exec_body(r, s, &m->body, &b);
  r->depth--;
  r->brk = 0;
  r->line = line;
  return jj_strv(jj_sb_done(r->a, &b));
}

// ---- entry points ----

int mdl_jinja_parse(const char *text, size_t n, mdl_jinja **out, char *err, size_t errlen) {
  *out = NULL;
  if (n > MDL_JINJA_MAX_TEMPLATE) {
    utl_seterr(err, errlen, "template of %zu bytes is longer than %u", n, MDL_JINJA_MAX_TEMPLATE);
    return -1;
  }
  mdl_jinja *t = calloc(1, sizeof(*t));
  if (!t) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  jmp_buf jb;
  t->arena.fail = &jb;
  t->arena.err = err;
  t->arena.errlen = errlen;
  if (setjmp(jb)) {
    mdl_jinja_free(t);
    return -1;
  }
  // jinja2 reads "\r\n" and "\r" as "\n" and drops one trailing newline (keep_trailing_newline=False)
  char *src = jj_alloc(&t->arena, n + 1);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (text[i] == '\r') {
      src[k++] = '\n';
      if (i + 1 < n && text[i + 1] == '\n') i++;
    } else {
      src[k++] = text[i];
    }
  }
  if (k && src[k - 1] == '\n') k--;
  jj_toks toks = {0};
  jj_lex(&t->arena, src, k, &toks);
  jj_parse(t, &toks);
  t->arena.fail = NULL;
  t->arena.err = NULL;
  *out = t;
  return 0;
}

void mdl_jinja_free(mdl_jinja *t) {
  if (!t) return;
  jj_arena_free(&t->arena);
  free(t);
}

int mdl_jinja_uses_var(const mdl_jinja *t, const char *name) {
  for (size_t i = 0; i < t->nvars; i++)
    if (strcmp(t->vars[i], name) == 0) return 1;
  return 0;
}

int mdl_jinja_render(const mdl_jinja *t, const char *ctx_json, size_t ctx_len, const mdl_jinja_opts *o, char **out,
                     size_t *out_len, size_t **spans, size_t *n_spans, char *err, size_t errlen) {
  *out = NULL;
  *out_len = 0;
  if (spans) *spans = NULL;
  if (n_spans) *n_spans = 0;
  jj_arena a = {.budget = MDL_JINJA_MAX_MEMORY, .err = err, .errlen = errlen};
  jj_render r = {.a = &a, .t = t, .now = o ? o->now : 0, .line = 1};
  jmp_buf jb;
  a.fail = &jb;
  if (setjmp(jb)) {
    int raised = r.raised;
    jj_arena_free(&a);
    return raised ? MDL_JINJA_RAISED : -1;
  }
  jj_val ctx = jj_from_json(&a, ctx_json, ctx_len);
  if (ctx.t != JV_DICT) jj_fail(&a, "context: not a JSON object");
  r.globals = scope_new(&r, NULL);
  static const struct { const char *name; int fn; } fns[] = {
      {"raise_exception", JJ_FN_RAISE}, {"range", JJ_FN_RANGE},   {"namespace", JJ_FN_NAMESPACE},
      {"strftime_now", JJ_FN_STRFTIME}, {"dict", JJ_FN_DICT}};
  for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
    scope_set(&r, r.globals, fns[i].name, (jj_val){.t = JV_FUNC, .fn = fns[i].fn});
  for (size_t i = 0; i < ctx.d->n; i++) {
    const jj_str *k = ctx.d->k[i].s;
    char *name = jj_alloc(&a, k->n + 1);
    memcpy(name, k->p, k->n);
    scope_set(&r, r.globals, name, ctx.d->v[i]);
  }
  r.top = scope_new(&r, r.globals);
  shadow(&r, r.top, t->shadow, t->nshadow);
  jj_sbuf b = {.limit = MDL_JINJA_MAX_OUTPUT};
  exec_body(&r, r.top, &t->body, &b);
  char *res = malloc(b.n + 1);
  size_t *sp = spans && b.nsp ? malloc(b.nsp * 2 * sizeof(size_t)) : NULL;
  if (!res || (spans && b.nsp && !sp)) {
    free(res);
    free(sp);
    jj_fail(&a, "out of memory");
  }
  if (b.n) memcpy(res, b.p, b.n);
  res[b.n] = 0;
  if (sp) memcpy(sp, b.sp, b.nsp * 2 * sizeof(size_t));
  *out = res;
  *out_len = b.n;
  if (spans) {
    *spans = sp;
    *n_spans = sp ? b.nsp : 0;
  }
  jj_arena_free(&a);
  return 0;
}
