// config/observe.c: the config's observability sections: "logging" (format, stats lines) and "tracing" (OTLP).
#include <stdio.h>
#include <string.h>

#include "config/config_int.h"
#include "util/trace.h"

static const char *const K_LOGGING[] = {"format", "stats_interval_s", NULL};
static const char *const K_TRACING[] = {"endpoint", "service_name", "sample_ratio", "queue_spans", "flush_ms", NULL};
static const char *const S_FORMAT[] = {"text", "json", NULL};

static int parse_logging(cfg_ctx *x, const cJSON *root, cfg_logging *o) {
  const cJSON *lg;
  const char *p = "logging";
  if (cfg_obj(x, root, "", p, &lg)) return -1;
  if (lg && cfg_check_keys(x, lg, p, K_LOGGING)) return -1;
  if (cfg_str(x, lg, p, "format", o->format, sizeof o->format, "text") ||
      cfg_one_of(x, p, "format", o->format, S_FORMAT) ||
      cfg_int32(x, lg, p, "stats_interval_s", &o->stats_interval_s, 0, 86400, CFG_DEF_STATS_INTERVAL_S, 0))
    return -1;
  return 0;
}

static int parse_tracing(cfg_ctx *x, const cJSON *root, cfg_tracing *o) {
  const cJSON *tr;
  const char *p = "tracing";
  memset(o, 0, sizeof *o);
  if (cfg_obj(x, root, "", p, &tr)) return -1;
  if (tr && cfg_check_keys(x, tr, p, K_TRACING)) return -1;
  if (cfg_str(x, tr, p, "endpoint", o->endpoint, sizeof o->endpoint, tr ? NULL : "") ||
      cfg_str(x, tr, p, "service_name", o->service_name, sizeof o->service_name, "dserve") ||
      cfg_num(x, tr, p, "sample_ratio", &o->sample_ratio, 0, 0, 1, 1) ||
      cfg_int32(x, tr, p, "queue_spans", &o->queue_spans, 16, 1 << 20, CFG_DEF_TRACE_QUEUE_SPANS, 0) ||
      cfg_int32(x, tr, p, "flush_ms", &o->flush_ms, 10, 60000, CFG_DEF_TRACE_FLUSH_MS, 0))
    return -1;
  if (tr && !o->service_name[0]) return cfg_fail(x, "tracing.service_name", "must not be empty");
  char host[128], path[128], why[128];
  int port;
  if (tr && utl_http_url_parse(o->endpoint, host, sizeof host, &port, path, sizeof path, why, sizeof why))
    return cfg_fail(x, "tracing.endpoint", "%s", why);
  return 0;
}

int cfg_parse_observe(cfg_ctx *x, const cJSON *root, cfg_cluster *c) {
  return parse_logging(x, root, &c->logging) || parse_tracing(x, root, &c->tracing) ? -1 : 0;
}
