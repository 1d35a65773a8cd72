// util/trace.h: OpenTelemetry tracing: W3C trace context (traceparent), spans, and an exporter that batches finished
// spans to an OTLP/HTTP JSON collector from its own thread, so that no caller ever waits on the network.
#ifndef DSERVE_UTL_TRACE_H
#define DSERVE_UTL_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// A W3C trace context: "00-<trace id, 32 hex>-<parent span id, 16 hex>-<flags, 2 hex>".
typedef struct utl_trace_ctx {
  uint8_t trace_id[16];
  uint8_t span_id[8]; // the parent of whatever is started under this context
  int sampled;        // flags bit 0
} utl_trace_ctx;
#define UTL_TRACEPARENT_LEN 55 // its length, the NUL not counted

// 0, or -1 when s is not a valid version-00 traceparent (all-zero ids are invalid; a later version's longer value is
// read by its first 55 characters, as the W3C spec asks).
int utl_traceparent_parse(const char *s, utl_trace_ctx *out) UTL_WARN_UNUSED;
void utl_traceparent_format(const utl_trace_ctx *c, char out[UTL_TRACEPARENT_LEN + 1]);
void utl_trace_new_id(uint8_t *id, size_t n); // random, never all zero

#define UTL_SPAN_MAX_ATTRS 8
typedef struct utl_span_attr {
  char key[32];
  char str[64]; // a string value, or "" with is_num
  double num;
  int is_num;
} utl_span_attr;

enum { UTL_SPAN_INTERNAL = 1, UTL_SPAN_SERVER = 2, UTL_SPAN_CLIENT = 3 }; // OTLP SpanKind
typedef struct utl_span {
  uint8_t trace_id[16], span_id[8], parent_id[8]; // parent_id all zero: a root span
  char name[32];
  int kind;                  // UTL_SPAN_*
  int64_t start_ns, end_ns;  // Unix-epoch ns (utl_unix_ns)
  int error;                 // status ERROR (else unset)
  utl_span_attr attrs[UTL_SPAN_MAX_ATTRS];
  int n_attrs;
} utl_span;

// A span named name, child of parent (a new span id), over [start_ns, end_ns]; attributes added with the calls below
// (beyond UTL_SPAN_MAX_ATTRS they are dropped).
void utl_span_init(utl_span *s, const utl_trace_ctx *parent, const char *name, int kind, int64_t start_ns,
                   int64_t end_ns);
void utl_span_str(utl_span *s, const char *key, const char *v);
void utl_span_num(utl_span *s, const char *key, double v);
// The context a child of s is started under (s's trace, s as the parent, sampled).
void utl_span_ctx(const utl_span *s, utl_trace_ctx *out);

// "http://HOST[:PORT]/PATH" (port 80 when absent, path "/" when absent). 0, or -1 with why.
int utl_http_url_parse(const char *url, char *host, size_t hcap, int *port, char *path, size_t pcap, char *why,
                       size_t whylen) UTL_WARN_UNUSED;

typedef struct utl_tracer utl_tracer;
typedef struct utl_tracer_opts {
  const char *endpoint;     // the collector's OTLP/HTTP traces URL (http://host:4318/v1/traces)
  const char *service_name; // resource attribute service.name
  int queue_spans;          // finished spans held at most; a span submitted beyond is dropped and counted
  int flush_ms;             // how long a span may wait before the exporter posts
} utl_tracer_opts;
// Starts the exporter thread. 0, or -1 with err (bad endpoint, out of memory).
int utl_tracer_new(const utl_tracer_opts *o, utl_tracer **out, char *err, size_t errlen) UTL_WARN_UNUSED;
// Posts what still waits (at most ~2 s more) and stops the thread; NULL is a no-op.
void utl_tracer_free(utl_tracer *t);
// Queues a copy of s for export: never waits for the network (a mutex held for a copy). 0, or -1 when the queue was
// full (the span is dropped and counted) or t is NULL.
int utl_tracer_submit(utl_tracer *t, const utl_span *s);
// Counters: spans posted and accepted by the collector, dropped (queue full), lost (a post that failed).
void utl_tracer_counts(utl_tracer *t, unsigned long long *exported, unsigned long long *dropped,
                       unsigned long long *failed);

#ifdef __cplusplus
}
#endif
#endif
