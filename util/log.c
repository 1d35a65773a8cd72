// util/log.c: one-line log messages to stderr with a UTC timestamp, a level and the component's name, as text or JSON.
#include "util/log.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 4096

const char *utl_log_level_name(utl_log_level level) {
  switch (level) {
    case UTL_LOG_DEBUG: return "DEBUG";
    case UTL_LOG_INFO: return "INFO";
    case UTL_LOG_WARN: return "WARN";
    case UTL_LOG_ERROR: return "ERROR";
  }
  return "?";
}

static int json_mode(void) {
  const char *f = getenv("DSERVE_LOG_FORMAT");
  return f && !strcmp(f, "json");
}

const char *utl_log_format(void) { return json_mode() ? "json" : "text"; }

int utl_log_format_default(const char *format) {
  if (!format || (strcmp(format, "text") && strcmp(format, "json"))) return -1;
  return setenv("DSERVE_LOG_FORMAT", format, 0) ? -1 : 0;
}

// A line being built: bytes in p (n of LINE_MAX_BYTES; what does not fit is cut).
typedef struct line {
  char p[LINE_MAX_BYTES];
  size_t n;
} line;

static void put(line *l, const char *s, size_t k) {
  if (k > sizeof l->p - 2 - l->n) k = sizeof l->p - 2 - l->n; // room for the newline
  memcpy(l->p + l->n, s, k);
  l->n += k;
}
static void puts_(line *l, const char *s) { put(l, s, strlen(s)); }

static void putf(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(line *l, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k > 0) put(l, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

// s as a JSON string, quotes included (control characters escaped; other bytes as they are).
static void put_json_str(line *l, const char *s) {
  put(l, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') {
      char e[2] = {'\\', (char)*c};
      put(l, e, 2);
    } else if (*c == '\n') puts_(l, "\\n");
    else if (*c == '\t') puts_(l, "\\t");
    else if (*c < 0x20) putf(l, "\\u%04x", *c);
    else put(l, (const char *)c, 1);
  }
  put(l, "\"", 1);
}

static void put_num(line *l, double v, int json) {
  if (!isfinite(v)) puts_(l, json ? "null" : "-");
  else if (v == floor(v) && fabs(v) < 1e15) putf(l, "%.0f", v);
  else {
    char t[64];
    snprintf(t, sizeof t, "%.3f", v);
    size_t k = strlen(t);
    while (k > 1 && t[k - 1] == '0') k--; // 12.500 -> 12.5
    if (t[k - 1] == '.') k--;
    put(l, t, k);
  }
}

static void head(line *l, utl_log_level level, const char *component, int json) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[64];
  snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
           tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000));
  const char *comp = component ? component : "dserve";
  if (json) {
    putf(l, "{\"ts\":\"%s\",\"level\":\"%s\",\"component\":", when, utl_log_level_name(level));
    put_json_str(l, comp);
  } else {
    putf(l, "%s %-5s %s: ", when, utl_log_level_name(level), comp);
  }
}

// Ends the line (a JSON line whose text was cut still closes its object) and writes it with one write(2).
static void emit(line *l, int json) {
  while (l->n > 0 && l->p[l->n - 1] == '\n') l->n--;
  if (json) {
    if (l->n > sizeof l->p - 4) l->n = sizeof l->p - 4;
    l->p[l->n++] = '}';
  }
  l->p[l->n++] = '\n';
  for (size_t off = 0; off < l->n;) {
    ssize_t w = write(STDERR_FILENO, l->p + off, l->n - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
}

void utl_vlogl(utl_log_level level, const char *component, const char *fmt, va_list ap) {
  if (level == UTL_LOG_DEBUG) {
    const char *e = getenv("DSERVE_DEBUG");
    if (!e || !*e || !strcmp(e, "0")) return;
  }
  int json = json_mode();
  line l;
  l.n = 0;
  head(&l, level, component, json);
  char msg[LINE_MAX_BYTES];
  int m = vsnprintf(msg, sizeof msg, fmt ? fmt : "", ap);
  if (m < 0) msg[0] = 0;
  size_t k = strlen(msg);
  while (k > 0 && msg[k - 1] == '\n') msg[--k] = 0;
  if (json) {
    puts_(&l, ",\"msg\":");
    put_json_str(&l, msg);
  } else {
    put(&l, msg, k);
  }
  emit(&l, json);
}

// A text value needs quoting when it is empty or holds a space, a quote, a backslash, '=' or a control character.
static int needs_quotes(const char *s) {
  if (!*s) return 1;
  for (const unsigned char *c = (const unsigned char *)s; *c; c++)
    if (*c <= ' ' || *c == '"' || *c == '\\' || *c == '=') return 1;
  return 0;
}

void utl_log_fields(const char *component, const char *event, const utl_log_field *fields, int n) {
  int json = json_mode();
  line l;
  l.n = 0;
  head(&l, UTL_LOG_INFO, component, json);
  if (json) {
    puts_(&l, ",\"event\":");
    put_json_str(&l, event ? event : "");
  } else {
    puts_(&l, event ? event : "");
  }
  for (int i = 0; i < n; i++) {
    const utl_log_field *f = &fields[i];
    if (json) {
      put(&l, ",", 1);
      put_json_str(&l, f->key);
      put(&l, ":", 1);
    } else {
      putf(&l, " %s=", f->key);
    }
    if (!f->str) put_num(&l, f->num, json);
    else if (json || needs_quotes(f->str)) put_json_str(&l, f->str);
    else puts_(&l, f->str);
  }
  emit(&l, json);
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
