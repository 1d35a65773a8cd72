// router/http.c: the router's top layer (libmicrohttpd, thread per connection): routes, replies, endpoints.
// Auth, /v1/models, /health, /metrics, (de)tokenize, a generation request from body to answer (built, run and
// stopped by server.c).
// A connection's thread blocks while its request waits for a worker (rtr_wait_locked, the stream reader), so each
// connection has its own thread; conns.c accepts them and caps how many are open.
#include <errno.h>
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
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "models/chat.h"
#include "router/server_int.h"
#include "util/err.h"
#include "util/log.h"


typedef struct conn {          // one request on a connection
  utl_buf body;                // the request body so far (at most max_body_bytes; p NULL while empty)
  int too_large, first_done, answered;
  rtr_req *req;                // (reference) once a generation request is made
  int deferred;                // refused at its head but answered once MHD has read it (keeps the connection open)
  rtr_error err;               // ... with this error
  const char *h1, *v1;         // ... and this header (static strings, NULL: none)
} conn;

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

// The client closed or broke its socket (fd; -1: unknown).
int rtr_client_gone(int fd) {
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

// Authorization: Bearer KEY, the scheme in any case (RFC 7235), the key compared exactly in constant time.
static int auth_ok(rtr_server *s, struct MHD_Connection *c) {
  if (s->rc->n_api_keys == 0) return 1;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncasecmp(h, "Bearer", 6) || (h[6] != ' ' && h[6] != '\t')) return 0;
  const char *k = h + 6;
  while (*k == ' ' || *k == '\t') k++;
  int ok = 0;
  for (int i = 0; i < s->rc->n_api_keys; i++) ok |= ctl_consttime_eq(k, s->rc->api_keys[i]); // every key compared
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

static cJSON *model_object(rtr_server *s) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", s->model);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)s->started);
  cJSON_AddStringToObject(m, "owned_by", "dserve");
  cJSON_AddNumberToObject(m, "max_model_len", s->n_ctx);
  // which chat template renders (docs/openai.md, "Chat templates"): said at start-up too
  cJSON_AddStringToObject(m, "chat_template_source", s->chat_source[0] ? s->chat_source : "none (not a chat model)");
  return m;
}

static enum MHD_Result do_models(rtr_server *s, struct MHD_Connection *c) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_object(s));
  return reply_json(c, 200, o);
}

// GET /v1/models/{id}: the served model, or 404 model_not_found (the id may hold slashes: "org/name").
static enum MHD_Result do_model(rtr_server *s, struct MHD_Connection *c, const char *id) {
  if (strcmp(id, s->model))
    return reply_err(c, 404, "not_found_error", "model_not_found", NULL, NULL,
                     "The model '%.100s' does not exist; this server serves '%.100s'", id, s->model);
  return reply_json(c, 200, model_object(s));
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

// Renders and encodes the prompt of q (one, pr, of a completion's; else its messages or tokenize's prompt) into *ids
// (n). 0, or -1 with e.
static int tokenize(rtr_server *s, const rtr_request *q, const rtr_prompt *pr, int32_t **ids, int *n, rtr_error *e) {
  char err[256];
  if (pr && pr->ids) {
    *ids = malloc(((size_t)pr->n_ids + 1) * sizeof **ids);
    if (!*ids) return rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    memcpy(*ids, pr->ids, (size_t)pr->n_ids * sizeof **ids);
    *n = pr->n_ids;
    return 0;
  }
  char *text = NULL;
  size_t *spans = NULL, n_spans = 0; // a chat's own text: no control token is matched in it (models/chat.h)
  const char *p = pr ? pr->text : q->prompt;
  size_t plen = pr ? pr->len : q->prompt_len;
  if (q->msgs) { // the chat template's rendering (router/prompt.c)
    if (rtr_chat_prompt(s, q, &text, &spans, &n_spans, e) < 0) return -1;
    p = text;
    plen = strlen(text);
  }
  int32_t *raw = NULL;
  size_t nraw = 0;
  int rc = text ? mdl_tok_encode_guarded(s->tok, text, plen, spans, n_spans, &raw, &nraw, err, sizeof err)
                : mdl_tok_encode(s->tok, p ? p : "", p ? plen : 0, 1, &raw, &nraw, err, sizeof err);
  free(text);
  free(spans);
  if (rc < 0) return rtr_fail(e, 400, "invalid_request_error", "prompt", NULL, "tokenizer: %s", err);
  // A chat's rendering carries no BOS text (models/chat.h): as llama-server tokenizes it, BOS comes from the vocabulary
  int bos = q->add_special && mdl_tok_add_bos(s->tok) && mdl_tok_bos(s->tok) >= 0;
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

// The request limits; with defaults (caller's storage), also the sampling a generation request gets for the fields
// it leaves out: the config's "sampling", else the GGUF's general.sampling.*, else llama-server's (docs/openai.md).
static rtr_limits limits_of(rtr_server *s, rtr_sampling *defaults) {
  rtr_limits l = {s->model, s->n_ctx, s->rc->max_tokens_limit, s->rc->max_n,
                  s->rc->max_stop, mdl_tok_n_vocab(s->tok), NULL, !s->rc->strict_model_name, s->n_embd};
  if (defaults) {
    rtr_sampling_resolve(&s->cfg->sampling, s->gguf, defaults, NULL, 0);
    l.defaults = defaults;
  }
  return l;
}

static enum MHD_Result do_tokenize(rtr_server *s, struct MHD_Connection *c, conn *cs, int detok) {
  rtr_limits l = limits_of(s, NULL);
  rtr_request q;
  rtr_error e;
  if (rtr_request_parse(detok ? RTR_DETOKENIZE : RTR_TOKENIZE, cs->body.p, cs->body.n, &l, &q, &e) < 0)
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
    if (tokenize(s, &q, NULL, &ids, &n, &e) < 0) {
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

// Back to the configured idle timeout; MHD restarts the idle clock when the timeout was 0.
void rtr_restore_timeout(rtr_server *s, struct MHD_Connection *c) {
  unsigned t = (unsigned)s->rc->conn_timeout_s;
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, t);
}

// What a streamed response's connection reads: the request's SSE bytes as they come (MHD content reader). The
// dispatcher queues records (r->pend) under s->mu; they are taken in one swap and formatted here, unlocked.
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  rtr_req *r = cls;
  rtr_server *s = r->s;
  if (r->out_pos == r->out.n) { // all formatted bytes sent: take what was queued since
    pthread_mutex_lock(&s->mu);
    // router.stream_flush_ms: sleep until the flush is due whatever comes meanwhile (a token does not wake a paced
    // reader; its end, a slow end or a cancel does), so that one wake takes several steps' tokens
    while (r->flush_due_us && !r->out_end && !r->slow && utl_now_us() < r->flush_due_us) {
      r->paced = 1;
      struct timespec dl = utl_deadline_ms((int)((r->flush_due_us - utl_now_us() + 999) / 1000));
      pthread_cond_timedwait(&r->cv, &s->mu, &dl);
    }
    r->paced = 0;
    while (!r->pend.n && !r->out_end && !r->slow) {
      rtr_wait w = rtr_wait_locked(s, r);
      if (w == RTR_WAIT_GONE) {
        pthread_mutex_unlock(&s->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
      if (w == RTR_WAIT_TIMEOUT) break;
    }
    if (r->slow) { // it stopped reading and was ended (relay.c): no trailer
      pthread_mutex_unlock(&s->mu);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    utl_buf t = r->taken; // (empty) the reader's: pend becomes it, and it the new pend
    r->taken = r->pend;
    r->pend = t;
    if (s->rc->stream_flush_ms > 0) r->flush_due_us = utl_now_us() + (int64_t)s->rc->stream_flush_ms * 1000;
    pthread_mutex_unlock(&s->mu);
    utl_buf_reset(&r->out);
    r->out_pos = 0;
    rtr_out_format(r);
  }
  ssize_t n;
  if (r->out_pos < r->out.n) {
    size_t k = r->out.n - r->out_pos;
    if (k > max) k = max;
    memcpy(buf, r->out.p + r->out_pos, k);
    r->out_pos += k;
    n = (ssize_t)k;
  } else {
    n = MHD_CONTENT_READER_END_OF_STREAM; // the trailer was read (or the request passed its bound)
  }
  if (n == MHD_CONTENT_READER_END_OF_STREAM) rtr_restore_timeout(s, r->conn);
  return n;
}

static void stream_free(void *cls) {
  rtr_req *r = cls;
  rtr_server *s = r->s;
  pthread_mutex_lock(&s->mu);
  rtr_req_unref_locked(r);
  pthread_mutex_unlock(&s->mu);
}

// A request without a seed samples from a fresh random one (choice i uses seed + i, links.c), so that its choices and
// two such requests differ; 52 bits keep seed + i exact in the message's JSON number.
static void draw_seed(rtr_server *s, rtr_request *q) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) { // no entropy yet: the clock and a counter
    pthread_mutex_lock(&s->mu);
    unsigned long long k = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    v = (uint64_t)utl_now_us() * 0x9E3779B97F4A7C15ULL ^ k * 0xBF58476D1CE4E5B9ULL;
  }
  q->seed = (int64_t)(v & ((1ULL << 52) - 1));
  q->has_seed = 1;
}

// Tokenizes r's prompts (a completion's list, else the one prompt) back to back into r->prompt, checks each against
// the context and the request against router.max_choices and max_request_tokens (docs/openai.md, "Limits"), and makes
// r's choices: q.n per prompt, each pointing at its prompt. 0, or -1 with e.
static int make_choices(rtr_server *s, rtr_req *r, rtr_error *e) {
  const rtr_request *q = &r->q;
  const int embd = q->kind == RTR_EMBEDDING, listed = q->kind == RTR_COMPLETION || embd; // a list of prompts
  int groups = listed ? q->n_prompts : 1, total = 0, rc = 0;
  if (embd && groups > s->rc->max_choices)
    return rtr_fail(e, 400, "invalid_request_error", "input", "too_many_choices", "the request has %d inputs; "
                    "router.max_choices allows at most %d", groups, s->rc->max_choices);
  if ((long long)groups * q->n > s->rc->max_choices)
    return rtr_fail(e, 400, "invalid_request_error", "n", "too_many_choices",
                    "the request asks for %d choices (%d prompt%s x n %d); router.max_choices allows at most %d",
                    groups * q->n, groups, groups == 1 ? "" : "s", q->n, s->rc->max_choices);
  // what the choices may hold at most: each its prompt and its max_tokens (the rest of the context when not given)
  long long tokens = 0, budget = s->rc->max_request_tokens > 0 ? s->rc->max_request_tokens
                                                               : (long long)s->rc->max_choices * s->n_ctx;
  int32_t **ids = calloc((size_t)groups, sizeof *ids);
  int *lens = calloc((size_t)groups, sizeof *lens);
  if (!ids || !lens) rc = rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  for (int g = 0; g < groups && rc == 0; g++) {
    if ((rc = tokenize(s, q, listed ? &q->prompts[g] : NULL, &ids[g], &lens[g], e)) == 0 &&
        (rc = rtr_check_context(q->kind, lens[g], q->max_tokens, s->n_ctx, e)) < 0 && groups > 1 &&
        (!strcmp(e->param, "prompt") || !strcmp(e->param, "input")))
      snprintf(e->param, sizeof e->param, "%s[%d]", embd ? "input" : "prompt", g);
    if (rc < 0 && embd && !strcmp(e->param, "prompt")) snprintf(e->param, sizeof e->param, "input"); // the tokenizer's
    if (rc == 0 && lens[g] > INT32_MAX - total)
      rc = rtr_fail(e, 400, "invalid_request_error", "prompt", NULL, "the prompts are too long");
    if (rc == 0) total += lens[g];
    if (rc == 0) // an embedding holds its input only
      tokens += embd ? lens[g] : (long long)q->n * (q->max_tokens >= 0 ? lens[g] + q->max_tokens : s->n_ctx);
  }
  if (rc == 0 && tokens > budget && embd)
    rc = rtr_fail(e, 400, "invalid_request_error", "input", "too_many_tokens", "the request's %d inputs hold %lld "
                  "tokens; router.max_request_tokens allows at most %lld", groups, tokens, budget);
  else if (rc == 0 && tokens > budget)
    rc = rtr_fail(e, 400, "invalid_request_error", "max_tokens", "too_many_tokens",
                  "the request's %d choices hold up to %lld tokens (prompt + max_tokens each, the context when "
                  "max_tokens is not given); router.max_request_tokens allows at most %lld: lower max_tokens, n or the "
                  "prompts", groups * q->n, tokens, budget);
  if (rc == 0 && (!(r->prompt = malloc((size_t)total * sizeof *r->prompt)) ||
                  !(r->ch = calloc((size_t)(groups * q->n), sizeof *r->ch))))
    rc = rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  for (int g = 0, at = 0; g < groups && rc == 0; at += lens[g], g++) {
    memcpy(r->prompt + at, ids[g], (size_t)lens[g] * sizeof *ids[g]);
    for (int i = 0; i < q->n; i++) {
      rtr_choice *c = &r->ch[g * q->n + i];
      c->index = g * q->n + i;
      c->link = c->plink = -1;
      c->prompt = r->prompt + at;
      c->n_prompt = lens[g];
      c->max_tokens = q->max_tokens >= 0 ? q->max_tokens : s->n_ctx - lens[g];
    }
  }
  if (rc == 0) {
    r->n_prompt = total;
    r->n_ch = groups * q->n;
  }
  for (int g = 0; ids && g < groups; g++) free(ids[g]);
  free(ids);
  free(lens);
  return rc;
}

// A generation request refused before it was admitted: the access log reads its error from r.
static enum MHD_Result refuse(struct MHD_Connection *c, rtr_req *r, const rtr_error *e) {
  r->err = *e;
  r->failed = 1;
  return reply_error(c, e, NULL, NULL);
}

// kind: chat (api: RTR_API_CHAT, or RTR_API_RESPONSES for /v1/responses) or completion.
static enum MHD_Result do_generate(rtr_server *s, struct MHD_Connection *c, conn *cs, rtr_kind kind, int api) {
  int64_t t0 = utl_now_us();
  rtr_sampling defaults;
  rtr_limits l = limits_of(s, &defaults);
  rtr_error e;
  rtr_req *r = calloc(1, sizeof *r);
  if (!r) return reply_err(c, 500, "server_error", NULL, NULL, NULL, "out of memory");
  utl_cond_init_monotonic(&r->cv); // rtr_wait_locked waits on it with a deadline
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
  r->route = api == RTR_API_RESPONSES ? "/v1/responses"
             : kind == RTR_CHAT       ? "/v1/chat/completions"
             : kind == RTR_EMBEDDING  ? "/v1/embeddings"
                                      : "/v1/completions";
  rtr_observe_begin(s, r, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "traceparent"));
  if ((api == RTR_API_RESPONSES ? rtr_request_parse_responses(cs->body.p, cs->body.n, &l, &r->q, &e)
                                : rtr_request_parse(kind, cs->body.p, cs->body.n, &l, &r->q, &e)) < 0)
    return refuse(c, r, &e);
  if (kind == RTR_EMBEDDING && s->embd_refusal[0]) { // the model's pooling (router/server.c embeddings_init)
    rtr_fail(&e, 400, "invalid_request_error", "model", "model_not_embedding", "%s", s->embd_refusal);
    return refuse(c, r, &e);
  }
  if (!r->q.has_seed) draw_seed(s, &r->q);
  if (make_choices(s, r, &e) < 0) {
    if (api == RTR_API_RESPONSES && !strcmp(e.param, "messages")) snprintf(e.param, sizeof e.param, "input");
    return refuse(c, r, &e);
  }
  // no idle timeout while the worker generates (request_timeout_ms bounds it); restored, with the idle clock
  // restarted, once the answer is ready
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  r->created = (long)time(NULL);
  pthread_mutex_lock(&s->mu);
  unsigned long long id = ++s->next_id;
  const char *prefix = api == RTR_API_RESPONSES ? "resp"
                       : kind == RTR_CHAT       ? "chatcmpl"
                       : kind == RTR_EMBEDDING  ? "embd"
                                                : "cmpl";
  snprintf(r->id, sizeof r->id, "%s-%llx%06llu", prefix,
           (unsigned long long)t0 & 0xffffffffffULL, id);
  for (int i = 0; i < r->n_ch; i++) snprintf(r->ch[i].id, sizeof r->ch[i].id, "%s-%d", r->id, i);
  int listed = rtr_req_list_locked(s, r);
  pthread_mutex_unlock(&s->mu);
  if (listed < 0) {
    rtr_fail(&e, 500, "server_error", NULL, "internal_error", "out of memory");
    return refuse(c, r, &e);
  }

  if (rtr_admit_and_send(s, r, &e) < 0) {
    pthread_mutex_lock(&s->mu);
    int was_admitted = r->admitted;
    r->q.stream = 0;
    rtr_fail_locked(s, r, &e);
    pthread_mutex_unlock(&s->mu);
    if (!was_admitted && e.status == 499) return MHD_NO;
    rtr_restore_timeout(s, c);
    return reply_error(c, &e, e.status == 429 ? "Retry-After" : NULL, "1");
  }
  if (r->q.stream) {
    pthread_mutex_lock(&s->mu);
    r->refs++; // the response's
    pthread_mutex_unlock(&s->mu);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, r, stream_free);
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
  while (!r->finished) {
    rtr_wait w = rtr_wait_locked(s, r);
    if (w == RTR_WAIT_GONE) {
      pthread_mutex_unlock(&s->mu);
      return MHD_NO;
    }
    if (w == RTR_WAIT_TIMEOUT) break;
  }
  cJSON *o = NULL;
  if (r->failed) e = r->err;
  else if ((o = rtr_final_response(r)) && r->q.api == RTR_API_RESPONSES) o = rtr_resp_from_chat(&r->q, o);
  pthread_mutex_unlock(&s->mu);
  rtr_restore_timeout(s, c);
  if (!o) return reply_error(c, &e, NULL, NULL);
  return reply_json(c, 200, o);
}

typedef struct route {
  const char *path, *method;
  int kind; // 0 models, 1 health, 2 metrics, 3 chat, 4 completions, 5 tokenize, 6 detokenize, 7 one model, 8 live,
            // 9 responses, 10 embeddings, 11 cluster
} route;

static const route ROUTES[] = {
    {"/v1/chat/completions", "POST", 3}, {"/v1/completions", "POST", 4}, {"/v1/models", "GET", 0},
    {"/health", "GET", 1},                {"/metrics", "GET", 2},         {"/tokenize", "POST", 5},
    {"/detokenize", "POST", 6},           {"/ready", "GET", 1},           {"/live", "GET", 8},
    {"/v1/responses", "POST", 9},         {"/v1/embeddings", "POST", 10},
    {"/v1/cluster", "GET", 11}, // the membership view (cluster.c)
};
static const route MODEL_ROUTE = {"/v1/models/", "GET", 7}; // a prefix: the rest of the path is the model id

static const route *find_route(const char *url) {
  for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
    if (!strcmp(url, ROUTES[i].path)) return &ROUTES[i];
  size_t n = strlen(MODEL_ROUTE.path);
  return !strncmp(url, MODEL_ROUTE.path, n) && url[n] ? &MODEL_ROUTE : NULL;
}

// A request refused at its head. Without a body it is answered on the next call, once MHD has read the request:
// the connection then stays open and a pipelined request behind it is answered too. With a body it is answered now
// (MHD then closes the connection rather than read a body nobody wants).
// ---- message framing (RFC 9112): what a proxy in front could read differently is refused, not guessed ----

typedef struct framing {
  int n_cl, n_te, cl_differ, cl_bad, te_bad, name_bad;
  const char *cl;     // the first Content-Length value
  char bad_name[64];  // the first header name that is not an RFC 9110 token
} framing;

// A header name must be a token: no whitespace (libmicrohttpd keeps "Transfer-Encoding " of "Transfer-Encoding :"),
// no separators, no control characters.
static int token_ok(const char *k) {
  if (!*k) return 0;
  for (const unsigned char *p = (const unsigned char *)k; *p; p++)
    if (*p <= 32 || *p >= 127 || strchr("\"(),/:;<=>?@[\\]{}", *p)) return 0;
  return 1;
}

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  (void)kind;
  framing *f = cls;
  if (!token_ok(key) && !f->name_bad++) snprintf(f->bad_name, sizeof f->bad_name, "%.60s", key);
  if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
    const char *v = value ? value : "";
    size_t n = strspn(v, "0123456789");
    if (n == 0 || v[n] || n > 19) f->cl_bad = 1;
    if (f->n_cl++ == 0) f->cl = v;
    else if (strcmp(f->cl, v)) f->cl_differ = 1;
  } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
    f->n_te++;
    if (!value || strcasecmp(value, "chunked")) f->te_bad = 1; // the only coding this server reads
  }
  return MHD_YES;
}

// Why the request head's framing is refused (a static message), or NULL when it is fine: both Content-Length and
// Transfer-Encoding (the smuggling classic), differing or malformed Content-Lengths, a transfer coding other than
// chunked, a header name that is not a token.
static const char *framing_error(struct MHD_Connection *c, char *buf, size_t cap) {
  framing f = {0};
  MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
  if (f.name_bad) {
    snprintf(buf, cap, "header name '%s' is not a token (whitespace before the colon, or a separator)", f.bad_name);
    return buf;
  }
  if (f.n_cl && f.n_te) return "both Content-Length and Transfer-Encoding: the body's length is ambiguous";
  if (f.cl_differ) return "Content-Length headers that differ";
  if (f.cl_bad) return "Content-Length is not a decimal number";
  if (f.n_te > 1 || f.te_bad) return "Transfer-Encoding other than one 'chunked' is not supported";
  return NULL;
}

static enum MHD_Result refuse_head(struct MHD_Connection *c, conn *cs, int status, const char *type,
                                   const char *code, const char *h1, const char *v1, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
static enum MHD_Result refuse_head(struct MHD_Connection *c, conn *cs, int status, const char *type,
                                   const char *code, const char *h1, const char *v1, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rtr_fail(&cs->err, status, type, NULL, code, "%s", msg);
  cs->answered = 1;
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
  if (!te && (!cl || strtoull(cl, NULL, 10) == 0)) {
    cs->deferred = 1;
    cs->h1 = h1;
    cs->v1 = v1;
    return MHD_YES;
  }
  return reply_error(c, &cs->err, h1, v1);
}

enum MHD_Result rtr_http_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  rtr_server *s = cls;
  conn *cs = *con_cls;
  if (!cs) { // a new request: its head is complete
    cs = calloc(1, sizeof *cs);
    if (!cs) return MHD_NO;
    *con_cls = cs;
    rtr_gate_head_seen(s, c);
  }
  const route *rt = find_route(url);
  if (!cs->first_done) {
    cs->first_done = 1;
    char fb[160];
    const char *bad = framing_error(c, fb, sizeof fb);
    if (bad) { // answered before the body is read: MHD closes the connection, so nothing after it is read either
      cs->answered = 1;
      return reply_err(c, 400, "invalid_request_error", "bad_framing", MHD_HTTP_HEADER_CONNECTION, "close", "%s",
                       bad);
    }
    if (!rt) return refuse_head(c, cs, 404, "not_found_error", "not_found", NULL, NULL, "no such path: %.200s", url);
    int is_head = !strcmp(method, "HEAD") && !strcmp(rt->method, "GET");
    if (strcmp(method, rt->method) && !is_head)
      return refuse_head(c, cs, 405, "invalid_request_error", "method_not_allowed", "Allow", rt->method,
                         "method %.20s is not allowed on %s (use %s)", method, rt->path, rt->method);
    int open_route = rt->kind == 1 || rt->kind == 8 || (rt->kind == 2 && s->rc->metrics_public); // health, live
    if (!open_route && !auth_ok(s, c))
      return refuse_head(c, cs, 401, "invalid_request_error", "invalid_api_key", "WWW-Authenticate", "Bearer",
                         "missing or invalid API key (Authorization: Bearer KEY)");
    if (!strcmp(rt->method, "POST")) {
      if (!json_ctype_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE)))
        return refuse_head(c, cs, 415, "invalid_request_error", "unsupported_media_type", NULL, NULL,
                           "the body must be application/json");
      const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      if (cl && strtoull(cl, NULL, 10) > s->rc->max_body_bytes) {
        cs->answered = 1;
        return reply_err(c, 413, "invalid_request_error", "request_too_large", NULL, NULL,
                         "the body is larger than %zu bytes", s->rc->max_body_bytes);
      }
    }
    // answer on the next call, once MHD has read the (possibly empty) body: a response queued before that
    // makes MHD close the connection instead of keeping it alive. The body is due within body_timeout_s (conns.c).
    rtr_gate_body_start(s, c);
    return MHD_YES;
  }
  if (cs->answered) {
    if (cs->deferred && !*upload_size) {
      cs->deferred = 0;
      return reply_error(c, &cs->err, cs->h1, cs->v1);
    }
    *upload_size = 0; // discard whatever still arrives
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    rtr_gate_body_read(s, c, n);
    if (cs->too_large || cs->body.n + n > s->rc->max_body_bytes) {
      cs->too_large = 1;
      return MHD_YES;
    }
    return utl_buf_add(&cs->body, upload, n) ? MHD_NO : MHD_YES;
  }
  if (rtr_gate_body_done(s, c)) return MHD_NO; // late: the gate answered 408 and shut the socket
  cs->answered = 1;
  if (cs->too_large)
    return reply_err(c, 413, "invalid_request_error", "request_too_large", NULL, NULL,
                     "the body is larger than %zu bytes", s->rc->max_body_bytes);
  switch (rt->kind) {
  case 0: return do_models(s, c);
  case 7: return do_model(s, c, url + strlen(MODEL_ROUTE.path));
  case 1: { // /health and /ready (readiness): 200 only while a generation can be served
    int up = rtr_server_links_up(s), serving = rtr_server_serving_up(s);
    pthread_mutex_lock(&s->mu);
    int draining = s->draining;
    pthread_mutex_unlock(&s->mu);
    const char *reason = draining ? "the router is draining (SIGTERM)"
                         : serving ? NULL
                         : up      ? "no decode or both worker is up: the linked prefill workers cannot finish a request"
                                   : "no worker is up";
    char b[256];
    int n = snprintf(b, sizeof b, "{\"status\":\"%s\",\"workers_up\":%d,\"serving_workers\":%d%s%s%s}",
                     draining ? "draining" : serving ? "ok" : "unavailable", up, serving, reason ? ",\"reason\":\"" : "",
                     reason ? reason : "", reason ? "\"" : "");
    return reply(c, reason ? 503 : 200, "application/json", b, (size_t)n, NULL, NULL);
  }
  case 8: // /live (liveness): the router answers, whatever its workers do
    return reply(c, 200, "application/json", "{\"status\":\"alive\"}", 18, NULL, NULL);
  case 2: return do_metrics(s, c);
  case 11: {
    cJSON *view = rtr_cluster_view(s);
    return view ? reply_json(c, 200, view) : reply_err(c, 500, "server_error", NULL, NULL, NULL, "out of memory");
  }
  case 3: return do_generate(s, c, cs, RTR_CHAT, RTR_API_CHAT);
  case 4: return do_generate(s, c, cs, RTR_COMPLETION, RTR_API_CHAT);
  case 9: return do_generate(s, c, cs, RTR_CHAT, RTR_API_RESPONSES);
  case 10: return do_generate(s, c, cs, RTR_EMBEDDING, RTR_API_CHAT);
  case 5: return do_tokenize(s, c, cs, 0);
  default: return do_tokenize(s, c, cs, 1);
  }
}

void rtr_http_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  rtr_server *s = cls;
  conn *cs = *con_cls;
  if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) rtr_gate_request_done(s, c);
  if (!cs) return;
  if (cs->req) {
    pthread_mutex_lock(&s->mu);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !cs->req->finished) rtr_cancel_locked(s, cs->req);
    int status = cs->req->failed ? cs->req->err.status : 200;
    pthread_mutex_unlock(&s->mu);
    rtr_observe_end(s, cs->req, status); // the access log line (the connection's reference keeps it)
    pthread_mutex_lock(&s->mu);
    rtr_req_unref_locked(cs->req);
    pthread_mutex_unlock(&s->mu);
  }
  utl_buf_free(&cs->body);
  free(cs);
  *con_cls = NULL;
}

// The HTTP layer's answer to the layers below: whether a request's client is still there.
void rtr_http_register(rtr_server *s) { s->hooks.client_gone = rtr_client_gone; }
