// models/chat.c: ChatML rendering, with the default system prompt read from the model's own chat template, and tool
// calling's prompt (a style table per template family).
#include "models/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "util/buf.h"
#include "util/err.h"

#define SMOLLM2_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

static const char *find_in(const char *p, size_t n, const char *needle) {
  return memmem(p, n, needle, strlen(needle));
}

// Default system prompt of a ChatML template: the text of a literal "<|im_start|>system\n...<|im_end|>" block that the
// template emits when messages[0] is not a system message. *def is NULL when the template has none.
static int template_default_system(const mdl_gguf *g, char **def, char *err, size_t errlen) {
  *def = NULL;
  mdl_str tpl;
  if (!g || mdl_gguf_get_str(g, "tokenizer.chat_template", &tpl) != 0) {
    *def = strdup(SMOLLM2_SYSTEM); // no template: SmolLM2's is assumed
    if (!*def) goto oom;
    return 0;
  }
  size_t n = (size_t)tpl.n;
  if (!find_in(tpl.p, n, "<|im_start|>") || !find_in(tpl.p, n, "<|im_end|>")) {
    utl_seterr(err, errlen, "the model's chat template is not ChatML (only ChatML is supported)");
    return -1;
  }
  if (!find_in(tpl.p, n, "!= 'system'") && !find_in(tpl.p, n, "!= \"system\"")) return 0;
  const char *open = "<|im_start|>system";
  const char *s = find_in(tpl.p, n, open);
  if (!s) return 0;
  s += strlen(open);
  size_t rest = n - (size_t)(s - tpl.p);
  if (rest >= 1 && *s == '\n') s++, rest--;
  else if (rest >= 2 && s[0] == '\\' && s[1] == 'n') s += 2, rest -= 2;
  else return 0;
  const char *e = find_in(s, rest, "<|im_end|>");
  if (!e) return 0;
  size_t len = (size_t)(e - s);
  if (memchr(s, '\'', len) || memchr(s, '"', len) || find_in(s, len, "{{") || find_in(s, len, "{%")) return 0; // not literal
  *def = malloc(len + 1);
  if (!*def) goto oom;
  // unescape \n as jinja would in a string literal
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '\\' && i + 1 < len && s[i + 1] == 'n') {
      (*def)[o++] = '\n';
      i++;
    } else {
      (*def)[o++] = s[i];
    }
  }
  (*def)[o] = 0;
  return 0;
oom:
  utl_seterr(err, errlen, "out of memory");
  return -1;
}

int mdl_chat_default_system(const mdl_gguf *g, char **out, char *err, size_t errlen) {
  return template_default_system(g, out, err, errlen);
}

static void block(utl_buf *b, const char *role, const char *content) {
  utl_buf_printf(b, "<|im_start|>%s\n%s<|im_end|>\n", role, content);
}

// ---- tools: one style table per template family ----

// Hermes/Qwen's convention, the fallback for ChatML templates with none of their own (SmolLM2's).
static const mdl_chat_tool_style HERMES = {
    .name = "hermes",
    .call_open = "<tool_call>\n",
    .call_close = "\n</tool_call>",
    .call_sep = "\n",
    .result_role = "user",
    .result_open = "<tool_response>\n",
    .result_close = "\n</tool_response>",
    .sys_head = "# Tools\n\nYou may call one or more functions to help with the user's request. The functions you can "
                "call are described by their JSON signatures inside <tools></tools> XML tags:\n<tools>",
    .sys_tail = "\n</tools>\n\nTo call a function, write a JSON object with its name and arguments inside "
                "<tool_call></tool_call> XML tags, one call per tag:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call>",
};

const mdl_chat_tool_style *mdl_chat_tool_style_of(const mdl_gguf *g, char *err, size_t errlen) {
  mdl_str tpl;
  if (!g || mdl_gguf_get_str(g, "tokenizer.chat_template", &tpl) != 0) return &HERMES; // SmolLM2's is assumed
  if (!find_in(tpl.p, (size_t)tpl.n, "<|im_start|>") || !find_in(tpl.p, (size_t)tpl.n, "<|im_end|>")) {
    utl_seterr(err, errlen, "the model's chat template is not ChatML (only ChatML is supported)");
    return NULL;
  }
  return &HERMES; // a ChatML template: its own <tool_call> convention (Qwen's) is Hermes's too
}

// The system block's tool section: head, one line per tool (its JSON as given), tail.
static int tools_section(utl_buf *b, const mdl_chat_tool_style *st, const char *tools, char *err, size_t errlen) {
  cJSON *t = cJSON_Parse(tools);
  if (!cJSON_IsArray(t)) {
    cJSON_Delete(t);
    utl_seterr(err, errlen, "tools must be a JSON array");
    return -1;
  }
  utl_buf_adds(b, st->sys_head);
  const cJSON *it;
  cJSON_ArrayForEach(it, t) {
    char *j = cJSON_PrintUnformatted(it);
    utl_buf_adds(b, "\n");
    if (j) utl_buf_adds(b, j);
    else b->oom = 1;
    free(j);
  }
  utl_buf_adds(b, st->sys_tail);
  cJSON_Delete(t);
  return 0;
}

// One call as the model writes it: {"name": NAME, "arguments": ARGS}, the form the call grammar generates
// (models/json_schema.c mdl_grammar_from_tool_calls).
static int call_text(utl_buf *b, const cJSON *call, char *err, size_t errlen) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
  if (!cJSON_IsString(name) || !args) {
    utl_seterr(err, errlen, "a tool call needs a string name and arguments");
    return -1;
  }
  char *n = cJSON_PrintUnformatted(name), *a = cJSON_PrintUnformatted(args);
  if (n && a) utl_buf_printf(b, "{\"name\": %s, \"arguments\": %s}", n, a);
  else b->oom = 1;
  free(n);
  free(a);
  return 0;
}

static int check_msgs(const mdl_chat_msg *msgs, size_t n, int with_tools, char *err, size_t errlen) {
  if (n > 0 && !msgs) {
    utl_seterr(err, errlen, "no messages");
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    const char *r = msgs[i].role;
    if (!r) {
      utl_seterr(err, errlen, "message %zu has no role", i);
      return -1;
    }
    if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 &&
        (!with_tools || strcmp(r, "tool") != 0)) {
      utl_seterr(err, errlen, "message %zu has role '%.40s' (system, user and assistant%s are accepted)", i, r,
                 with_tools ? ", tool" : "");
      return -1;
    }
    if (!msgs[i].content) {
      utl_seterr(err, errlen, "message %zu has no content", i);
      return -1;
    }
  }
  return 0;
}

static int apply(const mdl_gguf *g, const mdl_chat_msg *msgs, const char *const *calls, size_t n, const char *tools,
                 int with_tools, int add_generation_prompt, char **out, char *err, size_t errlen) {
  *out = NULL;
  if (check_msgs(msgs, n, with_tools, err, errlen) != 0) return -1;
  const mdl_chat_tool_style *st = NULL;
  if (with_tools && !(st = mdl_chat_tool_style_of(g, err, errlen))) return -1;
  char *def = NULL;
  if (template_default_system(g, &def, err, errlen) != 0) return -1;
  utl_buf b = {0};
  int rc = -1;
  int first_sys = n > 0 && !strcmp(msgs[0].role, "system");
  if (tools) { // the system block with the tool section
    utl_buf_adds(&b, "<|im_start|>system\n");
    const char *sys = first_sys ? msgs[0].content : def;
    if (sys && sys[0]) utl_buf_printf(&b, "%s\n\n", sys);
    if (tools_section(&b, st, tools, err, errlen) != 0) goto done;
    utl_buf_adds(&b, "<|im_end|>\n");
  } else if (n > 0 && def && !first_sys) {
    block(&b, "system", def);
  }
  for (size_t i = (tools && first_sys) ? 1 : 0; i < n; i++) {
    const char *role = msgs[i].role;
    if (!strcmp(role, "tool")) { // consecutive results share one turn
      utl_buf_printf(&b, "<|im_start|>%s\n", st->result_role);
      for (size_t k = i; k < n && !strcmp(msgs[k].role, "tool"); i = k++)
        utl_buf_printf(&b, "%s%s%s%s", k > i ? "\n" : "", st->result_open, msgs[k].content, st->result_close);
      utl_buf_adds(&b, "<|im_end|>\n");
      continue;
    }
    const char *ctext = calls ? calls[i] : NULL;
    if (!ctext || strcmp(role, "assistant") != 0) {
      block(&b, role, msgs[i].content);
      continue;
    }
    cJSON *cl = cJSON_Parse(ctext);
    if (!cJSON_IsArray(cl)) {
      cJSON_Delete(cl);
      utl_seterr(err, errlen, "message %zu: tool_calls must be a JSON array", i);
      goto done;
    }
    utl_buf_printf(&b, "<|im_start|>assistant\n%s", msgs[i].content);
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cl) {
      if (k++ || msgs[i].content[0]) utl_buf_adds(&b, st->call_sep);
      utl_buf_adds(&b, st->call_open);
      if (call_text(&b, c, err, errlen) != 0) {
        cJSON_Delete(cl);
        goto done;
      }
      utl_buf_adds(&b, st->call_close);
    }
    cJSON_Delete(cl);
    utl_buf_adds(&b, "<|im_end|>\n");
  }
  if (add_generation_prompt) utl_buf_adds(&b, "<|im_start|>assistant\n");
  if (!(*out = utl_buf_take(&b))) {
    utl_seterr(err, errlen, "out of memory");
    goto done;
  }
  rc = 0;
done:
  utl_buf_free(&b);
  free(def);
  return rc;
}

int mdl_chat_apply(const mdl_gguf *g, const mdl_chat_msg *msgs, size_t n, int add_generation_prompt, char **out,
                   char *err, size_t errlen) {
  return apply(g, msgs, NULL, n, NULL, 0, add_generation_prompt, out, err, errlen);
}

int mdl_chat_apply_tools(const mdl_gguf *g, const mdl_chat_msg *msgs, const char *const *tool_calls, size_t n,
                         const char *tools, int add_generation_prompt, char **out, char *err, size_t errlen) {
  return apply(g, msgs, tool_calls, n, tools, 1, add_generation_prompt, out, err, errlen);
}
