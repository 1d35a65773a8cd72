// tests/fuzz/fuzz_gguf.c: libFuzzer target: mdl_gguf_from_memory on arbitrary bytes, then every kv and tensor walked.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Touches every byte a borrowed view points at, so ASan sees any view that leaves the buffer.
static unsigned touch(const void *p, size_t n) {
  const volatile uint8_t *b = p;
  unsigned s = 0;
  for (size_t i = 0; i < n; i++) s += b[i];
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // A private copy of exactly size bytes: a read past the end is a heap overflow ASan reports.
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) return 0;
  if (size) memcpy(buf, data, size);
  mdl_gguf *g = NULL;
  char err[256];
  if (mdl_gguf_from_memory(buf, size, &g, err, sizeof err) == 0) {
    volatile unsigned sink = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
      const mdl_gguf_kv *kv = &g->kv[i];
      sink += touch(kv->key.p, kv->key.n);
      char key[256];
      size_t kn = kv->key.n < sizeof key - 1 ? kv->key.n : sizeof key - 1;
      memcpy(key, kv->key.p, kn);
      key[kn] = 0;
      int64_t iv;
      float fv;
      mdl_str sv;
      if (memchr(key, 0, kn) == NULL) { // lookups by name need a NUL-free key
        (void)mdl_gguf_find(g, key);
        if (mdl_gguf_get_i64(g, key, &iv) == 0) sink += (unsigned)iv;
        if (mdl_gguf_get_f32(g, key, &fv) == 0) sink += (unsigned)(fv == fv);
        if (mdl_gguf_get_str(g, key, &sv) == 0) sink += touch(sv.p, sv.n);
      }
      if (kv->type == MDL_GGUF_ARR) {
        for (uint64_t j = 0; j < kv->arr_n; j++) {
          if (mdl_gguf_arr_str(kv, j, &sv) == 0) sink += touch(sv.p, sv.n);
          if (mdl_gguf_arr_i64(kv, j, &iv) == 0) sink += (unsigned)iv;
          if (mdl_gguf_arr_f32(kv, j, &fv) == 0) sink += (unsigned)(fv == fv);
        }
        // One past the end must be refused, never read.
        if (mdl_gguf_arr_str(kv, kv->arr_n, &sv) == 0 || mdl_gguf_arr_i64(kv, kv->arr_n, &iv) == 0 ||
            mdl_gguf_arr_f32(kv, kv->arr_n, &fv) == 0)
          abort();
      }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
      const mdl_gguf_tensor *t = &g->tensors[i];
      sink += touch(t->name.p, t->name.n);
      if (t->n_dims < 0 || t->n_dims > 4) abort();
      const uint8_t *d = t->data;
      if (t->nbytes && (d < buf || d + t->nbytes > buf + size || d + t->nbytes < d)) abort(); // outside the buffer
      if (t->nbytes) sink += d[0] + d[t->nbytes - 1];
      char name[256];
      size_t nn = t->name.n < sizeof name - 1 ? t->name.n : sizeof name - 1;
      memcpy(name, t->name.p, nn);
      name[nn] = 0;
      if (!memchr(name, 0, nn)) (void)mdl_gguf_tensor_find(g, name);
    }
    (void)sink;
    mdl_gguf_close(g);
  }
  free(buf);
  return 0;
}
