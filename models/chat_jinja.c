// models/chat_jinja.c: a chat rendered by the model's own Jinja template: the OpenAI conversation as the template's
// variables (Hugging Face's apply_chat_template context), and the leading BOS text cut as llama.cpp cuts it.
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "models/chat.h"
#include "models/jinja.h"
#include "util/err.h"

// An assistant's calls (JSON text, either shape of mdl_chat_msg.tool_calls) in OpenAI's shape, which the published
// templates read (tool_call.function.name, tool_call.id; Qwen's also unwrap .function themselves). NULL when calls is
// not an array of objects.
static cJSON *openai_calls(const char *calls) {
  cJSON *in = cJSON_Parse(calls), *out = cJSON_IsArray(in) ? cJSON_CreateArray() : NULL;
  if (!out) goto bad;
  const cJSON *c;
  cJSON_ArrayForEach(c, in) {
    if (!cJSON_IsObject(c)) goto bad;
    if (cJSON_GetObjectItemCaseSensitive(c, "function")) { // already OpenAI's
      cJSON_AddItemToArray(out, cJSON_Duplicate(c, 1));
      continue;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id"), *name = cJSON_GetObjectItemCaseSensitive(c, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, "arguments");
    if (!cJSON_IsString(name) || !args) goto bad;
    cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
    if (!o || !f) {
      cJSON_Delete(o);
      cJSON_Delete(f);
      goto bad;
    }
    if (cJSON_IsString(id)) cJSON_AddStringToObject(o, "id", id->valuestring);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(f, "name", name->valuestring);
    cJSON_AddItemToObject(f, "arguments", cJSON_Duplicate(args, 1));
    cJSON_AddItemToObject(o, "function", f);
    cJSON_AddItemToArray(out, o);
  }
  cJSON_Delete(in);
  return out;
bad:
  cJSON_Delete(in);
  cJSON_Delete(out);
  return NULL;
}

static void add_str(cJSON *o, const char *k, const char *v) {
  if (v) cJSON_AddStringToObject(o, k, v);
}

// The template's variables as JSON text (malloc'ed), or NULL with err.
static char *context(const mdl_chat_jinja_in *in, char *err, size_t errlen) {
  cJSON *ctx = NULL, *msgs;
  if (in->kwargs) { // first: the server's own variables below are never the request's
    ctx = cJSON_Parse(in->kwargs);
    if (!cJSON_IsObject(ctx)) {
      cJSON_Delete(ctx);
      utl_seterr(err, errlen, "chat_template_kwargs must be a JSON object");
      return NULL;
    }
    static const char *const mine[] = {"messages", "tools", "bos_token", "eos_token", "add_generation_prompt"};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++) cJSON_DeleteItemFromObjectCaseSensitive(ctx, mine[i]);
  } else {
    ctx = cJSON_CreateObject();
  }
  if (!ctx || !(msgs = cJSON_AddArrayToObject(ctx, "messages"))) goto oom;
  for (size_t i = 0; i < in->n; i++) {
    const mdl_chat_turn *m = &in->msgs[i];
    cJSON *o = cJSON_CreateObject();
    if (!o || !m->role || !m->content) {
      cJSON_Delete(o);
      utl_seterr(err, errlen, o ? "message %zu has no role or content" : "out of memory", i);
      cJSON_Delete(ctx);
      return NULL;
    }
    cJSON_AddItemToArray(msgs, o);
    add_str(o, "role", m->role);
    add_str(o, "content", m->content);
    add_str(o, "name", m->name);
    if (m->tool_calls) {
      cJSON *c = openai_calls(m->tool_calls);
      if (!c) {
        utl_seterr(err, errlen, "message %zu: tool_calls must be a JSON array of calls", i);
        cJSON_Delete(ctx);
        return NULL;
      }
      cJSON_AddItemToObject(o, "tool_calls", c);
    }
    add_str(o, "tool_call_id", m->tool_call_id);
    add_str(o, "reasoning_content", m->reasoning_content);
  }
  if (in->tools) {
    cJSON *t = cJSON_Parse(in->tools);
    int is_array = cJSON_IsArray(t);
    cJSON_Delete(t);
    if (!is_array) {
      cJSON_Delete(ctx);
      utl_seterr(err, errlen, "tools must be a JSON array");
      return NULL;
    }
  }
  cJSON_AddBoolToObject(ctx, "add_generation_prompt", in->add_generation_prompt != 0);
  cJSON_AddStringToObject(ctx, "bos_token", in->bos ? in->bos : "");
  cJSON_AddStringToObject(ctx, "eos_token", in->eos ? in->eos : "");
  char *text = cJSON_PrintUnformatted(ctx);
  cJSON_Delete(ctx);
  if (text && in->tools) {
    // The tools go in as the request wrote them: a round trip through cJSON would print 100.0 as 100 and round
    // integers past 2^53, and the interpreter keeps a number's own text (int or float) as jinja2 does.
    size_t n = strlen(text), k = strlen(in->tools);
    char *with = malloc(n + k + 16);
    if (with) {
      memcpy(with, text, n - 1); // (without the closing brace)
      memcpy(with + n - 1, ",\"tools\":", 9);
      memcpy(with + n + 8, in->tools, k);
      memcpy(with + n + 8 + k, "}", 2);
    }
    free(text);
    text = with;
  }
  if (text) return text;
  ctx = NULL;
oom:
  cJSON_Delete(ctx);
  utl_seterr(err, errlen, "out of memory");
  return NULL;
}

int mdl_chat_render_jinja(const mdl_jinja *t, const mdl_chat_jinja_in *in, char **out, size_t **spans,
                          size_t *n_spans, char *err, size_t errlen) {
  *out = NULL;
  *spans = NULL;
  *n_spans = 0;
  char *ctx = context(in, err, errlen);
  if (!ctx) return -1;
  size_t len = 0;
  mdl_jinja_opts o = {.now = in->now};
  int rc = mdl_jinja_render(t, ctx, strlen(ctx), &o, out, &len, spans, n_spans, err, errlen);
  free(ctx);
  if (rc != 0) return rc;
  // Llama 3's templates write bos_token themselves; the tokenizer adds BOS too: cut the text, unless the request's
  // own text begins there (then the template did not write it).
  size_t b = in->bos ? strlen(in->bos) : 0;
  if (in->strip_bos && b && len >= b && !memcmp(*out, in->bos, b) && !(*n_spans && (*spans)[0] < b)) {
    memmove(*out, *out + b, len - b + 1);
    for (size_t i = 0; i < *n_spans; i++) (*spans)[2 * i] -= b;
  }
  return 0;
}
