// proto/request.h: a request's messages between the router and the workers: generate, token, done, error, cancel (and
// the sampled-token fields kv_first shares).
#ifndef DSERVE_PRT_REQUEST_H
#define DSERVE_PRT_REQUEST_H

#include "proto/proto.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Strings in decoded structs are borrowed from the decoded cJSON: they live as long as it does.
// Encoders return a new message (owned by the caller) or NULL on out of memory (err says so).

typedef struct prt_error {
  const char *id;      // (borrowed) the request's; NULL in a listener's refusal of a hello (protocol version)
  const char *message; // (borrowed) required
  const char *code;    // (borrowed) e.g. "worker_failure"; may be NULL
} prt_error;
cJSON *prt_error_encode(const prt_error *m, char *err, size_t errlen);
int prt_error_decode(const cJSON *j, prt_error *m, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct prt_cancel {
  const char *id; // (borrowed) required
} prt_cancel;
cJSON *prt_cancel_encode(const prt_cancel *m, char *err, size_t errlen);
int prt_cancel_decode(const cJSON *j, prt_cancel *m, char *err, size_t errlen) UTL_WARN_UNUSED;

// A sampled token as every message carries it (kv_first's fields, one entry of token's "logprobs"): "token",
// "logprob" (-inf travels as null, read as 0) and "top": [[id, logprob], ...].
#define PRT_MAX_TOP 20
typedef struct prt_top {
  int32_t token;
  float logprob;
} prt_top;
typedef struct prt_sampled {
  int32_t token;
  float logprob;
  prt_top top[PRT_MAX_TOP]; // (n_top); entries past PRT_MAX_TOP are dropped when read
  int n_top;
} prt_sampled;
int prt_sampled_add(cJSON *o, const prt_sampled *s) UTL_WARN_UNUSED; // the fields into o; 0, -1 on out of memory
int prt_sampled_read(const cJSON *o, const char *op, prt_sampled *s, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct prt_token {
  const char *id;        // (borrowed) required
  const char *text;      // (borrowed) the delta, may be empty; "" when absent
  int32_t *tokens;       // (owned) (n_tokens) ids in this delta; n_tokens -1 when the field is absent
  int n_tokens;
  prt_sampled *logprobs; // (owned) (n_logprobs); n_logprobs -1 when the field is absent (not asked for)
  int n_logprobs;
} prt_token;
cJSON *prt_token_encode(const prt_token *m, char *err, size_t errlen);
int prt_token_decode(const cJSON *j, prt_token *m, char *err, size_t errlen) UTL_WARN_UNUSED;
void prt_token_free(prt_token *m);

// token_batch (PRT_VERSION 3): the token messages of one engine step to one router, {"op": "token_batch", "items":
// [token...]}, each item a `token` message without its op, in the order they were produced. prt_tokens_new makes an
// empty batch; prt_tokens_add appends m (0, -1 on out of memory: the batch is as it was); prt_tokens_count says how
// many it holds.
cJSON *prt_tokens_new(void);
int prt_tokens_add(cJSON *batch, const prt_token *m) UTL_WARN_UNUSED;
int prt_tokens_count(const cJSON *batch);
// The items of a received batch (borrowed from j; decode each with prt_token_decode), or NULL with err when j has no
// array "items".
const cJSON *prt_tokens_items(const cJSON *j, char *err, size_t errlen);

typedef struct prt_done {
  const char *id;            // (borrowed) required
  const char *finish_reason; // (borrowed) "stop" / "length"; NULL when absent
  int prompt_tokens;         // -1 when absent (each count)
  int completion_tokens;
  int cached_tokens;
  double kv_bytes;           // -1 when absent
  double kv_ms;              // -1 when absent: the handoff's time, from the decode worker's receipt of the request to
                             // its holding the whole prompt's KV (the prefill worker's queue and compute included)
  double prefill_ms;         // -1 when absent: the prefill phase, from the prefill worker's receipt of the request to
                             // its first token (kv_first's prefill_ms; a colocated worker's own); sent when >= 0
  int64_t spec_drafts;       // speculative decoding on the decode worker: drafts verified, tokens they proposed and
  int64_t spec_drafted;      // tokens accepted (0 when absent; sent when spec_drafts > 0)
  int64_t spec_accepted;
  int cached_store_tokens;   // of cached_tokens, read from the shared KV tier (kvstore); 0 when absent (sent when > 0)
  // An embedding choice's pooled, normalised vector (generate's "embed"): "embedding", an array of n_embedding
  // numbers. Encode: embedding (borrowed) when n_embedding > 0. Decode: embedding_json (borrowed from the message,
  // every element checked to be a finite float32) and n_embedding; NULL and 0 when absent.
  const float *embedding;
  const cJSON *embedding_json;
  int n_embedding;
} prt_done;
cJSON *prt_done_encode(const prt_done *m, char *err, size_t errlen);
int prt_done_decode(const cJSON *j, prt_done *m, char *err, size_t errlen) UTL_WARN_UNUSED;

// generate's grammar (structured outputs and tool calls, docs/protocol.md): {"type": "json"} (any JSON object),
// {"type": "json_schema", "schema": {...}}, or {"type": "tool_calls", "tools": [{"name", "parameters"}...], "open",
// "close", "sep", "parallel"} (the chat template's call markup). schema and tools are JSON text: the encoder parses
// them into the message (text that is not JSON fails the encoding), the decoder prints what it read compactly (owned
// then, freed by prt_generate_free); open, close and sep are borrowed.
typedef enum prt_grammar_type {
  PRT_GRAMMAR_NONE = 0,
  PRT_GRAMMAR_JSON = 1,
  PRT_GRAMMAR_JSON_SCHEMA = 2,
  PRT_GRAMMAR_TOOL_CALLS = 3,
} prt_grammar_type;
typedef struct prt_grammar {
  prt_grammar_type type;
  char *schema;                   // json_schema: the schema (an object or a boolean); NULL: any JSON object
  char *tools;                    // tool_calls: the tools array
  const char *open, *close, *sep; // tool_calls: sep only with parallel
  int parallel;                   // tool_calls: one or more calls
  const char *args_key;           // tool_calls: the key of a call's arguments (Llama 3's "parameters"); NULL:
                                  // "arguments" (absent on the wire)
} prt_grammar;

// generate (router -> worker): one choice of a request. Decoding checks types and the protocol's ranges; what depends
// on the model (token ids < n_vocab, the context) is the worker's to check (worker/genreq.c). On failure the struct
// keeps the fields read before the bad one, read in this order: id, mode, decode, prefill (a refusal needs the id and
// the decode worker's name), and owns nothing.
typedef struct prt_bias {
  int32_t token;
  double bias; // finite
} prt_bias;
typedef struct prt_sampling {
  double temperature;                         // [0, 100]; 1 when absent
  int top_k;                                  // [-1, 2^30] (-1 and 0: off); 0 when absent
  double top_p, min_p;                        // [0, 1]; 1 and 0 when absent
  double presence_penalty, frequency_penalty; // [-2, 2]; 0 when absent
  double repetition_penalty;                  // [0, 100]; 1 when absent
  int has_seed;
  double seed;                                // any number (the worker reads it as an int64; see worker/genreq.c)
  int logprobs;                               // top-N in [0, 20], -1 (also when absent): none
  prt_bias *logit_bias;                       // (owned) (n_logit_bias)
  int n_logit_bias;
} prt_sampling;
typedef struct prt_generate {
  const char *id;          // (borrowed) required
  int32_t *prompt;         // (owned) (n_prompt) token ids; required (may be empty: the worker refuses it)
  int n_prompt;
  int max_tokens;          // [1, 2^30]; -1 when absent
  prt_sampling sampling;   // defaults when absent
  const char **stop;       // (owned array of borrowed strings) (n_stop)
  int n_stop;
  int32_t *stop_ids;       // (owned) (n_stop_ids)
  int n_stop_ids;
  int ignore_eos;          // a bool; 0 when absent
  int no_spec;             // "speculative": false (sent only then): decode without drafts; 0 when absent
  int deadline_ms;         // [0, 2^30] ms from receipt; 0 when absent (none)
  const char *mode;        // (borrowed) "local" / "prefill" / "decode" (the worker checks it); NULL when absent (local)
  const char *prefill;     // (borrowed) mode decode: the prefill worker; NULL when absent
  const char *decode;      // (borrowed) mode prefill: the decode worker; NULL when absent
  const char *prefix_peer; // (borrowed) prefix fetch hint, with prefix_blocks (both or neither); NULL when absent
  int prefix_blocks;       // [1, 2^30]; 0 when absent
  int resume;              // [0, 2^31); 0 when absent
  prt_grammar grammar;     // type PRT_GRAMMAR_NONE: none
  const char *embed;       // (borrowed) an embedding, not a generation: the pooling ("mean", "cls", "last") of the
                           // prompt's final hidden states, answered by one done with "embedding"; NULL when absent
  const char *traceparent; // (borrowed) the W3C trace context of the request's span (util/trace.h: the decoder checks
                           // it); NULL when absent: the request is not traced
} prt_generate;
// The encoder writes every sampling field, stop and stop_ids (maybe empty), and the optional fields that are set.
cJSON *prt_generate_encode(const prt_generate *m, char *err, size_t errlen);
int prt_generate_decode(const cJSON *j, prt_generate *m, char *err, size_t errlen) UTL_WARN_UNUSED;
void prt_generate_free(prt_generate *m);

#ifdef __cplusplus
}
#endif
#endif
