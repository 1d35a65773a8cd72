// spec/draft.c: proposing drafts: prompt lookup in the sequence itself and the suffix index over recent outputs.
#include "spec/spec.h"

#include <stdlib.h>

// The index: a ring of tokens (documents one after another, each followed by SEP) and a direct-mapped table from an
// n-gram's hash to the ring position just after its most recent occurrence. A slot is overwritten by the next n-gram
// that hashes to it, and a ring position by the next token a lap later: both forget the oldest first, and nothing is
// ever trusted unread: a lookup compares the n-gram against the ring itself before proposing.
#define SEP ((int32_t)-1)

struct spc_index {
  spc_cfg cfg;
  int32_t *ring;  // (cap) token at absolute position p is ring[p % cap]
  size_t cap;
  uint64_t head;  // absolute position of the next token written; the live range is [head - min(head, cap), head)
  uint64_t *slot; // (nslots) 1 + the absolute position following an n-gram's most recent occurrence; 0: empty
  size_t nslots;
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
    // Three quarters for the table: every token adds ngram_max - ngram_min + 1 keys, so slots run out before tokens.
    size_t avail = c->index_bytes - sizeof *ix;
    ix->nslots = avail / 4 * 3 / sizeof(uint64_t);
    ix->cap = (avail - ix->nslots * sizeof(uint64_t)) / sizeof(int32_t);
    ix->slot = calloc(ix->nslots, sizeof(uint64_t));
    ix->ring = malloc(ix->cap * sizeof(int32_t));
    if (!ix->slot || !ix->ring) {
      spc_index_free(ix);
      utl_seterr(err, errlen, "spec index: out of memory for %zu bytes", c->index_bytes);
      return -1;
    }
    ix->bytes += ix->nslots * sizeof(uint64_t) + ix->cap * sizeof(int32_t);
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

static uint64_t live_start(const spc_index *ix) { return ix->head > ix->cap ? ix->head - ix->cap : 0; }
static int32_t at(const spc_index *ix, uint64_t p) { return ix->ring[p % ix->cap]; }

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
      // The n-grams ending just before i, each a key for "i follows it" (the most recent write wins).
      for (int len = lo; len <= hi && len <= run; len++)
        ix->slot[ngram_hash(toks + i - len, len) % ix->nslots] = ix->head + 1;
    }
    ix->ring[ix->head % ix->cap] = t;
    ix->head++;
    run = t == SEP ? 0 : run + 1;
  }
  ix->ring[ix->head % ix->cap] = SEP;
  ix->head++;
}

// The index's most recent occurrence of the last len tokens of toks: the position following it, or 0 (none, or the
// slot holds another n-gram or one overwritten since).
static uint64_t index_find(const spc_index *ix, const int32_t *toks, int n, int len) {
  const int32_t *g = toks + n - len;
  uint64_t v = ix->slot[ngram_hash(g, len) % ix->nslots];
  if (v == 0)
    return 0;
  uint64_t p = v - 1;
  if (p >= ix->head || p < live_start(ix) + (uint64_t)len || at(ix, p) == SEP)
    return 0;
  for (int i = 0; i < len; i++)
    if (at(ix, p - (uint64_t)len + (uint64_t)i) != g[i])
      return 0;
  return p;
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
      if (p) {
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
