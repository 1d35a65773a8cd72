// util/log.h: one-line log messages to stderr with a UTC timestamp, a level and the component's name, as text or JSON.
#ifndef DSERVE_UTL_LOG_H
#define DSERVE_UTL_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum utl_log_level { UTL_LOG_DEBUG = 0, UTL_LOG_INFO = 1, UTL_LOG_WARN = 2, UTL_LOG_ERROR = 3 } utl_log_level;

// "2025-01-02T03:04:05.678Z INFO  router: message\n", written with one write(2) so lines of concurrent threads and
// processes do not interleave. A trailing newline in fmt is not doubled. DEBUG lines appear only when the
// environment has DSERVE_DEBUG set (non-empty, not "0").
// The environment's DSERVE_LOG_FORMAT=json makes every line one JSON object instead (JSON lines):
// {"ts":"2025-01-02T03:04:05.678Z","level":"INFO","component":"router","msg":"message"}. The process's own
// environment is the one switch so that a launcher's children, and every thread, write the same format.
void utl_vlogl(utl_log_level level, const char *component, const char *fmt, va_list ap);
void utl_logl(utl_log_level level, const char *component, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void utl_log(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3)));  // INFO
void utl_warn(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3))); // WARN
void utl_err(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3)));  // ERROR
void utl_debug(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3))); // DEBUG
const char *utl_log_level_name(utl_log_level level); // "DEBUG", "INFO", "WARN", "ERROR"

// "text" or "json": the format this process writes (DSERVE_LOG_FORMAT; anything but "json" is text).
const char *utl_log_format(void);
// Sets DSERVE_LOG_FORMAT to format ("text" or "json") unless the environment already has it (a command-line flag set
// it first, or the launcher's environment did). 0, or -1 for another value.
int utl_log_format_default(const char *format);

// One field of a structured line: a string (str non-NULL) or a number (num; printed as an integer when it is one, else
// with at most 3 decimals; NaN, "unknown", is written null in JSON and - in text).
typedef struct utl_log_field {
  const char *key; // (borrowed) [a-z0-9_]
  const char *str; // (borrowed) NULL: a number
  double num;
} utl_log_field;
static inline utl_log_field utl_lf_str(const char *key, const char *v) { // NULL v: ""
  utl_log_field f = {key, v ? v : "", 0};
  return f;
}
#define UTL_LF_S(k, v) utl_lf_str((k), (v))
#define UTL_LF_N(k, v) ((utl_log_field){.key = (k), .str = NULL, .num = (double)(v)})

// A structured INFO line: event names the kind of line ("access", "stats"), fields (n) its values. Text:
// "... INFO  router: access id=chatcmpl-1 status=200 ttft_ms=12.5 workers=p0>d0" (a value with a space, a quote,
// a backslash or '=' is written as a JSON string); JSON: {"ts", "level", "component", "event", then each field}.
void utl_log_fields(const char *component, const char *event, const utl_log_field *fields, int n);

#ifdef __cplusplus
}
#endif
#endif
