// worker/trace.c: a worker's spans of a traced request, handed to the shell's exporter (util/trace.h).
#include "worker/trace.h"

#include <stdio.h>

#include "util/clock.h"
#include "util/log.h"

int wrk_trace_open(wrk_shell *sh, char *err, size_t errlen) {
  const cfg_tracing *t = &sh->cfg->tracing;
  if (!t->endpoint[0]) return 0;
  char svc[160];
  snprintf(svc, sizeof svc, "%s-%s", t->service_name, sh->wc->name);
  utl_tracer_opts o = {.endpoint = t->endpoint, .service_name = svc, .queue_spans = t->queue_spans,
                       .flush_ms = t->flush_ms};
  if (utl_tracer_new(&o, &sh->tracer, err, errlen)) return -1;
  utl_log(sh->wc->name, "tracing to %s", t->endpoint);
  return 0;
}

void wrk_trace_close(wrk_shell *sh) {
  if (!sh->tracer) return;
  unsigned long long done, dropped, failed;
  utl_tracer_counts(sh->tracer, &done, &dropped, &failed);
  utl_tracer_free(sh->tracer);
  sh->tracer = NULL;
  if (dropped) utl_warn(sh->wc->name, "tracing: %llu spans dropped (the export queue was full)", dropped);
}

void wrk_trace_span(wrk_shell *sh, const wrk_genreq *req, const char *name, int64_t start_us, int64_t end_us,
                    const char *key, double value) {
  if (!sh->tracer || !req->traced) return;
  utl_span s;
  utl_span_init(&s, &req->trace, name, UTL_SPAN_INTERNAL, utl_unix_ns_of(start_us * 1000),
                utl_unix_ns_of(end_us * 1000));
  utl_span_str(&s, "dserve.request_id", req->id);
  utl_span_str(&s, "dserve.worker", sh->wc->name);
  if (key) utl_span_num(&s, key, value);
  utl_tracer_submit(sh->tracer, &s);
}
