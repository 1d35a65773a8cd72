// models/grammar_match.c: following a grammar byte by byte (a set of persistent stacks), and token masks: a walk of
// the vocabulary's byte trie (grammar_vocab.c) from the current stacks, pruned at the first rejected byte, cached per
// state in the grammar.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/grammar_int.h"
#include "util/vec.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *s = p;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

// ---- matcher ----

// A stack frame: continue at elem[pos] (a terminal, or a rule reference not expanded yet); parent is the frame below
// (0: none). A stack is named by its top frame; frames are never changed once made, so stacks share their lower
// frames. Top 0 is the empty stack: the whole sentence is complete.
//
// Expansion is lazy: a reference on top is expanded only when a byte comes, and then only into the alternatives
// whose FIRST set holds that byte (or that can be empty). Inside a JSON string that is one alternative of a dozen
// (plain character, each UTF-8 form, escape), so a byte costs a frame or two rather than a stack per alternative.
typedef struct gnode {
  uint32_t pos, parent;
} gnode;

#define NONE UINT32_MAX
// At most this many stacks in a state: more are dropped, which only narrows what may follow (each stack kept is a
// valid reading of the output so far), so a pathologically ambiguous grammar costs choice, never validity.
#define MAX_STACKS 256
#define MAX_REF_DEPTH 4096 // nested references entered for one byte (a left-recursion-free grammar needs few)

struct mdl_grammar_matcher {
  const mdl_grammar *g;       // (borrowed)
  const mdl_grammar_vocab *v; // (borrowed, may be NULL)
  gnode *node;                // (owned) (n_node) frames; node 0 is unused
  uint32_t n_node, cap_node, live;
  uint32_t *cur;              // (owned) (n_cur) the state: its stacks' tops
  int n_cur, cap_cur;
  uint32_t *buf;              // (owned) (n_buf) scratch: the stack sets of a walk, one level after another
  size_t n_buf, cap_buf;
  uint32_t *key;              // (owned) (cap_key) scratch: the state's cache key
  size_t cap_key;
  int ended, dead, oom;
  uint64_t work;              // parse steps of the mask being computed (bounded by MDL_GRAMMAR_MASK_WORK)
  int too_costly;             // a mask needed more than MDL_GRAMMAR_MASK_WORK steps: the request must end
};

static uint32_t node_new(mdl_grammar_matcher *m, uint32_t pos, uint32_t parent) {
  if (m->n_node == m->cap_node) {
    uint32_t cap = m->cap_node * 2;
    gnode *p = cap > m->cap_node ? realloc(m->node, (size_t)cap * sizeof *p) : NULL;
    if (!p) {
      m->oom = 1;
      return NONE;
    }
    m->node = p;
    m->cap_node = cap;
  }
  m->node[m->n_node] = (gnode){pos, parent};
  return m->n_node++;
}

static int buf_reserve(mdl_grammar_matcher *m, size_t n) {
  if (n <= m->cap_buf) return 0;
  size_t cap = m->cap_buf * 2 > n ? m->cap_buf * 2 : n < 64 ? 64 : n;
  uint32_t *p = realloc(m->buf, cap * sizeof *p);
  if (!p) {
    m->oom = 1;
    return -1;
  }
  m->buf = p;
  m->cap_buf = cap;
  return 0;
}

static int is_end(uint32_t e) { return E_KIND(e) == E_ALT || E_KIND(e) == E_END; }

// Adds the stack "continue at pos over parent" to the set being built at buf[out0..) unless an equal one is there.
// Positions at the end of an alternative return to the frame below first (so a state never holds a finished
// alternative, and the complete sentence is always top 0); a frame returned to is reused, not copied.
static void emit(mdl_grammar_matcher *m, size_t out0, uint32_t pos, uint32_t parent) {
  const uint32_t *el = m->g->elem;
  uint32_t t = NONE;
  while (is_end(el[pos])) {
    if (parent == 0) {
      t = 0;
      break;
    }
    t = parent;
    pos = m->node[parent].pos;
    parent = m->node[parent].parent;
  }
  for (size_t i = out0; i < m->n_buf; i++) {
    uint32_t u = m->buf[i];
    if (t == 0 ? u == 0 : u != 0 && (u == t || (m->node[u].pos == pos && m->node[u].parent == parent))) return;
  }
  if (m->n_buf - out0 >= MAX_STACKS || buf_reserve(m, m->n_buf + 1)) return;
  if (t == NONE && (t = node_new(m, pos, parent)) == NONE) return;
  m->buf[m->n_buf++] = t;
}

// Continues at elem[pos] over frames parent and takes byte c: every stack after it is emitted. A reference enters
// the alternatives that can start with c or be empty (an empty one returns to the reference's continuation).
static void step(mdl_grammar_matcher *m, uint32_t pos, uint32_t parent, uint8_t c, size_t out0, int depth) {
  const mdl_grammar *g = m->g;
  m->work++;
  for (;;) {
    uint32_t e = g->elem[pos];
    switch (E_KIND(e)) {
    case E_TERM:
      if (g->set[E_VAL(e)][c >> 3] >> (c & 7) & 1) emit(m, out0, pos + 1, parent);
      return;
    case E_REF: {
      uint32_t r = E_VAL(e), np = NONE;
      if (depth > MAX_REF_DEPTH) return;
      for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
        if (!(g->first_alt[a][c >> 3] >> (c & 7) & 1) && !g->alt_nullable[a]) continue;
        // The caller's frame is needed only when something follows the reference (a tail call needs none:
        // stacks stay flat over right recursion, e.g. a string's characters).
        if (np == NONE) np = is_end(g->elem[pos + 1]) ? parent : node_new(m, pos + 1, parent);
        if (np == NONE) return;
        step(m, g->alt[a], np, c, out0, depth + 1);
      }
      return;
    }
    default: // the alternative is done: return to the frame below
      if (parent == 0) return;
      pos = m->node[parent].pos;
      parent = m->node[parent].parent;
    }
  }
}

// The stacks after byte c from the set buf[in0 .. in0 + n_in), appended to buf (from out0 = n_buf); their count.
static int advance(mdl_grammar_matcher *m, size_t in0, int n_in, uint8_t c) {
  size_t out0 = m->n_buf;
  for (int i = 0; i < n_in; i++) {
    uint32_t t = m->buf[in0 + (size_t)i];
    if (t) step(m, m->node[t].pos, m->node[t].parent, c, out0, 0);
  }
  return (int)(m->n_buf - out0);
}

// ORs into acc the bytes stack t can take next; returns 1 when it can also end here (everything left is nullable).
static int next_bytes(const mdl_grammar_matcher *m, uint32_t t, uint8_t *acc) {
  const mdl_grammar *g = m->g;
  if (!t) return 1;
  uint32_t pos = m->node[t].pos, parent = m->node[t].parent;
  for (;;) {
    uint32_t e = g->elem[pos];
    if (E_KIND(e) == E_TERM) {
      if (acc)
        for (int w = 0; w < 32; w++) acc[w] |= g->set[E_VAL(e)][w];
      return 0;
    }
    if (E_KIND(e) == E_REF) {
      if (acc)
        for (int w = 0; w < 32; w++) acc[w] |= g->first_rule[E_VAL(e)][w];
      if (!g->rule_nullable[E_VAL(e)]) return 0;
      pos++;
      continue;
    }
    if (parent == 0) return 1;
    pos = m->node[parent].pos;
    parent = m->node[parent].parent;
  }
}

int mdl_grammar_matcher_new(const mdl_grammar *g, const mdl_grammar_vocab *v, mdl_grammar_matcher **out, char *err,
                            size_t errlen) {
  *out = NULL;
  mdl_grammar_matcher *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->g = g;
  m->v = v;
  m->cap_node = 256;
  m->node = malloc(m->cap_node * sizeof *m->node);
  if (!m->node) goto oom;
  m->n_node = 1;
  m->node[0] = (gnode){0, 0};
  for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) emit(m, 0, g->alt[a], 0);
  if (m->oom) goto oom;
  m->cur = malloc((m->n_buf + 1) * sizeof *m->cur);
  if (!m->cur) goto oom;
  memcpy(m->cur, m->buf, m->n_buf * sizeof *m->cur);
  m->n_cur = m->cap_cur = (int)m->n_buf;
  m->n_buf = 0;
  m->live = m->n_node;
  *out = m;
  return 0;
oom:
  mdl_grammar_matcher_free(m);
  snprintf(err, errlen, "grammar matcher: out of memory");
  return -1;
}

void mdl_grammar_matcher_free(mdl_grammar_matcher *m) {
  if (!m) return;
  free(m->node);
  free(m->cur);
  free(m->buf);
  free(m->key);
  free(m);
}

// Frames only the current stacks use are kept once the frames made since the last time outgrow them: each accepted
// byte leaves a few dead frames behind. Copies the live chains into a fresh array, keeping shared frames shared.
static void compact(mdl_grammar_matcher *m) {
  if (m->n_node < 2 * m->live + 4096) return;
  uint32_t *map = calloc(m->n_node, sizeof *map); // old frame -> new frame (0: not copied yet)
  gnode *nn = malloc((size_t)m->cap_node * sizeof *nn);
  if (!map || !nn) {
    free(map);
    free(nn);
    return; // keep the old array: correct, just larger
  }
  uint32_t n = 1;
  nn[0] = (gnode){0, 0};
  for (int i = 0; i < m->n_cur; i++) {
    uint32_t t = m->cur[i];
    size_t depth = 0;
    for (uint32_t u = t; u && !map[u]; u = m->node[u].parent) { // the frames not copied yet, top down
      if (buf_reserve(m, depth + 1)) {
        free(map);
        free(nn);
        return;
      }
      m->buf[depth++] = u;
    }
    while (depth > 0) { // copied bottom up, so a parent's new index is known
      uint32_t u = m->buf[--depth], p = m->node[u].parent;
      nn[n] = (gnode){m->node[u].pos, p ? map[p] : 0};
      map[u] = n++;
    }
  }
  for (int i = 0; i < m->n_cur; i++) m->cur[i] = m->cur[i] ? map[m->cur[i]] : 0;
  free(map);
  free(m->node);
  m->node = nn;
  m->n_node = m->live = n;
}

// Advances by n bytes when commit, else only checks; -1 (state unchanged) when the grammar cannot take them.
static int take(mdl_grammar_matcher *m, const void *bytes, size_t n, int commit) {
  if (m->ended || m->dead) return n ? -1 : 0;
  const uint8_t *s = bytes;
  uint32_t saved = m->n_node;
  m->n_buf = 0;
  if (buf_reserve(m, (size_t)m->n_cur)) return -1;
  memcpy(m->buf, m->cur, (size_t)m->n_cur * sizeof *m->cur);
  m->n_buf = (size_t)m->n_cur;
  size_t in0 = 0;
  int n_in = m->n_cur;
  for (size_t i = 0; i < n; i++) {
    size_t out0 = m->n_buf;
    int k = advance(m, in0, n_in, s[i]);
    if (!k) {
      m->n_node = saved; // the frames made for this attempt are unused
      m->n_buf = 0;
      return -1;
    }
    in0 = out0;
    n_in = k;
  }
  if (!commit) {
    m->n_node = saved;
    m->n_buf = 0;
    return 0;
  }
  if (n_in > m->cap_cur) {
    uint32_t *c = realloc(m->cur, (size_t)n_in * sizeof *c);
    if (!c) {
      m->n_node = saved;
      m->n_buf = 0;
      m->oom = 1;
      return -1;
    }
    m->cur = c;
    m->cap_cur = n_in;
  }
  memcpy(m->cur, m->buf + in0, (size_t)n_in * sizeof *m->cur);
  m->n_cur = n_in;
  m->n_buf = 0;
  compact(m);
  return 0;
}

int mdl_grammar_matcher_accept_bytes(mdl_grammar_matcher *m, const void *bytes, size_t n) {
  return take(m, bytes, n, 1);
}

int mdl_grammar_matcher_can_take(mdl_grammar_matcher *m, const void *bytes, size_t n) {
  return take(m, bytes, n, 0) == 0;
}

int mdl_grammar_matcher_can_end(const mdl_grammar_matcher *m) {
  if (m->ended || m->dead) return 0;
  for (int i = 0; i < m->n_cur; i++)
    if (next_bytes(m, m->cur[i], NULL)) return 1;
  return 0;
}

int mdl_grammar_matcher_done(const mdl_grammar_matcher *m) {
  if (m->ended || m->dead || m->n_cur == 0) return 1;
  uint8_t next[32] = {0};
  for (int i = 0; i < m->n_cur; i++) next_bytes(m, m->cur[i], next);
  for (int w = 0; w < 32; w++)
    if (next[w]) return 0;
  return 1; // no byte can come: complete (a state holds only live stacks, so some stack can end)
}

int mdl_grammar_matcher_accept_token(mdl_grammar_matcher *m, int32_t t) {
  const mdl_grammar_vocab *v = m->v;
  if (!v || t < 0 || t >= v->n_vocab) {
    m->dead = 1;
    return -1;
  }
  if (mdl_grammar_vocab_is_eog(v, t)) {
    if (mdl_grammar_matcher_can_end(m)) {
      m->ended = 1;
      return 0;
    }
    m->dead = 1;
    return -1;
  }
  if (!v->piece_len[t] || mdl_grammar_matcher_accept_bytes(m, v->blob + v->piece_off[t], v->piece_len[t])) {
    m->dead = 1;
    return -1;
  }
  return 0;
}

int mdl_grammar_matches(const mdl_grammar *g, const void *s, size_t n) {
  mdl_grammar_matcher *m;
  char err[64];
  if (mdl_grammar_matcher_new(g, NULL, &m, err, sizeof err)) return 0;
  int ok = mdl_grammar_matcher_accept_bytes(m, s, n) == 0 && mdl_grammar_matcher_can_end(m);
  mdl_grammar_matcher_free(m);
  return ok;
}

// ---- masks ----

// Marks the tokens below trie node tn that the stacks buf[in0 .. in0 + n_in) can take, whole.
static void walk(mdl_grammar_matcher *m, uint32_t tn, size_t in0, int n_in, uint32_t *bits) {
  const mdl_grammar_vocab *v = m->v;
  uint8_t nb[32] = {0}; // the bytes some stack can take next: children outside it are skipped unexamined
  for (int i = 0; i < n_in; i++) next_bytes(m, m->buf[in0 + (size_t)i], nb);
  for (uint32_t c = tn + 1; c < v->end[tn]; c = v->end[c]) {
    uint8_t b = v->byte[c];
    if (!(nb[b >> 3] >> (b & 7) & 1)) continue;
    if (m->work > MDL_GRAMMAR_MASK_WORK) { // too ambiguous to follow at a bounded cost: stop here (too_costly)
      m->too_costly = 1;
      return;
    }
    uint32_t saved = m->n_node;
    size_t out0 = m->n_buf;
    int k = advance(m, in0, n_in, b);
    if (k > 0) {
      for (uint32_t i = v->tok_off[c]; i < v->tok_off[c + 1]; i++) bits[v->tok[i] >> 5] |= 1u << (v->tok[i] & 31);
      if (v->end[c] > c + 1 && !(k == 1 && m->buf[out0] == 0)) walk(m, c, out0, k, bits);
    }
    m->n_buf = out0;
    m->n_node = saved;
  }
}

// ---- the loop shortcut ----
// Inside a JSON string almost every token is allowed, and a walk would visit nearly the whole trie. But the state
// after a plain character is the same whatever the character: for the set B of such bytes, when every byte of B
// takes the current state S0 to one state S1 and S1 to itself, every token made only of B's bytes is allowed, and
// only the tokens with another byte need a walk, from the first such byte on (from S0 when it is the token's first
// byte, else from S1). The tokens in B+ and those first-outside nodes are computed once per (vocabulary, B) and kept
// in the grammar.

#define LOOP_MIN 16 // fewer loop bytes than this: a plain walk is as cheap

// 1 when the stacks buf[a .. a + k) and buf[b .. b + k) are the same, frame positions compared.
static int same_stacks(const mdl_grammar_matcher *m, size_t a, size_t b, int k) {
  for (int i = 0; i < k; i++) {
    uint32_t u = m->buf[a + (size_t)i], w = m->buf[b + (size_t)i];
    while (u && w && u != w) {
      if (m->node[u].pos != m->node[w].pos) return 0;
      u = m->node[u].parent;
      w = m->node[w].parent;
    }
    if (u != w) return 0;
  }
  return 1;
}

// With S0 = buf[0 .. n_cur): finds S1 and B (above) into set; S1 is left at buf[n_cur .. n_cur + *n1) (and the
// frames it needs kept). The size of B (0: no shortcut).
static int loop_bytes(mdl_grammar_matcher *m, uint8_t *set, int *n1) {
  uint8_t next[32] = {0};
  int n = 0, k1 = 0;
  size_t s1 = (size_t)m->n_cur;
  memset(set, 0, 32);
  for (int i = 0; i < m->n_cur; i++) next_bytes(m, m->buf[i], next);
  for (int b = 0; b < 256; b++) {
    if (!(next[b >> 3] >> (b & 7) & 1)) continue;
    uint32_t saved = m->n_node;
    size_t out0 = m->n_buf;
    int k = advance(m, 0, m->n_cur, (uint8_t)b), loop = 0;
    if (k > 0 && k1 == 0) { // the first candidate for S1: kept if b takes it to itself
      size_t out1 = m->n_buf;
      loop = advance(m, out0, k, (uint8_t)b) == k && same_stacks(m, out0, out1, k);
      m->n_buf = out1;
      if (loop) {
        k1 = k; // S1 stays in buf, its frames in the arena
        set[b >> 3] |= (uint8_t)(1u << (b & 7));
        n++;
        continue;
      }
    } else if (k > 0 && k == k1 && same_stacks(m, s1, out0, k)) {
      size_t out1 = m->n_buf;
      loop = advance(m, s1, k1, (uint8_t)b) == k1 && same_stacks(m, s1, out1, k1);
    }
    if (loop) {
      set[b >> 3] |= (uint8_t)(1u << (b & 7));
      n++;
    }
    m->n_buf = out0;
    m->n_node = saved;
  }
  *n1 = k1;
  return n;
}

static int loop_build(const mdl_grammar_vocab *v, const uint8_t *set, gr_loop_entry *e) {
  size_t W = ((size_t)v->n_vocab + 31) / 32, cap = 1024;
  uint32_t *stack = malloc((size_t)v->n_node * sizeof *stack), n = 0;
  e->bits = calloc(W, sizeof *e->bits);
  e->esc = malloc(cap * sizeof *e->esc);
  e->n_esc = 0;
  if (!stack || !e->bits || !e->esc) goto oom;
  stack[n++] = 0; // nodes whose path is in B*
  while (n) {
    uint32_t x = stack[--n];
    for (uint32_t c = x + 1; c < v->end[x]; c = v->end[c]) {
      uint8_t b = v->byte[c];
      if (set[b >> 3] >> (b & 7) & 1) {
        for (uint32_t i = v->tok_off[c]; i < v->tok_off[c + 1]; i++) e->bits[v->tok[i] >> 5] |= 1u << (v->tok[i] & 31);
        stack[n++] = c;
        continue;
      }
      if (e->n_esc + 2 > cap) {
        uint32_t *p = realloc(e->esc, cap * 2 * sizeof *p);
        if (!p) goto oom;
        e->esc = p;
        cap *= 2;
      }
      e->esc[e->n_esc++] = c;
      e->esc[e->n_esc++] = x;
    }
  }
  free(stack);
  return 0;
oom:
  free(stack);
  free(e->bits);
  free(e->esc);
  e->bits = e->esc = NULL;
  return -1;
}

// The entry for byte set `set` over v, from the grammar's cache or built now: kept there while there is room (then
// it lives as long as the grammar, so it is read without the lock), else built into *tmp for the caller to free.
// NULL when out of memory.
static const gr_loop_entry *loop_entry(mdl_grammar *g, const mdl_grammar_vocab *v, const uint8_t *set,
                                       gr_loop_entry *tmp) {
  const gr_loop_entry *found = NULL;
  pthread_mutex_lock(&g->mu);
  for (int i = 0; i < g->n_loop && !found; i++)
    if (g->loop[i].vocab_id == v->id && !memcmp(g->loop[i].set, set, 32)) found = &g->loop[i];
  pthread_mutex_unlock(&g->mu);
  if (found) return found;
  gr_loop_entry e = {.vocab_id = v->id};
  memcpy(e.set, set, 32);
  if (loop_build(v, set, &e)) return NULL;
  pthread_mutex_lock(&g->mu);
  for (int i = 0; i < g->n_loop && !found; i++) // another matcher may have built it meanwhile
    if (g->loop[i].vocab_id == v->id && !memcmp(g->loop[i].set, set, 32)) found = &g->loop[i];
  if (!found && g->n_loop < GR_LOOP_MAX) {
    g->loop[g->n_loop] = e;
    found = &g->loop[g->n_loop++];
    e.bits = e.esc = NULL;
  }
  pthread_mutex_unlock(&g->mu);
  if (found) {
    free(e.bits);
    free(e.esc);
    return found;
  }
  *tmp = e;
  return tmp;
}

// The mask from S0 = buf[0 .. n_cur) and S1 = buf[n_cur .. n_cur + n1) through a loop entry: its tokens, then
// walks from its nodes.
static void walk_escapes(mdl_grammar_matcher *m, const gr_loop_entry *e, int n1, uint32_t *bits) {
  const mdl_grammar_vocab *v = m->v;
  size_t W = ((size_t)v->n_vocab + 31) / 32;
  for (size_t i = 0; i < W; i++) bits[i] |= e->bits[i];
  for (uint32_t j = 0; j < e->n_esc; j += 2) {
    uint32_t c = e->esc[j], saved = m->n_node;
    size_t out0 = m->n_buf;
    int k = e->esc[j + 1] == 0 ? advance(m, 0, m->n_cur, v->byte[c]) : advance(m, (size_t)m->n_cur, n1, v->byte[c]);
    if (k > 0) {
      for (uint32_t i = v->tok_off[c]; i < v->tok_off[c + 1]; i++) bits[v->tok[i] >> 5] |= 1u << (v->tok[i] & 31);
      if (v->end[c] > c + 1 && !(k == 1 && m->buf[out0] == 0)) walk(m, c, out0, k, bits);
    }
    m->n_buf = out0;
    m->n_node = saved;
  }
}

// The state as a cache key: each stack's positions from the top down, each ended by ~0u. Its length, or 0.
static size_t state_key(mdl_grammar_matcher *m) {
  size_t n = 0;
  for (int i = 0; i < m->n_cur; i++) {
    for (uint32_t u = m->cur[i];; u = m->node[u].parent) {
      if (n + 2 > m->cap_key) {
        size_t cap = m->cap_key ? m->cap_key * 2 : 64;
        uint32_t *k = realloc(m->key, cap * sizeof *k);
        if (!k) return 0;
        m->key = k;
        m->cap_key = cap;
      }
      if (!u) break;
      m->key[n++] = m->node[u].pos;
    }
    m->key[n++] = ~0u;
  }
  return n;
}

static int cache_get(mdl_grammar *g, uint64_t vid, uint64_t h, const uint32_t *key, size_t n_key, uint32_t *bits,
                     size_t W) {
  int hit = 0;
  pthread_mutex_lock(&g->mu);
  for (int i = 0; i < g->n_cache; i++) {
    gr_mask_entry *e = &g->cache[i];
    if (e->hash == h && e->vocab_id == vid && e->n_key == n_key && e->n_words == W &&
        !memcmp(e->key, key, n_key * sizeof *key)) {
      memcpy(bits, e->bits, W * sizeof *bits);
      e->used = ++g->tick;
      hit = 1;
      break;
    }
  }
  pthread_mutex_unlock(&g->mu);
  return hit;
}

static void cache_put(mdl_grammar *g, uint64_t vid, uint64_t h, const uint32_t *key, size_t n_key,
                      const uint32_t *bits, size_t W) {
  uint32_t *k = malloc(n_key * sizeof *k), *b = malloc(W * sizeof *b);
  if (!k || !b) {
    free(k);
    free(b);
    return;
  }
  memcpy(k, key, n_key * sizeof *k);
  memcpy(b, bits, W * sizeof *b);
  size_t max = GR_CACHE_BYTES / (W * sizeof *bits);
  if (max < GR_CACHE_MIN) max = GR_CACHE_MIN;
  pthread_mutex_lock(&g->mu);
  gr_mask_entry *e = NULL;
  if ((size_t)g->n_cache < max) {
    if (!utl_vec_reserve((void **)&g->cache, &g->cap_cache, g->n_cache + 1, sizeof *g->cache))
      e = &g->cache[g->n_cache++];
  }
  if (!e && g->n_cache > 0) { // full: the least recently used entry makes room
    e = &g->cache[0];
    for (int i = 1; i < g->n_cache; i++)
      if (g->cache[i].used < e->used) e = &g->cache[i];
    free(e->key);
    free(e->bits);
  }
  if (e) {
    *e = (gr_mask_entry){vid, h, k, (uint32_t)n_key, b, (uint32_t)W, ++g->tick};
    k = NULL;
    b = NULL;
  }
  pthread_mutex_unlock(&g->mu);
  free(k);
  free(b);
}

static void set_eog(const mdl_grammar_vocab *v, uint32_t *bits) {
  for (int i = 0; i < v->n_eog; i++) bits[v->eog[i] >> 5] |= 1u << (v->eog[i] & 31);
}

int mdl_grammar_matcher_allows(mdl_grammar_matcher *m, int32_t t) {
  const mdl_grammar_vocab *v = m->v;
  if (!v || t < 0 || t >= v->n_vocab) return 0;
  if (mdl_grammar_vocab_is_eog(v, t)) return m->ended || m->dead || m->n_cur == 0 || mdl_grammar_matcher_can_end(m);
  if (m->ended || m->dead || !v->piece_len[t]) return 0;
  return take(m, v->blob + v->piece_off[t], v->piece_len[t], 0) == 0;
}

int mdl_grammar_matcher_mask_cached(mdl_grammar_matcher *m, uint32_t *bits) {
  const mdl_grammar_vocab *v = m->v;
  if (!v || m->ended || m->dead || m->n_cur == 0) return 0;
  size_t n_key = state_key(m);
  if (!n_key) return 0;
  uint64_t h = fnv(1469598103934665603ull, m->key, n_key * sizeof *m->key);
  return cache_get((mdl_grammar *)m->g, v->id, h, m->key, n_key, bits, ((size_t)v->n_vocab + 31) / 32);
}

void mdl_grammar_matcher_mask(mdl_grammar_matcher *m, uint32_t *bits) {
  const mdl_grammar_vocab *v = m->v;
  if (!v) return;
  size_t W = ((size_t)v->n_vocab + 31) / 32;
  memset(bits, 0, W * sizeof *bits);
  if (m->ended || m->dead || m->n_cur == 0) {
    set_eog(v, bits);
    return;
  }
  mdl_grammar *g = (mdl_grammar *)m->g; // only its locked cache changes
  size_t n_key = state_key(m);
  uint64_t h = n_key ? fnv(1469598103934665603ull, m->key, n_key * sizeof *m->key) : 0;
  if (n_key && cache_get(g, v->id, h, m->key, n_key, bits, W)) return;
  if (atomic_load(&g->too_costly)) m->too_costly = 1; // the n rows of one request (and its other users) pay once
  int oom = m->oom;
  m->oom = 0;
  m->n_buf = 0;
  m->work = 0;
  if (!m->too_costly && buf_reserve(m, (size_t)m->n_cur) == 0) {
    memcpy(m->buf, m->cur, (size_t)m->n_cur * sizeof *m->cur);
    m->n_buf = (size_t)m->n_cur;
    uint8_t loop[32];
    int n1 = 0;
    gr_loop_entry tmp = {0};
    uint32_t saved = m->n_node;
    const gr_loop_entry *e = loop_bytes(m, loop, &n1) >= LOOP_MIN ? loop_entry(g, v, loop, &tmp) : NULL;
    if (e) walk_escapes(m, e, n1, bits);
    else {
      m->n_buf = (size_t)m->n_cur;
      m->n_node = saved;
      walk(m, 0, 0, m->n_cur, bits);
    }
    m->n_node = saved;
    free(tmp.bits);
    free(tmp.esc);
  }
  m->n_buf = 0;
  if (m->too_costly) { // the walk was cut short: its mask is not the grammar's; the caller ends the request
    atomic_store(&g->too_costly, 1);
    memset(bits, 0, W * sizeof *bits);
    set_eog(v, bits);
    m->oom |= oom;
    return;
  }
  if (mdl_grammar_matcher_can_end(m)) set_eog(v, bits);
  int any = 0;
  for (size_t i = 0; i < W && !any; i++) any = bits[i] != 0;
  if (!any) set_eog(v, bits); // no token continues it: end rather than write something invalid
  else if (n_key && !m->oom) cache_put(g, v->id, h, m->key, n_key, bits, W); // a walk cut short is not cached
  m->oom |= oom;
}

int mdl_grammar_matcher_too_costly(const mdl_grammar_matcher *m) { return m && m->too_costly; }
