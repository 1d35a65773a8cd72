// models/jinja_frames.c: which names each frame (the template, a loop body, a macro body) starts as undefined, as
// jinja2's compiler decides them (its idtracking.py), so that a read before the frame's own `set` is undefined even
// where an outer frame or the context has the name.
//
// jinja2 gives every name a frame meets one reference, fixed by the first thing the frame does with it, in source
// order, looking into if-branches but not into nested loops and macros (frames of their own): a read first resolves
// the name from outside when the frame starts; a write first, when no enclosing frame refers to the name, starts it
// undefined (`{% for %}{{ n }}{% endfor %}{% set n = 1 %}` prints nothing even with n in the context). A write inside
// an if is no first write: the name is read from outside until it happens.
#include <string.h>

#include "models/jinja_int.h"

typedef struct sym {
  const char *name;
  int undef; // 1: written first with no outer reference: the frame starts it undefined
} sym;

typedef struct symtab {
  jj_arena *a;
  const struct symtab *up; // the enclosing frame's finished table
  sym *refs;               // (nrefs) in first-reference order
  size_t nrefs, cap;
  const char **stores;     // (nstores) names written in this frame
  size_t nstores, scap;
} symtab;

static int has_ref(const symtab *t, const char *name) {
  for (size_t i = 0; i < t->nrefs; i++)
    if (strcmp(t->refs[i].name, name) == 0) return 1;
  return 0;
}

static int find_ref(const symtab *t, const char *name) {
  for (; t; t = t->up)
    if (has_ref(t, name)) return 1;
  return 0;
}

static void add_ref(symtab *t, const char *name, int undef) {
  for (size_t i = 0; i < t->nrefs; i++) {
    if (strcmp(t->refs[i].name, name) == 0) {
      t->refs[i].undef = undef;
      return;
    }
  }
  if (t->nrefs == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 8;
    sym *v = jj_alloc(t->a, cap * sizeof(*v));
    if (t->nrefs) memcpy(v, t->refs, t->nrefs * sizeof(*v));
    t->refs = v;
    t->cap = cap;
  }
  t->refs[t->nrefs++] = (sym){name, undef};
}

static int stored(const symtab *t, const char *name) {
  for (size_t i = 0; i < t->nstores; i++)
    if (strcmp(t->stores[i], name) == 0) return 1;
  return 0;
}

static void add_store(symtab *t, const char *name) {
  if (stored(t, name)) return;
  if (t->nstores == t->scap) {
    size_t cap = t->scap ? t->scap * 2 : 8;
    const char **v = jj_alloc(t->a, cap * sizeof(*v));
    if (t->nstores) memcpy(v, t->stores, t->nstores * sizeof(*v));
    t->stores = v;
    t->scap = cap;
  }
  t->stores[t->nstores++] = name;
}

static symtab copy(const symtab *t) {
  symtab c = *t;
  c.refs = jj_alloc(t->a, (t->cap + 1) * sizeof(sym));
  if (t->nrefs) memcpy(c.refs, t->refs, t->nrefs * sizeof(sym));
  c.stores = jj_alloc(t->a, (t->scap + 1) * sizeof(char *));
  if (t->nstores) memcpy(c.stores, t->stores, t->nstores * sizeof(char *));
  return c;
}

static void load(symtab *t, const char *name) {
  if (!find_ref(t, name)) add_ref(t, name, 0);
}

static void store(symtab *t, const char *name) {
  add_store(t, name);
  if (!has_ref(t, name)) add_ref(t, name, !(t->up && find_ref(t->up, name)));
}

static void param(symtab *t, const char *name) {
  add_store(t, name);
  add_ref(t, name, 0);
}

static void loads(symtab *t, const jj_node *e) {
  if (!e) return;
  if (e->kind == JE_NAME) {
    load(t, e->name);
    return;
  }
  loads(t, e->a);
  loads(t, e->b);
  loads(t, e->c);
  loads(t, e->d);
  for (size_t i = 0; i < e->args.n; i++) loads(t, e->args.v[i]);
  for (size_t i = 0; i < e->kw.n; i++) loads(t, e->kind == JE_DICT ? e->kw.v[i] : e->kw.v[i]->a); // else: keywords
}

static void visit(symtab *t, const jj_nodes *body);

// jinja2's Symbols.branch_update: a name an if's branches read or write first, and one they write that the frame had
// not written before, is read from outside when the frame starts (its value there, if any, until the write).
static void visit_if(symtab *t, const jj_node *st) {
  loads(t, st->a);
  symtab br[2] = {copy(t), copy(t)};
  visit(&br[0], &st->body);
  visit(&br[1], &st->els); // an elif is an if nested here, merged the same way
  size_t orig = t->nrefs;  // the copies begin with these refs; what follows them is new
  for (size_t b = 0; b < 2; b++) {
    for (size_t i = orig; i < br[b].nrefs; i++) add_ref(t, br[b].refs[i].name, 0);
    for (size_t i = 0; i < br[b].nstores; i++) {
      if (!stored(t, br[b].stores[i]) && has_ref(t, br[b].stores[i])) add_ref(t, br[b].stores[i], 0);
    }
  }
  for (size_t b = 0; b < 2; b++)
    for (size_t i = 0; i < br[b].nstores; i++) add_store(t, br[b].stores[i]);
}

static void frame(jj_arena *a, const symtab *up, jj_node *owner, const jj_nodes *targets, const jj_nodes *body,
                  const char ***shadow, size_t *nshadow);

static void visit(symtab *t, const jj_nodes *body) {
  for (size_t i = 0; i < body->n; i++) {
    const jj_node *st = body->v[i];
    switch (st->kind) {
    case JS_OUT: loads(t, st->a); break;
    case JS_IF: visit_if(t, st); break;
    case JS_SET:
      loads(t, st->b);
      if (st->attr) load(t, st->name); // ns.attr = ...: reads ns
      else
        for (size_t k = 0; k < st->args.n; k++) store(t, st->args.v[k]->name);
      break;
    case JS_SETBLOCK: store(t, st->name); break; // its body, a for's body and else, a macro's: frames of their own
    case JS_FILTERBLOCK: loads(t, st->a); break;
    case JS_FOR: loads(t, st->a); break;
    case JS_MACRO: store(t, st->name); break;
    default: break;
    }
  }
}

// The frames below body (loops, their else, macros, block sets, filter blocks), each under t.
static void children(jj_arena *a, const symtab *t, const jj_nodes *body) {
  for (size_t i = 0; i < body->n; i++) {
    jj_node *st = body->v[i];
    const char **none;
    size_t nnone;
    switch (st->kind) {
    case JS_FOR:
      frame(a, t, st, &st->args, &st->body, &st->shadow, &st->nshadow);
      frame(a, t, NULL, NULL, &st->els, &none, &nnone); // runs where nothing reads before writing: no shadows kept
      break;
    case JS_MACRO: frame(a, t, st, &st->kw, &st->body, &st->shadow, &st->nshadow); break;
    case JS_SETBLOCK: case JS_FILTERBLOCK: frame(a, t, st, NULL, &st->body, &st->shadow, &st->nshadow); break;
    case JS_IF:
      children(a, t, &st->body);
      children(a, t, &st->els);
      break;
    default: break;
    }
  }
}

static void frame(jj_arena *a, const symtab *up, jj_node *owner, const jj_nodes *targets, const jj_nodes *body,
                  const char ***shadow, size_t *nshadow) {
  symtab t = {.a = a, .up = up};
  if (targets)
    for (size_t i = 0; i < targets->n; i++) param(&t, targets->v[i]->name);
  if (owner && owner->kind == JS_FOR) param(&t, "loop");
  visit(&t, body);
  size_t n = 0;
  for (size_t i = 0; i < t.nrefs; i++) n += t.refs[i].undef;
  *shadow = jj_alloc(a, (n + 1) * sizeof(char *));
  *nshadow = 0;
  for (size_t i = 0; i < t.nrefs; i++)
    if (t.refs[i].undef) (*shadow)[(*nshadow)++] = t.refs[i].name;
  children(a, &t, body);
}

void jj_frames(mdl_jinja *t) {
  frame(&t->arena, NULL, NULL, NULL, &t->body, &t->shadow, &t->nshadow);
}
