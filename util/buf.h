// util/buf.h: a growable byte buffer (text or binary, always NUL-terminated) whose out-of-memory flag is sticky,
// so a caller appends many pieces and checks once at the end.
#ifndef DSERVE_UTL_BUF_H
#define DSERVE_UTL_BUF_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct utl_buf {
  char *p;    // (owned) (cap) bytes: n bytes of content, then a NUL; NULL until the first append
  size_t n;   // content length, the NUL not counted
  size_t cap; // bytes allocated
  int oom;    // an append failed: later appends do nothing, utl_buf_take returns NULL
} utl_buf;

// Appends n bytes (they may contain NULs). 0, or -1 when memory ran out (then and on every later call). A failed
// append leaves the content as it was, so a caller that would rather lose only that piece may clear oom and go on.
int utl_buf_add(utl_buf *b, const void *p, size_t n);
int utl_buf_adds(utl_buf *b, const char *s); // a C string
int utl_buf_printf(utl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Hands the content over (an empty string when nothing was appended; NULL after out of memory, the content
// then freed) and leaves b empty. The caller frees the result.
char *utl_buf_take(utl_buf *b);
void utl_buf_reset(utl_buf *b); // empties b, keeping its memory
void utl_buf_free(utl_buf *b);  // frees the content and leaves b empty

#ifdef __cplusplus
}
#endif
#endif
