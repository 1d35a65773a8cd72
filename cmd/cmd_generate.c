// cmd/cmd_generate.c: `dserve generate`: local text generation (and --bench: engine throughput) on this machine.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/bench_steps.h"
#include "cmd/cmds.h"
#include "cmd/model.h"
#include "cmd/roofline.h"
#include "models/chat.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "models/sampler.h"
#include "models/tokenizer.h"
#include "util/clock.h"

typedef struct gen_opts {
  const char *model, *prompt, *kernels;
  int n_gen, chat, threads, top_k, bench;
  int bench_pp, bench_tg, bench_batch, bench_ctx; // --bench: prompt tokens, decode steps, concurrent sequences, and
                                                  // the context each decoding sequence starts from
  int bench_chunks[16], n_bench_chunks, bench_reps; // --bench-chunks: prefill chunk sizes to time steps with
  float temp, top_p;
  uint64_t seed;
  cmd_model_load lo; // --f32-weights, --f32-kv, --kv-type
} gen_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: dserve generate --model M.gguf --prompt TEXT [options]\n"
          "       dserve generate --model M.gguf --bench [--bench-prompt N] [--bench-gen N] [--bench-batch N] [--bench-ctx N]\n"
          "       dserve generate --model M.gguf --bench-chunks C1,C2,... [--bench-batch N] [--bench-ctx N] [--bench-reps N]\n"
          "options:\n"
          "  -n N                tokens to generate (default 128)\n"
          "  --temp T            temperature, 0 = greedy (default 0)\n"
          "  --seed S            sampling seed (default 1)\n"
          "  --top-k K           (default 0 = off)\n"
          "  --top-p P           (default 1 = off)\n"
          "  --chat              wrap the prompt in the model's chat template\n"
          "  --threads N         cpu threads (default: number of CPUs)\n"
          "  --kernels K         scalar|avx2|avx2vnni|avx512|amx|auto|cuda (default auto)\n"
          "  --bench             time prompt processing and decode at batch 1 and batch B (no text)\n"
          "  --bench-ctx N       the context (tokens) each decoding sequence starts from (default 16; untimed)\n"
          "  --bench-chunks L    time engine steps instead: batch decode rows at context N with one prefill chunk of each\n"
          "                      size in L (1..4096, at most 16), at a prompt's start and after an N-token prefix\n"
          "  --bench-reps N      forwards per timed step of --bench-chunks, the median reported (default 5)\n"
          CMD_MODEL_LOAD_USAGE);
}

static int parse_float(const char *s, double lo, double hi, float *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
  *out = (float)v;
  return 0;
}

// --bench-chunks: a comma-separated list of 1..16 chunk sizes, each 1..4096 (an empty item is an error).
static int parse_chunks(const char *v, gen_opts *o) {
  o->n_bench_chunks = 0;
  for (const char *p = v;; p++) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char item[16];
    if (o->n_bench_chunks == 16 || len == 0 || len >= sizeof item) return -1;
    memcpy(item, p, len);
    item[len] = 0;
    if (cmd_parse_int(item, 1, 4096, &o->bench_chunks[o->n_bench_chunks++])) return -1;
    if (!end) return 0;
    p = end;
  }
}

static int parse_args(int argc, char **argv, gen_opts *o) {
  memset(o, 0, sizeof *o);
  o->n_gen = 128;
  o->top_p = 1;
  o->seed = 1;
  o->kernels = "auto";
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  o->threads = ncpu > 0 ? (int)ncpu : 1;
  o->bench_pp = 512;
  o->bench_tg = 128;
  o->bench_batch = 8;
  o->bench_ctx = 16;
  o->bench_reps = 5;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--chat")) { o->chat = 1; continue; }
    if (!strcmp(a, "--bench")) { o->bench = 1; continue; }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
    if (cmd_model_load_flag(a, &o->lo)) continue;
    if (i + 1 >= argc) {
      fprintf(stderr, "dserve generate: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    int bad = 0;
    if (!strcmp(a, "--model") || !strcmp(a, "-m")) o->model = v;
    else if (!strcmp(a, "--prompt") || !strcmp(a, "-p")) o->prompt = v;
    else if (!strcmp(a, "--kernels")) o->kernels = v;
    else if (!strcmp(a, "--kv-type")) bad = cmd_model_kv_type(v, &o->lo);
    else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) bad = cmd_parse_int(v, 0, 1 << 20, &o->n_gen);
    else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) bad = cmd_parse_int(v, 1, 1024, &o->threads);
    else if (!strcmp(a, "--top-k")) bad = cmd_parse_int(v, 0, 1 << 30, &o->top_k);
    else if (!strcmp(a, "--temp")) bad = parse_float(v, 0, 100, &o->temp);
    else if (!strcmp(a, "--top-p")) bad = parse_float(v, 1e-6, 1, &o->top_p);
    else if (!strcmp(a, "--bench-prompt")) bad = cmd_parse_int(v, 1, 1 << 16, &o->bench_pp);
    else if (!strcmp(a, "--bench-gen")) bad = cmd_parse_int(v, 1, 1 << 16, &o->bench_tg);
    else if (!strcmp(a, "--bench-batch")) bad = cmd_parse_int(v, 1, 256, &o->bench_batch);
    else if (!strcmp(a, "--bench-ctx")) bad = cmd_parse_int(v, 1, 1 << 16, &o->bench_ctx);
    else if (!strcmp(a, "--bench-reps")) bad = cmd_parse_int(v, 1, 64, &o->bench_reps);
    else if (!strcmp(a, "--bench-chunks")) bad = parse_chunks(v, o);
    else if (!strcmp(a, "--seed")) {
      char *end;
      errno = 0;
      unsigned long long s = strtoull(v, &end, 10);
      bad = errno || end == v || *end || v[0] == '-';
      o->seed = s;
    } else {
      fprintf(stderr, "dserve generate: unknown option %s\n", a);
      return -1;
    }
    if (bad) {
      fprintf(stderr, "dserve generate: bad value '%s' for %s\n", v, a);
      return -1;
    }
  }
  if (cmd_model_opts_ok("generate", o->model, o->kernels)) return -1;
  if (!o->prompt && !o->bench && !o->n_bench_chunks) {
    fprintf(stderr, "dserve generate: --prompt is required (or --bench)\n");
    return -1;
  }
  return 0;
}

// --bench: prompt processing of bench_pp tokens, then bench_tg greedy decode steps at batch 1 and at batch B.
// Every sequence starts from a 16-token prompt, as llama.cpp's side in bench/engine_bench.sh does.
static int run_bench(cmd_model *e, const gen_opts *o, char *err, size_t errlen) {
  int V = e->cfg->n_vocab, B = o->bench_batch, PP = o->bench_pp, TG = o->bench_tg, P0 = o->bench_ctx;
  int per_seq = (P0 + TG + CMD_KV_BLOCK - 1) / CMD_KV_BLOCK + 1, pp_blocks = (PP + CMD_KV_BLOCK - 1) / CMD_KV_BLOCK;
  int nb = (B + 1) * per_seq + pp_blocks;
  if (cmd_model_kv(e, nb, err, errlen)) return -1;
  int32_t *bt = malloc((size_t)nb * sizeof *bt), *toks = malloc((size_t)(PP > P0 * B ? PP : P0 * B) * sizeof *toks);
  float *logits = malloc((size_t)B * V * sizeof *logits);
  mdl_seq *ms = calloc((size_t)B, sizeof *ms);
  int32_t *last = malloc((size_t)B * sizeof *last);
  int rc = -1;
  if (!bt || !toks || !logits || !ms || !last) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  for (int i = 0; i < nb; i++) bt[i] = i;
  uint64_t x = 12345;
  for (int i = 0; i < (PP > P0 * B ? PP : P0 * B); i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    // past the first 256 ids (byte and control tokens) when the vocabulary has more
    toks[i] = V > 256 ? (int32_t)((x >> 33) % (uint64_t)(V - 256)) + 256 : (int32_t)((x >> 33) % (uint64_t)V);
  }
  // prompt processing: best of 3
  double best_pp = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    mdl_seq s = {toks, PP, 0, bt, pp_blocks, 1};
    double t0 = utl_now_s();
    if (mdl_llama_forward(e->m, &e->kv, &s, 1, logits, NULL, NULL, err, errlen)) goto done;
    double t = utl_now_s() - t0;
    if (t < best_pp) best_pp = t;
  }
  printf("pp%d tok/s: %.2f\n", PP, PP / best_pp);
  fflush(stdout);
  // the read bandwidth, probed before and after the decode runs (the best of both counts): on a shared machine it
  // moved by a third between the two on some runs, which put batch 1 above a roofline probed after it alone
  double gbps = e->pool ? cmd_read_gbps(e->pool, (size_t)1 << 30) : 0;
  // decode at batch 1 and at batch B
  int sizes[2] = {1, B};
  for (int k = 0; k < 2; k++) {
    int n = sizes[k];
    // each sequence's context (untimed), in steps of at most 512 tokens, then its first token
    for (int s = 0; s < n; s++)
      for (int at = 0; at < P0; at += 512) {
        int len = P0 - at < 512 ? P0 - at : 512;
        mdl_seq c = {toks + s * P0 + at, len, at, bt + pp_blocks + s * per_seq, per_seq, 1};
        if (mdl_llama_forward(e->m, &e->kv, &c, 1, logits + (size_t)s * V, NULL, NULL, err, errlen)) goto done;
      }
    for (int s = 0; s < n; s++) last[s] = mdl_argmax(logits + (size_t)s * V, V);
    double t0 = utl_now_s(), c0 = utl_cpu_s();
    for (int step = 0; step < TG; step++) {
      for (int s = 0; s < n; s++) ms[s] = (mdl_seq){&last[s], 1, P0 + step, bt + pp_blocks + s * per_seq, per_seq, 1};
      if (mdl_llama_forward(e->m, &e->kv, ms, n, logits, NULL, NULL, err, errlen)) goto done;
      for (int s = 0; s < n; s++) last[s] = mdl_argmax(logits + (size_t)s * V, V);
    }
    double t = utl_now_s() - t0, cpu = utl_cpu_s() - c0;
    // with --bench-ctx, also per second of the threads' own CPU time: what a shared machine's other load leaves out
    if (P0 != 16)
      printf("tg%d batch %d ctx %d tok/s: %.2f (per thread-second of CPU: %.2f)\n", TG, n, P0, (double)TG * n / t,
             (double)TG * n / (cpu / krn_pool_threads(e->pool)));
    else printf("tg%d batch %d tok/s: %.2f\n", TG, n, (double)TG * n / t);
    fflush(stdout);
  }
  // the roofline: a decode step reads every weight once, so batch-1 decode can go no faster than bandwidth / bytes
  if (e->pool) {
    double after = cmd_read_gbps(e->pool, (size_t)1 << 30);
    if (after > gbps) gbps = after;
    size_t wb = cmd_decode_weight_bytes(e->g);
    printf("memory read GB/s: %.2f (%d threads)\n", gbps, krn_pool_threads(e->pool));
    printf("decode weight MiB per step: %.2f\n", wb / 1048576.0);
    printf("roofline batch 1 tok/s: %.2f\n", wb ? gbps * 1e9 / (double)wb : 0.0);
  }
  rc = 0;
done:
  free(bt);
  free(toks);
  free(logits);
  free(ms);
  free(last);
  return rc;
}

static int run_generate(cmd_model *e, const gen_opts *o, char *err, size_t errlen) {
  int rc = -1, V = e->cfg->n_vocab;
  mdl_tok *tok = NULL;
  mdl_sampler *smp = NULL;
  mdl_detok *dt = NULL;
  char *text = NULL;
  int32_t *ids = NULL, *bt = NULL;
  float *logits = NULL;
  size_t n_ids = 0;
  if (mdl_tok_load(e->g, &tok, err, errlen)) goto done;
  const char *src = o->prompt;
  size_t src_len = strlen(src);
  if (o->chat) {
    mdl_chat_msg msg = {"user", o->prompt};
    if (mdl_chat_apply(e->g, &msg, 1, 1, &text, err, errlen)) goto done;
    src = text;
    src_len = strlen(text);
  }
  if (mdl_tok_encode(tok, src, src_len, o->chat, &ids, &n_ids, err, errlen)) goto done;
  if (!o->chat && mdl_tok_add_bos(tok) && mdl_tok_bos(tok) >= 0) { // as the router does for a plain prompt
    int32_t *b = realloc(ids, (n_ids + 1) * sizeof *ids);
    if (!b) {
      snprintf(err, errlen, "out of memory");
      goto done;
    }
    ids = b;
    memmove(ids + 1, ids, n_ids * sizeof *ids);
    ids[0] = mdl_tok_bos(tok);
    n_ids++;
  }
  if (n_ids == 0) {
    snprintf(err, errlen, "the prompt has no tokens");
    goto done;
  }
  int n_pos = (int)n_ids + o->n_gen + 1, nb = (n_pos + CMD_KV_BLOCK - 1) / CMD_KV_BLOCK;
  if (cmd_model_kv(e, nb, err, errlen)) goto done;
  bt = malloc((size_t)nb * sizeof *bt);
  logits = malloc((size_t)V * sizeof *logits);
  if (!bt || !logits) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  for (int i = 0; i < nb; i++) bt[i] = i;
  mdl_sampling sp = {.temperature = o->temp, .top_k = o->top_k, .top_p = o->top_p, .repetition_penalty = 1,
                     .seed = o->seed};
  if (mdl_sampler_new(&sp, V, ids, (int)n_ids, &smp, err, errlen)) goto done;
  if (mdl_detok_new(tok, &dt, err, errlen)) goto done;
  // prefill in chunks of 512
  double t0 = utl_now_s();
  for (int at = 0; at < (int)n_ids;) {
    int n = (int)n_ids - at > 512 ? 512 : (int)n_ids - at;
    mdl_seq s = {ids + at, n, at, bt, nb, at + n == (int)n_ids};
    if (mdl_llama_forward(e->m, &e->kv, &s, 1, logits, NULL, NULL, err, errlen)) goto done;
    at += n;
  }
  double t1 = utl_now_s();
  int pos = (int)n_ids, n_done = 0;
  for (; n_done < o->n_gen; n_done++) {
    mdl_sampled sm;
    mdl_sampler_sample(smp, logits, &sm);
    if (mdl_tok_is_eog(tok, sm.token)) break;
    const char *piece;
    size_t plen;
    mdl_detok_push(dt, sm.token, &piece, &plen);
    fwrite(piece, 1, plen, stdout);
    fflush(stdout);
    if (n_done + 1 == o->n_gen) {
      n_done++;
      break;
    }
    int32_t t = sm.token;
    mdl_seq s = {&t, 1, pos++, bt, nb, 1};
    if (mdl_llama_forward(e->m, &e->kv, &s, 1, logits, NULL, NULL, err, errlen)) goto done;
  }
  {
    const char *piece;
    size_t plen;
    mdl_detok_flush(dt, &piece, &plen);
    fwrite(piece, 1, plen, stdout);
  }
  printf("\n");
  fflush(stdout); // the text's end before the timings on stderr
  double t2 = utl_now_s();
  fprintf(stderr, "prompt: %zu tokens, %.2f tok/s; generation: %d tokens, %.2f tok/s (%s, %d threads)\n", n_ids,
          (double)n_ids / (t1 - t0), n_done, n_done > 0 ? n_done / (t2 - t1) : 0.0, e->kc.be->name, o->threads);
  rc = 0;
done:
  mdl_detok_free(dt);
  mdl_sampler_free(smp);
  mdl_tok_free(tok);
  free(text);
  free(ids);
  free(bt);
  free(logits);
  return rc;
}

int cmd_generate(int argc, char **argv) {
  gen_opts o;
  int r = parse_args(argc, argv, &o);
  if (r != 0) {
    usage(r > 0 ? stdout : stderr);
    return r > 0 ? 0 : 2;
  }
  char err[512] = {0};
  cmd_model e;
  if (cmd_model_open(&e, o.model, o.kernels, o.threads, &o.lo, err, sizeof err) != 0) {
    fprintf(stderr, "dserve generate: %s\n", err);
    return 1;
  }
  int rc = o.n_bench_chunks ? cmd_bench_steps(&e, o.bench_chunks, o.n_bench_chunks, o.bench_batch, o.bench_ctx,
                                               o.bench_reps, err, sizeof err)
           : o.bench      ? run_bench(&e, &o, err, sizeof err)
                          : run_generate(&e, &o, err, sizeof err);
  if (rc != 0) fprintf(stderr, "dserve generate: %s\n", err);
  cmd_model_close(&e);
  return rc ? 1 : 0;
}
