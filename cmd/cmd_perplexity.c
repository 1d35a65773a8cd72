// cmd/cmd_perplexity.c: `dserve perplexity`: PPL of a text file and KL divergence against llama-perplexity's logits.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmds.h"
#include "cmd/model.h"
#include "models/ppl.h"
#include "models/tokenizer.h"

typedef struct ppl_opts {
  const char *model, *file, *kl_base, *save_logits, *kernels;
  int ctx;    // 0: 512, or the base file's with --kl-base
  int chunks; // -1: as many as the text holds
  int threads;
  cmd_model_load lo; // --f32-weights, --f32-kv
} ppl_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: dserve perplexity --model M.gguf --file TEXT [options]\n"
          "       dserve perplexity --model M.gguf --kl-base BASE [--file TEXT] [options]\n"
          "Scores TEXT as llama-perplexity does: the whole file is tokenized (BOS first when the model asks for one),\n"
          "cut into chunks of --ctx tokens, and the second half of each chunk is scored.\n"
          "options:\n"
          "  --ctx N             tokens per chunk (default 512; with --kl-base, the base file's)\n"
          "  --chunks K          score at most K chunks (default: all the text holds)\n"
          "  --threads N         cpu threads (default: number of CPUs)\n"
          "  --kernels K         " CMD_KERNELS " (default auto)\n"
          "  --kl-base BASE      the file `llama-perplexity --kl-divergence-base BASE` wrote: score its tokens and\n"
          "                      print the KL divergence from its log-probabilities; --file, if given, must tokenize\n"
          "                      to the same tokens (checked)\n"
          "  --save-logits OUT   write this run's log-probabilities in the same format (a base for a later run)\n"
          CMD_MODEL_LOAD_USAGE);
}

static int parse_args(int argc, char **argv, ppl_opts *o) {
  memset(o, 0, sizeof *o);
  o->chunks = -1;
  o->kernels = "auto";
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  o->threads = ncpu > 0 ? (int)ncpu : 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
    if (cmd_model_load_flag(a, &o->lo)) continue;
    if (i + 1 >= argc) {
      fprintf(stderr, "dserve perplexity: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    int bad = 0;
    if (!strcmp(a, "--model") || !strcmp(a, "-m")) o->model = v;
    else if (!strcmp(a, "--file") || !strcmp(a, "-f")) o->file = v;
    else if (!strcmp(a, "--kl-base")) o->kl_base = v;
    else if (!strcmp(a, "--save-logits")) o->save_logits = v;
    else if (!strcmp(a, "--kernels")) o->kernels = v;
    else if (!strcmp(a, "--kv-type")) bad = cmd_model_kv_type(v, &o->lo);
    else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) bad = cmd_parse_int(v, 4, 1 << 20, &o->ctx);
    else if (!strcmp(a, "--chunks")) bad = cmd_parse_int(v, 1, 1 << 20, &o->chunks);
    else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) bad = cmd_parse_int(v, 1, 1024, &o->threads);
    else {
      fprintf(stderr, "dserve perplexity: unknown option %s\n", a);
      return -1;
    }
    if (bad) {
      fprintf(stderr, "dserve perplexity: bad value '%s' for %s\n", v, a);
      return -1;
    }
  }
  if (cmd_model_opts_ok("perplexity", o->model, o->kernels)) return -1;
  if (!o->file && !o->kl_base) {
    fprintf(stderr, "dserve perplexity: --file is required (or --kl-base)\n");
    return -1;
  }
  if (o->kl_base && o->save_logits) {
    fprintf(stderr, "dserve perplexity: --kl-base and --save-logits do not go together (one reads a base, the "
                    "other writes one)\n");
    return -1;
  }
  return 0;
}

// The text's tokens as llama-perplexity makes them: the file less one trailing newline (its -f drops it), no special
// tokens parsed, BOS first when the model's add_bos_token says so.
static int tokenize_file(const mdl_tok *tok, const char *path, int32_t **ids, size_t *n_ids, char *err,
                         size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 65536 > cap) {
      cap = cap ? cap * 2 : 1 << 20;
      char *t = realloc(text, cap);
      if (!t) {
        free(text);
        fclose(f);
        snprintf(err, errlen, "out of memory reading %s", path);
        return -1;
      }
      text = t;
    }
    size_t n = fread(text + len, 1, cap - len, f);
    len += n;
    if (n == 0) break;
  }
  int rd_err = ferror(f);
  fclose(f);
  if (rd_err) {
    free(text);
    snprintf(err, errlen, "cannot read %s", path);
    return -1;
  }
  if (len > 0 && text[len - 1] == '\n') len--;
  int32_t *t = NULL;
  size_t n = 0;
  int rc = mdl_tok_encode(tok, text, len, 0, &t, &n, err, errlen);
  free(text);
  if (rc) return -1;
  if (mdl_tok_add_bos(tok) && mdl_tok_bos(tok) >= 0) {
    int32_t *b = realloc(t, (n + 1) * sizeof *t);
    if (!b) {
      free(t);
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    t = b;
    memmove(t + 1, t, n * sizeof *t);
    t[0] = mdl_tok_bos(tok);
    n++;
  }
  *ids = t;
  *n_ids = n;
  return 0;
}

// One piece of scored rows, shared with the pool's threads: each row is scored on its own, and the sums are taken
// in row order afterwards, so the figures do not depend on the thread count.
typedef struct score_job {
  const float *logits;    // (n, n_vocab)
  const int32_t *next;    // (n) the token each row predicts
  int n, n_vocab;
  const uint16_t *base;   // (n, row_len) with --kl-base, else NULL
  uint16_t *out;          // (n, row_len) with --save-logits, else NULL
  size_t row_len;
  double *nll;            // (n)
  mdl_kld_acc *acc;       // (n) with --kl-base
  float *kld;             // (n) with --kl-base
} score_job;

static void score_rows(void *arg, int ith, int nth) {
  score_job *j = arg;
  for (int r = ith; r < j->n; r += nth) {
    const float *l = j->logits + (size_t)r * j->n_vocab;
    if (j->base) {
      memset(&j->acc[r], 0, sizeof j->acc[r]);
      j->kld[r] = (float)mdl_kld_compare(l, j->n_vocab, j->base + (size_t)r * j->row_len, j->next[r], &j->acc[r]);
      j->nll[r] = j->acc[r].sum_nll;
    } else if (j->out) {
      j->nll[r] = mdl_kld_encode_row(l, j->n_vocab, j->next[r], j->out + (size_t)r * j->row_len);
    } else {
      j->nll[r] = mdl_ppl_nll(l, j->n_vocab, j->next[r]);
    }
  }
}

static void add_acc(mdl_kld_acc *a, const mdl_kld_acc *b) {
  a->sum_nll += b->sum_nll;
  a->sum_nll2 += b->sum_nll2;
  a->sum_nll_base += b->sum_nll_base;
  a->sum_nll_base2 += b->sum_nll_base2;
  a->sum_nll_nll_base += b->sum_nll_nll_base;
  a->sum_kld += b->sum_kld;
  a->sum_kld2 += b->sum_kld2;
  a->n_same_top += b->n_same_top;
  a->count += b->count;
}

// Rows of logits computed per forward step: bounded in bytes, since a 262k vocabulary makes each row 1 MiB.
static int rows_per_step(int n_vocab, int scored) {
  long r = (128L << 20) / ((long)n_vocab * 4);
  if (r < 1) r = 1;
  return r < scored ? (int)r : scored;
}

typedef struct ppl_run {
  int n_ctx, n_chunk, n_vocab;
  const int32_t *tokens; // (n_chunk * n_ctx)
  int32_t bos;           // put at each chunk's first position, -1 for none
  mdl_kld_file *base;    // or NULL
  FILE *save;            // or NULL
} ppl_run;

static int run(cmd_model *e, const ppl_run *p, char *err, size_t errlen) {
  const int n_ctx = p->n_ctx, first = n_ctx / 2, S = mdl_ppl_scored(n_ctx), V = p->n_vocab;
  const int step = rows_per_step(V, S), nb = (n_ctx + CMD_KV_BLOCK - 1) / CMD_KV_BLOCK;
  const size_t row_len = mdl_kld_row_len(V);
  int rc = -1;
  int32_t *bt = malloc((size_t)nb * sizeof *bt), *chunk = malloc((size_t)n_ctx * sizeof *chunk);
  float *logits = malloc((size_t)step * V * sizeof *logits);
  double *nll = malloc((size_t)step * sizeof *nll);
  uint16_t *rows = p->base || p->save ? malloc((size_t)S * row_len * sizeof *rows) : NULL;
  mdl_kld_acc *accs = p->base ? calloc((size_t)step, sizeof *accs) : NULL;
  float *kld = p->base ? malloc((size_t)S * p->n_chunk * sizeof *kld) : NULL;
  if (!bt || !chunk || !logits || !nll || ((p->base || p->save) && !rows) || (p->base && (!accs || !kld))) {
    snprintf(err, errlen, "out of memory (%d rows of %d logits)", step, V);
    goto done;
  }
  if (cmd_model_kv(e, nb, err, errlen)) goto done;
  for (int i = 0; i < nb; i++) bt[i] = i;
  double sum = 0, sum2 = 0;
  long count = 0;
  mdl_kld_acc acc = {0};
  fprintf(stderr, "perplexity: %d chunks of %d tokens, scoring %d per chunk (%s, %d threads, %s weights, %s KV)\n",
          p->n_chunk, n_ctx, S, e->kc.be->name, krn_pool_threads(e->pool), e->lo.f32_weights ? "F32" : "the file's",
          krn_type_name(e->kv.type));
  for (int c = 0; c < p->n_chunk; c++) {
    const int32_t *src = p->tokens + (size_t)c * n_ctx;
    memcpy(chunk, src, (size_t)n_ctx * sizeof *chunk);
    if (p->bos >= 0) chunk[0] = p->bos; // each chunk is a fresh sequence, as llama-perplexity makes it
    if (p->base && mdl_kld_read_chunk(p->base, rows, err, errlen)) goto done;
    // the context half: no logits, in steps of at most 512 tokens (the cache keeps them for the scored half)
    for (int at = 0; at < first;) {
      int n = first - at > 512 ? 512 : first - at;
      mdl_seq s = {chunk + at, n, at, bt, nb, 0};
      if (mdl_llama_forward(e->m, &e->kv, &s, 1, NULL, NULL, NULL, err, errlen)) goto done;
      at += n;
    }
    // the scored half: logits at positions first .. n_ctx-2, each predicting the token after it
    for (int j = 0; j < S;) {
      int n = S - j > step ? step : S - j;
      mdl_seq s = {chunk + first + j, n, first + j, bt, nb, 1};
      if (mdl_llama_forward_all(e->m, &e->kv, &s, logits, err, errlen)) goto done;
      score_job job = {logits, src + first + j + 1, n, V, p->base ? rows + (size_t)j * row_len : NULL,
                       p->save ? rows + (size_t)j * row_len : NULL, row_len, nll, accs,
                       kld ? kld + (size_t)c * S + j : NULL};
      krn_pool_run(e->pool, score_rows, &job);
      for (int r = 0; r < n; r++) {
        sum += nll[r];
        sum2 += nll[r] * nll[r];
        if (accs) add_acc(&acc, &accs[r]);
      }
      count += n;
      j += n;
    }
    if (p->save && fwrite(rows, 2, (size_t)S * row_len, p->save) != (size_t)S * row_len) {
      snprintf(err, errlen, "cannot write the logits file: %s", strerror(errno));
      goto done;
    }
    if (p->base) { // llama-perplexity --kl-divergence's running figures, and this chunk's own mean KLD
      double m, e_m, k, e_k, chunk_kld = 0;
      mdl_ppl_mean(acc.sum_nll, acc.sum_nll2, acc.count, &m, &e_m);
      mdl_ppl_mean(acc.sum_kld, acc.sum_kld2, acc.count, &k, &e_k);
      for (int i = 0; i < S; i++) chunk_kld += kld[(size_t)c * S + i];
      if (c == 0) printf("chunk        PPL   ln(PPL/PPL(base))    KLD (running)   KLD (chunk)   same top\n");
      printf("%5d %10.4f %12.5f %16.6f %13.6f %9.3f %%\n", c + 1, exp(m), m - acc.sum_nll_base / (double)acc.count, k,
             chunk_kld / S, 100.0 * (double)acc.n_same_top / (double)acc.count);
    } else {
      printf("[%d]%.4f,", c + 1, exp(sum / (double)count));
    }
    fflush(stdout);
  }
  if (!p->base) printf("\n");
  double mean, se;
  mdl_ppl_mean(sum, sum2, count, &mean, &se);
  printf("Final estimate: PPL = %.4f +/- %.5f\n", exp(mean), exp(mean) * se);
  if (p->base) {
    mdl_kld_summary s;
    mdl_kld_summarize(&acc, kld, (size_t)count, &s);
    printf("Mean PPL(base)                : %10.6f ± %10.6f\n", s.ppl_base, s.ppl_base_err);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f\n", s.ppl_ratio, s.ppl_ratio_err);
    printf("Mean    KLD: %10.6f ± %10.6f\n", s.kld, s.kld_err);
    printf("Maximum KLD: %10.6f\n", s.kld_max);
    printf("99.9%%   KLD: %10.6f\n", s.kld_p999);
    printf("99.0%%   KLD: %10.6f\n", s.kld_p99);
    printf("Median  KLD: %10.6f\n", s.kld_median);
    printf("Same top p: %6.3f ± %5.3f %%\n", 100 * s.same_top, 100 * s.same_top_err);
  }
  rc = 0;
done:
  free(bt);
  free(chunk);
  free(logits);
  free(nll);
  free(rows);
  free(accs);
  free(kld);
  return rc;
}

// With --kl-base and --file: are the text's tokens the ones the base run scored? A difference means the two
// tokenizers disagree; the KL figures then still compare like with like (both score the base's tokens).
static void check_tokens(const int32_t *ours, size_t n_ours, const mdl_kld_file *kf, int n_chunk, const char *file) {
  size_t n = (size_t)n_chunk * kf->n_ctx, diff = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    // the base file holds the text's own first token; the BOS goes in at scoring time
    if (i >= n_ours || ours[i] != kf->tokens[i]) {
      if (!diff) first = i;
      diff++;
    }
  }
  if (!diff) {
    printf("tokens: the first %zu tokens of %s agree with the base file\n", n, file);
    return;
  }
  printf("tokens: %zu of %zu differ from the base file, the first at position %zu (ours %d, base %d); scoring the "
         "base file's tokens\n",
         diff, n, first, first < n_ours ? (int)ours[first] : -1, (int)kf->tokens[first]);
}

int cmd_perplexity(int argc, char **argv) {
  ppl_opts o;
  int r = parse_args(argc, argv, &o);
  if (r != 0) {
    usage(r > 0 ? stdout : stderr);
    return r > 0 ? 0 : 2;
  }
  char err[512] = {0};
  cmd_model e;
  mdl_tok *tok = NULL;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  mdl_kld_file kf = {0};
  FILE *save = NULL;
  ppl_run p = {0};
  int rc = 1;
  if (cmd_model_open(&e, o.model, o.kernels, o.threads, &o.lo, err, sizeof err) != 0) {
    fprintf(stderr, "dserve perplexity: %s\n", err);
    return 1;
  }
  if (mdl_tok_load(e.g, &tok, err, sizeof err)) goto fail;
  if (o.file && tokenize_file(tok, o.file, &ids, &n_ids, err, sizeof err)) goto fail;
  for (size_t i = 0; i < n_ids; i++) // a vocabulary longer than the model's output: a token no logit scores
    if (ids[i] >= e.cfg->n_vocab) {
      snprintf(err, sizeof err, "%s: token %zu is %d, but the model has %d logits", o.file, i, (int)ids[i],
               e.cfg->n_vocab);
      goto fail;
    }
  p.n_vocab = e.cfg->n_vocab;
  p.bos = mdl_tok_add_bos(tok) ? mdl_tok_bos(tok) : -1;
  if (o.kl_base) {
    if (mdl_kld_open(o.kl_base, &kf, err, sizeof err)) goto fail;
    if (o.ctx && o.ctx != kf.n_ctx) {
      snprintf(err, sizeof err, "--ctx %d, but %s was made with %d (leave --ctx out)", o.ctx, o.kl_base, kf.n_ctx);
      goto fail;
    }
    if (kf.n_vocab != e.cfg->n_vocab) {
      snprintf(err, sizeof err, "%s has a vocabulary of %d, the model %d: not the same model", o.kl_base, kf.n_vocab,
               e.cfg->n_vocab);
      goto fail;
    }
    p.n_ctx = kf.n_ctx;
    p.n_chunk = o.chunks > 0 && o.chunks < kf.n_chunk ? o.chunks : kf.n_chunk;
    p.tokens = kf.tokens;
    p.base = &kf;
    if (ids) check_tokens(ids, n_ids, &kf, p.n_chunk, o.file);
  } else {
    p.n_ctx = o.ctx ? o.ctx : 512;
    if (n_ids < 2 * (size_t)p.n_ctx) { // as llama-perplexity: at least two chunks
      snprintf(err, sizeof err, "%s has %zu tokens; a context of %d needs at least %d", o.file, n_ids, p.n_ctx,
               2 * p.n_ctx);
      goto fail;
    }
    int max_chunks = (int)(n_ids / (size_t)p.n_ctx);
    p.n_chunk = o.chunks > 0 && o.chunks < max_chunks ? o.chunks : max_chunks;
    p.tokens = ids;
    fprintf(stderr, "perplexity: %s: %zu tokens\n", o.file, n_ids);
  }
  // a sequence reaches p.n_ctx positions: LongRoPE models (phi3) pick their factors by it, as llama-perplexity's -c
  if (mdl_llama_set_ctx(e.m, p.n_ctx, err, sizeof err)) goto fail;
  if (p.n_ctx > e.cfg->n_ctx_train)
    fprintf(stderr, "perplexity: warning: the model was trained on %d tokens of context, --ctx is %d\n",
            e.cfg->n_ctx_train, p.n_ctx);
  if (o.save_logits) {
    save = fopen(o.save_logits, "wb");
    if (!save) {
      snprintf(err, sizeof err, "cannot create %s: %s", o.save_logits, strerror(errno));
      goto fail;
    }
    if (mdl_kld_write_header(save, p.n_ctx, p.n_vocab, p.n_chunk, p.tokens, err, sizeof err)) goto fail;
    p.save = save;
  }
  if (run(&e, &p, err, sizeof err)) goto fail;
  if (save) {
    int bad = fclose(save) != 0;
    save = NULL;
    if (bad) {
      snprintf(err, sizeof err, "cannot write %s: %s", o.save_logits, strerror(errno));
      goto fail;
    }
  }
  rc = 0;
fail:
  if (rc) fprintf(stderr, "dserve perplexity: %s\n", err);
  if (save) { // a part-written base would only mislead a later run (and is refused by its length anyway)
    fclose(save);
    unlink(o.save_logits);
  }
  mdl_kld_close(&kf);
  free(ids);
  mdl_tok_free(tok);
  cmd_model_close(&e);
  return rc;
}
