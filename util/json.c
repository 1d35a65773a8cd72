// util/json.c: the one pre-pass over raw JSON text (util/json.h): duplicate keys, depth, lone surrogates, NULs and
// malformed numbers, each with its path and byte offset.
#include "util/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

typedef struct jframe {
  int is_obj, expect_key, index;
  const char *key; // (borrowed: the text) the current key's raw text, klen bytes
  size_t klen;
  uint32_t id;     // this object's number, which the key set is keyed by (objects only)
} jframe;

// One key seen: its object, its hash and its decoded bytes in the arena.
typedef struct jkey {
  uint32_t obj; // 0: an empty slot
  uint32_t hash;
  size_t off, len;
} jkey;

typedef struct jscan {
  const char *text;
  size_t len;
  jframe *f; // (owned) max_depth frames
  int depth;
  jkey *keys; // (owned) (cap) an open-addressed set of every object's keys, cap a power of two
  size_t n_keys, cap;
  utl_buf arena; // the decoded keys
  utl_json_issue *out;
} jscan;

const char *utl_json_problem_name(utl_json_problem p) {
  switch (p) {
  case UTL_JSON_DUP_KEY: return "a duplicate key";
  case UTL_JSON_TOO_DEEP: return "nesting too deep";
  case UTL_JSON_SURROGATE: return "a lone UTF-16 surrogate";
  case UTL_JSON_NUL: return "a NUL character";
  case UTL_JSON_BAD_NUMBER: return "a malformed number";
  default: return "no problem";
  }
}

static void path_of(const jscan *s, char *out, size_t cap) {
  size_t w = 0;
  out[0] = 0;
  for (int i = 0; i < s->depth && w < cap; i++) {
    const jframe *f = &s->f[i];
    int n = f->is_obj ? snprintf(out + w, cap - w, "%s%.*s", w ? "." : "", (int)f->klen, f->key)
                      : snprintf(out + w, cap - w, "[%d]", f->index);
    if (n < 0) break;
    w += (size_t)n;
  }
}

static int report(jscan *s, utl_json_problem what, size_t at) {
  s->out->what = what;
  s->out->at = at;
  path_of(s, s->out->path, sizeof s->out->path);
  return 1;
}

static int hexval(const char *p, unsigned *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
               : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
    if (d > 15) return 0;
    *v = *v * 16 + d;
  }
  return 1;
}

// The string whose opening quote is at i: its end (the closing quote, or len when unclosed) in *end; a lone
// surrogate escape or a NUL (raw or \u0000) is reported (1). dec, when given, gets the decoded bytes: escapes as
// the characters they stand for (UTF-8), so two spellings of one key decode the same.
static int scan_string(jscan *s, size_t i, size_t *end, utl_buf *dec) {
  const char *p = s->text;
  size_t n = s->len, j = i + 1;
  for (; j < n && p[j] != '"'; j++) {
    if (p[j] == 0) return report(s, UTL_JSON_NUL, j);
    if (p[j] != '\\') {
      if (dec) utl_buf_add(dec, p + j, 1);
      continue;
    }
    if (j + 1 >= n) break;
    char c = p[++j];
    if (c != 'u') {
      static const char from[] = "bfnrt", to[] = "\b\f\n\r\t";
      const char *k = strchr(from, c);
      char d = k && c ? to[k - from] : c;
      if (dec) utl_buf_add(dec, &d, 1);
      continue;
    }
    unsigned u, lo;
    if (j + 4 >= n || !hexval(p + j + 1, &u)) continue; // the parser refuses a short \u escape
    size_t at = j - 1;
    j += 4;
    if (u == 0) return report(s, UTL_JSON_NUL, at);
    if (u >= 0xDC00 && u <= 0xDFFF) return report(s, UTL_JSON_SURROGATE, at);
    if (u >= 0xD800 && u <= 0xDBFF) {
      if (j + 6 >= n || p[j + 1] != '\\' || p[j + 2] != 'u' || !hexval(p + j + 3, &lo) || lo < 0xDC00 || lo > 0xDFFF)
        return report(s, UTL_JSON_SURROGATE, at);
      u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
      j += 6;
    }
    if (dec) {
      char b[4];
      size_t k = 0;
      if (u < 0x80) b[k++] = (char)u;
      else if (u < 0x800) b[k++] = (char)(0xC0 | (u >> 6)), b[k++] = (char)(0x80 | (u & 0x3F));
      else if (u < 0x10000)
        b[k++] = (char)(0xE0 | (u >> 12)), b[k++] = (char)(0x80 | ((u >> 6) & 0x3F)), b[k++] = (char)(0x80 | (u & 0x3F));
      else
        b[k++] = (char)(0xF0 | (u >> 18)), b[k++] = (char)(0x80 | ((u >> 12) & 0x3F)),
        b[k++] = (char)(0x80 | ((u >> 6) & 0x3F)), b[k++] = (char)(0x80 | (u & 0x3F));
      utl_buf_add(dec, b, k);
    }
  }
  *end = j;
  return 0;
}

static uint32_t hash_of(uint32_t obj, const char *p, size_t n) {
  uint32_t h = 2166136261u ^ obj; // FNV-1a
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 16777619u;
  return h;
}

static int keys_grow(jscan *s) {
  size_t cap = s->cap ? s->cap * 2 : 64;
  jkey *k = calloc(cap, sizeof *k);
  if (!k) return -1;
  for (size_t i = 0; i < s->cap; i++) {
    if (!s->keys[i].obj) continue;
    size_t at = s->keys[i].hash & (cap - 1);
    while (k[at].obj) at = (at + 1) & (cap - 1);
    k[at] = s->keys[i];
  }
  free(s->keys);
  s->keys = k;
  s->cap = cap;
  return 0;
}

// Adds the decoded key (the arena's last len bytes) to object obj's set: 1 when it was there already.
static int key_add(jscan *s, uint32_t obj, size_t off, size_t len) {
  if ((s->n_keys + 1) * 2 > s->cap && keys_grow(s) < 0) return -1;
  uint32_t h = hash_of(obj, len ? s->arena.p + off : "", len);
  size_t at = h & (s->cap - 1);
  for (; s->keys[at].obj; at = (at + 1) & (s->cap - 1)) {
    const jkey *k = &s->keys[at];
    if (k->obj == obj && k->hash == h && k->len == len && (!len || !memcmp(s->arena.p + k->off, s->arena.p + off, len)))
      return 1;
  }
  s->keys[at] = (jkey){.obj = obj, .hash = h, .off = off, .len = len};
  s->n_keys++;
  return 0;
}

size_t utl_json_number_len(const char *text, size_t len) {
  if (!len || !(text[0] == '-' || (text[0] >= '0' && text[0] <= '9'))) return 0;
  size_t i = 1;
  while (i < len && ((text[i] >= '0' && text[i] <= '9') || strchr("+-.eE", text[i]))) i++;
  return i;
}

// Whether p[0..n) is a number in JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
static int number_ok(const char *p, size_t n) {
  size_t i = 0, d;
  if (i < n && p[i] == '-') i++;
  for (d = i; i < n && p[i] >= '0' && p[i] <= '9'; i++) {}
  if (i == d || (p[d] == '0' && i - d > 1)) return 0;
  if (i < n && p[i] == '.') {
    for (d = ++i; i < n && p[i] >= '0' && p[i] <= '9'; i++) {}
    if (i == d) return 0;
  }
  if (i < n && (p[i] == 'e' || p[i] == 'E')) {
    i++;
    if (i < n && (p[i] == '+' || p[i] == '-')) i++;
    for (d = i; i < n && p[i] >= '0' && p[i] <= '9'; i++) {}
    if (i == d) return 0;
  }
  return i == n;
}

static int walk(jscan *s, int max_depth) {
  const char *p = s->text;
  uint32_t next_id = 1;
  for (size_t i = 0; i < s->len; i++) {
    char c = p[i];
    jframe *top = s->depth > 0 ? &s->f[s->depth - 1] : NULL;
    if (c == '"') {
      int is_key = top && top->is_obj && top->expect_key;
      size_t end, off = s->arena.n;
      if (is_key) { // the key names what follows, and a problem inside it
        top->key = p + i + 1;
        for (top->klen = 0; i + 1 + top->klen < s->len && p[i + 1 + top->klen] != '"'; top->klen++)
          if (p[i + 1 + top->klen] == '\\') top->klen++;
        if (i + 1 + top->klen > s->len) top->klen = s->len - i - 1;
      }
      if (scan_string(s, i, &end, is_key ? &s->arena : NULL)) return 1;
      if (is_key) {
        if (s->arena.oom) return -1;
        int dup = key_add(s, top->id, off, s->arena.n - off);
        if (dup < 0) return -1;
        if (dup) return report(s, UTL_JSON_DUP_KEY, i);
      }
      i = end;
    } else if (c == '{' || c == '[') {
      if (s->depth >= max_depth) return report(s, UTL_JSON_TOO_DEEP, i);
      s->f[s->depth++] = (jframe){.is_obj = c == '{', .expect_key = c == '{', .key = "", .id = c == '{' ? next_id++ : 0};
    } else if (c == ':') {
      if (top) top->expect_key = 0;
    } else if (c == ',') {
      if (top && top->is_obj) top->expect_key = 1;
      else if (top) top->index++;
    } else if ((c == '}' || c == ']') && top) {
      s->depth--;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t n = utl_json_number_len(p + i, s->len - i);
      if (!number_ok(p + i, n)) return report(s, UTL_JSON_BAD_NUMBER, i);
      i += n - 1;
    }
  }
  return 0;
}

int utl_json_check(const char *text, size_t len, int max_depth, utl_json_issue *out) {
  memset(out, 0, sizeof *out);
  if (max_depth < 1) max_depth = 1;
  jscan s = {.text = text, .len = len, .out = out};
  s.f = malloc((size_t)max_depth * sizeof *s.f);
  int rc = s.f ? walk(&s, max_depth) : -1;
  free(s.f);
  free(s.keys);
  utl_buf_free(&s.arena);
  if (rc <= 0) memset(out, 0, sizeof *out);
  return rc;
}
