// util/trace.c: W3C trace context, spans, and the OTLP/HTTP JSON exporter (a bounded queue drained by one thread).
#include "util/trace.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/net.h"

#define BATCH_SPANS 512   // spans per post at most
#define IO_TIMEOUT_MS 2000 // connect, send and the answer's status line
#define STOP_FLUSH_MS 2000 // utl_tracer_free: how long what waits may still take

// ---- trace context ----

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1; // W3C: lowercase only
}

static int read_hex(const char *s, uint8_t *out, size_t n) {
  int any = 0;
  for (size_t i = 0; i < n; i++) {
    int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
    any |= out[i];
  }
  return any ? 0 : -1;
}

static void put_hex(char *out, const uint8_t *v, size_t n) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = d[v[i] >> 4];
    out[2 * i + 1] = d[v[i] & 15];
  }
  out[2 * n] = 0;
}

int utl_traceparent_parse(const char *s, utl_trace_ctx *out) {
  if (!s || strlen(s) < UTL_TRACEPARENT_LEN) return -1;
  if (hexval(s[0]) < 0 || hexval(s[1]) < 0 || !strncmp(s, "ff", 2)) return -1; // version ff is invalid
  int ver = hexval(s[0]) << 4 | hexval(s[1]), flags;
  if (s[2] != '-' || s[35] != '-' || s[52] != '-') return -1;
  if (ver == 0 && s[UTL_TRACEPARENT_LEN] != 0) return -1;
  if (ver > 0 && s[UTL_TRACEPARENT_LEN] != 0 && s[UTL_TRACEPARENT_LEN] != '-') return -1;
  utl_trace_ctx c;
  if (read_hex(s + 3, c.trace_id, 16) || read_hex(s + 36, c.span_id, 8)) return -1;
  if (hexval(s[53]) < 0 || hexval(s[54]) < 0) return -1;
  flags = hexval(s[53]) << 4 | hexval(s[54]);
  c.sampled = flags & 1;
  *out = c;
  return 0;
}

void utl_traceparent_format(const utl_trace_ctx *c, char out[UTL_TRACEPARENT_LEN + 1]) {
  memcpy(out, "00-", 3);
  put_hex(out + 3, c->trace_id, 16);
  out[35] = '-';
  put_hex(out + 36, c->span_id, 8);
  snprintf(out + 52, 4, "-%02x", c->sampled ? 1 : 0);
}

void utl_trace_new_id(uint8_t *id, size_t n) {
  for (;;) {
    if (getrandom(id, n, 0) != (ssize_t)n) { // no entropy source: the clocks and the address, mixed
      uint64_t x = (uint64_t)utl_now_ns() ^ (uint64_t)utl_unix_ns() << 17 ^ (uint64_t)(uintptr_t)id;
      for (size_t i = 0; i < n; i++) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 29;
        id[i] = (uint8_t)x;
      }
    }
    for (size_t i = 0; i < n; i++)
      if (id[i]) return;
  }
}

// ---- spans ----

void utl_span_init(utl_span *s, const utl_trace_ctx *parent, const char *name, int kind, int64_t start_ns,
                   int64_t end_ns) {
  memset(s, 0, sizeof *s);
  memcpy(s->trace_id, parent->trace_id, sizeof s->trace_id);
  memcpy(s->parent_id, parent->span_id, sizeof s->parent_id);
  utl_trace_new_id(s->span_id, sizeof s->span_id);
  snprintf(s->name, sizeof s->name, "%s", name);
  s->kind = kind;
  s->start_ns = start_ns;
  s->end_ns = end_ns >= start_ns ? end_ns : start_ns;
}

static utl_span_attr *new_attr(utl_span *s, const char *key) {
  if (s->n_attrs >= UTL_SPAN_MAX_ATTRS) return NULL;
  utl_span_attr *a = &s->attrs[s->n_attrs++];
  memset(a, 0, sizeof *a);
  snprintf(a->key, sizeof a->key, "%s", key);
  return a;
}

void utl_span_str(utl_span *s, const char *key, const char *v) {
  utl_span_attr *a = new_attr(s, key);
  if (a) snprintf(a->str, sizeof a->str, "%s", v ? v : "");
}

void utl_span_num(utl_span *s, const char *key, double v) {
  utl_span_attr *a = new_attr(s, key);
  if (!a) return;
  a->num = v;
  a->is_num = 1;
}

void utl_span_ctx(const utl_span *s, utl_trace_ctx *out) {
  memcpy(out->trace_id, s->trace_id, sizeof out->trace_id);
  memcpy(out->span_id, s->span_id, sizeof out->span_id);
  out->sampled = 1;
}

int utl_http_url_parse(const char *url, char *host, size_t hcap, int *port, char *path, size_t pcap, char *why,
                       size_t whylen) {
  const char *p = url && !strncmp(url, "http://", 7) ? url + 7 : NULL;
  if (!p) return snprintf(why, whylen, "expected http://HOST[:PORT]/PATH (https is not supported)"), -1;
  size_t h = strcspn(p, ":/");
  if (!h || h >= hcap) return snprintf(why, whylen, "the host is empty or longer than %zu bytes", hcap - 1), -1;
  memcpy(host, p, h);
  host[h] = 0;
  p += h;
  *port = 80;
  if (*p == ':') {
    char *end;
    long v = strtol(p + 1, &end, 10);
    if (end == p + 1 || v < 1 || v > 65535 || (*end && *end != '/'))
      return snprintf(why, whylen, "the port is not a number 1..65535"), -1;
    *port = (int)v;
    p = end;
  }
  const char *rest = *p ? p : "/";
  if (strlen(rest) >= pcap) return snprintf(why, whylen, "the path is longer than %zu bytes", pcap - 1), -1;
  for (const char *c = rest; *c; c++)
    if (*c <= ' ' || *c == 0x7f) return snprintf(why, whylen, "the path holds a space or a control character"), -1;
  snprintf(path, pcap, "%s", rest);
  return 0;
}

// ---- exporter ----

struct utl_tracer {
  char host[128], path[128], service[64];
  int port, flush_ms;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  utl_span *q;       // (owned) (cap) a ring: n spans from head
  utl_span *out;     // (owned) (BATCH_SPANS) the batch being posted
  int cap, head, n;
  int stopping;
  pthread_t thread;
  unsigned long long exported, dropped, failed;
};

static void json_str(utl_buf *b, const char *s) {
  utl_buf_adds(b, "\"");
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') utl_buf_printf(b, "\\%c", *c);
    else if (*c < 0x20) utl_buf_printf(b, "\\u%04x", *c);
    else utl_buf_add(b, c, 1);
  }
  utl_buf_adds(b, "\"");
}

// The OTLP/JSON ExportTraceServiceRequest of spans (n): ids in hex, times as decimal strings (int64 in proto3 JSON).
static void encode(const utl_tracer *t, const utl_span *spans, int n, utl_buf *b) {
  utl_buf_adds(b, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":\"service.name\",\"value\":{"
                  "\"stringValue\":");
  json_str(b, t->service);
  utl_buf_adds(b, "}}]},\"scopeSpans\":[{\"scope\":{\"name\":\"dserve\"},\"spans\":[");
  for (int i = 0; i < n; i++) {
    const utl_span *s = &spans[i];
    char tid[33], sid[17], pid[17];
    put_hex(tid, s->trace_id, 16);
    put_hex(sid, s->span_id, 8);
    put_hex(pid, s->parent_id, 8);
    int root = !strcmp(pid, "0000000000000000");
    utl_buf_printf(b, "%s{\"traceId\":\"%s\",\"spanId\":\"%s\",%s%s%s\"name\":", i ? "," : "", tid, sid,
                   root ? "" : "\"parentSpanId\":\"", root ? "" : pid, root ? "" : "\",");
    json_str(b, s->name);
    utl_buf_printf(b, ",\"kind\":%d,\"startTimeUnixNano\":\"%lld\",\"endTimeUnixNano\":\"%lld\",\"attributes\":[",
                   s->kind, (long long)s->start_ns, (long long)s->end_ns);
    for (int k = 0; k < s->n_attrs; k++) {
      const utl_span_attr *a = &s->attrs[k];
      utl_buf_adds(b, k ? ",{\"key\":" : "{\"key\":");
      json_str(b, a->key);
      if (a->is_num && a->num == (double)(long long)a->num) utl_buf_printf(b, ",\"value\":{\"intValue\":\"%lld\"}}", (long long)a->num);
      else if (a->is_num) utl_buf_printf(b, ",\"value\":{\"doubleValue\":%.17g}}", a->num);
      else {
        utl_buf_adds(b, ",\"value\":{\"stringValue\":");
        json_str(b, a->str);
        utl_buf_adds(b, "}}");
      }
    }
    utl_buf_printf(b, "],\"status\":{%s}}", s->error ? "\"code\":2" : "");
  }
  utl_buf_adds(b, "]}]}]}");
}

// One POST of body; 0 when the collector answered 2xx.
static int post(const utl_tracer *t, const char *body, size_t len) {
  char port[16];
  snprintf(port, sizeof port, "%d", t->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(t->host, port, &hints, &ai) || !ai) return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), rc = -1;
  struct timeval tv = {.tv_sec = IO_TIMEOUT_MS / 1000, .tv_usec = (IO_TIMEOUT_MS % 1000) * 1000};
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); // connect honours it too
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
    char head[512];
    int k = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     t->path, t->host, t->port, len);
    char status[64] = "";
    if (utl_send_all(fd, head, (size_t)k) == 0 && utl_send_all(fd, body, len) == 0) {
      size_t got = 0;
      while (got < sizeof status - 1) {
        ssize_t r = recv(fd, status + got, sizeof status - 1 - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
        if (memchr(status, '\n', got)) break;
      }
      status[got] = 0;
      char rest[4096]; // the rest of the answer, to its end (Connection: close): closing with it unread resets
      for (size_t more = 0; more < (64u << 10);) {
        ssize_t r = recv(fd, rest, sizeof rest, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        more += (size_t)r;
      }
      int code = 0;
      if (sscanf(status, "HTTP/1.%*d %d", &code) == 1 && code >= 200 && code < 300) rc = 0;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(ai);
  return rc;
}

// Takes up to BATCH_SPANS spans off the queue into t->out (mu held); returns how many.
static int take_locked(utl_tracer *t) {
  int k = t->n < BATCH_SPANS ? t->n : BATCH_SPANS;
  for (int i = 0; i < k; i++) t->out[i] = t->q[(t->head + i) % t->cap];
  t->head = (t->head + k) % t->cap;
  t->n -= k;
  return k;
}

static void *exporter_main(void *arg) {
  utl_tracer *t = arg;
  int warned = 0;
  int64_t stop_by = 0;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    if (!t->n && t->stopping) break;
    if (t->stopping && !stop_by) stop_by = utl_now_ms() + STOP_FLUSH_MS;
    if (stop_by && utl_now_ms() > stop_by) break;
    if (t->n < BATCH_SPANS && !t->stopping) { // wait for a full batch or flush_ms
      struct timespec dl = utl_deadline_ms(t->flush_ms);
      pthread_cond_timedwait(&t->cv, &t->mu, &dl);
      if (t->n < BATCH_SPANS && !t->stopping && !t->n) continue;
    }
    int k = take_locked(t);
    pthread_mutex_unlock(&t->mu);
    utl_buf b = {0};
    encode(t, t->out, k, &b);
    int ok = !b.oom && post(t, b.p, b.n) == 0;
    utl_buf_free(&b);
    if (!ok && !warned) {
      utl_warn("trace", "cannot post spans to http://%s:%d%s (counted as failed; said once)", t->host, t->port,
               t->path);
      warned = 1;
    }
    pthread_mutex_lock(&t->mu);
    if (ok) t->exported += (unsigned long long)k;
    else t->failed += (unsigned long long)k;
  }
  t->failed += (unsigned long long)t->n;
  t->n = 0;
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

int utl_tracer_new(const utl_tracer_opts *o, utl_tracer **out, char *err, size_t errlen) {
  *out = NULL;
  utl_tracer *t = calloc(1, sizeof *t);
  if (!t) return snprintf(err, errlen, "out of memory"), -1;
  char why[128];
  if (utl_http_url_parse(o->endpoint, t->host, sizeof t->host, &t->port, t->path, sizeof t->path, why, sizeof why)) {
    snprintf(err, errlen, "tracing endpoint %s: %s", o->endpoint ? o->endpoint : "(none)", why);
    free(t);
    return -1;
  }
  snprintf(t->service, sizeof t->service, "%s", o->service_name && o->service_name[0] ? o->service_name : "dserve");
  t->cap = o->queue_spans > 0 ? o->queue_spans : 4096;
  t->flush_ms = o->flush_ms > 0 ? o->flush_ms : 500;
  t->q = calloc((size_t)t->cap, sizeof *t->q);
  t->out = calloc(BATCH_SPANS, sizeof *t->out);
  pthread_mutex_init(&t->mu, NULL);
  utl_cond_init_monotonic(&t->cv); // the exporter waits on it up to flush_ms
  if (!t->q || !t->out || pthread_create(&t->thread, NULL, exporter_main, t)) {
    snprintf(err, errlen, "cannot start the span exporter: %s", !t->q || !t->out ? "out of memory" : strerror(errno));
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->q);
    free(t->out);
    free(t);
    return -1;
  }
  *out = t;
  return 0;
}

void utl_tracer_free(utl_tracer *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->stopping = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  pthread_join(t->thread, NULL);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  free(t->q);
  free(t->out);
  free(t);
}

int utl_tracer_submit(utl_tracer *t, const utl_span *s) {
  if (!t) return -1;
  pthread_mutex_lock(&t->mu);
  int ok = t->n < t->cap && !t->stopping;
  if (ok) t->q[(t->head + t->n++) % t->cap] = *s;
  else t->dropped++;
  if (t->n >= BATCH_SPANS) pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
  return ok ? 0 : -1;
}

void utl_tracer_counts(utl_tracer *t, unsigned long long *exported, unsigned long long *dropped,
                       unsigned long long *failed) {
  pthread_mutex_lock(&t->mu);
  *exported = t->exported;
  *dropped = t->dropped;
  *failed = t->failed;
  pthread_mutex_unlock(&t->mu);
}
