// router/server.c: the router: HTTP endpoints (libmicrohttpd, thread per connection), admission, worker links, relay.
#include "router/router.h"

#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "models/chat.h"
#include "router/openai.h"
#include "router/sched.h"
#include "server/hub.h"
#include "router/kvindex.h"
#include "server/log.h"
#include "router/metrics.h"

#define LOGC "router"
#define STATS_EVERY_MS 1000
#define LINK_DEAD_DEFAULT_MS 15000 // router.link_dead_ms when a caller's config leaves it 0
#define WAIT_TICK_MS 100     // how often a waiting connection checks its client is still there
#define DRAIN_FLUSH_MS 1000  // after the drain bound, how long failed streams get to send their error event

typedef struct rtr_link {
  rtr_server *s;               // (borrowed)
  const srv_worker_cfg *cfg;   // (borrowed) from s->cfg
  srv_peer *peer;              // (reference owned while up) guarded by s->mu; NULL when down
  int up;
  int n_ctx;
  int block_size;              // hello_ok kv_layout.block_size (16 when absent): the prompt's key chain
  int running, waiting, free_blocks, total_blocks, inflight;
  double prefix_hits, prefix_queries; // last cumulative values seen
  int connecting;              // 1 while the link thread is connecting (its peer may speak before it is stored)
  // Per prefix-cache tier (pool, host, disk: stats_ok prefix_tiers): last cumulative hits / queries seen, and the
  // series {worker, tier} of hits, queries and resident blocks, created when the worker first reports the tier.
  double tier_last[3][2];
  rtr_metric *m_tier[3][3];    // (owned by s->m)
  int64_t last_stats_ms, last_stats_sent_ms; // last_stats_ms: when the worker last answered (stats_ok or pong)
  pthread_t thread;
  int has_thread;
} rtr_link;

typedef struct rtr_choice {
  char id[64];
  int index;
  int link, plink;             // decode/both link, prefill link (-1: local)
  int finished;                // done, error or cancelled
  char finish[16];
  char *text;                  // (owned) non-stream accumulation (len bytes)
  size_t len, cap;
  cJSON *lp;                   // (owned) non-stream logprobs (chat: content array; completions: the object)
  int completion_tokens, cached_tokens, prompt_tokens;
  int retried;                 // sent again once after its decode/both worker died before its first token
  int handed_off;              // a token came from the decode worker: it holds all the KV, plink no longer matters
  int64_t last_tok_us;
  size_t text_offset;
} rtr_choice;

typedef struct rtr_req {
  rtr_server *s;               // (borrowed)
  int refs;                    // guarded by s->mu: list + connection + stream response
  pthread_cond_t cv;
  rtr_request q;               // (owned) the validated request
  int32_t *prompt;             // (owned) (n_prompt) token ids
  int n_prompt;
  int max_tokens;
  char id[48];
  long created;
  rtr_choice *ch;              // (owned) (q.n)
  int n_done;
  int failed;
  rtr_error err;
  int finished;                // every choice finished (or the request failed)
  int listed;                  // in s->reqs
  int admitted, slots;         // holds slots of admission capacity
  int waiting;                 // in the admission queue
  struct rtr_req *next, *wnext; // s->reqs / s->wait lists
  char *out;                   // (owned) stream bytes not yet read (out_pos..out_len)
  size_t out_len, out_cap, out_pos;
  int out_end;
  int fd;                      // client socket (for disconnect checks)
  struct MHD_Connection *conn; // (borrowed) its connection, for restoring the idle timeout
  int64_t t_arrival_us, t_admit_us, t_first_us;
} rtr_req;

typedef struct conn {
  char *body;                  // (owned) (len)
  size_t len, cap;
  int too_large, first_done, answered;
  rtr_req *req;                // (reference) once a generation request is made
} conn;

struct rtr_server {
  const srv_config *cfg;       // (borrowed)
  const srv_router_cfg *rc;
  const mdl_gguf *gguf;        // (borrowed)
  int has_template;
  const mdl_tok *tok;          // (borrowed)
  int n_ctx;
  char model[128];
  struct MHD_Daemon *mhd;
  int port;
  srv_hub *hub;
  pthread_t dispatcher;
  int has_dispatcher;
  pthread_mutex_t mu;          // guards links, requests, admission, counters
  pthread_cond_t link_cv;      // wakes link threads
  pthread_cond_t admit_cv;
  int stopping;
  int draining;                // rtr_server_drain: new requests get 503, queued ones are failed
  int n_live;                  // generation requests whose connection or response still holds them
  rtr_link *links;             // (owned) (n_links)
  int n_links;
  rtr_req *reqs;               // active requests (linked through next)
  rtr_req *wait_head, *wait_tail; // admission queue
  int n_waiting, running_slots, capacity;
  unsigned long long next_id;
  long started;
  rtr_kvindex *kv;             // (owned) which worker (by link index) holds which prefix blocks; guarded by mu
  rtr_metrics *m;              // (owned)
  rtr_metric *m_running, *m_waiting, *m_prompt, *m_gen, *m_ttft, *m_itl, *m_e2e, *m_queue, *m_kv_usage,
      *m_prefix_hits, *m_prefix_queries, *m_kv_bytes, *m_kv_time, *m_ok_stop, *m_ok_length, *m_fail;
};

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void deadline_in(struct timespec *dl, int ms) {
  clock_gettime(CLOCK_REALTIME, dl);
  dl->tv_sec += ms / 1000;
  dl->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (dl->tv_nsec >= 1000000000L) {
    dl->tv_sec++;
    dl->tv_nsec -= 1000000000L;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// small buffers

static int out_append(rtr_req *r, const char *p, size_t n) {
  if (r->out_len + n + 1 > r->out_cap) {
    size_t nc = (r->out_cap ? r->out_cap * 2 : 4096) + n;
    char *np = realloc(r->out, nc);
    if (!np) return -1;
    r->out = np;
    r->out_cap = nc;
  }
  memcpy(r->out + r->out_len, p, n);
  r->out_len += n;
  return 0;
}

static void out_event(rtr_req *r, cJSON *obj) { // "data: JSON\n\n"; consumes obj
  char *j = cJSON_PrintUnformatted(obj);
  cJSON_Delete(obj);
  if (!j) return;
  out_append(r, "data: ", 6);
  out_append(r, j, strlen(j));
  out_append(r, "\n\n", 2);
  free(j);
}

static int text_append(rtr_choice *c, const char *p, size_t n) {
  if (c->len + n + 1 > c->cap) {
    size_t nc = (c->cap ? c->cap * 2 : 256) + n;
    char *np = realloc(c->text, nc);
    if (!np) return -1;
    c->text = np;
    c->cap = nc;
  }
  memcpy(c->text + c->len, p, n);
  c->len += n;
  c->text[c->len] = 0;
  return 0;
}

// ---------------------------------------------------------------------------------------------------------------
// request objects (all under s->mu)

static void req_unref_locked(rtr_req *r) {
  if (--r->refs > 0) return;
  if (--r->s->n_live == 0) pthread_cond_broadcast(&r->s->admit_cv); // rtr_server_drain waits for this
  for (int i = 0; i < r->q.n && r->ch; i++) {
    free(r->ch[i].text);
    cJSON_Delete(r->ch[i].lp);
  }
  free(r->ch);
  free(r->prompt);
  free(r->out);
  rtr_request_free(&r->q);
  pthread_cond_destroy(&r->cv);
  free(r);
}

static void unlist_locked(rtr_server *s, rtr_req *r) {
  if (!r->listed) return;
  for (rtr_req **pp = &s->reqs; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      break;
    }
  r->listed = 0;
  req_unref_locked(r);
}

static void release_slots_locked(rtr_server *s, rtr_req *r) {
  if (r->admitted && r->slots) {
    s->running_slots -= r->slots;
    r->slots = 0;
    rtr_metric_set(s->m_running, s->running_slots);
    pthread_cond_broadcast(&s->admit_cv);
  }
}

static cJSON *chunk_base(rtr_req *r) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "object", r->q.kind == RTR_CHAT ? "chat.completion.chunk" : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)r->created);
  cJSON_AddStringToObject(o, "model", r->s->model);
  return o;
}

static cJSON *usage_json(rtr_req *r) {
  int comp = 0, cached = 0;
  for (int i = 0; i < r->q.n; i++) {
    comp += r->ch[i].completion_tokens;
    if (r->ch[i].cached_tokens > cached) cached = r->ch[i].cached_tokens;
  }
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", comp);
  cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + comp);
  cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
  cJSON_AddNumberToObject(d, "cached_tokens", cached);
  return u;
}

// Marks the request finished: stream trailer, metrics, admission slots, out of the active list.
static void finish_locked(rtr_server *s, rtr_req *r) {
  if (r->finished) return;
  r->finished = 1;
  if (r->q.stream) {
    if (r->failed) {
      cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
      cJSON_AddStringToObject(e, "message", r->err.message);
      cJSON_AddStringToObject(e, "type", r->err.type);
      if (r->err.param[0]) cJSON_AddStringToObject(e, "param", r->err.param);
      else cJSON_AddNullToObject(e, "param");
      if (r->err.code[0]) cJSON_AddStringToObject(e, "code", r->err.code);
      else cJSON_AddNullToObject(e, "code");
      out_event(r, o);
    } else if (r->q.include_usage) {
      cJSON *o = chunk_base(r);
      cJSON_AddItemToObject(o, "choices", cJSON_CreateArray());
      cJSON_AddItemToObject(o, "usage", usage_json(r));
      out_event(r, o);
    }
    out_append(r, "data: [DONE]\n\n", 14);
    r->out_end = 1;
  }
  if (!r->failed) {
    int64_t t = now_us();
    rtr_metric_observe(s->m_e2e, (double)(t - r->t_arrival_us) / 1e6);
    for (int i = 0; i < r->q.n; i++)
      rtr_metric_add(!strcmp(r->ch[i].finish, "length") ? s->m_ok_length : s->m_ok_stop, 1);
  } else {
    rtr_metric_add(s->m_fail, 1);
  }
  release_slots_locked(s, r);
  pthread_cond_broadcast(&r->cv);
  unlist_locked(s, r);
}

static void send_cancel(rtr_server *s, rtr_req *r, int ci) {
  rtr_choice *c = &r->ch[ci];
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "op", "cancel");
  cJSON_AddStringToObject(m, "id", c->id);
  int links[2] = {c->link, c->plink};
  for (int k = 0; k < 2; k++)
    if (links[k] >= 0 && s->links[links[k]].peer) srv_peer_send(s->links[links[k]].peer, m);
  cJSON_Delete(m);
}

static void choice_end_locked(rtr_server *s, rtr_req *r, int ci) {
  rtr_choice *c = &r->ch[ci];
  if (c->finished) return;
  c->finished = 1;
  r->n_done++;
  if (c->link >= 0 && s->links[c->link].inflight > 0) s->links[c->link].inflight--;
  if (c->plink >= 0 && !c->handed_off && s->links[c->plink].inflight > 0) s->links[c->plink].inflight--;
}

// Fails the whole request (other choices are cancelled at their workers).
static void fail_locked(rtr_server *s, rtr_req *r, const rtr_error *e) {
  if (r->finished) return;
  r->failed = 1;
  r->err = *e;
  for (int i = 0; i < r->q.n; i++)
    if (!r->ch[i].finished) {
      send_cancel(s, r, i);
      choice_end_locked(s, r, i);
    }
  finish_locked(s, r);
}

// The client went away: cancel whatever still runs; nothing more is sent.
static void cancel_locked(rtr_server *s, rtr_req *r) {
  if (r->finished) return;
  for (int i = 0; i < r->q.n; i++)
    if (!r->ch[i].finished && r->admitted) {
      send_cancel(s, r, i);
      choice_end_locked(s, r, i);
    }
  r->failed = 1;
  rtr_fail(&r->err, 499, "invalid_request_error", NULL, "cancelled", "the client disconnected");
  r->q.stream = 0; // no trailer for nobody
  finish_locked(s, r);
}

// ---------------------------------------------------------------------------------------------------------------
// worker messages (dispatcher thread)

static rtr_req *find_choice_locked(rtr_server *s, const char *id, int *ci) {
  for (rtr_req *r = s->reqs; r; r = r->next) {
    size_t k = strlen(r->id);
    if (strncmp(id, r->id, k) || id[k] != '-') continue;
    char *end;
    long i = strtol(id + k + 1, &end, 10);
    if ((*end && *end != '-') || i < 0 || i >= r->q.n || strcmp(r->ch[i].id, id)) return NULL; // "-r": a retry
    *ci = (int)i;
    return r;
  }
  return NULL;
}

static double num(const cJSON *o, const char *k, double dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : dflt;
}

static char *piece(rtr_server *s, int32_t id) {
  char tmp[MDL_TOK_MAX_PIECE + 1];
  size_t n = mdl_tok_piece(s->tok, id, tmp, MDL_TOK_MAX_PIECE);
  if (n > MDL_TOK_MAX_PIECE) n = MDL_TOK_MAX_PIECE;
  tmp[n] = 0;
  // a lone piece can be part of a UTF-8 character: show it with U+FFFD like OpenAI's byte tokens
  if (!rtr_utf8_valid(tmp, n)) snprintf(tmp, sizeof tmp, "\xef\xbf\xbd");
  char *d = malloc(strlen(tmp) + 1);
  if (d) strcpy(d, tmp);
  return d;
}

static cJSON *bytes_of(const char *t) {
  cJSON *a = cJSON_CreateArray();
  for (const unsigned char *p = (const unsigned char *)t; *p; p++) cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
  return a;
}

// Converts the worker's [{token, logprob, top:[[id, lp]..]}..] into OpenAI's shape. Chat: appends to content
// (array of {token, logprob, bytes, top_logprobs}); completions: appends to {tokens, token_logprobs, top_logprobs,
// text_offset}.
static void add_logprobs(rtr_server *s, rtr_req *r, rtr_choice *c, const cJSON *lps, cJSON *dst) {
  const cJSON *e;
  cJSON_ArrayForEach(e, lps) {
    int32_t id = (int32_t)num(e, "token", -1);
    double lp = num(e, "logprob", 0);
    char *t = piece(s, id);
    if (!t) continue;
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(e, "top");
    if (r->q.kind == RTR_CHAT) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "token", t);
      cJSON_AddNumberToObject(o, "logprob", lp);
      cJSON_AddItemToObject(o, "bytes", bytes_of(t));
      cJSON *ta = cJSON_AddArrayToObject(o, "top_logprobs");
      const cJSON *p;
      int k = 0;
      cJSON_ArrayForEach(p, top) {
        if (k++ >= r->q.logprobs) break;
        char *pt = piece(s, (int32_t)(cJSON_IsNumber(cJSON_GetArrayItem(p, 0)) ? cJSON_GetArrayItem(p, 0)->valuedouble : -1));
        if (!pt) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "token", pt);
        cJSON_AddNumberToObject(x, "logprob", cJSON_IsNumber(cJSON_GetArrayItem(p, 1)) ? cJSON_GetArrayItem(p, 1)->valuedouble : 0);
        cJSON_AddItemToObject(x, "bytes", bytes_of(pt));
        cJSON_AddItemToArray(ta, x);
        free(pt);
      }
      cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "content"), o);
    } else {
      cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "tokens"), cJSON_CreateString(t));
      cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "token_logprobs"), cJSON_CreateNumber(lp));
      cJSON *to = cJSON_CreateObject();
      const cJSON *p;
      int k = 0;
      cJSON_ArrayForEach(p, top) {
        if (k++ >= r->q.logprobs) break;
        char *pt = piece(s, (int32_t)(cJSON_IsNumber(cJSON_GetArrayItem(p, 0)) ? cJSON_GetArrayItem(p, 0)->valuedouble : -1));
        if (!pt) continue;
        if (!cJSON_GetObjectItemCaseSensitive(to, pt))
          cJSON_AddNumberToObject(to, pt, cJSON_IsNumber(cJSON_GetArrayItem(p, 1)) ? cJSON_GetArrayItem(p, 1)->valuedouble : 0);
        free(pt);
      }
      cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "top_logprobs"), to);
      cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "text_offset"), cJSON_CreateNumber((double)c->text_offset));
      c->text_offset += strlen(t);
    }
    free(t);
  }
}

static cJSON *new_lp(rtr_req *r) {
  cJSON *o = cJSON_CreateObject();
  if (r->q.kind == RTR_CHAT) {
    cJSON_AddArrayToObject(o, "content");
  } else {
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
  }
  return o;
}

static cJSON *stream_choice(rtr_req *r, int index, const char *text, const char *finish) {
  cJSON *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "index", index);
  if (r->q.kind == RTR_CHAT) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (text) cJSON_AddStringToObject(d, "content", text);
  } else {
    cJSON_AddStringToObject(c, "text", text ? text : "");
  }
  cJSON_AddNullToObject(c, "logprobs");
  if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
  else cJSON_AddNullToObject(c, "finish_reason");
  return c;
}

static void on_token(rtr_server *s, rtr_req *r, int ci, const cJSON *m) {
  rtr_choice *c = &r->ch[ci];
  if (c->finished) return;
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(m, "text");
  const cJSON *toks = cJSON_GetObjectItemCaseSensitive(m, "tokens");
  const cJSON *lps = cJSON_GetObjectItemCaseSensitive(m, "logprobs");
  const char *t = cJSON_IsString(text) ? text->valuestring : "";
  int ntok = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : 1;
  int64_t now = now_us();
  if (c->plink >= 0 && !c->handed_off) { // the handoff is over: the prefill worker is free of this choice
    c->handed_off = 1;
    if (s->links[c->plink].inflight > 0) s->links[c->plink].inflight--;
  }
  if (!r->t_first_us) {
    r->t_first_us = now;
    rtr_metric_observe(s->m_ttft, (double)(now - r->t_arrival_us) / 1e6);
  } else if (c->last_tok_us && ntok > 0) {
    double per = (double)(now - c->last_tok_us) / 1e6 / ntok;
    for (int k = 0; k < ntok; k++) rtr_metric_observe(s->m_itl, per);
  }
  c->last_tok_us = now;
  c->completion_tokens += ntok;
  rtr_metric_add(s->m_gen, ntok);
  if (r->q.stream) {
    cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = stream_choice(r, ci, t, NULL);
    if (r->q.logprobs >= 0 && cJSON_IsArray(lps)) {
      cJSON *lp = new_lp(r);
      add_logprobs(s, r, c, lps, lp);
      cJSON_ReplaceItemInObject(ch, "logprobs", lp);
    }
    cJSON_AddItemToArray(arr, ch);
    out_event(r, o);
    pthread_cond_broadcast(&r->cv);
  } else {
    text_append(c, t, strlen(t));
    if (r->q.logprobs >= 0 && cJSON_IsArray(lps)) {
      if (!c->lp) c->lp = new_lp(r);
      add_logprobs(s, r, c, lps, c->lp);
    }
  }
}

static void on_done(rtr_server *s, rtr_req *r, int ci, const cJSON *m) {
  rtr_choice *c = &r->ch[ci];
  if (c->finished) return;
  const cJSON *fr = cJSON_GetObjectItemCaseSensitive(m, "finish_reason");
  snprintf(c->finish, sizeof c->finish, "%s",
           cJSON_IsString(fr) && !strcmp(fr->valuestring, "length") ? "length" : "stop");
  int ct = (int)num(m, "completion_tokens", -1);
  if (ct >= 0) c->completion_tokens = ct;
  c->cached_tokens = (int)num(m, "cached_tokens", 0);
  c->prompt_tokens = (int)num(m, "prompt_tokens", r->n_prompt);
  double kvb = num(m, "kv_bytes", 0), kvms = num(m, "kv_ms", -1);
  if (kvb > 0) rtr_metric_add(s->m_kv_bytes, kvb);
  if (kvms >= 0 && c->plink >= 0) rtr_metric_observe(s->m_kv_time, kvms / 1000.0);
  choice_end_locked(s, r, ci);
  if (r->q.stream) {
    cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = stream_choice(r, ci, NULL, c->finish);
    if (r->q.kind != RTR_CHAT) cJSON_ReplaceItemInObject(ch, "text", cJSON_CreateString(""));
    cJSON_AddItemToArray(arr, ch);
    out_event(r, o);
    pthread_cond_broadcast(&r->cv);
  }
  if (r->n_done == r->q.n) finish_locked(s, r);
}

static void on_error(rtr_server *s, rtr_req *r, int ci, const cJSON *m) {
  (void)ci;
  const cJSON *msg = cJSON_GetObjectItemCaseSensitive(m, "message");
  const cJSON *code = cJSON_GetObjectItemCaseSensitive(m, "code");
  const char *cs = cJSON_IsString(code) ? code->valuestring : "worker_failure";
  int status = !strcmp(cs, "context_length_exceeded") ? 400 : !strcmp(cs, "timeout") ? 504 : 503;
  rtr_error e;
  rtr_fail(&e, status, status == 400 ? "invalid_request_error" : "server_error", NULL, cs, "%s",
           cJSON_IsString(msg) ? msg->valuestring : "the worker failed");
  r->ch[ci].finished = 1; // the worker already dropped it: no cancel for this one
  r->n_done++;
  rtr_choice *c = &r->ch[ci];
  if (c->link >= 0 && s->links[c->link].inflight > 0) s->links[c->link].inflight--;
  if (c->plink >= 0 && !c->handed_off && s->links[c->plink].inflight > 0) s->links[c->plink].inflight--;
  fail_locked(s, r, &e);
}

static void update_kv_gauge_locked(rtr_server *s) {
  double used = 0, total = 0;
  for (int i = 0; i < s->n_links; i++)
    if (s->links[i].up && s->links[i].total_blocks > 0) {
      used += s->links[i].total_blocks - s->links[i].free_blocks;
      total += s->links[i].total_blocks;
    }
  rtr_metric_set(s->m_kv_usage, total > 0 ? used / total : 0);
}

// Adds to counter c what a worker's running total v grew by since *last (a restarted worker counts anew).
static void counter_from_total(rtr_metric *c, double v, double *last) {
  rtr_metric_add(c, v >= *last ? v - *last : v);
  *last = v;
}

// stats_ok prefix_tiers {"pool"|"host"|"disk": {hits, queries, blocks}} into the worker's labeled series.
static void on_prefix_tiers(rtr_server *s, rtr_link *l, const cJSON *tiers) {
  static const char *const names[3] = {"pool", "host", "disk"};
  for (int t = 0; t < 3; t++) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(tiers, names[t]);
    if (!cJSON_IsObject(o)) continue;
    if (!l->m_tier[t][0]) {
      char lab[128];
      snprintf(lab, sizeof lab, "worker=\"%s\",tier=\"%s\"", l->cfg->name, names[t]);
      l->m_tier[t][0] = rtr_metrics_counter(s->m, "dserve:prefix_cache_tier_hits_total",
                                            "Prefix-cache hit tokens served from each tier of each worker.", lab);
      l->m_tier[t][1] = rtr_metrics_counter(s->m, "dserve:prefix_cache_tier_queries_total",
                                            "Prefix-cache tokens looked up in each tier of each worker.", lab);
      l->m_tier[t][2] = rtr_metrics_gauge(s->m, "dserve:prefix_cache_blocks",
                                          "Prefix-cache blocks resident in each tier of each worker.", lab);
    }
    counter_from_total(l->m_tier[t][0], num(o, "hits", 0), &l->tier_last[t][0]);
    counter_from_total(l->m_tier[t][1], num(o, "queries", 0), &l->tier_last[t][1]);
    rtr_metric_set(l->m_tier[t][2], num(o, "blocks", 0));
  }
}

static void on_stats(rtr_server *s, rtr_link *l, const cJSON *m) {
  l->running = (int)num(m, "running", 0);
  l->waiting = (int)num(m, "waiting", 0);
  l->free_blocks = (int)num(m, "free_blocks", 0);
  l->total_blocks = (int)num(m, "total_blocks", 0);
  counter_from_total(s->m_prefix_hits, num(m, "prefix_hits", 0), &l->prefix_hits);
  counter_from_total(s->m_prefix_queries, num(m, "prefix_queries", 0), &l->prefix_queries);
  on_prefix_tiers(s, l, cJSON_GetObjectItemCaseSensitive(m, "prefix_tiers"));
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  l->last_stats_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  update_kv_gauge_locked(s);
}

// {"op":"kv_events","events":[[kind, "key"], ...]}: applied in order to the link's index entries. A malformed
// entry is skipped (the index is a hint: a missed event costs a recomputation, never a wrong answer).
static void on_kv_events(rtr_server *s, rtr_link *l, const cJSON *m) {
  const cJSON *evs = cJSON_GetObjectItemCaseSensitive(m, "events"), *e;
  if (!s->kv || !cJSON_IsArray(evs)) return;
  int li = (int)(l - s->links), n = 0;
  srv_kv_event buf[256];
  cJSON_ArrayForEach(e, evs) {
    const cJSON *kind = cJSON_GetArrayItem(e, 0), *key = cJSON_GetArrayItem(e, 1);
    if (!cJSON_IsArray(e) || !cJSON_IsNumber(kind)) continue;
    char *end = NULL;
    uint64_t k = 0;
    if (cJSON_IsString(key)) {
      errno = 0;
      k = strtoull(key->valuestring, &end, 10);
      if (errno || end == key->valuestring || *end) continue;
    } else if (kind->valueint != SRV_KV_CLEARED) {
      continue;
    }
    buf[n++] = (srv_kv_event){.key = k, .kind = kind->valueint};
    if (n == (int)(sizeof buf / sizeof buf[0])) {
      rtr_kvindex_apply(s->kv, li, buf, n);
      n = 0;
    }
  }
  if (n) rtr_kvindex_apply(s->kv, li, buf, n);
}

static int retry_locked(rtr_server *s, rtr_req *r, int ci, int dead);

static void link_down_locked(rtr_server *s, rtr_link *l) {
  if (!l->peer) return;
  srv_warn(LOGC, "worker %s (%s:%d) disconnected", l->cfg->name, l->cfg->host, l->cfg->port);
  srv_peer_unref(l->peer);
  l->peer = NULL;
  l->up = 0;
  int li = (int)(l - s->links);
  if (s->kv) rtr_kvindex_remove_worker(s->kv, li);
  rtr_error e;
  rtr_fail(&e, 503, "server_error", NULL, "worker_failure", "worker %s disconnected", l->cfg->name);
  for (rtr_req *r = s->reqs, *n; r; r = n) {
    n = r->next;
    int hit = 0;
    for (int i = 0; i < r->q.n && !hit; i++)
      if (!r->ch[i].finished && (r->ch[i].link == li || (r->ch[i].plink == li && !r->ch[i].handed_off)) &&
          retry_locked(s, r, i, li) < 0)
        hit = 1;
    if (hit) fail_locked(s, r, &e);
  }
  l->inflight = 0;
  update_kv_gauge_locked(s);
  pthread_cond_broadcast(&s->link_cv);
}

// The link whose peer is p. A worker may speak (its kv_events snapshot) as soon as it has sent hello_ok, before
// the link thread that connected has stored the peer: a message from an unknown peer while a link of that
// worker's name is connecting waits for it (polling, at most ~2 s) instead of being dropped. Called with mu
// held; releases it while waiting.
static rtr_link *link_of_locked(rtr_server *s, srv_peer *p, int is_msg) {
  for (int tries = 0;; tries++) {
    int connecting = 0;
    for (int i = 0; i < s->n_links; i++) {
      if (s->links[i].peer == p) return &s->links[i];
      connecting |= s->links[i].connecting && !strcmp(s->links[i].cfg->name, srv_peer_name(p));
    }
    if (!is_msg || !connecting || s->stopping || tries >= 2000) return NULL;
    pthread_mutex_unlock(&s->mu);
    usleep(1000);
    pthread_mutex_lock(&s->mu);
  }
}

static void *dispatcher_main(void *arg) {
  rtr_server *s = arg;
  for (;;) {
    srv_event ev;
    int got = srv_hub_next(s->hub, &ev, 200);
    pthread_mutex_lock(&s->mu);
    int stop = s->stopping;
    if (got) {
      rtr_link *l = link_of_locked(s, ev.peer, ev.msg != NULL);
      if (l && !ev.msg) {
        link_down_locked(s, l);
      } else if (l) {
        const cJSON *op = cJSON_GetObjectItemCaseSensitive(ev.msg, "op");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(ev.msg, "id");
        const char *o = cJSON_IsString(op) ? op->valuestring : "";
        if (!strcmp(o, "pong")) { // from the worker's hub thread: alive, however busy its compute loop is
          l->last_stats_ms = now_us() / 1000;
        } else if (!strcmp(o, "stats_ok")) {
          on_stats(s, l, ev.msg);
        } else if (!strcmp(o, "kv_events")) {
          on_kv_events(s, l, ev.msg);
        } else if (cJSON_IsString(id) && (!strcmp(o, "token") || !strcmp(o, "done") || !strcmp(o, "error"))) {
          int ci;
          rtr_req *r = find_choice_locked(s, id->valuestring, &ci);
          if (r && !strcmp(o, "token")) on_token(s, r, ci, ev.msg);
          else if (r && !strcmp(o, "done")) on_done(s, r, ci, ev.msg);
          else if (r) on_error(s, r, ci, ev.msg);
        } else {
          srv_debug(LOGC, "worker %s: ignored message op '%s'", l->cfg->name, o);
        }
      }
    }
    pthread_mutex_unlock(&s->mu);
    if (got) srv_event_done(&ev);
    if (stop && !got) break;
  }
  return NULL;
}

static int64_t now_ms(void) { return now_us() / 1000; }

static void *link_main(void *arg) {
  rtr_link *l = arg;
  rtr_server *s = l->s;
  int backoff = 100;
  pthread_mutex_lock(&s->mu);
  while (!s->stopping) {
    if (!l->peer) {
      l->connecting = 1;
      pthread_mutex_unlock(&s->mu);
      char err[256] = "";
      srv_peer *p = srv_hub_connect(s->hub, l->cfg->host, l->cfg->port, 1000, err, sizeof err);
      pthread_mutex_lock(&s->mu);
      l->connecting = 0;
      if (p && !s->stopping) {
        const cJSON *ok = srv_peer_hello(p);
        l->n_ctx = (int)num(ok, "n_ctx", 0);
        l->block_size = (int)num(cJSON_GetObjectItemCaseSensitive(ok, "kv_layout"), "block_size", 16);
        if (l->block_size < 1) l->block_size = 16;
        if (s->kv) rtr_kvindex_remove_worker(s->kv, (int)(l - s->links)); // a new process: it tells us anew
        l->peer = p;
        l->up = 1;
        l->inflight = 0;
        l->last_stats_ms = now_ms();
        l->last_stats_sent_ms = 0;
        backoff = 100;
        srv_log(LOGC, "worker %s (%s, %s:%d) connected", l->cfg->name, srv_role_name(l->cfg->role), l->cfg->host,
                l->cfg->port);
        continue;
      }
      if (p) {
        srv_peer_close(p);
        srv_peer_unref(p);
        break;
      }
      srv_debug(LOGC, "worker %s: %s (retry in %d ms)", l->cfg->name, err, backoff);
      struct timespec dl;
      deadline_in(&dl, backoff);
      pthread_cond_timedwait(&s->link_cv, &s->mu, &dl);
      backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
      continue;
    }
    int64_t t = now_ms();
    // not scaled by DSERVE_TIMEOUT_SCALE: the pong comes from the hub thread, however slow a (sanitized) compute step
    int dead_ms = s->rc->link_dead_ms > 0 ? s->rc->link_dead_ms : LINK_DEAD_DEFAULT_MS;
    if (t - l->last_stats_ms > dead_ms) {
      srv_warn(LOGC, "worker %s answered nothing for %d ms; closing its link", l->cfg->name, dead_ms);
      srv_peer_close(l->peer); // the dispatcher sees the close at once and fails (or retries) its requests
      l->last_stats_ms = t;
    } else if (t - l->last_stats_sent_ms >= STATS_EVERY_MS) {
      cJSON *m = cJSON_CreateObject(), *ping = cJSON_CreateObject();
      cJSON_AddStringToObject(m, "op", "stats");
      cJSON_AddStringToObject(ping, "op", "ping");
      srv_peer *p = l->peer;
      l->last_stats_sent_ms = t;
      pthread_mutex_unlock(&s->mu);
      srv_peer_send(p, m);
      srv_peer_send(p, ping);
      cJSON_Delete(m);
      cJSON_Delete(ping);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    struct timespec dl;
    deadline_in(&dl, 250);
    pthread_cond_timedwait(&s->link_cv, &s->mu, &dl);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

int rtr_server_links_up(rtr_server *s) {
  pthread_mutex_lock(&s->mu);
  int n = 0;
  for (int i = 0; i < s->n_links; i++) n += s->links[i].up;
  pthread_mutex_unlock(&s->mu);
  return n;
}

// ---------------------------------------------------------------------------------------------------------------
// HTTP helpers

static enum MHD_Result reply(struct MHD_Connection *c, int status, const char *ctype, const char *body, size_t len,
                             const char *h1, const char *v1) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  if (h1) MHD_add_response_header(resp, h1, v1);
  enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
  MHD_destroy_response(resp);
  return rc;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, int status, cJSON *o) { // consumes o
  char *j = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!j) return MHD_NO;
  enum MHD_Result rc = reply(c, status, "application/json", j, strlen(j), NULL, NULL);
  free(j);
  return rc;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, const rtr_error *e, const char *h1, const char *v1) {
  char *j = rtr_error_json(e);
  if (!j) return MHD_NO;
  enum MHD_Result rc = reply(c, e->status, "application/json", j, strlen(j), h1, v1);
  free(j);
  return rc;
}

static enum MHD_Result reply_err(struct MHD_Connection *c, int status, const char *type, const char *code,
                                 const char *h1, const char *v1, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static enum MHD_Result reply_err(struct MHD_Connection *c, int status, const char *type, const char *code,
                                 const char *h1, const char *v1, const char *fmt, ...) {
  rtr_error e;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rtr_fail(&e, status, type, NULL, code, "%s", msg);
  return reply_error(c, &e, h1, v1);
}

static int client_gone(int fd) {
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int auth_ok(rtr_server *s, struct MHD_Connection *c) {
  if (s->rc->n_api_keys == 0) return 1;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncmp(h, "Bearer ", 7)) return 0;
  const char *k = h + 7;
  int ok = 0;
  for (int i = 0; i < s->rc->n_api_keys; i++) ok |= srv_consttime_eq(k, s->rc->api_keys[i]); // every key compared
  return ok;
}

static int json_ctype_ok(const char *ct) {
  if (!ct) return 1; // a missing content type is taken as JSON
  while (*ct == ' ') ct++;
  size_t n = strlen("application/json");
  if (strncasecmp(ct, "application/json", n)) return 0;
  return ct[n] == 0 || ct[n] == ';' || ct[n] == ' ';
}

// ---------------------------------------------------------------------------------------------------------------
// endpoints

static enum MHD_Result do_models(rtr_server *s, struct MHD_Connection *c) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", s->model);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)s->started);
  cJSON_AddStringToObject(m, "owned_by", "dserve");
  cJSON_AddNumberToObject(m, "max_model_len", s->n_ctx);
  cJSON_AddItemToArray(d, m);
  return reply_json(c, 200, o);
}

static enum MHD_Result do_metrics(rtr_server *s, struct MHD_Connection *c) {
  pthread_mutex_lock(&s->mu);
  rtr_metric_set(s->m_running, s->running_slots);
  rtr_metric_set(s->m_waiting, s->n_waiting);
  pthread_mutex_unlock(&s->mu);
  char *t = NULL, err[128];
  size_t n = 0;
  if (rtr_metrics_render(s->m, &t, &n, err, sizeof err) < 0)
    return reply_err(c, 500, "server_error", NULL, NULL, NULL, "%s", err);
  enum MHD_Result rc = reply(c, 200, "text/plain; version=0.0.4", t, n, NULL, NULL);
  free(t);
  return rc;
}

// Renders and encodes the prompt of q into *ids (n). 0, or -1 with e.
static int tokenize(rtr_server *s, const rtr_request *q, int32_t **ids, int *n, rtr_error *e) {
  char err[256];
  if (q->prompt_ids) {
    *ids = malloc(((size_t)q->n_prompt_ids + 1) * sizeof **ids);
    if (!*ids) return rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    memcpy(*ids, q->prompt_ids, (size_t)q->n_prompt_ids * sizeof **ids);
    *n = q->n_prompt_ids;
    return 0;
  }
  char *text = NULL;
  const char *p = q->prompt;
  size_t plen = q->prompt_len;
  if (q->msgs) {
    mdl_chat_msg *mm = calloc((size_t)q->n_msgs, sizeof *mm);
    if (!mm) return rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (int i = 0; i < q->n_msgs; i++) {
      mm[i].role = q->msgs[i].role;
      mm[i].content = q->msgs[i].content;
    }
    int add_gen = q->kind == RTR_TOKENIZE ? q->add_generation_prompt : 1;
    int rc = mdl_chat_apply(s->has_template ? s->gguf : NULL, mm, (size_t)q->n_msgs, add_gen, &text, err, sizeof err);
    free(mm);
    if (rc < 0) return rtr_fail(e, 400, "invalid_request_error", "messages", NULL, "chat template: %s", err);
    p = text;
    plen = strlen(text);
  }
  int32_t *raw = NULL;
  size_t nraw = 0;
  int rc = mdl_tok_encode(s->tok, p ? p : "", p ? plen : 0, 1, &raw, &nraw, err, sizeof err);
  free(text);
  if (rc < 0) return rtr_fail(e, 400, "invalid_request_error", "prompt", NULL, "tokenizer: %s", err);
  int bos = q->add_special && mdl_tok_add_bos(s->tok) && mdl_tok_bos(s->tok) >= 0 && !q->msgs;
  *ids = malloc((nraw + 2) * sizeof **ids);
  if (!*ids) {
    free(raw);
    return rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  }
  if (bos) (*ids)[0] = mdl_tok_bos(s->tok);
  if (nraw) memcpy(*ids + bos, raw, nraw * sizeof *raw);
  free(raw);
  if (nraw + (size_t)bos > (size_t)INT32_MAX) {
    free(*ids);
    *ids = NULL;
    return rtr_fail(e, 400, "invalid_request_error", "prompt", "context_length_exceeded", "the prompt is too long");
  }
  *n = (int)nraw + bos;
  return 0;
}

static rtr_limits limits_of(rtr_server *s) {
  rtr_limits l = {s->model, s->n_ctx, s->rc->max_tokens_limit, s->rc->max_n > 0 ? s->rc->max_n : 8,
                  s->rc->max_stop > 0 ? s->rc->max_stop : 8, mdl_tok_n_vocab(s->tok)};
  return l;
}

static enum MHD_Result do_tokenize(rtr_server *s, struct MHD_Connection *c, conn *cs, int detok) {
  rtr_limits l = limits_of(s);
  rtr_request q;
  rtr_error e;
  if (rtr_request_parse(detok ? RTR_DETOKENIZE : RTR_TOKENIZE, cs->body, cs->len, &l, &q, &e) < 0)
    return reply_error(c, &e, NULL, NULL);
  cJSON *o = cJSON_CreateObject();
  if (detok) {
    char *text = NULL, err[256];
    size_t len = 0;
    if (mdl_tok_decode(s->tok, q.prompt_ids, (size_t)q.n_prompt_ids, &text, &len, err, sizeof err) < 0) {
      cJSON_Delete(o);
      rtr_request_free(&q);
      return reply_err(c, 400, "invalid_request_error", NULL, NULL, NULL, "%s", err);
    }
    if (!rtr_utf8_valid(text, len)) { // token pieces can end inside a character: replace what is not UTF-8
      size_t w = 0;
      char *fixed = malloc(len * 3 + 1);
      for (size_t i = 0; fixed && i < len;) {
        size_t k = 1;
        while (k <= 4 && i + k <= len && !rtr_utf8_valid(text + i, k)) k++;
        if (k <= 4 && i + k <= len) {
          memcpy(fixed + w, text + i, k);
          w += k;
          i += k;
        } else {
          memcpy(fixed + w, "\xef\xbf\xbd", 3);
          w += 3;
          i++;
        }
      }
      if (fixed) fixed[w] = 0;
      free(text);
      text = fixed;
    }
    cJSON_AddStringToObject(o, "prompt", text ? text : "");
    free(text);
  } else {
    int32_t *ids = NULL;
    int n = 0;
    if (tokenize(s, &q, &ids, &n, &e) < 0) {
      cJSON_Delete(o);
      rtr_request_free(&q);
      return reply_error(c, &e, NULL, NULL);
    }
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(o, "count", n);
    cJSON_AddNumberToObject(o, "max_model_len", s->n_ctx);
    free(ids);
  }
  rtr_request_free(&q);
  return reply_json(c, 200, o);
}

// The `generate` message (docs/protocol.md) for choice ci. How the router fills the fields the catalogue leaves open:
// max_tokens is always set (n_ctx - prompt when the client gave none); sampling.seed is seed + ci, and absent when the
// client gave no seed (the worker picks one); sampling.logprobs is -1 for none; stop_ids is empty (the worker ends at
// its own end-of-generation tokens unless ignore_eos); deadline_ms is a budget in ms from receipt, not a clock time.
static cJSON *generate_msg(rtr_server *s, rtr_req *r, int ci, const char *mode, const char *peer_key,
                           const char *peer_name) {
  const rtr_request *q = &r->q;
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "op", "generate");
  cJSON_AddStringToObject(m, "id", r->ch[ci].id);
  cJSON *p = cJSON_AddArrayToObject(m, "prompt");
  for (int i = 0; i < r->n_prompt; i++) cJSON_AddItemToArray(p, cJSON_CreateNumber(r->prompt[i]));
  cJSON_AddNumberToObject(m, "max_tokens", r->max_tokens);
  cJSON *sp = cJSON_AddObjectToObject(m, "sampling");
  cJSON_AddNumberToObject(sp, "temperature", q->temperature);
  cJSON_AddNumberToObject(sp, "top_k", q->top_k);
  cJSON_AddNumberToObject(sp, "top_p", q->top_p);
  cJSON_AddNumberToObject(sp, "min_p", q->min_p);
  cJSON_AddNumberToObject(sp, "presence_penalty", q->presence_penalty);
  cJSON_AddNumberToObject(sp, "frequency_penalty", q->frequency_penalty);
  cJSON_AddNumberToObject(sp, "repetition_penalty", q->repetition_penalty);
  if (q->has_seed) cJSON_AddNumberToObject(sp, "seed", (double)(q->seed + ci));
  cJSON_AddNumberToObject(sp, "logprobs", q->logprobs);
  cJSON *lb = cJSON_AddArrayToObject(sp, "logit_bias");
  for (int i = 0; i < q->n_bias; i++) {
    cJSON *pair = cJSON_CreateArray();
    cJSON_AddItemToArray(pair, cJSON_CreateNumber(q->bias[i].id));
    cJSON_AddItemToArray(pair, cJSON_CreateNumber(q->bias[i].bias));
    cJSON_AddItemToArray(lb, pair);
  }
  cJSON *st = cJSON_AddArrayToObject(m, "stop");
  for (int i = 0; i < q->n_stop; i++) cJSON_AddItemToArray(st, cJSON_CreateString(q->stop[i]));
  cJSON_AddArrayToObject(m, "stop_ids");
  cJSON_AddBoolToObject(m, "ignore_eos", q->ignore_eos);
  cJSON_AddNumberToObject(m, "deadline_ms", s->rc->request_timeout_ms > 0 ? s->rc->request_timeout_ms : 600000);
  cJSON_AddStringToObject(m, "mode", mode);
  if (peer_key) cJSON_AddStringToObject(m, peer_key, peer_name);
  return m;
}

// Picks the worker(s) for choice ci and builds its generate message(s): msgs[*n..] (owned by the caller) for the links
// to[*n..]; *n grows by 1 (colocated) or 2 (prefill + decode). w: (s->n_links) scratch. 0, or -1 with e.
static int route_choice_locked(rtr_server *s, rtr_req *r, int ci, rtr_sched_worker *w, cJSON **msgs, int *to, int *n,
                               rtr_error *e) {
  for (int i = 0; i < s->n_links; i++) {
    rtr_link *l = &s->links[i];
    w[i] = (rtr_sched_worker){l->up, l->cfg->role, l->running, l->waiting, l->free_blocks, l->total_blocks,
                              l->inflight, l->block_size};
  }
  rtr_sched_target pick;
  rtr_kvindex_weights wt = {s->rc->w_overlap, s->rc->w_queue, s->rc->w_free};
  if (rtr_sched_pick_kv(w, s->n_links, r->prompt, r->n_prompt, s->rc->disagg_threshold, s->kv, &wt, &pick, NULL) < 0)
    return rtr_fail(e, 503, "server_error", NULL, "no_worker", "no worker that can generate is available");
  rtr_choice *c = &r->ch[ci];
  c->link = pick.decode;
  c->plink = pick.prefill;
  s->links[pick.decode].inflight++;
  if (pick.prefill >= 0) {
    s->links[pick.prefill].inflight++;
    msgs[*n] = generate_msg(s, r, ci, "prefill", "decode", s->links[pick.decode].cfg->name);
    int fetch_blocks, peer = s->rc->prefix_fetch ? rtr_sched_prefix_peer(w, s->n_links, r->prompt, r->n_prompt, s->kv,
                                                                           pick.prefill, s->rc->prefix_fetch_min_blocks,
                                                                           &fetch_blocks)
                                                 : -1;
    if (peer >= 0) { // a peer prefill worker holds more of the prefix: the prefill worker may fetch it
      cJSON_AddStringToObject(msgs[*n], "prefix_peer", s->links[peer].cfg->name);
      cJSON_AddNumberToObject(msgs[*n], "prefix_blocks", fetch_blocks);
    }
    to[(*n)++] = pick.prefill;
    msgs[*n] = generate_msg(s, r, ci, "decode", "prefill", s->links[pick.prefill].cfg->name);
    to[(*n)++] = pick.decode;
  } else {
    msgs[*n] = generate_msg(s, r, ci, "local", NULL, NULL);
    to[(*n)++] = pick.decode;
  }
  return 0;
}

// Choice ci's decode (or both) worker, link dead, went away. When the choice has streamed no token and was not retried
// yet: cancel it at its prefill worker and send it once more, under a new id ("<id>-r"), to the workers the scheduler
// picks now. 0 when re-sent; -1 when it cannot be (the caller fails the request).
static int retry_locked(rtr_server *s, rtr_req *r, int ci, int dead) {
  rtr_choice *c = &r->ch[ci];
  if (c->link != dead || c->retried || c->completion_tokens > 0 || !r->admitted || r->finished) return -1;
  send_cancel(s, r, ci); // reaches the prefill worker only: the dead link has no peer any more
  if (c->plink >= 0 && s->links[c->plink].inflight > 0) s->links[c->plink].inflight--;
  c->link = c->plink = -1;
  c->retried = 1;
  char old[64];
  snprintf(old, sizeof old, "%s", c->id);
  snprintf(c->id, sizeof c->id, "%s-%d-r", r->id, ci);
  rtr_sched_worker *w = calloc((size_t)s->n_links + 1, sizeof *w);
  cJSON *msgs[2];
  int to[2], n = 0;
  rtr_error e;
  int rc = w ? route_choice_locked(s, r, ci, w, msgs, to, &n, &e) : -1;
  free(w);
  if (rc < 0) return -1;
  srv_log(LOGC, "%s: worker %s went away before the first token; retrying on %s%s%s", old, s->links[dead].cfg->name,
          s->links[c->link].cfg->name, c->plink >= 0 ? " via " : "", c->plink >= 0 ? s->links[c->plink].cfg->name : "");
  for (int i = 0; i < n; i++) {
    if (srv_peer_send(s->links[to[i]].peer, msgs[i]) < 0) srv_peer_close(s->links[to[i]].peer); // its close fails it
    cJSON_Delete(msgs[i]);
  }
  return 0;
}

// Admission then dispatch of every choice. 0, or -1 with e (r is then failed/finished by the caller).
static int admit_and_send(rtr_server *s, rtr_req *r, rtr_error *e) {
  pthread_mutex_lock(&s->mu);
  int up = 0;
  for (int i = 0; i < s->n_links; i++) up += s->links[i].up;
  if (s->stopping || s->draining) {
    pthread_mutex_unlock(&s->mu);
    return rtr_fail(e, 503, "server_error", NULL, "shutting_down", "the router is shutting down");
  }
  if (!up) {
    pthread_mutex_unlock(&s->mu);
    return rtr_fail(e, 503, "server_error", NULL, "no_worker", "no worker is available");
  }
  int need = r->q.n;
  int fits = s->running_slots == 0 || s->running_slots + need <= s->capacity;
  if (!(fits && !s->wait_head)) {
    if (s->n_waiting >= s->rc->queue_limit) {
      pthread_mutex_unlock(&s->mu);
      return rtr_fail(e, 429, "rate_limit_error", NULL, "queue_full",
                      "the server is busy (%d requests waiting); retry later", s->rc->queue_limit);
    }
    r->waiting = 1;
    if (s->wait_tail) s->wait_tail->wnext = r;
    else s->wait_head = r;
    s->wait_tail = r;
    s->n_waiting++;
    rtr_metric_set(s->m_waiting, s->n_waiting);
    int gone = 0;
    int64_t limit = r->t_arrival_us + (int64_t)(s->rc->request_timeout_ms > 0 ? s->rc->request_timeout_ms : 600000) * 1000;
    while (!s->stopping && !s->draining) {
      if (s->wait_head == r && (s->running_slots == 0 || s->running_slots + need <= s->capacity)) break;
      if (client_gone(r->fd) || now_us() > limit) {
        gone = 1;
        break;
      }
      struct timespec dl;
      deadline_in(&dl, WAIT_TICK_MS);
      pthread_cond_timedwait(&s->admit_cv, &s->mu, &dl);
    }
    for (rtr_req **pp = &s->wait_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->wnext)
      if (*pp == r) {
        *pp = r->wnext;
        if (s->wait_tail == r) s->wait_tail = prev;
        break;
      }
    r->wnext = NULL;
    r->waiting = 0;
    s->n_waiting--;
    rtr_metric_set(s->m_waiting, s->n_waiting);
    pthread_cond_broadcast(&s->admit_cv);
    if (gone || s->stopping || s->draining) {
      pthread_mutex_unlock(&s->mu);
      return rtr_fail(e, gone ? 499 : 503, "server_error", NULL, gone ? "cancelled" : "shutting_down",
                      gone ? "the client disconnected or the request timed out while queued" : "shutting down");
    }
  }
  r->admitted = 1;
  r->slots = need;
  s->running_slots += need;
  rtr_metric_set(s->m_running, s->running_slots);
  r->t_admit_us = now_us();
  rtr_metric_observe(s->m_queue, (double)(r->t_admit_us - r->t_arrival_us) / 1e6);
  rtr_metric_add(s->m_prompt, r->n_prompt);
  // pick a worker for every choice
  rtr_sched_worker *w = calloc((size_t)s->n_links + 1, sizeof *w);
  srv_peer **send_to = calloc((size_t)need * 2, sizeof *send_to);
  cJSON **msgs = calloc((size_t)need * 2, sizeof *msgs);
  int *to = calloc((size_t)need * 2, sizeof *to);
  int n_msgs = 0, rc = 0;
  if (!w || !send_to || !msgs || !to) rc = rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  for (int ci = 0; rc == 0 && ci < need; ci++) {
    int first = n_msgs;
    if ((rc = route_choice_locked(s, r, ci, w, msgs, to, &n_msgs, e)) < 0) break;
    for (int i = first; i < n_msgs; i++) send_to[i] = s->links[to[i]].peer;
    if (r->q.stream && r->q.kind == RTR_CHAT) { // the role comes first in every choice's stream
      cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
      cJSON *ch = cJSON_CreateObject();
      cJSON_AddNumberToObject(ch, "index", ci);
      cJSON *d = cJSON_AddObjectToObject(ch, "delta");
      cJSON_AddStringToObject(d, "role", "assistant");
      cJSON_AddStringToObject(d, "content", "");
      cJSON_AddNullToObject(ch, "logprobs");
      cJSON_AddNullToObject(ch, "finish_reason");
      cJSON_AddItemToArray(arr, ch);
      out_event(r, o);
    }
  }
  // the peers stay allocated while the hub lives, so sending outside the lock is safe
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < n_msgs; i++) {
    if (rc == 0 && srv_peer_send(send_to[i], msgs[i]) < 0) {
      // The link broke after the pick: close it (unless that was seen already) so that the dispatcher fails or retries
      // this request with the link's others, as for a worker that dies later.
      pthread_mutex_lock(&s->mu);
      if (s->links[to[i]].peer == send_to[i]) srv_peer_close(send_to[i]);
      pthread_mutex_unlock(&s->mu);
    }
    cJSON_Delete(msgs[i]);
  }
  free(w);
  free(send_to);
  free(msgs);
  free(to);
  return rc;
}

static enum MHD_Result do_generate(rtr_server *s, struct MHD_Connection *c, conn *cs, rtr_kind kind);

// Back to the configured idle timeout; MHD restarts the idle clock when the timeout was 0.
static void restore_timeout(rtr_server *s, struct MHD_Connection *c) {
  unsigned t = (unsigned)(s->rc->conn_timeout_s > 0 ? s->rc->conn_timeout_s : 60);
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, t);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  rtr_req *r = cls;
  rtr_server *s = r->s;
  pthread_mutex_lock(&s->mu);
  int64_t limit = r->t_arrival_us + (int64_t)(s->rc->request_timeout_ms > 0 ? s->rc->request_timeout_ms : 600000) * 1000 +
                  5000000;
  while (r->out_pos == r->out_len && !r->out_end) {
    if (client_gone(r->fd)) {
      cancel_locked(s, r);
      pthread_mutex_unlock(&s->mu);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (now_us() > limit) {
      rtr_error e;
      rtr_fail(&e, 504, "server_error", NULL, "timeout", "the request passed its deadline");
      fail_locked(s, r, &e);
      break;
    }
    struct timespec dl;
    deadline_in(&dl, WAIT_TICK_MS);
    pthread_cond_timedwait(&r->cv, &s->mu, &dl);
  }
  ssize_t n;
  if (r->out_pos < r->out_len) {
    size_t k = r->out_len - r->out_pos;
    if (k > max) k = max;
    memcpy(buf, r->out + r->out_pos, k);
    r->out_pos += k;
    n = (ssize_t)k;
  } else {
    n = MHD_CONTENT_READER_END_OF_STREAM;
  }
  pthread_mutex_unlock(&s->mu);
  if (n == MHD_CONTENT_READER_END_OF_STREAM) restore_timeout(s, r->conn);
  return n;
}

static void stream_free(void *cls) {
  rtr_req *r = cls;
  rtr_server *s = r->s;
  pthread_mutex_lock(&s->mu);
  req_unref_locked(r);
  pthread_mutex_unlock(&s->mu);
}

static cJSON *final_response(rtr_req *r) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "object", r->q.kind == RTR_CHAT ? "chat.completion" : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)r->created);
  cJSON_AddStringToObject(o, "model", r->s->model);
  cJSON *arr = cJSON_AddArrayToObject(o, "choices");
  for (int i = 0; i < r->q.n; i++) {
    rtr_choice *c = &r->ch[i];
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    if (r->q.kind == RTR_CHAT) {
      cJSON *m = cJSON_AddObjectToObject(ch, "message");
      cJSON_AddStringToObject(m, "role", "assistant");
      cJSON_AddStringToObject(m, "content", c->text ? c->text : "");
    } else {
      cJSON_AddStringToObject(ch, "text", c->text ? c->text : "");
    }
    if (r->q.logprobs >= 0) {
      cJSON_AddItemToObject(ch, "logprobs", c->lp ? c->lp : new_lp(r));
      c->lp = NULL;
    } else {
      cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", c->finish[0] ? c->finish : "stop");
    cJSON_AddItemToArray(arr, ch);
  }
  cJSON_AddItemToObject(o, "usage", usage_json(r));
  return o;
}

static enum MHD_Result do_generate(rtr_server *s, struct MHD_Connection *c, conn *cs, rtr_kind kind) {
  int64_t t0 = now_us();
  rtr_limits l = limits_of(s);
  rtr_error e;
  rtr_req *r = calloc(1, sizeof *r);
  if (!r) return reply_err(c, 500, "server_error", NULL, NULL, NULL, "out of memory");
  pthread_cond_init(&r->cv, NULL);
  r->s = s;
  r->t_arrival_us = t0;
  r->fd = -1;
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci) r->fd = ci->connect_fd;
  pthread_mutex_lock(&s->mu);
  r->refs = 1; // this connection
  s->n_live++;
  pthread_mutex_unlock(&s->mu);
  cs->req = r;
  r->conn = c;
  if (rtr_request_parse(kind, cs->body, cs->len, &l, &r->q, &e) < 0) return reply_error(c, &e, NULL, NULL);
  // no idle timeout while the worker generates (request_timeout_ms bounds it); restored, with the idle clock
  // restarted, once the answer is ready
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  if (tokenize(s, &r->q, &r->prompt, &r->n_prompt, &e) < 0) return reply_error(c, &e, NULL, NULL);
  if (rtr_check_context(r->n_prompt, r->q.max_tokens, s->n_ctx, &e) < 0) return reply_error(c, &e, NULL, NULL);
  r->max_tokens = r->q.max_tokens >= 0 ? r->q.max_tokens : s->n_ctx - r->n_prompt;
  r->ch = calloc((size_t)r->q.n, sizeof *r->ch);
  if (!r->ch) return reply_err(c, 500, "server_error", NULL, NULL, NULL, "out of memory");
  r->created = (long)time(NULL);
  pthread_mutex_lock(&s->mu);
  unsigned long long id = ++s->next_id;
  snprintf(r->id, sizeof r->id, "%s-%llx%06llu", kind == RTR_CHAT ? "chatcmpl" : "cmpl",
           (unsigned long long)t0 & 0xffffffffffULL, id);
  for (int i = 0; i < r->q.n; i++) {
    snprintf(r->ch[i].id, sizeof r->ch[i].id, "%s-%d", r->id, i);
    r->ch[i].index = i;
    r->ch[i].link = r->ch[i].plink = -1;
  }
  r->listed = 1;
  r->refs++;
  r->next = s->reqs;
  s->reqs = r;
  pthread_mutex_unlock(&s->mu);

  if (admit_and_send(s, r, &e) < 0) {
    pthread_mutex_lock(&s->mu);
    int was_admitted = r->admitted;
    r->q.stream = 0;
    fail_locked(s, r, &e);
    pthread_mutex_unlock(&s->mu);
    if (!was_admitted && e.status == 499) return MHD_NO;
    restore_timeout(s, c);
    return reply_error(c, &e, e.status == 429 ? "Retry-After" : NULL, "1");
  }
  if (r->q.stream) {
    pthread_mutex_lock(&s->mu);
    r->refs++; // the response's
    pthread_mutex_unlock(&s->mu);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, r, stream_free);
    if (!resp) {
      stream_free(r);
      return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return rc;
  }
  pthread_mutex_lock(&s->mu);
  int64_t limit = t0 + (int64_t)(s->rc->request_timeout_ms > 0 ? s->rc->request_timeout_ms : 600000) * 1000 + 5000000;
  while (!r->finished) {
    if (client_gone(r->fd)) {
      cancel_locked(s, r);
      pthread_mutex_unlock(&s->mu);
      return MHD_NO;
    }
    if (now_us() > limit) {
      rtr_fail(&e, 504, "server_error", NULL, "timeout", "the request passed its deadline");
      fail_locked(s, r, &e);
      break;
    }
    struct timespec dl;
    deadline_in(&dl, WAIT_TICK_MS);
    pthread_cond_timedwait(&r->cv, &s->mu, &dl);
  }
  cJSON *o = NULL;
  if (r->failed) e = r->err;
  else o = final_response(r);
  pthread_mutex_unlock(&s->mu);
  restore_timeout(s, c);
  if (!o) return reply_error(c, &e, NULL, NULL);
  return reply_json(c, 200, o);
}

typedef struct route {
  const char *path, *method;
  int kind; // 0 models, 1 health, 2 metrics, 3 chat, 4 completions, 5 tokenize, 6 detokenize
} route;

static const route ROUTES[] = {
    {"/v1/chat/completions", "POST", 3}, {"/v1/completions", "POST", 4}, {"/v1/models", "GET", 0},
    {"/health", "GET", 1},                {"/metrics", "GET", 2},         {"/tokenize", "POST", 5},
    {"/detokenize", "POST", 6},
};

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  rtr_server *s = cls;
  conn *cs = *con_cls;
  if (!cs) {
    cs = calloc(1, sizeof *cs);
    if (!cs) return MHD_NO;
    *con_cls = cs;
  }
  const route *rt = NULL;
  for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
    if (!strcmp(url, ROUTES[i].path)) rt = &ROUTES[i];
  if (!cs->first_done) {
    cs->first_done = 1;
    if (!rt) {
      cs->answered = 1;
      return reply_err(c, 404, "not_found_error", "not_found", NULL, NULL, "no such path: %.200s", url);
    }
    int is_head = !strcmp(method, "HEAD") && !strcmp(rt->method, "GET");
    if (strcmp(method, rt->method) && !is_head) {
      cs->answered = 1;
      return reply_err(c, 405, "invalid_request_error", "method_not_allowed", "Allow", rt->method,
                       "method %.20s is not allowed on %s (use %s)", method, rt->path, rt->method);
    }
    if (rt->kind != 1 && !auth_ok(s, c)) {
      cs->answered = 1;
      return reply_err(c, 401, "invalid_request_error", "invalid_api_key", "WWW-Authenticate", "Bearer",
                       "missing or invalid API key (Authorization: Bearer KEY)");
    }
    if (!strcmp(rt->method, "POST")) {
      if (!json_ctype_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        cs->answered = 1;
        return reply_err(c, 415, "invalid_request_error", "unsupported_media_type", NULL, NULL,
                         "the body must be application/json");
      }
      const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      if (cl && strtoull(cl, NULL, 10) > s->rc->max_body_bytes) {
        cs->answered = 1;
        return reply_err(c, 413, "invalid_request_error", "request_too_large", NULL, NULL,
                         "the body is larger than %zu bytes", s->rc->max_body_bytes);
      }
    }
    // answer on the next call, once MHD has read the (possibly empty) body: a response queued before that
    // makes MHD close the connection instead of keeping it alive
    return MHD_YES;
  }
  if (cs->answered) {
    *upload_size = 0; // discard whatever still arrives
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    if (cs->too_large || cs->len + n > s->rc->max_body_bytes) {
      cs->too_large = 1;
      return MHD_YES;
    }
    if (cs->len + n + 1 > cs->cap) {
      size_t nc = cs->cap * 2 + n + 1024;
      if (nc > s->rc->max_body_bytes + 1) nc = s->rc->max_body_bytes + 1;
      char *np = realloc(cs->body, nc);
      if (!np) return MHD_NO;
      cs->body = np;
      cs->cap = nc;
    }
    memcpy(cs->body + cs->len, upload, n);
    cs->len += n;
    return MHD_YES;
  }
  cs->answered = 1;
  if (cs->too_large)
    return reply_err(c, 413, "invalid_request_error", "request_too_large", NULL, NULL,
                     "the body is larger than %zu bytes", s->rc->max_body_bytes);
  switch (rt->kind) {
  case 0: return do_models(s, c);
  case 1: {
    int up = rtr_server_links_up(s);
    pthread_mutex_lock(&s->mu);
    int draining = s->draining;
    pthread_mutex_unlock(&s->mu);
    char b[96];
    int n = snprintf(b, sizeof b, "{\"status\":\"%s\",\"workers_up\":%d}",
                     draining ? "draining" : up ? "ok" : "unavailable", up);
    return reply(c, up && !draining ? 200 : 503, "application/json", b, (size_t)n, NULL, NULL);
  }
  case 2: return do_metrics(s, c);
  case 3: return do_generate(s, c, cs, RTR_CHAT);
  case 4: return do_generate(s, c, cs, RTR_COMPLETION);
  case 5: return do_tokenize(s, c, cs, 0);
  default: return do_tokenize(s, c, cs, 1);
  }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)c;
  rtr_server *s = cls;
  conn *cs = *con_cls;
  if (!cs) return;
  if (cs->req) {
    pthread_mutex_lock(&s->mu);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !cs->req->finished) cancel_locked(s, cs->req);
    req_unref_locked(cs->req);
    pthread_mutex_unlock(&s->mu);
  }
  free(cs->body);
  free(cs);
  *con_cls = NULL;
}

// ---------------------------------------------------------------------------------------------------------------

static void make_metrics(rtr_server *s) {
  static const double lat[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
                               20, 40, 80};
  static const double itl[] = {0.001, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                               0.75, 1, 2.5, 5};
  rtr_metrics *m = s->m;
  s->m_running = rtr_metrics_gauge(m, "dserve:num_requests_running", "Sequences running on the workers.", NULL);
  s->m_waiting = rtr_metrics_gauge(m, "dserve:num_requests_waiting", "Requests waiting for admission.", NULL);
  s->m_kv_usage = rtr_metrics_gauge(m, "dserve:kv_cache_usage_perc", "KV-cache usage (1 = full).", NULL);
  s->m_prompt = rtr_metrics_counter(m, "dserve:prompt_tokens_total", "Prompt tokens admitted.", NULL);
  s->m_gen = rtr_metrics_counter(m, "dserve:generation_tokens_total", "Tokens generated.", NULL);
  s->m_prefix_hits = rtr_metrics_counter(m, "dserve:prefix_cache_hits_total", "Prefix-cache hit tokens.", NULL);
  s->m_prefix_queries =
      rtr_metrics_counter(m, "dserve:prefix_cache_queries_total", "Prefix-cache queried tokens.", NULL);
  s->m_kv_bytes = rtr_metrics_counter(m, "dserve:kv_transfer_bytes_total", "KV bytes moved prefill -> decode.", NULL);
  s->m_ok_stop = rtr_metrics_counter(m, "dserve:request_success_total", "Finished choices.", "finished_reason=\"stop\"");
  s->m_ok_length = rtr_metrics_counter(m, "dserve:request_success_total", "", "finished_reason=\"length\"");
  s->m_fail = rtr_metrics_counter(m, "dserve:request_failure_total", "Requests that failed or were cancelled.", NULL);
  int nl = (int)(sizeof lat / sizeof lat[0]), ni = (int)(sizeof itl / sizeof itl[0]);
  s->m_ttft = rtr_metrics_histogram(m, "dserve:time_to_first_token_seconds", "Time to first token.", NULL, lat, nl);
  s->m_itl = rtr_metrics_histogram(m, "dserve:inter_token_latency_seconds", "Inter-token latency.", NULL, itl, ni);
  s->m_e2e = rtr_metrics_histogram(m, "dserve:e2e_request_latency_seconds", "End-to-end latency.", NULL, lat, nl);
  s->m_queue = rtr_metrics_histogram(m, "dserve:request_queue_time_seconds", "Time waiting for admission.", NULL, lat, nl);
  s->m_kv_time = rtr_metrics_histogram(m, "dserve:kv_transfer_time_seconds", "KV transfer time per request.", NULL, lat, nl);
}

int rtr_server_new(const rtr_server_opts *o, rtr_server **out, char *err, size_t errlen) {
  *out = NULL;
  rtr_server *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  s->cfg = o->cfg;
  s->rc = &o->cfg->router;
  s->gguf = o->gguf;
  s->has_template = o->gguf && mdl_gguf_find(o->gguf, "tokenizer.chat_template");
  s->tok = o->tok;
  s->n_ctx = o->n_ctx;
  s->started = (long)time(NULL);
  snprintf(s->model, sizeof s->model, "%s", o->model_name && o->model_name[0] ? o->model_name : o->cfg->model_name);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->link_cv, NULL);
  pthread_cond_init(&s->admit_cv, NULL);
  s->m = rtr_metrics_new();
  if (!s->m) {
    snprintf(err, errlen, "out of memory");
    rtr_server_free(s);
    return -1;
  }
  make_metrics(s);
  for (int i = 0; i < o->cfg->n_workers; i++)
    if (o->cfg->workers[i].role != SRV_ROLE_PREFILL)
      s->capacity += o->cfg->workers[i].max_seqs > 0 ? o->cfg->workers[i].max_seqs : 64;
  if (s->capacity <= 0) s->capacity = 64;
  srv_hub_opts ho = {.name = "router", .role = "router", .secret = o->cfg->secret, .host = NULL};
  if (srv_hub_new(&ho, &s->hub, err, errlen) < 0) {
    rtr_server_free(s);
    return -1;
  }
  if (pthread_create(&s->dispatcher, NULL, dispatcher_main, s) == 0) s->has_dispatcher = 1;
  s->links = calloc((size_t)o->cfg->n_workers + 1, sizeof *s->links);
  if (!s->links) {
    snprintf(err, errlen, "out of memory");
    rtr_server_free(s);
    return -1;
  }
  s->n_links = o->cfg->n_workers;
  // The index is a hint: without memory for it the router routes by load.
  if (s->n_links > 0 && rtr_kvindex_new(s->n_links, 1 << 16, &s->kv, err, errlen) < 0) s->kv = NULL;
  for (int i = 0; i < s->n_links; i++) {
    s->links[i].s = s;
    s->links[i].cfg = &o->cfg->workers[i];
    if (pthread_create(&s->links[i].thread, NULL, link_main, &s->links[i]) == 0) s->links[i].has_thread = 1;
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)s->rc->port);
  const char *host = s->rc->host[0] ? s->rc->host : "127.0.0.1";
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    snprintf(err, errlen, "router host '%s' is not an IPv4 address", host);
    rtr_server_free(s);
    return -1;
  }
  unsigned timeout = (unsigned)(s->rc->conn_timeout_s > 0 ? s->rc->conn_timeout_s : 60);
  s->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL,
                            0, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, timeout, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000, MHD_OPTION_LISTENING_ADDRESS_REUSE,
                            (unsigned)1, MHD_OPTION_END);
  if (!s->mhd) {
    snprintf(err, errlen, "cannot listen on %s:%d: %s", host, s->rc->port, strerror(errno));
    rtr_server_free(s);
    return -1;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : s->rc->port;
  *out = s;
  return 0;
}

int rtr_server_port(const rtr_server *s) { return s->port; }

// Waits (s->mu held) until no generation request is live or until end_us.
static void wait_idle_locked(rtr_server *s, int64_t end_us) {
  while (s->n_live > 0 && now_us() < end_us) {
    struct timespec dl;
    deadline_in(&dl, WAIT_TICK_MS);
    pthread_cond_timedwait(&s->admit_cv, &s->mu, &dl);
  }
}

int rtr_server_drain(rtr_server *s, int timeout_ms) {
  pthread_mutex_lock(&s->mu);
  s->draining = 1;
  pthread_cond_broadcast(&s->admit_cv); // queued requests leave with 503 shutting_down
  wait_idle_locked(s, now_us() + (int64_t)timeout_ms * 1000);
  int left = s->n_live;
  if (left) { // past the bound: fail what still runs, and give the clients DRAIN_FLUSH_MS to read the error
    rtr_error e;
    rtr_fail(&e, 503, "server_error", NULL, "shutting_down", "the router stopped before the request finished");
    for (rtr_req *r = s->reqs, *n; r; r = n) {
      n = r->next;
      fail_locked(s, r, &e);
    }
    wait_idle_locked(s, now_us() + DRAIN_FLUSH_MS * 1000);
  }
  pthread_mutex_unlock(&s->mu);
  return left;
}

void rtr_server_free(rtr_server *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  rtr_error e;
  rtr_fail(&e, 503, "server_error", NULL, "shutting_down", "the router is shutting down");
  for (rtr_req *r = s->reqs, *n; r; r = n) {
    n = r->next;
    fail_locked(s, r, &e);
  }
  pthread_cond_broadcast(&s->link_cv);
  pthread_cond_broadcast(&s->admit_cv);
  pthread_mutex_unlock(&s->mu);
  if (s->mhd) MHD_stop_daemon(s->mhd);
  for (int i = 0; i < s->n_links; i++)
    if (s->links[i].has_thread) pthread_join(s->links[i].thread, NULL);
  if (s->hub) srv_hub_wake(s->hub);
  if (s->has_dispatcher) pthread_join(s->dispatcher, NULL);
  for (int i = 0; i < s->n_links; i++)
    if (s->links[i].peer) srv_peer_unref(s->links[i].peer);
  srv_hub_free(s->hub);
  free(s->links);
  rtr_kvindex_free(s->kv);
  rtr_metrics_free(s->m);
  pthread_cond_destroy(&s->link_cv);
  pthread_cond_destroy(&s->admit_cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
