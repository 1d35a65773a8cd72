// router/oai_tools.c: tools and structured outputs at the OpenAI layer: the request's tools, tool_choice,
// response_format and the chat-only fields checked beside them, and the tool calls parsed out of the model's text.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "models/json_lit.h"
#include "router/oai_int.h"
#include "router/openai.h"

// ---- fields beyond sampling: documented no-ops, and what is refused until it exists (docs/openai.md) ----


// The deprecated functions / function_call: accepted only as "no calls" (no functions, or function_call "none");
// anything else is refused, pointing at tools / tool_choice, which take the same declarations.
static int check_functions(const cJSON *root, rtr_error *e) {
  const cJSON *fns = rtr_oai_field(root, "functions"), *fc = rtr_oai_field(root, "function_call");
  if (fns && !cJSON_IsArray(fns)) return BAD(e, "functions", "'functions' must be an array");
  if (fc && !cJSON_IsString(fc) && !cJSON_IsObject(fc))
    return BAD(e, "function_call", "'function_call' must be a string or an object");
  if (fc && (cJSON_IsObject(fc) || strcmp(fc->valuestring, "none")) && (cJSON_IsObject(fc) || strcmp(fc->valuestring, "auto")))
    return UNSUP(e, "function_call", "'function_call' (deprecated) is not supported: send 'tool_choice'");
  if (fns && fns->child && !(fc && !strcmp(fc->valuestring, "none")))
    return UNSUP(e, "functions", "'functions' (deprecated) is not supported: send the same declarations as 'tools' "
                 "([{\"type\": \"function\", \"function\": {...}}])");
  return 0;
}

// A function name: 1..64 of a-z, A-Z, 0-9, _ and - (OpenAI's rule).
static int name_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 64) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
      return 0;
  return 1;
}

// One tools[i]: {"type": "function", "function": {name, description, parameters, strict}}. The parameters schema is
// compiled (models/json_schema.c) so what the call grammar cannot follow is a 400 naming the keyword. Appends
// {"name", "parameters"} to calls.
static int parse_tool(const cJSON *t, int i, cJSON *calls, rtr_error *e) {
  char param[96];
  snprintf(param, sizeof param, "tools[%d]", i);
  if (!cJSON_IsObject(t)) return BAD(e, param, "'%s' must be an object", param);
  for (const cJSON *k = t->child; k; k = k->next)
    if (strcmp(k->string, "type") && strcmp(k->string, "function")) {
      snprintf(param, sizeof param, "tools[%d].%.40s", i, k->string);
      return UNSUP(e, param, "'%s' is not supported (a tool has type and function)", param);
    }
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type"), *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
  snprintf(param, sizeof param, "tools[%d].type", i);
  if (!cJSON_IsString(type)) return BAD(e, param, "'%s' is required and must be \"function\"", param);
  if (strcmp(type->valuestring, "function"))
    return INVAL(e, param, "'%s' '%.40s' is not supported (only \"function\")", param, type->valuestring);
  snprintf(param, sizeof param, "tools[%d].function", i);
  if (!cJSON_IsObject(fn)) return BAD(e, param, "'%s' is required and must be an object", param);
  for (const cJSON *k = fn->child; k; k = k->next)
    if (strcmp(k->string, "name") && strcmp(k->string, "description") && strcmp(k->string, "parameters") &&
        strcmp(k->string, "strict")) {
      snprintf(param, sizeof param, "tools[%d].function.%.40s", i, k->string);
      return UNSUP(e, param, "'%s' is not supported (name, description, parameters, strict)", param);
    }
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *desc = rtr_oai_field(fn, "description");
  const cJSON *params = rtr_oai_field(fn, "parameters"), *strict = rtr_oai_field(fn, "strict");
  snprintf(param, sizeof param, "tools[%d].function.name", i);
  if (!cJSON_IsString(name) || !name_ok(name->valuestring))
    return BAD(e, param, "'%s' must be 1..64 of a-z, A-Z, 0-9, _ and -", param);
  snprintf(param, sizeof param, "tools[%d].function.description", i);
  if (desc && !cJSON_IsString(desc)) return BAD(e, param, "'%s' must be a string", param);
  snprintf(param, sizeof param, "tools[%d].function.strict", i);
  if (strict && !cJSON_IsBool(strict)) return BAD(e, param, "'%s' must be a boolean", param);
  snprintf(param, sizeof param, "tools[%d].function.parameters", i);
  if (params && !cJSON_IsObject(params)) return BAD(e, param, "'%s' must be a JSON Schema object", param);
  for (const cJSON *o = calls->child; o; o = o->next)
    if (!strcmp(cJSON_GetObjectItemCaseSensitive(o, "name")->valuestring, name->valuestring)) {
      snprintf(param, sizeof param, "tools[%d].function.name", i);
      return BAD(e, param, "'%s': a tool named '%s' is declared twice", param, name->valuestring);
    }
  if (params) {
    char *text = mdl_json_print(params), err[400];
    if (!text) return OOM(e);
    mdl_grammar *g = NULL;
    int rc = mdl_grammar_from_json_schema(text, strlen(text), &g, err, sizeof err);
    mdl_grammar_unref(g);
    free(text);
    if (rc == MDL_GRAMMAR_UNSUPPORTED) return UNSUP(e, param, "'%s': %s", param, err);
    if (rc) return INVAL(e, param, "'%s': %s", param, err);
  }
  cJSON *o = cJSON_CreateObject();
  if (!o || !cJSON_AddStringToObject(o, "name", name->valuestring)) {
    cJSON_Delete(o);
    return OOM(e);
  }
  if (params) cJSON_AddItemToObject(o, "parameters", cJSON_Duplicate(params, 1));
  cJSON_AddItemToArray(calls, o);
  return 0;
}

// tools, tool_choice and parallel_tool_calls. tool_choice: "none" (no calls; the tools are left out of the prompt),
// "auto" (the default with tools: the model may call; its output is read for calls), "required" or
// {"type": "function", "function": {"name"}} (decoding is constrained to calls, models/json_schema.c).
int rtr_oai_parse_tools(const cJSON *root, rtr_request *r, rtr_error *e) {
  const cJSON *tools = rtr_oai_field(root, "tools"), *choice = rtr_oai_field(root, "tool_choice");
  r->parallel_tool_calls = 1;
  int parallel_given = rtr_oai_get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, e);
  if (parallel_given < 0) return -1;
  if (tools && !cJSON_IsArray(tools)) return BAD(e, "tools", "'tools' must be an array");
  int n = tools ? cJSON_GetArraySize(tools) : 0;
  if (n > RTR_MAX_TOOLS) return BAD(e, "tools", "'tools' has %d tools; at most %d are allowed", n, RTR_MAX_TOOLS);
  const char *named = NULL;
  int mode = n ? RTR_TOOLS_AUTO : RTR_TOOLS_OFF;
  if (choice) {
    if (cJSON_IsString(choice)) {
      const char *c = choice->valuestring;
      if (!strcmp(c, "none")) mode = RTR_TOOLS_OFF;
      else if (!strcmp(c, "auto")) mode = n ? RTR_TOOLS_AUTO : RTR_TOOLS_OFF;
      else if (!strcmp(c, "required")) mode = RTR_TOOLS_REQUIRED;
      else return INVAL(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else if (cJSON_IsObject(choice)) {
      const cJSON *t = cJSON_GetObjectItemCaseSensitive(choice, "type"), *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
      const cJSON *nm = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
      if (!cJSON_IsString(t) || strcmp(t->valuestring, "function") || !cJSON_IsString(nm))
        return BAD(e, "tool_choice", "'tool_choice' as an object must be {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}");
      for (const cJSON *k = choice->child; k; k = k->next)
        if (strcmp(k->string, "type") && strcmp(k->string, "function"))
          return UNSUP(e, "tool_choice", "'tool_choice.%.40s' is not supported", k->string);
      for (const cJSON *k = f->child; k; k = k->next)
        if (strcmp(k->string, "name"))
          return UNSUP(e, "tool_choice", "'tool_choice.function.%.40s' is not supported", k->string);
      named = nm->valuestring;
      mode = RTR_TOOLS_NAMED;
    } else {
      return BAD(e, "tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  if (mode >= RTR_TOOLS_REQUIRED && !n)
    return BAD(e, "tool_choice", "'tool_choice' %s needs 'tools'", named ? "naming a function" : "\"required\"");
  // A forced call is one call unless parallel calls are asked for: with OpenAI's default (true) a small model
  // under the call grammar writes call after call until max_tokens.
  if (mode >= RTR_TOOLS_REQUIRED && !parallel_given) r->parallel_tool_calls = 0;
  if (!n) return 0;
  cJSON *calls = cJSON_CreateArray();
  if (!calls) return OOM(e);
  int i = 0, rc = 0;
  for (const cJSON *t = tools->child; t && !rc; t = t->next) rc = parse_tool(t, i++, calls, e);
  if (!rc && named) { // only the named tool can be called
    cJSON *keep = NULL;
    for (cJSON *o = calls->child; o && !keep; o = o->next)
      if (!strcmp(cJSON_GetObjectItemCaseSensitive(o, "name")->valuestring, named)) keep = o;
    if (!keep) rc = INVAL(e, "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'", named);
    else {
      cJSON *one = cJSON_CreateArray();
      if (!one) rc = OOM(e);
      else {
        cJSON_AddItemToArray(one, cJSON_DetachItemViaPointer(calls, keep));
        cJSON_Delete(calls);
        calls = one;
      }
    }
  }
  if (!rc && mode != RTR_TOOLS_OFF) {
    r->tool_choice = mode;
    if (!(r->tools = mdl_json_print(tools)) || !(r->call_tools = mdl_json_print(calls))) rc = OOM(e);
  }
  cJSON_Delete(calls);
  return rc;
}

// Keys of obj other than those in known (NULL-terminated) are refused, naming the first (param: response_format).
static int only_keys(const cJSON *obj, const char *where, const char *const *known, rtr_error *e) {
  for (const cJSON *k = obj->child; k; k = k->next) {
    int ok = 0;
    for (const char *const *f = known; *f && !ok; f++) ok = !strcmp(*f, k->string);
    if (!ok)
      return UNSUP(e, "response_format", "'%s.%.40s' is not supported (docs/openai.md lists the fields)", where,
                   k->string);
  }
  return 0;
}

// response_format: text; json_object (any JSON object); json_schema {name, description, schema, strict}. The schema
// is compiled here (models/json_schema.c) so a bad or unsupported one is a 400 naming the keyword; the workers
// compile it again from the generate message's grammar field (docs/protocol.md).
static int parse_response_format(const cJSON *root, rtr_request *r, rtr_error *e) {
  static const char *const k_type[] = {"type", NULL}, *const k_schema[] = {"type", "json_schema", NULL};
  static const char *const k_js[] = {"name", "description", "schema", "strict", NULL};
  const cJSON *rf = rtr_oai_field(root, "response_format");
  if (!rf) return 0;
  if (!cJSON_IsObject(rf)) return BAD(e, "response_format", "'response_format' must be an object");
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
  if (!cJSON_IsString(t))
    return INVAL(e, "response_format", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  int is_schema = !strcmp(t->valuestring, "json_schema");
  if (strcmp(t->valuestring, "text") && strcmp(t->valuestring, "json_object") && !is_schema)
    return INVAL(e, "response_format", "'response_format.type' '%.40s' is not one of \"text\", \"json_object\", "
                 "\"json_schema\"", t->valuestring);
  if (only_keys(rf, "response_format", is_schema ? k_schema : k_type, e) < 0) return -1;
  if (!strcmp(t->valuestring, "text")) return 0;
  r->response_format = RTR_FORMAT_JSON_OBJECT;
  if (!is_schema) return 0;
  const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
  if (!cJSON_IsObject(js))
    return BAD(e, "response_format", "'response_format.json_schema' must be an object with 'name' and 'schema'");
  if (only_keys(js, "response_format.json_schema", k_js, e) < 0) return -1;
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name"), *desc = rtr_oai_field(js, "description");
  const cJSON *schema = rtr_oai_field(js, "schema"), *strict = rtr_oai_field(js, "strict");
  int name_ok = cJSON_IsString(name) && name->valuestring[0] && strlen(name->valuestring) <= 64;
  for (const char *c = name_ok ? name->valuestring : ""; *c && name_ok; c++)
    name_ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-';
  if (!name_ok)
    return BAD(e, "response_format", "'response_format.json_schema.name' must be 1..64 of a-z, A-Z, 0-9, _ and -");
  if (desc && !cJSON_IsString(desc))
    return BAD(e, "response_format", "'response_format.json_schema.description' must be a string");
  if (strict && !cJSON_IsBool(strict))
    return BAD(e, "response_format", "'response_format.json_schema.strict' must be a boolean");
  if (schema && !cJSON_IsObject(schema) && !cJSON_IsBool(schema))
    return BAD(e, "response_format", "'response_format.json_schema.schema' must be a JSON Schema object");
  if (!schema) return 0; // no schema: any JSON object, as json_object
  r->response_format = RTR_FORMAT_JSON_SCHEMA;
  if (!(r->json_schema = mdl_json_print(schema))) return OOM(e); // its numbers as the client wrote them
  mdl_grammar *g = NULL;
  char err[400];
  int rc = mdl_grammar_from_json_schema(r->json_schema, strlen(r->json_schema), &g, err, sizeof err);
  mdl_grammar_unref(g);
  if (rc == MDL_GRAMMAR_UNSUPPORTED)
    return UNSUP(e, "response_format", "'response_format.json_schema.schema': %s", err);
  if (rc) return INVAL(e, "response_format", "'response_format.json_schema.schema': %s", err);
  return 0;
}

// The chat fields accepted as no-ops (their reason is in docs/openai.md), the tool fields and response_format.
int rtr_oai_check_chat_extras(const cJSON *root, rtr_request *r, rtr_error *e) {
  int store = 0;
  if (rtr_oai_check_str(root, "user", e) < 0 || rtr_oai_check_str(root, "prompt_cache_key", e) < 0 ||
      rtr_oai_check_str(root, "safety_identifier", e) < 0)
    return -1;
  if (rtr_oai_get_bool(root, "store", &store, e) < 0) return -1;
  if (store) return UNSUP(e, "store", "'store': true is not supported: this server keeps no completions");
  const cJSON *md = rtr_oai_field(root, "metadata");
  if (md) {
    if (!cJSON_IsObject(md)) return BAD(e, "metadata", "'metadata' must be an object of strings");
    for (const cJSON *k = md->child; k; k = k->next)
      if (!cJSON_IsString(k)) return BAD(e, "metadata", "'metadata' must be an object of strings");
  }
  const cJSON *tier = rtr_oai_field(root, "service_tier");
  if (tier && !cJSON_IsString(tier)) return BAD(e, "service_tier", "'service_tier' must be a string");
  if (tier && strcmp(tier->valuestring, "auto") && strcmp(tier->valuestring, "default"))
    return INVAL(e, "service_tier", "'service_tier' must be \"auto\" or \"default\" (this server has one tier)");
  const cJSON *mod = rtr_oai_field(root, "modalities");
  if (mod) {
    if (!cJSON_IsArray(mod)) return BAD(e, "modalities", "'modalities' must be an array of strings");
    for (const cJSON *m = mod->child; m; m = m->next)
      if (!cJSON_IsString(m) || strcmp(m->valuestring, "text"))
        return UNSUP(e, "modalities", "'modalities' other than [\"text\"] is not supported");
  }
  if (rtr_oai_parse_tools(root, r, e) < 0 || check_functions(root, e) < 0 || parse_response_format(root, r, e) < 0)
    return -1;
  if (r->tool_choice != RTR_TOOLS_OFF && r->response_format != RTR_FORMAT_TEXT) // one grammar per choice
    return UNSUP(e, "response_format", "'response_format' other than text together with tools (tool_choice other "
                 "than \"none\") is not supported");
  return 0;
}


// ---- tool calls in the output ----

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// tag without its surrounding whitespace: *n bytes at the returned pointer.
static const char *trim_tag(const char *tag, size_t *n) {
  size_t len = strlen(tag);
  while (len && is_ws(*tag)) tag++, len--;
  while (len && is_ws(tag[len - 1])) len--;
  *n = len;
  return tag;
}

size_t rtr_tool_open_prefix(const char *text, size_t n, const char *open) {
  size_t tn;
  const char *tag = trim_tag(open, &tn);
  for (size_t k = tn - 1 < n ? tn - 1 : n; k > 0; k--) // the longest proper prefix of the tag ending text
    if (!memcmp(text + n - k, tag, k)) return k;
  return 0;
}

size_t rtr_tool_hold(const mdl_chat_tool_style *st, const char *held, size_t n, int began, int *in_call) {
  if (*in_call || !n) return 0;
  if (st->format == MDL_TOOL_FMT_LLAMA3 && !began) { // a reply that opens with '{' may be the call itself
    size_t w = 0;
    while (w < n && is_ws(held[w])) w++;
    if (w == n) return 0;
    if (held[w] == '{') {
      *in_call = 1;
      return 0;
    }
  }
  size_t mn = strlen(st->marker), send;
  const char *at = memmem(held, n, st->marker, mn);
  if (at) {
    send = (size_t)(at - held);
    *in_call = 1;
  } else {
    send = n - rtr_tool_open_prefix(held, n, st->marker);
  }
  while (send && is_ws(held[send - 1])) send--; // whitespace before a call is not content: it waits with the call
  return send;
}

// An id for a call the model wrote none for: "call_" and 24 random letters and digits (OpenAI's ids look so), or
// for Mistral 9 letters and digits (its template refuses any other id when the call comes back in the history).
static void call_id(char out[32], int mistral) {
  static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char b[24] = {0};
  FILE *f = fopen("/dev/urandom", "rb");
  if (f) {
    if (fread(b, 1, sizeof b, f) != sizeof b) memset(b, 0, sizeof b);
    fclose(f);
  }
  int pre = mistral ? 0 : 5, n = mistral ? 9 : 24;
  memcpy(out, "call_", (size_t)pre);
  for (int i = 0; i < n; i++) out[pre + i] = al[b[i] % (sizeof al - 1)];
  out[pre + n] = 0;
}

// One call object the model wrote (v) as OpenAI's {"id", "type", "function": {"name", "arguments": JSON text}},
// appended to found: 1, or 0 when v is not a call of a declared tool ({"name": string, key: object or string}; Llama
// 3's "parameters" or "arguments"), -1 when out of memory.
static int add_call(const cJSON *v, const mdl_chat_tool_style *st, const cJSON *declared, cJSON *found) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(v, st->args_key);
  if (!args && st->format == MDL_TOOL_FMT_LLAMA3) args = cJSON_GetObjectItemCaseSensitive(v, "arguments");
  const cJSON *given = cJSON_GetObjectItemCaseSensitive(v, "id");
  if (!cJSON_IsObject(v) || !cJSON_IsString(name) || !(cJSON_IsObject(args) || cJSON_IsString(args))) return 0;
  const cJSON *d = NULL;
  cJSON_ArrayForEach(d, declared) if (!strcmp(cJSON_GetObjectItemCaseSensitive(d, "name")->valuestring,
                                              name->valuestring)) break;
  if (!d) return 0;
  char id[32];
  if (cJSON_IsString(given) && given->valuestring[0] && strlen(given->valuestring) < sizeof id)
    snprintf(id, sizeof id, "%s", given->valuestring); // Mistral writes its own
  else
    call_id(id, st->format == MDL_TOOL_FMT_MISTRAL);
  char *a = cJSON_IsString(args) ? strdup(args->valuestring) : cJSON_PrintUnformatted(args);
  cJSON *o = cJSON_CreateObject(), *f = NULL;
  int ok = a && o && cJSON_AddStringToObject(o, "id", id) && cJSON_AddStringToObject(o, "type", "function") &&
           (f = cJSON_AddObjectToObject(o, "function")) && cJSON_AddStringToObject(f, "name", name->valuestring) &&
           cJSON_AddStringToObject(f, "arguments", a);
  free(a);
  if (!ok) {
    cJSON_Delete(o);
    return -1;
  }
  cJSON_AddItemToArray(found, o);
  return 1;
}

// Hermes/Qwen: blocks of open JSON close from p on. The number of calls (0: not a call turn), -1 out of memory.
static int parse_tagged(const mdl_chat_tool_style *st, const char *p, const char *end, const cJSON *declared,
                        cJSON *found) {
  size_t on, cn;
  const char *otag = trim_tag(st->call_open, &on), *ctag = trim_tag(st->call_close, &cn);
  int n = 0;
  while (p < end) {
    while (p < end && is_ws(*p)) p++;
    if (p == end) break;
    if ((size_t)(end - p) < on || memcmp(p, otag, on)) return 0; // text after a call: not a call turn known here
    p += on;
    // the call is one JSON value, then the close tag: parsed as JSON first, because a string inside it may hold the
    // close tag's text (the model wrote "Europe_2017_AM}}}</tool_call> " into an argument)
    const char *c = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &c, 0);
    if (v) {
      while (c < end && is_ws(*c)) c++;
      if ((size_t)(end - c) < cn || memcmp(c, ctag, cn)) cJSON_Delete(v), v = NULL, c = NULL;
    }
    if (!v && !memmem(p, (size_t)(end - p), ctag, cn)) return n; // unclosed: cut by max_tokens; the calls before stand
    int k = v ? add_call(v, st, declared, found) : 0;
    cJSON_Delete(v);
    if (k <= 0) return k;
    n++;
    p = c + cn;
  }
  return n;
}

// Mistral: one or more JSON arrays of calls, each after [TOOL_CALLS] (the first's marker is at p).
static int parse_mistral(const mdl_chat_tool_style *st, const char *p, const char *end, const cJSON *declared,
                         cJSON *found) {
  size_t mn = strlen(st->marker);
  int n = 0;
  while (p < end) {
    while (p < end && is_ws(*p)) p++;
    if (p == end) break;
    if ((size_t)(end - p) >= mn && !memcmp(p, st->marker, mn)) p += mn;
    else if (!n || *p != '[') return 0; // text after the calls
    while (p < end && is_ws(*p)) p++;
    const char *c = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &c, 0);
    if (!v) return p < end && *p == '[' ? n : 0; // an array cut by max_tokens: the calls before stand
    if (!cJSON_IsArray(v) || !v->child) {
      cJSON_Delete(v);
      return 0;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
      int k = add_call(it, st, declared, found);
      if (k <= 0) {
        cJSON_Delete(v);
        return k;
      }
      n++;
    }
    cJSON_Delete(v);
    p = c;
  }
  return n;
}

// Llama 3: the call is the whole rest of the reply, one JSON object (after <|python_tag|> or at the reply's start).
static int parse_llama3(const mdl_chat_tool_style *st, const char *p, const char *end, const cJSON *declared,
                        cJSON *found) {
  const char *c = NULL;
  cJSON *v = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &c, 0);
  if (!v) return 0;
  while (c < end && is_ws(*c)) c++;
  int k = c == end ? add_call(v, st, declared, found) : 0;
  cJSON_Delete(v);
  return k;
}

int rtr_parse_tool_calls(const rtr_request *q, const mdl_chat_tool_style *st, const char *text, size_t len,
                         cJSON *calls, size_t *content_len) {
  *content_len = len;
  if (q->tool_choice == RTR_TOOLS_OFF || !q->call_tools) return 0;
  const char *end = text + len, *first = memmem(text, len, st->marker, strlen(st->marker)), *body = NULL;
  if (first) body = first + strlen(st->marker);
  if (st->format == MDL_TOOL_FMT_LLAMA3) {
    const char *w = text;
    while (w < end && is_ws(*w)) w++;
    if (w < end && *w == '{') first = body = w; // a reply that is a JSON object
  }
  if (!first) return 0;
  cJSON *declared = cJSON_Parse(q->call_tools), *found = cJSON_CreateArray();
  int n = !declared || !found ? -1
          : st->format == MDL_TOOL_FMT_HERMES  ? parse_tagged(st, first, end, declared, found)
          : st->format == MDL_TOOL_FMT_MISTRAL ? parse_mistral(st, first, end, declared, found)
                                               : parse_llama3(st, body, end, declared, found);
  cJSON_Delete(declared);
  if (n <= 0) {
    cJSON_Delete(found);
    return n < 0 ? -1 : 0;
  }
  while (found->child) cJSON_AddItemToArray(calls, cJSON_DetachItemViaPointer(found, found->child));
  cJSON_Delete(found);
  size_t cl = (size_t)(first - text);
  while (cl && is_ws(text[cl - 1])) cl--;
  *content_len = cl;
  return n;
}
