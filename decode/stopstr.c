// decode/stopstr.c: finds the first stop string in the generated text and holds back possible prefixes of one.
#include "decode/stopstr.h"

#include <stdlib.h>
#include <string.h>

int dec_stopstr_init(dec_stopstr *s, const char *const *stops, int n) {
  memset(s, 0, sizeof *s);
  if (n <= 0) return 0;
  s->stops = calloc((size_t)n, sizeof *s->stops);
  s->lens = calloc((size_t)n, sizeof *s->lens);
  if (!s->stops || !s->lens) goto oom;
  for (int i = 0; i < n; i++) {
    s->stops[i] = strdup(stops[i]);
    if (!s->stops[i]) goto oom;
    s->lens[i] = strlen(stops[i]);
    if (s->lens[i] > s->max_len) s->max_len = s->lens[i];
    s->n = i + 1;
  }
  return 0;
oom:
  dec_stopstr_free(s);
  return -1;
}

void dec_stopstr_free(dec_stopstr *s) {
  for (int i = 0; i < s->n; i++) free(s->stops[i]);
  free(s->stops);
  free(s->lens);
  free(s->held);
  memset(s, 0, sizeof *s);
}

static char *dup_bytes(const char *p, size_t n) {
  char *o = malloc(n + 1);
  if (o) {
    memcpy(o, p, n);
    o[n] = 0;
  }
  return o;
}

// Length of the longest suffix of held that is a proper prefix of some stop string.
static size_t partial_suffix(const dec_stopstr *s) {
  size_t best = 0;
  for (int i = 0; i < s->n; i++) {
    size_t maxk = s->lens[i] - 1 < s->n_held ? s->lens[i] - 1 : s->n_held;
    for (size_t k = maxk; k > best; k--)
      if (!memcmp(s->held + s->n_held - k, s->stops[i], k)) {
        best = k;
        break;
      }
  }
  return best;
}

int dec_stopstr_push(dec_stopstr *s, const char *text, size_t len, char **out, size_t *out_len) {
  if (s->n == 0) { // nothing to match: everything passes through
    *out = dup_bytes(text, len);
    *out_len = *out ? len : 0;
    return 0;
  }
  if (s->n_held + len + 1 > s->cap) {
    size_t cap = (s->n_held + len + 1) * 2;
    char *nh = realloc(s->held, cap);
    if (!nh) {
      *out = NULL;
      *out_len = 0;
      return 0;
    }
    s->held = nh;
    s->cap = cap;
  }
  memcpy(s->held + s->n_held, text, len);
  s->n_held += len;
  // The earliest stop occurrence wins; only the new text and the held-back tail can contain a new one.
  size_t first = (size_t)-1;
  for (int i = 0; i < s->n; i++) {
    if (s->lens[i] > s->n_held) continue;
    void *hit = memmem(s->held, s->n_held, s->stops[i], s->lens[i]);
    if (hit && (size_t)((char *)hit - s->held) < first) first = (size_t)((char *)hit - s->held);
  }
  if (first != (size_t)-1) {
    *out = dup_bytes(s->held, first);
    *out_len = *out ? first : 0;
    s->n_held = 0;
    return 1;
  }
  // Hold back a tail that could still grow into a stop string; never split a UTF-8 character.
  size_t keep = partial_suffix(s), send = s->n_held - keep;
  while (send > 0 && send < s->n_held && ((unsigned char)s->held[send] & 0xc0) == 0x80) send--;
  *out = dup_bytes(s->held, send);
  *out_len = *out ? send : 0;
  memmove(s->held, s->held + send, s->n_held - send);
  s->n_held -= send;
  return 0;
}

void dec_stopstr_flush(dec_stopstr *s, char **out, size_t *out_len) {
  *out = dup_bytes(s->held ? s->held : "", s->n_held);
  *out_len = *out ? s->n_held : 0;
  s->n_held = 0;
}
