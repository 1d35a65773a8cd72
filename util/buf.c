// util/buf.c: the growable byte buffer (util/buf.h).
#include "util/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Room for `more` bytes of content plus the NUL, doubling so appends cost amortised O(1).
static int reserve(utl_buf *b, size_t more) {
  if (b->oom) return -1;
  if (more > (size_t)-1 / 2 - b->n - 1) goto oom; // a size no allocator grants; also keeps the doubling finite
  if (b->n + more + 1 <= b->cap) return 0;
  size_t nc = b->cap ? b->cap : 64;
  while (nc < b->n + more + 1) nc *= 2;
  char *np = realloc(b->p, nc);
  if (!np) goto oom;
  b->p = np;
  b->cap = nc;
  return 0;
oom:
  b->oom = 1;
  return -1;
}

int utl_buf_add(utl_buf *b, const void *p, size_t n) {
  if (reserve(b, n)) return -1;
  if (n) memcpy(b->p + b->n, p, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

int utl_buf_adds(utl_buf *b, const char *s) { return utl_buf_add(b, s, strlen(s)); }

int utl_buf_printf(utl_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (k < 0) {
    b->oom = 1;
    return -1;
  }
  if (reserve(b, (size_t)k)) return -1;
  va_start(ap, fmt);
  vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)k;
  return 0;
}

char *utl_buf_take(utl_buf *b) {
  if (!b->oom && !b->p) utl_buf_add(b, "", 0);
  char *p = b->oom ? NULL : b->p;
  if (b->oom) free(b->p);
  *b = (utl_buf){0};
  return p;
}

void utl_buf_reset(utl_buf *b) {
  b->n = 0;
  b->oom = 0;
  if (b->p) b->p[0] = 0;
}

void utl_buf_free(utl_buf *b) {
  free(b->p);
  *b = (utl_buf){0};
}
