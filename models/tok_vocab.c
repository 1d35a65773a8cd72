// models/tok_vocab.c: the tokenizer's lowest floor: UTF-8 code points, Unicode classes, and the hash maps from a
// piece's text to its id and from a pair of ids to its merge (tokenizer.c, tok_spm.c and tok_decode.c call down here).
#include <stdlib.h>
#include <string.h>

#include "models/tok_int.h"
#include "models/tok_unicode.h"

// ---- Unicode helpers ----

static int in_ranges(const mdl_tok_range *r, size_t n, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < r[mid].lo) hi = mid;
    else if (cp > r[mid].hi) lo = mid + 1;
    else return 1;
  }
  return 0;
}

int mdl_tok_is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return in_ranges(mdl_tok_letters, mdl_tok_letters_n, cp);
}

int mdl_tok_is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(mdl_tok_numbers, mdl_tok_numbers_n, cp);
}

int mdl_tok_is_space(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Decodes one code point at s[*i] the way llama.cpp does (lenient: overlong forms and surrogates pass); a byte that
// does not start a decodable sequence becomes U+FFFD and is consumed alone.
uint32_t mdl_tok_cp_next(const uint8_t *s, size_t n, size_t *i) {
  size_t o = *i;
  uint8_t b = s[o];
  if (b < 0x80) {
    *i = o + 1;
    return b;
  }
  if ((b & 0x40) == 0) goto bad;
  if ((b & 0x20) == 0) {
    if (o + 1 >= n || (s[o + 1] & 0xC0) != 0x80) goto bad;
    *i = o + 2;
    return ((uint32_t)(b & 0x1F) << 6) | (s[o + 1] & 0x3F);
  }
  if ((b & 0x10) == 0) {
    if (o + 2 >= n || (s[o + 1] & 0xC0) != 0x80 || (s[o + 2] & 0xC0) != 0x80) goto bad;
    *i = o + 3;
    return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[o + 1] & 0x3F) << 6) | (s[o + 2] & 0x3F);
  }
  if ((b & 0x08) == 0) {
    if (o + 3 >= n || (s[o + 1] & 0xC0) != 0x80 || (s[o + 2] & 0xC0) != 0x80 || (s[o + 3] & 0xC0) != 0x80) goto bad;
    uint32_t cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[o + 1] & 0x3F) << 12) | ((uint32_t)(s[o + 2] & 0x3F) << 6) |
                  (s[o + 3] & 0x3F);
    if (cp > 0x10FFFF) goto bad;
    *i = o + 4;
    return cp;
  }
bad:
  *i = o + 1;
  return 0xFFFD;
}

size_t mdl_tok_cp_put(uint8_t *out, uint32_t cp) {
  if (cp < 0x80) {
    out[0] = (uint8_t)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (uint8_t)(0xC0 | (cp >> 6));
    out[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (uint8_t)(0xE0 | (cp >> 12));
    out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (uint8_t)(0xF0 | (cp >> 18));
  out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

// ---- hashing ----

static uint64_t hash_bytes(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (uint8_t)p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

int32_t mdl_tok_find_n(const mdl_tok *t, const char *p, size_t n) {
  size_t m = t->hcap - 1;
  for (size_t h = (size_t)hash_bytes(p, n) & m;; h = (h + 1) & m) {
    int32_t id = t->hmap[h];
    if (id < 0) return -1;
    if (t->text_len[id] == n && memcmp(t->text + t->text_off[id], p, n) == 0) return id;
  }
}

void mdl_tok_hmap_put(mdl_tok *t, int32_t id) {
  const char *p = t->text + t->text_off[id];
  size_t n = t->text_len[id], m = t->hcap - 1;
  for (size_t h = (size_t)hash_bytes(p, n) & m;; h = (h + 1) & m) {
    int32_t o = t->hmap[h];
    if (o < 0 || (t->text_len[o] == n && memcmp(t->text + t->text_off[o], p, n) == 0)) {
      t->hmap[h] = id; // a later duplicate wins, as in llama.cpp
      return;
    }
  }
}

const mrg_slot *mdl_tok_mrg_find(const mdl_tok *t, int32_t l, int32_t r) {
  if (t->mcap == 0) return NULL;
  uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
  size_t m = t->mcap - 1;
  for (size_t h = (size_t)hash_u64(key) & m;; h = (h + 1) & m) {
    if (t->mmap[h].key == MRG_EMPTY) return NULL;
    if (t->mmap[h].key == key) return &t->mmap[h];
  }
}

void mdl_tok_mrg_put(mdl_tok *t, int32_t l, int32_t r, int32_t rank, int32_t merged) {
  uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
  size_t m = t->mcap - 1;
  for (size_t h = (size_t)hash_u64(key) & m;; h = (h + 1) & m) {
    if (t->mmap[h].key == key) return; // the first (lowest) rank of a repeated pair stands
    if (t->mmap[h].key == MRG_EMPTY) {
      t->mmap[h].key = key;
      t->mmap[h].rank = rank;
      t->mmap[h].merged = merged;
      return;
    }
  }
}

size_t mdl_tok_pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}
