// server/log.h: one-line log messages to stderr with a UTC timestamp, a level and the component's name.
#ifndef DSERVE_SRV_LOG_H
#define DSERVE_SRV_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum srv_log_level { SRV_LOG_DEBUG = 0, SRV_LOG_INFO = 1, SRV_LOG_WARN = 2, SRV_LOG_ERROR = 3 } srv_log_level;

// "2025-01-02T03:04:05.678Z INFO  router: message\n", written with one write(2) so lines of concurrent threads and
// processes do not interleave. A trailing newline in fmt is not doubled. DEBUG lines appear only when the
// environment has DSERVE_DEBUG set (non-empty, not "0").
void srv_vlogl(srv_log_level level, const char *component, const char *fmt, va_list ap);
void srv_logl(srv_log_level level, const char *component, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void srv_log(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3)));  // INFO
void srv_warn(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3))); // WARN
void srv_err(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3)));  // ERROR
void srv_debug(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3))); // DEBUG
const char *srv_log_level_name(srv_log_level level); // "DEBUG", "INFO", "WARN", "ERROR"

#ifdef __cplusplus
}
#endif
#endif
