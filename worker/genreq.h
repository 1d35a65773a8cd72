// worker/genreq.h: a `generate` request as every worker role checks and keeps it, and the replies they share.
#ifndef DSERVE_WRK_GENREQ_H
#define DSERVE_WRK_GENREQ_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ctl/hub.h"
#include "models/grammar.h"
#include "models/sampler.h"
#include "models/tokenizer.h"
#include "proto/request.h"
#include "util/err.h"
#include "util/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

// Compiled grammars (response_format's and tool calls') by their text (the workers' LRU of WRK_GRAMMAR_CACHE), and
// the vocabulary's token trie they mask with, built on the first request that needs it. One per worker, used from its
// event loop.
#define WRK_GRAMMAR_CACHE 16
typedef struct wrk_grammar_slot {
  char *key;          // (owned) "" for any JSON object, "S" + a schema's JSON text, "T" + a tool_calls grammar's
  mdl_grammar *g;     // (owned reference)
  uint64_t used;
} wrk_grammar_slot;

typedef struct wrk_grammars {
  const mdl_tok *tok;        // (borrowed) the runtime's tokenizer
  mdl_grammar_vocab *vocab;  // (owned) its trie, NULL until needed
  wrk_grammar_slot slot[WRK_GRAMMAR_CACHE]; // (n)
  int n;
  uint64_t tick;
} wrk_grammars;

void wrk_grammars_init(wrk_grammars *c, const mdl_tok *tok);
// Frees the cache; requests still holding a grammar keep their reference, but the trie goes: call it after every
// request is freed.
void wrk_grammars_fini(wrk_grammars *c);

typedef struct wrk_genreq {
  char id[96];
  int32_t *prompt;       // (owned) (n_prompt)
  int n_prompt;
  int max_tokens;        // capped to the context
  int n_resume;          // the last n_resume prompt tokens are this request's own output so far (a stream moved here
                         // from another worker): they count as generated for penalties, the RNG, stop strings and
                         // max_tokens; 0..n_prompt-1
  mdl_sampling sampling; // bias points into bias below
  mdl_bias *bias;        // (owned) (sampling.n_bias)
  int n_logprobs;        // -1 = none, else top-N (0..20)
  char **stop;           // (owned) (n_stop) stop strings
  int n_stop;
  int32_t *stop_ids;     // (owned) (n_stop_ids)
  int n_stop_ids;
  int ignore_eos;        // 0 whenever there is a grammar: it decides where the output ends
  int no_spec;           // 1: the client asked for no speculative decoding ("speculative": false)
  int embed;             // an embedding (generate's "embed"): MDL_POOL_MEAN, _CLS or _LAST; 0: a generation
  mdl_grammar *grammar;  // (owned reference) the `grammar` field's, or NULL; sampling.grammar points at it and
                         // sampling.grammar_vocab at the worker's trie (borrowed from its wrk_grammars)
  int deadline_ms;       // 0 = none
  char mode[16];         // "local", "prefill", "decode"
  char prefill[64];      // mode decode: the prefill worker that computes the KV
  char decode[64];       // mode prefill: the decode worker that receives it
  int traced;            // the router traces the request: the worker's spans are children of trace (worker/trace.h)
  utl_trace_ctx trace;   // the router's request span (the generate's traceparent)
} wrk_genreq;

// Checks g (a generate message decoded by proto's prt_generate_decode) against the model's vocabulary and context
// and copies it into req; a `grammar` field is compiled through gc (a worker's cache; NULL: a grammar is refused). On
// failure fills code ("invalid_request" / "context_length_exceeded") and err, and req holds nothing to free.
int wrk_genreq_parse(const prt_generate *g, int n_vocab, int n_ctx, wrk_grammars *gc, wrk_genreq *req, char *code,
                     size_t code_len, char *err, size_t errlen) UTL_WARN_UNUSED;
void wrk_genreq_free(wrk_genreq *req);
// Replays req's resumed tokens into a sampler made from req's whole prompt, as if it had sampled them: the RNG
// advances by their draws and the penalties count them as generated.
void wrk_genreq_resume_sampler(const wrk_genreq *req, mdl_sampler *s);

// {"op":"error","id","message","code"} to a peer.
void wrk_send_error(ctl_peer *to, const char *id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// SIGTERM / SIGINT handling without handlers or globals: the signals are blocked in every thread
// and one thread waits for them, then sets stop and wakes the hub.
typedef struct wrk_signals {
  sigset_t set;
  atomic_int stop;
  ctl_hub *hub; // (borrowed) woken when a signal arrives
} wrk_signals;
void wrk_signals_block(wrk_signals *s);                  // first thing in main, before any thread starts
int wrk_signals_start(wrk_signals *s, ctl_hub *hub) UTL_WARN_UNUSED;     // 0, or -1 when the thread cannot start

#ifdef __cplusplus
}
#endif
#endif
