// models/llama_w.c: one weight tensor of a Llama-family GGUF into the model: shape and type checked, used in place,
// uploaded (cuda) or dequantized to F32 (f32_weights). Below llama_load.c and llama_moe.c, which both load through it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama_int.h"

// mdl_llama_opts.f32_weights: t's rows(rows, k) into an F32 copy in m->uploads, by the scalar backend's get_rows
// (krn_scalar_dequant_row, the reference every backend is tested against), a bounded run of row ids at a time.
static int dequant_w(mdl_llama *m, const char *name, const mdl_gguf_tensor *t, int64_t k, int64_t rows, mdl_w *out,
                     char *err, size_t errlen) {
  size_t bytes = (size_t)k * (size_t)rows * sizeof(float);
  float *d = m->kc->be->alloc(m->kc, bytes);
  if (!d) {
    snprintf(err, errlen, "model: cannot allocate %zu bytes for %s in F32", bytes, name);
    return -1;
  }
  m->uploads[m->n_uploads++] = d;
  const krn_backend *sc = krn_cpu_scalar();
  krn_ctx sctx = {sc, NULL, NULL};
  int32_t ids[256];
  for (int64_t r0 = 0; r0 < rows; r0 += 256) {
    int n = rows - r0 < 256 ? (int)(rows - r0) : 256;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(r0 + i);
    sc->get_rows(&sctx, d + (size_t)r0 * (size_t)k, t->data, (krn_type)t->type, ids, n, (int)k);
  }
  out->data = d;
  out->type = KRN_F32;
  return 0;
}

// Finds a tensor, checks its type and its shape (ne0 = row length, ne1 = rows; ne1 0 for a vector; ne2 > 0: a stack
// of ne2 such matrices, an MoE layer's experts).
int mdl_llama_get_w(mdl_llama *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int optional, int f32_only,
                    mdl_w *out, char *err, size_t errlen) {
  const mdl_gguf_tensor *t = mdl_gguf_tensor_find(m->g, name);
  out->data = NULL;
  out->type = KRN_F32;
  if (!t) {
    if (optional) return 0;
    snprintf(err, errlen, "model: tensor %s missing", name);
    return -1;
  }
  if (!krn_type_known(t->type) || (f32_only && t->type != KRN_F32)) {
    snprintf(err, errlen, "model: tensor %s has type %s, which dserve does not support%s", name,
             krn_type_name(t->type), f32_only ? " here (F32 needed)" : " (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
    return -1;
  }
  int want_dims = ne2 ? 3 : ne1 ? 2 : 1;
  int64_t have1 = t->n_dims >= 2 ? t->ne[1] : 0, have2 = t->n_dims >= 3 ? t->ne[2] : 0;
  int extra = 0;
  for (int d = ne2 ? 3 : 2; d < t->n_dims; d++) extra |= t->ne[d] != 1;
  if (ne2 && (t->ne[0] != ne0 || have1 != ne1 || have2 != ne2 || extra || t->n_dims < 3)) {
    char have[96] = "(";
    for (int d = 0; d < t->n_dims && d < 4; d++)
      snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "", (long long)t->ne[d]);
    snprintf(err, errlen, "model: tensor %s has shape %s), expected (%lld, %lld, %lld)", name, have, (long long)ne0,
             (long long)ne1, (long long)ne2);
    return -1;
  }
  if (t->ne[0] != ne0 || have1 != ne1 || extra || t->n_dims < want_dims) {
    snprintf(err, errlen, "model: tensor %s has shape (%lld, %lld), expected (%lld, %lld)", name,
             (long long)t->ne[0], (long long)have1, (long long)ne0, (long long)ne1);
    return -1;
  }
  if (!ne2) ne2 = 1;
  if (ne0 % krn_type_block(t->type)) {
    snprintf(err, errlen, "model: tensor %s rows of %lld are not a multiple of %d", name, (long long)ne0, krn_type_block(t->type));
    return -1;
  }
  size_t need = krn_row_size((krn_type)t->type, ne0) * (size_t)(ne1 ? ne1 : 1) * (size_t)ne2;
  if (t->nbytes < need) {
    snprintf(err, errlen, "model: tensor %s holds %zu bytes, %zu needed", name, t->nbytes, need);
    return -1;
  }
  out->type = (krn_type)t->type;
  if (m->f32_weights && t->type != KRN_F32) return dequant_w(m, name, t, ne0, (ne1 ? ne1 : 1) * ne2, out, err, errlen);
  if (m->on_host) {
    out->data = t->data;
    return 0;
  }
  void *d = m->kc->be->alloc(m->kc, need);
  if (!d) {
    snprintf(err, errlen, "model: cannot allocate %zu bytes for %s on %s", need, name, m->kc->be->name);
    return -1;
  }
  m->kc->be->upload(m->kc, d, t->data, need);
  m->uploads[m->n_uploads++] = d;
  out->data = d;
  return 0;
}
