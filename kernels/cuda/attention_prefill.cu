// kernels/cuda/attention_prefill.cu: flash-attention-style paged attention for prefill rows (query tile in shared memory, online softmax).
#include <limits.h>
#include <math.h>

#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/common.cuh"

#define KRN_CU_PF_BQ KRN_CU_ATTN_TILE // query rows per CTA
#define KRN_CU_PF_BK 32               // keys per K/V tile
#define KRN_CU_PF_THREADS 128         // 4 threads per query row
#define KRN_CU_PF_MAXD 256

template <typename KT> __device__ __forceinline__ float krn_cu_kv_f32(const KT *p);
template <> __device__ __forceinline__ float krn_cu_kv_f32<__half>(const __half *p) { return __half2float(*p); }
template <> __device__ __forceinline__ float krn_cu_kv_f32<float>(const float *p) { return *p; }

// grid (ceil(n_tokens / BQ), n_head). A CTA takes 32 consecutive rows of one query head. Its rows are grouped
// by sequence (runs); for each sequence, K/V tiles of BK positions up to the largest position among its rows are
// loaded through the block table into shared memory and every row of the sequence runs an online softmax over
// them, masking positions past its own (causal). Thread t serves row t / 4: keys t % 4 + 4 j of each tile and
// elements t % 4 + 4 i of the head. Shared memory (dynamic): Q (BQ, hd + 1), K (BK, hd + 1), V (BK, hd),
// P (BQ, BK + 1) floats.
template <typename KT>
__global__ void __launch_bounds__(KRN_CU_PF_THREADS)
    krn_cu_attn_prefill(float *out, const float *q, const KT *kc, const KT *vc, const int32_t *tok_seq,
                        const int32_t *tok_pos, const int32_t *bt, int max_blocks, int bs, int n_tokens, int n_head,
                        int n_kv_head, int hd, float scale, int all_rows, int window) {
  extern __shared__ float sm[];
  float *Qs = sm;                                   // (BQ, hd + 1)
  float *Ks = Qs + KRN_CU_PF_BQ * (hd + 1);         // (BK, hd + 1)
  float *Vs = Ks + KRN_CU_PF_BK * (hd + 1);         // (BK, hd)
  float *Ps = Vs + KRN_CU_PF_BK * hd;               // (BQ, BK + 1)
  __shared__ int s_seq[KRN_CU_PF_BQ], s_pos[KRN_CU_PF_BQ], s_cur, s_maxpos, s_minlo, s_take;

  const int tile = blockIdx.x, h = blockIdx.y;
  const int kvh = h / (n_head / n_kv_head);
  const int r0 = tile * KRN_CU_PF_BQ;
  const int ctx_max = max_blocks * bs;
  if (threadIdx.x == 0) s_take = all_rows || krn_cu_attn_tile_is_prefill(tok_seq, n_tokens, tile);
  if (threadIdx.x < KRN_CU_PF_BQ) {
    const int row = r0 + threadIdx.x;
    s_seq[threadIdx.x] = row < n_tokens ? tok_seq[row] : -1;
    s_pos[threadIdx.x] = row < n_tokens ? min(tok_pos[row], ctx_max - 1) : -1;
  }
  __syncthreads();
  if (!s_take) return; // the decode kernel's tile
  for (int t = threadIdx.x; t < KRN_CU_PF_BQ * hd; t += blockDim.x) {
    const int r = t / hd, d = t % hd;
    Qs[r * (hd + 1) + d] = r0 + r < n_tokens ? q[((int64_t)(r0 + r) * n_head + h) * hd + d] * scale : 0.0f;
  }

  const int r = threadIdx.x >> 2, t4 = threadIdx.x & 3;
  const int my_seq = s_seq[r], my_pos = s_pos[r];
  // a sliding window: row r sees (my_pos - window, my_pos]; the sequence's tiles start at the lowest such bound
  const int my_lo = window > 0 ? max(0, my_pos - window + 1) : 0;
  float acc[KRN_CU_PF_MAXD / 4];
#pragma unroll
  for (int i = 0; i < KRN_CU_PF_MAXD / 4; i++) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t kv_stride = (int64_t)n_kv_head * hd;
  unsigned done = 0; // bit r: row r's sequence has been processed (kept identical in every thread)

  for (;;) {
    if (threadIdx.x == 0) {
      int cur = -1, mp = -1, ml = INT_MAX;
      for (int i = 0; i < KRN_CU_PF_BQ; i++) {
        if (s_seq[i] < 0 || (done >> i & 1)) continue;
        if (cur < 0) cur = s_seq[i];
        if (s_seq[i] == cur) {
          mp = max(mp, s_pos[i]);
          ml = min(ml, window > 0 ? max(0, s_pos[i] - window + 1) : 0);
        }
      }
      s_cur = cur;
      s_maxpos = mp;
      s_minlo = ml == INT_MAX ? 0 : ml;
    }
    __syncthreads();
    const int cur = s_cur, maxpos = s_maxpos, minlo = s_minlo;
    if (cur < 0) break;
    for (int i = 0; i < KRN_CU_PF_BQ; i++)
      if (s_seq[i] == cur) done |= 1u << i;
    const bool active = my_seq == cur;
    const int32_t *btab = bt + (int64_t)cur * max_blocks;

    for (int kt = minlo / KRN_CU_PF_BK * KRN_CU_PF_BK; kt <= maxpos; kt += KRN_CU_PF_BK) {
      __syncthreads(); // the previous tile is no longer read
      for (int t = threadIdx.x; t < KRN_CU_PF_BK * hd; t += blockDim.x) {
        const int j = t / hd, d = t % hd, p = kt + j;
        float kv = 0.0f, vv = 0.0f;
        if (p <= maxpos && p >= minlo && btab[p / bs] >= 0) {
          const int64_t off = ((int64_t)btab[p / bs] * bs + p % bs) * kv_stride + (int64_t)kvh * hd + d;
          kv = krn_cu_kv_f32<KT>(kc + off);
          vv = krn_cu_kv_f32<KT>(vc + off);
        }
        Ks[j * (hd + 1) + d] = kv;
        Vs[j * hd + d] = vv;
      }
      __syncthreads();
      float sc[KRN_CU_PF_BK / 4];
      float mt = -INFINITY;
#pragma unroll
      for (int jj = 0; jj < KRN_CU_PF_BK / 4; jj++) {
        const int j = t4 + 4 * jj;
        float sdot = 0.0f;
        const float *qr = Qs + r * (hd + 1), *kr = Ks + j * (hd + 1);
        for (int d = 0; d < hd; d++) sdot += qr[d] * kr[d];
        sc[jj] = active && kt + j <= my_pos && kt + j >= my_lo ? sdot : -INFINITY;
        mt = fmaxf(mt, sc[jj]);
      }
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
      const float mn = fmaxf(m, mt);
      float ps = 0.0f;
#pragma unroll
      for (int jj = 0; jj < KRN_CU_PF_BK / 4; jj++) {
        const float p = sc[jj] == -INFINITY ? 0.0f : expf(sc[jj] - mn);
        Ps[r * (KRN_CU_PF_BK + 1) + t4 + 4 * jj] = p;
        ps += p;
      }
      ps += __shfl_xor_sync(0xffffffffu, ps, 1);
      ps += __shfl_xor_sync(0xffffffffu, ps, 2);
      __syncwarp(); // row r's P is written by its 4 threads, all in this warp
      if (active && mn != -INFINITY) {
        const float alpha = m == -INFINITY ? 0.0f : expf(m - mn);
        l = l * alpha + ps;
        m = mn;
        const float *pr = Ps + r * (KRN_CU_PF_BK + 1);
#pragma unroll
        for (int i = 0; i < KRN_CU_PF_MAXD / 4; i++) {
          const int d = t4 + 4 * i;
          if (d < hd) {
            float o = acc[i] * alpha;
            for (int j = 0; j < KRN_CU_PF_BK; j++) o += pr[j] * Vs[j * hd + d];
            acc[i] = o;
          }
        }
      }
    }
    __syncthreads(); // s_cur is rewritten by the next round
  }

  if (r0 + r < n_tokens) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float *o = out + ((int64_t)(r0 + r) * n_head + h) * hd;
#pragma unroll
    for (int i = 0; i < KRN_CU_PF_MAXD / 4; i++) {
      const int d = t4 + 4 * i;
      if (d < hd) o[d] = acc[i] * inv;
    }
  }
}

void krn_cuda_attn_prefill(krn_ctx *c, float *out, const float *q, const krn_attn_args *a, int all_rows) {
  krn_cuda_state *s = (krn_cuda_state *)c->dev;
  const int hd = a->head_dim;
  const size_t smem =
      sizeof(float) * ((size_t)KRN_CU_PF_BQ * (hd + 1) + (size_t)KRN_CU_PF_BK * (2 * hd + 1) + KRN_CU_PF_BQ * (KRN_CU_PF_BK + 1));
  const dim3 grid((unsigned)((a->n_tokens + KRN_CU_PF_BQ - 1) / KRN_CU_PF_BQ), (unsigned)a->n_head);
  if (a->kv_type == KRN_F16) {
    cudaFuncSetAttribute(krn_cu_attn_prefill<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    krn_cu_attn_prefill<__half><<<grid, KRN_CU_PF_THREADS, smem, s->stream>>>(
        out, q, (const __half *)a->k_cache, (const __half *)a->v_cache, a->tok_seq, a->tok_pos, a->block_tables,
        a->max_blocks, a->block_size, a->n_tokens, a->n_head, a->n_kv_head, hd, a->scale, all_rows, a->window);
  } else {
    cudaFuncSetAttribute(krn_cu_attn_prefill<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    krn_cu_attn_prefill<float><<<grid, KRN_CU_PF_THREADS, smem, s->stream>>>(
        out, q, (const float *)a->k_cache, (const float *)a->v_cache, a->tok_seq, a->tok_pos, a->block_tables,
        a->max_blocks, a->block_size, a->n_tokens, a->n_head, a->n_kv_head, hd, a->scale, all_rows, a->window);
  }
  krn_cuda_check(s, "paged_attention prefill");
}
