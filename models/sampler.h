// models/sampler.h: turning logits into the next token: grammar mask, penalties, bias, filters, seeded sampling,
// logprobs.
#ifndef DSERVE_MDL_SAMPLER_H
#define DSERVE_MDL_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "models/grammar.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mdl_bias { int32_t token; float bias; } mdl_bias;

// OpenAI / vLLM semantics. temperature 0 = greedy. Neutral values: top_k 0, top_p 1, min_p 0,
// penalties 0 (presence, frequency) and 1 (repetition).
typedef struct mdl_sampling {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  float presence_penalty;   // -2..2, once per distinct token generated
  float frequency_penalty;  // -2..2, times the count of the token generated
  float repetition_penalty; // > 0, over prompt and generated tokens (llama.cpp / HF style)
  uint64_t seed;            // the request's RNG seed (same seed -> same output): output position i's random draw
                            // depends only on (seed, i), never on how many tokens a step produced
  const mdl_bias *bias;     // (borrowed) (n_bias)
  int n_bias;
  int n_logprobs;           // top-N logprobs to report, 0..20
  int no_logprob;           // 1: the chosen token's logprob is not wanted either (out->logprob is then 0): the
                            // log-softmax over the vocabulary is skipped
  // Structured outputs: only tokens that continue a sentence of grammar are sampled, end-of-generation only where
  // one may end (models/grammar.h). Both borrowed and must outlive the sampler; NULL grammar: unconstrained.
  const mdl_grammar *grammar;
  const mdl_grammar_vocab *grammar_vocab; // the vocabulary's token trie (n_vocab tokens), needed with grammar
} mdl_sampling;

typedef struct mdl_logprob { int32_t token; float logprob; } mdl_logprob;

typedef struct mdl_sampled {
  int32_t token;
  float logprob;              // log-softmax of the raw logits (before penalties and filters), as OpenAI reports
  mdl_logprob top[20];        // (n_top) the most likely tokens by the same measure
  int n_top;
} mdl_sampled;

typedef struct mdl_sampler mdl_sampler;

// prompt (n_prompt) seeds the repetition penalty's history. n_vocab sizes the scratch space.
int mdl_sampler_new(const mdl_sampling *s, int n_vocab, const int32_t *prompt, int n_prompt, mdl_sampler **out,
                    char *err, size_t errlen) UTL_WARN_UNUSED;
void mdl_sampler_free(mdl_sampler *s);
// Index of the largest of v(n), ties to the lowest index; NaN never wins (0 when nothing beats -inf).
int mdl_argmax(const float *v, int n);
// Picks the next token from logits (n_vocab) (not modified) and records it in the history. With a grammar, the
// tokens it does not allow are masked out first (before bias, penalties and filters) and the token advances it.
void mdl_sampler_sample(mdl_sampler *s, const float *logits, mdl_sampled *out);
// Records a token another process sampled for this request (the prefill worker's first token), as if
// mdl_sampler_sample had picked it: penalties see it, the next draw is the next position's, the grammar takes it.
void mdl_sampler_accept(mdl_sampler *s, int32_t token);
// 1 when the request has a grammar and nothing but the end can follow: the output is complete (the caller ends the
// choice with finish_reason "stop"), or a token the grammar refused was accepted.
int mdl_sampler_grammar_done(const mdl_sampler *s);
// 1 when the grammar proved too costly to follow (mdl_grammar_matcher_too_costly): the last token is not the
// grammar's, and the caller fails the request (code grammar_too_complex) instead of emitting it.
int mdl_sampler_grammar_too_costly(const mdl_sampler *s);

#ifdef __cplusplus
}
#endif
#endif
