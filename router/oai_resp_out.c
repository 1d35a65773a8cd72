// router/oai_resp_out.c: the Responses API's answers, pure: a chat completion as a response object, and a chat
// stream's chunks as the Responses events (response.created, output items, text and argument deltas, completed).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/oai_int.h"
#include "router/openai.h"

// id with its chat prefix ("chatcmpl-", "call_") replaced by prefix: "resp_", "msg_", "fc_".
static void id_as(char *out, size_t cap, const char *prefix, const char *id) {
  const char *rest = id ? strpbrk(id, "-_") : NULL;
  snprintf(out, cap, "%s%s", prefix, rest ? rest + 1 : id ? id : "");
}

static const char *str_of(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double num_of(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

// The chat usage object as the Responses API's.
static cJSON *usage_of(const cJSON *u) {
  if (!u) return cJSON_CreateNull();
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "input_tokens", num_of(u, "prompt_tokens"));
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "input_tokens_details"), "cached_tokens",
                          num_of(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details"), "cached_tokens"));
  cJSON_AddNumberToObject(o, "output_tokens", num_of(u, "completion_tokens"));
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "output_tokens_details"), "reasoning_tokens", 0);
  cJSON_AddNumberToObject(o, "total_tokens", num_of(u, "total_tokens"));
  return o;
}

// The response object: chat (borrowed) gives id, created and model; output (consumed); usage (borrowed, chat's, may be
// NULL); finish: the choice's finish_reason (NULL: in progress).
static cJSON *resp_object(const rtr_request *q, const cJSON *chat, cJSON *output, const cJSON *usage,
                          const char *finish) {
  cJSON *o = cJSON_CreateObject();
  char id[96];
  id_as(id, sizeof id, "resp_", str_of(chat, "id"));
  cJSON_AddStringToObject(o, "id", id);
  cJSON_AddStringToObject(o, "object", "response");
  cJSON_AddNumberToObject(o, "created_at", num_of(chat, "created"));
  int cut = finish && !strcmp(finish, "length");
  cJSON_AddStringToObject(o, "status", !finish ? "in_progress" : cut ? "incomplete" : "completed");
  cJSON_AddNullToObject(o, "error");
  if (cut) cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
  else cJSON_AddNullToObject(o, "incomplete_details");
  cJSON_AddStringToObject(o, "model", str_of(chat, "model") ? str_of(chat, "model") : "");
  cJSON_AddItemToObject(o, "output", output);
  cJSON_AddNumberToObject(o, "temperature", q->temperature);
  cJSON_AddNumberToObject(o, "top_p", q->top_p);
  cJSON *echo = q->resp_echo ? cJSON_Parse(q->resp_echo) : NULL;
  for (cJSON *k = echo ? echo->child : NULL; k; k = k->next)
    cJSON_AddItemToObject(o, k->string, cJSON_Duplicate(k, 1));
  cJSON_Delete(echo);
  cJSON_AddItemToObject(o, "usage", usage_of(usage));
  return o;
}

static cJSON *text_part(const char *text) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddStringToObject(p, "type", "output_text");
  cJSON_AddStringToObject(p, "text", text);
  cJSON_AddArrayToObject(p, "annotations");
  cJSON_AddArrayToObject(p, "logprobs");
  return p;
}

static cJSON *message_item(const char *chat_id, const char *status) {
  cJSON *m = cJSON_CreateObject();
  char id[96];
  id_as(id, sizeof id, "msg_", chat_id);
  cJSON_AddStringToObject(m, "id", id);
  cJSON_AddStringToObject(m, "type", "message");
  cJSON_AddStringToObject(m, "status", status);
  cJSON_AddStringToObject(m, "role", "assistant");
  cJSON_AddArrayToObject(m, "content");
  return m;
}

static cJSON *call_item(const char *call_id, const char *name, const char *args, const char *status) {
  cJSON *c = cJSON_CreateObject();
  char id[96];
  id_as(id, sizeof id, "fc_", call_id);
  cJSON_AddStringToObject(c, "id", id);
  cJSON_AddStringToObject(c, "type", "function_call");
  cJSON_AddStringToObject(c, "status", status);
  cJSON_AddStringToObject(c, "call_id", call_id);
  cJSON_AddStringToObject(c, "name", name);
  cJSON_AddStringToObject(c, "arguments", args);
  return c;
}

cJSON *rtr_resp_from_chat(const rtr_request *q, cJSON *chat) {
  const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chat, "choices"), 0);
  const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
  const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), *call;
  const char *text = str_of(msg, "content"), *finish = str_of(ch, "finish_reason");
  cJSON *output = cJSON_CreateArray();
  if ((text && text[0]) || !cJSON_GetArraySize(calls)) {
    cJSON *m = message_item(str_of(chat, "id"), "completed");
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(m, "content"), text_part(text ? text : ""));
    cJSON_AddItemToArray(output, m);
  }
  cJSON_ArrayForEach(call, calls) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
    cJSON_AddItemToArray(output, call_item(str_of(call, "id"), str_of(f, "name"), str_of(f, "arguments"), "completed"));
  }
  cJSON *o = resp_object(q, chat, output, cJSON_GetObjectItemCaseSensitive(chat, "usage"), finish ? finish : "stop");
  cJSON_Delete(chat);
  return o;
}

// ---- streams ----

static cJSON *event(rtr_resp_stream *st, cJSON *events, const char *type) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "type", type);
  cJSON_AddNumberToObject(e, "sequence_number", st->seq++);
  cJSON_AddItemToArray(events, e);
  return e;
}

// An event about output item at (its index and id).
static cJSON *item_event(rtr_resp_stream *st, cJSON *events, const char *type, int at) {
  cJSON *e = event(st, events, type);
  cJSON_AddStringToObject(e, "item_id", str_of(cJSON_GetArrayItem(st->output, at), "id"));
  cJSON_AddNumberToObject(e, "output_index", at);
  return e;
}

// Closes the open output item: its text (or arguments) done, then the item done.
static void close_open(rtr_resp_stream *st, cJSON *events) {
  int at = cJSON_GetArraySize(st->output) - 1;
  cJSON *item = cJSON_GetArrayItem(st->output, at), *e;
  if (!st->open || !item) return;
  if (st->open == 1) {
    const char *text = str_of(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(item, "content"), 0), "text");
    e = item_event(st, events, "response.output_text.done", at);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddStringToObject(e, "text", text ? text : "");
    cJSON_AddArrayToObject(e, "logprobs");
    e = item_event(st, events, "response.content_part.done", at);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddItemToObject(e, "part", text_part(text ? text : ""));
  } else {
    e = item_event(st, events, "response.function_call_arguments.done", at);
    cJSON_AddStringToObject(e, "arguments", str_of(item, "arguments"));
  }
  cJSON_ReplaceItemInObjectCaseSensitive(item, "status", cJSON_CreateString("completed"));
  e = event(st, events, "response.output_item.done");
  cJSON_AddNumberToObject(e, "output_index", at);
  cJSON_AddItemToObject(e, "item", cJSON_Duplicate(item, 1));
  st->open = 0;
}

// Appends more to the string field k of o.
static void append_str(cJSON *o, const char *k, const char *more) {
  const char *now = str_of(o, k);
  size_t a = now ? strlen(now) : 0, b = strlen(more);
  char *s = malloc(a + b + 1);
  if (!s) return;
  memcpy(s, now ? now : "", a);
  memcpy(s + a, more, b + 1);
  cJSON_ReplaceItemInObjectCaseSensitive(o, k, cJSON_CreateString(s));
  free(s);
}

static void on_text(rtr_resp_stream *st, const cJSON *chunk, const char *text, cJSON *events) {
  if (st->open != 1) {
    close_open(st, events);
    cJSON *m = message_item(str_of(chunk, "id"), "in_progress");
    cJSON_AddItemToArray(st->output, m);
    int at = cJSON_GetArraySize(st->output) - 1;
    cJSON *e = event(st, events, "response.output_item.added");
    cJSON_AddNumberToObject(e, "output_index", at);
    cJSON_AddItemToObject(e, "item", cJSON_Duplicate(m, 1));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(m, "content"), text_part(""));
    e = item_event(st, events, "response.content_part.added", at);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddItemToObject(e, "part", text_part(""));
    st->open = 1;
  }
  int at = cJSON_GetArraySize(st->output) - 1;
  append_str(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(st->output, at), "content"), 0),
             "text", text);
  cJSON *e = item_event(st, events, "response.output_text.delta", at);
  cJSON_AddNumberToObject(e, "content_index", 0);
  cJSON_AddStringToObject(e, "delta", text);
  cJSON_AddArrayToObject(e, "logprobs");
}

// A tool_calls delta: a call's head (id, name) opens a function_call item; an arguments fragment goes into it.
static void on_call(rtr_resp_stream *st, const cJSON *tc, cJSON *events) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
  const char *id = str_of(tc, "id"), *args = str_of(f, "arguments");
  if (id) {
    close_open(st, events);
    cJSON *c = call_item(id, str_of(f, "name") ? str_of(f, "name") : "", "", "in_progress");
    cJSON_AddItemToArray(st->output, c);
    cJSON *e = event(st, events, "response.output_item.added");
    cJSON_AddNumberToObject(e, "output_index", cJSON_GetArraySize(st->output) - 1);
    cJSON_AddItemToObject(e, "item", cJSON_Duplicate(c, 1));
    st->open = 2;
  } else if (st->open == 2 && args && args[0]) {
    int at = cJSON_GetArraySize(st->output) - 1;
    append_str(cJSON_GetArrayItem(st->output, at), "arguments", args);
    cJSON_AddStringToObject(item_event(st, events, "response.function_call_arguments.delta", at), "delta", args);
  }
}

void rtr_resp_stream_chunk(rtr_resp_stream *st, const rtr_request *q, const cJSON *chunk, cJSON *events) {
  const cJSON *err = cJSON_GetObjectItemCaseSensitive(chunk, "error"), *v;
  if (err) { // the request failed: the error event (the openai client raises it)
    cJSON *e = event(st, events, "error");
    cJSON_AddStringToObject(e, "code", str_of(err, "code") ? str_of(err, "code") : str_of(err, "type"));
    cJSON_AddStringToObject(e, "message", str_of(err, "message") ? str_of(err, "message") : "");
    if (str_of(err, "param")) cJSON_AddStringToObject(e, "param", str_of(err, "param"));
    else cJSON_AddNullToObject(e, "param");
    return;
  }
  if (!st->started) {
    st->started = 1;
    st->output = cJSON_CreateArray();
    const char *types[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++)
      cJSON_AddItemToObject(event(st, events, types[i]), "response",
                            resp_object(q, chunk, cJSON_CreateArray(), NULL, NULL));
  }
  const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chunk, "choices"), 0);
  if (ch) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(ch, "delta");
    const char *text = str_of(d, "content"), *finish = str_of(ch, "finish_reason");
    if (text && text[0]) on_text(st, chunk, text, events);
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(d, "tool_calls")) on_call(st, v, events);
    if (finish) {
      close_open(st, events);
      snprintf(st->finish, sizeof st->finish, "%s", finish);
    }
  } else if ((v = cJSON_GetObjectItemCaseSensitive(chunk, "usage"))) { // the request's end
    close_open(st, events);
    const char *finish = st->finish[0] ? st->finish : "stop";
    cJSON *e = event(st, events, !strcmp(finish, "length") ? "response.incomplete" : "response.completed");
    cJSON_AddItemToObject(e, "response", resp_object(q, chunk, cJSON_Duplicate(st->output, 1), v, finish));
  }
}

void rtr_resp_stream_free(rtr_resp_stream *st) {
  cJSON_Delete(st->output);
  memset(st, 0, sizeof *st);
}
