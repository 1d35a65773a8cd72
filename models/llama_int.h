// models/llama_int.h: the model's struct, shared by llama_load.c (which fills it) and llama.c (which runs it).
#ifndef DSERVE_MDL_LLAMA_INT_H
#define DSERVE_MDL_LLAMA_INT_H

#include "models/llama.h"

typedef struct mdl_w {  // one weight matrix or vector
  const void *data;     // backend memory: the mapping (cpu) or an uploaded copy (cuda, owned by the model)
  krn_type type;
} mdl_w;

typedef struct mdl_layer {
  mdl_w attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, wg, wu, wd; // bq/bk/bv data NULL when absent
  mdl_w q_norm, k_norm;                                              // qwen3, gemma3
  mdl_w post_attn_norm, post_ffn_norm;                               // gemma2, gemma3
  // mixture of experts (cfg.n_expert > 0; wg, wu, wd unused): the router (n_expert, n_embd) and the experts,
  // gate/up (n_expert, n_ff_exp, n_embd) and down (n_expert, n_embd, n_ff_exp): expert e's matrix is the contiguous
  // slice e of the 3-D tensor, a plain matrix to the matmul kernels
  mdl_w ffn_gate_inp, gate_exps, up_exps, down_exps;
  const float *probs_b;       // (n_expert) host memory: deepseek2's selection bias exp_probs_b, or NULL
  mdl_w gate_shexp, up_shexp, down_shexp; // shared experts (n_ff_exp * n_expert_shared wide), data NULL when none
  // MLA (llama_mla.c): wq_a (q_lora_rank, n_embd), q_a_norm, wq_b (n_head * head_dim, q_lora_rank), or wq alone;
  // wkv_a (kv_lora_rank + n_rot, n_embd), kv_a_norm (kv_lora_rank); head h's k_b (kv_lora_rank, qk_nope) at wk_b +
  // h * kv_lora_rank rows, and its v_b (head_dim_v, kv_lora_rank) at wv_b + h * vb_stride rows
  mdl_w wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b;
  int vb_stride;
} mdl_layer;

// MLA's step scratch (llama_mla.c), host memory (the cpu backends only), grown with the step's tokens.
typedef struct mdl_mla_scratch {
  int cap;
  float *qa;   // (cap, q_lora_rank)
  float *kv;   // (cap, kv_lora_rank + n_rot) the cache rows: normed latent, roped key
  float *qw;   // (cap, n_head, kv_lora_rank + n_rot) absorbed queries
  float *ow;   // (cap, n_head, kv_lora_rank) attention's output: each head's weighted latent
  float *g1;   // (n_head, cap, max(qk_nope, n_rot, kv_lora_rank)) per-head gathers
  float *g2;   // (n_head, cap, max(kv_lora_rank, head_dim_v))
  float *o;    // (cap, n_head * head_dim_v)
} mdl_mla_scratch;

// A mixture-of-experts step's scratch (llama_moe.c), grown with the step's tokens and kept across steps.
typedef struct mdl_moe_scratch {
  int cap;                  // tokens the buffers hold (each with n_expert_used slots)
  float *logits;            // (cap, n_expert) the router's logits
  float *xe, *ye;           // (cap * n_used, n_embd) the tokens gathered by expert, and their experts' outputs
  float *ge, *ue;           // (cap * n_used, n_ff_exp) gate and up (swiglu in ge)
  int32_t *d_gather;        // (cap * n_used) the token row of each gathered row
  int32_t *d_rows;          // (cap, n_used) each token's slots: their rows in ye
  float *d_w;               // (cap, n_used) and their weights
  float *h_logits;          // host (cap, n_expert)
  int32_t *h_gather, *h_rows, *h_sel; // host copies; h_sel (cap, n_used): each slot's expert
  float *h_w;               // host (cap, n_used)
  int32_t *h_count, *h_off; // host (n_expert): tokens routed to each expert, and its first row in xe
} mdl_moe_scratch;

// llama_w.c, the tensor loader of llama_load.c and llama_moe.c: tensor name of shape (ne0, ne1, ne2) (ne1 0: a
// vector; ne2 0: a matrix), type and size checked, into out (uploaded, or dequantized with f32_weights). optional:
// absent is no error.
int mdl_llama_get_w(mdl_llama *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int optional, int f32_only,
                    mdl_w *out, char *err, size_t errlen);

// llama_moe.c. Load: the expert keys of arch into m->cfg (n_expert stays 0 for a dense model; -1 with err for bad
// counts or an old per-expert file); the router and experts of layer l.
int mdl_moe_load_cfg(mdl_llama *m, const char *arch, char *err, size_t errlen);
int mdl_moe_load_layer(mdl_llama *m, int l, char *err, size_t errlen);
// Step: mdl_moe_reserve sizes the scratch for T tokens (0, or -1 with err); mdl_moe_ffn then runs the routed FFN of
// layer L on m->xb (T rows, normed) and adds its output into m->x.
int mdl_moe_reserve(mdl_llama *m, int T, char *err, size_t errlen);
void mdl_moe_ffn(mdl_llama *m, const mdl_layer *L, int T);
void mdl_moe_free(mdl_llama *m);
// The shared experts of layer L (n_expert_shared > 0) on m->xb (T rows), added into m->x.
void mdl_moe_shared(mdl_llama *m, const mdl_layer *L, int T);

// llama_mla.c (deepseek2). mdl_mla_load_cfg: the MLA keys into m->cfg (after the common ones; head_dim and n_kv_head
// become the MLA's); mdl_mla_load_layer: layer l's attention weights; mdl_mla_attn: its attention on m->x (T rows,
// positions and block tables in a), added into m->x, its cache rows written; 0, or -1 with err.
int mdl_mla_load_cfg(mdl_llama *m, const char *arch, char *err, size_t errlen);
// After the RoPE scaling is read: deepseek2's softmax scale and RoPE magnitude (YaRN's correction) into m->cfg.
int mdl_mla_scales(mdl_llama *m, const char *arch, char *err, size_t errlen);
int mdl_mla_load_layer(mdl_llama *m, int l, char *err, size_t errlen);
int mdl_mla_reserve(mdl_llama *m, int T, char *err, size_t errlen);
void mdl_mla_attn(mdl_llama *m, const mdl_layer *L, const mdl_kv *kv, krn_attn_args *a, int l,
                  mdl_layer_done_fn on_layer, void *on_layer_arg);
void mdl_mla_free(mdl_llama *m);

// The shape of a decode step that a recorded graph replays (its buffers are the model's, fixed until they grow).
typedef struct mdl_graph_key {
  int n_seqs, max_blocks;  // one token and one logits row per sequence; block-table width
  const void *kv_base;
  int kv_type, kv_block_size, kv_n_blocks, kv_n_groups;
} mdl_graph_key;

#define MDL_GRAPHS 8 // recorded decode steps kept (round robin)

typedef struct mdl_null mdl_null;

struct mdl_llama {
  mdl_llama_cfg cfg;
  mdl_null *nul;       // (owned) the null model's state (architecture "null", models/null.c), else NULL
  const mdl_gguf *g;   // (borrowed)
  krn_ctx *kc;         // (borrowed)
  int on_host;         // 1: weights used in place from the mapping
  int f32_weights;     // 1: non-F32 weights dequantized into uploads at load (mdl_llama_opts)
  mdl_w tok_embd, output_norm, output;
  mdl_layer *layers;   // (owned) (n_layer)
  void **uploads;      // (owned) (n_uploads) device copies of the weights (cuda), or their F32 copies (f32_weights)
  int n_uploads;
  const float *rope_freq; // (head_dim / 2) cfg.rope_inv_freq in backend memory when cfg.rope_scaled (an upload on cuda)
  mdl_rope_scaling rope_s; // the GGUF's scaling, kept so that mdl_llama_set_ctx can pick phi3's long or short factors
  const float *rope_factors[2]; // (head_dim / 2) (borrowed, the mapping) rope_factors_short, _long; NULL when absent

  // Step graphs (mdl_llama_set_graphs); kept before the scratch, which a failed grow clears.
  int graphs;                      // 1: decode steps are recorded and replayed
  struct {
    mdl_graph_key key;
    void *h;                       // (owned) from kc->be->graph_end
  } gcache[MDL_GRAPHS];
  int n_gcache, g_next;
  mdl_graph_key last;              // the previous decode step's shape: a shape seen twice in a row is recorded
  long n_replayed, n_recorded;
  mdl_moe_scratch moe; // mixture-of-experts scratch (cfg.n_expert > 0), freed by mdl_moe_free
  mdl_mla_scratch mla; // MLA scratch (cfg.kv_lora_rank > 0), freed by mdl_mla_free
  float *h_embd;       // host (cap_embd, n_embd): a pooled sequence's normed hidden rows, downloaded (mdl_seq.pool)
  int cap_embd;

  // Scratch, grown as needed and reused across calls; backend memory unless said host.
  int cap_t;           // token rows the activation buffers hold
  float *x, *xb;       // (cap_t, n_embd)
  float *q, *att;      // (cap_t, n_head * head_dim)
  float *k, *v;        // (cap_t, n_kv_head * head_dim)
  float *hb, *hb2;     // (cap_t, n_ff)
  int32_t *d_ids, *d_seq, *d_pos; // (cap_t)
  int cap_s;           // sequences the per-sequence buffers hold
  float *xo;           // (cap_s, n_embd) rows that want logits
  float *lo;           // (cap_s, n_vocab) their logits
  int32_t *d_rows;     // (cap_s) row index in x of each logits row
  int cap_bt;          // ints in d_bt
  int32_t *d_bt;       // (n_groups, n_seqs, max_blocks) block tables, one per layer group of the KV cache (mdl_kv)
  int bt_group_stride; // ints from one group's tables to the next's in d_bt, this step
  int32_t *h_ids, *h_seq, *h_pos; // host (cap_t)
  int32_t *h_rows, *h_rseq;       // host (cap_s): row in x, and row of the caller's logits, of each logits row
  int32_t *h_bt;                  // host (cap_bt)
};

// models/llama_pool.c: after the layers, each sequence s with pools[s].pool gets its pooled hidden rows in its embd.
// 0, or -1 with err (an unknown pooling, out of memory).
int mdl__pool_step(mdl_llama *m, const mdl_seq *seqs, const mdl_pool_out *pools, int n_seqs, char *err,
                   size_t errlen);

#endif
