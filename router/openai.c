// router/openai.c: OpenAI request validation (chat, completions, tokenize, detokenize) into rtr_request, pure (tools
// and response_format: oai_tools.c; the error object and field readers: oai_base.c).
#include "router/openai.h"
#include "router/oai_int.h"
#include "models/jinja.h"
#include "models/json_lit.h"
#include "util/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rtr_utf8_valid(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F; // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else
      return 0;
    if (i + (size_t)len > n) return 0;
    if (s[i + 1] < lo || s[i + 1] > hi) return 0;
    for (int k = 2; k < len; k++)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
    i += (size_t)len;
  }
  return 1;
}

static char *dupn(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

void rtr_request_free(rtr_request *r) {
  if (!r) return;
  for (int i = 0; i < r->n_msgs; i++) {
    free(r->msgs[i].role);
    free(r->msgs[i].content);
    free(r->msgs[i].tool_calls);
    free(r->msgs[i].name);
    free(r->msgs[i].tool_call_id);
    free(r->msgs[i].reasoning_content);
  }
  free(r->msgs);
  for (int i = 0; i < r->n_prompts; i++) {
    free(r->prompts[i].text);
    free(r->prompts[i].ids);
  }
  free(r->prompts);
  free(r->prompt);
  free(r->prompt_ids);
  for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
  free(r->stop);
  free(r->bias);
  free(r->json_schema);
  free(r->tools);
  free(r->call_tools);
  free(r->chat_template);
  mdl_jinja_free(r->chat_jinja);
  free(r->chat_kwargs);
  free(r->resp_echo);
  memset(r, 0, sizeof *r);
}

// A JSON number in [lo, hi]; 1 when present, 0 when absent, -1 on error.
static int get_num(const cJSON *root, const char *name, double lo, double hi, int lo_open, double *out, rtr_error *e) {
  const cJSON *v = rtr_oai_field(root, name);
  if (!v) return 0;
  if (!cJSON_IsNumber(v)) return BAD(e, name, "'%s' must be a number", name);
  double d = v->valuedouble;
  if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
    return BAD(e, name, "'%s' must be in %s%g, %g]", name, lo_open ? "(" : "[", lo, hi);
  *out = d;
  return 1;
}

// A JSON integer (a number with no fraction) in [lo, hi].
static int get_int(const cJSON *root, const char *name, double lo, double hi, int64_t *out, rtr_error *e) {
  const cJSON *v = rtr_oai_field(root, name);
  if (!v) return 0;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
    return BAD(e, name, "'%s' must be an integer", name);
  double d = v->valuedouble;
  if (d < lo || d > hi) return BAD(e, name, "'%s' must be in [%.0f, %.0f]", name, lo, hi);
  *out = (int64_t)d;
  return 1;
}


// A message's keys besides role and content: name, tool_calls (an assistant's), tool_call_id (a tool result's) and
// reasoning_content (an assistant's) are read by parse_msgs (name, tool_call_id and reasoning_content reach a Jinja
// template; the built-in families have no place for them); function_call (deprecated) and any other key are refused
// unless null (not given).
static int check_msg_keys(const cJSON *msg, int i, const char *role, rtr_error *e) {
  char param[96];
  for (const cJSON *k = msg->child; k; k = k->next) {
    const char *key = k->string;
    if (!strcmp(key, "role") || !strcmp(key, "content")) continue;
    snprintf(param, sizeof param, "messages[%d].%.60s", i, key);
    if (!strcmp(key, "name")) {
      if (!cJSON_IsNull(k) && !cJSON_IsString(k)) return BAD(e, param, "'%s' must be a string", param);
      continue;
    }
    if (cJSON_IsNull(k)) continue;
    if (!strcmp(key, "tool_calls")) {
      if (strcmp(role, "assistant")) return BAD(e, param, "'%s': only assistant messages have tool_calls", param);
      continue;
    }
    if (!strcmp(key, "tool_call_id")) {
      if (strcmp(role, "tool")) return BAD(e, param, "'%s': only tool messages have a tool_call_id", param);
      continue;
    }
    if (!strcmp(key, "reasoning_content")) {
      if (strcmp(role, "assistant"))
        return BAD(e, param, "'%s': only assistant messages have reasoning_content", param);
      if (!cJSON_IsString(k)) return BAD(e, param, "'%s' must be a string", param);
      continue;
    }
    if (!strcmp(key, "function_call"))
      return UNSUP(e, param, "'%s' (deprecated) is not supported: send 'tool_calls'", param);
    return UNSUP(e, param, "'%s' is not supported (a message has role, content, name, tool_calls, tool_call_id, "
                 "reasoning_content)", param);
  }
  return 0;
}

// An assistant message's tool_calls [{id, type "function", function {name, arguments}}] into the JSON text
// models/chat.h renders: [{"id", "name", "arguments"}], arguments parsed when they are a JSON text (templates expect a
// mapping). *out stays NULL for [].
static int parse_msg_calls(const cJSON *tc, int i, char **out, rtr_error *e) {
  char param[96];
  snprintf(param, sizeof param, "messages[%d].tool_calls", i);
  if (!cJSON_IsArray(tc)) return BAD(e, param, "'%s' must be an array", param);
  if (!tc->child) return 0;
  cJSON *arr = cJSON_CreateArray();
  if (!arr) return OOM(e);
  int k = 0, rc = 0;
  for (const cJSON *c = tc->child; c && !rc; c = c->next, k++) {
    snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, k);
    const cJSON *id = rtr_oai_field(c, "id"), *type = rtr_oai_field(c, "type"), *fn = rtr_oai_field(c, "function");
    const cJSON *name = fn ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
    const cJSON *args = fn ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
    if (!cJSON_IsObject(c)) rc = BAD(e, param, "'%s' must be an object", param);
    else if (!cJSON_IsString(id)) rc = BAD(e, param, "'%s.id' must be a string", param);
    else if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function")))
      rc = INVAL(e, param, "'%s.type' must be \"function\"", param);
    else if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !cJSON_IsString(args))
      rc = BAD(e, param, "'%s.function' must be an object with string 'name' and 'arguments'", param);
    if (rc) break;
    cJSON *o = cJSON_CreateObject(), *a = cJSON_Parse(args->valuestring);
    if (!a) a = cJSON_CreateString(args->valuestring); // not JSON: shown to the model as the string it was
    if (!o || !a || !cJSON_AddStringToObject(o, "id", id->valuestring) ||
        !cJSON_AddStringToObject(o, "name", name->valuestring)) {
      cJSON_Delete(o);
      cJSON_Delete(a);
      rc = OOM(e);
      break;
    }
    cJSON_AddItemToObject(o, "arguments", a);
    cJSON_AddItemToArray(arr, o);
  }
  if (!rc && !(*out = cJSON_PrintUnformatted(arr))) rc = OOM(e);
  cJSON_Delete(arr);
  return rc;
}

static int parse_msgs(const cJSON *root, rtr_request *r, rtr_error *e) {
  const cJSON *m = rtr_oai_field(root, "messages");
  if (!m) return BAD(e, "messages", "'messages' is required");
  if (!cJSON_IsArray(m)) return BAD(e, "messages", "'messages' must be an array");
  int n = cJSON_GetArraySize(m);
  if (n == 0) return BAD(e, "messages", "'messages' must not be empty");
  r->msgs = calloc((size_t)n, sizeof *r->msgs);
  if (!r->msgs) return OOM(e);
  int i = 0;
  char param[64];
  for (const cJSON *it = m->child; it; it = it->next, i++) {
    r->n_msgs = i + 1; // calloc'ed: what this message owns is freed with it, whatever fails below
    snprintf(param, sizeof param, "messages[%d]", i);
    if (!cJSON_IsObject(it)) return BAD(e, param, "'%s' must be an object", param);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
    snprintf(param, sizeof param, "messages[%d].role", i);
    if (!cJSON_IsString(role)) return BAD(e, param, "'%s' must be a string", param);
    const char *rs = role->valuestring;
    if (!strcmp(rs, "developer")) rs = "system";
    if (!strcmp(rs, "function"))
      return UNSUP(e, param, "'%s': 'function' messages (deprecated) are not supported: send 'tool' messages", param);
    if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))
      return BAD(e, param, "'%s': unknown role '%.40s' (system, user, assistant, tool)", param, role->valuestring);
    if (check_msg_keys(it, i, rs, e) < 0) return -1;
    int is_tool = !strcmp(rs, "tool");
    if (is_tool) {
      const cJSON *tid = cJSON_GetObjectItemCaseSensitive(it, "tool_call_id");
      snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
      if (!cJSON_IsString(tid)) return BAD(e, param, "'%s' is required and must be a string", param);
      r->has_tool_msgs = 1;
      if (!(r->msgs[i].tool_call_id = dupn(tid->valuestring, strlen(tid->valuestring)))) return OOM(e);
    }
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(it, "reasoning_content");
    if (cJSON_IsString(nm) && !(r->msgs[i].name = dupn(nm->valuestring, strlen(nm->valuestring)))) return OOM(e);
    if (cJSON_IsString(rc) && !(r->msgs[i].reasoning_content = dupn(rc->valuestring, strlen(rc->valuestring))))
      return OOM(e);
    const cJSON *tc = rtr_oai_field(it, "tool_calls");
    if (tc && parse_msg_calls(tc, i, &r->msgs[i].tool_calls, e) < 0) return -1;
    if (r->msgs[i].tool_calls) r->has_tool_msgs = 1;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
    snprintf(param, sizeof param, "messages[%d].content", i);
    char *text = NULL;
    if (cJSON_IsString(c)) {
      text = dupn(c->valuestring, strlen(c->valuestring));
    } else if (!c && r->msgs[i].tool_calls) { // an assistant's calls with no content key
      text = dupn("", 0);
    } else if (cJSON_IsNull(c) && !strcmp(rs, "assistant")) {
      text = dupn("", 0);
    } else if (cJSON_IsArray(c)) {
      size_t total = 0;
      for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t))
          return BAD(e, param, "'%s': only parts {\"type\": \"text\", \"text\": \"...\"} are supported", param);
        total += strlen(t->valuestring);
      }
      text = malloc(total + 1);
      if (text) {
        size_t off = 0;
        for (const cJSON *p = c->child; p; p = p->next) {
          const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
          size_t k = strlen(t);
          memcpy(text + off, t, k);
          off += k;
        }
        text[off] = 0;
      }
    } else if (!c) {
      return BAD(e, param, "'%s' is required", param);
    } else {
      return BAD(e, param, "'%s' must be a string or an array of text parts", param);
    }
    if (!text) return OOM(e);
    r->msgs[i].content = text;
    r->msgs[i].role = dupn(rs, strlen(rs));
    if (!r->msgs[i].role) return OOM(e);
  }
  return 0;
}

static int parse_ids(const cJSON *arr, const char *param, const rtr_limits *lim, int32_t **ids, int *n_ids,
                     rtr_error *e) {
  int n = cJSON_GetArraySize(arr);
  *ids = malloc(((size_t)n + 1) * sizeof **ids);
  if (!*ids) return OOM(e);
  int i = 0;
  for (const cJSON *t = arr->child; t; t = t->next, i++) {
    if (!cJSON_IsNumber(t) || !isfinite(t->valuedouble) || t->valuedouble != floor(t->valuedouble))
      return BAD(e, param, "'%s[%d]' must be an integer token id", param, i);
    if (t->valuedouble < 0 || t->valuedouble >= (double)lim->n_vocab)
      return BAD(e, param, "'%s[%d]': token id %.0f is outside the vocabulary [0, %d)", param, i, t->valuedouble,
                 lim->n_vocab);
    (*ids)[i] = (int32_t)t->valuedouble;
  }
  *n_ids = n;
  return 0;
}

// A list of token ids (one prompt) rather than a list of prompts: every element a number.
static int all_ints(const cJSON *arr) {
  for (const cJSON *t = arr->child; t; t = t->next)
    if (!cJSON_IsNumber(t)) return 0;
  return 1;
}

// prompt (field "prompt"), or an embedding's "input": a string, a list of token ids, or a list of strings / lists of
// token ids (one choice group each, as OpenAI and vLLM number them: prompt i's choices are i*n .. i*n+n-1). At most
// max prompts; an input's strings must not be empty (OpenAI refuses an empty input string).
static int parse_prompt_field(const cJSON *root, const char *field, int max, const rtr_limits *lim, rtr_request *r,
                              rtr_error *e) {
  char shapes[160];
  snprintf(shapes, sizeof shapes, "'%s' must be a string, a list of token ids, or a list of strings or of lists of "
           "token ids", field);
  const int input = !strcmp(field, "input");
  const cJSON *p = rtr_oai_field(root, field);
  if (!p) return BAD(e, field, "'%s' is required", field);
  if (!cJSON_IsString(p) && !cJSON_IsArray(p)) return BAD(e, field, "%s", shapes);
  if (cJSON_IsArray(p) && !p->child) return BAD(e, field, "'%s' must not be empty", field);
  int single = cJSON_IsString(p) || all_ints(p), n = single ? 1 : cJSON_GetArraySize(p);
  if (n > max) return BAD(e, field, "'%s' has %d prompts; at most %d are allowed", field, n, max);
  r->prompts = calloc((size_t)n, sizeof *r->prompts);
  if (!r->prompts) return OOM(e);
  const cJSON *it = single ? p : p->child;
  for (int i = 0; i < n; i++, it = it->next) {
    char param[32];
    if (single) snprintf(param, sizeof param, "%s", field);
    else snprintf(param, sizeof param, "%s[%d]", field, i);
    rtr_prompt *q = &r->prompts[i];
    r->n_prompts = i + 1;
    if (cJSON_IsString(it)) {
      q->len = strlen(it->valuestring);
      if (input && q->len == 0) return BAD(e, param, "'%s' must not be an empty string", param);
      if (!(q->text = dupn(it->valuestring, q->len))) return OOM(e);
    } else if (cJSON_IsArray(it) && it->child && all_ints(it)) {
      if (parse_ids(it, param, lim, &q->ids, &q->n_ids, e) < 0) return -1;
    } else if (cJSON_IsArray(it) && !it->child) {
      return BAD(e, param, "'%s' must not be empty", param);
    } else {
      return BAD(e, param, "%s", shapes);
    }
  }
  return 0;
}

static int parse_prompt(const cJSON *root, const rtr_limits *lim, rtr_request *r, rtr_error *e) {
  return parse_prompt_field(root, "prompt", RTR_MAX_PROMPTS, lim, r, e);
}

// /v1/embeddings (OpenAI's fields): input, encoding_format "float" or "base64", dimensions only as the model's width
// (no Matryoshka truncation: the vector would no longer be the model's), user.
static int parse_embedding(const cJSON *root, const rtr_limits *lim, rtr_request *r, rtr_error *e) {
  if (parse_prompt_field(root, "input", RTR_MAX_INPUTS, lim, r, e) < 0) return -1;
  const cJSON *f = rtr_oai_field(root, "encoding_format");
  if (f && !cJSON_IsString(f)) return BAD(e, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
  if (f && strcmp(f->valuestring, "float") && strcmp(f->valuestring, "base64"))
    return INVAL(e, "encoding_format", "'encoding_format' must be \"float\" or \"base64\", not '%.40s'",
                 f->valuestring);
  r->embd_base64 = f && !strcmp(f->valuestring, "base64");
  int64_t dim;
  int rc = get_int(root, "dimensions", 1, 1 << 30, &dim, e);
  if (rc < 0) return -1;
  if (rc && dim != lim->n_embd)
    return UNSUP(e, "dimensions", "'dimensions' %lld is not supported: this model's embeddings have %d dimensions "
                 "(leave it out, or give %d)", (long long)dim, lim->n_embd, lim->n_embd);
  return rtr_oai_check_str(root, "user", e);
}

static int parse_stop(const cJSON *root, const rtr_limits *lim, rtr_request *r, rtr_error *e) {
  const cJSON *s = rtr_oai_field(root, "stop");
  if (!s) return 0;
  int n;
  if (cJSON_IsString(s)) n = 1;
  else if (cJSON_IsArray(s)) n = cJSON_GetArraySize(s);
  else return BAD(e, "stop", "'stop' must be a string or a list of strings");
  if (n > lim->max_stop) return BAD(e, "stop", "'stop' has %d strings; at most %d are allowed", n, lim->max_stop);
  if (n == 0) return 0;
  r->stop = calloc((size_t)n, sizeof *r->stop);
  if (!r->stop) return OOM(e);
  const cJSON *it = cJSON_IsString(s) ? s : s->child;
  for (int i = 0; i < n; i++, it = it->next) {
    if (!cJSON_IsString(it)) return BAD(e, "stop", "'stop[%d]' must be a string", i);
    size_t k = strlen(it->valuestring);
    if (k == 0) return BAD(e, "stop", "'stop[%d]' must not be empty", i);
    if (k > RTR_MAX_STOP_BYTES) return BAD(e, "stop", "'stop[%d]' is longer than %d bytes", i, RTR_MAX_STOP_BYTES);
    r->stop[i] = dupn(it->valuestring, k);
    if (!r->stop[i]) return OOM(e);
    r->n_stop = i + 1;
  }
  return 0;
}

static int parse_bias(const cJSON *root, const rtr_limits *lim, rtr_request *r, rtr_error *e) {
  const cJSON *b = rtr_oai_field(root, "logit_bias");
  if (!b) return 0;
  if (!cJSON_IsObject(b)) return BAD(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
  int n = cJSON_GetArraySize(b);
  if (n > RTR_MAX_LOGIT_BIAS) return BAD(e, "logit_bias", "'logit_bias' has more than %d entries", RTR_MAX_LOGIT_BIAS);
  if (n == 0) return 0;
  r->bias = calloc((size_t)n, sizeof *r->bias);
  if (!r->bias) return OOM(e);
  for (const cJSON *it = b->child; it; it = it->next) {
    const char *k = it->string;
    char *end = NULL;
    long id = -1;
    if (k && *k >= '0' && *k <= '9' && strlen(k) <= 10) id = strtol(k, &end, 10);
    if (id < 0 || !end || *end || id >= lim->n_vocab)
      return BAD(e, "logit_bias", "'logit_bias' key '%.32s' is not a token id in [0, %d)", k ? k : "", lim->n_vocab);
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 || it->valuedouble > 100)
      return BAD(e, "logit_bias", "'logit_bias[%ld]' must be a number in [-100, 100]", id);
    r->bias[r->n_bias].id = (int32_t)id;
    r->bias[r->n_bias].bias = (float)it->valuedouble;
    r->n_bias++;
  }
  return 0;
}

// chat_template (vLLM's): the template a chat renders with instead of the server's: a family's name (models/chat.h),
// or Jinja text, parsed here (a parse error is a 400 naming its line) and run at render (router/http.c).
// chat_template_kwargs (vLLM's, llama-server's): an object whose keys become the template's top-level variables
// (e.g. enable_thinking); the variables the server sets itself cannot be overridden. A family takes no variables:
// http.c refuses non-empty kwargs when the chat renders with one.
static int parse_chat_template(const cJSON *root, rtr_request *r, rtr_error *e) {
  const cJSON *t = rtr_oai_field(root, "chat_template"), *kw = rtr_oai_field(root, "chat_template_kwargs");
  if (kw && !cJSON_IsObject(kw)) return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
  static const char *const mine[] = {"messages", "tools", "bos_token", "eos_token", "add_generation_prompt", NULL};
  char param[64];
  for (const cJSON *k = kw ? kw->child : NULL; k; k = k->next)
    for (const char *const *m = mine; *m; m++)
      if (!strcmp(k->string, *m)) {
        snprintf(param, sizeof param, "chat_template_kwargs.%.40s", k->string);
        return INVAL(e, param, "'%s' cannot be set: the server sets %s from the request itself", param, *m);
      }
  if (kw && kw->child && r->kind == RTR_TOKENIZE && !rtr_oai_field(root, "messages"))
    return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' needs 'messages'");
  if (kw && kw->child && !(r->chat_kwargs = cJSON_PrintUnformatted(kw))) return OOM(e);
  if (!t) return 0;
  if (!cJSON_IsString(t) || !t->valuestring[0])
    return BAD(e, "chat_template", "'chat_template' must be a non-empty string");
  if (r->kind == RTR_TOKENIZE && !rtr_oai_field(root, "messages"))
    return BAD(e, "chat_template", "'chat_template' needs 'messages'");
  size_t n = strlen(t->valuestring);
  if (n > RTR_MAX_CHAT_TEMPLATE)
    return BAD(e, "chat_template", "'chat_template' is %zu bytes; at most %d are allowed", n, RTR_MAX_CHAT_TEMPLATE);
  if (!(r->chat_family = mdl_chat_template_named(t->valuestring))) {
    char err[384];
    if (mdl_jinja_parse(t->valuestring, n, &r->chat_jinja, err, sizeof err) != 0)
      return INVAL(e, "chat_template", "'chat_template' is neither a template family (%s) nor a Jinja template that "
                   "parses: %s", mdl_chat_template_names(), err);
    r->chat_jinja_tools = mdl_chat_tool_style_detect(t->valuestring, n);
  }
  return (r->chat_template = dupn(t->valuestring, n)) ? 0 : OOM(e);
}

// Every top-level field a kind knows (honoured, no-op or checked); any other is refused, naming it.
static const char *const F_CHAT[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "n", "best_of", "ignore_eos", "stop",
    "logit_bias", "logprobs", "top_logprobs", "stream", "stream_options", "response_format", "tools", "tool_choice",
    "functions", "function_call", "parallel_tool_calls", "user", "store", "metadata", "service_tier",
    "prompt_cache_key", "safety_identifier", "modalities", "chat_template", "chat_template_kwargs", "speculative", NULL};
static const char *const F_COMPLETION[] = {
    "model", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "n", "best_of", "ignore_eos", "stop",
    "logit_bias", "logprobs", "stream", "stream_options", "echo", "suffix", "user", "speculative", NULL};
static const char *const F_TOKENIZE[] = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                                         "chat_template", "chat_template_kwargs", "tools",
                                         "content", NULL}; // content: llama-server's name for prompt
static const char *const F_DETOKENIZE[] = {"model", "tokens", NULL};
static const char *const F_EMBEDDING[] = {"model", "input", "encoding_format", "dimensions", "user", NULL};

static int check_known(rtr_kind kind, const cJSON *root, rtr_error *e) {
  const char *const *known = kind == RTR_CHAT         ? F_CHAT
                             : kind == RTR_COMPLETION ? F_COMPLETION
                             : kind == RTR_TOKENIZE   ? F_TOKENIZE
                             : kind == RTR_EMBEDDING  ? F_EMBEDDING
                                                      : F_DETOKENIZE;
  for (const cJSON *k = root->child; k; k = k->next) {
    int ok = 0;
    for (const char *const *f = known; *f && !ok; f++) ok = !strcmp(*f, k->string);
    if (!ok) {
      char param[64];
      snprintf(param, sizeof param, "%.60s", k->string);
      return UNSUP(e, param, "Unrecognized request argument supplied: '%.60s' (docs/openai.md lists the fields "
                   "this server knows)", k->string);
    }
  }
  return 0;
}

static int parse_sampling(const cJSON *root, const rtr_limits *lim, rtr_request *r, rtr_error *e) {
  int64_t iv;
  int rc;
  int max_limit = lim->max_tokens_limit > 0 ? lim->max_tokens_limit : lim->n_ctx;
  if ((rc = get_int(root, "max_tokens", 1, max_limit, &iv, e)) < 0) return -1;
  if (rc) r->max_tokens = (int)iv;
  if ((rc = get_int(root, "max_completion_tokens", 1, max_limit, &iv, e)) < 0) return -1;
  if (rc) r->max_tokens = (int)iv;
  if (get_num(root, "temperature", 0, 2, 0, &r->temperature, e) < 0) return -1;
  if (get_num(root, "top_p", 0, 1, 1, &r->top_p, e) < 0) return -1;
  if (get_num(root, "min_p", 0, 1, 0, &r->min_p, e) < 0) return -1;
  if (get_num(root, "presence_penalty", -2, 2, 0, &r->presence_penalty, e) < 0) return -1;
  if (get_num(root, "frequency_penalty", -2, 2, 0, &r->frequency_penalty, e) < 0) return -1;
  if (get_num(root, "repetition_penalty", 0, 2, 1, &r->repetition_penalty, e) < 0) return -1;
  if ((rc = get_int(root, "top_k", -1, 1e9, &iv, e)) < 0) return -1;
  if (rc) r->top_k = iv == 0 ? -1 : (int)iv;
  if ((rc = get_int(root, "seed", -9223372036854775807.0, 9223372036854775807.0, &iv, e)) < 0) return -1;
  if (rc) {
    r->has_seed = 1;
    r->seed = iv;
  }
  if ((rc = get_int(root, "n", 1, lim->max_n, &iv, e)) < 0) return -1;
  if (rc) r->n = (int)iv;
  if ((rc = get_int(root, "best_of", 1, lim->max_n, &iv, e)) < 0) return -1;
  if (rc && iv != r->n) return UNSUP(e, "best_of", "'best_of' other than n is not supported");
  if (rtr_oai_get_bool(root, "ignore_eos", &r->ignore_eos, e) < 0) return -1;
  int spec = 1;
  if (rtr_oai_get_bool(root, "speculative", &spec, e) < 0) return -1;
  r->no_spec = !spec;
  if (parse_stop(root, lim, r, e) < 0 || parse_bias(root, lim, r, e) < 0) return -1;

  if (r->kind == RTR_CHAT) {
    int lp = 0;
    if (rtr_oai_get_bool(root, "logprobs", &lp, e) < 0) return -1;
    int64_t top = 0;
    if ((rc = get_int(root, "top_logprobs", 0, 20, &top, e)) < 0) return -1;
    if (rc && !lp) return BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->logprobs = lp ? (int)top : -1;
  } else {
    if ((rc = get_int(root, "logprobs", 0, 5, &iv, e)) < 0) return -1;
    r->logprobs = rc ? (int)iv : -1;
    int echo = 0;
    if (rtr_oai_get_bool(root, "echo", &echo, e) < 0) return -1;
    if (echo) return UNSUP(e, "echo", "'echo' is not supported");
    const cJSON *suffix = rtr_oai_field(root, "suffix");
    if (suffix && !(cJSON_IsString(suffix) && !suffix->valuestring[0]))
      return UNSUP(e, "suffix", "'suffix' is not supported");
  }

  if (rtr_oai_get_bool(root, "stream", &r->stream, e) < 0) return -1;
  const cJSON *so = rtr_oai_field(root, "stream_options");
  if (so) {
    if (!cJSON_IsObject(so)) return BAD(e, "stream_options", "'stream_options' must be an object");
    if (!r->stream) return BAD(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
    int obf = 0;
    if (rtr_oai_get_bool(so, "include_usage", &r->include_usage, e) < 0) {
      snprintf(e->param, sizeof e->param, "stream_options.include_usage");
      return -1;
    }
    if (rtr_oai_get_bool(so, "include_obfuscation", &obf, e) < 0) { // no-op: chunks carry no padding to obfuscate
      snprintf(e->param, sizeof e->param, "stream_options.include_obfuscation");
      return -1;
    }
    for (const cJSON *k = so->child; k; k = k->next)
      if (strcmp(k->string, "include_usage") && strcmp(k->string, "include_obfuscation")) {
        char param[64];
        snprintf(param, sizeof param, "stream_options.%.40s", k->string);
        return UNSUP(e, param, "'%s' is not supported (include_usage, include_obfuscation)", param);
      }
  }
  return r->kind == RTR_CHAT ? rtr_oai_check_chat_extras(root, r, e) : rtr_oai_check_str(root, "user", e);
}

// What the one JSON pre-pass (util/json.h) found, as a 400 naming the place: a duplicate key (Python and JS keep
// the last value, cJSON the first, so a gateway that checked the last one would be bypassed), nesting past cJSON's
// limit, a lone surrogate escape (no character to decode it to), a NUL (it would cut the text short), a number
// outside JSON's grammar.
static void body_issue(const utl_json_issue *is, rtr_error *e) {
  const char *p = is->path;
  switch (is->what) {
  case UTL_JSON_DUP_KEY:
    BAD(e, p, "duplicate key '%s' at byte %zu: a key may appear once in an object", p, is->at);
    break;
  case UTL_JSON_TOO_DEEP:
    BAD(e, NULL, "the JSON nests deeper than %d levels (at byte %zu)", CJSON_NESTING_LIMIT, is->at);
    break;
  case UTL_JSON_SURROGATE:
    BAD(e, p, "'%s' holds a lone UTF-16 surrogate escape at byte %zu (a \\uD800-\\uDBFF escape must be followed by "
        "a \\uDC00-\\uDFFF one)", p, is->at);
    break;
  case UTL_JSON_NUL:
    BAD(e, p, "'%s' contains a NUL character (\\u0000), which is not allowed", p);
    break;
  default:
    BAD(e, p[0] ? p : NULL, "malformed JSON: a number at byte %zu is not in JSON's number syntax", is->at);
  }
}

cJSON *rtr_oai_parse_body(const char *body, size_t len, rtr_error *e) {
  if (!body || len == 0) return BAD(e, NULL, "the request body is empty; expected a JSON object"), NULL;
  if (!rtr_utf8_valid(body, len)) return BAD(e, NULL, "the request body is not valid UTF-8"), NULL;
  utl_json_issue is;
  int bad = utl_json_check(body, len, CJSON_NESTING_LIMIT, &is);
  if (bad < 0) return OOM(e), NULL;
  if (bad) return body_issue(&is, e), NULL;
  const char *end = NULL;
  // numbers keep their literal text (models/json_lit.h): a schema's 9007199254740993 must reach the grammar whole
  cJSON *root = mdl_json_parse(body, len, &end);
  if (!root) {
    if (!end) return OOM(e), NULL;
    size_t at = end >= body && end <= body + len ? (size_t)(end - body) : 0;
    return BAD(e, NULL, "malformed JSON near byte %zu", at), NULL;
  }
  size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : len;
  while (at < len && (body[at] == ' ' || body[at] == '\t' || body[at] == '\r' || body[at] == '\n')) at++;
  if (at < len) BAD(e, NULL, "malformed JSON: unexpected bytes after the value at byte %zu", at);
  else if (!cJSON_IsObject(root)) BAD(e, NULL, "the request body must be a JSON object");
  else return root;
  cJSON_Delete(root);
  return NULL;
}

int rtr_request_parse(rtr_kind kind, const char *body, size_t len, const rtr_limits *lim, rtr_request *out,
                      rtr_error *e) {
  memset(out, 0, sizeof *out);
  memset(e, 0, sizeof *e);
  out->kind = kind;
  out->max_tokens = -1;
  const rtr_sampling *d = lim->defaults;
  out->temperature = d ? d->temperature : 1;
  out->top_p = d ? d->top_p : 1;
  out->top_k = d && d->top_k > 0 ? d->top_k : -1;
  out->min_p = d ? d->min_p : 0;
  out->repetition_penalty = d ? d->repetition_penalty : 1;
  out->n = 1;
  out->logprobs = -1;
  out->add_special = 1;
  out->add_generation_prompt = 1;
  cJSON *root = rtr_oai_parse_body(body, len, e);
  if (!root) return -1;
  int rc = 0;
  if ((rc = check_known(kind, root, e)) < 0) goto done;
  const cJSON *model = rtr_oai_field(root, "model");
  if (model && !cJSON_IsString(model)) {
    rc = BAD(e, "model", "'model' must be a string");
    goto done;
  }
  if (model && lim->model_name && !lim->any_model && strcmp(model->valuestring, lim->model_name)) {
    rc = rtr_fail(e, 404, "not_found_error", "model", "model_not_found",
                  "The model '%.100s' does not exist; this server serves '%.100s'", model->valuestring,
                  lim->model_name);
    goto done;
  }
  switch (kind) {
  case RTR_CHAT:
    if ((rc = parse_msgs(root, out, e)) == 0 && (rc = parse_chat_template(root, out, e)) == 0)
      rc = parse_sampling(root, lim, out, e);
    break;
  case RTR_COMPLETION:
    if ((rc = parse_prompt(root, lim, out, e)) == 0) rc = parse_sampling(root, lim, out, e);
    break;
  case RTR_TOKENIZE:
    if (rtr_oai_get_bool(root, "add_special_tokens", &out->add_special, e) < 0 ||
        rtr_oai_get_bool(root, "add_generation_prompt", &out->add_generation_prompt, e) < 0 ||
        parse_chat_template(root, out, e) < 0) {
      rc = -1;
      break;
    }
    if (rtr_oai_field(root, "content") && (rtr_oai_field(root, "prompt") || rtr_oai_field(root, "messages"))) {
      rc = BAD(e, "content", "give 'prompt', llama-server's 'content' or 'messages', only one of them");
    } else if (rtr_oai_field(root, "messages")) { // tools as a chat lists them (vLLM's /tokenize takes them too)
      if ((rc = parse_msgs(root, out, e)) == 0) rc = rtr_oai_parse_tools(root, out, e);
    } else if (rtr_oai_field(root, "tools")) {
      rc = BAD(e, "tools", "'tools' needs 'messages'");
    } else if (rtr_oai_field(root, "prompt") || rtr_oai_field(root, "content")) {
      const char *name = rtr_oai_field(root, "prompt") ? "prompt" : "content";
      const cJSON *p = rtr_oai_field(root, name);
      if (!cJSON_IsString(p)) rc = BAD(e, name, "'%s' must be a string", name);
      else {
        out->prompt_len = strlen(p->valuestring);
        out->prompt = dupn(p->valuestring, out->prompt_len);
        if (!out->prompt) rc = OOM(e);
      }
    } else
      rc = BAD(e, "prompt", "'prompt' (or 'content') or 'messages' is required");
    break;
  case RTR_EMBEDDING:
    rc = parse_embedding(root, lim, out, e);
    break;
  case RTR_DETOKENIZE: {
    const cJSON *t = rtr_oai_field(root, "tokens");
    if (!t) rc = BAD(e, "tokens", "'tokens' is required");
    else if (!cJSON_IsArray(t)) rc = BAD(e, "tokens", "'tokens' must be a list of token ids");
    else rc = parse_ids(t, "tokens", lim, &out->prompt_ids, &out->n_prompt_ids, e);
    break;
  }
  }
done:
  cJSON_Delete(root);
  if (rc < 0) {
    rtr_request_free(out);
    out->kind = kind;
  }
  return rc < 0 ? -1 : 0;
}

int rtr_check_context(rtr_kind kind, int n_prompt, int max_tokens, int n_ctx, rtr_error *e) {
  const char *what = kind == RTR_CHAT ? "messages" : kind == RTR_EMBEDDING ? "input" : "prompt"; // the prompt's field
  if (n_prompt <= 0) return BAD(e, what, "the prompt is empty (0 tokens)");
  if (n_prompt >= n_ctx)
    return rtr_fail(e, 400, "invalid_request_error", what, "context_length_exceeded",
                    "This model's maximum context length is %d tokens. However, your prompt has %d tokens.", n_ctx,
                    n_prompt);
  if (max_tokens >= 0 && (long)n_prompt + max_tokens > n_ctx)
    return rtr_fail(e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                    "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the "
                    "prompt, %d for the completion). Please reduce the prompt or max_tokens.",
                    n_ctx, n_prompt + max_tokens, n_prompt, max_tokens);
  return 0;
}

// ---- server-side sampling defaults ----

const rtr_sampling rtr_sampling_shipped = {.temperature = 0.8, .top_k = 40, .top_p = 0.95, .min_p = 0.05,
                                           .repetition_penalty = 1.0};

// A GGUF number (float or integer) under key within [lo, hi] (lo excluded when lo_open); 1 when found.
static int gguf_num(const mdl_gguf *g, const char *key, double lo, double hi, int lo_open, double *out) {
  float f;
  int64_t i;
  double d;
  if (!g) return 0;
  if (mdl_gguf_get_f32(g, key, &f) == 0) {
    char b[32]; // 0.95f is 0.949999988...: keep the float's own 7 significant digits
    snprintf(b, sizeof b, "%.7g", (double)f);
    d = strtod(b, NULL);
  } else if (mdl_gguf_get_i64(g, key, &i) == 0) d = (double)i;
  else return 0;
  if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) return 0;
  *out = d;
  return 1;
}

void rtr_sampling_resolve(const cfg_sampling *cfg, const mdl_gguf *g, rtr_sampling *out, char *desc,
                          size_t desc_cap) {
  static const char *const from_name[] = {"shipped", "gguf", "config"};
  const rtr_sampling *sh = &rtr_sampling_shipped;
  double v, top_k = sh->top_k;
  int from[5] = {0, 0, 0, 0, 0}; // temperature, top_k, top_p, min_p, repetition_penalty
  *out = *sh;
  if (cfg && cfg->has_temperature) out->temperature = cfg->temperature, from[0] = 2;
  else if (gguf_num(g, "general.sampling.temp", 0, 2, 0, &v)) out->temperature = v, from[0] = 1;
  if (cfg && cfg->has_top_k) top_k = cfg->top_k, from[1] = 2;
  else if (gguf_num(g, "general.sampling.top_k", -1, 1000000, 0, &v) && v == floor(v)) top_k = v, from[1] = 1;
  out->top_k = top_k > 0 ? (int)top_k : -1;
  if (cfg && cfg->has_top_p) out->top_p = cfg->top_p, from[2] = 2;
  else if (gguf_num(g, "general.sampling.top_p", 0, 1, 1, &v)) out->top_p = v, from[2] = 1;
  if (cfg && cfg->has_min_p) out->min_p = cfg->min_p, from[3] = 2;
  else if (gguf_num(g, "general.sampling.min_p", 0, 1, 0, &v)) out->min_p = v, from[3] = 1;
  if (cfg && cfg->has_repetition_penalty) out->repetition_penalty = cfg->repetition_penalty, from[4] = 2;
  else if (gguf_num(g, "general.sampling.penalty_repeat", 0, 2, 1, &v)) out->repetition_penalty = v, from[4] = 1;
  if (desc && desc_cap)
    snprintf(desc, desc_cap, "temperature %g (%s), top_k %d (%s), top_p %g (%s), min_p %g (%s), "
             "repetition_penalty %g (%s)", out->temperature, from_name[from[0]], out->top_k, from_name[from[1]],
             out->top_p, from_name[from[2]], out->min_p, from_name[from[3]], out->repetition_penalty,
             from_name[from[4]]);
}
