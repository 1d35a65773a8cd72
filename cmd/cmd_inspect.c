// cmd/cmd_inspect.c: `dserve inspect` (what a GGUF holds) and `dserve tokenize` (a text's token ids).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmds.h"
#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "models/null.h"
#include "models/tokenizer.h"

// help: asked for (stdout, exit 0) or a bad command line (stderr, exit 2)
static int inspect_usage(const char *name, int help) {
  fprintf(help ? stdout : stderr,
          "usage: dserve %s MODEL.gguf [--tensors]\n"
          "  prints the GGUF's architecture, hyper-parameters, tokenizer and chat template, and the CPU kernels\n"
          "  `--kernels auto` runs on this machine\n"
          "  --tensors   also every tensor's name, type and shape\n",
          name);
  return help ? 0 : 2;
}

static int tokenize_usage(const char *name, int help) {
  fprintf(help ? stdout : stderr,
          "usage: dserve %s MODEL.gguf TEXT [--special]\n"
          "  prints TEXT's token ids under the GGUF's tokenizer\n"
          "  --special   parse special-token text (e.g. <|im_start|>) as those tokens (default: as plain text)\n",
          name);
  return help ? 0 : 2;
}

static void print_str(const mdl_gguf *g, const char *label, const char *key) {
  mdl_str s;
  if (mdl_gguf_get_str(g, key, &s) == 0) printf("%-22s %.*s\n", label, (int)(s.n > 200 ? 200 : s.n), s.p);
}

static void print_int(const mdl_gguf *g, const char *label, const char *arch, const char *suffix) {
  char key[160];
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  int64_t v;
  if (mdl_gguf_get_i64(g, key, &v) == 0) printf("%-22s %lld\n", label, (long long)v);
  else printf("%-22s (absent)\n", label);
}

static void print_float(const mdl_gguf *g, const char *label, const char *arch, const char *suffix) {
  char key[160];
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  float v;
  if (mdl_gguf_get_f32(g, key, &v) == 0) printf("%-22s %g\n", label, (double)v);
  else printf("%-22s (absent)\n", label);
}

// What the engine makes of the file (llama.cpp's defaults applied): each architecture's own fields, or why it would
// not load. The scalar table maps the weights in place, so this reads no tensor data beyond a few checks.
static void print_model(const mdl_gguf *g) {
  krn_ctx kc = {krn_cpu_scalar(), NULL, NULL};
  mdl_llama *m = NULL;
  char err[512];
  if (mdl_llama_load(g, &kc, &m, err, sizeof err) != 0) {
    printf("%-22s no: %s\n", "engine loads it", err);
    return;
  }
  const mdl_llama_cfg *c = mdl_llama_config(m);
  printf("%-22s yes: %d layers, head dim %d, %s RoPE, attention scale %g\n", "engine loads it", c->n_layer,
         c->head_dim, c->rope_neox ? "NeoX" : "GGUF-llama", (double)c->attn_scale);
  if (c->qk_norm) printf("%-22s per-head RMS norms of q and k before RoPE\n", "q/k norm");
  if (c->fused_qkv) printf("%-22s %d layers: q, k, v are row ranges of attn_qkv\n", "fused qkv", c->fused_qkv);
  if (c->fused_gate_up) printf("%-22s gate and up are the halves of ffn_up\n", "fused gate/up");
  if (c->gemma2 || c->gemma3) printf("%-22s after attention and after the FFN; embeddings times sqrt(%d)\n",
                                     "post norms", c->n_embd);
  if (c->attn_softcap > 0) printf("%-22s %g (scores s -> cap tanh(s / cap))\n", "attention soft-cap",
                                  (double)c->attn_softcap);
  if (c->final_softcap > 0) printf("%-22s %g\n", "final logit soft-cap", (double)c->final_softcap);
  if (c->n_swa > 0 && c->swa_pattern > 1) {
    int local = 0;
    for (int l = 0; l < c->n_layer; l++) local += mdl_llama_layer_window(c, l) > 0;
    printf("%-22s %d tokens on %d of %d layers (pattern %d: layer l is local when l %% %d < %d), local RoPE base "
           "%g\n", "sliding window", c->n_swa, local, c->n_layer, c->swa_pattern, c->swa_pattern, c->swa_pattern - 1,
           (double)c->rope_theta_swa);
  }
  if (c->n_swa_ignored) printf("%-22s %d, not applied (as llama.cpp)\n", "sliding window", c->n_swa_ignored);
  printf("%-22s %s%s", "rope scaling", c->rope_scaling, c->rope_scaled ? "" : " (plain RoPE)");
  if (c->rope_scaled) printf(", magnitude %g", (double)c->rope_mscale);
  if (c->rope_long >= 0)
    printf(", %s factors at the trained context %d (long above the original context)", c->rope_long ? "long" : "short",
           c->n_ctx_train);
  printf("\n");
  if (c->kv_lora_rank)
    printf("%-22s kv_lora_rank %d, q_lora_rank %d%s, rope dim %d; %d heads of key %d (%d roped), value %d\n",
           "latent attention", c->kv_lora_rank, c->q_lora_rank, c->q_lora_rank ? "" : " (plain attn_q)", c->n_rot,
           c->n_head, c->head_dim, c->n_rot, c->head_dim_v);
  if (c->n_expert)
    printf("%-22s %d shared, %s gating%s, weights %snormalised, scale %g, groups %d (%d used), first %d layers "
           "dense\n", "expert routing", c->n_expert_shared,
           c->expert_gating == MDL_GATING_SIGMOID ? "sigmoid" : "softmax",
           c->expert_gating == MDL_GATING_SIGMOID ? " (exp_probs_b: selection bias where present)" : "",
           c->expert_weights_norm ? "" : "not ", (double)(c->expert_weights_scale ? c->expert_weights_scale : 1),
           c->n_expert_groups, c->n_group_used, c->n_layer_dense_lead);
  if (c->n_nextn_skipped)
    printf("%-22s %d layers after the %d used, not loaded (drafting with them is not built)\n",
           "multi-token prediction", c->n_nextn_skipped, c->n_layer);
  printf("%-22s %zu bytes per token per layer in f16 (%d part%s of %d values: %s)\n", "KV cache",
         mdl_kv_block_bytes(c, KRN_F16, 1) / (size_t)c->n_layer, mdl_kv_parts(c), mdl_kv_parts(c) > 1 ? "s" : "",
         mdl_kv_width(c), mdl_kv_parts(c) > 1 ? "K and V" : "the latent and the roped key");
  mdl_llama_free(m);
}

int cmd_inspect(int argc, char **argv) {
  const char *path = NULL;
  int tensors = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--tensors")) tensors = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return inspect_usage(argv[0], 1);
    else if (argv[i][0] == '-' || path) return inspect_usage(argv[0], 0);
    else path = argv[i];
  }
  if (!path) return inspect_usage(argv[0], 0);
  mdl_gguf *g = NULL;
  char err[512];
  if (mdl_gguf_open(path, &g, err, sizeof err) != 0) {
    fprintf(stderr, "dserve %s: %s\n", argv[0], err);
    return 1;
  }
  mdl_str a;
  char arch[64] = "";
  if (mdl_gguf_get_str(g, "general.architecture", &a) == 0) snprintf(arch, sizeof arch, "%.*s", (int)(a.n > 63 ? 63 : a.n), a.p);
  printf("%-22s %s\n", "file", path);
  printf("%-22s %u\n", "gguf version", g->version);
  printf("%-22s %s\n", "architecture", arch[0] ? arch : "(absent)");
  print_str(g, "name", "general.name");
  print_str(g, "tokenizer", "tokenizer.ggml.model");
  print_str(g, "pre-tokenizer", "tokenizer.ggml.pre");
  if (arch[0]) {
    print_int(g, "context length", arch, "context_length");
    print_int(g, "embedding length", arch, "embedding_length");
    print_int(g, "block count", arch, "block_count");
    print_int(g, "head count", arch, "attention.head_count");
    print_int(g, "head count kv", arch, "attention.head_count_kv");
    print_int(g, "feed-forward length", arch, "feed_forward_length");
    char ek[160];
    snprintf(ek, sizeof ek, "%s.expert_count", arch);
    if (mdl_gguf_find(g, ek)) { // a mixture of experts (qwen3moe, Mixtral)
      print_int(g, "experts", arch, "expert_count");
      print_int(g, "experts used", arch, "expert_used_count");
      if (!strcmp(arch, "qwen3moe") || !strcmp(arch, "deepseek2"))
        print_int(g, "expert FFN length", arch, "expert_feed_forward_length");
      else printf("%-22s %s\n", "expert FFN length", "(the feed-forward length)");
    }
    print_float(g, "rope theta", arch, "rope.freq_base");
    print_int(g, "rope dims", arch, "rope.dimension_count");
    print_float(g, "rms eps", arch, "attention.layer_norm_rms_epsilon");
    print_model(g);
  }
  const mdl_gguf_kv *toks = mdl_gguf_find(g, "tokenizer.ggml.tokens");
  int64_t vs;
  char key[160];
  snprintf(key, sizeof key, "%s.vocab_size", arch);
  if (toks && toks->type == MDL_GGUF_ARR) printf("%-22s %llu\n", "vocab size", (unsigned long long)toks->arr_n);
  else if (mdl_gguf_get_i64(g, key, &vs) == 0) printf("%-22s %lld\n", "vocab size", (long long)vs);
  else printf("%-22s (absent)\n", "vocab size");
  printf("%-22s %llu\n", "metadata entries", (unsigned long long)g->n_kv);
  printf("%-22s %llu\n", "tensor count", (unsigned long long)g->n_tensors);
  uint64_t per_type[64] = {0}, bytes_type[64] = {0}, total = 0;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    int t = g->tensors[i].type;
    if (t >= 0 && t < 64) {
      per_type[t]++;
      bytes_type[t] += g->tensors[i].nbytes;
    }
    total += g->tensors[i].nbytes;
  }
  // the type mix on one line, most tensors first: "109 F32, 81 Q5_0, 27 Q4_K, ..."
  printf("%-22s", "types");
  int done[64] = {0};
  for (int shown = 0;; shown++) {
    int best = -1;
    for (int t = 0; t < 64; t++)
      if (per_type[t] && !done[t] && (best < 0 || per_type[t] > per_type[best])) best = t;
    if (best < 0) break;
    done[best] = 1;
    printf("%s %llu %s", shown ? "," : "", (unsigned long long)per_type[best], krn_type_name(best));
  }
  printf("\n");
  for (int t = 0; t < 64; t++)
    if (per_type[t])
      printf("  %-20s %llu tensors, %.2f MiB\n", krn_type_name(t), (unsigned long long)per_type[t], bytes_type[t] / 1048576.0);
  printf("%-22s %.2f MiB\n", "tensor data", total / 1048576.0);
  char kernels[160]; // what `--kernels auto` (or DSERVE_KERNELS) runs on this machine, and why not amx
  krn_describe(krn_cpu_best(), kernels, sizeof kernels);
  printf("%-22s %s\n", "kernels (auto)", kernels);
  if (tensors) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
      const mdl_gguf_tensor *t = &g->tensors[i];
      printf("%-40.*s %-5s [", (int)(t->name.n > 200 ? 200 : t->name.n), t->name.p, krn_type_name(t->type));
      for (int d = 0; d < t->n_dims; d++) printf("%s%lld", d ? ", " : "", (long long)t->ne[d]);
      printf("] %zu bytes @ %llu\n", t->nbytes, (unsigned long long)t->offset);
    }
  }
  mdl_gguf_close(g);
  return 0;
}

int cmd_tokenize(int argc, char **argv) {
  const char *path = NULL, *text = NULL;
  int special = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--special")) special = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return tokenize_usage(argv[0], 1);
    else if (!strcmp(argv[i], "--")) { // the text may start with '-'
      if (i + 1 < argc && !text && path) text = argv[++i];
      else return tokenize_usage(argv[0], 0);
    } else if (argv[i][0] == '-' && argv[i][1] != 0) return tokenize_usage(argv[0], 0);
    else if (!path) path = argv[i];
    else if (!text) text = argv[i];
    else return tokenize_usage(argv[0], 0);
  }
  if (!path || !text) return tokenize_usage(argv[0], 0);
  mdl_gguf *g = NULL;
  mdl_tok *t = NULL;
  char err[512];
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = 1;
  if (mdl_model_open(path, NULL, &g, err, sizeof err) != 0 || mdl_tok_load(g, &t, err, sizeof err) != 0 ||
      mdl_tok_encode(t, text, strlen(text), special, &ids, &n, err, sizeof err) != 0) {
    fprintf(stderr, "dserve %s: %s\n", argv[0], err);
    goto done;
  }
  for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
  printf("\n");
  rc = 0;
done:
  free(ids);
  mdl_tok_free(t);
  mdl_gguf_close(g);
  return rc;
}
