// router/observe.c: what the router tells of its work: one access-log line per request, a stats line every
// logging.stats_interval_s while there is work (the router's and each worker's), the phase histograms (queue,
// prefill, transfer, decode), each worker's labelled series, and a request's trace spans (the workers send theirs
// under the same trace: the generate messages carry its traceparent). docs/observability.md describes every line,
// series and span.
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/server_int.h"
#include "util/log.h"

void rtr_observe_metrics(rtr_server *s, const double *bounds, int n_bounds) {
  rtr_metrics *m = s->m;
  s->m_prefill_time = rtr_metrics_histogram(
      m, "dserve:request_prefill_time_seconds",
      "Prefill phase per choice: from the receipt of the request by the worker that computes the prompt (the prefill "
      "worker of a handed-off choice) to its first token sampled: that worker's queue and compute.",
      NULL, bounds, n_bounds);
  s->m_transfer_time = rtr_metrics_histogram(
      m, "dserve:request_transfer_time_seconds",
      "KV transfer per handed-off choice not hidden under prefill compute: from the prefill worker's first token to "
      "the decode worker holding the whole prompt's KV (dserve:kv_transfer_time_seconds minus the prefill phase).",
      NULL, bounds, n_bounds);
  s->m_decode_time = rtr_metrics_histogram(m, "dserve:request_decode_time_seconds",
                                           "Decode phase per choice: from its first token to its last, at the router.",
                                           NULL, bounds, n_bounds);
  s->m_migrations = rtr_metrics_counter(m, "dserve:migrations_total",
                                        "Choices moved to another worker mid-request (worker died, went silent or "
                                        "drained).",
                                        NULL);
  s->m_handoffs = rtr_metrics_counter(m, "dserve:kv_handoffs_total",
                                      "Choices whose prompt KV moved from a prefill worker to a decode worker.", NULL);
  // vLLM's names with dserve's prefix; the mean acceptance length is accepted / drafts + 1 (the bonus token)
  s->m_spec_drafts = rtr_metrics_counter(m, "dserve:spec_decode_num_drafts_total",
                                         "Speculative decoding: drafts verified (steps in which a sequence proposed "
                                         "at least one token).", NULL);
  s->m_spec_drafted = rtr_metrics_counter(m, "dserve:spec_decode_num_draft_tokens_total",
                                          "Speculative decoding: tokens drafted.", NULL);
  s->m_spec_accepted = rtr_metrics_counter(m, "dserve:spec_decode_num_accepted_tokens_total",
                                           "Speculative decoding: drafted tokens verification accepted.", NULL);
}

// ---------------------------------------------------------------------------------------------------------------
// per-worker series and counts

static void worker_series(rtr_server *s, rtr_link *l) {
  if (l->m_w_running) return;
  char lab[160];
  snprintf(lab, sizeof lab, "worker=\"%s\",role=\"%s\"", l->cfg->name, cfg_role_name(l->cfg->role));
  rtr_metrics *m = s->m;
  l->m_w_running = rtr_metrics_gauge(m, "dserve:worker_num_requests_running",
                                     "Sequences each worker runs (its last stats, every second).", lab);
  l->m_w_waiting = rtr_metrics_gauge(m, "dserve:worker_num_requests_waiting",
                                     "Sequences queued at each worker (its last stats, every second).", lab);
  l->m_w_kv_usage = rtr_metrics_gauge(m, "dserve:worker_kv_cache_usage_perc",
                                      "Each worker's KV-cache blocks in use: held by sequences and cached (1 = full; "
                                      "its last stats).", lab);
  l->m_w_kv_running = rtr_metrics_gauge(m, "dserve:worker_kv_running_perc",
                                        "Each worker's KV-cache blocks held by its sequences (running, waiting, being "
                                        "handed off), cached blocks left out (1 = full; its last stats).", lab);
  l->m_w_kv_cached = rtr_metrics_gauge(m, "dserve:worker_kv_cached_perc",
                                       "Each worker's KV-cache blocks only its prefix cache holds: reusable, evicted "
                                       "when a sequence needs the room (1 = all; its last stats).", lab);
  l->m_w_prompt = rtr_metrics_counter(m, "dserve:worker_prompt_tokens_total",
                                      "Prompt tokens the router sent each worker to prefill.", lab);
  l->m_w_gen = rtr_metrics_counter(m, "dserve:worker_generation_tokens_total", "Tokens each worker generated.", lab);
  l->m_w_handoffs = rtr_metrics_counter(m, "dserve:worker_kv_handoffs_total",
                                        "KV handoffs each worker took part in (as the prefill or the decode side).",
                                        lab);
}

#define SPANS_DROPPED "dserve:trace_spans_dropped_total"
#define SPANS_DROPPED_HELP "Spans dropped because a process's export queue was full (tracing.queue_spans)."

// The shared KV tier's running totals of stats_ok, as counters {worker, role} (docs/observability.md).
static const struct {
  const char *name, *help;
  size_t off;
} KVS_SERIES[RTR_N_KVS] = {
    {"dserve:kvstore_read_blocks_total", "KV blocks each worker read from the shared store.",
     offsetof(prt_stats_ok, kvstore_read_blocks)},
    {"dserve:kvstore_read_bytes_total", "Payload bytes each worker read from the shared store.",
     offsetof(prt_stats_ok, kvstore_read_bytes)},
    {"dserve:kvstore_write_blocks_total", "KV blocks each worker wrote to the shared store (behind).",
     offsetof(prt_stats_ok, kvstore_write_blocks)},
    {"dserve:kvstore_write_bytes_total", "Payload bytes each worker wrote to the shared store.",
     offsetof(prt_stats_ok, kvstore_write_bytes)},
    {"dserve:kvstore_errors_total", "Failed round trips to the shared store (connection, AUTH, protocol).",
     offsetof(prt_stats_ok, kvstore_errors)},
    {"dserve:kvstore_timeouts_total", "Shared-store reads abandoned past kvstore.read_timeout_ms (recomputed).",
     offsetof(prt_stats_ok, kvstore_timeouts)},
    {"dserve:kvstore_mac_failures_total", "Shared-store values whose MAC did not verify (dropped, recomputed).",
     offsetof(prt_stats_ok, kvstore_mac_failures)},
    {"dserve:kvstore_mismatches_total", "Shared-store values of another model, type, layout, block or length.",
     offsetof(prt_stats_ok, kvstore_mismatches)},
    {"dserve:kvstore_queue_drops_total", "Blocks dropped because the write-behind queue was full or the store down.",
     offsetof(prt_stats_ok, kvstore_queue_drops)},
};

static void kvstore_series(rtr_server *s, rtr_link *l, const prt_stats_ok *m) {
  for (int i = 0; i < RTR_N_KVS; i++) {
    double v = *(const double *)((const char *)m + KVS_SERIES[i].off);
    if (v < 0) continue; // a worker without the tier
    if (!l->m_w_kvs[i]) {
      char lab[160];
      snprintf(lab, sizeof lab, "worker=\"%s\",role=\"%s\"", l->cfg->name, cfg_role_name(l->cfg->role));
      l->m_w_kvs[i] = rtr_metrics_counter(s->m, KVS_SERIES[i].name, KVS_SERIES[i].help, lab);
    }
    rtr_metric_add(l->m_w_kvs[i], v >= l->kvs_last[i] ? v - l->kvs_last[i] : v); // a restarted worker counts anew
    l->kvs_last[i] = v;
  }
  if (m->kvstore_up < 0) return;
  if (!l->m_w_kvs_up) {
    char lab[160];
    snprintf(lab, sizeof lab, "worker=\"%s\",role=\"%s\"", l->cfg->name, cfg_role_name(l->cfg->role));
    l->m_w_kvs_up = rtr_metrics_gauge(s->m, "dserve:kvstore_up",
                                      "1 while a worker's last round trip to the shared store succeeded.", lab);
  }
  rtr_metric_set(l->m_w_kvs_up, m->kvstore_up);
}

void rtr_observe_stats_locked(rtr_server *s, rtr_link *l, const prt_stats_ok *m) {
  worker_series(s, l);
  kvstore_series(s, l, m);
  if (m->trace_spans_dropped >= 0) { // a running total: what it grew by (a restarted worker counts anew)
    if (!l->m_w_spans_dropped) {
      char lab[160];
      snprintf(lab, sizeof lab, "worker=\"%s\",role=\"%s\"", l->cfg->name, cfg_role_name(l->cfg->role));
      l->m_w_spans_dropped = rtr_metrics_counter(s->m, SPANS_DROPPED, SPANS_DROPPED_HELP, lab);
    }
    double v = m->trace_spans_dropped, last = l->spans_dropped_last;
    rtr_metric_add(l->m_w_spans_dropped, v >= last ? v - last : v);
    l->spans_dropped_last = v;
  }
  rtr_metric_set(l->m_w_running, l->running);
  rtr_metric_set(l->m_w_waiting, l->waiting);
  rtr_metric_set(l->m_w_kv_usage,
                 l->total_blocks > 0 ? (double)(l->total_blocks - l->free_blocks) / l->total_blocks : 0);
  rtr_metric_set(l->m_w_kv_running, rtr_link_kv_running(l));
  rtr_metric_set(l->m_w_kv_cached, l->total_blocks > 0 ? (double)l->evictable_blocks / l->total_blocks : 0);
}

static void count_prompt(rtr_server *s, int li, double n) {
  if (li < 0) return;
  rtr_link *l = &s->links[li];
  worker_series(s, l);
  l->n_prompt_tokens += n;
  rtr_metric_add(l->m_w_prompt, n);
}

// ---------------------------------------------------------------------------------------------------------------
// tracing

static int64_t unix_ns_of_us(int64_t mono_us) { return utl_unix_ns_of(mono_us * 1000); }

void rtr_observe_begin(rtr_server *s, rtr_req *r, const char *traceparent) {
  if (!s->tracer) return;
  utl_trace_ctx in;
  if (traceparent && utl_traceparent_parse(traceparent, &in) == 0) { // continue the caller's trace
    r->traced = in.sampled;
    memcpy(r->trace.trace_id, in.trace_id, sizeof in.trace_id);
    memcpy(r->parent_span, in.span_id, sizeof in.span_id);
  } else { // a new trace (an invalid traceparent starts one too, as the W3C spec asks)
    if (traceparent) utl_debug(LOGC, "traceparent '%.80s' is not valid: a new trace starts", traceparent);
    uint32_t draw;
    utl_trace_new_id((uint8_t *)&draw, sizeof draw);
    r->traced = (double)draw / 4294967296.0 < s->cfg->tracing.sample_ratio;
    utl_trace_new_id(r->trace.trace_id, sizeof r->trace.trace_id);
  }
  utl_trace_new_id(r->trace.span_id, sizeof r->trace.span_id); // the request span's
  r->trace.sampled = 1;
}

void rtr_observe_traceparent(const rtr_req *r, char out[UTL_TRACEPARENT_LEN + 1]) {
  if (!r->traced) out[0] = 0;
  else utl_traceparent_format(&r->trace, out);
}

static void submit(rtr_server *s, const utl_span *sp) {
  if (utl_tracer_submit(s->tracer, sp) < 0) rtr_metric_add(s->m_spans_dropped, 1);
}

// ---------------------------------------------------------------------------------------------------------------
// a choice's life

static void add_worker(rtr_choice *c, const char *text) {
  size_t n = strlen(c->workers);
  snprintf(c->workers + n, sizeof c->workers - n, "%s", text);
}

void rtr_observe_routed_locked(rtr_server *s, rtr_req *r, int ci) {
  rtr_choice *c = &r->ch[ci];
  c->t_sent_us = utl_now_us();
  c->kv_bytes = c->kv_ms = c->prefill_ms = -1;
  if (c->workers[0]) add_worker(c, ",");
  if (c->plink >= 0) {
    add_worker(c, s->links[c->plink].cfg->name);
    add_worker(c, ">");
  }
  if (c->link >= 0) add_worker(c, s->links[c->link].cfg->name);
  count_prompt(s, c->plink >= 0 ? c->plink : c->link, c->n_prompt + c->n_gen);
}

void rtr_observe_moved_locked(rtr_server *s, rtr_req *r, int ci) {
  r->ch[ci].t_move_us = utl_now_us();
  rtr_metric_add(s->m_migrations, 1);
}

void rtr_observe_token_locked(rtr_server *s, rtr_req *r, int ci, int n_tokens, int64_t now_us) {
  rtr_choice *c = &r->ch[ci];
  if (!c->t_first_us) c->t_first_us = now_us;
  if (c->link >= 0 && n_tokens > 0) {
    rtr_link *l = &s->links[c->link];
    worker_series(s, l);
    l->n_gen_tokens += n_tokens;
    rtr_metric_add(l->m_w_gen, n_tokens);
  }
  if (c->t_move_us) { // the move is over: its new worker streams
    if (r->traced && s->tracer) {
      utl_span sp;
      utl_span_init(&sp, &r->trace, "migration", UTL_SPAN_INTERNAL, unix_ns_of_us(c->t_move_us),
                    unix_ns_of_us(now_us));
      utl_span_str(&sp, "dserve.choice", c->id);
      utl_span_str(&sp, "dserve.workers", c->workers);
      utl_span_num(&sp, "dserve.tokens_before", c->n_gen);
      submit(s, &sp);
    }
    c->t_move_us = 0;
  }
}

void rtr_observe_done_locked(rtr_server *s, rtr_req *r, int ci, const prt_done *m) {
  rtr_choice *c = &r->ch[ci];
  int64_t now = utl_now_us();
  c->kv_bytes = m->kv_bytes;
  c->kv_ms = m->kv_ms;
  c->prefill_ms = m->prefill_ms;
  c->spec_drafted += m->spec_drafted; // a moved choice's workers each report theirs
  c->spec_accepted += m->spec_accepted;
  if (m->spec_drafts > 0) {
    rtr_metric_add(s->m_spec_drafts, (double)m->spec_drafts);
    rtr_metric_add(s->m_spec_drafted, (double)m->spec_drafted);
    rtr_metric_add(s->m_spec_accepted, (double)m->spec_accepted);
  }
  if (m->kv_bytes > 0) rtr_metric_add(s->m_kv_bytes, m->kv_bytes);
  int handoff = c->plink >= 0 && m->kv_ms >= 0;
  if (handoff) {
    rtr_metric_observe(s->m_kv_time, m->kv_ms / 1000.0);
    rtr_metric_add(s->m_handoffs, 1);
    int sides[2] = {c->plink, c->link};
    for (int k = 0; k < 2; k++) {
      rtr_link *l = &s->links[sides[k]];
      worker_series(s, l);
      l->n_handoffs++;
      rtr_metric_add(l->m_w_handoffs, 1);
    }
  }
  if (m->prefill_ms >= 0) rtr_metric_observe(s->m_prefill_time, m->prefill_ms / 1000.0);
  else if (c->plink < 0 && c->t_first_us && c->t_sent_us && c->t_first_us >= c->t_sent_us)
    rtr_metric_observe(s->m_prefill_time, (double)(c->t_first_us - c->t_sent_us) / 1e6);
  if (handoff && m->prefill_ms >= 0) rtr_metric_observe(s->m_transfer_time, fmax(0, m->kv_ms - m->prefill_ms) / 1000.0);
  if (c->t_first_us) rtr_metric_observe(s->m_decode_time, (double)(now - c->t_first_us) / 1e6);
}

// ---------------------------------------------------------------------------------------------------------------
// the access log line and the request's spans

void rtr_observe_end(rtr_server *s, rtr_req *r, int status) {
  int64_t now = utl_now_us();
  pthread_mutex_lock(&s->mu);
  int comp = 0, cached = 0, cached_store = 0, moves = 0;
  double kvb = 0, drafted = 0, accepted = 0;
  char workers[256] = "", finish[16] = "";
  int routed = 0;
  for (int i = 0; r->ch && i < r->n_ch; i++) {
    const rtr_choice *c = &r->ch[i];
    comp += c->completion_tokens;
    if (c->cached_tokens > cached) cached = c->cached_tokens, cached_store = c->cached_store_tokens;
    moves += c->resends;
    if (c->kv_bytes > 0) kvb += c->kv_bytes;
    drafted += (double)c->spec_drafted;
    accepted += (double)c->spec_accepted;
    size_t n = strlen(workers);
    snprintf(workers + n, sizeof workers - n, "%s%s", i ? ";" : "", c->workers[0] ? c->workers : "-");
    routed |= c->workers[0] != 0;
    if (!i) snprintf(finish, sizeof finish, "%s", c->finish);
  }
  if (!routed) workers[0] = 0; // refused before any worker: "" as for a request refused before its choices
  double ttft = r->t_first_us ? (double)(r->t_first_us - r->t_arrival_us) / 1000.0 : NAN;
  double queue = r->t_admit_us ? (double)(r->t_admit_us - r->t_arrival_us) / 1000.0 : NAN;
  double total = (double)(now - r->t_arrival_us) / 1000.0;
  char trace[33] = "";
  if (r->traced)
    for (int i = 0; i < 16; i++) snprintf(trace + 2 * i, 3, "%02x", r->trace.trace_id[i]);
  utl_log_field f[] = {
      UTL_LF_S("id", r->id[0] ? r->id : "-"), UTL_LF_S("route", r->route ? r->route : "-"), UTL_LF_N("status", status),
      UTL_LF_S("error", status >= 400 && r->err.code[0] ? r->err.code : ""), UTL_LF_N("n", r->q.n),
      UTL_LF_N("stream", r->q.stream), UTL_LF_N("prompt_tokens", r->n_prompt), UTL_LF_N("completion_tokens", comp),
      UTL_LF_N("cached_tokens", cached), UTL_LF_N("cached_store_tokens", cached_store), UTL_LF_S("finish", finish), UTL_LF_N("queue_ms", queue),
      UTL_LF_N("ttft_ms", ttft), UTL_LF_N("total_ms", total), UTL_LF_S("workers", workers),
      UTL_LF_N("kv_bytes", kvb), UTL_LF_N("migrations", moves), UTL_LF_N("spec_drafted", drafted),
      UTL_LF_N("spec_accepted", accepted), UTL_LF_S("trace_id", trace)};
  if (r->traced && s->tracer) {
    utl_trace_ctx parent = r->trace;
    memcpy(parent.span_id, r->parent_span, sizeof parent.span_id);
    utl_span req;
    utl_span_init(&req, &parent, "request", UTL_SPAN_SERVER, unix_ns_of_us(r->t_arrival_us), unix_ns_of_us(now));
    memcpy(req.span_id, r->trace.span_id, sizeof req.span_id); // the id its children were given
    utl_span_str(&req, "http.route", r->route ? r->route : "");
    utl_span_num(&req, "http.response.status_code", status);
    utl_span_str(&req, "dserve.request_id", r->id);
    utl_span_num(&req, "gen_ai.usage.input_tokens", r->n_prompt);
    utl_span_num(&req, "gen_ai.usage.output_tokens", comp);
    utl_span_str(&req, "dserve.workers", workers);
    req.error = status >= 500;
    submit(s, &req);
    if (r->t_admit_us) {
      utl_span q;
      utl_span_init(&q, &r->trace, "queue", UTL_SPAN_INTERNAL, unix_ns_of_us(r->t_arrival_us),
                    unix_ns_of_us(r->t_admit_us));
      utl_span_num(&q, "dserve.prompt_tokens", r->n_prompt);
      submit(s, &q);
    }
  }
  pthread_mutex_unlock(&s->mu);
  utl_log_fields(LOGC, "access", f, (int)(sizeof f / sizeof f[0]));
}

// ---------------------------------------------------------------------------------------------------------------
// the stats lines

typedef struct stats_prev {
  double prompt, gen, hits, queries, handoffs; // counts at the last line
} stats_prev;

typedef struct stats_line {
  char worker[64];
  const char *role;
  double prompt_s, gen_s, running, waiting, kv_pct, hit_pct, handoffs;
} stats_line;

static double pct(double part, double whole) { return whole > 0 && part > 0 ? 100.0 * part / whole : 0; }

static void log_line(const stats_line *x) {
  utl_log_field f[] = {UTL_LF_S("worker", x->worker),         UTL_LF_S("role", x->role),
                       UTL_LF_N("prompt_tok_s", x->prompt_s), UTL_LF_N("gen_tok_s", x->gen_s),
                       UTL_LF_N("running", x->running),       UTL_LF_N("waiting", x->waiting),
                       UTL_LF_N("kv_usage_pct", x->kv_pct),   UTL_LF_N("prefix_hit_pct", x->hit_pct),
                       UTL_LF_N("handoffs", x->handoffs)};
  utl_log_fields(LOGC, "stats", f, (int)(sizeof f / sizeof f[0]));
}

// Fills lines[0] (the router) and lines[1..] (each worker up) from what changed since prev (cap_links + 1); returns how
// many, or 0 when there was no work (no token, nothing running or waiting). s->mu held.
static int collect_locked(rtr_server *s, stats_prev *prev, double secs, stats_line *lines) {
  double prompt = rtr_metric_value(s->m_prompt), gen = rtr_metric_value(s->m_gen);
  double hits = rtr_metric_value(s->m_prefix_hits), queries = rtr_metric_value(s->m_prefix_queries);
  double handoffs = rtr_metric_value(s->m_handoffs);
  stats_line *x = &lines[0];
  snprintf(x->worker, sizeof x->worker, "router");
  x->role = "router";
  x->prompt_s = (prompt - prev[0].prompt) / secs;
  x->gen_s = (gen - prev[0].gen) / secs;
  x->running = s->running_slots;
  x->waiting = s->n_waiting;
  x->kv_pct = 100.0 * rtr_metric_value(s->m_kv_usage);
  x->hit_pct = pct(hits - prev[0].hits, queries - prev[0].queries);
  x->handoffs = handoffs - prev[0].handoffs;
  int work = x->prompt_s > 0 || x->gen_s > 0 || x->running > 0 || x->waiting > 0;
  prev[0] = (stats_prev){prompt, gen, hits, queries, handoffs};
  int n = 1;
  for (int i = 0; i < s->n_links; i++) {
    rtr_link *l = &s->links[i];
    stats_prev *p = &prev[i + 1], now = {l->n_prompt_tokens, l->n_gen_tokens, l->prefix_hits, l->prefix_queries,
                                         l->n_handoffs};
    if (l->up) {
      x = &lines[n++];
      snprintf(x->worker, sizeof x->worker, "%s", l->cfg->name);
      x->role = cfg_role_name(l->cfg->role);
      x->prompt_s = (now.prompt - p->prompt) / secs;
      x->gen_s = (now.gen - p->gen) / secs;
      x->running = l->running;
      x->waiting = l->waiting;
      x->kv_pct = l->total_blocks > 0 ? pct(l->total_blocks - l->free_blocks, l->total_blocks) : 0;
      x->hit_pct = pct(now.hits - p->hits, now.queries - p->queries);
      x->handoffs = now.handoffs - p->handoffs;
      work |= x->running > 0 || x->waiting > 0;
    }
    *p = now;
  }
  return work ? n : 0;
}

// prev and lines (cap + 1 each) grown to s->cap_links + 1 (new links start from zero). 0, or -1 out of memory.
static int fit_locked(rtr_server *s, stats_prev **prev, stats_line **lines, int *cap) {
  if (*prev && *lines && *cap >= s->cap_links) return 0;
  stats_prev *np = realloc(*prev, (size_t)(s->cap_links + 1) * sizeof *np);
  if (np) *prev = np;
  stats_line *nl = np ? realloc(*lines, (size_t)(s->cap_links + 1) * sizeof *nl) : NULL;
  if (nl) *lines = nl;
  if (!np || !nl) return -1;
  int from = *cap ? *cap + 1 : 0;
  memset(np + from, 0, (size_t)(s->cap_links + 1 - from) * sizeof *np);
  *cap = s->cap_links;
  return 0;
}

static void *stats_main(void *arg) {
  rtr_server *s = arg;
  int64_t every_ms = (int64_t)s->cfg->logging.stats_interval_s * 1000;
  // every slot a link may take (cap_links): members that join through discovery grow it while this runs
  stats_prev *prev = NULL;
  stats_line *lines = NULL;
  int cap = 0;
  pthread_mutex_lock(&s->mu);
  if (fit_locked(s, &prev, &lines, &cap) < 0) {
    pthread_mutex_unlock(&s->mu);
    utl_warn(LOGC, "out of memory: no stats lines");
    free(prev);
    free(lines);
    return NULL;
  }
  collect_locked(s, prev, 1, lines); // the counts so far are the baseline
  int64_t last = utl_now_ms();
  while (!s->stopping) {
    int64_t due = last + every_ms;
    while (!s->stopping && utl_now_ms() < due) {
      struct timespec dl = utl_deadline_ms((int)(due - utl_now_ms()));
      pthread_cond_timedwait(&s->link_cv, &s->mu, &dl);
    }
    if (s->stopping) break;
    int64_t now = utl_now_ms();
    if (fit_locked(s, &prev, &lines, &cap) < 0) { // out of memory: the next interval tries again
      last = now;
      continue;
    }
    int n = collect_locked(s, prev, (double)(now - last) / 1000.0, lines);
    last = now;
    pthread_mutex_unlock(&s->mu); // the lines go out without the router's lock
    for (int i = 0; i < n; i++) log_line(&lines[i]);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  free(prev);
  free(lines);
  return NULL;
}

int rtr_observe_start(rtr_server *s, char *err, size_t errlen) {
  const cfg_tracing *t = &s->cfg->tracing;
  if (t->endpoint[0]) {
    char svc[96];
    snprintf(svc, sizeof svc, "%s-router", t->service_name);
    utl_tracer_opts o = {.endpoint = t->endpoint, .service_name = svc, .queue_spans = t->queue_spans,
                         .flush_ms = t->flush_ms};
    if (utl_tracer_new(&o, &s->tracer, err, errlen) < 0) return -1;
    s->m_spans_dropped = rtr_metrics_counter(s->m, SPANS_DROPPED, SPANS_DROPPED_HELP,
                                             "worker=\"router\",role=\"router\"");
    utl_log(LOGC, "tracing to %s (sample ratio %g for requests without a traceparent)", t->endpoint,
            t->sample_ratio);
  }
  if (s->cfg->logging.stats_interval_s > 0 && pthread_create(&s->stats_thread, NULL, stats_main, s) == 0)
    s->has_stats_thread = 1;
  return 0;
}

void rtr_observe_stop(rtr_server *s) {
  if (s->has_stats_thread) pthread_join(s->stats_thread, NULL); // s->stopping is set and link_cv broadcast
  s->has_stats_thread = 0;
  utl_tracer_free(s->tracer);
  s->tracer = NULL;
}
