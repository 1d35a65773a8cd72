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
} mdl_layer;

// The shape of a decode step that a recorded graph replays (its buffers are the model's, fixed until they grow).
typedef struct mdl_graph_key {
  int n_seqs, max_blocks;  // one token and one logits row per sequence; block-table width
  const void *kv_base;
  int kv_type, kv_block_size, kv_n_blocks, kv_n_groups;
} mdl_graph_key;

#define MDL_GRAPHS 8 // recorded decode steps kept (round robin)

struct mdl_llama {
  mdl_llama_cfg cfg;
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

#endif
