// models/gguf.h: a bounds-checked GGUF reader over an mmapped file; tensors are used in place.
#ifndef DSERVE_MDL_GGUF_H
#define DSERVE_MDL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/krn.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// GGUF metadata value types, numbered as the format numbers them.
typedef enum mdl_gguf_vtype {
  MDL_GGUF_U8 = 0, MDL_GGUF_I8 = 1, MDL_GGUF_U16 = 2, MDL_GGUF_I16 = 3,
  MDL_GGUF_U32 = 4, MDL_GGUF_I32 = 5, MDL_GGUF_F32 = 6, MDL_GGUF_BOOL = 7,
  MDL_GGUF_STR = 8, MDL_GGUF_ARR = 9, MDL_GGUF_U64 = 10, MDL_GGUF_I64 = 11, MDL_GGUF_F64 = 12,
} mdl_gguf_vtype;

typedef struct mdl_str { const char *p; uint64_t n; } mdl_str; // not NUL-terminated; points into the mapping

typedef struct mdl_gguf_kv {
  mdl_str key;
  mdl_gguf_vtype type;
  mdl_gguf_vtype arr_type;  // element type when type == ARR
  uint64_t arr_n;           // element count when type == ARR
  const uint8_t *val;       // (borrowed) the value's bytes in the mapping (array: first element)
  const uint64_t *str_offs; // (owned by mdl_gguf) arrays of strings: offset of element i from val, arr_n of them
} mdl_gguf_kv;

typedef struct mdl_gguf_tensor {
  mdl_str name;
  int n_dims;
  int64_t ne[4];     // ne[0] is the contiguous (row) dimension, as ggml orders it
  int type;          // krn_type when krn_type_known(type)
  uint64_t offset;   // from the start of the data section
  const void *data;  // (borrowed) in the mapping
  size_t nbytes;
} mdl_gguf_tensor;

typedef struct mdl_gguf {
  uint32_t version;
  uint64_t n_kv, n_tensors;
  mdl_gguf_kv *kv;          // (owned) (n_kv)
  mdl_gguf_tensor *tensors; // (owned) (n_tensors)
  uint64_t alignment;
  const uint8_t *base;      // (owned mapping unless from_memory) the whole file
  size_t size;
  int mapped;
  void *owned;              // (owned) a buffer freed at close (the null model's GGUF in memory), or NULL
} mdl_gguf;

// Open and validate: every length, offset and size is checked against the file; no crash on any input.
int mdl_gguf_open(const char *path, mdl_gguf **out, char *err, size_t errlen) UTL_WARN_UNUSED;
// Buf borrowed
int mdl_gguf_from_memory(const void *buf, size_t len, mdl_gguf **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void mdl_gguf_close(mdl_gguf *g);

const mdl_gguf_kv *mdl_gguf_find(const mdl_gguf *g, const char *key);
const mdl_gguf_tensor *mdl_gguf_tensor_find(const mdl_gguf *g, const char *name);
// Scalar getters: 0 on success, -1 when absent or of an incompatible type (ints convert between widths).
int mdl_gguf_get_i64(const mdl_gguf *g, const char *key, int64_t *out);
int mdl_gguf_get_f32(const mdl_gguf *g, const char *key, float *out);
int mdl_gguf_get_str(const mdl_gguf *g, const char *key, mdl_str *out);
// Array element access (bounds-checked): string, integer or float elements.
int mdl_gguf_arr_str(const mdl_gguf_kv *kv, uint64_t i, mdl_str *out);
int mdl_gguf_arr_i64(const mdl_gguf_kv *kv, uint64_t i, int64_t *out);
int mdl_gguf_arr_f32(const mdl_gguf_kv *kv, uint64_t i, float *out);
int mdl_str_eq(mdl_str s, const char *c);

#ifdef __cplusplus
}
#endif
#endif
