// models/ppl.c: perplexity and KL-divergence scoring, and the base log-probabilities file llama-perplexity writes.
#include "models/ppl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KLD_MAGIC "_logits_"

double mdl_ppl_nll(const float *logits, int n_vocab, int tok) {
  float mx = logits[0];
  for (int i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
  double sum = 0;
  for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - mx);
  return -((double)(logits[tok] - mx) - log(sum));
}

void mdl_ppl_mean(double sum, double sum2, long count, double *mean, double *err) {
  *mean = count > 0 ? sum / (double)count : 0;
  double var = count > 0 ? sum2 / (double)count - *mean * *mean : 0;
  *err = count > 1 && var > 0 ? sqrt(var / (double)(count - 1)) : 0;
}

int mdl_ppl_scored(int n_ctx) { return n_ctx - 1 - n_ctx / 2; }

size_t mdl_kld_row_len(int n_vocab) { return 2 * (((size_t)n_vocab + 1) / 2) + 4; }

double mdl_kld_encode_row(const float *logits, int n_vocab, int tok, uint16_t *row) {
  float mx = logits[0], mn = logits[0];
  for (int i = 1; i < n_vocab; i++) {
    mx = logits[i] > mx ? logits[i] : mx;
    mn = logits[i] < mn ? logits[i] : mn;
  }
  // the 16 bits cover the top 16 nats only: lower log-probs are stored as the floor, which the KL sum skips
  if (mn < mx - 16) mn = mx - 16;
  double sum = 0;
  for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - mx);
  const float lse = (float)log(sum), min_lp = mn - mx - lse, scale = (mx - mn) / 65535.0f;
  memcpy(row, &scale, sizeof scale);
  memcpy(row + 2, &min_lp, sizeof min_lp);
  uint16_t *q = row + 4;
  if (scale > 0) {
    const float inv = 1 / scale;
    for (int i = 0; i < n_vocab; i++) q[i] = logits[i] > mn ? (uint16_t)lrintf(inv * (logits[i] - mn)) : 0;
  } else {
    memset(q, 0, (size_t)n_vocab * sizeof *q);
  }
  for (size_t i = (size_t)n_vocab; i < mdl_kld_row_len(n_vocab) - 4; i++) q[i] = 0; // the pad to even
  return mx + lse - logits[tok];
}

void mdl_kld_close(mdl_kld_file *kf) {
  if (kf->f) fclose(kf->f);
  free(kf->tokens);
  memset(kf, 0, sizeof *kf);
}

int mdl_kld_open(const char *path, mdl_kld_file *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->f = fopen(path, "rb");
  if (!out->f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  char magic[8];
  uint32_t n_ctx;
  int32_t n_vocab, n_chunk;
  if (fread(magic, 1, 8, out->f) != 8 || memcmp(magic, KLD_MAGIC, 8) != 0) {
    snprintf(err, errlen, "%s is not a llama-perplexity logits file (no \"_logits_\" at its start)", path);
    goto fail;
  }
  if (fread(&n_ctx, 4, 1, out->f) != 1 || fread(&n_vocab, 4, 1, out->f) != 1 || fread(&n_chunk, 4, 1, out->f) != 1) {
    snprintf(err, errlen, "%s: header cut short", path);
    goto fail;
  }
  if (n_ctx < 4 || n_ctx > (1u << 20) || n_vocab < 2 || n_vocab > (1 << 24) || n_chunk < 1 || n_chunk > (1 << 20)) {
    snprintf(err, errlen, "%s: header out of range (n_ctx %u, n_vocab %d, n_chunk %d)", path, n_ctx, n_vocab, n_chunk);
    goto fail;
  }
  out->n_ctx = (int)n_ctx;
  out->n_vocab = n_vocab;
  out->n_chunk = n_chunk;
  {
    // the whole length is known from the header: a cut or padded file is refused here, not half-way through
    const uint64_t n_tok = (uint64_t)n_ctx * (uint64_t)n_chunk;
    const uint64_t want = 20 + 4 * n_tok + (uint64_t)n_chunk * (uint64_t)mdl_ppl_scored((int)n_ctx) *
                                               (uint64_t)mdl_kld_row_len(n_vocab) * 2;
    struct stat st;
    if (fstat(fileno(out->f), &st) != 0 || (uint64_t)st.st_size != want) {
      snprintf(err, errlen, "%s: %lld bytes, but its header (n_ctx %u, n_vocab %d, n_chunk %d) says %llu", path,
               (long long)st.st_size, n_ctx, n_vocab, n_chunk, (unsigned long long)want);
      goto fail;
    }
    out->tokens = malloc(n_tok * sizeof *out->tokens);
    if (!out->tokens) {
      snprintf(err, errlen, "out of memory for %llu tokens", (unsigned long long)n_tok);
      goto fail;
    }
    if (fread(out->tokens, 4, n_tok, out->f) != n_tok) {
      snprintf(err, errlen, "%s: tokens cut short", path);
      goto fail;
    }
    for (uint64_t i = 0; i < n_tok; i++)
      if (out->tokens[i] < 0 || out->tokens[i] >= n_vocab) {
        snprintf(err, errlen, "%s: token %llu is %d, outside the vocabulary of %d", path, (unsigned long long)i,
                 (int)out->tokens[i], n_vocab);
        goto fail;
      }
  }
  return 0;
fail:
  mdl_kld_close(out);
  return -1;
}

int mdl_kld_read_chunk(mdl_kld_file *kf, uint16_t *rows, char *err, size_t errlen) {
  if (kf->chunks_read >= kf->n_chunk) {
    snprintf(err, errlen, "logits file: all %d chunks read", kf->n_chunk);
    return -1;
  }
  const size_t n = (size_t)mdl_ppl_scored(kf->n_ctx) * mdl_kld_row_len(kf->n_vocab);
  if (fread(rows, 2, n, kf->f) != n) {
    snprintf(err, errlen, "logits file: chunk %d cut short", kf->chunks_read + 1);
    return -1;
  }
  kf->chunks_read++;
  return 0;
}

int mdl_kld_write_header(FILE *f, int n_ctx, int n_vocab, int n_chunk, const int32_t *tokens, char *err,
                         size_t errlen) {
  const uint32_t c = (uint32_t)n_ctx;
  const int32_t v = n_vocab, k = n_chunk;
  if (fwrite(KLD_MAGIC, 1, 8, f) != 8 || fwrite(&c, 4, 1, f) != 1 || fwrite(&v, 4, 1, f) != 1 ||
      fwrite(&k, 4, 1, f) != 1 || fwrite(tokens, 4, (size_t)n_ctx * n_chunk, f) != (size_t)n_ctx * n_chunk) {
    snprintf(err, errlen, "cannot write the logits file: %s", strerror(errno));
    return -1;
  }
  return 0;
}

double mdl_kld_compare(const float *logits, int n_vocab, const uint16_t *row, int tok, mdl_kld_acc *acc) {
  float mx = logits[0];
  int imax = 0;
  for (int i = 1; i < n_vocab; i++)
    if (logits[i] > mx) {
      mx = logits[i];
      imax = i;
    }
  double sum_exp = 0;
  for (int i = 0; i < n_vocab; i++) sum_exp += expf(logits[i] - mx);
  const float lse = (float)log(sum_exp);
  float scale, min_lp;
  memcpy(&scale, row, sizeof scale);
  memcpy(&min_lp, row + 2, sizeof min_lp);
  const uint16_t *q = row + 4;
  const float nll = mx + lse - logits[tok];
  const float nll_base = -(scale * q[tok] + min_lp);
  acc->sum_nll += nll;
  acc->sum_nll2 += (double)nll * nll;
  acc->sum_nll_base += nll_base;
  acc->sum_nll_base2 += (double)nll_base * nll_base;
  acc->sum_nll_nll_base += (double)nll * nll_base;
  const float log_z = mx + lse; // log p[i] = logits[i] - log_z
  double kld = 0;
  int imax_base = 0;
  float top_base = 0;
  for (int i = 0; i < n_vocab; i++) {
    const float lp_base = scale * q[i] + min_lp;
    if (i == 0 || lp_base > top_base) {
      top_base = lp_base;
      imax_base = i;
    }
    if (lp_base > -16.0f) kld += expf(lp_base) * (lp_base - logits[i] + log_z);
  }
  acc->sum_kld += kld;
  acc->sum_kld2 += kld * kld;
  acc->n_same_top += imax == imax_base;
  acc->count++;
  return kld;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

double mdl_ppl_percentile(const float *sorted, size_t n, double fraction) {
  if (n == 0) return 0;
  if (fraction <= 0) return sorted[0];
  if (fraction >= 1) return sorted[n - 1];
  double p = fraction * (double)(n - 1);
  size_t ip = (size_t)p;
  p -= (double)ip;
  return (1 - p) * sorted[ip] + p * sorted[ip + 1 < n ? ip + 1 : n - 1];
}

void mdl_kld_summarize(const mdl_kld_acc *acc, float *kld_values, size_t n, mdl_kld_summary *out) {
  memset(out, 0, sizeof *out);
  const long c = acc->count;
  double m, e, mb, eb;
  mdl_ppl_mean(acc->sum_nll, acc->sum_nll2, c, &m, &e);
  mdl_ppl_mean(acc->sum_nll_base, acc->sum_nll_base2, c, &mb, &eb);
  out->ppl = exp(m);
  out->ppl_err = out->ppl * e;
  out->ppl_base = exp(mb);
  out->ppl_base_err = out->ppl_base * eb;
  // the two NLL series are strongly correlated (same text): the ratio's error uses their covariance
  double cov = 0;
  if (c >= 10)
    cov = (acc->sum_nll_nll_base / (double)c - (acc->sum_nll / (double)c) * (acc->sum_nll_base / (double)c)) /
          (double)(c - 1);
  double v = e * e + eb * eb - 2 * cov;
  out->ppl_ratio = exp(m - mb);
  out->ppl_ratio_err = out->ppl_ratio * (v > 0 ? sqrt(v) : 0);
  mdl_ppl_mean(acc->sum_kld, acc->sum_kld2, c, &out->kld, &out->kld_err);
  if (c > 1) {
    out->same_top = (double)acc->n_same_top / (double)c;
    out->same_top_err = sqrt(out->same_top * (1 - out->same_top) / (double)(c - 1));
  } else if (c == 1) {
    out->same_top = (double)acc->n_same_top;
  }
  if (n > 0) {
    qsort(kld_values, n, sizeof *kld_values, cmp_float);
    out->kld_max = kld_values[n - 1];
    out->kld_p99 = mdl_ppl_percentile(kld_values, n, 0.99);
    out->kld_p999 = mdl_ppl_percentile(kld_values, n, 0.999);
    out->kld_median = n % 2 ? kld_values[n / 2] : 0.5 * (kld_values[n / 2] + kld_values[n / 2 - 1]);
  }
}
