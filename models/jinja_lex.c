// models/jinja_lex.c: splits a Jinja template into text and tag tokens as jinja2's lexer does with trim_blocks=True
// and lstrip_blocks=True (Hugging Face's apply_chat_template environment): "-" strips whitespace beside a tag, "+"
// keeps it, a block or comment tag alone on its line takes the line's indentation and its newline with it.
#include <stdlib.h>
#include <string.h>

#include "models/jinja_int.h"

typedef struct lexer {
  jj_arena *a;
  const char *s;
  size_t n, pos;
  size_t lpos; // the position line/lcol describe
  int line, lcol;
  jj_toks *out;
} lexer;

static void where(lexer *L, size_t pos, int *line, int *col) {
  if (pos < L->lpos) L->lpos = 0, L->line = 1, L->lcol = 1;
  for (; L->lpos < pos; L->lpos++) {
    if (L->s[L->lpos] == '\n') L->line++, L->lcol = 1;
    else L->lcol++;
  }
  *line = L->line;
  *col = L->lcol;
}

_Noreturn static void lfail(lexer *L, size_t pos, const char *what) {
  int line, col;
  where(L, pos, &line, &col);
  jj_fail(L->a, "line %d:%d: %s", line, col, what);
}

static jj_tok *emit(lexer *L, int kind, size_t pos, const char *p, size_t n) {
  jj_toks *t = L->out;
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    jj_tok *v = jj_alloc(L->a, cap * sizeof(*v));
    if (t->n) memcpy(v, t->v, t->n * sizeof(*v));
    t->v = v;
    t->cap = cap;
  }
  jj_tok *k = &t->v[t->n++];
  memset(k, 0, sizeof(*k));
  k->kind = (uint8_t)kind;
  where(L, pos, &k->line, &k->col);
  k->p = p;
  k->n = n;
  return k;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A string literal, decoded as jinja2 decodes it (Python's unicode-escape: unknown escapes keep their backslash).
static void lex_string(lexer *L) {
  size_t start = L->pos;
  char q = L->s[L->pos++];
  jj_sbuf b = {.limit = MDL_JINJA_MAX_TEMPLATE};
  for (;;) {
    if (L->pos >= L->n) lfail(L, start, "unterminated string");
    char c = L->s[L->pos++];
    if (c == q) break;
    if (c != '\\') { jj_sb_put(L->a, &b, &c, 1, 0); continue; }
    if (L->pos >= L->n) lfail(L, start, "unterminated string");
    c = L->s[L->pos++];
    const char *m = strchr("\\'\"abfnrtv", c);
    if (c && m) { jj_sb_put(L->a, &b, &"\\'\"\a\b\f\n\r\t\v"[m - "\\'\"abfnrtv"], 1, 0); continue; }
    if (c == '\n') continue; // a backslash-newline joins lines
    if (c >= '0' && c <= '7') {
      uint32_t v = (uint32_t)(c - '0');
      for (int i = 0; i < 2 && L->pos < L->n && L->s[L->pos] >= '0' && L->s[L->pos] <= '7'; i++)
        v = v * 8 + (uint32_t)(L->s[L->pos++] - '0');
      jj_sb_utf8(L->a, &b, v);
      continue;
    }
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (!digits) { // unknown escape: kept as written
      char two[2] = {'\\', c};
      jj_sb_put(L->a, &b, two, 2, 0);
      continue;
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
      int h = L->pos < L->n ? hexval(L->s[L->pos]) : -1;
      if (h < 0) lfail(L, L->pos, "bad escape in string");
      v = v * 16 + (uint32_t)h;
      L->pos++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) lfail(L, L->pos, "escape is not a Unicode scalar value");
    jj_sb_utf8(L->a, &b, v);
  }
  jj_tok *t = emit(L, JT_STR, start, b.p ? b.p : "", b.n);
  (void)t;
}

static void lex_number(lexer *L) {
  size_t start = L->pos;
  const char *s = L->s;
  int isf = 0;
  while (L->pos < L->n && ((s[L->pos] >= '0' && s[L->pos] <= '9') || s[L->pos] == '_')) L->pos++;
  if (L->pos + 1 < L->n && s[L->pos] == '.' && s[L->pos + 1] >= '0' && s[L->pos + 1] <= '9') {
    isf = 1;
    L->pos++;
    while (L->pos < L->n && ((s[L->pos] >= '0' && s[L->pos] <= '9') || s[L->pos] == '_')) L->pos++;
  }
  if (L->pos < L->n && (s[L->pos] == 'e' || s[L->pos] == 'E')) {
    size_t p = L->pos + 1;
    if (p < L->n && (s[p] == '+' || s[p] == '-')) p++;
    if (p < L->n && s[p] >= '0' && s[p] <= '9') {
      isf = 1;
      L->pos = p;
      while (L->pos < L->n && s[L->pos] >= '0' && s[L->pos] <= '9') L->pos++;
    }
  }
  char buf[64];
  size_t k = 0;
  for (size_t i = start; i < L->pos; i++) {
    if (s[i] == '_') continue;
    if (k + 1 >= sizeof buf) lfail(L, start, "number too long");
    buf[k++] = s[i];
  }
  buf[k] = 0;
  jj_tok *t = emit(L, isf ? JT_FLOAT : JT_INT, start, s + start, L->pos - start);
  if (isf) {
    t->f = strtod(buf, NULL);
  } else {
    if (k > 18) lfail(L, start, "integer literal out of range");
    t->i = strtoll(buf, NULL, 10);
  }
}

// The tokens inside {{ }} or {% %} up to the closing tag (at bracket depth 0: "}}" closes only outside braces).
// Returns the position after the closing tag and sets *strip when it was "-}}" / "-%}", *keep when "+%}".
static size_t lex_tag(lexer *L, int block, int *strip, int *keep) {
  int depth = 0;
  const char *s = L->s;
  for (;;) {
    while (L->pos < L->n && (s[L->pos] == ' ' || s[L->pos] == '\t' || s[L->pos] == '\n' || s[L->pos] == '\r'))
      L->pos++;
    if (L->pos >= L->n) lfail(L, L->pos, block ? "unexpected end of template: '%}' missing" : "unexpected end of "
                                                                                            "template: '}}' missing");
    size_t p = L->pos;
    char c = s[p];
    char close = block ? '%' : '}';
    if (depth == 0) {
      int sign = (c == '-' || (c == '+' && block)) ? 1 : 0;
      if (p + sign + 1 < L->n && s[p + sign] == close && s[p + sign + 1] == '}') {
        *strip = sign && c == '-';
        *keep = sign && c == '+';
        emit(L, block ? JT_BLOCK_END : JT_VAR_END, p, s + p, 2 + (size_t)sign);
        return p + 2 + (size_t)sign;
      }
    }
    if (c == '\'' || c == '"') { lex_string(L); continue; }
    if (c >= '0' && c <= '9') { lex_number(L); continue; }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
      while (L->pos < L->n && ((s[L->pos] >= 'a' && s[L->pos] <= 'z') || (s[L->pos] >= 'A' && s[L->pos] <= 'Z') ||
                               (s[L->pos] >= '0' && s[L->pos] <= '9') || s[L->pos] == '_'))
        L->pos++;
      emit(L, JT_NAME, p, s + p, L->pos - p);
      continue;
    }
    static const char *ops2[] = {"**", "//", "==", "!=", "<=", ">="};
    size_t len = 0;
    for (size_t i = 0; i < sizeof ops2 / sizeof *ops2; i++)
      if (p + 1 < L->n && s[p] == ops2[i][0] && s[p + 1] == ops2[i][1]) len = 2;
    if (!len && strchr("+-*/%~<>()[]{},.:|=", c) && c) len = 1;
    if (!len) lfail(L, p, "unexpected character in tag");
    if (c == '(' || c == '[' || c == '{') depth++;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
    emit(L, JT_OP, p, s + p, len);
    L->pos = p + len;
  }
}

void jj_lex(jj_arena *a, const char *src, size_t n, jj_toks *out) {
  lexer L = {.a = a, .s = src, .n = n, .line = 1, .lcol = 1, .out = out};
  int line_starting = 1;
  for (;;) {
    size_t t = L.pos;
    while (t + 1 < n && !(src[t] == '{' && (src[t + 1] == '{' || src[t + 1] == '%' || src[t + 1] == '#'))) t++;
    if (t + 1 >= n) t = n;
    size_t tend = t; // end of the text before the tag
    if (t < n) {
      char kind = src[t + 1], sign = t + 2 < n ? src[t + 2] : 0;
      if (sign == '-') {
        size_t k;
        while (tend > L.pos && jj_isspace_at(src, n, tend, 1, &k)) tend -= k;
      } else if (sign != '+' && kind != '{') {
        size_t l = tend;
        while (l > L.pos && src[l - 1] != '\n') l--;
        if (l > L.pos || line_starting) {
          size_t i = l, k;
          while (i < tend && jj_isspace_at(src, n, i, 0, &k)) i += k;
          if (i == tend) tend = l;
        }
      }
    }
    if (tend > L.pos) emit(&L, JT_TEXT, L.pos, src + L.pos, tend - L.pos);
    if (t >= n) break;
    char kind = src[t + 1];
    size_t body = t + 2 + ((t + 2 < n && (src[t + 2] == '-' || (src[t + 2] == '+' && kind != '{'))) ? 1 : 0);
    size_t end;
    int strip = 0, keep = 0;
    if (kind == '#') {
      const char *e = NULL;
      for (size_t i = body; i + 1 < n; i++)
        if (src[i] == '#' && src[i + 1] == '}') { e = src + i; break; }
      if (!e) lfail(&L, t, "unterminated comment");
      size_t ep = (size_t)(e - src);
      strip = ep > body && src[ep - 1] == '-';
      keep = ep > body && src[ep - 1] == '+';
      end = ep + 2;
    } else {
      emit(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, t, src + t, body - t);
      L.pos = body;
      end = lex_tag(&L, kind == '%', &strip, &keep);
    }
    if (strip) {
      size_t k;
      while (end < n && jj_isspace_at(src, n, end, 0, &k)) end += k;
    } else if (kind != '{' && !keep && end < n && src[end] == '\n') {
      end++; // trim_blocks
    }
    line_starting = end > 0 && src[end - 1] == '\n';
    L.pos = end;
  }
  emit(&L, JT_EOF, n, src + n, 0);
}
