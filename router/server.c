// router/server.c: the router's construction and teardown: config, tokenizer and template, metrics, worker links,
// the HTTP daemon, each layer's hooks; the drain on SIGTERM and the free.
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "models/chat.h"
#include "models/jinja.h"
#include "models/llama.h"
#include "router/server_int.h"
#include "util/err.h"
#include "util/log.h"

#define DRAIN_FLUSH_MS 1000  // after the drain bound, how long failed streams get to send their error event

static void make_metrics(rtr_server *s) {
  static const double lat[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
                               20, 40, 80};
  static const double itl[] = {0.001, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                               0.75, 1, 2.5, 5};
  rtr_metrics *m = s->m;
  s->m_running =
      rtr_metrics_gauge(m, "dserve:num_requests_running",
                        "Choices sent to workers and not finished (the router's admission slots in use).", NULL);
  s->m_waiting =
      rtr_metrics_gauge(m, "dserve:num_requests_waiting", "Requests waiting in the router's admission queue.", NULL);
  s->m_kv_usage = rtr_metrics_gauge(
      m, "dserve:kv_cache_usage_perc",
      "KV-cache blocks in use across the workers up (1 = full; their last stats, every second).", NULL);
  s->m_prompt = rtr_metrics_counter(m, "dserve:prompt_tokens_total",
                                    "Prompt tokens of admitted requests (once per request, whatever its n).", NULL);
  s->m_gen = rtr_metrics_counter(m, "dserve:generation_tokens_total",
                                 "Tokens generated, every choice, as the router receives them.", NULL);
  s->m_prefix_hits =
      rtr_metrics_counter(m, "dserve:prefix_cache_hits_total",
                          "Prompt tokens the workers found in their prefix caches (their stats, every second).", NULL);
  s->m_prefix_queries = rtr_metrics_counter(
      m, "dserve:prefix_cache_queries_total",
      "Prompt tokens the workers looked up in their prefix caches (their stats, every second).", NULL);
  s->m_kv_bytes = rtr_metrics_counter(
      m, "dserve:kv_transfer_bytes_total",
      "KV bytes handoffs moved from prefill to decode workers (the decode worker's count, per finished choice).", NULL);
  s->m_kv_pushed = rtr_metrics_counter(m, "dserve:kv_pushed_bytes_total",
                                       "KV bytes prefill workers wrote (their stats, every second).", NULL);
  s->m_ok_stop = rtr_metrics_counter(m, "dserve:request_success_total",
                                     "Choices finished, by finish reason (a tool call counts as stop).",
                                     "finished_reason=\"stop\"");
  s->m_ok_length = rtr_metrics_counter(m, "dserve:request_success_total", "", "finished_reason=\"length\"");
  s->m_fail = rtr_metrics_counter(m, "dserve:request_failure_total", "Requests that failed or were cancelled.", NULL);
  s->m_slow_ended = rtr_metrics_counter(m, "dserve:streams_ended_slow_total",
                                        "Streams ended because their client stopped reading (router.stream_queue_bytes).",
                                        NULL);
  s->m_auth_failures = rtr_metrics_counter(m, "dserve:auth_failures_total",
                                           "Connections refused for want of the shared secret (workers' control and "
                                           "kvxfer ports, the router's links).",
                                           NULL);
  int nl = (int)(sizeof lat / sizeof lat[0]), ni = (int)(sizeof itl / sizeof itl[0]);
  s->m_ttft = rtr_metrics_histogram(m, "dserve:time_to_first_token_seconds",
                                    "Time from a request's arrival at the router to its first token (any choice).",
                                    NULL, lat, nl);
  s->m_itl = rtr_metrics_histogram(
      m, "dserve:inter_token_latency_seconds",
      "Time between consecutive tokens of a choice at the router (a message of k tokens counts as k gaps of 1/k).",
      NULL, itl, ni);
  s->m_e2e = rtr_metrics_histogram(
      m, "dserve:e2e_request_latency_seconds",
      "Time from a successful request's arrival at the router to the end of its last choice.", NULL, lat, nl);
  s->m_queue = rtr_metrics_histogram(m, "dserve:request_queue_time_seconds",
                                     "Time from a request's arrival at the router (body read) to its admission: "
                                     "parsing, tokenizing and the wait for admission slots.",
                                     NULL, lat, nl);
  s->m_kv_time = rtr_metrics_histogram(m, "dserve:kv_transfer_time_seconds",
                                       "Handoff time per handed-off choice: from the decode worker's receipt of the "
                                       "request to its holding the whole prompt's KV. Includes the prefill worker's "
                                       "queue and compute, which the layer-wise transfer overlaps (the parts: "
                                       "dserve:request_prefill_time_seconds, dserve:request_transfer_time_seconds).",
                                       NULL, lat, nl);
  rtr_observe_metrics(s, lat, nl);
}

// A Jinja chat template file's text (malloc'ed, *n bytes), or NULL with err naming the file.
static char *read_template(const char *path, size_t *n, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  char *t = NULL;
  if (!f) {
    utl_seterr(err, errlen, "chat template file %s: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  long len = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) ? (long)st.st_size : -1;
  if (len <= 0 || (size_t)len > MDL_JINJA_MAX_TEMPLATE)
    utl_seterr(err, errlen, "chat template file %s: %s", path,
               len < 0 ? "is not a regular file" : len == 0 ? "is empty" : "is larger than 1 MiB");
  else if (!(t = malloc((size_t)len + 1)))
    utl_seterr(err, errlen, "out of memory");
  else if (fread(t, 1, (size_t)len, f) != (size_t)len) {
    utl_seterr(err, errlen, "chat template file %s: cannot be read", path);
    free(t);
    t = NULL;
  }
  fclose(f);
  if (t) t[*n = (size_t)len] = 0;
  return t;
}

// The template chats render with, in this order: the config's chat_template family (--chat-template), the config's
// chat_template_file (--chat-template-file) or the GGUF's tokenizer.chat_template run as Jinja (s->jinja), else
// ChatML when the vocabulary has its tokens (s->chat); neither: not a chat model. A Jinja template that does not parse
// fails the start naming its source and line; so does an unknown family or one whose end-of-turn token the vocabulary
// lacks or the workers would not stop on.
static int resolve_chat(rtr_server *s, const rtr_server_opts *o, char *err, size_t errlen) {
  char e[384];
  const char *fam = o->cfg->chat_template, *file = o->cfg->chat_template_file;
  mdl_str gt = {0};
  int in_gguf = o->gguf && mdl_gguf_get_str(o->gguf, "tokenizer.chat_template", &gt) == 0;
  if (!fam[0] && (file[0] || in_gguf)) {
    size_t n = 0;
    char *text = file[0] ? read_template(file, &n, err, errlen) : NULL;
    if (file[0] && !text) return -1;
    const char *src = text ? text : gt.p;
    n = text ? n : (size_t)gt.n;
    int rc = mdl_jinja_parse(src, n, &s->jinja, e, sizeof e);
    if (rc == 0) s->jinja_tools = mdl_chat_tool_style_detect(src, n);
    free(text);
    if (rc != 0) {
      utl_seterr(err, errlen, "chat template %s%s does not parse: %s", file[0] ? "file " : "",
                 file[0] ? file : "(the GGUF's tokenizer.chat_template)", e);
      return -1;
    }
    snprintf(s->chat_source, sizeof s->chat_source, "%s%s (Jinja)", file[0] ? "the file " : "the GGUF's ",
             file[0] ? file : "tokenizer.chat_template");
    utl_log("router", "chats render with %s; tool calls: %s", s->chat_source,
            !mdl_jinja_uses_var(s->jinja, "tools") ? "none (the template does not read tools)"
            : s->jinja_tools                       ? s->jinja_tools->name
                                                   : "none (the template writes calls in no format known here)");
    return 0;
  }
  if (fam[0] && !(s->chat = mdl_chat_template_named(fam))) {
    utl_seterr(err, errlen, "chat_template '%.40s' is not a template family known here (%s)", fam,
               mdl_chat_template_names());
    return -1;
  }
  // Without a template, ChatML (SmolLM2's) is assumed only for a vocabulary that has its tokens: a base model such
  // as Gemma 3 270M would read ChatML's markup as text and answer garbage.
  if (!s->chat && o->tok && mdl_tok_find(o->tok, "<|im_start|>") >= 0 && mdl_tok_find(o->tok, "<|im_end|>") >= 0)
    s->chat = mdl_chat_template_named("chatml");
  if (!s->chat) // said at start-up: nothing else would tell the operator that chat is off until a client fails
    utl_log("router", "chats: no template: the GGUF has no tokenizer.chat_template and its vocabulary no ChatML tokens "
            "(a base model?); chat requests get 400 model_not_chat, completions work; --chat-template NAME (%s) or "
            "--chat-template-file F gives it one", mdl_chat_template_names());
  if (!s->chat || !o->tok) return 0;
  int32_t eot = mdl_tok_find(o->tok, s->chat->eot);
  if (eot < 0 || !mdl_tok_is_eog(o->tok, eot)) {
    utl_seterr(err, errlen, "chat template %s: the model's turns end with %s, which the vocabulary %s", s->chat->name,
               s->chat->eot, eot < 0 ? "does not have" : "does not mark as an end of generation");
    return -1;
  }
  snprintf(s->chat_source, sizeof s->chat_source, "the %s family (%s)", s->chat->name,
           fam[0] ? "config chat_template" : "fallback: no template in the GGUF, ChatML's tokens in its vocabulary");
  utl_log("router", "chats render with %s%s%s", s->chat_source, fam[0] && file[0] ? "; chat_template_file not used: "
          "chat_template wins, " : "", fam[0] && file[0] ? file : "");
  return 0;
}

// /v1/embeddings: the pooling the GGUF asks for and the model's width, or why embeddings are refused (a pooling
// this server does not compute: none gives a vector per token and rank a score, neither an OpenAI embedding, as
// llama-server refuses them on /v1/embeddings).
static void embeddings_init(rtr_server *s, const mdl_gguf *g) {
  char err[160] = "", key[96];
  mdl_str a;
  int64_t w = 0;
  if (g && mdl_gguf_get_str(g, "general.architecture", &a) == 0 && a.n < 64) {
    snprintf(key, sizeof key, "%.*s.embedding_length", (int)a.n, a.p);
    if (mdl_gguf_get_i64(g, key, &w) != 0 || w < 1 || w > (1 << 20)) w = 0;
  }
  s->n_embd = (int)w;
  if (mdl_gguf_pooling(g, &s->embd_pool, err, sizeof err) != 0)
    snprintf(s->embd_refusal, sizeof s->embd_refusal, "this model's embeddings cannot be served: %s", err);
  else if (s->embd_pool != MDL_POOL_MEAN && s->embd_pool != MDL_POOL_CLS && s->embd_pool != MDL_POOL_LAST)
    snprintf(s->embd_refusal, sizeof s->embd_refusal, "this model's pooling_type is %s: /v1/embeddings serves mean, "
             "cls and last pooling", mdl_pool_name(s->embd_pool));
  else if (!s->n_embd)
    snprintf(s->embd_refusal, sizeof s->embd_refusal, "the model's GGUF says no embedding_length: the embeddings' "
             "width is unknown");
}

int rtr_server_new(const rtr_server_opts *o, rtr_server **out, char *err, size_t errlen) {
  *out = NULL;
  rtr_server *s = calloc(1, sizeof *s);
  if (!s) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  s->cfg = o->cfg;
  s->rc_own = o->cfg->router;
  cfg_router_defaults(&s->rc_own);
  s->rc = &s->rc_own;
  s->gguf = o->gguf;
  s->has_template = o->gguf && mdl_gguf_find(o->gguf, "tokenizer.chat_template");
  if (resolve_chat(s, o, err, errlen) != 0) {
    mdl_jinja_free(s->jinja);
    free(s);
    return -1;
  }
  s->tok = o->tok;
  s->n_ctx = o->n_ctx;
  embeddings_init(s, o->gguf);
  s->started = (long)time(NULL);
  {
    rtr_sampling d;
    char desc[256];
    rtr_sampling_resolve(&o->cfg->sampling, o->gguf, &d, desc, sizeof desc);
    utl_log("router", "sampling defaults for fields a request leaves out: %s", desc);
  }
  snprintf(s->model, sizeof s->model, "%s", o->model_name && o->model_name[0] ? o->model_name : o->cfg->model_name);
  // Each layer's answers to the ones below it, before any thread can ask (server_int.h, rtr_hooks).
  rtr_links_register(s);
  rtr_relay_register(s);
  rtr_http_register(s);
  pthread_mutex_init(&s->mu, NULL);
  utl_cond_init_monotonic(&s->link_cv); // both are waited on with utl_deadline_ms deadlines
  utl_cond_init_monotonic(&s->admit_cv);
  s->m = rtr_metrics_new_labeled("model_name", s->model); // every series says which model it counts
  if (!s->m) {
    utl_seterr(err, errlen, "out of memory");
    rtr_server_free(s);
    return -1;
  }
  make_metrics(s);
  for (int i = 0; i < o->cfg->n_workers; i++)
    if (o->cfg->workers[i].role != CFG_ROLE_PREFILL) {
      cfg_worker w = o->cfg->workers[i];
      cfg_worker_defaults(&w);
      s->capacity += w.max_seqs;
    }
  s->capacity_static = s->capacity;
  if (s->capacity <= 0) s->capacity = 64;
  ctl_hub_opts ho = {.name = "router", .role = "router", .secret = o->cfg->secret, .host = NULL};
  if (ctl_hub_new(&ho, &s->hub, err, errlen) < 0) {
    rtr_server_free(s);
    return -1;
  }
  if (pthread_create(&s->dispatcher, NULL, rtr_dispatcher_main, s) == 0) s->has_dispatcher = 1;
  s->cap_links = o->cfg->n_workers + (o->cfg->has_discovery ? 16 : 0); // members grow it (links.c)
  s->links = calloc((size_t)s->cap_links + 1, sizeof *s->links);
  if (!s->links) {
    utl_seterr(err, errlen, "out of memory");
    rtr_server_free(s);
    return -1;
  }
  s->n_links = o->cfg->n_workers;
  s->last_link = -1;
  // The index is a hint: without memory for it the router routes by load.
  if (s->cap_links > 0 && rtr_kvindex_new(s->cap_links, 1 << 16, &s->kv, err, errlen) < 0) s->kv = NULL;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_links; i++) {
    s->links[i].s = s;
    s->links[i].cfg = &o->cfg->workers[i];
    if (rtr_link_start_locked(s, i) < 0) utl_err(LOGC, "cannot start a link thread: worker %s not linked",
                                                 s->links[i].cfg->name);
  }
  pthread_mutex_unlock(&s->mu);
  if (rtr_observe_start(s, err, errlen) < 0 || // the tracer and the stats lines
      rtr_members_start(s, err, errlen) < 0) { // the workers etcd knows (config "discovery")
    rtr_server_free(s);
    return -1;
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)s->rc->port);
  const char *host = s->rc->host[0] ? s->rc->host : "127.0.0.1";
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    utl_seterr(err, errlen, "router host '%s' is not an IPv4 address", host);
    rtr_server_free(s);
    return -1;
  }
  if (rtr_gate_listen(s, &sa, err, errlen) < 0) {
    rtr_server_free(s);
    return -1;
  }
  // conns.c accepts and hands the sockets over; MHD's own limit sits above the gate's cap, with room for
  // connections the gate already let go that MHD has not cleaned up yet
  unsigned timeout = (unsigned)s->rc->conn_timeout_s;
  unsigned cap = (unsigned)s->rc->max_connections;
  s->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                                MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC,
                            0, NULL, NULL, rtr_http_handler, s, MHD_OPTION_CONNECTION_TIMEOUT, timeout,
                            MHD_OPTION_NOTIFY_COMPLETED, rtr_http_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
                            rtr_gate_notify, s, MHD_OPTION_CONNECTION_LIMIT, cap + cap / 2 + 64, MHD_OPTION_END);
  if (!s->mhd) {
    utl_seterr(err, errlen, "cannot start the HTTP server on %s:%d: %s", host, s->rc->port, strerror(errno));
    rtr_server_free(s);
    return -1;
  }
  if (rtr_gate_start(s, err, errlen) < 0) {
    rtr_server_free(s);
    return -1;
  }
  s->port = rtr_gate_port(s);
  *out = s;
  return 0;
}

int rtr_server_port(const rtr_server *s) { return s->port; }

// Waits (s->mu held) until no generation request is live or until end_us.
static void wait_idle_locked(rtr_server *s, int64_t end_us) {
  while (s->n_live > 0 && utl_now_us() < end_us) {
    struct timespec dl = utl_deadline_ms(WAIT_TICK_MS);
    pthread_cond_timedwait(&s->admit_cv, &s->mu, &dl);
  }
}

int rtr_server_drain(rtr_server *s, int timeout_ms) {
  pthread_mutex_lock(&s->mu);
  s->draining = 1;
  pthread_cond_broadcast(&s->admit_cv); // queued requests leave with 503 shutting_down
  wait_idle_locked(s, utl_now_us() + (int64_t)timeout_ms * 1000);
  int left = s->n_live;
  if (left) { // past the bound: fail what still runs, and give the clients DRAIN_FLUSH_MS to read the error
    rtr_error e;
    rtr_fail(&e, 503, "server_error", NULL, "shutting_down", "the router stopped before the request finished");
    for (rtr_req *r = s->reqs, *n; r; r = n) {
      n = r->next;
      rtr_fail_locked(s, r, &e);
    }
    wait_idle_locked(s, utl_now_us() + DRAIN_FLUSH_MS * 1000);
  }
  pthread_mutex_unlock(&s->mu);
  return left;
}

void rtr_server_free(rtr_server *s) {
  if (!s) return;
  rtr_members_stop(s); // first: no link comes or goes while the rest stops
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  rtr_error e;
  rtr_fail(&e, 503, "server_error", NULL, "shutting_down", "the router is shutting down");
  for (rtr_req *r = s->reqs, *n; r; r = n) {
    n = r->next;
    rtr_fail_locked(s, r, &e);
  }
  pthread_cond_broadcast(&s->link_cv);
  pthread_cond_broadcast(&s->admit_cv);
  pthread_mutex_unlock(&s->mu);
  rtr_gate_stop(s); // no new connections, then MHD closes the open ones (the gate hears of each)
  if (s->mhd) MHD_stop_daemon(s->mhd);
  rtr_gate_free(s);
  for (int i = 0; i < s->n_links; i++)
    if (s->links[i].has_thread) pthread_join(s->links[i].thread, NULL);
  if (s->hub) ctl_hub_wake(s->hub);
  if (s->has_dispatcher) pthread_join(s->dispatcher, NULL);
  rtr_observe_stop(s); // the stats thread saw stopping; what spans wait are posted
  for (int i = 0; i < s->n_links; i++)
    if (s->links[i].peer) ctl_peer_unref(s->links[i].peer);
  ctl_hub_free(s->hub);
  free(s->links);
  free(s->wake); // (empty: the dispatcher flushes it before it takes its next event)
  rtr_reqtab_free(&s->reqtab);
  rtr_kvindex_free(s->kv);
  rtr_metrics_free(s->m);
  mdl_jinja_free(s->jinja);
  pthread_cond_destroy(&s->link_cv);
  pthread_cond_destroy(&s->admit_cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
