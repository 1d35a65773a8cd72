// models/grammar.c: building a byte-level context-free grammar and freezing it (productivity, left-recursion checks).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/grammar_int.h"
#include "util/vec.h"

typedef struct gb_alt {
  uint32_t *sym; // (owned) (n)
  int n;
} gb_alt;

typedef struct gb_rule {
  gb_alt *alt; // (owned) (n_alt)
  int n_alt, cap_alt;
} gb_rule;

struct mdl_grammar_builder {
  gb_rule *rule;       // (owned) (n_rule)
  int n_rule, cap_rule;
  uint8_t (*set)[32];  // (owned) (n_set)
  int n_set, cap_set;
  int32_t *set_slot;   // (owned) (set_cap) open addressing: set content -> id, -1 empty
  size_t set_cap;
  size_t n_sym;        // over all alternatives, bounded by MDL_GRAMMAR_MAX_SYMS
  int failed;          // out of memory or room: every later call fails and finish refuses
};

mdl_grammar_builder *mdl_grammar_builder_new(void) { return calloc(1, sizeof(mdl_grammar_builder)); }

void mdl_grammar_builder_free(mdl_grammar_builder *b) {
  if (!b) return;
  for (int r = 0; r < b->n_rule; r++) {
    for (int a = 0; a < b->rule[r].n_alt; a++) free(b->rule[r].alt[a].sym);
    free(b->rule[r].alt);
  }
  free(b->rule);
  free(b->set);
  free(b->set_slot);
  free(b);
}

int mdl_grammar_builder_failed(const mdl_grammar_builder *b) { return b->failed; }

int mdl_grammar_rule_new(mdl_grammar_builder *b) {
  if (b->failed) return -1;
  if (b->n_rule >= (int)MDL_GRAMMAR_MAX_RULES) {
    b->failed = 1;
    return -1;
  }
  if (utl_vec_reserve((void **)&b->rule, &b->cap_rule, b->n_rule + 1, sizeof *b->rule)) {
    b->failed = 1;
    return -1;
  }
  memset(&b->rule[b->n_rule], 0, sizeof b->rule[0]);
  return b->n_rule++;
}

static uint64_t set_hash(const uint8_t *s) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 32; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

int mdl_grammar_set(mdl_grammar_builder *b, const uint8_t set[32]) {
  if (b->failed) return -1;
  if ((size_t)b->n_set * 2 >= b->set_cap) { // grow the table (load <= 1/2) and re-insert
    size_t cap = b->set_cap ? b->set_cap * 2 : 64;
    int32_t *slot = malloc(cap * sizeof *slot);
    if (!slot) {
      b->failed = 1;
      return -1;
    }
    for (size_t i = 0; i < cap; i++) slot[i] = -1;
    for (int i = 0; i < b->n_set; i++) {
      size_t h = (size_t)set_hash(b->set[i]) & (cap - 1);
      while (slot[h] >= 0) h = (h + 1) & (cap - 1);
      slot[h] = i;
    }
    free(b->set_slot);
    b->set_slot = slot;
    b->set_cap = cap;
  }
  size_t h = (size_t)set_hash(set) & (b->set_cap - 1);
  for (; b->set_slot[h] >= 0; h = (h + 1) & (b->set_cap - 1))
    if (!memcmp(b->set[b->set_slot[h]], set, 32)) return b->set_slot[h];
  if (utl_vec_reserve((void **)&b->set, &b->cap_set, b->n_set + 1, sizeof *b->set)) {
    b->failed = 1;
    return -1;
  }
  memcpy(b->set[b->n_set], set, 32);
  b->set_slot[h] = b->n_set;
  return b->n_set++;
}

void mdl_grammar_seq_push(mdl_grammar_seq *s, uint32_t sym) {
  if (s->oom) return;
  if (UTL_VEC_PUSH(s->sym, s->n, s->cap, sym)) s->oom = 1;
}

void mdl_grammar_seq_append(mdl_grammar_seq *s, const mdl_grammar_seq *tail) {
  if (tail->oom) s->oom = 1;
  for (int i = 0; i < tail->n; i++) mdl_grammar_seq_push(s, tail->sym[i]);
}

void mdl_grammar_seq_range(mdl_grammar_builder *b, mdl_grammar_seq *s, uint8_t lo, uint8_t hi) {
  uint8_t set[32] = {0};
  for (int c = lo; c <= hi; c++) set[c >> 3] |= (uint8_t)(1u << (c & 7));
  int id = mdl_grammar_set(b, set);
  if (id < 0) s->oom = 1;
  else mdl_grammar_seq_push(s, (uint32_t)id);
}

void mdl_grammar_seq_bytes(mdl_grammar_builder *b, mdl_grammar_seq *s, const void *bytes, size_t n) {
  const uint8_t *p = bytes;
  for (size_t i = 0; i < n; i++) mdl_grammar_seq_range(b, s, p[i], p[i]);
}

void mdl_grammar_seq_free(mdl_grammar_seq *s) {
  free(s->sym);
  memset(s, 0, sizeof *s);
}

int mdl_grammar_alt(mdl_grammar_builder *b, int rule, const mdl_grammar_seq *s) {
  if (b->failed || s->oom || rule < 0 || rule >= b->n_rule) {
    b->failed = 1;
    return -1;
  }
  if (b->n_sym + (size_t)s->n + 1 > MDL_GRAMMAR_MAX_SYMS) {
    b->failed = 1;
    return -1;
  }
  gb_rule *r = &b->rule[rule];
  if (utl_vec_reserve((void **)&r->alt, &r->cap_alt, r->n_alt + 1, sizeof *r->alt)) {
    b->failed = 1;
    return -1;
  }
  gb_alt a = {NULL, s->n};
  if (s->n) {
    a.sym = malloc((size_t)s->n * sizeof *a.sym);
    if (!a.sym) {
      b->failed = 1;
      return -1;
    }
    memcpy(a.sym, s->sym, (size_t)s->n * sizeof *a.sym);
  }
  r->alt[r->n_alt++] = a;
  b->n_sym += (size_t)s->n + 1;
  return 0;
}

// A rule for "up to k more (sep item)s": T_k ::= "" | sep item T_(k-1), T_0 ::= "", built from the inside out.
// k < 0: no bound (T ::= "" | sep item T).
static int optional_tail(mdl_grammar_builder *b, const mdl_grammar_seq *item, const mdl_grammar_seq *sep, int k) {
  mdl_grammar_seq empty = {0}, s = {0};
  int t = mdl_grammar_rule_new(b);
  if (t < 0 || mdl_grammar_alt(b, t, &empty)) return -1;
  if (k < 0) {
    if (sep) mdl_grammar_seq_append(&s, sep);
    mdl_grammar_seq_append(&s, item);
    mdl_grammar_seq_push(&s, MDL_GRAMMAR_REF(t));
    int rc = mdl_grammar_alt(b, t, &s);
    mdl_grammar_seq_free(&s);
    return rc ? -1 : t;
  }
  for (int i = 1; i <= k; i++) {
    int u = mdl_grammar_rule_new(b);
    s.n = 0;
    if (sep) mdl_grammar_seq_append(&s, sep);
    mdl_grammar_seq_append(&s, item);
    mdl_grammar_seq_push(&s, MDL_GRAMMAR_REF(t));
    if (u < 0 || mdl_grammar_alt(b, u, &empty) || mdl_grammar_alt(b, u, &s)) {
      mdl_grammar_seq_free(&s);
      return -1;
    }
    t = u;
  }
  mdl_grammar_seq_free(&s);
  return t;
}

int mdl_grammar_repeat(mdl_grammar_builder *b, const mdl_grammar_seq *item, const mdl_grammar_seq *sep, int min,
                       int max) {
  if (min < 0 || (max >= 0 && max < min)) {
    b->failed = 1;
    return -1;
  }
  if (min == 0 && max < 0 && !sep) return optional_tail(b, item, NULL, -1); // r ::= "" | item r: one loop state
  int r = mdl_grammar_rule_new(b);
  if (r < 0) return -1;
  mdl_grammar_seq s = {0};
  int rc = 0;
  if (max == 0) {
    rc = mdl_grammar_alt(b, r, &s);
  } else {
    // first item, then min-1 mandatory (sep item)s, then the optional tail
    int first = min > 0 ? min : 1, tail = optional_tail(b, item, sep, max < 0 ? -1 : max - first);
    if (tail < 0) rc = -1;
    if (!rc && min == 0) rc = mdl_grammar_alt(b, r, &s);
    mdl_grammar_seq_append(&s, item);
    for (int i = 1; i < first; i++) {
      if (sep) mdl_grammar_seq_append(&s, sep);
      mdl_grammar_seq_append(&s, item);
    }
    mdl_grammar_seq_push(&s, MDL_GRAMMAR_REF(tail));
    if (!rc) rc = mdl_grammar_alt(b, r, &s);
  }
  mdl_grammar_seq_free(&s);
  return rc ? -1 : r;
}

// ---- freezing ----

static int is_ref(uint32_t sym) { return (sym & 0x80000000u) != 0; }
static int ref_rule(uint32_t sym) { return (int)(sym & 0x7fffffffu); }

// The rules that can derive something: productive[r] (mode 0: a finite byte string; mode 1: the empty string, i.e.
// nullable). A worklist over "how many symbols of this alternative are not known good yet". 0, or -1 out of memory.
static int fixpoint(const mdl_grammar_builder *b, int nullable, uint8_t *good) {
  int R = b->n_rule, rc = -1;
  size_t n_alts = 0, n_refs = 0;
  for (int r = 0; r < R; r++) {
    n_alts += (size_t)b->rule[r].n_alt;
    for (int a = 0; a < b->rule[r].n_alt; a++) n_refs += (size_t)b->rule[r].alt[a].n;
  }
  uint32_t *alt_base = malloc(((size_t)R + 1) * sizeof *alt_base); // rule r's alternatives: alt_base[r]..
  int32_t *left = malloc((n_alts + 1) * sizeof *left);            // per alternative: symbols not known good
  uint32_t *occ_off = calloc((size_t)R + 1, sizeof *occ_off);      // rule r occurs in occ[occ_off[r]..occ_off[r+1])
  uint32_t *occ = malloc((n_refs + 1) * sizeof *occ);              // the alternative (global index) it occurs in
  uint32_t *occ_rule = malloc((n_refs + 1) * sizeof *occ_rule);    // and that alternative's rule
  int32_t *queue = malloc(((size_t)R + 1) * sizeof *queue);
  if (!alt_base || !left || !occ_off || !occ || !occ_rule || !queue) goto done;
  memset(good, 0, (size_t)R);
  uint32_t k = 0;
  for (int r = 0; r < R; r++) {
    alt_base[r] = k;
    for (int a = 0; a < b->rule[r].n_alt; a++, k++) {
      const gb_alt *al = &b->rule[r].alt[a];
      left[k] = 0;
      for (int i = 0; i < al->n; i++) {
        if (!is_ref(al->sym[i])) {
          if (nullable) left[k] = INT32_MAX / 2; // a terminal is never empty
          continue;
        }
        left[k]++;
        occ_off[ref_rule(al->sym[i]) + 1]++;
      }
    }
  }
  alt_base[R] = k;
  for (int r = 0; r < R; r++) occ_off[r + 1] += occ_off[r];
  uint32_t *fill = calloc((size_t)R + 1, sizeof *fill);
  if (!fill) goto done;
  k = 0;
  for (int r = 0; r < R; r++)
    for (int a = 0; a < b->rule[r].n_alt; a++, k++) {
      const gb_alt *al = &b->rule[r].alt[a];
      for (int i = 0; i < al->n; i++)
        if (is_ref(al->sym[i])) {
          int q = ref_rule(al->sym[i]);
          occ[occ_off[q] + fill[q]] = k;
          occ_rule[occ_off[q] + fill[q]++] = (uint32_t)r;
        }
    }
  free(fill);
  int qh = 0, qt = 0;
  for (int r = 0; r < R; r++)
    for (uint32_t a = alt_base[r]; a < alt_base[r + 1]; a++)
      if (left[a] == 0 && !good[r]) {
        good[r] = 1;
        queue[qt++] = r;
      }
  while (qh < qt) {
    int q = queue[qh++];
    for (uint32_t i = occ_off[q]; i < occ_off[q + 1]; i++) {
      uint32_t a = occ[i];
      int r = (int)occ_rule[i];
      if (--left[a] == 0 && !good[r]) {
        good[r] = 1;
        queue[qt++] = r;
      }
    }
  }
  rc = 0;
done:
  free(alt_base);
  free(left);
  free(occ_off);
  free(occ);
  free(occ_rule);
  free(queue);
  return rc;
}

static int alt_productive(const gb_alt *a, const uint8_t *prod) {
  for (int i = 0; i < a->n; i++)
    if (is_ref(a->sym[i]) && !prod[ref_rule(a->sym[i])]) return 0;
  return 1;
}

// A kept rule (keep[r] >= 0) that reaches itself through the leading symbols of its alternatives (skipping nullable
// rules) without a terminal in between: *bad, else -1. Iterative depth-first searches (colour 1: on the path, 2: done).
static int left_cycle(const mdl_grammar_builder *b, const uint8_t *prod, const uint8_t *nullable, const int32_t *keep,
                      int *bad) {
  int R = b->n_rule;
  uint8_t *colour = calloc((size_t)R, 1);
  typedef struct frame { int r, a, i; } frame;
  frame *st = malloc(((size_t)R + 1) * sizeof *st);
  if (!colour || !st) {
    free(colour);
    free(st);
    return -1;
  }
  int n = 0, start = 0;
  *bad = -1;
  while (*bad < 0) {
    if (n == 0) { // the next kept rule no search has visited yet
      while (start < R && (keep[start] < 0 || colour[start])) start++;
      if (start == R) break;
      colour[start] = 1;
      st[n++] = (frame){start, 0, 0};
    }
    frame *f = &st[n - 1];
    const gb_rule *rl = &b->rule[f->r];
    if (f->a >= rl->n_alt) {
      colour[f->r] = 2;
      n--;
      continue;
    }
    const gb_alt *al = &rl->alt[f->a];
    if (!alt_productive(al, prod) || f->i >= al->n || !is_ref(al->sym[f->i]) ||
        (f->i > 0 && !nullable[ref_rule(al->sym[f->i - 1])])) {
      f->a++; // this alternative's leading references are all visited
      f->i = 0;
      continue;
    }
    int q = ref_rule(al->sym[f->i++]);
    if (colour[q] == 1) *bad = q;
    else if (colour[q] == 0) {
      colour[q] = 1;
      st[n++] = (frame){q, 0, 0};
    }
  }
  free(colour);
  free(st);
  return 0;
}

// Only the rules reachable from root over productive alternatives are kept (renumbered).
static int reachable(const mdl_grammar_builder *b, const uint8_t *prod, int root, int32_t *map, int *n_out) {
  int R = b->n_rule, n = 0;
  int32_t *stack = malloc(((size_t)R + 1) * sizeof *stack);
  if (!stack) return -1;
  for (int r = 0; r < R; r++) map[r] = -1;
  int sp = 0;
  map[root] = n++;
  stack[sp++] = root;
  while (sp) {
    const gb_rule *rl = &b->rule[stack[--sp]];
    for (int a = 0; a < rl->n_alt; a++) {
      if (!alt_productive(&rl->alt[a], prod)) continue;
      for (int i = 0; i < rl->alt[a].n; i++) {
        uint32_t s = rl->alt[a].sym[i];
        if (is_ref(s) && map[ref_rule(s)] < 0) {
          map[ref_rule(s)] = n++;
          stack[sp++] = ref_rule(s);
        }
      }
    }
  }
  free(stack);
  *n_out = n;
  return 0;
}

// FIRST sets: what each alternative and rule can start with, and which alternatives can be empty. A rule's set
// depends on the rules at the left edges of its alternatives (skipping nullable ones), which form no cycle (finish
// checked), so a depth-first post-order over those edges computes each rule after what it needs.
static int first_sets(mdl_grammar *g) {
  int R = g->n_rule;
  uint32_t n_alt = g->rule_alt[R];
  g->first_alt = calloc((size_t)n_alt + 1, sizeof *g->first_alt);
  g->alt_nullable = calloc((size_t)n_alt + 1, 1);
  g->first_rule = calloc((size_t)R + 1, sizeof *g->first_rule);
  uint8_t *state = calloc((size_t)R + 1, 1); // 0 new, 1 on the path, 2 done
  typedef struct frame { int r; uint32_t a, pos; } frame;
  frame *st = malloc(((size_t)R + 1) * sizeof *st);
  int rc = -1;
  if (!g->first_alt || !g->alt_nullable || !g->first_rule || !state || !st) goto done;
  for (int start = 0; start < R; start++) {
    if (state[start]) continue;
    int n = 0;
    st[n++] = (frame){start, g->rule_alt[start], g->alt[g->rule_alt[start]]};
    state[start] = 1;
    while (n) {
      frame *f = &st[n - 1];
      if (f->a >= g->rule_alt[f->r + 1]) { // every alternative done
        for (uint32_t a = g->rule_alt[f->r]; a < g->rule_alt[f->r + 1]; a++)
          for (int w = 0; w < 32; w++) g->first_rule[f->r][w] |= g->first_alt[a][w];
        state[f->r] = 2;
        n--;
        continue;
      }
      uint32_t e = g->elem[f->pos];
      if (E_KIND(e) == E_TERM) {
        for (int w = 0; w < 32; w++) g->first_alt[f->a][w] |= g->set[E_VAL(e)][w];
      } else if (E_KIND(e) == E_REF) {
        int q = (int)E_VAL(e);
        if (state[q] == 0) { // needed first: come back to this position after it
          state[q] = 1;
          st[n++] = (frame){q, g->rule_alt[q], g->alt[g->rule_alt[q]]};
          continue;
        }
        for (int w = 0; w < 32; w++) g->first_alt[f->a][w] |= g->first_rule[q][w];
        if (g->rule_nullable[q]) {
          f->pos++;
          continue;
        }
      } else {
        g->alt_nullable[f->a] = 1; // reached the end of the alternative with nothing consumed
      }
      f->a++; // this alternative is done
      if (f->a < g->rule_alt[f->r + 1]) f->pos = g->alt[f->a];
    }
  }
  rc = 0;
done:
  free(state);
  free(st);
  return rc;
}

int mdl_grammar_finish(mdl_grammar_builder *b, int root, mdl_grammar **out, char *err, size_t errlen) {
  *out = NULL;
  if (b->failed) {
    snprintf(err, errlen, "the grammar is too large (more than %u symbols or %u rules) or out of memory",
             MDL_GRAMMAR_MAX_SYMS, MDL_GRAMMAR_MAX_RULES);
    return -1;
  }
  if (root < 0 || root >= b->n_rule) {
    snprintf(err, errlen, "grammar: no root rule");
    return -1;
  }
  int R = b->n_rule, rc = -1, bad = -1, n_keep = 0;
  uint8_t *prod = malloc((size_t)R), *nul = malloc((size_t)R);
  int32_t *map = malloc((size_t)R * sizeof *map);
  mdl_grammar *g = NULL;
  if (!prod || !nul || !map || fixpoint(b, 0, prod) || fixpoint(b, 1, nul)) goto oom;
  if (!prod[root]) {
    snprintf(err, errlen, "nothing can satisfy it (every choice is impossible or infinitely deep)");
    goto done;
  }
  if (reachable(b, prod, root, map, &n_keep)) goto oom;
  if (left_cycle(b, prod, nul, map, &bad)) goto oom;
  if (bad >= 0) {
    snprintf(err, errlen, "it refers to itself without consuming any text (a $ref cycle, or a pattern that repeats "
             "something that can be empty)");
    goto done;
  }
  g = calloc(1, sizeof *g);
  if (!g) goto oom;
  atomic_init(&g->refs, 1);
  pthread_mutex_init(&g->mu, NULL);
  size_t n_elem = 0, n_alt = 0;
  for (int r = 0; r < R; r++) {
    if (map[r] < 0) continue;
    for (int a = 0; a < b->rule[r].n_alt; a++)
      if (alt_productive(&b->rule[r].alt[a], prod)) {
        n_alt++;
        n_elem += (size_t)b->rule[r].alt[a].n + 1;
      }
  }
  n_elem += 1; // a lone E_END after the last rule: a position one past an alternative's reference reads it
  g->elem = malloc(n_elem * sizeof *g->elem);
  g->alt = malloc((n_alt + 1) * sizeof *g->alt);
  g->rule_alt = malloc(((size_t)n_keep + 1) * sizeof *g->rule_alt);
  g->set = malloc(((size_t)b->n_set + 1) * sizeof *g->set);
  int32_t *order = malloc(((size_t)n_keep + 1) * sizeof *order); // new id -> old id
  if (!g->elem || !g->alt || !g->rule_alt || !g->set || !order) {
    free(order);
    goto oom;
  }
  for (int r = 0; r < R; r++)
    if (map[r] >= 0) order[map[r]] = r;
  memcpy(g->set, b->set, (size_t)b->n_set * sizeof *g->set);
  g->n_set = b->n_set;
  uint32_t e = 0, na = 0;
  for (int nr = 0; nr < n_keep; nr++) {
    const gb_rule *rl = &b->rule[order[nr]];
    g->rule_alt[nr] = na;
    uint32_t last_end = 0;
    for (int a = 0; a < rl->n_alt; a++) {
      const gb_alt *al = &rl->alt[a];
      if (!alt_productive(al, prod)) continue;
      g->alt[na++] = e;
      for (int i = 0; i < al->n; i++)
        g->elem[e++] = is_ref(al->sym[i]) ? E_MAKE(E_REF, map[ref_rule(al->sym[i])]) : E_MAKE(E_TERM, al->sym[i]);
      last_end = e;
      g->elem[e++] = E_MAKE(E_ALT, 0);
    }
    g->elem[last_end] = E_MAKE(E_END, 0); // a kept rule has at least one alternative: it is productive
  }
  g->elem[e++] = E_MAKE(E_END, 0);
  g->rule_alt[n_keep] = na;
  g->n_elem = e;
  g->n_rule = n_keep;
  g->root = 0; // map[root] is 0: it was numbered first
  g->rule_nullable = malloc((size_t)n_keep + 1);
  if (g->rule_nullable)
    for (int nr = 0; nr < n_keep; nr++) g->rule_nullable[nr] = nul[order[nr]];
  free(order);
  if (!g->rule_nullable || first_sets(g)) goto oom;
  *out = g;
  g = NULL;
  rc = 0;
  goto done;
oom:
  snprintf(err, errlen, "grammar: out of memory");
done:
  mdl_grammar_unref(g);
  free(prod);
  free(nul);
  free(map);
  return rc;
}

mdl_grammar *mdl_grammar_ref(mdl_grammar *g) {
  if (g) atomic_fetch_add(&g->refs, 1);
  return g;
}

void mdl_grammar_unref(mdl_grammar *g) {
  if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
  for (int i = 0; i < g->n_cache; i++) {
    free(g->cache[i].key);
    free(g->cache[i].bits);
  }
  free(g->cache);
  for (int i = 0; i < g->n_loop; i++) {
    free(g->loop[i].bits);
    free(g->loop[i].esc);
  }
  pthread_mutex_destroy(&g->mu);
  free(g->elem);
  free(g->alt);
  free(g->rule_alt);
  free(g->set);
  free(g->first_alt);
  free(g->alt_nullable);
  free(g->first_rule);
  free(g->rule_nullable);
  free(g);
}

int mdl_grammar_n_rules(const mdl_grammar *g) { return g->n_rule; }
size_t mdl_grammar_n_elems(const mdl_grammar *g) { return g->n_elem; }
