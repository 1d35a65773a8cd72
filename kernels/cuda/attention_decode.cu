// kernels/cuda/attention_decode.cu: paged attention for decode rows (split-K flash-decoding, GQA-shared K/V) and the dispatch.
#include <math.h>

#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_store.cuh"

#define KRN_CU_DEC_WARPS 4
// Query heads one CTA serves: a kv head's group, in parts of 4 (SmolLM2's 3 fit; 8 would cost registers and
// occupancy). 4 keys in flight per lane group keep enough loads outstanding (~160 registers, 3 CTAs per SM).
#define KRN_CU_DEC_MAXG 4
#define KRN_CU_DEC_MAXD 256 // largest head_dim (head_dim % 8 == 0)
#define KRN_CU_DEC_UNROLL 4 // keys each lane group loads before it computes

// 8 consecutive elements of a K or V row as floats: one 128-bit load for F16, two for F32.
__device__ __forceinline__ void krn_cu_load8(const __half *p, float *f) {
  const uint4 u = __ldg((const uint4 *)p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float2 t = __half22float2(*(const __half2 *)&w[j]);
    f[2 * j] = t.x;
    f[2 * j + 1] = t.y;
  }
}
__device__ __forceinline__ void krn_cu_load8(const float *p, float *f) {
  const float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}

// Merges the running softmax state (m, l, acc) with another (mo, lo, acco); -INFINITY m means empty.
__device__ __forceinline__ void krn_cu_merge(float &m, float &l, float *acc, float mo, float lo, const float *acco) {
  const float mn = fmaxf(m, mo);
  const float a = m == -INFINITY ? 0.0f : expf(m - mn), b = mo == -INFINITY ? 0.0f : expf(mo - mn);
  l = l * a + lo * b;
#pragma unroll
  for (int j = 0; j < 8; j++) acc[j] = acc[j] * a + acco[j] * b;
  m = mn;
}

// grid (n_kv_head * n_hg, n_tokens, n_split), KRN_CU_DEC_WARPS warps. CTA (kvh, hg), row, split: the query heads
// kvh * G + hg * MAXG + [0, MAXG) of row over positions [split * chunk, min(pos + 1, (split + 1) * chunk)).
// Lanes form groups of lpk lanes, each lane owning 8 of head_dim; each group runs its own online softmax over
// its share of the keys; groups, then warps, are merged at the end. Output: part_acc (n_tokens, n_head, n_split,
// head_dim) unnormalised, part_ml (n_tokens, n_head, n_split, 2) max and sum.
template <typename KT>
__global__ void __launch_bounds__(KRN_CU_DEC_WARPS * 32)
    krn_cu_attn_decode(float *part_acc, float *part_ml, const float *q, const KT *kc, const KT *vc,
                       const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *bt, int max_blocks, int bs,
                       int n_tokens, int n_head, int n_kv_head, int hd, int n_hg, int chunk, int n_split, float scale,
                       int window) {
  __shared__ float sm_acc[KRN_CU_DEC_WARPS][KRN_CU_DEC_MAXG][KRN_CU_DEC_MAXD];
  __shared__ float sm_ml[KRN_CU_DEC_WARPS][KRN_CU_DEC_MAXG][2];
  __shared__ int sm_skip;
  const int row = blockIdx.y, split = blockIdx.z;
  const int kvh = blockIdx.x / n_hg, hg = blockIdx.x % n_hg;
  const int G = n_head / n_kv_head;
  const int h0 = kvh * G + hg * KRN_CU_DEC_MAXG;
  const int gcount = min(KRN_CU_DEC_MAXG, G - hg * KRN_CU_DEC_MAXG);
  const int ctx = min(tok_pos[row] + 1, max_blocks * bs); // a position past the table is the caller's bug
  const int p0 = split * chunk, p1 = min(ctx, p0 + chunk);
  if (threadIdx.x == 0) sm_skip = krn_cu_attn_tile_is_prefill(tok_seq, n_tokens, row / KRN_CU_ATTN_TILE);
  __syncthreads();
  if (sm_skip || p0 >= p1) return; // the prefill kernel's row, or past this row's context (combine reads less)
  const int seq = tok_seq[row];
  const int32_t *btab = bt + (int64_t)seq * max_blocks;
  // A sliding window sees (pos - window, pos]: keys before lo are skipped (their blocks may have been given back, -1),
  // and a split wholly before it runs no key and writes an empty state, which the combine weighs 0.
  const int lo = window > 0 ? max(0, tok_pos[row] - window + 1) : 0;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ch = hd / 8;
  int lpk = 1;
  while (lpk < ch) lpk <<= 1;
  const int kpw = 32 / lpk;            // key groups per warp
  const int lg = lane / lpk, ci = lane % lpk;
  const bool lane_on = ci < ch;
  const int n_groups = KRN_CU_DEC_WARPS * kpw;
  const int gid = warp * kpw + lg;

  float qv[KRN_CU_DEC_MAXG][8], acc[KRN_CU_DEC_MAXG][8], m[KRN_CU_DEC_MAXG], l[KRN_CU_DEC_MAXG];
#pragma unroll
  for (int g = 0; g < KRN_CU_DEC_MAXG; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      acc[g][j] = 0.0f;
      qv[g][j] = 0.0f;
    }
    if (g < gcount && lane_on) {
      const float *qp = q + ((int64_t)row * n_head + h0 + g) * hd + ci * 8;
#pragma unroll
      for (int j = 0; j < 8; j++) qv[g][j] = qp[j] * scale;
    }
  }

  const int len = p1 - p0;
  const int64_t kv_stride = (int64_t)n_kv_head * hd; // one position of one block
  // Every lane of a warp runs the same iterations (the shuffles need the whole warp); idle groups do not update.
  for (int base = warp * kpw; base < len; base += n_groups * KRN_CU_DEC_UNROLL) {
    float kf[KRN_CU_DEC_UNROLL][8], vf[KRN_CU_DEC_UNROLL][8];
    bool ok[KRN_CU_DEC_UNROLL];
#pragma unroll
    for (int u = 0; u < KRN_CU_DEC_UNROLL; u++) {
      const int i = base - warp * kpw + u * n_groups + gid;
      ok[u] = i < len && p0 + i >= lo && btab[(p0 + i) / bs] >= 0;
      if (ok[u] && lane_on) {
        const int p = p0 + i;
        const int64_t off = ((int64_t)btab[p / bs] * bs + p % bs) * kv_stride + (int64_t)kvh * hd + ci * 8;
        krn_cu_load8(kc + off, kf[u]);
        krn_cu_load8(vc + off, vf[u]);
      } else {
#pragma unroll
        for (int j = 0; j < 8; j++) kf[u][j] = vf[u][j] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < KRN_CU_DEC_UNROLL; u++) {
#pragma unroll
      for (int g = 0; g < KRN_CU_DEC_MAXG; g++) {
        if (g >= gcount) break; // uniform across the CTA
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) s += qv[g][j] * kf[u][j];
        for (int o = lpk >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (ok[u]) {
          const float mn = fmaxf(m[g], s);
          const float a = expf(m[g] - mn), pr = expf(s - mn); // m[g] = -inf gives a = 0
          l[g] = l[g] * a + pr;
#pragma unroll
          for (int j = 0; j < 8; j++) acc[g][j] = acc[g][j] * a + pr * vf[u][j];
          m[g] = mn;
        }
      }
    }
  }

  // Merge the lane groups of the warp (lanes with the same ci), then the warps through shared memory.
#pragma unroll
  for (int g = 0; g < KRN_CU_DEC_MAXG; g++) {
    if (g >= gcount) break;
    for (int o = lpk; o < 32; o <<= 1) {
      float acco[8];
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
      for (int j = 0; j < 8; j++) acco[j] = __shfl_xor_sync(0xffffffffu, acc[g][j], o);
      krn_cu_merge(m[g], l[g], acc[g], mo, lo, acco);
    }
    if (lg == 0 && lane_on) {
#pragma unroll
      for (int j = 0; j < 8; j++) sm_acc[warp][g][ci * 8 + j] = acc[g][j];
      if (ci == 0) {
        sm_ml[warp][g][0] = m[g];
        sm_ml[warp][g][1] = l[g];
      }
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < gcount * hd; t += blockDim.x) {
    const int g = t / hd, d = t % hd;
    float mm = -INFINITY;
    for (int w = 0; w < KRN_CU_DEC_WARPS; w++) mm = fmaxf(mm, sm_ml[w][g][0]);
    float ll = 0.0f, aa = 0.0f;
    for (int w = 0; w < KRN_CU_DEC_WARPS; w++) {
      const float mw = sm_ml[w][g][0];
      const float f = mw == -INFINITY ? 0.0f : expf(mw - mm);
      ll += sm_ml[w][g][1] * f;
      aa += sm_acc[w][g][d] * f;
    }
    const int64_t idx = ((int64_t)row * n_head + h0 + g) * n_split + split;
    part_acc[idx * hd + d] = aa;
    if (d == 0) {
      part_ml[idx * 2] = mm;
      part_ml[idx * 2 + 1] = ll;
    }
  }
}

// grid (n_head, n_tokens), threads >= head_dim: out = sum over the row's splits of the partials, normalised.
__global__ void krn_cu_attn_combine(float *out, const float *part_acc, const float *part_ml, const int32_t *tok_seq,
                                    const int32_t *tok_pos, int n_tokens, int n_head, int hd, int chunk, int n_split) {
  const int h = blockIdx.x, row = blockIdx.y, d = threadIdx.x;
  if (krn_cu_attn_tile_is_prefill(tok_seq, n_tokens, row / KRN_CU_ATTN_TILE) || d >= hd) return;
  const int used = min(n_split, (tok_pos[row] + chunk) / chunk); // splits that saw keys: ceil((pos + 1) / chunk)
  const int64_t base = ((int64_t)row * n_head + h) * n_split;
  float mm = -INFINITY;
  for (int s = 0; s < used; s++) mm = fmaxf(mm, part_ml[(base + s) * 2]);
  float ll = 0.0f, aa = 0.0f;
  for (int s = 0; s < used; s++) {
    const float ms = part_ml[(base + s) * 2];
    const float f = ms == -INFINITY ? 0.0f : expf(ms - mm); // a split that saw no key (before a sliding window)
    ll += part_ml[(base + s) * 2 + 1] * f;
    aa += part_acc[(base + s) * hd + d] * f;
  }
  out[((int64_t)row * n_head + h) * hd + d] = ll > 0.0f ? aa / ll : 0.0f;
}

int krn_cuda_attn_decode(krn_ctx *c, float *out, const float *q, const krn_attn_args *a) {
  krn_cuda_state *s = (krn_cuda_state *)c->dev;
  const int hd = a->head_dim;
  if (hd % 8 || hd > KRN_CU_DEC_MAXD) return -1;
  const int G = a->n_head / a->n_kv_head;
  const int n_hg = (G + KRN_CU_DEC_MAXG - 1) / KRN_CU_DEC_MAXG;
  const int64_t ctx_max = (int64_t)a->max_blocks * a->block_size;
  // Enough CTAs to fill the device several times over, chunks of at least 256 positions, at most 64 splits.
  const int64_t base = (int64_t)a->n_tokens * a->n_kv_head * n_hg;
  int64_t want = (4LL * (s->n_sm > 0 ? s->n_sm : 100) + base - 1) / base;
  if (want < 1) want = 1;
  int64_t chunk = (ctx_max + want - 1) / want;
  chunk = ((chunk + 63) / 64) * 64;
  if (chunk < 256) chunk = 256;
  if ((ctx_max + chunk - 1) / chunk > 64) chunk = (ctx_max + 63) / 64;
  if (chunk > (1 << 30)) {
    krn_cuda_fail(s, "paged_attention", "context too long");
    return 0;
  }
  const int n_split = (int)((ctx_max + chunk - 1) / chunk);
  const size_t n_part = (size_t)a->n_tokens * a->n_head * n_split;
  float *pacc = (float *)krn_cuda_scratch(s, KRN_CUDA_SCR_ATTN, n_part * hd * sizeof(float));
  float *pml = (float *)krn_cuda_scratch(s, KRN_CUDA_SCR_ATTN2, n_part * 2 * sizeof(float));
  if (!pacc || !pml) return 0;
  const dim3 grid((unsigned)(a->n_kv_head * n_hg), (unsigned)a->n_tokens, (unsigned)n_split);
  if (a->kv_type == KRN_F16)
    krn_cu_attn_decode<__half><<<grid, KRN_CU_DEC_WARPS * 32, 0, s->stream>>>(
        pacc, pml, q, (const __half *)a->k_cache, (const __half *)a->v_cache, a->tok_seq, a->tok_pos, a->block_tables,
        a->max_blocks, a->block_size, a->n_tokens, a->n_head, a->n_kv_head, hd, n_hg, (int)chunk, n_split, a->scale,
        a->window);
  else
    krn_cu_attn_decode<float><<<grid, KRN_CU_DEC_WARPS * 32, 0, s->stream>>>(
        pacc, pml, q, (const float *)a->k_cache, (const float *)a->v_cache, a->tok_seq, a->tok_pos, a->block_tables,
        a->max_blocks, a->block_size, a->n_tokens, a->n_head, a->n_kv_head, hd, n_hg, (int)chunk, n_split, a->scale,
        a->window);
  const dim3 cgrid((unsigned)a->n_head, (unsigned)a->n_tokens);
  krn_cu_attn_combine<<<cgrid, ((hd + 31) / 32) * 32, 0, s->stream>>>(out, pacc, pml, a->tok_seq, a->tok_pos,
                                                                       a->n_tokens, a->n_head, hd, (int)chunk, n_split);
  krn_cuda_check(s, "paged_attention decode");
  return 0;
}

void krn_cuda_paged_attention(krn_ctx *c, float *out, const float *q, const krn_attn_args *a) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || krn_cuda_attn_check(c, a, "paged_attention") || a->n_tokens == 0) return;
  if (a->head_dim > KRN_CU_DEC_MAXD) {
    krn_cuda_fail(s, "paged_attention", "head_dim above 256 is not supported");
    return;
  }
  const int decode_ok = krn_cuda_attn_decode(c, out, q, a) == 0;
  krn_cuda_attn_prefill(c, out, q, a, !decode_ok);
}
