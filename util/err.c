// util/err.c: filling a caller's error buffer (util/err.h).
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>

void utl_seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}
