// models/llama.h: the Llama-family forward pass (llama, qwen2, qwen3, phi3, gemma2, gemma3, qwen3moe, Mixtral,
// deepseek2) over a batch of sequences and a paged KV cache.
#ifndef DSERVE_MDL_LLAMA_H
#define DSERVE_MDL_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/krn.h"
#include "models/gguf.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mdl_llama_cfg {
  char arch[32];        // "llama", "qwen2", ...
  int n_layer;
  int n_embd;
  int n_head, n_kv_head, head_dim;
  int n_ff;
  int n_vocab;
  int n_ctx_train;      // context length the model was trained with
  float rms_eps;
  float rope_theta;
  int rope_neox;        // 1 for NeoX-style rotation (qwen2), 0 for GGUF llama
  int tied_embeddings;  // output projection reuses token_embd
  // gemma2 and gemma3 (0 elsewhere): embeddings scaled by sqrt(n_embd), norms after attention and FFN, GELU FFN, and
  // sliding-window layers: layer l is local when swa_pattern > 0 and l % swa_pattern < swa_pattern - 1 (llama.cpp's
  // pattern; gemma3's 6: 5 local, 1 global; gemma2's 2: even layers local), with window n_swa and RoPE base
  // rope_theta_swa. gemma2 adds soft-capped attention scores; gemma3 has q/k norms.
  int gemma3;
  int gemma2;
  int n_swa;            // sliding window in tokens; 0: every layer global
  int swa_pattern;
  float rope_theta_swa;
  float attn_scale;     // softmax scale of q.k (1 / sqrt(head_dim) unless the architecture says otherwise)
  int qk_norm;          // 1: per-head RMS norms of q and k before RoPE (attn_q_norm, attn_k_norm: qwen3, qwen3moe,
                        // gemma3)
  float attn_softcap;   // > 0: attention scores s become cap * tanh(s / cap) (gemma2's attn_logit_softcapping)
  float final_softcap;  // > 0: logits soft-capped the same way (final_logit_softcapping: gemma2, gemma3 when given)
  int fused_qkv;        // layers whose q, k, v are row ranges of one attn_qkv matrix (phi3's): a count, for inspect
  int fused_gate_up;    // 1: gate and up are the two halves of ffn_up (phi3)
  int n_swa_ignored;    // phi3's sliding_window, which llama.cpp does not apply (nor do we); 0 when absent
  // RoPE scaling (mdl_rope_scaling): rope_scaled 0: plain RoPE; 1: the global layers turn pair i by pos *
  // rope_inv_freq[i] and scale by rope_mscale (a gemma3 model's sliding-window layers keep plain RoPE, as llama.cpp's)
  int rope_scaled;
  char rope_scaling[24];      // "none", "linear", "yarn", "longrope" (rope.scaling.type); "+freqs" appended with
                              // rope_freqs.weight, "+long" or "+short" with phi3's rope_factors_long / _short
  int rope_long;              // 1: rope_factors_long in use (mdl_llama_set_ctx), 0: short, -1: the model has none
  float rope_inv_freq[256];   // (head_dim / 2) when rope_scaled
  float rope_mscale;
  // Mixture of experts (models/llama_moe.c): qwen3moe, and llama with llama.expert_count (Mixtral). n_expert 0: a
  // dense FFN. Each token's router picks its n_expert_used best experts (softmax, top-k, weights renormalised to
  // sum 1: llama.cpp's build_moe_ffn for both), each an FFN of width n_ff_exp.
  int n_expert, n_expert_used, n_ff_exp;
  // deepseek2's MoE (llama.cpp's build_moe_ffn arguments; the others have softmax, norm 1, scale 0 and no groups):
  // p = softmax or sigmoid of the router's logits; the experts are chosen by p + exp_probs_b (the selection bias,
  // when the layer has one), within the n_group_used expert groups whose best two scores sum highest (when
  // n_expert_groups > 1); their weights are their p, divided by the sum when expert_weights_norm, times
  // expert_weights_scale (when not 0 or 1). n_expert_shared shared experts: one FFN of n_ff_exp * n_expert_shared
  // on every token, added. The first n_layer_dense_lead layers have a dense FFN of n_ff instead.
  int expert_gating;          // MDL_GATING_*
  int expert_weights_norm;
  float expert_weights_scale;
  int n_expert_groups, n_group_used;
  int n_expert_shared;
  int n_layer_dense_lead;
  int n_nextn_skipped;        // multi-token-prediction layers the file holds after the n_layer used (not loaded)
  // Multi-head latent attention (deepseek2; all 0 elsewhere). kv_lora_rank > 0: the KV cache holds, per position and
  // layer, ONE row of kv_lora_rank + n_rot values: the RMS-normed latent (kv_lora_rank) then the roped decoupled key
  // (n_rot), shared by every head (mdl_kv_parts 1, mdl_kv_width). Each head's query is head_dim = qk_nope + n_rot
  // values (n_rot of them roped); its value is head_dim_v values, up-projected from the latent.
  int kv_lora_rank;     // latent width (attention.kv_lora_rank); 0: not MLA
  int q_lora_rank;      // attention.q_lora_rank; 0: the query is one plain attn_q
  int n_rot;            // qk_rope_head_dim (rope.dimension_count): the roped tail of each query and the shared key
  int head_dim_v;       // v_head_dim: each head's value width after attn_v_b
} mdl_llama_cfg;

enum { MDL_GATING_SOFTMAX = 1, MDL_GATING_SIGMOID = 2 }; // llama.cpp's expert_gating_func values

// ---- RoPE scaling ----
// What a GGUF says (llama.cpp's keys, src/llama-model.cpp): <arch>.rope.scaling.type (none, linear, yarn; absent:
// linear), .rope.scaling.factor (or the older .rope.scale_linear; 0 or absent: 1), .rope.scaling.attn_factor (1),
// .rope.scaling.original_context_length (yarn; default the context length), and Llama 3.x's scaling, which
// llama.cpp's converter stores as per-pair frequency divisors in the tensor rope_freqs.weight.
enum { MDL_ROPE_NONE = 0, MDL_ROPE_LINEAR = 1, MDL_ROPE_YARN = 2 };
typedef struct mdl_rope_scaling {
  int type;                  // MDL_ROPE_*
  float factor;              // context extension factor (> 0; 1 = none)
  float attn_factor;         // multiplies the rotated values (1)
  int n_ctx_orig;            // yarn: the context the model was trained with before extension
  float beta_fast, beta_slow; // yarn: the ramp's ends in rotations over n_ctx_orig (llama.cpp's defaults: 32, 1)
  const float *freq_factors; // (n_dims / 2) divisors of each pair's frequency (rope_freqs.weight), or NULL
} mdl_rope_scaling;

// The angle of pair i at position p is p * inv_freq[i] (inv_freq(n_dims / 2)), and the rotated values are multiplied
// by *mscale. With b_i = base^(-2i / n_dims) / freq_factors[i] and s = 1 / factor (ggml's rope, read in
// ggml/src/ggml-cpu/ops.cpp rope_yarn and ggml.c ggml_rope_yarn_corr_dims; llama.cpp's context sets the YaRN
// attention factor in src/llama-context.cpp):
//   none:   inv_freq[i] = b_i;  linear: s * b_i;  both: *mscale = attn_factor
//   yarn:   inv_freq[i] = b_i * (s * (1 - r_i) + r_i), r_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), where
//           lo = max(0, floor(d(beta_fast))), hi = min(n_dims - 1, ceil(d(beta_slow))),
//           d(beta) = n_dims * ln(n_ctx_orig / (2 pi beta)) / (2 ln base);
//           *mscale = attn_factor * (factor > 1 ? 1 + 0.1 ln factor : 1)
void mdl_rope_freqs(const mdl_rope_scaling *s, int n_dims, float base, float *inv_freq, float *mscale);

// Sliding window of layer l: n_swa for a local layer, 0 for a global one (sees the whole context).
int mdl_llama_layer_window(const mdl_llama_cfg *c, int layer);

// The paged KV cache the forward pass reads and writes.
// Each layer stores P = mdl_kv_parts(cfg) parts per position, each a row of W = mdl_kv_width(cfg) values:
//   P 2 (every model but MLA): part 0 is K, part 1 is V, W = n_kv_head * head_dim (heads consecutive in the row);
//   P 1 (MLA, cfg.kv_lora_rank > 0): part 0 is the latent row, W = kv_lora_rank + n_rot (the normed latent, then the
//       roped key; attention reads the first kv_lora_rank values of the same row as its value).
// A row is krn_row_size(type, W) bytes (Q8_0: W / 32 blocks with their scales).
// Layout of base: (G, P, n_blocks, block_size, W) of type, where the model's layers are
// cut into n_groups groups of G = n_layer / n_groups layers each and layer l is slot layer_slot[l] of group
// layer_group[l]: each (slot, part, page) is one contiguous chunk of mdl_kv_chunk_bytes() = block_size rows, the unit
// kvxfer moves, and a page holds one group's P parts for block_size positions. Chunk (slot, part, page) is chunk
// number (slot * P + part) * n_blocks + page of base.
// n_groups 1 (or 0, zero-initialized: the same), the plain layout: slot = layer, one page is a whole block.
// More groups (mdl_kv_plan_groups: a model with sliding-window layers, whose groups are all-global or all-local) let
// a local group's pages go back to the pool once its window has passed them, while the global groups keep theirs.
// A sequence's block table then holds each block's group-0 page (the block's id); page_map says where its other
// groups' pages are.
typedef struct mdl_kv {
  void *base;       // (borrowed) backend memory (host for cpu, device for cuda)
  krn_type type;    // KRN_F16 or KRN_F32
  int n_blocks;     // pages (blocks, with one group)
  int block_size;   // tokens per block (16)
  int n_groups;     // layer groups (0 or 1: the plain layout; the fields below are then unused)
  const int16_t *layer_group, *layer_slot; // (n_layer) (borrowed) each layer's group and slot in it
  // (n_blocks, n_groups) (borrowed, host memory): page_map[b * n_groups + g] is the page holding group g of the block
  // whose id is b (b itself for g = 0), -1 when that group's page was given back (a local group whose window passed).
  const int32_t *page_map;
} mdl_kv;

// 0 when a KV cache of type (F16, F32, Q8_0) fits the model's head_dim and backend be's kernels (NULL: any); else -1
// with err naming the type. The pool, the forward pass and the one-machine commands all ask it.
int mdl_kv_type_check(const mdl_llama_cfg *c, const krn_backend *be, krn_type type, char *err,
                      size_t errlen) UTL_WARN_UNUSED;
int mdl_kv_parts(const mdl_llama_cfg *c); // parts per layer and position: 2 (K, V), or 1 (MLA's latent row)
int mdl_kv_width(const mdl_llama_cfg *c); // values in one part's row: n_kv_head * head_dim, or kv_lora_rank + n_rot
size_t mdl_kv_row_bytes(const mdl_llama_cfg *c, krn_type type); // one part's row: krn_row_size(type, width)
size_t mdl_kv_chunk_bytes(const mdl_llama_cfg *c, const mdl_kv *kv); // one (slot, part, page): block_size rows
// One block over all layers and parts: parts * n_layer * block_size rows (the bytes per token are this / block_size).
size_t mdl_kv_block_bytes(const mdl_llama_cfg *c, krn_type type, int block_size);
// Address of layer's chunk of part `part` (0 K, 1 V; or 0, the latent, when mdl_kv_parts is 1) in page `page` (the
// page of that layer's group).
void *mdl_kv_chunk(const mdl_llama_cfg *c, const mdl_kv *kv, int layer, int part, int page);
static inline int mdl_kv_groups(const mdl_kv *kv) { return kv->n_groups > 1 ? kv->n_groups : 1; }
static inline int mdl_kv_group_of(const mdl_kv *kv, int layer) { return kv->n_groups > 1 ? kv->layer_group[layer] : 0; }
// The page of group g of block id b, or -1 when given back.
static inline int32_t mdl_kv_page(const mdl_kv *kv, int32_t b, int g) {
  return kv->n_groups > 1 ? kv->page_map[(size_t)b * (size_t)kv->n_groups + (size_t)g] : b;
}

// How a model's layers are grouped for a paged cache whose local groups can give pages back: group and slot of each
// layer into group (n_layer) and slot (n_layer); returns the number of groups. Groups hold G = gcd(global layers,
// local layers) layers each, all global or all local; the global groups come first (group 0, whose page is the
// block's id, is global: every position keeps it). 1 (and the plain layout written) for a model without
// sliding-window layers or with only those.
int mdl_kv_plan_groups(const mdl_llama_cfg *c, int16_t *group, int16_t *slot);
// Sliding window of group g's layers (0: global) under the grouping of kv.
int mdl_kv_group_window(const mdl_llama_cfg *c, const mdl_kv *kv, int g);
// The first block a layer with sliding window `window` reads again once n_pos positions are computed: every later
// query is at a position >= n_pos and sees keys after pos - window only, so the blocks wholly before n_pos - window
// are never read again. 0 for a global layer (window 0) or a short sequence.
int mdl_kv_first_live_block(int window, int n_pos, int block_size);

// One sequence's share of a batch: n_tokens new tokens at positions [pos0, pos0 + n_tokens).
typedef struct mdl_seq {
  const int32_t *tokens;      // (n_tokens) (borrowed)
  int n_tokens;
  int pos0;                   // tokens already in the cache for this sequence
  const int32_t *block_table; // (n_blocks) covering positions [0, pos0 + n_tokens) (borrowed)
  int n_blocks;
  int want_logits;            // 1: return logits of the last new token; n > 1: of the last n new tokens (at most
                              // n_tokens: a draft's positions, verified in one step, docs/design.md); 0: none
} mdl_seq;

// Embeddings (docs/openai.md, /v1/embeddings): what mdl_llama_forward_pooled returns for one sequence besides (or
// instead of) logits: the final hidden states of its new tokens, after the output norm and before the LM head
// (llama.cpp's t_embd), pooled into embd (n_embd floats, host memory, borrowed). pool MEAN adds each new token's row
// to embd (zeroed first when the sequence's pos0 is 0, so one recomputed from its start begins again: the caller
// divides by the prompt's length, mdl_pool_finish); CLS copies the row of position 0; LAST the last new token's row
// (the prompt's last once its last chunk ran); 0: nothing.
typedef struct mdl_pool_out {
  int pool;   // MDL_POOL_*
  float *embd;
} mdl_pool_out;

// llama.cpp's llama_pooling_type values, as a GGUF's <arch>.pooling_type stores them.
enum { MDL_POOL_NONE = 0, MDL_POOL_MEAN = 1, MDL_POOL_CLS = 2, MDL_POOL_LAST = 3, MDL_POOL_RANK = 4 };
const char *mdl_pool_name(int pool); // "none", "mean", "cls", "last", "rank"; "?" otherwise
int mdl_pool_named(const char *name); // the MDL_POOL_* of a name, -1 for none of them
// The pooling a GGUF asks for: <arch>.pooling_type when present (-1 with err when it is not one of llama.cpp's
// values), else MDL_POOL_MEAN for a model without the key (a causal LM: docs/openai.md says how llama.cpp differs).
int mdl_gguf_pooling(const mdl_gguf *g, int *pool, char *err, size_t errlen) UTL_WARN_UNUSED;
// After a sequence's last chunk: embd (n) divided by n_tokens for MEAN, then scaled to unit L2 norm (a zero vector
// stays zero), as llama.cpp's common_embd_normalize with --embd-normalize 2.
void mdl_pool_finish(float *embd, int n, int pool, int n_tokens);

// Called once layer `layer`'s K and V writes for every sequence of the batch are queued on the model's
// krn_ctx (the prefill worker starts pushing that layer's blocks from here while the next layer computes).
// On a backend that runs ahead of the host (cuda) they may not have landed yet: a reader records a
// krn_event on the ctx here and waits for it (krn_event_wait) before touching those blocks, which waits
// for this layer's writes only, not for the rest of the queue. On cpu backends they have landed.
typedef void (*mdl_layer_done_fn)(void *arg, int layer);

typedef struct mdl_llama mdl_llama;

// Loads hyper-parameters and weights from g (borrowed; must outlive the model). On the cpu backends
// the weights are used in place from the mapping; on cuda they are uploaded once.
int mdl_llama_load(const mdl_gguf *g, krn_ctx *kc, mdl_llama **out, char *err, size_t errlen) UTL_WARN_UNUSED;

// What mdl_llama_load_opts may change about a load; zeroed (or NULL) is mdl_llama_load's.
typedef struct mdl_llama_opts {
  // 1: every weight not stored as F32 (F16, BF16, the quants) is dequantized to an F32 copy the model owns, by the
  // scalar reference's dequantization, and the forward pass multiplies by that: the same numbers as the file, with
  // none of the SIMD kernels' activation quantization. A reference for scoring (bench/accuracy.sh), not for serving:
  // 4 bytes a weight. cpu backends only (cuda: -1 with err).
  int f32_weights;
} mdl_llama_opts;
int mdl_llama_load_opts(const mdl_gguf *g, krn_ctx *kc, const mdl_llama_opts *o, mdl_llama **out, char *err,
                        size_t errlen) UTL_WARN_UNUSED;
void mdl_llama_free(mdl_llama *m);
// The context one sequence may reach, n_ctx (the model's context_length until set). It matters to models with
// LongRoPE factors (phi3's rope_factors_long / rope_factors_short): the long ones when n_ctx exceeds the original
// context (rope.scaling.original_context_length), else the short ones, as llama.cpp chooses by its n_ctx_seq. Not
// during a step. -1 with err when n_ctx < 1.
int mdl_llama_set_ctx(mdl_llama *m, int n_ctx, char *err, size_t errlen) UTL_WARN_UNUSED;
const mdl_llama_cfg *mdl_llama_config(const mdl_llama *m);

// Runs one step over n_seqs sequences (prefill chunks and single decode tokens mixed), writing K/V
// into kv and the logits of each sequence with want_logits into logits (mdl_logit_rows(seqs, n_seqs), n_vocab) (host
// memory, rows of sequences without want_logits are left untouched): sequence s's rows start at
// mdl_logit_row(seqs, s), one row, or want_logits rows in token order. A row's numbers do not depend on the step's other
// rows (the cpu kernels are batch-invariant: tests/models/test_llama.cc), which is what lets a draft be verified
// exactly. Not thread-safe per model: one call at a time.
static inline int mdl_seq_rows(const mdl_seq *q) { return q->want_logits > 1 ? q->want_logits : 1; }
static inline int mdl_logit_row(const mdl_seq *seqs, int s) {
  int r = 0;
  for (int i = 0; i < s; i++) r += mdl_seq_rows(&seqs[i]);
  return r;
}
static inline int mdl_logit_rows(const mdl_seq *seqs, int n_seqs) { return mdl_logit_row(seqs, n_seqs); }
int mdl_llama_forward(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seqs, int n_seqs, float *logits,
                      mdl_layer_done_fn on_layer, void *on_layer_arg, char *err, size_t errlen) UTL_WARN_UNUSED;
// mdl_llama_forward, and pools[s] (n_seqs; NULL: none) says what sequence s's hidden states give (mdl_pool_out).
int mdl_llama_forward_pooled(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seqs, int n_seqs,
                             const mdl_pool_out *pools, float *logits, mdl_layer_done_fn on_layer, void *on_layer_arg,
                             char *err, size_t errlen) UTL_WARN_UNUSED;

// One sequence's step that returns the logits of every new token, not only the last: (seq->n_tokens, n_vocab) into
// logits (host memory), row i for token i, whatever seq->want_logits says. For scoring text (perplexity), where
// each position's prediction counts; the caller bounds n_tokens, as the scratch holds n_tokens rows of n_vocab.
int mdl_llama_forward_all(mdl_llama *m, const mdl_kv *kv, const mdl_seq *seq, float *logits, char *err,
                          size_t errlen) UTL_WARN_UNUSED;

// Step graphs, on backends that have them (cuda): a pure decode step (one new token and logits per sequence,
// no layer callback) is recorded the second time its shape comes in a row (batch size, block-table width
// rounded up to a power of two) and replayed after, which saves the launch cost of its few hundred kernels.
// At most 8 shapes are kept; a scratch reallocation drops them. Off by default. on = 1 on a backend without
// graphs: -1 with err. The numbers can differ slightly from a plain step (the padded width changes how the
// attention kernel splits long contexts), never the batch's meaning. A mixture-of-experts model's steps always run
// plainly (each layer's routing is decided on the host mid-step, which a graph would freeze).
int mdl_llama_set_graphs(mdl_llama *m, int on, char *err, size_t errlen) UTL_WARN_UNUSED;
// Decode steps that ran from a graph, and graphs recorded, since the model was loaded.
void mdl_llama_graph_stats(const mdl_llama *m, long *replayed, long *recorded);

#ifdef __cplusplus
}
#endif
#endif
