// models/null.h: the null model: no weights, a synthetic vocabulary of short words, deterministic logits and a
// fixed step time, behind the same mdl_llama functions as a real model (docs/design.md, "The null model").
#ifndef DSERVE_MDL_NULL_H
#define DSERVE_MDL_NULL_H

#include <stddef.h>
#include <stdint.h>

#include "models/gguf.h"
#include "models/llama.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MDL_NULL_NAME "null" // what a config's "model" (or `dserve serve`) says to get the null model; only this
#define MDL_NULL_LAYERS 4    // the KV cache's geometry: 4 layers of K and V ...
#define MDL_NULL_HEAD_DIM 64 // ... in kv heads of 64 values, so bytes per token (F16) are multiples of this:
#define MDL_NULL_KV_QUANTUM (MDL_NULL_LAYERS * 2 * MDL_NULL_HEAD_DIM * 2)
#define MDL_NULL_CTX 16384   // the context it serves

// What a worker's config says about the null model (workers[].null_*; their defaults are config's).
typedef struct mdl_null_opts {
  double step_ms;              // a forward step's time whatever its batch
  double prefill_us_per_token; // added for each token beyond the first of each sequence (prompt chunks, drafts)
  long kv_bytes_per_token;     // an F16 cache's bytes per token; a multiple of MDL_NULL_KV_QUANTUM
} mdl_null_opts;

// The null model as a GGUF in memory: general.architecture "null", its vocabulary and chat template (ChatML), and,
// when o is not NULL, its step times and KV geometry (what mdl_llama_load reads; a router needs the vocabulary
// only). 0, or -1 with err naming the option that is out of range.
int mdl_null_gguf(const mdl_null_opts *o, mdl_gguf **out, char *err, size_t errlen) UTL_WARN_UNUSED;

// What a config's model path names: MDL_NULL_NAME, exactly, is the null model (mdl_null_gguf with o); anything else
// is a GGUF file, and a file that fails to open is that error, never the null model.
int mdl_model_open(const char *path, const mdl_null_opts *o, mdl_gguf **out, char *err, size_t errlen) UTL_WARN_UNUSED;
static inline int mdl_is_null_path(const char *path) { return path && !__builtin_strcmp(path, MDL_NULL_NAME); }

// The clock a null model's steps wait on (tests give a fake one): now in microseconds, and a wait until t.
typedef struct mdl_null_clock {
  int64_t (*now_us)(void *arg);
  void (*sleep_until_us)(void *arg, int64_t t);
  void *arg;
} mdl_null_clock;
// Sets m's clock (c NULL: the real monotonic one). -1 with err when m is not the null model.
int mdl_null_set_clock(mdl_llama *m, const mdl_null_clock *c, char *err, size_t errlen) UTL_WARN_UNUSED;
// The step time in microseconds of a batch of n_seqs sequences (what a step waits for).
int64_t mdl_null_step_us(const mdl_llama *m, const mdl_seq *seqs, int n_seqs);
// The logit of vocabulary entry v for the token after `tok` at position pos: a word's in [0, 4), other tokens' in
// [-20, -16), whitespace (bytes and U+2581 alone) -30.
float mdl_null_logit(const mdl_llama *m, int pos, int32_t tok, int32_t v);

// For models/llama*.c: load fills m->cfg and m->nul from g (architecture "null"); forward is mdl_llama_forward's
// (all_rows: mdl_llama_forward_all's); free releases m->nul.
int mdl_null_load(mdl_llama *m, const mdl_gguf *g, char *err, size_t errlen);
int mdl_null_forward(mdl_llama *m, const mdl_seq *seqs, int n_seqs, float *logits, int all_rows,
                     mdl_layer_done_fn on_layer, void *on_layer_arg, char *err, size_t errlen);
void mdl_null_free(mdl_llama *m);

#ifdef __cplusplus
}
#endif
#endif
