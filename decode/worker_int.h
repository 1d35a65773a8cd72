// decode/worker_int.h: the decode worker's private state, shared by its files: worker.c (the loop, handoffs,
// streaming) and spec.c (speculative decoding's drafts and verdicts).
#ifndef DSERVE_DEC_WORKER_INT_H
#define DSERVE_DEC_WORKER_INT_H

#include <stdint.h>

#include "ctl/hub.h"
#include "decode/handoff.h"
#include "decode/stopstr.h"
#include "models/sampler.h"
#include "proto/request.h"
#include "models/tokenizer.h"
#include "spec/spec.h"
#include "worker/engine.h"
#include "worker/genreq.h"
#include "worker/shell.h"
#include "worker/spec.h"

typedef struct dec_seq {
  wrk_seq seq;           // tokens, cache progress, blocks (engine state)
  wrk_genreq req;        // what was asked (prompt, sampling, stops)
  ctl_peer *router;      // (owned reference) where tokens go
  int n_gen;
  mdl_sampler *sampler;  // (owned)
  spc_seq spc;           // its drafts' record and length (speculative decoding); drafts only when spec_on
  int spec_on;
  mdl_detok *detok;      // (owned)
  dec_stopstr stop;
  int64_t deadline_ms;   // monotonic; 0 = none
  // handoff (mode decode): the KV comes from a prefill worker
  dec_state state;       // where it is (decode/handoff.h); changed by dec_seq_to only
  int64_t hold_until_ms; // DEC_HELD: its blocks are released then at the latest
  mdl_sampled first;     // the prefill worker's first token
  int64_t handoff_deadline_ms; // DEC_WAIT_TABLE..DEC_GOT_FIRST: the queue bound, then (kv_started) the KV-arrival bound
  int64_t t_start_ms;
  double kv_bytes, kv_ms; // what the handoff moved and how long it took from the request
  int remote_cached;      // prompt tokens the prefill worker found in its prefix cache
  int remote_store;       // ... of which it read from the shared KV tier (kv_first cached_store_tokens)
  double prefill_ms;      // the prefill phase (kv_first's, or this worker's own for a local request); -1: unknown
  int64_t t_recv_us, t_first_us, t_run_us; // generate, kv_first arrived, generating began (spans; 0: not yet)
} dec_seq;

typedef struct dec_worker {
  wrk_shell sh;          // runtime, hub, signals; kvx (decode role: receives KV) and the staging mirror prefill
                         // workers write into when the pool is out of their reach
  wrk_engine eng;        // sequences' owner fields point at their dec_seq
  dec_seq **handoffs;    // (owned array) (n_handoffs) waiting for their KV
  int n_handoffs, cap_handoffs;
  dec_seq **held;        // (owned array) (n_held) given up while their prefill worker may still write: blocks kept
  int n_held, cap_held;
  ctl_peer **prefills;   // (owned references) (n_prefills) connected prefill workers
  int n_prefills, cap_prefills;
  uint64_t n_finished;
  wrk_grammars gram;     // response_format grammars (compiled, cached) and the token trie the samplers mask with
  spc_index *spec;       // (owned) finished requests' outputs that drafts come from; NULL: workers[].spec "off"
  // While a step samples (batching): its tokens, one `token_batch` message per router (docs/protocol.md), sent when the
  // step's sampling ends, or before a done or error to that router so that nothing overtakes a choice's tokens.
  struct dec_tok_batch {
    ctl_peer *to;        // (borrowed: a sequence's router, alive through the step)
    cJSON *msg;          // (owned) prt_tokens_new
  } *batches;            // (owned array) (n_batches)
  int n_batches, cap_batches;
  int batching;
} dec_worker;

#define OWNER(sq) ((dec_seq *)(sq)->owner)

// ---- lookup.c: finding requests (running, waiting, or in handoff) ----
typedef int (*dec_seq_pred)(const dec_seq *s, const void *arg);
// Calls fn on every request that matches; fn may drop it (the walk goes from the end of each list).
void dec__for_each(dec_worker *w, dec_seq_pred match, const void *arg, void (*fn)(dec_worker *, dec_seq *, void *),
                   void *fn_arg);
// A request's id, and when set the router it came from and the prefill worker it waits on.
typedef struct dec_id_key { const char *id; const ctl_peer *router; const char *prefill; } dec_id_key;
dec_seq *dec__find(dec_worker *w, const dec_id_key *k); // the first match, NULL for none
// Predicates for dec__for_each: arg a dec_id_key, a ctl_peer (the router), a prefill worker's name, none, and the
// time now (int64_t ms) against the request's deadline or its handoff's.
int dec__has_id(const dec_seq *s, const void *key);
int dec__routed_to(const dec_seq *s, const void *peer);
int dec__from_prefill(const dec_seq *s, const void *name);
int dec__any(const dec_seq *s, const void *arg);
int dec__past_deadline(const dec_seq *s, const void *now);
int dec__kv_overdue(const dec_seq *s, const void *now);

// ---- batch.c: a step's tokens, one token_batch message per router ----
// Sends the step's batch for router p (every router's, and empties the list, when p is NULL).
void dec__flush_tokens(dec_worker *w, ctl_peer *p);
// Adds tm to the step's batch for s's router: 0, or -1 (out of memory: the caller sends it alone).
int dec__batch_token(dec_worker *w, dec_seq *s, const prt_token *tm);

// ---- spec.c: speculative decoding (docs/design.md, "Speculative decoding") ----
// Opens the suffix index unless workers[].spec is "off" or the kernels are not batch-invariant (then w->spec stays
// NULL: nothing drafts). 0, or -1 with err.
int dec__spec_open(dec_worker *w, char *err, size_t errlen);
void dec__spec_seq_init(dec_worker *w, dec_seq *s); // spec_on and the draft record of a new request
// A draft for each decoding sequence that drafts, before the step is planned.
void dec__spec_propose(dec_worker *w);
// After the step, for a decode row: its draft taken out of its tokens, verified against its rows of logits, its
// record updated; the caller emits v's tokens in order, then wrk_engine_accept(v->accepted).
void dec__spec_verdict(dec_seq *s, const float *logits, int n_vocab, wrk_verdict *v);
// A finished request's prompt tail and output into the suffix index (drafts for later requests).
void dec__spec_remember(dec_worker *w, const dec_seq *s);

// ---- embed.c: embeddings (generate's "embed", docs/openai.md) ----
// Makes s an embedding: its steps pool the prompt's hidden states (wrk_seq.pool) and nothing is drafted. NULL, or
// what is wrong (out of memory).
const char *dec__embed_init(dec_worker *w, dec_seq *s);
// Once the whole prompt ran: the vector finished (mean's division, L2 norm) and sent in s's done; the caller drops s.
void dec__embed_answer(dec_worker *w, dec_seq *s);

#endif
