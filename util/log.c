// util/log.c: one-line log messages to stderr with a UTC timestamp, a level and the component's name.
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *utl_log_level_name(utl_log_level level) {
  switch (level) {
    case UTL_LOG_DEBUG: return "DEBUG";
    case UTL_LOG_INFO: return "INFO";
    case UTL_LOG_WARN: return "WARN";
    case UTL_LOG_ERROR: return "ERROR";
  }
  return "?";
}

void utl_vlogl(utl_log_level level, const char *component, const char *fmt, va_list ap) {
  if (level == UTL_LOG_DEBUG) {
    const char *e = getenv("DSERVE_DEBUG");
    if (!e || !*e || !strcmp(e, "0")) return;
  }
  char line[2048];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %-5s %s: ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000),
                   utl_log_level_name(level), component ? component : "dserve");
  if (n < 0) return;
  if ((size_t)n < sizeof line) {
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt ? fmt : "", ap);
    if (m > 0) n += m;
  }
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2; // truncated
  while (n > 0 && line[n - 1] == '\n') n--;
  line[n++] = '\n';
  for (ssize_t off = 0; off < n;) {
    ssize_t w = write(STDERR_FILENO, line + off, (size_t)(n - off));
    if (w <= 0) break;
    off += w;
  }
}

void utl_logl(utl_log_level level, const char *component, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  utl_vlogl(level, component, fmt, ap);
  va_end(ap);
}

#define UTL_LOG_FN(fn, lvl)                                \
  void fn(const char *component, const char *fmt, ...) {   \
    va_list ap;                                            \
    va_start(ap, fmt);                                     \
    utl_vlogl(lvl, component, fmt, ap);                    \
    va_end(ap);                                            \
  }
UTL_LOG_FN(utl_log, UTL_LOG_INFO)
UTL_LOG_FN(utl_warn, UTL_LOG_WARN)
UTL_LOG_FN(utl_err, UTL_LOG_ERROR)
UTL_LOG_FN(utl_debug, UTL_LOG_DEBUG)
