// models/tok_decode.c: token ids back to text, whole (mdl_tok_decode) or streamed without splitting a UTF-8
// character (mdl_detok).
#include <stdlib.h>
#include <string.h>

#include "models/tok_int.h"
#include "util/err.h"

int mdl_tok_decode(const mdl_tok *t, const int32_t *ids, size_t n, char **text, size_t *len, char *err, size_t errlen) {
  *text = NULL;
  *len = 0;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->n_vocab) {
      utl_seterr(err, errlen, "token id %d at position %zu is out of range (vocabulary of %d)", ids[i], i, t->n_vocab);
      return -1;
    }
    total += t->piece_len[ids[i]];
  }
  char *out = malloc(total + 1);
  if (!out) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(out + o, t->piece + t->piece_off[ids[i]], t->piece_len[ids[i]]);
    o += t->piece_len[ids[i]];
  }
  out[o] = 0;
  *text = out;
  *len = o;
  return 0;
}

#define DETOK_OUT (3 * (MDL_TOK_MAX_PIECE + 4)) // worst case of one push: every byte invalid, tripled

struct mdl_detok {
  const mdl_tok *t; // (borrowed)
  uint8_t pend[4];  // bytes of an incomplete character held back
  int n_pend;
  char out[DETOK_OUT];
};

int mdl_detok_new(const mdl_tok *t, mdl_detok **out, char *err, size_t errlen) {
  *out = calloc(1, sizeof **out);
  if (!*out) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  (*out)->t = t;
  return 0;
}

void mdl_detok_free(mdl_detok *d) { free(d); }

static void put(char *out, size_t cap, size_t *w, const void *p, size_t n) {
  size_t room = *w < cap ? cap - *w : 0;
  if (n > room) n = room;
  if (n) memcpy(out + *w, p, n);
  *w += n;
}

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

// Emits complete, strictly valid UTF-8 from b (n); U+FFFD for each maximal invalid subpart; an incomplete valid
// prefix at the very end goes back into d->pend.
static size_t utf8_emit(mdl_detok *d, const uint8_t *b, size_t n, char *out, size_t cap) {
  size_t w = 0, i = 0;
  d->n_pend = 0;
  while (i < n) {
    uint8_t c = b[i];
    if (c < 0x80) {
      size_t j = i;
      while (j < n && b[j] < 0x80) j++;
      put(out, cap, &w, b + i, j - i);
      i = j;
      continue;
    }
    int len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEF) { len = 3; if (c == 0xED) hi = 0x9F; }
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else {
      put(out, cap, &w, REPL, 3);
      i++;
      continue;
    }
    int k = 1;
    for (; k < len; k++) {
      if (i + (size_t)k >= n) break;
      uint8_t x = b[i + (size_t)k];
      uint8_t l2 = k == 1 ? lo : 0x80, h2 = k == 1 ? hi : 0xBF;
      if (x < l2 || x > h2) break;
    }
    if (k == len) {
      put(out, cap, &w, b + i, (size_t)len);
      i += (size_t)len;
    } else if (i + (size_t)k >= n) { // valid so far, ran out of bytes: hold back
      memcpy(d->pend, b + i, n - i);
      d->n_pend = (int)(n - i);
      i = n;
    } else {
      put(out, cap, &w, REPL, 3);
      i += (size_t)k;
    }
  }
  return w < cap ? w : cap;
}

int mdl_detok_push(mdl_detok *d, int32_t id, const char **text, size_t *len) {
  const mdl_tok *t = d->t;
  *text = d->out;
  *len = 0;
  if (id < 0 || id >= t->n_vocab) return -1;
  size_t pl = t->piece_len[id];
  uint8_t buf[4 + MDL_TOK_MAX_PIECE];
  size_t n = (size_t)d->n_pend;
  memcpy(buf, d->pend, n);
  memcpy(buf + n, t->piece + t->piece_off[id], pl);
  *len = utf8_emit(d, buf, n + pl, d->out, sizeof d->out);
  return 0;
}

void mdl_detok_flush(mdl_detok *d, const char **text, size_t *len) {
  size_t w = 0;
  if (d->n_pend > 0) put(d->out, sizeof d->out, &w, REPL, 3);
  d->n_pend = 0;
  *text = d->out;
  *len = w;
}
