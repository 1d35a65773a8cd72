// router/metrics.h: a small thread-safe Prometheus registry (counters, gauges, fixed-bucket histograms) rendered as text.
#ifndef DSERVE_RTR_METRICS_H
#define DSERVE_RTR_METRICS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rtr_metric_kind { RTR_METRIC_COUNTER = 0, RTR_METRIC_GAUGE = 1, RTR_METRIC_HISTOGRAM = 2 } rtr_metric_kind;

typedef struct rtr_metrics rtr_metrics;
typedef struct rtr_metric rtr_metric; // one series (a family name plus one label set); owned by its registry

#define RTR_METRICS_MAX_BUCKETS 32

rtr_metrics *rtr_metrics_new(void); // NULL on out of memory
// A registry whose every series carries key="value" before its own labels (the router's model_name), value escaped.
rtr_metrics *rtr_metrics_new_labeled(const char *key, const char *value);
void rtr_metrics_free(rtr_metrics *m);

// Finds or creates the series name{labels}. labels is Prometheus label text without braces (`reason="stop"`) or
// NULL/"" for none. Every series of one name shares the kind, help and (histograms) buckets of its first creation;
// a different kind for an existing name, a bad name or bad buckets (not strictly increasing, more than
// RTR_METRICS_MAX_BUCKETS, not finite) return NULL. Names: [a-zA-Z_:][a-zA-Z0-9_:]*.
rtr_metric *rtr_metrics_counter(rtr_metrics *m, const char *name, const char *help, const char *labels);
rtr_metric *rtr_metrics_gauge(rtr_metrics *m, const char *name, const char *help, const char *labels);
rtr_metric *rtr_metrics_histogram(rtr_metrics *m, const char *name, const char *help, const char *labels,
                                  const double *bounds, int n_bounds); // bounds (n_bounds) upper bounds; +Inf implied

// Updates; NULL metric is a no-op. add on a counter ignores negative values (counters only go up).
void rtr_metric_add(rtr_metric *s, double v);     // counter or gauge
void rtr_metric_set(rtr_metric *s, double v);     // gauge
void rtr_metric_observe(rtr_metric *s, double v); // histogram
double rtr_metric_value(rtr_metric *s);           // counter/gauge value; histogram: the count
double rtr_metric_sum(rtr_metric *s);             // histogram sum (0 otherwise)

// Renders every family in creation order (# HELP, # TYPE, samples; histograms as _bucket{le=..}, _sum, _count) into
// *out (malloc'ed, NUL-terminated, *len bytes). 0, or -1 on out of memory.
int rtr_metrics_render(rtr_metrics *m, char **out, size_t *len, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
