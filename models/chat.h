// models/chat.h: the ChatML chat template (as SmolLM2's GGUF tokenizer.chat_template renders it), with tool calling.
#ifndef DSERVE_MDL_CHAT_H
#define DSERVE_MDL_CHAT_H

#include <stddef.h>

#include "models/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mdl_chat_msg {
  const char *role;    // "system", "user" or "assistant"
  const char *content; // UTF-8, NUL-terminated
} mdl_chat_msg;

// Renders msgs (n) as ChatML: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" each, then "<|im_start|>assistant\n" when
// add_generation_prompt. When the first message is not a system message and the model's template has a default system
// prompt (SmolLM2's does), that system block comes first. g may be NULL (SmolLM2's template is assumed); with a g whose
// tokenizer.chat_template is not ChatML, this fails. *out is malloc'ed (NUL-terminated); the caller frees it.
// The text is meant to be encoded with parse_special = 1.
int mdl_chat_apply(const mdl_gguf *g, const mdl_chat_msg *msgs, size_t n, int add_generation_prompt, char **out,
                   char *err, size_t errlen);

// The default system prompt the template inserts (malloc'ed into *out, NULL when the template has none).
int mdl_chat_default_system(const mdl_gguf *g, char **out, char *err, size_t errlen);


// ---- tools ----

// How a template family writes tool calling: where the tools are listed, how the model writes a call and how a tool's
// result is shown to it. One table per family; ChatML templates without a tool convention of their own get the
// Hermes/Qwen one (docs/openai.md): the tools' JSON signatures inside <tools></tools> in the system block, each call
// as "<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>", results as "<tool_response>...</tool_response>"
// inside a user turn.
typedef struct mdl_chat_tool_style {
  const char *name;         // "hermes"
  const char *call_open;    // what opens a call: "<tool_call>\n"
  const char *call_close;   // what closes it: "\n</tool_call>"
  const char *call_sep;     // between two calls of one turn: "\n"
  const char *result_role;  // the turn tool results ride in: "user"
  const char *result_open;  // around one result: "<tool_response>\n" ...
  const char *result_close; // ... "\n</tool_response>"
  const char *sys_head;     // the system block's tool section before the tool list ...
  const char *sys_tail;     // ... and after it
} mdl_chat_tool_style;

// The tool style of g's template (g NULL: SmolLM2's, ChatML). NULL with err when the template has none this code knows.
const mdl_chat_tool_style *mdl_chat_tool_style_of(const mdl_gguf *g, char *err, size_t errlen);

// mdl_chat_apply with tools: tools (NULL: none) is the JSON text of OpenAI's tools array ([{"type": "function",
// "function": {"name", "description", "parameters"}}]), listed in the system block (the default system prompt's, or
// the conversation's own first system message's, or a new one). tool_calls (NULL, or n entries each NULL or the JSON
// text of an array of {"name": string, "arguments": any JSON}) are an assistant message's calls, written after its
// content as the model would write them. Messages with role "tool" are results: consecutive ones go into one turn of
// the style's result_role. A malformed tools or tool_calls text fails with err.
int mdl_chat_apply_tools(const mdl_gguf *g, const mdl_chat_msg *msgs, const char *const *tool_calls, size_t n,
                         const char *tools, int add_generation_prompt, char **out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
