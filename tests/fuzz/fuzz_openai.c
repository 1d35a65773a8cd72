// tests/fuzz/fuzz_openai.c: libFuzzer target: the router's OpenAI request validation (rtr_request_parse, and
// rtr_request_parse_responses for /v1/responses) on JSON-ish bodies, the chat rendering of what it accepts (tools
// included), tool-call parsing, and the Responses answers built for it.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include "models/chat.h"
#include "router/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A chat completion with text and a call, turned into a response object, and the same as a stream's chunks into
// its events, for the accepted Responses request q.
static void responses_answers(const rtr_request *q) {
  static const char chat[] = "{\"id\":\"resp-1\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
                             "\"message\":{\"role\":\"assistant\",\"content\":\"hi\",\"tool_calls\":[{\"id\":\"call_1\","
                             "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                             "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,"
                             "\"total_tokens\":5}}";
  static const char *const chunks[] = {
      "{\"id\":\"resp-1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}",
      "{\"id\":\"resp-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}",
      "{\"id\":\"resp-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\","
      "\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}",
      "{\"id\":\"resp-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
      "{\"arguments\":\"{}\"}}]}}]}",
      "{\"id\":\"resp-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}",
      "{\"id\":\"resp-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}",
      "{\"error\":{\"message\":\"x\",\"type\":\"server_error\"}}"};
  cJSON *o = rtr_resp_from_chat(q, cJSON_Parse(chat));
  if (!o || !cJSON_GetObjectItem(o, "output")) abort();
  cJSON_Delete(o);
  rtr_resp_stream st = {0};
  cJSON *events = cJSON_CreateArray();
  for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
    cJSON *c = cJSON_Parse(chunks[i]);
    rtr_resp_stream_chunk(&st, q, c, events);
    cJSON_Delete(c);
  }
  if (cJSON_GetArraySize(events) < 10) abort();
  cJSON_Delete(events);
  rtr_resp_stream_free(&st);
}

// Input: byte 0 picks the kind (chat, completion, tokenize, detokenize, responses, embeddings); the rest is the body.
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  int responses = data[0] % 6 == 4;
  rtr_kind kind = responses ? RTR_CHAT : data[0] % 6 == 5 ? RTR_EMBEDDING : (rtr_kind)(data[0] % 6);
  size_t len = size - 1;
  char *body = malloc(len ? len : 1); // exactly len bytes, not NUL-terminated
  if (!body) return 0;
  if (len) memcpy(body, data + 1, len);
  rtr_limits lim = {.model_name = "SmolLM2-135M-Instruct", .n_ctx = 8192, .max_tokens_limit = 0, .max_n = 8,
                    .max_stop = 8, .n_vocab = 49152, .n_embd = 576};
  rtr_request r;
  memset(&r, 0x5a, sizeof r); // garbage in: the parser must set every field
  rtr_error e;
  memset(&e, 0, sizeof e);
  if ((responses ? rtr_request_parse_responses(body, len, &lim, &r, &e)
                 : rtr_request_parse(kind, body, len, &lim, &r, &e)) == 0) {
    if (r.kind != kind || r.api != (responses ? RTR_API_RESPONSES : RTR_API_CHAT)) abort();
    if (responses) responses_answers(&r);
    if (r.n < 1 || r.n > lim.max_n || r.n_stop < 0 || r.n_stop > lim.max_stop) abort();
    if (r.max_tokens < -1 || r.max_tokens > lim.n_ctx) abort();
    for (int i = 0; i < r.n_prompt_ids; i++)
      if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= lim.n_vocab) abort();
    if (r.n_prompts < 0 || r.n_prompts > (kind == RTR_EMBEDDING ? RTR_MAX_INPUTS : RTR_MAX_PROMPTS) ||
        ((kind == RTR_COMPLETION || kind == RTR_EMBEDDING) && r.n_prompts < 1))
      abort();
    for (int k = 0; k < r.n_prompts; k++) {
      const rtr_prompt *q = &r.prompts[k];
      if (!q->text == !q->ids) abort(); // text or ids, never both or neither
      if (q->text && !rtr_utf8_valid(q->text, q->len)) abort();
      for (int i = 0; i < q->n_ids; i++)
        if (q->ids[i] < 0 || q->ids[i] >= lim.n_vocab) abort();
    }
    for (int i = 0; i < r.n_msgs; i++)
      if (!r.msgs[i].role || !r.msgs[i].content || !rtr_utf8_valid(r.msgs[i].content, strlen(r.msgs[i].content)))
        abort();
    for (int i = 0; i < r.n_stop; i++)
      if (!r.stop[i] || !r.stop[i][0]) abort();
    if (r.prompt && !rtr_utf8_valid(r.prompt, r.prompt_len)) abort();
    if (r.msgs) { // the chat template renders what was accepted (ChatML; tools in the Hermes convention)
      mdl_chat_msg mm[64];
      const char *calls[64];
      size_t nm = r.n_msgs < 64 ? (size_t)r.n_msgs : 64;
      for (size_t i = 0; i < nm; i++) mm[i] = (mdl_chat_msg){r.msgs[i].role, r.msgs[i].content}, calls[i] = r.msgs[i].tool_calls;
      char *text = NULL, err[256];
      int rc = r.tools || r.has_tool_msgs ? mdl_chat_apply_tools(NULL, mm, calls, nm, r.tools, 1, &text, err, sizeof err)
                                          : mdl_chat_apply(NULL, mm, nm, 1, &text, err, sizeof err);
      if (rc == 0 && !text) abort();
      free(text);
    }
    // the body itself read as a model's output that may hold calls, in each format (models/chat.h)
    static const char *const fmt[] = {"<tool_call>", "[TOOL_CALLS]", "<|start_header_id|>\"parameters\""};
    for (int f = 0; f < 3 && r.tool_choice != RTR_TOOLS_OFF; f++) {
      const mdl_chat_tool_style *st = mdl_chat_tool_style_detect(fmt[f], strlen(fmt[f]));
      cJSON *calls = cJSON_CreateArray();
      size_t content_len = 0;
      int in_call = 0;
      if (st && calls) {
        int n = rtr_parse_tool_calls(&r, st, body, len, calls, &content_len);
        if (n > 0 && (cJSON_GetArraySize(calls) != n || content_len > len)) abort();
        if (rtr_tool_hold(st, body, len, 0, &in_call) > len) abort();
      }
      cJSON_Delete(calls);
    }
    (void)rtr_check_context(r.kind, r.n_prompt_ids, r.max_tokens, lim.n_ctx, &e);
    rtr_request_free(&r);
    rtr_request_free(&r); // freed twice: the second is a no-op on the zeroed struct
  } else {
    if (e.status < 400 || e.status > 599 || e.message[0] == 0) abort(); // an error is an HTTP error with a message
    char *j = rtr_error_json(&e);
    if (!j) abort();
    free(j);
  }
  (void)rtr_utf8_valid(body, len);
  free(body);
  return 0;
}
