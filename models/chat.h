// models/chat.h: chat templates: the model's own Jinja template run with the OpenAI conversation (chat_jinja.c), and
// the built-in families (ChatML, Llama 3, Gemma, Mistral [INST], Phi-3) for --chat-template NAME and as the fallback;
// tool calling's formats (Hermes/Qwen, Llama 3 JSON, Mistral) and ChatML's Hermes convention.
#ifndef DSERVE_MDL_CHAT_H
#define DSERVE_MDL_CHAT_H

#include <stddef.h>

#include "models/gguf.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mdl_chat_msg {
  const char *role;    // "system", "user" or "assistant"
  const char *content; // UTF-8, NUL-terminated
} mdl_chat_msg;

// ---- template families ----

// One chat template family: what goes around each role's message, the generation prompt and the token that ends a
// turn, rendered from this table as llama.cpp's llama_chat_apply_template renders its built-in templates (the goldens
// in tests/models/golden/chat_families.json are that function's output); a GGUF's template is recognised as a family
// by its markers where no Jinja is run (mdl_chat_apply: dserve generate --chat). The rendered text carries no BOS: a caller
// tokenizes it as llama-server does, with BOS when the vocabulary's add_bos_token says so.
typedef struct mdl_chat_template {
  const char *name;        // "chatml", "llama3", "gemma", "mistral", "phi3": the config's chat_template values
  const char *sys_open;    // around a system message; NULL: the family has no system turn and the system text goes
  const char *sys_close;   // in front of the next user message's content, followed by fold_sep
  const char *fold_sep;    // "\n\n"
  const char *user_open, *user_close;
  const char *asst_open, *asst_close;
  const char *gen_prompt;  // what add_generation_prompt appends ("" for Mistral: the model answers after [/INST])
  const char *eot;         // the token that ends the model's turn: a worker must stop on it (an end-of-generation id)
  int trim;                // 1: system and user contents are trimmed of surrounding whitespace (Jinja's | trim)
  int trim_asst;           // 1: assistant contents are trimmed
  int has_tools;           // 1: tool calling has a convention for this family (ChatML: Hermes)
} mdl_chat_template;

// The family named name, NULL when there is none such.
const mdl_chat_template *mdl_chat_template_named(const char *name);
// The families' names for messages: "chatml, llama3, gemma, mistral, phi3".
const char *mdl_chat_template_names(void);

// Which family renders g's chats. override (NULL or "": none) names a family and wins over the template. Otherwise
// g's tokenizer.chat_template is recognised by its markers; *out is NULL (and 0 returned) when g has none (g NULL
// too). -1 with err for an unknown override or a template of no family known here (err names the families and the
// config's chat_template override).
int mdl_chat_template_of(const mdl_gguf *g, const char *override, const mdl_chat_template **out, char *err,
                         size_t errlen) UTL_WARN_UNUSED;

// Renders msgs (n) with family t. g (may be NULL) gives ChatML's default system prompt (see mdl_chat_apply); tools,
// tool_calls and role "tool" as mdl_chat_apply_tools, refused with err for a family without a tool convention.
// with_tools 0: role "tool" is refused. *out is malloc'ed; the caller frees it. To be encoded with parse_special = 1,
// except inside *user_spans: when user_spans and n_user_spans are given, *user_spans (malloc'ed, the caller frees it)
// gets (*n_user_spans, 2) offsets and lengths into *out, in order, of the request's own text (message contents,
// tool declarations, call arguments), which mdl_tok_encode_guarded encodes without matching control tokens: a user
// who writes "<|im_end|>" gets those characters, not the template's markup.
int mdl_chat_render(const mdl_chat_template *t, const mdl_gguf *g, const mdl_chat_msg *msgs,
                    const char *const *tool_calls, size_t n, const char *tools, int with_tools,
                    int add_generation_prompt, char **out, size_t **user_spans, size_t *n_user_spans, char *err,
                    size_t errlen) UTL_WARN_UNUSED;
// mdl_chat_render with the template's text given (tpl_text, tpl_len bytes; NULL: SmolLM2's assumed) rather than read
// from a GGUF: a request's own chat_template, whose text gives ChatML's default system prompt.
int mdl_chat_render_text(const mdl_chat_template *t, const char *tpl_text, size_t tpl_len, const mdl_chat_msg *msgs,
                         const char *const *tool_calls, size_t n, const char *tools, int with_tools,
                         int add_generation_prompt, char **out, size_t **user_spans, size_t *n_user_spans, char *err,
                         size_t errlen) UTL_WARN_UNUSED;

// ---- Jinja templates (models/chat_jinja.c) ----

struct mdl_jinja; // models/jinja.h

// One message as a Jinja template reads it (the families read role and content only: mdl_chat_msg). NULL: absent.
typedef struct mdl_chat_turn {
  const char *role, *content;    // required; role as the request gave it ("system", "user", "assistant", "tool")
  const char *name;              // the participant's name
  const char *tool_calls;        // an assistant's calls: JSON text of [{"id", "name", "arguments"}] or OpenAI's
                                 // [{"id", "type", "function": {"name", "arguments"}}] (arguments a value or a string)
  const char *tool_call_id;      // a tool result's call id
  const char *reasoning_content; // an assistant's reasoning (Qwen3's template shows it)
} mdl_chat_turn;

// What a Jinja chat template is rendered with: the variables Hugging Face's apply_chat_template gives it.
typedef struct mdl_chat_jinja_in {
  const mdl_chat_turn *msgs; // (n) messages[i]: {role, content, name, tool_calls (OpenAI's shape, arguments a mapping
  size_t n;                  // when they are JSON), tool_call_id, reasoning_content}, absent fields left out
  const char *tools;        // JSON text of OpenAI's tools array, or NULL: `tools` undefined
  const char *kwargs;       // JSON text of an object whose keys become top-level variables (chat_template_kwargs;
                            // the caller refuses messages, tools, bos_token, eos_token, add_generation_prompt), or NULL
  int add_generation_prompt;
  const char *bos, *eos;    // bos_token, eos_token: the vocabulary's texts ("" when it has none)
  int strip_bos;            // the tokenizer adds BOS itself: a leading bos text is cut (as llama.cpp's
                            // common_chat_template_direct_apply does), so the prompt never starts with two
  int64_t now;              // unix seconds strftime_now() formats
} mdl_chat_jinja_in;

// Renders t with in. *out malloc'ed (NUL-terminated); *spans (malloc'ed, (*n_spans, 2) offsets and lengths into
// *out) covers the request's text as mdl_chat_render's user_spans do. Returns 0, -1 with err (a runtime error: err
// names its line), or MDL_JINJA_RAISED with the template's raise_exception message in err.
int mdl_chat_render_jinja(const struct mdl_jinja *t, const mdl_chat_jinja_in *in, char **out, size_t **spans,
                          size_t *n_spans, char *err, size_t errlen) UTL_WARN_UNUSED;

// ---- ChatML ----

// Renders msgs (n) as ChatML: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" each, then "<|im_start|>assistant\n" when
// add_generation_prompt. When the first message is not a system message and the model's template has a default system
// prompt (SmolLM2's does), that system block comes first. g may be NULL (SmolLM2's template is assumed); a g whose
// tokenizer.chat_template is of another family renders with it (mdl_chat_template_of, no override), and one whose
// template is of no family known here fails. *out is malloc'ed (NUL-terminated); the caller frees it.
// The text is meant to be encoded with parse_special = 1.
int mdl_chat_apply(const mdl_gguf *g, const mdl_chat_msg *msgs, size_t n, int add_generation_prompt, char **out,
                   char *err, size_t errlen) UTL_WARN_UNUSED;

// The default system prompt the template inserts (malloc'ed into *out, NULL when the template has none).
int mdl_chat_default_system(const mdl_gguf *g, char **out, char *err, size_t errlen) UTL_WARN_UNUSED;


// ---- tools ----

// How a template family writes tool calling: where the tools are listed, how the model writes a call and how a tool's
// result is shown to it. One table per family; ChatML templates without a tool convention of their own get the
// Hermes/Qwen one (docs/openai.md): the tools' JSON signatures inside <tools></tools> in the system block, each call
// as "<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>", results as "<tool_response>...</tool_response>"
// inside a user turn.
// The formats a model writes its calls in (models/chat.c detects a Jinja template's from its text, as llama.cpp's
// common/chat.cpp does): Hermes/Qwen's tags, Llama 3.x's bare JSON reply, Mistral Nemo's [TOOL_CALLS] array.
typedef enum mdl_tool_format {
  MDL_TOOL_FMT_HERMES = 0,  // <tool_call>{"name": N, "arguments": {...}}</tool_call>, one block per call
  MDL_TOOL_FMT_LLAMA3 = 1,  // the whole reply is {"name": N, "parameters": {...}}, optionally after <|python_tag|>
  MDL_TOOL_FMT_MISTRAL = 2, // [TOOL_CALLS][{"name": N, "arguments": {...}, "id": "9 alnum"}, ...]
} mdl_tool_format;

typedef struct mdl_chat_tool_style {
  const char *name;         // "hermes", "llama3_json", "mistral"
  mdl_tool_format format;
  const char *marker;       // the text that begins a call wherever it comes ("<tool_call>", "[TOOL_CALLS]",
                            // "<|python_tag|>"): a stream holds back what may be its beginning
  const char *args_key;     // the key of a call's arguments: "arguments", Llama 3's "parameters"
  const char *call_open;    // what opens a call: "<tool_call>\n"
  const char *call_close;   // what closes it: "\n</tool_call>"
  const char *call_sep;     // between two calls of one turn: "\n"
  const char *result_role;  // the turn tool results ride in: "user"
  const char *result_open;  // around one result: "<tool_response>\n" ...
  const char *result_close; // ... "\n</tool_response>"
  const char *sys_head;     // the system block's tool section before the tool list ...
  const char *sys_tail;     // ... and after it
} mdl_chat_tool_style;

// The call format a Jinja template's text (n bytes) shows the model: Mistral Nemo's [TOOL_CALLS] (not with [ARGS]),
// Hermes/Qwen's <tool_call> (not Qwen3 Coder's <function=...>), Llama 3's {"name": ..., "parameters": ...} (a
// <|start_header_id|> template that writes "parameters" or <|python_tag|>). NULL when the template writes calls in
// none of these (or not at all).
const mdl_chat_tool_style *mdl_chat_tool_style_detect(const char *tpl, size_t n);

// The tool style of g's template (g NULL: SmolLM2's, ChatML). NULL with err when the template has none this code knows.
// mdl_chat_template_tools: the same for a family (NULL with err for one without a tool convention).
const mdl_chat_tool_style *mdl_chat_tool_style_of(const mdl_gguf *g, char *err, size_t errlen);
const mdl_chat_tool_style *mdl_chat_template_tools(const mdl_chat_template *t, char *err, size_t errlen);

// mdl_chat_apply with tools: tools (NULL: none) is the JSON text of OpenAI's tools array ([{"type": "function",
// "function": {"name", "description", "parameters"}}]), listed in the system block (the default system prompt's, or
// the conversation's own first system message's, or a new one). tool_calls (NULL, or n entries each NULL or the JSON
// text of an array of {"name": string, "arguments": any JSON}) are an assistant message's calls, written after its
// content as the model would write them. Messages with role "tool" are results: consecutive ones go into one turn of
// the style's result_role. A malformed tools or tool_calls text fails with err.
int mdl_chat_apply_tools(const mdl_gguf *g, const mdl_chat_msg *msgs, const char *const *tool_calls, size_t n,
                         const char *tools, int add_generation_prompt, char **out, char *err,
                         size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
