// router/metrics.c: the Prometheus registry: series in creation order behind one mutex, text exposition format.
#include "router/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

struct rtr_metric {
  rtr_metrics *reg;              // (borrowed)
  char *name, *help, *labels;    // (owned)
  rtr_metric_kind kind;
  double value;                  // counter / gauge
  double bounds[RTR_METRICS_MAX_BUCKETS];
  unsigned long long counts[RTR_METRICS_MAX_BUCKETS + 1]; // (n_bounds + 1) per bucket, not cumulative
  int n_bounds;
  double sum;
  unsigned long long count;
  rtr_metric *next;
};

struct rtr_metrics {
  pthread_mutex_t mu;
  rtr_metric *head, *tail; // (owned) creation order
  char *base;              // (owned) labels every series carries first ("" for none)
};

rtr_metrics *rtr_metrics_new(void) { return rtr_metrics_new_labeled(NULL, NULL); }

rtr_metrics *rtr_metrics_new_labeled(const char *key, const char *value) {
  rtr_metrics *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  utl_buf b = {0};
  if (key && value) { // key="value" with the exposition format's escapes
    utl_buf_printf(&b, "%s=\"", key);
    for (const char *p = value; *p; p++) {
      if (*p == '\\' || *p == '"') utl_buf_printf(&b, "\\%c", *p);
      else if (*p == '\n') utl_buf_adds(&b, "\\n");
      else utl_buf_add(&b, p, 1);
    }
    utl_buf_adds(&b, "\"");
  }
  if (!(m->base = utl_buf_take(&b))) {
    free(m);
    return NULL;
  }
  pthread_mutex_init(&m->mu, NULL);
  return m;
}

void rtr_metrics_free(rtr_metrics *m) {
  if (!m) return;
  for (rtr_metric *s = m->head, *n; s; s = n) {
    n = s->next;
    free(s->name);
    free(s->help);
    free(s->labels);
    free(s);
  }
  pthread_mutex_destroy(&m->mu);
  free(m->base);
  free(m);
}

static int name_ok(const char *n) {
  if (!n || !*n) return 0;
  for (const char *p = n; *p; p++) {
    int c = (unsigned char)*p;
    int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(p != n && c >= '0' && c <= '9')) return 0;
  }
  return 1;
}

static char *dup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static rtr_metric *get(rtr_metrics *m, rtr_metric_kind kind, const char *name, const char *help, const char *labels,
                       const double *bounds, int nb) {
  if (!m || !name_ok(name)) return NULL;
  if (!labels) labels = "";
  char full[512]; // the registry's labels first
  if (m->base[0]) {
    if (snprintf(full, sizeof full, "%s%s%s", m->base, labels[0] ? "," : "", labels) >= (int)sizeof full) return NULL;
    labels = full;
  }
  if (kind == RTR_METRIC_HISTOGRAM) {
    if (nb < 0 || nb > RTR_METRICS_MAX_BUCKETS || (nb > 0 && !bounds)) return NULL;
    for (int i = 0; i < nb; i++)
      if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) return NULL;
  }
  pthread_mutex_lock(&m->mu);
  rtr_metric *first = NULL, *found = NULL;
  for (rtr_metric *s = m->head; s; s = s->next) {
    if (strcmp(s->name, name)) continue;
    if (!first) first = s;
    if (!strcmp(s->labels, labels)) {
      found = s;
      break;
    }
  }
  if (found || (first && first->kind != kind)) {
    pthread_mutex_unlock(&m->mu);
    return found && found->kind == kind ? found : NULL;
  }
  rtr_metric *s = calloc(1, sizeof *s);
  if (s) {
    s->reg = m;
    s->kind = kind;
    s->name = dup(name);
    s->help = dup(first ? first->help : (help ? help : ""));
    s->labels = dup(labels);
    if (first) {
      s->n_bounds = first->n_bounds;
      memcpy(s->bounds, first->bounds, sizeof s->bounds);
    } else if (kind == RTR_METRIC_HISTOGRAM) {
      s->n_bounds = nb;
      if (nb) memcpy(s->bounds, bounds, (size_t)nb * sizeof *bounds);
    }
    if (!s->name || !s->help || !s->labels) {
      free(s->name);
      free(s->help);
      free(s->labels);
      free(s);
      s = NULL;
    } else {
      // keep a family's series together: insert after the family's last series
      rtr_metric *after = NULL;
      for (rtr_metric *t = m->head; t; t = t->next)
        if (!strcmp(t->name, name)) after = t;
      if (after) {
        s->next = after->next;
        after->next = s;
        if (m->tail == after) m->tail = s;
      } else {
        if (m->tail) m->tail->next = s;
        else m->head = s;
        m->tail = s;
      }
    }
  }
  pthread_mutex_unlock(&m->mu);
  return s;
}

rtr_metric *rtr_metrics_counter(rtr_metrics *m, const char *name, const char *help, const char *labels) {
  return get(m, RTR_METRIC_COUNTER, name, help, labels, NULL, 0);
}
rtr_metric *rtr_metrics_gauge(rtr_metrics *m, const char *name, const char *help, const char *labels) {
  return get(m, RTR_METRIC_GAUGE, name, help, labels, NULL, 0);
}
rtr_metric *rtr_metrics_histogram(rtr_metrics *m, const char *name, const char *help, const char *labels,
                                  const double *bounds, int n_bounds) {
  return get(m, RTR_METRIC_HISTOGRAM, name, help, labels, bounds, n_bounds);
}

void rtr_metric_add(rtr_metric *s, double v) {
  if (!s || s->kind == RTR_METRIC_HISTOGRAM || !isfinite(v)) return;
  if (s->kind == RTR_METRIC_COUNTER && v < 0) return;
  pthread_mutex_lock(&s->reg->mu);
  s->value += v;
  pthread_mutex_unlock(&s->reg->mu);
}

void rtr_metric_set(rtr_metric *s, double v) {
  if (!s || s->kind != RTR_METRIC_GAUGE) return;
  pthread_mutex_lock(&s->reg->mu);
  s->value = v;
  pthread_mutex_unlock(&s->reg->mu);
}

void rtr_metric_observe(rtr_metric *s, double v) {
  if (!s || s->kind != RTR_METRIC_HISTOGRAM || isnan(v)) return;
  pthread_mutex_lock(&s->reg->mu);
  int b = 0;
  while (b < s->n_bounds && v > s->bounds[b]) b++;
  s->counts[b]++;
  s->count++;
  s->sum += v;
  pthread_mutex_unlock(&s->reg->mu);
}

double rtr_metric_value(rtr_metric *s) {
  if (!s) return 0;
  pthread_mutex_lock(&s->reg->mu);
  double v = s->kind == RTR_METRIC_HISTOGRAM ? (double)s->count : s->value;
  pthread_mutex_unlock(&s->reg->mu);
  return v;
}

double rtr_metric_sum(rtr_metric *s) {
  if (!s) return 0;
  pthread_mutex_lock(&s->reg->mu);
  double v = s->kind == RTR_METRIC_HISTOGRAM ? s->sum : 0;
  pthread_mutex_unlock(&s->reg->mu);
  return v;
}

static void fmt_num(char *o, size_t cap, double v) {
  if (isinf(v)) snprintf(o, cap, v > 0 ? "+Inf" : "-Inf");
  else if (isnan(v)) snprintf(o, cap, "NaN");
  else if (v == floor(v) && fabs(v) < 1e15) snprintf(o, cap, "%.0f", v);
  else {
    snprintf(o, cap, "%.15g", v); // shortest form that reads back as the same double
    if (strtod(o, NULL) != v) snprintf(o, cap, "%.17g", v);
  }
}

int rtr_metrics_render(rtr_metrics *m, char **out, size_t *len, char *err, size_t errlen) {
  static const char *kinds[] = {"counter", "gauge", "histogram"};
  utl_buf b = {0};
  pthread_mutex_lock(&m->mu);
  const char *last = NULL;
  for (rtr_metric *s = m->head; s; s = s->next) {
    if (!last || strcmp(last, s->name)) {
      utl_buf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", s->name, s->help, s->name, kinds[s->kind]);
      last = s->name;
    }
    char num[64];
    const char *sep = s->labels[0] ? "," : "";
    if (s->kind != RTR_METRIC_HISTOGRAM) {
      fmt_num(num, sizeof num, s->value);
      if (s->labels[0]) utl_buf_printf(&b, "%s{%s} %s\n", s->name, s->labels, num);
      else utl_buf_printf(&b, "%s %s\n", s->name, num);
      continue;
    }
    unsigned long long cum = 0;
    for (int i = 0; i <= s->n_bounds; i++) {
      cum += s->counts[i];
      char le[64];
      fmt_num(le, sizeof le, i < s->n_bounds ? s->bounds[i] : INFINITY);
      if (i < s->n_bounds && s->bounds[i] != floor(s->bounds[i])) snprintf(le, sizeof le, "%g", s->bounds[i]);
      utl_buf_printf(&b, "%s_bucket{%s%sle=\"%s\"} %llu\n", s->name, s->labels, sep, le, cum);
    }
    fmt_num(num, sizeof num, s->sum);
    if (s->labels[0]) {
      utl_buf_printf(&b, "%s_sum{%s} %s\n", s->name, s->labels, num);
      utl_buf_printf(&b, "%s_count{%s} %llu\n", s->name, s->labels, s->count);
    } else {
      utl_buf_printf(&b, "%s_sum %s\n", s->name, num);
      utl_buf_printf(&b, "%s_count %llu\n", s->name, s->count);
    }
  }
  pthread_mutex_unlock(&m->mu);
  *len = b.n;
  if (!(*out = utl_buf_take(&b))) {
    snprintf(err, errlen, "out of memory rendering metrics");
    return -1;
  }
  return 0;
}
