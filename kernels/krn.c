// kernels/krn.c: element types, half-float conversion and row sizes shared by every backend.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/krn.h"

// Elements and bytes per block of each type dserve computes with; a zero block means "not supported".
typedef struct krn_type_info { int block; size_t bytes; } krn_type_info;

static krn_type_info krn_info(int type) {
  switch (type) {
  case KRN_F32: return (krn_type_info){1, 4};
  case KRN_F16: return (krn_type_info){1, 2};
  case KRN_BF16: return (krn_type_info){1, 2};
  case KRN_Q4_0: return (krn_type_info){KRN_QK, sizeof(krn_block_q4_0)};
  case KRN_Q4_1: return (krn_type_info){KRN_QK, sizeof(krn_block_q4_1)};
  case KRN_Q5_0: return (krn_type_info){KRN_QK, sizeof(krn_block_q5_0)};
  case KRN_Q5_1: return (krn_type_info){KRN_QK, sizeof(krn_block_q5_1)};
  case KRN_Q8_0: return (krn_type_info){KRN_QK, sizeof(krn_block_q8_0)};
  case KRN_Q4_K: return (krn_type_info){KRN_QK_K, sizeof(krn_block_q4_k)};
  case KRN_Q5_K: return (krn_type_info){KRN_QK_K, sizeof(krn_block_q5_k)};
  case KRN_Q6_K: return (krn_type_info){KRN_QK_K, sizeof(krn_block_q6_k)};
  }
  return (krn_type_info){0, 0};
}

// ggml's block sizes in bytes; a struct that differs would read every GGUF tensor of its type wrongly.
_Static_assert(sizeof(krn_block_q5_0) == 22 && sizeof(krn_block_q5_1) == 24, "q5 block layout");
_Static_assert(sizeof(krn_block_q4_k) == 144 && sizeof(krn_block_q5_k) == 176 && sizeof(krn_block_q6_k) == 210,
               "k-quant block layout");

int krn_type_known(int type) { return krn_info(type).block != 0; }
int krn_type_block(int type) { return krn_info(type).block; }
size_t krn_type_block_bytes(int type) { return krn_info(type).bytes; }

const char *krn_type_name(int type) {
  // ggml's numbering, so that a refused type is refused by its name.
  static const char *const names[] = {"F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1",
                                      "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
                                      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",
                                      "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16"};
  if (type < 0 || (size_t)type >= sizeof names / sizeof names[0]) return "unknown";
  return names[type];
}

size_t krn_row_size(krn_type t, int64_t n) {
  krn_type_info in = krn_info(t);
  return in.block ? (size_t)(n / in.block) * in.bytes : 0;
}

float krn_bf16_to_f32(krn_bf16 h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

krn_bf16 krn_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (krn_bf16)((x >> 16) | 0x40); // NaN: keep it one, quiet
  return (krn_bf16)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);                   // round to nearest even
}

float krn_f16_to_f32(krn_f16 h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

krn_f16 krn_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return (krn_f16)(sign | 0x7c00 | (man ? 0x200 : 0)); // inf / nan
  if (exp >= 31) return (krn_f16)(sign | 0x7c00);                                      // overflow
  if (exp <= 0) {                                                                       // subnormal or zero
    if (exp < -10) return (krn_f16)sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (krn_f16)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; // round to nearest even (may carry into exp)
  return (krn_f16)half;
}

int krn_kv_type_parse(const char *name) {
  if (!name) return -1;
  if (!strcmp(name, "f16")) return KRN_F16;
  if (!strcmp(name, "f32")) return KRN_F32;
  if (!strcmp(name, "q8_0")) return KRN_Q8_0;
  return -1;
}

const char *krn_kv_type_str(int type) {
  switch (type) {
  case KRN_F16: return "f16";
  case KRN_F32: return "f32";
  case KRN_Q8_0: return "q8_0";
  }
  return "unknown";
}

int krn_kv_type_ok(int type, int head_dim) {
  if (head_dim < 1) return 0;
  if (type == KRN_F16 || type == KRN_F32) return 1;
  return type == KRN_Q8_0 && head_dim % KRN_QK == 0;
}

// Squared error of x(32) stored as scale dh (f16) and q = round(x * id) clipped to +-127, with the q in qs.
static float q8_0_try(const float *x, krn_f16 dh, float id, int8_t *qs) {
  float d = krn_f16_to_f32(dh), err = 0.0f;
  for (int j = 0; j < KRN_QK; j++) {
    float v = roundf(x[j] * id);
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    qs[j] = (int8_t)v;
    float e = x[j] - d * v;
    err += e * e;
  }
  return err;
}

void krn_quant_row_q8_0(krn_block_q8_0 *out, const float *x, int n) {
  for (int b = 0; b < n / KRN_QK; b++, x += KRN_QK) {
    float amax = 0.0f;
    for (int j = 0; j < KRN_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    // ggml's encoding: d = max|x| / 127, q = round(x / d) with the f32 d, d stored as f16
    float d = amax / 127.0f;
    out[b].d = krn_f32_to_f16(d);
    float best = q8_0_try(x, out[b].d, d != 0.0f ? 1.0f / d : 0.0f, out[b].qs);
    if (amax == 0.0f) continue;
    // then 16 scales from max|x| / 120 to max|x| / 127.49, each quantized with its own f16 value: the least squared
    // error wins (about 20% below ggml's on Gaussian groups, 13% on heavy-tailed ones; never above it)
    for (int k = 0; k < 16; k++) {
      krn_f16 dh = krn_f32_to_f16(amax / (120.0f + 0.4993f * (float)k));
      float dd = krn_f16_to_f32(dh);
      int8_t qs[KRN_QK];
      float err = dd != 0.0f ? q8_0_try(x, dh, 1.0f / dd, qs) : best;
      if (err < best) {
        best = err;
        out[b].d = dh;
        memcpy(out[b].qs, qs, sizeof qs);
      }
    }
  }
}

int krn_event_new(krn_ctx *c, krn_event **out, char *err, size_t errlen) {
  *out = NULL;
  if (!c || !c->be) {
    snprintf(err, errlen, "krn_event_new: no kernel context");
    return -1;
  }
  if (!c->be->event_new) return 0; // ops complete when they return: nothing to wait for
  *out = (krn_event *)c->be->event_new(c);
  if (!*out) {
    snprintf(err, errlen, "krn_event_new: backend %s could not create an event", c->be->name);
    return -1;
  }
  return 0;
}

void krn_event_free(krn_ctx *c, krn_event *e) {
  if (e && c->be->event_free) c->be->event_free(c, e);
}

void krn_event_record(krn_ctx *c, krn_event *e) {
  if (e && c->be->event_record) c->be->event_record(c, e);
}

void krn_event_wait(krn_ctx *c, krn_event *e) {
  if (e && c->be->event_wait) c->be->event_wait(c, e);
}

void krn_matmul_group(krn_ctx *c, const krn_mm *mm, int n_mm, const float *x, int n, int k) {
  if (c->be->matmul_group && n_mm <= KRN_MM_GROUP_MAX) {
    c->be->matmul_group(c, mm, n_mm, x, n, k);
    return;
  }
  for (int i = 0; i < n_mm; i++) {
    const float *xi = mm[i].x ? mm[i].x : x;
    int ni = mm[i].x ? mm[i].xn : n;
    if (ni > 0) c->be->matmul(c, mm[i].y, mm[i].w, mm[i].wt, xi, ni, k, mm[i].m);
  }
}

void krn_download_ready(krn_ctx *c, void *host_dst, const void *src, size_t bytes) {
  if (c->be->download_ready) c->be->download_ready(c, host_dst, src, bytes);
  else c->be->download(c, host_dst, src, bytes);
}

int krn_host_register(krn_ctx *c, void *host, size_t bytes) {
  return c->be->host_register ? c->be->host_register(c, host, bytes) : 0;
}

void krn_host_unregister(krn_ctx *c, void *host) {
  if (host && c->be->host_unregister) c->be->host_unregister(c, host);
}

int krn_ctx_error(krn_ctx *c, char *err, size_t errlen) {
  return c && c->be && c->be->error ? c->be->error(c, err, errlen) : 0;
}

#ifndef DSERVE_HAVE_CUDA
// Built without the CUDA toolkit: there is no cuda backend.
const krn_backend *krn_cuda(void) { return NULL; }
int krn_cuda_device_count(void) { return 0; }
#endif
