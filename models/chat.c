// models/chat.c: chat rendering from a table of template families (recognised by markers in the GGUF's Jinja
// template), ChatML's default system prompt read from the model's own template, and tool calling's prompt.
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

// Default system prompt of a ChatML template (tpl: its text, NULL: none, SmolLM2's is assumed): the text of the first
// literal "<|im_start|>system\n...<|im_end|>" block, which the template emits when messages[0] is not a system message
// (it tests messages[0]'s role: SmolLM2's with != 'system', Qwen 2.5's with == 'system' and an else branch). *def is
// NULL when the template has none.
static int text_default_system(const mdl_str *tpl_or_null, char **def, char *err, size_t errlen) {
  *def = NULL;
  if (!tpl_or_null) {
    *def = strdup(SMOLLM2_SYSTEM); // no template: SmolLM2's is assumed
    if (!*def) goto oom;
    return 0;
  }
  mdl_str tpl = *tpl_or_null;
  size_t n = (size_t)tpl.n;
  if (!find_in(tpl.p, n, "<|im_start|>") || !find_in(tpl.p, n, "<|im_end|>")) return 0; // (chatml by override)
  if (!find_in(tpl.p, n, "!= 'system'") && !find_in(tpl.p, n, "!= \"system\"") && !find_in(tpl.p, n, "== 'system'") &&
      !find_in(tpl.p, n, "== \"system\""))
    return 0;
  const char *open = "<|im_start|>system", *s = NULL, *e = NULL;
  size_t len = 0;
  for (const char *at = tpl.p; (at = find_in(at, n - (size_t)(at - tpl.p), open)); at += strlen(open)) {
    s = at + strlen(open);
    size_t rest = n - (size_t)(s - tpl.p);
    if (rest >= 1 && *s == '\n') s++, rest--;
    else if (rest >= 2 && s[0] == '\\' && s[1] == 'n') s += 2, rest -= 2;
    else continue;
    if (!(e = find_in(s, rest, "<|im_end|>"))) return 0;
    len = (size_t)(e - s);
    if (!memchr(s, '\'', len) && !memchr(s, '"', len) && !find_in(s, len, "{{") && !find_in(s, len, "{%")) break;
    e = NULL; // not a literal: a block the template fills in
  }
  if (!e) return 0;
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

static int template_default_system(const mdl_gguf *g, char **def, char *err, size_t errlen) {
  mdl_str tpl;
  int has = g && mdl_gguf_get_str(g, "tokenizer.chat_template", &tpl) == 0;
  return text_default_system(has ? &tpl : NULL, def, err, errlen);
}

int mdl_chat_default_system(const mdl_gguf *g, char **out, char *err, size_t errlen) {
  const mdl_chat_template *t;
  if (mdl_chat_template_of(g, NULL, &t, err, errlen) != 0) return -1;
  if (t && strcmp(t->name, "chatml") != 0) {
    *out = NULL; // the other families' templates are not read for one
    return 0;
  }
  return template_default_system(g, out, err, errlen);
}

// ---- the families ----

// Each row renders as llama.cpp's llama_chat_apply_template does for its built-in template of the same name
// (src/llama-chat.cpp: chatml, llama3, gemma, mistral-v3, phi3).
static const mdl_chat_template FAMILIES[] = {
    {.name = "chatml",
     .sys_open = "<|im_start|>system\n", .sys_close = "<|im_end|>\n",
     .user_open = "<|im_start|>user\n", .user_close = "<|im_end|>\n",
     .asst_open = "<|im_start|>assistant\n", .asst_close = "<|im_end|>\n",
     .gen_prompt = "<|im_start|>assistant\n", .eot = "<|im_end|>", .has_tools = 1},
    {.name = "llama3",
     .sys_open = "<|start_header_id|>system<|end_header_id|>\n\n", .sys_close = "<|eot_id|>",
     .user_open = "<|start_header_id|>user<|end_header_id|>\n\n", .user_close = "<|eot_id|>",
     .asst_open = "<|start_header_id|>assistant<|end_header_id|>\n\n", .asst_close = "<|eot_id|>",
     .gen_prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n", .eot = "<|eot_id|>", .trim = 1,
     .trim_asst = 1},
    // Gemma has no system turn: its templates put the system text in front of the first user message
    {.name = "gemma", .fold_sep = "\n\n",
     .user_open = "<start_of_turn>user\n", .user_close = "<end_of_turn>\n",
     .asst_open = "<start_of_turn>model\n", .asst_close = "<end_of_turn>\n",
     .gen_prompt = "<start_of_turn>model\n", .eot = "<end_of_turn>", .trim = 1, .trim_asst = 1},
    // Mistral's [INST] templates (v3 spacing) put the system text in front of a user message inside its [INST]
    {.name = "mistral", .fold_sep = "\n\n",
     .user_open = "[INST] ", .user_close = "[/INST]",
     .asst_open = " ", .asst_close = "</s>",
     .gen_prompt = "", .eot = "</s>", .trim_asst = 1},
    {.name = "phi3",
     .sys_open = "<|system|>\n", .sys_close = "<|end|>\n",
     .user_open = "<|user|>\n", .user_close = "<|end|>\n",
     .asst_open = "<|assistant|>\n", .asst_close = "<|end|>\n",
     .gen_prompt = "<|assistant|>\n", .eot = "<|end|>"},
};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

// How a template is recognised, in llama.cpp's order of checks: every marker of `all` present and none of `none`
// (variants this table does not render: they are refused, not rendered wrong).
static const struct {
  const char *family;
  const char *all[3];
  const char *none[3];
} MARKERS[] = {
    {"chatml", {"<|im_start|>", "<|im_end|>"}, {"<|im_sep|>", "<end_of_utterance>"}}, // Phi-4, SmolVLM: other layouts
    {"mistral", {"[INST]", "[/INST]"}, {"[SYSTEM_PROMPT]", "<<SYS>>"}}, // Mistral v7, Llama 2: system turns of their own
    {"phi3", {"<|user|>", "<|assistant|>", "<|end|>"}, {0}},
    {"gemma", {"<start_of_turn>", "<end_of_turn>"}, {0}},
    {"llama3", {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}, {0}},
};

const mdl_chat_template *mdl_chat_template_named(const char *name) {
  for (size_t i = 0; name && i < N_FAMILIES; i++)
    if (!strcmp(FAMILIES[i].name, name)) return &FAMILIES[i];
  return NULL;
}

const char *mdl_chat_template_names(void) { return "chatml, llama3, gemma, mistral, phi3"; }

// The family whose markers the template text (n bytes) has, NULL when none (or a variant the table does not render).
static const mdl_chat_template *by_markers(const char *p, size_t n) {
  for (size_t i = 0; i < sizeof MARKERS / sizeof MARKERS[0]; i++) {
    int all = 1;
    for (int k = 0; k < 3 && MARKERS[i].all[k]; k++) all = all && find_in(p, n, MARKERS[i].all[k]);
    if (!all) continue;
    for (int k = 0; k < 3 && MARKERS[i].none[k]; k++)
      if (find_in(p, n, MARKERS[i].none[k])) return NULL; // a variant of this family that the table does not render
    return mdl_chat_template_named(MARKERS[i].family);
  }
  return NULL;
}

int mdl_chat_template_of(const mdl_gguf *g, const char *override, const mdl_chat_template **out, char *err,
                         size_t errlen) {
  *out = NULL;
  if (override && override[0]) {
    if (!(*out = mdl_chat_template_named(override))) {
      utl_seterr(err, errlen, "chat_template '%.40s' is not a template family known here (%s)", override,
                 mdl_chat_template_names());
      return -1;
    }
    return 0;
  }
  mdl_str tpl;
  if (!g || mdl_gguf_get_str(g, "tokenizer.chat_template", &tpl) != 0) return 0;
  if ((*out = by_markers(tpl.p, (size_t)tpl.n))) return 0;
  utl_seterr(err, errlen,
             "the model's chat template (tokenizer.chat_template) is of no family known here (%s); if it is one of "
             "them, name it with the config's \"chat_template\"",
             mdl_chat_template_names());
  return -1;
}

// ---- tools: one style table per template family ----

// Hermes/Qwen's convention, the fallback for ChatML templates with none of their own (SmolLM2's).
static const mdl_chat_tool_style HERMES = {
    .name = "hermes",
    .format = MDL_TOOL_FMT_HERMES,
    .marker = "<tool_call>",
    .args_key = "arguments",
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

// The formats only a Jinja template renders the prompt of (its own tool list and results): what the model writes and
// what a forced call's grammar generates. Llama 3's is one call, the whole reply: its sep is never used.
static const mdl_chat_tool_style LLAMA3_JSON = {
    .name = "llama3_json", .format = MDL_TOOL_FMT_LLAMA3, .marker = "<|python_tag|>", .args_key = "parameters",
    .call_open = "", .call_close = "", .call_sep = ""};
// Mistral's calls are one JSON array after [TOOL_CALLS]; a forced turn of several writes one array per call, which
// the parser reads as well.
static const mdl_chat_tool_style MISTRAL = {
    .name = "mistral", .format = MDL_TOOL_FMT_MISTRAL, .marker = "[TOOL_CALLS]", .args_key = "arguments",
    .call_open = "[TOOL_CALLS][", .call_close = "]", .call_sep = ""};

const mdl_chat_tool_style *mdl_chat_tool_style_detect(const char *tpl, size_t n) {
  if (!tpl) return NULL;
  // Mistral Small 3.2's and Devstral's [TOOL_CALLS]name[ARGS]{...}, Qwen3 Coder's <tool_call><function=...> XML:
  // other formats with the same markers, not read here
  if (find_in(tpl, n, "[TOOL_CALLS]")) return find_in(tpl, n, "[ARGS]") ? NULL : &MISTRAL;
  if (find_in(tpl, n, "<tool_call>")) return find_in(tpl, n, "<function=") ? NULL : &HERMES;
  if (find_in(tpl, n, "<|start_header_id|>") &&
      (find_in(tpl, n, "\"parameters\"") || find_in(tpl, n, "<|python_tag|>")))
    return &LLAMA3_JSON;
  return NULL;
}

const mdl_chat_tool_style *mdl_chat_template_tools(const mdl_chat_template *t, char *err, size_t errlen) {
  if (t && t->has_tools) return &HERMES; // a ChatML template: its own <tool_call> convention (Qwen's) is Hermes's too
  utl_seterr(err, errlen, "tool calling is not supported with the %s chat template (only with ChatML's, in the Hermes "
             "convention)", t ? t->name : "model's");
  return NULL;
}

const mdl_chat_tool_style *mdl_chat_tool_style_of(const mdl_gguf *g, char *err, size_t errlen) {
  const mdl_chat_template *t;
  if (mdl_chat_template_of(g, NULL, &t, err, errlen) != 0) return NULL;
  return mdl_chat_template_tools(t ? t : &FAMILIES[0], err, errlen); // no template: SmolLM2's (ChatML) is assumed
}

// Where the request's own text lies in the rendering (message contents, tool declarations, call arguments): the
// encoder matches no control token there, so a user cannot forge the template's markup (mdl_tok_encode_guarded).
typedef struct spans {
  size_t *v;     // (n, 2) offset, length; in order, not overlapping
  size_t n, cap;
  int oom;
} spans;

// Records b's bytes from `from` to its end as the request's text (sp may be NULL: nothing recorded).
static void mark(spans *sp, const utl_buf *b, size_t from) {
  if (!sp || b->n <= from) return;
  if (sp->n && sp->v[2 * (sp->n - 1)] + sp->v[2 * (sp->n - 1) + 1] == from) { // adjacent: one span
    sp->v[2 * (sp->n - 1) + 1] += b->n - from;
    return;
  }
  if (sp->n == sp->cap) {
    size_t c = sp->cap ? sp->cap * 2 : 16;
    size_t *nv = realloc(sp->v, c * 2 * sizeof *nv);
    if (!nv) {
      sp->oom = 1;
      return;
    }
    sp->v = nv;
    sp->cap = c;
  }
  sp->v[2 * sp->n] = from;
  sp->v[2 * sp->n + 1] = b->n - from;
  sp->n++;
}

// The system block's tool section: head, one line per tool (its JSON as given), tail.
static int tools_section(utl_buf *b, spans *sp, const mdl_chat_tool_style *st, const char *tools, char *err,
                         size_t errlen) {
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
    size_t from = b->n;
    if (j) utl_buf_adds(b, j);
    else b->oom = 1;
    mark(sp, b, from);
    free(j);
  }
  utl_buf_adds(b, st->sys_tail);
  cJSON_Delete(t);
  return 0;
}

// One call as the model writes it: {"name": NAME, "arguments": ARGS}, the form the call grammar generates
// (models/json_schema.c mdl_grammar_from_tool_calls).
static int call_text(utl_buf *b, spans *sp, const cJSON *call, char *err, size_t errlen) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
  if (!cJSON_IsString(name) || !args) {
    utl_seterr(err, errlen, "a tool call needs a string name and arguments");
    return -1;
  }
  char *n = cJSON_PrintUnformatted(name), *a = cJSON_PrintUnformatted(args);
  size_t from = b->n;
  if (n && a) utl_buf_printf(b, "{\"name\": %s, \"arguments\": %s}", n, a);
  else b->oom = 1;
  mark(sp, b, from);
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

// Appends s, trimmed of ASCII whitespace on both sides when trim (llama.cpp's trim(); Jinja's | trim); it is the
// request's text (recorded in sp).
static void put(utl_buf *b, spans *sp, const char *s, int trim) {
  size_t n = strlen(s), from = b->n;
  if (trim) {
    while (n && strchr(" \t\n\r\v\f", *s)) s++, n--;
    while (n && strchr(" \t\n\r\v\f", s[n - 1])) n--;
  }
  utl_buf_add(b, s, n);
  mark(sp, b, from);
}

static const char *role_open(const mdl_chat_template *t, const char *role) {
  return !strcmp(role, "system") ? t->sys_open : !strcmp(role, "user") ? t->user_open : t->asst_open;
}

static const char *role_close(const mdl_chat_template *t, const char *role) {
  return !strcmp(role, "system") ? t->sys_close : !strcmp(role, "user") ? t->user_close : t->asst_close;
}

int mdl_chat_render(const mdl_chat_template *t, const mdl_gguf *g, const mdl_chat_msg *msgs,
                    const char *const *calls, size_t n, const char *tools, int with_tools,
                    int add_generation_prompt, char **out, size_t **user_spans, size_t *n_user_spans, char *err,
                    size_t errlen) {
  mdl_str tpl;
  int has = g && mdl_gguf_get_str(g, "tokenizer.chat_template", &tpl) == 0;
  return mdl_chat_render_text(t, has ? tpl.p : NULL, has ? (size_t)tpl.n : 0, msgs, calls, n, tools, with_tools,
                              add_generation_prompt, out, user_spans, n_user_spans, err, errlen);
}

int mdl_chat_render_text(const mdl_chat_template *t, const char *tpl_text, size_t tpl_len, const mdl_chat_msg *msgs,
                         const char *const *calls, size_t n, const char *tools, int with_tools,
                         int add_generation_prompt, char **out, size_t **user_spans, size_t *n_user_spans, char *err,
                         size_t errlen) {
  *out = NULL;
  if (user_spans) *user_spans = NULL;
  if (n_user_spans) *n_user_spans = 0;
  spans rec = {0}, *sp = user_spans && n_user_spans ? &rec : NULL;
  if (!t) {
    utl_seterr(err, errlen, "no chat template");
    return -1;
  }
  if (check_msgs(msgs, n, with_tools, err, errlen) != 0) return -1;
  const mdl_chat_tool_style *st = NULL;
  if (with_tools && !(st = mdl_chat_template_tools(t, err, errlen))) return -1;
  char *def = NULL; // ChatML's default system prompt, from the model's own template
  mdl_str tpl = {.p = tpl_text, .n = (uint64_t)tpl_len};
  if (!strcmp(t->name, "chatml") && text_default_system(tpl_text ? &tpl : NULL, &def, err, errlen) != 0) return -1;
  utl_buf b = {0}, fold = {0}; // fold: system text waiting for the next user message (families without a system turn)
  int rc = -1;
  int first_sys = n > 0 && !strcmp(msgs[0].role, "system");
  if (tools) { // the system block with the tool section (has_tools families have a system turn)
    utl_buf_adds(&b, t->sys_open);
    const char *sys = first_sys ? msgs[0].content : def;
    if (sys && sys[0]) {
      size_t from = b.n;
      utl_buf_adds(&b, sys);
      if (first_sys) mark(sp, &b, from);
      utl_buf_adds(&b, "\n\n");
    }
    if (tools_section(&b, sp, st, tools, err, errlen) != 0) goto done;
    utl_buf_adds(&b, t->sys_close);
  } else if (n > 0 && def && !first_sys) {
    utl_buf_printf(&b, "%s%s%s", t->sys_open, def, t->sys_close);
  }
  for (size_t i = (tools && first_sys) ? 1 : 0; i < n; i++) {
    const char *role = msgs[i].role;
    if (!strcmp(role, "tool")) { // consecutive results share one turn
      utl_buf_adds(&b, role_open(t, st->result_role));
      for (size_t k = i; k < n && !strcmp(msgs[k].role, "tool"); i = k++) {
        utl_buf_printf(&b, "%s%s", k > i ? "\n" : "", st->result_open);
        put(&b, sp, msgs[k].content, 0);
        utl_buf_adds(&b, st->result_close);
      }
      utl_buf_adds(&b, role_close(t, st->result_role));
      continue;
    }
    if (!strcmp(role, "system") && !t->sys_open) { // folded into the next user message
      if (fold.n) utl_buf_adds(&fold, t->fold_sep);
      put(&fold, NULL, msgs[i].content, t->trim);
      continue;
    }
    int asst = !strcmp(role, "assistant");
    utl_buf_adds(&b, role_open(t, role));
    if (!asst && !strcmp(role, "user") && fold.n) {
      size_t from = b.n;
      utl_buf_add(&b, fold.p, fold.n); // system texts and the family's plain-text separator between them
      mark(sp, &b, from);
      utl_buf_adds(&b, t->fold_sep);
      utl_buf_reset(&fold);
    }
    put(&b, sp, msgs[i].content, asst ? t->trim_asst : t->trim);
    const char *ctext = calls && asst ? calls[i] : NULL;
    if (ctext) {
      cJSON *cl = cJSON_Parse(ctext);
      if (!cJSON_IsArray(cl)) {
        cJSON_Delete(cl);
        utl_seterr(err, errlen, "message %zu: tool_calls must be a JSON array", i);
        goto done;
      }
      int k = 0;
      const cJSON *c;
      cJSON_ArrayForEach(c, cl) {
        if (k++ || msgs[i].content[0]) utl_buf_adds(&b, st->call_sep);
        utl_buf_adds(&b, st->call_open);
        if (call_text(&b, sp, c, err, errlen) != 0) {
          cJSON_Delete(cl);
          goto done;
        }
        utl_buf_adds(&b, st->call_close);
      }
      cJSON_Delete(cl);
    }
    utl_buf_adds(&b, role_close(t, role));
  }
  if (fold.n) { // never dropped in silence
    utl_seterr(err, errlen, "the %s chat template has no system turn: a system message is put in front of the next "
               "user message, and this one has none after it", t->name);
    goto done;
  }
  if (add_generation_prompt) utl_buf_adds(&b, t->gen_prompt);
  if (fold.oom || rec.oom || !(*out = utl_buf_take(&b))) {
    utl_seterr(err, errlen, "out of memory");
    goto done;
  }
  if (sp) {
    *user_spans = rec.v;
    *n_user_spans = rec.n;
    rec.v = NULL;
  }
  rc = 0;
done:
  utl_buf_free(&b);
  utl_buf_free(&fold);
  free(rec.v);
  free(def);
  return rc;
}

static int apply(const mdl_gguf *g, const mdl_chat_msg *msgs, const char *const *calls, size_t n, const char *tools,
                 int with_tools, int add_generation_prompt, char **out, char *err, size_t errlen) {
  *out = NULL;
  const mdl_chat_template *t;
  if (mdl_chat_template_of(g, NULL, &t, err, errlen) != 0) return -1;
  return mdl_chat_render(t ? t : &FAMILIES[0], g, msgs, calls, n, tools, with_tools, add_generation_prompt, out, NULL,
                         NULL, err, errlen); // no template: SmolLM2's (ChatML) is assumed
}

int mdl_chat_apply(const mdl_gguf *g, const mdl_chat_msg *msgs, size_t n, int add_generation_prompt, char **out,
                   char *err, size_t errlen) {
  return apply(g, msgs, NULL, n, NULL, 0, add_generation_prompt, out, err, errlen);
}

int mdl_chat_apply_tools(const mdl_gguf *g, const mdl_chat_msg *msgs, const char *const *tool_calls, size_t n,
                         const char *tools, int add_generation_prompt, char **out, char *err, size_t errlen) {
  return apply(g, msgs, tool_calls, n, tools, 1, add_generation_prompt, out, err, errlen);
}
