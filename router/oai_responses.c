// router/oai_responses.c: the Responses API's requests (/v1/responses) as chat requests, pure (its answers:
// oai_resp_out.c).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/oai_int.h"
#include "router/openai.h"
#include "util/buf.h"
#include "util/json.h"
#include "util/vec.h"
#include "models/json_lit.h"

// Every top-level field /v1/responses knows; any other is refused, naming it.
static const char *const F_RESPONSES[] = {
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
    "parallel_tool_calls", "stream", "store", "metadata", "user", "text", "truncation", "service_tier",
    "safety_identifier", "prompt_cache_key", "background", "include", "chat_template", "chat_template_kwargs",
    "speculative", NULL};

static int only(const cJSON *obj, const char *const *known, const char *where, rtr_error *e) {
  for (const cJSON *k = obj->child; k; k = k->next) {
    int ok = 0;
    for (const char *const *f = known; *f && !ok; f++) ok = !strcmp(*f, k->string);
    if (!ok) {
      char param[64];
      snprintf(param, sizeof param, "%s%s%.40s", where, where[0] ? "." : "", k->string);
      return UNSUP(e, param, "'%s' is not supported on /v1/responses (docs/openai.md lists the fields)", param);
    }
  }
  return 0;
}

static const char *str_of(const cJSON *o, const char *k) {
  const cJSON *v = rtr_oai_field(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

// One message item's content: a string, or a list of input_text / output_text parts (their texts joined).
static int item_text(const cJSON *content, int i, utl_buf *out, rtr_error *e) {
  char param[64];
  snprintf(param, sizeof param, "input[%d].content", i);
  if (cJSON_IsString(content)) return utl_buf_adds(out, content->valuestring) ? OOM(e) : 0;
  if (!cJSON_IsArray(content)) return BAD(e, param, "'%s' must be a string or a list of text parts", param);
  int j = 0;
  for (const cJSON *p = content->child; p; p = p->next, j++) {
    snprintf(param, sizeof param, "input[%d].content[%d]", i, j);
    const char *type = str_of(p, "type"), *text = str_of(p, "text");
    if (!cJSON_IsObject(p) || !type) return BAD(e, param, "'%s' must be a part with a 'type'", param);
    if (strcmp(type, "input_text") && strcmp(type, "output_text"))
      return UNSUP(e, param, "'%s' of type '%.40s' is not supported: only text parts (input_text, output_text)",
                   param, type);
    static const char *const part_keys[] = {"type", "text", "annotations", "logprobs", NULL};
    if (only(p, part_keys, param, e) < 0) return -1;
    const cJSON *ann = rtr_oai_field(p, "annotations");
    if (ann && !(cJSON_IsArray(ann) && !ann->child))
      return UNSUP(e, param, "'%s.annotations' other than [] is not supported", param);
    if (!text) return BAD(e, param, "'%s.text' must be a string", param);
    if (utl_buf_adds(out, text)) return OOM(e);
  }
  return 0;
}

// A function_call's call_id and where it stands in input, sorted by (id, index) to find the call an output answers.
typedef struct call_ref {
  const char *id; // (borrowed: the request)
  int index;
} call_ref;

static int call_ref_cmp(const void *a, const void *b) {
  const call_ref *x = a, *y = b;
  int c = strcmp(x->id, y->id);
  return c ? c : (x->index > y->index) - (x->index < y->index);
}

// The call_ids of input's function_call items, sorted; *n of them. NULL with n 0 when there are none (or no memory:
// then *oom).
static call_ref *call_refs(const cJSON *input, int *n, int *oom) {
  int cap = 0, i = 0;
  call_ref *r = NULL;
  *n = 0;
  *oom = 0;
  for (const cJSON *it = input->child; it; it = it->next, i++) {
    const char *type = str_of(it, "type"), *id = str_of(it, "call_id");
    if (!type || strcmp(type, "function_call") || !id) continue;
    if (UTL_VEC_PUSH(r, *n, cap, ((call_ref){id, i})) < 0) {
      *oom = 1;
      break;
    }
  }
  if (r) qsort(r, (size_t)*n, sizeof *r, call_ref_cmp);
  return r;
}

// Whether a function_call before item i has call_id id.
static int call_before(const call_ref *r, int n, const char *id, int i) {
  int lo = 0, hi = n; // the first (id, index) at or after (id, 0): the earliest call with that id
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (strcmp(r[mid].id, id) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && !strcmp(r[lo].id, id) && r[lo].index < i;
}

// A function_call's arguments must be one JSON value (the model's call as it wrote it, which the template renders
// as JSON): checked by the same pre-pass and parser as a body. 0, or -1 with e naming param.
static int check_args(const char *args, const char *param, rtr_error *e) {
  utl_json_issue is;
  size_t n = strlen(args);
  int bad = utl_json_check(args, n, CJSON_NESTING_LIMIT, &is);
  if (bad < 0) return OOM(e);
  if (bad)
    return BAD(e, param, "'%s' is not valid JSON: %s at byte %zu%s%.60s", param, utl_json_problem_name(is.what), is.at,
               is.path[0] ? ", at " : "", is.path);
  const char *end = NULL;
  cJSON *v = cJSON_ParseWithLengthOpts(args, n, &end, 0);
  size_t at = v && end ? (size_t)(end - args) : 0;
  while (v && at < n && (args[at] == ' ' || args[at] == '\t' || args[at] == '\r' || args[at] == '\n')) at++;
  cJSON_Delete(v);
  if (!v || at < n)
    return BAD(e, param, "'%s' is not valid JSON (near byte %zu): a function call's arguments are a JSON text", param,
               !v && end ? (size_t)(end - args) : at);
  return 0;
}

// input as chat messages, appended to msgs: a string is one user message; a list holds messages (role user,
// system, developer, assistant), function_call items (consecutive ones: one assistant message's tool_calls; their
// arguments a JSON text) and function_call_output items (tool messages, each answering a function_call before it:
// refs, sorted by call_ids).
static int input_items(const cJSON *input, cJSON *msgs, const call_ref *refs, int n_refs, rtr_error *e) {
  if (cJSON_IsString(input)) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddStringToObject(m, "role", "user");
    return cJSON_AddStringToObject(m, "content", input->valuestring) ? 0 : OOM(e);
  }
  if (!cJSON_IsArray(input) || !input->child)
    return BAD(e, "input", "'input' must be a string or a non-empty list of items");
  int i = 0;
  cJSON *calls = NULL; // the tool_calls of the assistant message the last function_call items went into
  for (const cJSON *it = input->child; it; it = it->next, i++) {
    char param[48];
    snprintf(param, sizeof param, "input[%d]", i);
    if (!cJSON_IsObject(it)) return BAD(e, param, "'%s' must be an object", param);
    const char *type = str_of(it, "type");
    if (rtr_oai_field(it, "type") && !type) return BAD(e, param, "'%s.type' must be a string", param);
    cJSON *m = cJSON_CreateObject();
    if (!m) return OOM(e);
    if (!type || !strcmp(type, "message")) {
      static const char *const keys[] = {"type", "role", "content", "id", "status", NULL};
      const char *role = str_of(it, "role");
      utl_buf text = {0};
      cJSON_Delete(m);
      if (only(it, keys, param, e) < 0) return -1;
      if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") &&
                    strcmp(role, "assistant")))
        return BAD(e, param, "'%s.role' must be user, system, developer or assistant", param);
      if (item_text(rtr_oai_field(it, "content"), i, &text, e) < 0) {
        utl_buf_free(&text);
        return -1;
      }
      char *t = utl_buf_take(&text);
      m = cJSON_CreateObject();
      cJSON_AddItemToArray(msgs, m);
      cJSON_AddStringToObject(m, "role", role);
      cJSON *c = cJSON_AddStringToObject(m, "content", t ? t : "");
      free(t);
      if (!c) return OOM(e);
      calls = NULL;
    } else if (!strcmp(type, "function_call")) {
      static const char *const keys[] = {"type", "call_id", "name", "arguments", "id", "status", NULL};
      const char *id = str_of(it, "call_id"), *name = str_of(it, "name"), *args = str_of(it, "arguments");
      cJSON_Delete(m);
      if (only(it, keys, param, e) < 0) return -1;
      if (!id || !name || !args)
        return BAD(e, param, "'%s' (a function_call) needs string 'call_id', 'name' and 'arguments'", param);
      char ap[64];
      snprintf(ap, sizeof ap, "%s.arguments", param);
      if (check_args(args, ap, e) < 0) return -1;
      if (!calls) {
        m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddNullToObject(m, "content");
        calls = cJSON_AddArrayToObject(m, "tool_calls");
        if (!calls) return OOM(e);
      }
      cJSON *c = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(c, "function");
      cJSON_AddItemToArray(calls, c);
      cJSON_AddStringToObject(c, "id", id);
      cJSON_AddStringToObject(c, "type", "function");
      cJSON_AddStringToObject(f, "name", name);
      if (!cJSON_AddStringToObject(f, "arguments", args)) return OOM(e);
    } else if (!strcmp(type, "function_call_output")) {
      static const char *const keys[] = {"type", "call_id", "output", "id", "status", NULL};
      const char *id = str_of(it, "call_id"), *out = str_of(it, "output");
      cJSON_AddItemToArray(msgs, m);
      if (only(it, keys, param, e) < 0) return -1;
      if (!id || !out)
        return BAD(e, param, "'%s' (a function_call_output) needs string 'call_id' and 'output'", param);
      if (!call_before(refs, n_refs, id, i)) {
        char cp[64];
        snprintf(cp, sizeof cp, "%s.call_id", param);
        return BAD(e, cp, "'%s' '%.64s' answers no function_call before it in 'input' (an output follows the call it "
                   "answers, with the same call_id)", cp, id);
      }
      cJSON_AddStringToObject(m, "role", "tool");
      cJSON_AddStringToObject(m, "tool_call_id", id);
      if (!cJSON_AddStringToObject(m, "content", out)) return OOM(e);
      calls = NULL;
    } else {
      cJSON_Delete(m);
      return UNSUP(e, param, "'%s' of type '%.40s' is not supported (message, function_call, function_call_output)",
                   param, type);
    }
  }
  return 0;
}

static int input_msgs(const cJSON *input, cJSON *msgs, rtr_error *e) {
  int n_refs = 0, oom = 0;
  call_ref *refs = NULL;
  if (cJSON_IsArray(input) && !(refs = call_refs(input, &n_refs, &oom)) && oom) return OOM(e);
  int rc = input_items(input, msgs, refs, n_refs, e);
  free(refs);
  return rc;
}

// The Responses API's function tools ({"type": "function", "name", ...}) as chat tools.
static int tools_of(const cJSON *tools, cJSON *chat, rtr_error *e) {
  if (!cJSON_IsArray(tools)) return BAD(e, "tools", "'tools' must be a list");
  cJSON *out = cJSON_AddArrayToObject(chat, "tools");
  int i = 0;
  for (const cJSON *t = tools->child; t; t = t->next, i++) {
    char param[32];
    snprintf(param, sizeof param, "tools[%d]", i);
    const char *type = str_of(t, "type");
    if (!cJSON_IsObject(t) || !type) return BAD(e, param, "'%s' must be a tool object with a 'type'", param);
    if (strcmp(type, "function"))
      return UNSUP(e, param, "tools of type '%.40s' are not supported: only function tools", type);
    static const char *const keys[] = {"type", "name", "description", "parameters", "strict", NULL};
    if (only(t, keys, param, e) < 0) return -1;
    cJSON *o = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(o, "function");
    cJSON_AddItemToArray(out, o);
    cJSON_AddStringToObject(o, "type", "function");
    for (const cJSON *k = t->child; k; k = k->next)
      if (strcmp(k->string, "type")) cJSON_AddItemToObject(f, k->string, cJSON_Duplicate(k, 1));
  }
  return 0;
}

static int tool_choice_of(const cJSON *tc, cJSON *chat, rtr_error *e) {
  if (cJSON_IsString(tc)) return cJSON_AddItemToObject(chat, "tool_choice", cJSON_Duplicate(tc, 1)) ? 0 : OOM(e);
  const char *type = str_of(tc, "type"), *name = str_of(tc, "name");
  if (!cJSON_IsObject(tc) || !type || strcmp(type, "function") || !name)
    return UNSUP(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                 "\"function\", \"name\": ...}");
  static const char *const keys[] = {"type", "name", NULL};
  if (only(tc, keys, "tool_choice", e) < 0) return -1;
  cJSON *o = cJSON_AddObjectToObject(chat, "tool_choice");
  cJSON_AddStringToObject(o, "type", "function");
  cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", name);
  return 0;
}

// text: {"format": {"type": "text" | "json_object" | "json_schema", ...}} as the chat's response_format.
static int text_format_of(const cJSON *text, cJSON *chat, rtr_error *e) {
  static const char *const keys[] = {"format", NULL};
  if (!cJSON_IsObject(text)) return BAD(e, "text", "'text' must be an object");
  if (only(text, keys, "text", e) < 0) return -1;
  const cJSON *f = rtr_oai_field(text, "format");
  const char *type = str_of(f, "type");
  if (!f) return 0;
  if (!cJSON_IsObject(f) || !type) return BAD(e, "text.format", "'text.format' must be an object with a 'type'");
  cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
  cJSON_AddStringToObject(rf, "type", type);
  if (strcmp(type, "json_schema")) {
    static const char *const plain[] = {"type", NULL};
    return only(f, plain, "text.format", e);
  }
  static const char *const js[] = {"type", "name", "schema", "strict", "description", NULL};
  if (only(f, js, "text.format", e) < 0) return -1;
  cJSON *j = cJSON_AddObjectToObject(rf, "json_schema");
  for (const cJSON *k = f->child; k; k = k->next)
    if (strcmp(k->string, "type")) cJSON_AddItemToObject(j, k->string, cJSON_Duplicate(k, 1));
  return 0;
}

// The request's fields a response object repeats (as given, or their defaults).
static char *echo_of(const cJSON *root) {
  cJSON *o = cJSON_CreateObject();
  const char *names[] = {"instructions", "max_output_tokens", "tools", "tool_choice", "parallel_tool_calls", "text",
                         "metadata", "user"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const cJSON *v = rtr_oai_field(root, names[i]);
    if (v) cJSON_AddItemToObject(o, names[i], cJSON_Duplicate(v, 1));
  }
  if (!rtr_oai_field(root, "instructions")) cJSON_AddNullToObject(o, "instructions");
  if (!rtr_oai_field(root, "max_output_tokens")) cJSON_AddNullToObject(o, "max_output_tokens");
  if (!rtr_oai_field(root, "tools")) cJSON_AddArrayToObject(o, "tools");
  if (!rtr_oai_field(root, "tool_choice")) cJSON_AddStringToObject(o, "tool_choice", "auto");
  if (!rtr_oai_field(root, "parallel_tool_calls")) cJSON_AddTrueToObject(o, "parallel_tool_calls");
  if (!rtr_oai_field(root, "text"))
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "text"), "format"), "type", "text");
  if (!rtr_oai_field(root, "metadata")) cJSON_AddObjectToObject(o, "metadata");
  cJSON_AddFalseToObject(o, "store");
  cJSON_AddStringToObject(o, "truncation", "disabled");
  char *s = mdl_json_print(o);
  cJSON_Delete(o);
  return s;
}

// The chat body for root; -1 with e.
static int to_chat(const cJSON *root, cJSON *chat, rtr_error *e) {
  if (only(root, F_RESPONSES, "", e) < 0) return -1;
  const cJSON *v;
  if (!rtr_oai_field(root, "input")) return BAD(e, "input", "'input' is required");
  cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
  if ((v = rtr_oai_field(root, "instructions"))) {
    if (!cJSON_IsString(v)) return BAD(e, "instructions", "'instructions' must be a string");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddStringToObject(m, "role", "system");
    cJSON_AddStringToObject(m, "content", v->valuestring);
  }
  if (input_msgs(rtr_oai_field(root, "input"), msgs, e) < 0) return -1;
  // copied as they are: the chat parser checks them (and its errors are renamed by parse_responses)
  static const char *const same[] = {"model", "temperature", "top_p", "parallel_tool_calls", "stream", "metadata",
                                     "user", "service_tier", "safety_identifier", "prompt_cache_key", "chat_template",
                                     "chat_template_kwargs", "speculative", NULL};
  for (const char *const *k = same; *k; k++)
    if ((v = rtr_oai_field(root, *k))) cJSON_AddItemToObject(chat, *k, cJSON_Duplicate(v, 1));
  if ((v = rtr_oai_field(root, "max_output_tokens")))
    cJSON_AddItemToObject(chat, "max_completion_tokens", cJSON_Duplicate(v, 1));
  if (cJSON_IsTrue(rtr_oai_field(root, "stream"))) // the usage event feeds response.completed
    cJSON_AddTrueToObject(cJSON_AddObjectToObject(chat, "stream_options"), "include_usage");
  if ((v = rtr_oai_field(root, "tools")) && tools_of(v, chat, e) < 0) return -1;
  if ((v = rtr_oai_field(root, "tool_choice")) && tool_choice_of(v, chat, e) < 0) return -1;
  if ((v = rtr_oai_field(root, "text")) && text_format_of(v, chat, e) < 0) return -1;
  if ((v = rtr_oai_field(root, "store")) && !cJSON_IsFalse(v))
    return UNSUP(e, "store", "'store' must be false: nothing is stored (no previous_response_id to chain from)");
  if ((v = rtr_oai_field(root, "background")) && !cJSON_IsFalse(v))
    return UNSUP(e, "background", "'background' must be false: responses are answered while the client waits");
  if ((v = rtr_oai_field(root, "truncation")) && !(cJSON_IsString(v) && !strcmp(v->valuestring, "disabled")))
    return UNSUP(e, "truncation", "'truncation' must be \"disabled\": a prompt over the context is a 400");
  if ((v = rtr_oai_field(root, "include")) && !(cJSON_IsArray(v) && !v->child))
    return UNSUP(e, "include", "'include' must be empty: there is nothing extra to include");
  return 0;
}

// A chat field's name in an error, as the Responses request spells it.
static void rename_param(rtr_error *e) {
  char p[64];
  snprintf(p, sizeof p, "%s", e->param);
  unsigned i;
  if (!strncmp(p, "messages", 8)) snprintf(e->param, sizeof e->param, "input");
  else if (!strcmp(p, "max_completion_tokens")) snprintf(e->param, sizeof e->param, "max_output_tokens");
  else if (!strncmp(p, "response_format", 15)) snprintf(e->param, sizeof e->param, "text.format");
  else if (!strncmp(p, "stream_options", 14)) snprintf(e->param, sizeof e->param, "stream");
  else if (sscanf(p, "tools[%u].function.", &i) == 1 && strstr(p, "].function."))
    snprintf(e->param, sizeof e->param, "tools[%u].%s", i, strstr(p, "].function.") + 11);
  else if (sscanf(p, "tools[%u].function", &i) == 1) snprintf(e->param, sizeof e->param, "tools[%u]", i);
}

int rtr_request_parse_responses(const char *body, size_t len, const rtr_limits *lim, rtr_request *out, rtr_error *e) {
  memset(out, 0, sizeof *out);
  memset(e, 0, sizeof *e);
  cJSON *root = rtr_oai_parse_body(body, len, e), *chat = cJSON_CreateObject();
  char *text = NULL;
  int rc = !root ? -1 : !chat ? OOM(e) : to_chat(root, chat, e);
  if (rc == 0 && !(text = mdl_json_print(chat))) rc = OOM(e); // numbers as the client wrote them
  if (rc == 0 && (rc = rtr_request_parse(RTR_CHAT, text, strlen(text), lim, out, e)) < 0) rename_param(e);
  if (rc == 0) {
    out->api = RTR_API_RESPONSES;
    if (!(out->resp_echo = echo_of(root))) {
      rtr_request_free(out);
      rc = OOM(e);
    }
  }
  free(text);
  cJSON_Delete(chat);
  cJSON_Delete(root);
  if (rc < 0) out->kind = RTR_CHAT;
  return rc < 0 ? -1 : 0;
}
