// worker/trace.h: a worker's spans of a traced request (its phases, children of the router's request span), exported
// by the shell's tracer when the config has a "tracing" section.
#ifndef DSERVE_WRK_TRACE_H
#define DSERVE_WRK_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"
#include "worker/genreq.h"
#include "worker/shell.h"

#ifdef __cplusplus
extern "C" {
#endif

// Opens sh->tracer (service "<tracing.service_name>-<worker name>") when the config traces; 0, or -1 with err.
int wrk_trace_open(wrk_shell *sh, char *err, size_t errlen) UTL_WARN_UNUSED;
void wrk_trace_close(wrk_shell *sh); // posts what waits; no tracer: no-op

// One span of req named name over [start_us, end_us] (utl_now_us readings), with the request's id, this worker's
// name and, when key is not NULL, key = value. Nothing when the request is not traced or there is no tracer; never
// waits on the network (a full queue drops the span and counts it).
void wrk_trace_span(wrk_shell *sh, const wrk_genreq *req, const char *name, int64_t start_us, int64_t end_us,
                    const char *key, double value);

#ifdef __cplusplus
}
#endif
#endif
