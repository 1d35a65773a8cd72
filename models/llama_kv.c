// models/llama_kv.c: sizes and addresses inside the paged KV cache layout of models/llama.h, and its layer groups.
#include "models/llama.h"

#include <stdio.h>

int mdl_kv_type_check(const mdl_llama_cfg *c, const krn_backend *be, krn_type type, char *err, size_t errlen) {
  if (type != KRN_F16 && type != KRN_F32 && type != KRN_Q8_0) {
    snprintf(err, errlen, "KV type %s not supported (f16, f32 or q8_0)", krn_type_name(type));
    return -1;
  }
  if (c->kv_lora_rank > 0) { // MLA: one latent row, whose first kv_lora_rank values attention reads as V
    if (!krn_kv_type_ok(type, c->kv_lora_rank) || !krn_kv_type_ok(type, mdl_kv_width(c))) {
      snprintf(err, errlen,
               "kv_type %s needs kv_lora_rank and kv_lora_rank + rope dim multiples of %d; this model's are "
               "%d and %d", krn_kv_type_str(type), KRN_QK, c->kv_lora_rank, mdl_kv_width(c));
      return -1;
    }
  } else if (!krn_kv_type_ok(type, c->head_dim)) {
    snprintf(err, errlen, "kv_type %s needs head_dim a multiple of %d; this model's is %d", krn_kv_type_str(type),
             KRN_QK, c->head_dim);
    return -1;
  }
  if (type == KRN_Q8_0 && be && !be->kv_q8_0) {
    snprintf(err, errlen, "kv_type q8_0: the %s kernels have no q8_0 paged attention (use kv_type f16, or cpu kernels)",
             be->name);
    return -1;
  }
  return 0;
}

int mdl_kv_parts(const mdl_llama_cfg *c) { return c->kv_lora_rank > 0 ? 1 : 2; }

int mdl_kv_width(const mdl_llama_cfg *c) {
  return c->kv_lora_rank > 0 ? c->kv_lora_rank + c->n_rot : c->n_kv_head * c->head_dim;
}

// Bytes of one position's part of one layer: its width in values of the type, Q8_0 with its scales.
size_t mdl_kv_row_bytes(const mdl_llama_cfg *c, krn_type t) { return krn_row_size(t, (int64_t)mdl_kv_width(c)); }

// The layer's sliding window (0: global): the first swa_pattern - 1 layers of each swa_pattern are local. Here, below
// llama.c, because the KV layout's layer groups are cut by it.
int mdl_llama_layer_window(const mdl_llama_cfg *c, int layer) {
  if (c->n_swa <= 0 || c->swa_pattern <= 0) return 0;
  return layer % c->swa_pattern < c->swa_pattern - 1 ? c->n_swa : 0;
}

size_t mdl_kv_chunk_bytes(const mdl_llama_cfg *c, const mdl_kv *kv) {
  return (size_t)kv->block_size * mdl_kv_row_bytes(c, kv->type);
}

size_t mdl_kv_block_bytes(const mdl_llama_cfg *c, krn_type type, int block_size) {
  return (size_t)mdl_kv_parts(c) * (size_t)c->n_layer * (size_t)block_size * mdl_kv_row_bytes(c, type);
}

void *mdl_kv_chunk(const mdl_llama_cfg *c, const mdl_kv *kv, int layer, int part, int page) {
  size_t chunk = mdl_kv_chunk_bytes(c, kv);
  size_t slot = kv->n_groups > 1 ? (size_t)kv->layer_slot[layer] : (size_t)layer;
  size_t i = (slot * (size_t)mdl_kv_parts(c) + (size_t)part) * (size_t)kv->n_blocks + (size_t)page;
  return (char *)kv->base + i * chunk;
}

static int gcd(int a, int b) {
  while (b) {
    int t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int mdl_kv_plan_groups(const mdl_llama_cfg *c, int16_t *group, int16_t *slot) {
  int n_local = 0;
  for (int l = 0; l < c->n_layer; l++) n_local += mdl_llama_layer_window(c, l) > 0;
  int n_global = c->n_layer - n_local;
  if (n_local == 0 || n_global == 0 || c->n_layer > INT16_MAX) {
    for (int l = 0; l < c->n_layer; l++) group[l] = 0, slot[l] = (int16_t)l;
    return 1;
  }
  int per = gcd(n_global, n_local), rg = 0, rl = 0;
  for (int l = 0; l < c->n_layer; l++) {
    int local = mdl_llama_layer_window(c, l) > 0, r = local ? rl++ : rg++;
    group[l] = (int16_t)((local ? n_global / per : 0) + r / per);
    slot[l] = (int16_t)(r % per);
  }
  return c->n_layer / per;
}

int mdl_kv_group_window(const mdl_llama_cfg *c, const mdl_kv *kv, int g) {
  if (kv->n_groups <= 1) return 0; // one group holds global layers too
  for (int l = 0; l < c->n_layer; l++)
    if (mdl_kv_group_of(kv, l) == g) return mdl_llama_layer_window(c, l);
  return 0;
}

int mdl_kv_first_live_block(int window, int n_pos, int block_size) {
  if (window <= 0 || n_pos <= window || block_size < 1) return 0;
  return (n_pos - window) / block_size; // the block holding position n_pos - window, the first one read
}
