// models/ppl.h: scoring text as llama.cpp's llama-perplexity does: per-token NLL, PPL ± error, and KL divergence
// against the base log-probabilities file that `llama-perplexity --kl-divergence-base FILE` writes.
#ifndef DSERVE_MDL_PPL_H
#define DSERVE_MDL_PPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// -log softmax(logits)[tok] over n_vocab logits: the max in float, the sum of expf in double, as llama-perplexity
// computes it, so that the two agree to the last digits on the same logits.
double mdl_ppl_nll(const float *logits, int n_vocab, int tok);

// Mean of count samples from their sum and sum of squares, and the standard error of that mean (0 when count < 2
// or the variance rounds to <= 0). llama-perplexity's PPL ± is exp(mean) ± exp(mean) * err of the per-token NLL.
void mdl_ppl_mean(double sum, double sum2, long count, double *mean, double *err);

// Positions of one chunk of n_ctx tokens that are scored: the logits at positions n_ctx/2 .. n_ctx-2, each
// predicting the next token (the first half is context only, so every prediction has at least n_ctx/2 tokens
// before it).
int mdl_ppl_scored(int n_ctx);

// ---- the base log-probabilities file ----
// Layout (little-endian): "_logits_", u32 n_ctx, i32 n_vocab, i32 n_chunk, i32 tokens (n_chunk * n_ctx), then for
// each chunk mdl_ppl_scored(n_ctx) rows of mdl_kld_row_len(n_vocab) u16: a row starts with two floats (scale,
// min_log_prob) in its first 4 u16s, then one u16 q per vocabulary entry: log p = scale * q + min_log_prob
// (q = 0 covers everything at or below min_log_prob, which is at most 16 below the top logit).

// u16s in one row: 4 for the two floats, then n_vocab rounded up to even.
size_t mdl_kld_row_len(int n_vocab);

// Encodes logits (n_vocab) into row (mdl_kld_row_len) as llama-perplexity writes it, and returns -log p[tok]
// (for --save-logits, and to make base rows in tests).
double mdl_kld_encode_row(const float *logits, int n_vocab, int tok, uint16_t *row);

typedef struct mdl_kld_file {
  FILE *f;              // (owned) positioned at the next chunk's rows
  int n_ctx, n_vocab, n_chunk;
  int32_t *tokens;      // (owned) (n_chunk * n_ctx) the tokens the base run scored, chunk after chunk
  int chunks_read;
} mdl_kld_file;

// Opens and checks a base file: magic, sizes in range, the file's length exactly what its header says, every token
// inside the vocabulary. -1 with err naming the file and what is wrong.
int mdl_kld_open(const char *path, mdl_kld_file *out, char *err, size_t errlen) UTL_WARN_UNUSED;
void mdl_kld_close(mdl_kld_file *kf);
// Reads the next chunk's rows into rows (mdl_ppl_scored(n_ctx), mdl_kld_row_len(n_vocab)).
int mdl_kld_read_chunk(mdl_kld_file *kf, uint16_t *rows, char *err, size_t errlen) UTL_WARN_UNUSED;

// Writes a base file of the same layout (--save-logits): the header and tokens first, then each chunk's rows.
int mdl_kld_write_header(FILE *f, int n_ctx, int n_vocab, int n_chunk, const int32_t *tokens, char *err,
                         size_t errlen) UTL_WARN_UNUSED;

// Sums over the positions compared so far (llama-perplexity's kl_divergence_result, less the Δp figures).
typedef struct mdl_kld_acc {
  double sum_nll, sum_nll2;           // -log p[next token] under the model
  double sum_nll_base, sum_nll_base2; // ... under the base
  double sum_nll_nll_base;            // their product, for the covariance of the two
  double sum_kld, sum_kld2;           // KL(base || model) per position
  long n_same_top;                    // positions where both put the highest probability on the same token
  long count;
} mdl_kld_acc;

// Compares one position: model logits (n_vocab) against a base row, tok being the next token. Adds to acc and
// returns this position's KL(base || model). As llama-perplexity does, base entries with log p <= -16 are left out
// of the sum (they add less than 1e-6 each).
double mdl_kld_compare(const float *logits, int n_vocab, const uint16_t *row, int tok, mdl_kld_acc *acc);

// The summary llama-perplexity --kl-divergence prints, from acc and the per-position KL values (n, sorted here).
typedef struct mdl_kld_summary {
  double ppl, ppl_err;            // the model's
  double ppl_base, ppl_base_err;  // the base's (from the stored log-probs)
  double ppl_ratio, ppl_ratio_err; // ppl / ppl_base
  double kld, kld_err;            // mean KL divergence
  double kld_max, kld_p99, kld_p999, kld_median;
  double same_top, same_top_err;  // fraction in [0, 1]
} mdl_kld_summary;
void mdl_kld_summarize(const mdl_kld_acc *acc, float *kld_values, size_t n, mdl_kld_summary *out);

// Linear interpolation between the two closest of n sorted values (fraction in [0, 1]), as llama-perplexity's.
double mdl_ppl_percentile(const float *sorted, size_t n, double fraction);

#ifdef __cplusplus
}
#endif
#endif
