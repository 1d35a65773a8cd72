// router/relay.c: the OpenAI layer's answers: SSE chunks (the role first, text deltas, tool-call deltas, the trailer),
// the final response, logprobs and usage, from what the workers send (registered as s->hooks; see rtr_relay_register).
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "models/chat.h"
#include "router/server_int.h"
#include "util/log.h"
#include "util/crypto.h"
#include "util/vec.h"

// ---------------------------------------------------------------------------------------------------------------
// output buffers

// Appends to r->out (stream bytes) or a choice's text. On out of memory only this piece is lost and later ones still
// go in, as with the hand-written buffers before utl_buf: the callers never checked, so the sticky flag is cleared.
static void add_or_drop(utl_buf *b, const char *p, size_t n) {
  if (utl_buf_add(b, p, n) < 0) b->oom = 0; // b is as it was before the call
}

// ---------------------------------------------------------------------------------------------------------------
// a stream's queue (server_int.h, rtr_req.pend): records queued under s->mu, formatted by the connection's reader

typedef struct out_rec {
  int32_t kind;  // OUT_RAW: SSE bytes as they go out; OUT_DELTA: text of choice ci, a plain chunk once formatted
  int32_t ci;
  uint32_t len;  // the bytes that follow
} out_rec;
enum { OUT_RAW, OUT_DELTA };

// The client stopped reading (server_int.h, rtr_req.slow): its stream ends here, counted; its choices are cancelled
// and its socket shut down, so its connection closes whether or not the client ever reads again.
static void slow_end(rtr_req *r) {
  rtr_server *s = r->s;
  r->slow = 1;
  utl_buf_free(&r->pend);
  rtr_metric_add(s->m_slow_ended, 1);
  utl_warn(LOGC, "%s: its client read nothing while %d bytes waited (router.stream_queue_bytes): stream ended", r->id,
           s->rc->stream_queue_bytes);
  rtr_cancel_locked(s, r);
  if (r->fd >= 0) shutdown(r->fd, SHUT_RDWR); // (the response still holds the connection: the fd is its own)
  pthread_cond_broadcast(&r->cv);
}

// Queues a record on r's stream (s->mu held). On out of memory only this piece is lost, as with add_or_drop.
static void pend_add(rtr_req *r, int kind, int ci, const char *p, size_t n) {
  if (r->slow) return;
  // (one record larger than the bound still goes out to a reader that took everything before it)
  if (r->pend.n && r->pend.n + sizeof(out_rec) + n > (size_t)r->s->rc->stream_queue_bytes) {
    slow_end(r);
    return;
  }
  size_t was = r->pend.n;
  out_rec h = {kind, ci, (uint32_t)n};
  if (utl_buf_add(&r->pend, &h, sizeof h) < 0 || (n && utl_buf_add(&r->pend, p, n) < 0)) {
    r->pend.n = was;
    r->pend.oom = 0;
  }
}

static cJSON *chunk_base(rtr_req *r);
static cJSON *stream_choice(rtr_req *r, int index, const char *text, const char *finish);

void rtr_out_format(rtr_req *r) {
  // reads only what never changes after the request was made (its id, kind, created, the model's name)
  for (size_t at = 0; at + sizeof(out_rec) <= r->taken.n;) {
    out_rec h;
    memcpy(&h, r->taken.p + at, sizeof h);
    const char *p = r->taken.p + at + sizeof h;
    at += sizeof h + h.len;
    if (h.kind == OUT_RAW) {
      add_or_drop(&r->out, p, h.len);
      continue;
    }
    char *t = malloc(h.len + 1);
    if (!t) continue;
    memcpy(t, p, h.len);
    t[h.len] = 0;
    cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToArray(arr, stream_choice(r, h.ci, t, NULL));
    free(t);
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j) continue;
    add_or_drop(&r->out, "data: ", 6);
    add_or_drop(&r->out, j, strlen(j));
    add_or_drop(&r->out, "\n\n", 2);
    free(j);
  }
  utl_buf_reset(&r->taken);
}

// A /v1/responses stream: the chunk (consumed) as the Responses events it means, "event: TYPE\ndata: JSON\n\n" each.
static void out_responses(rtr_req *r, cJSON *chunk) {
  cJSON *events = cJSON_CreateArray(), *e;
  if (events) rtr_resp_stream_chunk(&r->resp, &r->q, chunk, events);
  cJSON_Delete(chunk);
  cJSON_ArrayForEach(e, events) {
    char *j = cJSON_PrintUnformatted(e);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "type");
    if (!j || !cJSON_IsString(type)) {
      free(j);
      continue;
    }
    utl_buf ev = {0};
    utl_buf_printf(&ev, "event: %s\ndata: %s\n\n", type->valuestring, j);
    if (ev.n) pend_add(r, OUT_RAW, 0, ev.p, ev.n);
    utl_buf_free(&ev);
    free(j);
  }
  cJSON_Delete(events);
}

void rtr_out_event(rtr_req *r, cJSON *obj) { // "data: JSON\n\n"; consumes obj
  if (r->q.api == RTR_API_RESPONSES) {
    out_responses(r, obj);
    return;
  }
  char *j = cJSON_PrintUnformatted(obj);
  cJSON_Delete(obj);
  if (!j) return;
  utl_buf ev = {0};
  utl_buf_printf(&ev, "data: %s\n\n", j);
  if (ev.n) pend_add(r, OUT_RAW, 0, ev.p, ev.n);
  utl_buf_free(&ev);
  free(j);
}



// The fields every response object starts with; chat_object names it for chat (completions: text_completion).
static cJSON *response_head(rtr_req *r, const char *chat_object) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "object", r->q.kind == RTR_CHAT ? chat_object : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)r->created);
  cJSON_AddStringToObject(o, "model", r->s->model);
  return o;
}

static cJSON *chunk_base(rtr_req *r) { return response_head(r, "chat.completion.chunk"); }

static cJSON *usage_json(rtr_req *r) {
  int comp = 0, cached = 0, group_cached = 0; // a prompt's cached tokens: the most any of its choices found
  for (int i = 0; i < r->n_ch; i++) {
    comp += r->ch[i].completion_tokens;
    if (i % r->q.n == 0) cached += group_cached, group_cached = 0;
    if (r->ch[i].cached_tokens > group_cached) group_cached = r->ch[i].cached_tokens;
  }
  cached += group_cached;
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", comp);
  cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + comp);
  cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
  cJSON_AddNumberToObject(d, "cached_tokens", cached);
  return u;
}

// The stream's trailer when the request ends: its error event, or the usage chunk when asked; then [DONE].
static void stream_end(rtr_req *r) {
  if (r->failed) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", r->err.message);
    cJSON_AddStringToObject(e, "type", r->err.type);
    if (r->err.param[0]) cJSON_AddStringToObject(e, "param", r->err.param);
    else cJSON_AddNullToObject(e, "param");
    if (r->err.code[0]) cJSON_AddStringToObject(e, "code", r->err.code);
    else cJSON_AddNullToObject(e, "code");
    rtr_out_event(r, o);
  } else if (r->q.include_usage) {
    cJSON *o = chunk_base(r);
    cJSON_AddItemToObject(o, "choices", cJSON_CreateArray());
    cJSON_AddItemToObject(o, "usage", usage_json(r));
    rtr_out_event(r, o);
  }
  if (r->q.api != RTR_API_RESPONSES) pend_add(r, OUT_RAW, 0, "data: [DONE]\n\n", 14); // (its last event ends it)
  r->out_end = 1;
}

// Every choice's stream starts with the assistant's role, before any token of it can arrive (admit.c calls this
// through s->hooks.choice_start while it routes the choice, before the generate is sent).
static void choice_start(rtr_req *r, int ci) {
  if (r->q.kind != RTR_CHAT) return;
  cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
  cJSON *ch = cJSON_CreateObject();
  cJSON_AddNumberToObject(ch, "index", ci);
  cJSON *d = cJSON_AddObjectToObject(ch, "delta");
  cJSON_AddStringToObject(d, "role", "assistant");
  if (r->q.tool_choice != RTR_TOOLS_OFF) cJSON_AddNullToObject(d, "content"); // may be a call turn (OpenAI's)
  else cJSON_AddStringToObject(d, "content", "");
  cJSON_AddNullToObject(ch, "logprobs");
  cJSON_AddNullToObject(ch, "finish_reason");
  cJSON_AddItemToArray(arr, ch);
  rtr_out_event(r, o);
}






// ---------------------------------------------------------------------------------------------------------------
// worker messages of a choice (dispatcher thread)

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

// Converts the worker's [{token, logprob, top:[[id, lp]..]}..] (n) into OpenAI's shape. Chat: appends to content
// (array of {token, logprob, bytes, top_logprobs}); completions: appends to {tokens, token_logprobs, top_logprobs,
// text_offset}.
static void add_logprobs(rtr_server *s, rtr_req *r, rtr_choice *c, const prt_sampled *lps, int n, cJSON *dst) {
  for (int i = 0; i < n; i++) {
    const prt_sampled *e = &lps[i];
    double lp = e->logprob;
    char *t = piece(s, e->token);
    if (!t) continue;
    if (r->q.kind == RTR_CHAT) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "token", t);
      cJSON_AddNumberToObject(o, "logprob", lp);
      cJSON_AddItemToObject(o, "bytes", bytes_of(t));
      cJSON *ta = cJSON_AddArrayToObject(o, "top_logprobs");
      for (int k = 0; k < e->n_top && k < r->q.logprobs; k++) {
        char *pt = piece(s, e->top[k].token);
        if (!pt) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "token", pt);
        cJSON_AddNumberToObject(x, "logprob", e->top[k].logprob);
        cJSON_AddItemToObject(x, "bytes", bytes_of(pt));
        cJSON_AddItemToArray(ta, x);
        free(pt);
      }
      cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "content"), o);
    } else {
      cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "tokens"), cJSON_CreateString(t));
      cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "token_logprobs"), cJSON_CreateNumber(lp));
      cJSON *to = cJSON_CreateObject();
      for (int k = 0; k < e->n_top && k < r->q.logprobs; k++) {
        char *pt = piece(s, e->top[k].token);
        if (!pt) continue;
        if (!cJSON_GetObjectItemCaseSensitive(to, pt)) cJSON_AddNumberToObject(to, pt, e->top[k].logprob);
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

// The non-stream logprobs object of c: new_lp's arrays, each filled with the text kept in c->lp_text.
static cJSON *lp_object(rtr_req *r, rtr_choice *c) {
  cJSON *o = new_lp(r), *arr = o ? o->child : NULL;
  for (int k = 0; arr && k < 4; k++) {
    cJSON *next = arr->next;
    utl_buf b = {0};
    utl_buf_adds(&b, "[");
    if (c->lp_text[k].n) utl_buf_add(&b, c->lp_text[k].p, c->lp_text[k].n);
    utl_buf_adds(&b, "]");
    char *text = utl_buf_take(&b);
    cJSON *raw = text ? cJSON_CreateRaw(text) : NULL;
    free(text);
    if (raw) cJSON_ReplaceItemInObjectCaseSensitive(o, arr->string, raw); // frees arr
    utl_buf_free(&c->lp_text[k]); // the answer holds it now
    arr = next;
  }
  return o;
}

// The token ids a worker streamed for c (what a move resumes from). Out of memory: the choice cannot move any more.
static void record_tokens(rtr_choice *c, const int32_t *toks, int n) {
  for (int i = 0; i < n; i++)
    if (UTL_VEC_PUSH(c->gen, c->n_gen, c->cap_gen, toks[i])) {
      c->resends = INT32_MAX / 2;
      return;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// tool calls in a chat choice's output (docs/openai.md): read from the text by rtr_parse_tool_calls; a stream holds
// back what may be a call so the client never sees the markup as content

static int tools_on(const rtr_req *r) { return r->q.kind == RTR_CHAT && r->q.tool_choice != RTR_TOOLS_OFF; }

// Adds t to c's held text and returns what can go to the client now (malloc'ed, maybe ""; NULL on out of memory):
// the text before a call's beginning, or all but a tail that may begin one (rtr_tool_hold).
static char *hold_text(rtr_server *s, const rtr_req *r, rtr_choice *c, const char *t) {
  add_or_drop(&c->held, t, strlen(t));
  size_t n = c->held.n, send = rtr_tool_hold(rtr_tool_style_of(s, &r->q), c->held.p, n, c->began, &c->in_call);
  char *out = malloc(send + 1);
  if (!out) return NULL;
  memcpy(out, c->held.p, send);
  out[send] = 0;
  if (send) c->began = 1;
  memmove(c->held.p, c->held.p + send, n - send);
  c->held.n = n - send;
  return out;
}

// The tool_calls delta of a stream: the call's index, id, type and name with arguments "", or (id NULL) an arguments
// fragment, as OpenAI sends them.
static cJSON *call_delta(int index, const cJSON *call, int head) {
  cJSON *a = cJSON_CreateArray(), *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "index", index);
  const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
  cJSON *f = cJSON_CreateObject();
  if (head) {
    cJSON_AddStringToObject(o, "id", cJSON_GetObjectItemCaseSensitive(call, "id")->valuestring);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(f, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
    cJSON_AddStringToObject(f, "arguments", "");
  } else {
    cJSON_AddStringToObject(f, "arguments", cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring);
  }
  cJSON_AddItemToObject(o, "function", f);
  cJSON_AddItemToArray(a, o);
  return a;
}

static cJSON *stream_choice(rtr_req *r, int index, const char *text, const char *finish);

// The end of a streamed choice with tools on: its held text becomes tool-call deltas, or content when it holds no
// valid call. Returns 1 when calls went out.
static int flush_held(rtr_server *s, rtr_req *r, int ci) {
  rtr_choice *c = &r->ch[ci];
  if (!c->held.n) return 0;
  cJSON *calls = cJSON_CreateArray();
  size_t cl = 0;
  int n = c->in_call && calls ? rtr_parse_tool_calls(&r->q, rtr_tool_style_of(s, &r->q), c->held.p, c->held.n, calls,
                                                     &cl)
                              : 0;
  if (n > 0) {
    int k = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
      for (int head = 1; head >= 0; head--) {
        cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
        cJSON *ch = stream_choice(r, ci, NULL, NULL);
        cJSON_AddItemToObject(cJSON_GetObjectItem(ch, "delta"), "tool_calls", call_delta(k, call, head));
        cJSON_AddItemToArray(arr, ch);
        rtr_out_event(r, o);
      }
      k++;
    }
  } else {
    char *t = malloc(c->held.n + 1);
    if (t) {
      memcpy(t, c->held.p, c->held.n);
      t[c->held.n] = 0;
      cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
      cJSON_AddItemToArray(arr, stream_choice(r, ci, t, NULL));
      rtr_out_event(r, o);
      free(t);
    }
  }
  cJSON_Delete(calls);
  c->held.n = 0;
  return n > 0;
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

static void on_token(rtr_server *s, rtr_req *r, int ci, const prt_token *m) {
  rtr_choice *c = &r->ch[ci];
  if (c->state == RTR_CH_DONE) return;
  const char *t = m->text;
  int ntok = m->n_tokens >= 0 ? m->n_tokens : 1;
  int64_t now = utl_now_us();
  if (c->state != RTR_CH_STREAMING) rtr_choice_to(s, r, ci, RTR_CH_STREAMING); // its worker holds the KV now
  if (!r->t_first_us) {
    r->t_first_us = now;
    rtr_metric_observe(s->m_ttft, (double)(now - r->t_arrival_us) / 1e6);
  } else if (c->last_tok_us && ntok > 0) {
    double per = (double)(now - c->last_tok_us) / 1e6 / ntok;
    for (int k = 0; k < ntok; k++) rtr_metric_observe(s->m_itl, per);
  }
  rtr_observe_token_locked(s, r, ci, ntok, now);
  c->last_tok_us = now;
  c->completion_tokens += ntok;
  record_tokens(c, m->tokens, m->n_tokens);
  rtr_metric_add(s->m_gen, ntok);
  if (r->q.stream) {
    char *now_text = tools_on(r) ? hold_text(s, r, c, t) : NULL; // tools: what may be a call waits (flush_held)
    const char *send = tools_on(r) ? (now_text && now_text[0] ? now_text : NULL) : t;
    int with_lp = r->q.logprobs >= 0 && m->n_logprobs >= 0;
    if (!with_lp && !tools_on(r) && r->q.api != RTR_API_RESPONSES) { // plain text: formatted by the reader, unlocked
      pend_add(r, OUT_DELTA, ci, t, strlen(t));
      rtr_wake_reader_locked(s, r);
    } else if (send || with_lp || !tools_on(r)) {
      cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
      cJSON *ch = stream_choice(r, ci, send, NULL);
      if (with_lp) {
        cJSON *lp = new_lp(r);
        add_logprobs(s, r, c, m->logprobs, m->n_logprobs, lp);
        cJSON_ReplaceItemInObject(ch, "logprobs", lp);
      }
      cJSON_AddItemToArray(arr, ch);
      rtr_out_event(r, o);
      pthread_cond_broadcast(&r->cv);
    }
    free(now_text);
  } else {
    add_or_drop(&c->text, t, strlen(t));
    if (r->q.logprobs >= 0 && m->n_logprobs >= 0) { // kept as text (server_int.h, rtr_choice.lp_text)
      cJSON *lp = new_lp(r), *arr;
      add_logprobs(s, r, c, m->logprobs, m->n_logprobs, lp);
      int k = 0;
      for (arr = lp->child; arr && k < 4; arr = arr->next, k++)
        for (const cJSON *e = arr->child; e; e = e->next) {
          char *j = cJSON_PrintUnformatted(e);
          if (!j) continue;
          if (c->lp_text[k].n) add_or_drop(&c->lp_text[k], ",", 1);
          add_or_drop(&c->lp_text[k], j, strlen(j));
          free(j);
        }
      cJSON_Delete(lp);
    }
  }
}

// An embedding choice's done: its vector, which must have the model's width (a worker that predates `embed` would
// have generated text instead and sends none).
static void embedding_done(rtr_server *s, rtr_req *r, int ci, const prt_done *m) {
  rtr_choice *c = &r->ch[ci];
  rtr_error e;
  const cJSON *x;
  if (m->n_embedding != s->n_embd)
    rtr_fail(&e, 502, "server_error", NULL, "worker_failure", "the worker answered an embedding with %d values, not "
             "the model's %d", m->n_embedding, s->n_embd);
  else if (!(c->embd = malloc((size_t)s->n_embd * sizeof *c->embd)))
    rtr_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
  if (!c->embd) {
    rtr_choice_end_locked(s, r, ci);
    rtr_fail_locked(s, r, &e);
    return;
  }
  c->n_embd = 0;
  cJSON_ArrayForEach(x, m->embedding_json) c->embd[c->n_embd++] = (float)x->valuedouble;
  snprintf(c->finish, sizeof c->finish, "stop");
  c->prompt_tokens = m->prompt_tokens >= 0 ? m->prompt_tokens : c->n_prompt;
  rtr_observe_done_locked(s, r, ci, m);
  rtr_choice_end_locked(s, r, ci);
  if (r->n_done == r->n_ch) rtr_finish_locked(s, r);
}

static void on_done(rtr_server *s, rtr_req *r, int ci, const prt_done *m) {
  rtr_choice *c = &r->ch[ci];
  if (c->state == RTR_CH_DONE) return;
  if (r->q.kind == RTR_EMBEDDING) {
    embedding_done(s, r, ci, m);
    return;
  }
  snprintf(c->finish, sizeof c->finish, "%s",
           m->finish_reason && !strcmp(m->finish_reason, "length") ? "length" : "stop");
  if (m->completion_tokens >= 0) c->completion_tokens = m->completion_tokens;
  c->cached_tokens = m->cached_tokens >= 0 ? m->cached_tokens : 0;
  if (c->cached_tokens > c->n_prompt) c->cached_tokens = c->n_prompt; // a moved choice's worker cached its own output
  c->cached_store_tokens = m->cached_store_tokens < c->cached_tokens ? m->cached_store_tokens : c->cached_tokens;
  c->prompt_tokens = m->prompt_tokens >= 0 ? m->prompt_tokens : c->n_prompt;
  rtr_observe_done_locked(s, r, ci, m); // KV moved, the phases' histograms
  rtr_choice_end_locked(s, r, ci);
  if (r->q.stream) {
    if (tools_on(r) && flush_held(s, r, ci) && !strcmp(c->finish, "stop")) snprintf(c->finish, sizeof c->finish, "tool_calls");
    cJSON *o = chunk_base(r), *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = stream_choice(r, ci, NULL, c->finish);
    if (r->q.kind != RTR_CHAT) cJSON_ReplaceItemInObject(ch, "text", cJSON_CreateString(""));
    cJSON_AddItemToArray(arr, ch);
    rtr_out_event(r, o);
    pthread_cond_broadcast(&r->cv);
  }
  if (r->n_done == r->n_ch) rtr_finish_locked(s, r);
}

static void on_error(rtr_server *s, rtr_req *r, int ci, const prt_error *m) {
  const char *cs = m->code ? m->code : "worker_failure";
  int status = !strcmp(cs, "context_length_exceeded") || !strcmp(cs, "grammar_too_complex") ? 400
               : !strcmp(cs, "timeout")                                                       ? 504
                                                                                              : 503;
  rtr_error e;
  // A worker shutting down refused it (it was sent before the worker said `draining`): another worker takes it.
  if (!strcmp(cs, "unavailable") && rtr_move_choice_locked(s, r, ci, 1) == 0) return;
  // The prefill worker lost the decode worker it was handing to (killed: both connections to it close at once, and
  // the prefill worker's word may come first). The choice moves as the router's own link goes down (link_down_locked)
  // and waits there for the decode worker's restart; if that link stays up it is sent again after RTR_DECODE_LOST_MS
  // (send_waiting_locked), and fails once its moves are used up.
  rtr_choice *c = &r->ch[ci];
  if (!strcmp(cs, "decode_failure") && !rtr_choice_handed_off(c) && c->link >= 0 && c->link != c->plink) {
    if (s->links[c->link].up) {
      if (c->state != RTR_CH_DECODE_LOST) rtr_choice_to(s, r, ci, RTR_CH_DECODE_LOST);
      return;
    }
    if (rtr_move_choice_locked(s, r, ci, 1) == 0) return;
  }
  rtr_fail(&e, status, status == 400 ? "invalid_request_error" : "server_error", NULL, cs, "%s",
           m->message ? m->message : "the worker failed");
  rtr_choice_end_locked(s, r, ci); // the worker already dropped it: no cancel for this one
  rtr_fail_locked(s, r, &e);
}

// /v1/embeddings' answer (OpenAI's): {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
// "model", "usage": {"prompt_tokens", "total_tokens"}}; each vector a list of numbers (9 significant digits: a float
// exactly) or, for encoding_format base64, its little-endian float32 bytes in base64 (what OpenAI's client decodes).
static cJSON *embedding_response(rtr_req *r) {
  cJSON *o = cJSON_CreateObject(), *arr;
  cJSON_AddStringToObject(o, "object", "list");
  arr = cJSON_AddArrayToObject(o, "data");
  for (int i = 0; i < r->n_ch; i++) {
    const rtr_choice *c = &r->ch[i];
    cJSON *d = cJSON_CreateObject(), *v = NULL;
    cJSON_AddStringToObject(d, "object", "embedding");
    cJSON_AddNumberToObject(d, "index", i);
    if (r->q.embd_base64) {
      uint8_t *b = malloc((size_t)c->n_embd * 4 + 1);
      for (int k = 0; b && k < c->n_embd; k++) { // little-endian whatever the host
        uint32_t u;
        memcpy(&u, &c->embd[k], 4);
        for (int j = 0; j < 4; j++) b[(size_t)k * 4 + j] = (uint8_t)(u >> (8 * j));
      }
      char *t = b ? utl_base64_encode(b, (size_t)c->n_embd * 4) : NULL;
      if (t) v = cJSON_CreateString(t);
      free(t);
      free(b);
    } else {
      v = cJSON_CreateArray();
      for (int k = 0; v && k < c->n_embd; k++) {
        char num[32];
        snprintf(num, sizeof num, "%.9g", (double)c->embd[k]);
        cJSON_AddItemToArray(v, cJSON_CreateRaw(num));
      }
    }
    cJSON_AddItemToObject(d, "embedding", v ? v : cJSON_CreateNull());
    cJSON_AddItemToArray(arr, d);
  }
  cJSON_AddStringToObject(o, "model", r->s->model);
  cJSON *u = cJSON_AddObjectToObject(o, "usage");
  cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
  cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt);
  return o;
}

cJSON *rtr_final_response(rtr_req *r) {
  if (r->q.kind == RTR_EMBEDDING) return embedding_response(r);
  cJSON *o = response_head(r, "chat.completion");
  cJSON *arr = cJSON_AddArrayToObject(o, "choices");
  for (int i = 0; i < r->n_ch; i++) {
    rtr_choice *c = &r->ch[i];
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    if (r->q.kind == RTR_CHAT) {
      cJSON *m = cJSON_AddObjectToObject(ch, "message");
      cJSON_AddStringToObject(m, "role", "assistant");
      cJSON *calls = tools_on(r) ? cJSON_CreateArray() : NULL;
      size_t cl = 0;
      int nc = calls && c->text.p ? rtr_parse_tool_calls(&r->q, rtr_tool_style_of(r->s, &r->q), c->text.p, c->text.n,
                                                         calls, &cl)
                                  : 0;
      if (nc > 0) { // the text before the calls (null when none), the calls
        char *t = cl ? malloc(cl + 1) : NULL;
        if (t) {
          memcpy(t, c->text.p, cl);
          t[cl] = 0;
          cJSON_AddStringToObject(m, "content", t);
          free(t);
        } else {
          cJSON_AddNullToObject(m, "content");
        }
        cJSON_AddItemToObject(m, "tool_calls", calls);
        calls = NULL;
        if (!strcmp(c->finish, "stop")) snprintf(c->finish, sizeof c->finish, "tool_calls");
      } else {
        cJSON_AddStringToObject(m, "content", c->text.p ? c->text.p : "");
      }
      cJSON_Delete(calls);
    } else {
      cJSON_AddStringToObject(ch, "text", c->text.p ? c->text.p : "");
    }
    if (r->q.logprobs >= 0) {
      cJSON_AddItemToObject(ch, "logprobs", lp_object(r, c));
    } else {
      cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", c->finish[0] ? c->finish : "stop");
    cJSON_AddItemToArray(arr, ch);
  }
  cJSON_AddItemToObject(o, "usage", usage_json(r));
  return o;
}

// The OpenAI layer's answers to what happens below it: a worker's token, done and error for a choice (links.c), a
// choice routed (admit.c), a request's end (req.c).
void rtr_relay_register(rtr_server *s) {
  s->hooks.on_token = on_token;
  s->hooks.on_done = on_done;
  s->hooks.on_error = on_error;
  s->hooks.choice_start = choice_start;
  s->hooks.stream_end = stream_end;
}
