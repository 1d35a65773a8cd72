// models/llama_kv.c: sizes and addresses inside the paged KV cache layout of models/llama.h.
#include "models/llama.h"

static size_t kv_elsize(krn_type t) { return t == KRN_F32 ? 4 : 2; }

size_t mdl_kv_chunk_bytes(const mdl_llama_cfg *c, const mdl_kv *kv) {
  return (size_t)kv->block_size * (size_t)c->n_kv_head * (size_t)c->head_dim * kv_elsize(kv->type);
}

size_t mdl_kv_block_bytes(const mdl_llama_cfg *c, krn_type type, int block_size) {
  return 2 * (size_t)c->n_layer * (size_t)block_size * (size_t)c->n_kv_head * (size_t)c->head_dim * kv_elsize(type);
}

void *mdl_kv_chunk(const mdl_llama_cfg *c, const mdl_kv *kv, int layer, int kv_idx, int block) {
  size_t chunk = mdl_kv_chunk_bytes(c, kv);
  size_t i = ((size_t)layer * 2 + (size_t)kv_idx) * (size_t)kv->n_blocks + (size_t)block;
  return (char *)kv->base + i * chunk;
}
