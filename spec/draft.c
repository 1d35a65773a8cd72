// spec/draft.c: proposing drafts: prompt lookup in the sequence itself and the suffix index over recent outputs.
#include "spec/spec.h"

#include <stdlib.h>

// The index: a ring of tokens (documents one after another, each followed by SEP) and a table of buckets from an
// n-gram's hash to where its recent occurrences ended. A bucket holds WAYS positions and a new one replaces the oldest
// (or one whose tokens the ring has since overwritten), so the table forgets the oldest first, as the ring does. Nothing
// in it is trusted unread: a lookup compares the n-gram against the ring itself before proposing.
#define SEP ((int32_t)-1)
#define WAYS 4

struct spc_index {
  spc_cfg cfg;
  int32_t *ring;  // (cap) the token at absolute position p is ring[p % cap]
  size_t cap;
  uint64_t head;  // absolute position of the next token written; the live range is [head - min(head, cap), head)
  uint32_t *slot; // (nbuckets * WAYS) the low 32 bits of 1 + the position following an occurrence; 0: empty
  size_t nbuckets;
  size_t bytes;   // all of the above, the struct included
};

static uint64_t ngram_hash(const int32_t *t, int n) {
  uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(n + 1);
  for (int i = 0; i < n; i++) {
    h = (h ^ (uint32_t)t[i]) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h;
}

int spc_index_new(const spc_cfg *c, spc_index **out, char *err, size_t errlen) {
  *out = NULL;
  if (spc_cfg_check(c, err, errlen) != 0)
    return -1;
  spc_index *ix = calloc(1, sizeof *ix);
  if (!ix) {
    utl_seterr(err, errlen, "spec index: out of memory");
    return -1;
  }
  ix->cfg = *c;
  ix->bytes = sizeof *ix;
  if (c->index_bytes > 0) {
    // Each token adds one key per n-gram length; twice as many table entries as a full ring's keys keep the table
    // from forgetting a live n-gram much before the ring does.
    size_t keys = (size_t)(c->ngram_max - c->ngram_min + 1), avail = c->index_bytes - sizeof *ix;
    ix->cap = avail / (sizeof(int32_t) + 2 * keys * sizeof(uint32_t));
    ix->nbuckets = ix->cap * keys * 2 / WAYS;
    if (ix->cap > UINT32_MAX / 2)
      ix->cap = UINT32_MAX / 2; // positions are compared in 32 bits
    ix->slot = calloc(ix->nbuckets * WAYS, sizeof(uint32_t));
    ix->ring = malloc(ix->cap * sizeof(int32_t));
    if (!ix->slot || !ix->ring) {
      spc_index_free(ix);
      utl_seterr(err, errlen, "spec index: out of memory for %zu bytes", c->index_bytes);
      return -1;
    }
    ix->bytes += ix->nbuckets * WAYS * sizeof(uint32_t) + ix->cap * sizeof(int32_t);
  }
  *out = ix;
  return 0;
}

void spc_index_free(spc_index *ix) {
  if (!ix)
    return;
  free(ix->slot);
  free(ix->ring);
  free(ix);
}

size_t spc_index_bytes(const spc_index *ix) { return ix->bytes; }
const spc_cfg *spc_index_cfg(const spc_index *ix) { return &ix->cfg; }

static int32_t at(const spc_index *ix, uint64_t p) { return ix->ring[p % ix->cap]; }
static uint64_t live_len(const spc_index *ix) { return ix->head < ix->cap ? ix->head : ix->cap; }

// How long ago (in tokens written) the entry v was, or UINT64_MAX for an empty entry. Entries keep 32 bits: one from
// 2^32 tokens ago may read as recent, which the ring comparison in find() then catches.
static uint64_t age(const spc_index *ix, uint32_t v) {
  if (v == 0)
    return UINT64_MAX;
  return (uint32_t)((uint32_t)ix->head - (v - 1));
}

void spc_index_add(spc_index *ix, const int32_t *toks, int n) {
  if (!ix || !toks || n <= 0 || ix->cap < 2)
    return;
  // A document longer than the ring keeps its last tokens (and room for its SEP).
  if ((size_t)n > ix->cap - 1) {
    toks += (size_t)n - (ix->cap - 1);
    n = (int)(ix->cap - 1);
  }
  const int lo = ix->cfg.ngram_min, hi = ix->cfg.ngram_max;
  int run = 0; // tokens >= 0 in a row just before i
  for (int i = 0; i < n; i++) {
    int32_t t = toks[i] < 0 ? SEP : toks[i];
    if (t != SEP) {
      // The n-grams ending just before i, each a key for "i follows it": into the bucket's oldest entry.
      for (int len = lo; len <= hi && len <= run; len++) {
        uint32_t *b = ix->slot + ngram_hash(toks + i - len, len) % ix->nbuckets * WAYS;
        int victim = 0;
        for (int w = 1; w < WAYS; w++)
          if (age(ix, b[w]) > age(ix, b[victim]))
            victim = w;
        b[victim] = (uint32_t)(ix->head + 1);
      }
    }
    ix->ring[ix->head % ix->cap] = t;
    ix->head++;
    run = t == SEP ? 0 : run + 1;
  }
  ix->ring[ix->head % ix->cap] = SEP;
  ix->head++;
}

// The index's most recent occurrence of the last len tokens of toks: the position following it, or UINT64_MAX.
static uint64_t index_find(const spc_index *ix, const int32_t *toks, int n, int len) {
  const int32_t *g = toks + n - len;
  const uint32_t *b = ix->slot + ngram_hash(g, len) % ix->nbuckets * WAYS;
  uint64_t best = UINT64_MAX, best_age = UINT64_MAX;
  for (int w = 0; w < WAYS; w++) {
    uint64_t a = age(ix, b[w]);
    // live: the n-gram and the token after it are still in the ring
    if (a == UINT64_MAX || a < 1 || a + (uint64_t)len > live_len(ix) || a >= best_age)
      continue;
    uint64_t p = ix->head - a;
    if (at(ix, p) == SEP)
      continue;
    int i = 0;
    while (i < len && at(ix, p - (uint64_t)len + (uint64_t)i) == g[i])
      i++;
    if (i == len) {
      best = p;
      best_age = a;
    }
  }
  return best;
}

int spc_propose(const spc_index *ix, const int32_t *toks, int n, int k, int32_t *draft) {
  if (k <= 0 || n < 1 || !toks || !draft)
    return 0;
  const spc_cfg *c = ix ? &ix->cfg : NULL;
  const int lo = c ? c->ngram_min : SPC_DEF_NGRAM_MIN, hi = c ? c->ngram_max : SPC_DEF_NGRAM_MAX;
  const int32_t last = toks[n - 1];
  if (last < 0)
    return 0;

  // Prompt lookup, one scan from the end: at each earlier j holding the last token, how far the match reaches
  // backwards (up to hi). The longest wins, the most recent among equals; hi ends the scan at once.
  int best = 0, best_end = -1;
  for (int j = n - 2; j >= 0; j--) {
    if (toks[j] != last)
      continue;
    int len = 1;
    while (len < hi && j - len >= 0 && toks[j - len] == toks[n - 1 - len] && toks[j - len] >= 0)
      len++;
    if (len > best) {
      best = len;
      best_end = j;
      if (len == hi)
        break;
    }
  }
  if (best < lo)
    best = 0;

  // The suffix index, longest first; only a longer match than the prompt's replaces it. An n-gram with a boundary
  // (a negative id) in it matches nothing.
  if (ix && ix->cap > 0) {
    int top = 0;
    while (top < hi && top < n && toks[n - 1 - top] >= 0)
      top++;
    for (int len = top; len >= lo && len > best; len--) {
      uint64_t p = index_find(ix, toks, n, len);
      if (p != UINT64_MAX) {
        int m = 0;
        for (; m < k && p < ix->head && at(ix, p) != SEP; p++)
          draft[m++] = at(ix, p);
        return m;
      }
    }
  }
  if (best == 0)
    return 0;
  int m = 0;
  for (int i = best_end + 1; i < n && m < k; i++)
    draft[m++] = toks[i];
  return m;
}
