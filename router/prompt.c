// router/prompt.c: a chat request's prompt text: which template renders it (its own chat_template, the server's Jinja
// template or a family), the checks that go with each, and the template's errors as 400s (docs/openai.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "models/chat.h"
#include "models/jinja.h"
#include "router/server_int.h"

// The text of token id (bos_token, eos_token for a Jinja template) into buf: "" when there is none (id < 0).
static void token_text(const mdl_tok *t, int32_t id, char *buf, size_t cap) {
  size_t n = id >= 0 ? mdl_tok_piece(t, id, buf, cap - 1) : 0;
  buf[n < cap ? n : 0] = 0; // a text longer than buf: none (no vocabulary has one)
}

// chat_template_kwargs' top-level strings are the template's own variables, which the interpreter does not guard as
// the request's text (models/jinja.h): one holding a control token's text would put the model's markup in the prompt
// (a forged turn), so it is refused. Strings nested deeper are guarded like the messages'. 0, or -1 with e.
static int kwargs_markup(const mdl_tok *tok, const char *kwargs, rtr_error *e) {
  cJSON *kw = cJSON_Parse(kwargs);
  int rc = 0;
  for (const cJSON *k = kw ? kw->child : NULL; k && !rc; k = k->next) {
    if (!cJSON_IsString(k)) continue;
    int32_t *ids = NULL;
    size_t n = 0;
    char err[128], param[64];
    if (mdl_tok_encode(tok, k->valuestring, strlen(k->valuestring), 1, &ids, &n, err, sizeof err) < 0) n = 0;
    for (size_t i = 0; i < n && !rc; i++)
      if (mdl_tok_is_control(tok, ids[i])) {
        snprintf(param, sizeof param, "chat_template_kwargs.%.40s", k->string);
        rc = rtr_fail(e, 400, "invalid_request_error", param, "invalid_value",
                      "'%s' holds a control token's text: a template variable cannot carry the model's markup",
                      param);
      }
    free(ids);
  }
  cJSON_Delete(kw);
  return rc;
}

int rtr_chat_prompt(rtr_server *s, const rtr_request *q, char **text, size_t **spans, size_t *n_spans,
                    rtr_error *e) {
  char err[256];
  *text = NULL;
  *spans = NULL;
  *n_spans = 0;
  const mdl_chat_template *chat = rtr_chat_of(s, q);
  const mdl_jinja *jt = rtr_jinja_of(s, q);
  if (!chat && !jt)
    return rtr_fail(e, 400, "invalid_request_error", "messages", "model_not_chat",
                    "this model has no chat template (tokenizer.chat_template) and no ChatML tokens: it is not a chat "
                    "model; send a prompt to /v1/completions instead, or a chat_template, or start dserve with "
                    "--chat-template NAME (%s) or --chat-template-file F", mdl_chat_template_names());
  if (q->chat_family) { // the workers stop on the vocabulary's end-of-generation tokens
    int32_t eot = mdl_tok_find(s->tok, chat->eot);
    if (eot < 0 || !mdl_tok_is_eog(s->tok, eot))
      return rtr_fail(e, 400, "invalid_request_error", "chat_template", "invalid_value",
                      "'chat_template' is of the %s family, whose turns end with %s, which this model's vocabulary %s",
                      chat->name, chat->eot, eot < 0 ? "does not have" : "does not mark as an end of generation");
  }
  if (q->chat_kwargs && !jt) {
    char param[64];
    cJSON *kw = cJSON_Parse(q->chat_kwargs);
    snprintf(param, sizeof param, "chat_template_kwargs.%.40s", kw && kw->child ? kw->child->string : "");
    cJSON_Delete(kw);
    return rtr_fail(e, 400, "invalid_request_error", param, "unsupported_parameter",
                    "'%s' is not supported: the %s chat template family takes no template variables (a Jinja "
                    "template does: --chat-template-file, or the request's chat_template)", param, chat->name);
  }
  int add_gen = q->kind == RTR_TOKENIZE ? q->add_generation_prompt : 1;
  int with_tools = q->tools || q->has_tool_msgs; // the template family's tool convention (models/chat.c)
  if (jt && q->tools && !mdl_jinja_uses_var(jt, "tools"))
    return rtr_fail(e, 400, "invalid_request_error", "tools", "tools_not_supported",
                    "this model's chat template (%s) cannot express tools: it never reads them; send the request "
                    "without tools, or with a template that has tools (--chat-template-file; --chat-template chatml or the "
                    "request's \"chat_template\": \"chatml\" for the Hermes convention)",
                    q->chat_jinja ? "the request's chat_template" : s->chat_source);
  if (jt && q->chat_kwargs && kwargs_markup(s->tok, q->chat_kwargs, e) < 0) return -1;
  if (jt && q->tools && !(q->chat_jinja ? q->chat_jinja_tools : s->jinja_tools))
    return rtr_fail(e, 400, "invalid_request_error", "tools", "tools_not_supported",
                    "this model's chat template (%s) writes tool calls in a format this server does not read "
                    "(Hermes/Qwen <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS]: docs/openai.md)",
                    q->chat_jinja ? "the request's chat_template" : s->chat_source);
  if (!jt && with_tools && !mdl_chat_template_tools(chat, err, sizeof err))
    return rtr_fail(e, 400, "invalid_request_error", q->tools ? "tools" : "messages", "tools_not_supported", "%s",
                    err);
  mdl_chat_msg *mm = calloc((size_t)q->n_msgs, sizeof *mm);
  mdl_chat_turn *turns = calloc((size_t)q->n_msgs, sizeof *turns);
  const char **calls = calloc((size_t)q->n_msgs, sizeof *calls);
  if (!mm || !turns || !calls) {
    free(mm);
    free(turns);
    free(calls);
    return rtr_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  }
  for (int i = 0; i < q->n_msgs; i++) {
    const rtr_msg *m = &q->msgs[i];
    mm[i] = (mdl_chat_msg){m->role, m->content};
    turns[i] = (mdl_chat_turn){m->role, m->content, m->name, m->tool_calls, m->tool_call_id, m->reasoning_content};
    calls[i] = m->tool_calls;
  }
  const mdl_gguf *g = s->has_template ? s->gguf : NULL;
  int rc;
  if (jt) { // the template itself: its variables as Hugging Face's apply_chat_template gives them
    char bos[128], eos[128];
    token_text(s->tok, mdl_tok_bos(s->tok), bos, sizeof bos);
    token_text(s->tok, mdl_tok_eos(s->tok), eos, sizeof eos);
    mdl_chat_jinja_in in = {.msgs = turns, .n = (size_t)q->n_msgs, .tools = q->tools, .kwargs = q->chat_kwargs,
                            .add_generation_prompt = add_gen, .bos = bos, .eos = eos,
                            .strip_bos = q->add_special && mdl_tok_add_bos(s->tok), .now = (int64_t)time(NULL)};
    rc = mdl_chat_render_jinja(jt, &in, text, spans, n_spans, err, sizeof err);
  } else {
    rc = q->chat_family
             ? mdl_chat_render_text(chat, q->chat_template, strlen(q->chat_template), mm, with_tools ? calls : NULL,
                                    (size_t)q->n_msgs, q->tools, with_tools, add_gen, text, spans, n_spans, err,
                                    sizeof err)
             : mdl_chat_render(chat, g, mm, with_tools ? calls : NULL, (size_t)q->n_msgs, q->tools, with_tools,
                               add_gen, text, spans, n_spans, err, sizeof err);
  }
  free(mm);
  free(turns);
  free(calls);
  if (rc == MDL_JINJA_RAISED) // the template's own refusal (Gemma's alternating roles, Mistral's call ids, ...)
    return rtr_fail(e, 400, "invalid_request_error", "messages", "chat_template_error", "%s", err);
  if (rc < 0)
    return rtr_fail(e, 400, "invalid_request_error", "messages", jt ? "chat_template_error" : NULL,
                    "chat template%s: %s", jt ? " (Jinja)" : "", err);
  return 0;
}
