// router/openai.h: the OpenAI request schema: a JSON body becomes a validated request, or an OpenAI-style error.
#ifndef DSERVE_RTR_OPENAI_H
#define DSERVE_RTR_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "config/config.h"
#include "models/chat.h"
#include "models/gguf.h"
#include "models/grammar.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rtr_kind {
  RTR_CHAT = 0,
  RTR_COMPLETION = 1,
  RTR_TOKENIZE = 2,
  RTR_DETOKENIZE = 3,
  RTR_EMBEDDING = 4, // /v1/embeddings: input in prompts (one choice each), no sampling
} rtr_kind;

// An error as the client sees it: {"error": {"message", "type", "param", "code"}} with an HTTP status.
typedef struct rtr_error {
  int status;        // HTTP status (400, 404, ...)
  char message[512];
  char type[32];     // "invalid_request_error", "not_found_error", "server_error", ...
  char param[64];    // the offending field ("" = null)
  char code[48];     // machine-readable code ("" = null), e.g. "context_length_exceeded"
} rtr_error;

// Fills e (always returns -1 so callers can `return rtr_fail(...)`).
int rtr_fail(rtr_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
// The error object as JSON text (malloc'ed, NUL-terminated); NULL on out of memory.
char *rtr_error_json(const rtr_error *e);

// The sampling values a request gets for the fields it leaves out (explicit request values always win).
typedef struct rtr_sampling {
  double temperature;        // 0 = greedy
  int top_k;                 // -1 = off
  double top_p, min_p, repetition_penalty;
} rtr_sampling;

// The shipped defaults, llama-server's: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repetition_penalty 1.
extern const rtr_sampling rtr_sampling_shipped;

// Resolves each default field by field: the config's "sampling" section (cfg, may be NULL), else the GGUF's
// general.sampling.{temp, top_k, top_p, min_p, penalty_repeat} (llama.cpp's keys; g may be NULL; a value of the wrong
// type or out of range is skipped), else rtr_sampling_shipped. desc (may be NULL) gets one line saying each value and
// where it came from, for the startup log.
void rtr_sampling_resolve(const cfg_sampling *cfg, const mdl_gguf *g, rtr_sampling *out, char *desc,
                          size_t desc_cap);

typedef struct rtr_limits {
  const char *model_name; // (borrowed) the only model served; a request naming another gets 404
  int n_ctx;              // the model's context length
  int max_tokens_limit;   // largest max_tokens accepted (<= 0: n_ctx)
  int max_n;              // largest n
  int max_stop;           // most stop strings
  int n_vocab;            // token ids must be in [0, n_vocab)
  const rtr_sampling *defaults; // (borrowed, may be NULL) sampling for fields a request leaves out; NULL: the neutral
                                // values (temperature 1, top_k off, top_p 1, min_p 0, repetition_penalty 1)
  int any_model;          // 1: a request's "model" may name anything (one model served, router.strict_model_name off)
  int n_embd;             // embeddings: the model's width, the one `dimensions` accepted (0: unknown, none accepted)
} rtr_limits;

typedef struct rtr_msg {
  char *role;       // (owned) "system", "user", "assistant" or "tool"
  char *content;    // (owned) UTF-8 text (array-of-text content joined; "" for an assistant's null content)
  char *tool_calls; // (owned) an assistant's calls as models/chat.h takes them: JSON text of [{"id", "name",
                    // "arguments"}] (arguments parsed when they are JSON, else the string as sent), or NULL
  char *name;              // (owned) the message's name, or NULL (read by Jinja templates only)
  char *tool_call_id;      // (owned) a tool result's call id, or NULL (read by Jinja templates only)
  char *reasoning_content; // (owned) an assistant's reasoning, or NULL (read by Jinja templates only)
} rtr_msg;

// One /v1/completions prompt: text (NUL-terminated, len bytes), or token ids.
typedef struct rtr_prompt {
  char *text;  // (owned) or NULL
  size_t len;
  int32_t *ids; // (owned) (n_ids) or NULL
  int n_ids;
} rtr_prompt;
#define RTR_MAX_PROMPTS 64 // prompts in one /v1/completions request
#define RTR_MAX_INPUTS 2048 // inputs in one /v1/embeddings request (OpenAI's bound; router.max_choices bounds it too)
#define RTR_MAX_CHAT_TEMPLATE (256 * 1024) // bytes of a request's own chat_template

typedef struct rtr_bias {
  int32_t id;
  float bias;
} rtr_bias;

// tool_choice, resolved: no calls (no tools, or "none"); the model may call (auto); it must (required, or the one
// named function: call_tools then holds only that one).
enum { RTR_TOOLS_OFF = 0, RTR_TOOLS_AUTO = 1, RTR_TOOLS_REQUIRED = 2, RTR_TOOLS_NAMED = 3 };
#define RTR_MAX_TOOLS 128

// response_format: text; json_object (any JSON object); json_schema (a JSON text valid under json_schema).
enum { RTR_FORMAT_TEXT = 0, RTR_FORMAT_JSON_OBJECT = 1, RTR_FORMAT_JSON_SCHEMA = 2 };

#define RTR_MAX_LOGIT_BIAS 1024
#define RTR_MAX_STOP_BYTES 1024

// The API a chat request came in by: /v1/chat/completions, or /v1/responses (translated into a chat request).
enum { RTR_API_CHAT = 0, RTR_API_RESPONSES = 1 };

// A validated request. temperature, top_k, top_p, min_p and repetition_penalty the request leaves out come from
// rtr_limits.defaults; the rest default as OpenAI does: penalties 0, n 1, no seed, no logprobs.
typedef struct rtr_request {
  rtr_kind kind;
  rtr_msg *msgs;            // (owned) (n_msgs) chat, or tokenize with messages
  int n_msgs;
  rtr_prompt *prompts;      // (owned) (n_prompts) completion: one choice group of n per prompt, in order; embedding:
                            // its inputs, one choice each
  int n_prompts;
  char *prompt;             // (owned) tokenize's text prompt (NUL-terminated, prompt_len bytes), or NULL
  size_t prompt_len;
  int32_t *prompt_ids;      // (owned) (n_prompt_ids) detokenize's tokens, or NULL
  int n_prompt_ids;
  int max_tokens;           // -1 = not given (up to the context)
  double temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  int top_k;                // -1 = off
  int has_seed;
  int64_t seed;
  char **stop;              // (owned) (n_stop) non-empty strings
  int n_stop;
  int n;                    // choices
  int logprobs;             // -1 = none, else how many top alternatives per token (0..20)
  rtr_bias *bias;           // (owned) (n_bias)
  int n_bias;
  int stream, include_usage;
  int ignore_eos;
  int no_spec;               // "speculative": false: this request's choices decode without drafts (docs/openai.md)
  int response_format;      // RTR_FORMAT_*: structured outputs (grammar-constrained decoding), chat only
  char *json_schema;        // (owned) RTR_FORMAT_JSON_SCHEMA: the schema's JSON text (compiled once to validate it)
  int tool_choice;          // RTR_TOOLS_*
  char *tools;              // (owned) unless RTR_TOOLS_OFF: the tools as the chat template lists them (JSON text of
                            // [{"type": "function", "function": {...}}]); NULL otherwise
  char *call_tools;         // (owned) unless RTR_TOOLS_OFF: the tools a call may name as the call grammar takes them
                            // (JSON text of [{"name", "parameters"}]: every tool, or the named one)
  int parallel_tool_calls;  // a turn may hold several calls: as given; by default 1 with tool_choice auto, 0 with
                            // "required" or a named function (one call, then the choice ends: finish "tool_calls")
  int has_tool_msgs;        // a message has role "tool" or tool_calls (the prompt needs the tool convention)
  char *chat_template;      // (owned) chat / tokenize with messages: the request's own template text, or NULL
  const mdl_chat_template *chat_family; // (static) its family (models/chat.h) when it names one, else NULL
  struct mdl_jinja *chat_jinja; // (owned) the request's template text parsed as Jinja (not a family name), or NULL
  const mdl_chat_tool_style *chat_jinja_tools; // (static) chat_jinja's call format (models/chat.h), NULL: none known
  char *chat_kwargs;        // (owned) chat_template_kwargs (JSON text of a non-empty object), or NULL
  int api;                  // RTR_API_*: the API the client spoke (its answers take that API's shape)
  char *resp_echo;          // (owned) RTR_API_RESPONSES: the request's fields a response object repeats (JSON text)
  int add_special;          // tokenize: add_special_tokens (default 1)
  int add_generation_prompt; // tokenize with messages (default 1)
  int embd_base64;          // embedding: encoding_format "base64" (little-endian float32 bytes), else "float"
} rtr_request;

// Parses and validates body (len bytes, need not be NUL-terminated) as kind. Invalid UTF-8, malformed or too deeply
// nested JSON, a NUL character in any string (raw or \u0000: it would cut the text short; param is its path, e.g.
// "messages[0].content"), a wrong type or an out-of-range value: 400 with the field in param; another model's name: 404
// (code model_not_found). No field is silently ignored (docs/openai.md has the table): a field is honoured, accepted
// as a documented no-op (user, store false, metadata, ...), or refused with 400 naming it in param: code
// "unsupported_parameter" for an unknown field and for what this server cannot do (the deprecated functions /
// function_call beyond "none", a JSON Schema keyword outside the supported subset, ...), "invalid_value" for a value
// outside the field's set (e.g. response_format type "bogus", a schema that is not one, a tool_choice naming no
// declared tool). response_format json_schema and each tool's parameters are compiled to check them (param
// "response_format" / "tools[i].function.parameters", the message names the keyword). On error *out is left empty.
int rtr_request_parse(rtr_kind kind, const char *body, size_t len, const rtr_limits *lim, rtr_request *out,
                      rtr_error *e) UTL_WARN_UNUSED;
void rtr_request_free(rtr_request *r); // frees what r owns and zeroes it; NULL is a no-op

// ---- /v1/responses (router/oai_responses.c): the Responses API over the chat machinery ----

// Parses a /v1/responses body into a chat request (kind RTR_CHAT, api RTR_API_RESPONSES): input (a string or a list of
// message, function_call and function_call_output items), instructions (a system message first), max_output_tokens,
// temperature, top_p, function tools, tool_choice, parallel_tool_calls, text.format, stream, and the documented
// no-ops; any other field, item or tool type is a 400 naming it (docs/openai.md). Errors name the Responses field.
int rtr_request_parse_responses(const char *body, size_t len, const rtr_limits *lim, rtr_request *out,
                                rtr_error *e) UTL_WARN_UNUSED;

// A chat completion object (consumed) as the Responses API's response object for q (its one choice: text as a message
// item, calls as function_call items; finish "length": status "incomplete"). NULL on out of memory.
cJSON *rtr_resp_from_chat(const rtr_request *q, cJSON *chat);

// A stream's translation from chat.completion.chunk objects to the Responses API's events.
typedef struct rtr_resp_stream {
  int seq;          // the next event's sequence_number
  int started;      // response.created went out
  int open;         // 0 none, 1 a message item, 2 a function_call item is open (the last of output)
  cJSON *output;    // (owned) the output items so far, as they will stand in response.completed
  char finish[16];  // the choice's finish_reason once it came
} rtr_resp_stream;

// The events (appended to events, a cJSON array of {"type", ...} objects) that chunk (borrowed: a
// chat.completion.chunk, or an {"error"} object) means for the Responses stream of q.
void rtr_resp_stream_chunk(rtr_resp_stream *st, const rtr_request *q, const cJSON *chunk, cJSON *events);
void rtr_resp_stream_free(rtr_resp_stream *st);

// The context check once the prompt is tokenized: n_prompt >= n_ctx, or max_tokens >= 0 and n_prompt + max_tokens
// > n_ctx, is 400 context_length_exceeded with the counts in the message. An empty prompt is 400 too.
// Tool calls in a chat choice's output text (text_len bytes), in the format of st (models/chat.h: Hermes/Qwen's
// <tool_call> blocks, whitespace around the tags not significant; Llama 3's reply that is one {"name", "parameters"}
// object, at its start or after <|python_tag|>; Mistral's [TOOL_CALLS] arrays of {"name", "arguments", "id"}). Each
// call naming one of q's call tools is appended to calls (a cJSON array) as OpenAI's {"id": "call_..." (Mistral: its
// own id, or 9 letters and digits), "type": "function", "function": {"name", "arguments": JSON text}}; *content_len
// is the length of the text before the first call, trailing whitespace dropped. A last call left unclosed (max_tokens
// cut it) is dropped when calls precede it; otherwise, when a call is unclosed, not JSON, names no declared tool, or
// text follows the calls, nothing is appended: the whole text is the content. Returns the number of calls (0 when q's
// tool_choice is RTR_TOOLS_OFF), -1 when out of memory.
int rtr_parse_tool_calls(const rtr_request *q, const mdl_chat_tool_style *st, const char *text, size_t text_len,
                         cJSON *calls, size_t *content_len) UTL_WARN_UNUSED;

// The number of bytes at the end of text (n bytes) that may be the beginning of open (whitespace-trimmed): a stream
// holds them back until it knows they are not a call.
size_t rtr_tool_open_prefix(const char *text, size_t n, const char *open);

// A stream's text not yet sent (held, n bytes) with tools on: how many of its first bytes can go to the client now.
// The rest waits: a tail that may begin st's marker, or, once *in_call is set (the marker came, or with Llama 3's
// format a reply whose first non-space byte is '{' while began is 0: no content went out yet), everything, read for
// calls when the choice ends (rtr_parse_tool_calls). Whitespace before a call waits with it.
size_t rtr_tool_hold(const mdl_chat_tool_style *st, const char *held, size_t n, int began, int *in_call);

// 400 context_length_exceeded (param: the prompt's field for kind, or max_tokens) when the prompt and max_tokens do not fit
// n_ctx; an empty prompt is a 400 too.
int rtr_check_context(rtr_kind kind, int n_prompt, int max_tokens, int n_ctx, rtr_error *e) UTL_WARN_UNUSED;

// 1 when the n bytes at s are valid UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF).
int rtr_utf8_valid(const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
