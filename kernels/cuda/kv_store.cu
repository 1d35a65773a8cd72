// kernels/cuda/kv_store.cu: writes each row's K and V into its (seq, pos) slot of the paged caches.
#include <stdio.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_store.cuh"

int krn_cuda_attn_check(krn_ctx *c, const krn_attn_args *a, const char *what) {
  krn_cuda_state *s = (krn_cuda_state *)c->dev;
  const char *bad = NULL;
  if (!a) bad = "no arguments";
  else if (a->n_tokens < 0 || a->n_head <= 0 || a->n_kv_head <= 0 || a->head_dim <= 0 || a->block_size <= 0 ||
           a->max_blocks <= 0)
    bad = "non-positive shape";
  else if (a->n_head % a->n_kv_head)
    bad = "n_head is not a multiple of n_kv_head";
  else if (a->kv_type != KRN_F16 && a->kv_type != KRN_F32)
    bad = "kv_type must be F16 or F32";
  else if (a->n_tokens > 0 && (!a->tok_seq || !a->tok_pos || !a->block_tables || !a->k_cache || !a->v_cache))
    bad = "missing pointer";
  if (bad) krn_cuda_fail(s, what, bad);
  return bad ? -1 : 0;
}

// One thread per (row, kv element); the slot of position p of sequence q is block_tables[q][p / bs], p % bs.
template <typename KT>
__global__ void krn_cu_kv_store(const float *k, const float *v, KT *kc, KT *vc, const int32_t *tok_seq,
                                const int32_t *tok_pos, const int32_t *bt, int max_blocks, int bs, int n, int kv_dim) {
  const int64_t total = (int64_t)n * kv_dim;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int row = (int)(t / kv_dim), e = (int)(t % kv_dim);
    const int pos = tok_pos[row];
    const int blk = bt[(int64_t)tok_seq[row] * max_blocks + pos / bs];
    if (blk < 0) continue; // a page given back (models/llama.h): never one a step writes, but never write through it
    const int64_t dst = ((int64_t)blk * bs + pos % bs) * kv_dim + e;
    if (sizeof(KT) == 2) {
      ((__half *)kc)[dst] = __float2half_rn(k[t]);
      ((__half *)vc)[dst] = __float2half_rn(v[t]);
    } else {
      ((float *)kc)[dst] = k[t];
      ((float *)vc)[dst] = v[t];
    }
  }
}

void krn_cuda_kv_store(krn_ctx *c, const float *k, const float *v, const krn_attn_args *a) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || krn_cuda_attn_check(c, a, "kv_store") || a->n_tokens == 0) return;
  const int kv_dim = a->n_kv_head * a->head_dim;
  const unsigned grid = krn_cuda_blocks((int64_t)a->n_tokens * kv_dim, 256);
  if (a->kv_type == KRN_F16)
    krn_cu_kv_store<__half><<<grid, 256, 0, s->stream>>>(k, v, (__half *)a->k_cache, (__half *)a->v_cache, a->tok_seq,
                                                         a->tok_pos, a->block_tables, a->max_blocks, a->block_size,
                                                         a->n_tokens, kv_dim);
  else
    krn_cu_kv_store<float><<<grid, 256, 0, s->stream>>>(k, v, (float *)a->k_cache, (float *)a->v_cache, a->tok_seq,
                                                        a->tok_pos, a->block_tables, a->max_blocks, a->block_size,
                                                        a->n_tokens, kv_dim);
  krn_cuda_check(s, "kv_store");
}
