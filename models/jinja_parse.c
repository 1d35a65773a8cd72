// models/jinja_parse.c: Jinja tokens to a syntax tree, with jinja2's operator precedence (filters and tests bind
// tighter than arithmetic; `not` looser than comparisons; `a if c else b` loosest) and its statement tags.
#include <stdio.h>
#include <string.h>

#include "models/jinja_int.h"

#define MAX_NEST 256 // expression and block nesting: deeper templates are refused, not overflowed

typedef struct parser {
  mdl_jinja *t;
  jj_arena *a;
  const jj_toks *toks;
  size_t pos;
  int nest;
} parser;

static const jj_tok *cur(parser *P) { return &P->toks->v[P->pos]; }
static const jj_tok *peek(parser *P, size_t k) {
  size_t i = P->pos + k < P->toks->n ? P->pos + k : P->toks->n - 1;
  return &P->toks->v[i];
}

_Noreturn static void pfail(parser *P, const jj_tok *t, const char *fmt, const char *what, size_t n) {
  char msg[200];
  snprintf(msg, sizeof msg, fmt, (int)(n > 60 ? 60 : n), what);
  jj_fail(P->a, "line %d:%d: %s", t->line, t->col, msg);
}

static int is_op(const jj_tok *t, const char *op) {
  return t->kind == JT_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0;
}
static int is_name(const jj_tok *t, const char *w) {
  return t->kind == JT_NAME && t->n == strlen(w) && memcmp(t->p, w, t->n) == 0;
}

static const char *tok_desc(const jj_tok *t, size_t *n) {
  static const char *kinds[] = {"end of template", "text", "'{{'", "'}}'", "'{%'", "'%}'"};
  if (t->kind == JT_NAME || t->kind == JT_OP || t->kind == JT_INT || t->kind == JT_FLOAT) {
    *n = t->n;
    return t->p;
  }
  const char *s = t->kind == JT_STR ? "a string" : kinds[t->kind];
  *n = strlen(s);
  return s;
}

static void expect_op(parser *P, const char *op) {
  if (!is_op(cur(P), op)) {
    char fmt[64];
    snprintf(fmt, sizeof fmt, "expected '%s', got '%%.*s'", op);
    size_t n;
    const char *d = tok_desc(cur(P), &n);
    pfail(P, cur(P), fmt, d, n);
  }
  P->pos++;
}

static const char *name_dup(parser *P, const jj_tok *t) {
  char *s = jj_alloc(P->a, t->n + 1);
  memcpy(s, t->p, t->n);
  return s;
}

static const char *expect_name(parser *P) {
  if (cur(P)->kind != JT_NAME) {
    size_t n;
    const char *d = tok_desc(cur(P), &n);
    pfail(P, cur(P), "expected a name, got '%.*s'", d, n);
  }
  return name_dup(P, &P->toks->v[P->pos++]);
}

static jj_node *node(parser *P, int kind, const jj_tok *at) {
  jj_node *e = jj_alloc(P->a, sizeof(*e));
  e->kind = (uint8_t)kind;
  e->line = at->line;
  return e;
}

static void push(parser *P, jj_nodes *v, jj_node *e) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 4;
    jj_node **nv = jj_alloc(P->a, cap * sizeof(*nv));
    if (v->n) memcpy(nv, v->v, v->n * sizeof(*nv));
    v->v = nv;
    v->cap = cap;
  }
  v->v[v->n++] = e;
}

static void note_var(parser *P, const char *name) {
  mdl_jinja *t = P->t;
  for (size_t i = 0; i < t->nvars; i++)
    if (strcmp(t->vars[i], name) == 0) return;
  if ((t->nvars & (t->nvars - 1)) == 0) { // grow at powers of two
    const char **nv = jj_alloc(P->a, (t->nvars ? t->nvars * 2 : 8) * sizeof(*nv));
    if (t->nvars) memcpy(nv, t->vars, t->nvars * sizeof(*nv));
    t->vars = nv;
  }
  t->vars[t->nvars++] = name;
}

static jj_node *expr(parser *P, int condexpr);

static void call_args(parser *P, jj_node *e) {
  expect_op(P, "(");
  while (!is_op(cur(P), ")")) {
    if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), "=")) {
      jj_node *k = node(P, JE_NAME, cur(P));
      k->name = expect_name(P);
      P->pos++;
      k->a = expr(P, 1);
      push(P, &e->kw, k);
    } else {
      if (e->kw.n) pfail(P, cur(P), "%.*spositional argument after a keyword argument", "", 0);
      push(P, &e->args, expr(P, 1));
    }
    if (!is_op(cur(P), ",")) break;
    P->pos++;
  }
  expect_op(P, ")");
}

static jj_node *call_node(parser *P, jj_node *callee, const jj_tok *t) {
  jj_node *x = node(P, JE_CALL, t);
  x->a = callee;
  call_args(P, x);
  return x;
}

static jj_node *primary(parser *P) {
  const jj_tok *t = cur(P);
  jj_node *e;
  if (t->kind == JT_NAME) {
    static const struct { const char *w; uint8_t t; int b; } lits[] = {
        {"true", JV_BOOL, 1}, {"True", JV_BOOL, 1}, {"false", JV_BOOL, 0},
        {"False", JV_BOOL, 0}, {"none", JV_NONE, 0}, {"None", JV_NONE, 0}};
    P->pos++;
    for (size_t i = 0; i < sizeof lits / sizeof *lits; i++) {
      if (is_name(t, lits[i].w)) {
        e = node(P, JE_LIT, t);
        e->lit = (jj_val){.t = lits[i].t, .b = lits[i].b};
        return e;
      }
    }
    e = node(P, JE_NAME, t);
    e->name = name_dup(P, t);
    note_var(P, e->name);
    return e;
  }
  if (t->kind == JT_STR) {
    jj_sbuf b = {.limit = MDL_JINJA_MAX_TEMPLATE};
    while (cur(P)->kind == JT_STR) { // adjacent literals join, as in Python
      jj_sb_put(P->a, &b, cur(P)->p, cur(P)->n, 0);
      P->pos++;
    }
    e = node(P, JE_LIT, t);
    e->lit = jj_strv(jj_sb_done(P->a, &b));
    return e;
  }
  if (t->kind == JT_INT || t->kind == JT_FLOAT) {
    P->pos++;
    e = node(P, JE_LIT, t);
    e->lit = t->kind == JT_INT ? jj_int(t->i) : jj_float(t->f);
    return e;
  }
  if (is_op(t, "(")) {
    P->pos++;
    if (is_op(cur(P), ")")) {
      P->pos++;
      e = node(P, JE_TUPLE, t);
      return e;
    }
    jj_node *first = expr(P, 1);
    if (!is_op(cur(P), ",")) {
      expect_op(P, ")");
      return first;
    }
    e = node(P, JE_TUPLE, t);
    push(P, &e->args, first);
    while (is_op(cur(P), ",")) {
      P->pos++;
      if (is_op(cur(P), ")")) break;
      push(P, &e->args, expr(P, 1));
    }
    expect_op(P, ")");
    return e;
  }
  if (is_op(t, "[") || is_op(t, "{")) {
    int dict = is_op(t, "{");
    const char *close = dict ? "}" : "]";
    P->pos++;
    e = node(P, dict ? JE_DICT : JE_LIST, t);
    while (!is_op(cur(P), close)) {
      push(P, &e->args, expr(P, 1)); // a list's items, a dict's keys
      if (dict) {
        expect_op(P, ":");
        push(P, &e->kw, expr(P, 1));
      }
      if (!is_op(cur(P), ",")) break;
      P->pos++;
    }
    expect_op(P, close);
    return e;
  }
  size_t n;
  const char *d = tok_desc(t, &n);
  pfail(P, t, "unexpected '%.*s'", d, n);
}

static jj_node *postfix(parser *P, jj_node *e) {
  for (;;) {
    const jj_tok *t = cur(P);
    if (is_op(t, ".")) {
      P->pos++;
      if (cur(P)->kind == JT_INT) { // foo.0 is foo[0]
        jj_node *k = node(P, JE_LIT, cur(P));
        k->lit = jj_int(cur(P)->i);
        P->pos++;
        jj_node *x = node(P, JE_ITEM, t);
        x->a = e;
        x->b = k;
        e = x;
        continue;
      }
      jj_node *x = node(P, JE_ATTR, t);
      x->a = e;
      x->name = expect_name(P);
      e = x;
    } else if (is_op(t, "[")) {
      P->pos++;
      jj_node *idx[3] = {NULL, NULL, NULL};
      int colons = 0;
      for (;;) {
        if (is_op(cur(P), ":")) {
          if (++colons > 2) pfail(P, cur(P), "%.*stoo many ':' in a slice", "", 0);
          P->pos++;
          continue;
        }
        if (is_op(cur(P), "]")) break;
        if (!colons && idx[0] && is_op(cur(P), ",")) { // x[a, b]: the tuple (a, b) as the key
          if (idx[0]->kind != JE_TUPLE || idx[0]->line < 0) {
            jj_node *tu = node(P, JE_TUPLE, cur(P));
            tu->line = -1; // marks a tuple made here, not written in parentheses
            push(P, &tu->args, idx[0]);
            idx[0] = tu;
          }
          P->pos++;
          if (!is_op(cur(P), "]")) push(P, &idx[0]->args, expr(P, 1));
          continue;
        }
        if (idx[colons]) pfail(P, cur(P), "%.*sexpected ']'", "", 0);
        idx[colons] = expr(P, 1);
      }
      expect_op(P, "]");
      jj_node *x = node(P, colons ? JE_SLICE : JE_ITEM, t);
      x->a = e;
      x->b = idx[0];
      x->c = idx[1];
      x->d = idx[2];
      if (!colons && !x->b) pfail(P, t, "%.*sempty subscript", "", 0);
      e = x;
    } else if (is_op(t, "(")) {
      e = call_node(P, e, t);
    } else {
      return e;
    }
  }
}

static jj_node *unary(parser *P, int with_filter);

static jj_node *filters_tests(parser *P, jj_node *e) {
  for (;;) {
    const jj_tok *t = cur(P);
    if (is_op(t, "|")) {
      P->pos++;
      jj_node *x = node(P, JE_FILTER, t);
      x->a = e;
      x->name = expect_name(P);
      if (is_op(cur(P), "(")) call_args(P, x);
      e = x;
    } else if (is_name(t, "is")) {
      P->pos++;
      jj_node *x = node(P, JE_TEST, t);
      x->a = e;
      if (is_name(cur(P), "not")) {
        x->neg = 1;
        P->pos++;
      }
      x->name = expect_name(P);
      const jj_tok *n = cur(P);
      if (is_op(n, "(")) {
        call_args(P, x);
      } else if (n->kind == JT_STR || n->kind == JT_INT || n->kind == JT_FLOAT || is_op(n, "[") || is_op(n, "{") ||
                 (n->kind == JT_NAME && !is_name(n, "else") && !is_name(n, "or") && !is_name(n, "and"))) {
        // one argument without parentheses (`is divisibleby 3`), taken as jinja2 takes it: any name but these
        if (is_name(n, "is")) pfail(P, n, "%.*syou cannot chain multiple tests with is", "", 0);
        push(P, &x->args, postfix(P, primary(P)));
      }
      e = x;
    } else if (is_op(t, "(")) {
      e = call_node(P, e, t);
    } else {
      return e;
    }
  }
}

static jj_node *unary(parser *P, int with_filter) {
  const jj_tok *t = cur(P);
  jj_node *e;
  if (is_op(t, "-") || is_op(t, "+")) {
    P->pos++;
    e = node(P, JE_NEG, t);
    e->op = is_op(t, "-") ? "-" : "+";
    e->a = unary(P, 0);
  } else {
    e = primary(P);
  }
  e = postfix(P, e);
  return with_filter ? filters_tests(P, e) : e;
}

static jj_node *bin(parser *P, const jj_tok *at, const char *op, jj_node *a, jj_node *b) {
  jj_node *e = node(P, JE_BIN, at);
  e->op = op;
  e->a = a;
  e->b = b;
  return e;
}

// Left-associative binary operators, loosest level first: or, and, (not, comparisons), + -, ~, * / // %, **.
static const char *const OPS[][4] = {{"or"}, {"and"}, {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
static jj_node *binary(parser *P, int level);
static jj_node *not_expr(parser *P);

static jj_node *operand(parser *P, int level) {
  if (level == 1) return not_expr(P);
  if (level == 5) return unary(P, 1);
  return binary(P, level + 1);
}

static jj_node *binary(parser *P, int level) {
  jj_node *e = operand(P, level);
  for (;;) {
    const jj_tok *t = cur(P);
    const char *op = NULL;
    for (int k = 0; k < 4 && OPS[level][k]; k++)
      if (level < 2 ? is_name(t, OPS[level][k]) : is_op(t, OPS[level][k])) op = OPS[level][k];
    if (!op) return e;
    P->pos++;
    e = bin(P, t, op, e, operand(P, level));
  }
}

static const char *cmp_op(parser *P) {
  static const char *ops[] = {"==", "!=", "<", ">", "<=", ">="};
  for (size_t i = 0; i < 6; i++)
    if (is_op(cur(P), ops[i])) return ops[i];
  if (is_name(cur(P), "in")) return "in";
  if (is_name(cur(P), "not") && is_name(peek(P, 1), "in")) return "not in";
  return NULL;
}

static jj_node *compare(parser *P) {
  jj_node *e = binary(P, 2);
  const char *op = cmp_op(P);
  if (!op) return e;
  const jj_tok *t = cur(P);
  P->pos += strcmp(op, "not in") == 0 ? 2 : 1;
  e = bin(P, t, op, e, binary(P, 2));
  if (cmp_op(P)) pfail(P, cur(P), "%.*schained comparisons are not supported", "", 0);
  return e;
}

static jj_node *not_expr(parser *P) {
  if (is_name(cur(P), "not")) {
    jj_node *e = node(P, JE_NOT, cur(P));
    P->pos++;
    e->a = not_expr(P);
    return e;
  }
  return compare(P);
}

static jj_node *expr(parser *P, int condexpr) {
  if (++P->nest > MAX_NEST) pfail(P, cur(P), "%.*sexpression nested too deeply", "", 0);
  jj_node *e = binary(P, 0);
  while (condexpr && is_name(cur(P), "if")) {
    jj_node *c = node(P, JE_COND, cur(P));
    P->pos++;
    c->b = e;
    c->a = binary(P, 0);
    if (is_name(cur(P), "else")) {
      P->pos++;
      c->c = expr(P, 1);
    }
    e = c;
  }
  P->nest--;
  return e;
}

// ---- statements ----

static void block_end(parser *P) {
  if (cur(P)->kind != JT_BLOCK_END) {
    size_t n;
    const char *d = tok_desc(cur(P), &n);
    pfail(P, cur(P), "expected '%%}', got '%.*s'", d, n);
  }
  P->pos++;
}

// Statements until one of the tags in `ends` (NULL-terminated); returns which, with the cursor after its name.
static int body(parser *P, jj_nodes *out, const char *const *ends);

static void assign_targets(parser *P, jj_node *st) {
  int paren = is_op(cur(P), "(");
  if (paren) P->pos++;
  for (;;) {
    jj_node *n = node(P, JE_NAME, cur(P));
    n->name = expect_name(P);
    push(P, &st->args, n);
    if (!is_op(cur(P), ",")) break;
    P->pos++;
  }
  if (paren) expect_op(P, ")");
}

// "%}", the statements up to {% end %}, and its "%}".
static void block_to(parser *P, jj_nodes *out, const char *end) {
  const char *const ends[] = {end, NULL};
  block_end(P);
  body(P, out, ends);
  block_end(P);
}

static jj_node *statement(parser *P, const jj_tok *tag) {
  jj_node *st;
  if (is_name(tag, "if")) {
    st = node(P, JS_IF, tag);
    st->a = expr(P, 0); // jinja2 takes no `a if b else c` as an if's test
    block_end(P);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    jj_node *at = st;
    for (;;) {
      int which = body(P, &at->body, ends);
      if (which == 0) { // elif: a nested if in the else branch
        jj_node *el = node(P, JS_IF, &P->toks->v[P->pos - 1]);
        el->a = expr(P, 0);
        block_end(P);
        push(P, &at->els, el);
        at = el;
        continue;
      }
      if (which == 1) block_to(P, &at->els, "endif");
      else block_end(P);
      return st;
    }
  }
  if (is_name(tag, "for")) {
    st = node(P, JS_FOR, tag);
    assign_targets(P, st);
    if (!is_name(cur(P), "in")) pfail(P, cur(P), "%.*sexpected 'in'", "", 0);
    P->pos++;
    st->a = expr(P, 0);
    if (is_name(cur(P), "if")) {
      P->pos++;
      st->b = expr(P, 1);
    }
    if (is_name(cur(P), "recursive")) pfail(P, cur(P), "%.*srecursive loops are not supported", "", 0);
    block_end(P);
    static const char *const ends[] = {"else", "endfor", NULL};
    if (body(P, &st->body, ends) == 0) block_to(P, &st->els, "endfor");
    else block_end(P);
    return st;
  }
  if (is_name(tag, "set")) {
    st = node(P, JS_SET, tag);
    if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), ".")) {
      st->name = expect_name(P);
      note_var(P, st->name);
      P->pos++;
      st->attr = expect_name(P);
    } else {
      assign_targets(P, st);
      st->name = st->args.v[0]->name;
    }
    if (!is_op(cur(P), "=")) { // {% set x %}...{% endset %}
      if (st->attr || st->args.n != 1) pfail(P, cur(P), "%.*sexpected '='", "", 0);
      st->kind = JS_SETBLOCK;
      block_to(P, &st->body, "endset");
      return st;
    }
    P->pos++;
    st->b = expr(P, 1);
    if (is_op(cur(P), ",")) { // set a = 1, 2: a tuple
      jj_node *tu = node(P, JE_TUPLE, cur(P));
      push(P, &tu->args, st->b);
      while (is_op(cur(P), ",")) {
        P->pos++;
        push(P, &tu->args, expr(P, 1));
      }
      st->b = tu;
    }
    block_end(P);
    return st;
  }
  if (is_name(tag, "macro")) {
    st = node(P, JS_MACRO, tag);
    st->name = expect_name(P);
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
      jj_node *p = node(P, JE_NAME, cur(P));
      p->name = expect_name(P);
      if (is_op(cur(P), "=")) {
        P->pos++;
        p->a = expr(P, 1);
      } else if (st->kw.n && st->kw.v[st->kw.n - 1]->a) {
        pfail(P, cur(P), "%.*sa parameter without a default follows one with a default", "", 0);
      }
      push(P, &st->kw, p);
      if (!is_op(cur(P), ",")) break;
      P->pos++;
    }
    expect_op(P, ")");
    block_to(P, &st->body, "endmacro");
    return st;
  }
  if (is_name(tag, "break") || is_name(tag, "continue")) {
    st = node(P, is_name(tag, "break") ? JS_BREAK : JS_CONTINUE, tag);
    block_end(P);
    return st;
  }
  if (is_name(tag, "filter")) { // the filters run over a name bound to the body's output at render
    st = node(P, JS_FILTERBLOCK, tag);
    jj_node *body_name = node(P, JE_NAME, tag);
    body_name->name = JJ_BODY;
    jj_node *f = node(P, JE_FILTER, tag);
    f->a = body_name;
    f->name = expect_name(P);
    if (is_op(cur(P), "(")) call_args(P, f);
    st->a = filters_tests(P, f);
    block_to(P, &st->body, "endfilter");
    return st;
  }
  if (is_name(tag, "generation")) { // Hugging Face's marker of assistant text: renders its body
    st = node(P, JS_IF, tag);
    st->a = node(P, JE_LIT, tag);
    st->a->lit = jj_bool(1);
    block_to(P, &st->body, "endgeneration");
    return st;
  }
  pfail(P, tag, "unknown tag '%.*s'", tag->p, tag->n);
}

static int body(parser *P, jj_nodes *out, const char *const *ends) {
  if (++P->nest > MAX_NEST) pfail(P, cur(P), "%.*sblocks nested too deeply", "", 0);
  for (;;) {
    const jj_tok *t = cur(P);
    if (t->kind == JT_EOF) {
      if (!ends) {
        P->nest--;
        return -1;
      }
      size_t k = 0;
      while (ends[k + 1]) k++; // the closing tag is the last one
      pfail(P, t, "unexpected end of template: '{%% %.*s %%}' missing", ends[k], strlen(ends[k]));
    }
    if (t->kind == JT_TEXT) {
      jj_node *n = node(P, JS_TEXT, t);
      n->lit = jj_strv(jj_str_new(P->a, t->p, t->n, 0));
      push(P, out, n);
      P->pos++;
    } else if (t->kind == JT_VAR_BEGIN) {
      P->pos++;
      jj_node *n = node(P, JS_OUT, t);
      n->a = expr(P, 1);
      if (cur(P)->kind != JT_VAR_END) {
        size_t k;
        const char *d = tok_desc(cur(P), &k);
        pfail(P, cur(P), "expected '}}', got '%.*s'", d, k);
      }
      P->pos++;
      push(P, out, n);
    } else if (t->kind == JT_BLOCK_BEGIN) {
      P->pos++;
      const jj_tok *tag = cur(P);
      if (tag->kind != JT_NAME) pfail(P, tag, "%.*sexpected a tag name", "", 0);
      for (int i = 0; ends && ends[i]; i++) {
        if (is_name(tag, ends[i])) {
          P->pos++;
          P->nest--;
          return i;
        }
      }
      P->pos++;
      push(P, out, statement(P, tag));
    } else {
      size_t k;
      const char *d = tok_desc(t, &k);
      pfail(P, t, "unexpected '%.*s'", d, k);
    }
  }
}

void jj_parse(mdl_jinja *t, const jj_toks *toks) {
  parser P = {.t = t, .a = &t->arena, .toks = toks};
  body(&P, &t->body, NULL);
  jj_frames(t);
}
