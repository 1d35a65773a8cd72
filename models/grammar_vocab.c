// models/grammar_vocab.c: the trie of a vocabulary's token bytes that grammar masks walk, and its end-of-generation
// tokens.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/grammar_int.h"

typedef struct vitem {
  const uint8_t *p;
  uint32_t len;
  int32_t id;
} vitem;

static int vitem_cmp(const void *a, const void *b) {
  const vitem *x = a, *y = b;
  uint32_t n = x->len < y->len ? x->len : y->len;
  int c = n ? memcmp(x->p, y->p, n) : 0;
  if (c) return c;
  if (x->len != y->len) return x->len < y->len ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *s = p;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

void mdl_grammar_vocab_free(mdl_grammar_vocab *v) {
  if (!v) return;
  free(v->blob);
  free(v->piece_off);
  free(v->piece_len);
  free(v->byte);
  free(v->end);
  free(v->tok_off);
  free(v->tok);
  free(v->eog);
  free(v->eog_bits);
  free(v);
}

int mdl_grammar_vocab_new(int n_vocab, const char *const *piece, const size_t *len, const int32_t *eog, int n_eog,
                          mdl_grammar_vocab **out, char *err, size_t errlen) {
  *out = NULL;
  if (n_vocab < 1 || n_eog < 0) {
    snprintf(err, errlen, "grammar vocabulary: %d tokens", n_vocab);
    return -1;
  }
  size_t total = 0, n_text = 0, max_len = 0;
  for (int i = 0; i < n_vocab; i++)
    if (piece[i] && len[i]) {
      if (len[i] > UINT32_MAX / 2) {
        snprintf(err, errlen, "grammar vocabulary: token %d is too long", i);
        return -1;
      }
      total += len[i];
      n_text++;
      if (len[i] > max_len) max_len = len[i];
    }
  mdl_grammar_vocab *v = calloc(1, sizeof *v);
  vitem *it = malloc((n_text + 1) * sizeof *it);
  uint32_t *path = malloc((max_len + 2) * sizeof *path), *cnt = NULL;
  if (!v || !it || !path) goto oom;
  size_t W = ((size_t)n_vocab + 31) / 32;
  v->n_vocab = n_vocab;
  v->blob = malloc(total + 1);
  v->piece_off = calloc((size_t)n_vocab, sizeof *v->piece_off);
  v->piece_len = calloc((size_t)n_vocab, sizeof *v->piece_len);
  v->byte = malloc(total + 1);
  v->end = malloc((total + 1) * sizeof *v->end);
  cnt = calloc(total + 2, sizeof *cnt);
  v->tok_off = malloc((total + 2) * sizeof *v->tok_off);
  v->tok = malloc((n_text + 1) * sizeof *v->tok);
  v->eog = malloc(((size_t)n_eog + 1) * sizeof *v->eog);
  v->eog_bits = calloc(W, sizeof *v->eog_bits);
  if (!v->blob || !v->piece_off || !v->piece_len || !v->byte || !v->end || !cnt || !v->tok_off || !v->tok || !v->eog ||
      !v->eog_bits)
    goto oom;
  uint64_t h = fnv(1469598103934665603ull, &n_vocab, sizeof n_vocab);
  size_t off = 0, k = 0;
  for (int i = 0; i < n_vocab; i++) {
    if (!piece[i] || !len[i]) continue;
    memcpy(v->blob + off, piece[i], len[i]);
    v->piece_off[i] = (uint32_t)off;
    v->piece_len[i] = (uint32_t)len[i];
    it[k++] = (vitem){(const uint8_t *)v->blob + off, (uint32_t)len[i], i};
    h = fnv(fnv(h, &i, sizeof i), piece[i], len[i]);
    off += len[i];
  }
  for (int i = 0; i < n_eog; i++) {
    if (eog[i] < 0 || eog[i] >= n_vocab) continue;
    v->eog[v->n_eog++] = eog[i];
    v->eog_bits[eog[i] >> 5] |= 1u << (eog[i] & 31);
    h = fnv(h ^ 0xe0e0, &eog[i], sizeof eog[i]);
  }
  v->id = h;
  qsort(it, n_text, sizeof *it, vitem_cmp);
  // Preorder trie from the sorted strings: a string shares its prefix with the one before; the nodes past that
  // prefix are new, and the deeper nodes of the one before are closed (their subtree ends here).
  uint32_t n = 1, depth = 0;
  v->byte[0] = 0;
  path[0] = 0;
  for (size_t i = 0; i < n_text; i++) {
    uint32_t lcp = 0;
    if (i > 0) {
      uint32_t m = it[i - 1].len < it[i].len ? it[i - 1].len : it[i].len;
      while (lcp < m && it[i - 1].p[lcp] == it[i].p[lcp]) lcp++;
    }
    for (uint32_t d = depth; d > lcp; d--) v->end[path[d]] = n;
    for (uint32_t d = lcp; d < it[i].len; d++) {
      v->byte[n] = it[i].p[d];
      path[d + 1] = n++;
    }
    depth = it[i].len;
    cnt[path[depth]]++;
    v->tok[i] = it[i].id; // sorted order visits the nodes in preorder: tokens line up with their nodes
  }
  for (uint32_t d = depth; d > 0; d--) v->end[path[d]] = n;
  v->end[0] = n;
  v->n_node = n;
  v->tok_off[0] = 0;
  for (uint32_t i = 0; i < n; i++) v->tok_off[i + 1] = v->tok_off[i] + cnt[i];
  free(it);
  free(path);
  free(cnt);
  *out = v;
  return 0;
oom:
  free(it);
  free(path);
  free(cnt);
  mdl_grammar_vocab_free(v);
  snprintf(err, errlen, "grammar vocabulary: out of memory");
  return -1;
}

int mdl_grammar_vocab_from_tok(const mdl_tok *t, mdl_grammar_vocab **out, char *err, size_t errlen) {
  int V = mdl_tok_n_vocab(t), n_eog = 0, rc = -1;
  size_t total = 0;
  for (int i = 0; i < V; i++) total += mdl_tok_piece(t, i, NULL, 0);
  char *blob = malloc(total + 1);
  const char **piece = calloc((size_t)V, sizeof *piece);
  size_t *len = calloc((size_t)V, sizeof *len);
  int32_t *eog = malloc((size_t)V * sizeof *eog);
  if (!blob || !piece || !len || !eog) {
    snprintf(err, errlen, "grammar vocabulary: out of memory");
    goto done;
  }
  size_t off = 0;
  for (int i = 0; i < V; i++) {
    if (mdl_tok_is_eog(t, i)) eog[n_eog++] = i;
    int ty = mdl_tok_type(t, i);
    if (ty != MDL_TOK_NORMAL && ty != MDL_TOK_BYTE && ty != MDL_TOK_USER) continue;
    size_t n = mdl_tok_piece(t, i, blob + off, total - off);
    piece[i] = blob + off;
    len[i] = n;
    off += n;
  }
  rc = mdl_grammar_vocab_new(V, piece, len, eog, n_eog, out, err, errlen);
done:
  free(blob);
  free(piece);
  free(len);
  free(eog);
  return rc;
}

int mdl_grammar_vocab_n(const mdl_grammar_vocab *v) { return v->n_vocab; }

int mdl_grammar_vocab_is_eog(const mdl_grammar_vocab *v, int32_t t) {
  return t >= 0 && t < v->n_vocab && (v->eog_bits[t >> 5] >> (t & 31) & 1);
}
