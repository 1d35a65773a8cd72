// util/log.h: one-line log messages to stderr with a UTC timestamp, a level and the component's name.
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
void utl_vlogl(utl_log_level level, const char *component, const char *fmt, va_list ap);
void utl_logl(utl_log_level level, const char *component, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void utl_log(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3)));  // INFO
void utl_warn(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3))); // WARN
void utl_err(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3)));  // ERROR
void utl_debug(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3))); // DEBUG
const char *utl_log_level_name(utl_log_level level); // "DEBUG", "INFO", "WARN", "ERROR"

#ifdef __cplusplus
}
#endif
#endif
