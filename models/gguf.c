// models/gguf.c: the GGUF reader: mmap, header, metadata, tensor infos, all checked against the file length.
#include "models/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"

#define GGUF_MAX_DEPTH 8          // nesting of arrays of arrays we accept
#define GGUF_MAX_ALIGN (1u << 20) // general.alignment above this is refused as absurd

typedef struct cur {
  const uint8_t *base;
  size_t size, pos;
} cur;

static size_t left(const cur *c) { return c->size - c->pos; }

static int rd(cur *c, void *dst, size_t n) {
  if (left(c) < n) return -1;
  memcpy(dst, c->base + c->pos, n);
  c->pos += n;
  return 0;
}

static int rd_u32(cur *c, uint32_t *v) { return rd(c, v, 4); }
static int rd_u64(cur *c, uint64_t *v) { return rd(c, v, 8); }

static int rd_str(cur *c, mdl_str *s) {
  uint64_t n;
  if (rd_u64(c, &n) != 0) return -1;
  if (n > left(c)) return -1;
  s->p = (const char *)(c->base + c->pos);
  s->n = n;
  c->pos += (size_t)n;
  return 0;
}

// Size in bytes of one fixed-size value type, 0 for STR/ARR, -1 for an unknown type.
static int vtype_size(uint32_t t) {
  switch (t) {
  case MDL_GGUF_U8: case MDL_GGUF_I8: case MDL_GGUF_BOOL: return 1;
  case MDL_GGUF_U16: case MDL_GGUF_I16: return 2;
  case MDL_GGUF_U32: case MDL_GGUF_I32: case MDL_GGUF_F32: return 4;
  case MDL_GGUF_U64: case MDL_GGUF_I64: case MDL_GGUF_F64: return 8;
  case MDL_GGUF_STR: case MDL_GGUF_ARR: return 0;
  default: return -1;
  }
}

// Skips (validating) one value of type t; arrays of arrays recurse up to GGUF_MAX_DEPTH.
static int skip_value(cur *c, uint32_t t, int depth, char *err, size_t errlen) {
  int sz = vtype_size(t);
  if (sz < 0) {
    utl_seterr(err, errlen, "unknown metadata value type %u at offset %zu", t, c->pos);
    return -1;
  }
  if (sz > 0) {
    if (left(c) < (size_t)sz) goto trunc;
    c->pos += (size_t)sz;
    return 0;
  }
  if (t == MDL_GGUF_STR) {
    mdl_str s;
    if (rd_str(c, &s) != 0) goto trunc;
    return 0;
  }
  // array
  if (depth >= GGUF_MAX_DEPTH) {
    utl_seterr(err, errlen, "metadata arrays nested deeper than %d at offset %zu", GGUF_MAX_DEPTH, c->pos);
    return -1;
  }
  uint32_t et;
  uint64_t n;
  if (rd_u32(c, &et) != 0 || rd_u64(c, &n) != 0) goto trunc;
  int esz = vtype_size(et);
  if (esz < 0) {
    utl_seterr(err, errlen, "unknown array element type %u at offset %zu", et, c->pos);
    return -1;
  }
  if (esz > 0) {
    if (n > left(c) / (size_t)esz) goto trunc;
    c->pos += (size_t)n * (size_t)esz;
    return 0;
  }
  // strings need >= 8 bytes each, arrays >= 12: an absurd count is refused before looping
  if (n > left(c) / 8) goto trunc;
  for (uint64_t i = 0; i < n; i++)
    if (skip_value(c, et, depth + 1, err, errlen) != 0) return -1;
  return 0;
trunc:
  utl_seterr(err, errlen, "metadata value runs past the end of the file (offset %zu)", c->pos);
  return -1;
}

static int str_cmp(mdl_str a, mdl_str b) {
  size_t n = a.n < b.n ? (size_t)a.n : (size_t)b.n;
  int r = n ? memcmp(a.p, b.p, n) : 0;
  if (r) return r;
  return a.n < b.n ? -1 : a.n > b.n ? 1 : 0;
}

static int cmp_kv(const void *a, const void *b) {
  return str_cmp((*(const mdl_gguf_kv *const *)a)->key, (*(const mdl_gguf_kv *const *)b)->key);
}

static int cmp_tensor(const void *a, const void *b) {
  return str_cmp((*(const mdl_gguf_tensor *const *)a)->name, (*(const mdl_gguf_tensor *const *)b)->name);
}

// Refuses duplicate names (sorting pointers, so that the check is n log n on any count).
static int check_dups(mdl_gguf *g, char *err, size_t errlen) {
  size_t n = g->n_kv > g->n_tensors ? (size_t)g->n_kv : (size_t)g->n_tensors;
  if (n < 2) return 0;
  const void **v = malloc(n * sizeof *v);
  if (!v) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  int rc = 0;
  for (uint64_t i = 0; i < g->n_kv; i++) v[i] = &g->kv[i];
  qsort(v, (size_t)g->n_kv, sizeof *v, cmp_kv);
  for (uint64_t i = 1; i < g->n_kv && rc == 0; i++) {
    const mdl_gguf_kv *a = v[i - 1], *b = v[i];
    if (str_cmp(a->key, b->key) == 0) {
      utl_seterr(err, errlen, "duplicate metadata key '%.*s'", (int)(a->key.n > 200 ? 200 : a->key.n), a->key.p);
      rc = -1;
    }
  }
  for (uint64_t i = 0; i < g->n_tensors; i++) v[i] = &g->tensors[i];
  qsort(v, (size_t)g->n_tensors, sizeof *v, cmp_tensor);
  for (uint64_t i = 1; i < g->n_tensors && rc == 0; i++) {
    const mdl_gguf_tensor *a = v[i - 1], *b = v[i];
    if (str_cmp(a->name, b->name) == 0) {
      utl_seterr(err, errlen, "duplicate tensor name '%.*s'", (int)(a->name.n > 200 ? 200 : a->name.n), a->name.p);
      rc = -1;
    }
  }
  free(v);
  return rc;
}

static int parse_kv(cur *c, mdl_gguf_kv *kv, uint64_t idx, char *err, size_t errlen) {
  uint32_t t;
  if (rd_str(c, &kv->key) != 0 || rd_u32(c, &t) != 0) {
    utl_seterr(err, errlen, "metadata entry %llu runs past the end of the file", (unsigned long long)idx);
    return -1;
  }
  if (vtype_size(t) < 0) {
    utl_seterr(err, errlen, "metadata '%.*s': unknown value type %u", (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p, t);
    return -1;
  }
  kv->type = (mdl_gguf_vtype)t;
  if (t != MDL_GGUF_ARR) {
    kv->val = c->base + c->pos;
    if (skip_value(c, t, 0, err, errlen) != 0) return -1;
    return 0;
  }
  uint32_t et;
  uint64_t n;
  if (rd_u32(c, &et) != 0 || rd_u64(c, &n) != 0) {
    utl_seterr(err, errlen, "metadata '%.*s': array header runs past the end of the file", (int)(kv->key.n > 200 ? 200 : kv->key.n),
           kv->key.p);
    return -1;
  }
  int esz = vtype_size(et);
  if (esz < 0) {
    utl_seterr(err, errlen, "metadata '%.*s': unknown array element type %u", (int)(kv->key.n > 200 ? 200 : kv->key.n),
           kv->key.p, et);
    return -1;
  }
  kv->arr_type = (mdl_gguf_vtype)et;
  kv->arr_n = n;
  kv->val = c->base + c->pos;
  size_t start = c->pos;
  if (esz > 0) {
    if (n > left(c) / (size_t)esz) goto trunc;
    c->pos += (size_t)n * (size_t)esz;
    return 0;
  }
  if (n > left(c) / 8) goto trunc;
  if (et == MDL_GGUF_STR) {
    uint64_t *offs = malloc((n ? (size_t)n : 1) * sizeof *offs);
    if (!offs) {
      utl_seterr(err, errlen, "out of memory");
      return -1;
    }
    kv->str_offs = offs;
    for (uint64_t i = 0; i < n; i++) {
      offs[i] = c->pos - start;
      mdl_str s;
      if (rd_str(c, &s) != 0) goto trunc;
    }
    return 0;
  }
  for (uint64_t i = 0; i < n; i++) // arrays of arrays: validated and skipped
    if (skip_value(c, et, 1, err, errlen) != 0) return -1;
  return 0;
trunc:
  utl_seterr(err, errlen, "metadata '%.*s': array of %llu elements runs past the end of the file",
         (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p, (unsigned long long)n);
  return -1;
}

static int parse_tensor(cur *c, mdl_gguf_tensor *t, uint64_t idx, char *err, size_t errlen) {
  uint32_t nd, type;
  if (rd_str(c, &t->name) != 0 || rd_u32(c, &nd) != 0) goto trunc;
  int nl = (int)(t->name.n > 200 ? 200 : t->name.n);
  if (nd > 4) {
    utl_seterr(err, errlen, "tensor '%.*s': %u dimensions (at most 4)", nl, t->name.p, nd);
    return -1;
  }
  t->n_dims = (int)nd;
  for (int i = 0; i < 4; i++) t->ne[i] = 1;
  for (uint32_t i = 0; i < nd; i++) {
    uint64_t v;
    if (rd_u64(c, &v) != 0) goto trunc;
    if (v > (uint64_t)INT64_MAX) {
      utl_seterr(err, errlen, "tensor '%.*s': dimension %u is negative", nl, t->name.p, i);
      return -1;
    }
    t->ne[i] = (int64_t)v;
  }
  if (rd_u32(c, &type) != 0 || rd_u64(c, &t->offset) != 0) goto trunc;
  if (!krn_type_known((int)type)) {
    utl_seterr(err, errlen,
               "tensor '%.*s': type %s (%u) is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K are)",
               nl, t->name.p, krn_type_name((int)type), type);
    return -1;
  }
  t->type = (int)type;
  uint64_t blk = (uint64_t)krn_type_block((int)type), bsz = krn_type_block_bytes((int)type);
  if (t->ne[0] % (int64_t)blk != 0) {
    utl_seterr(err, errlen, "tensor '%.*s': row of %lld elements is not a multiple of the %s block size %d", nl, t->name.p,
           (long long)t->ne[0], krn_type_name((int)type), (int)blk);
    return -1;
  }
  // nbytes = row_size(ne0) * ne1 * ne2 * ne3, checked for overflow (row size computed from the block count)
  uint64_t ne0 = (uint64_t)t->ne[0];
  uint64_t row = ne0 / blk > UINT64_MAX / bsz ? UINT64_MAX : (ne0 / blk) * bsz;
  uint64_t nb = row;
  for (int i = 1; i < 4; i++) {
    uint64_t d = (uint64_t)t->ne[i];
    if (d != 0 && nb > UINT64_MAX / d) nb = UINT64_MAX;
    else nb *= d;
  }
  if (nb == UINT64_MAX || nb > SIZE_MAX) {
    utl_seterr(err, errlen, "tensor '%.*s': size overflows", nl, t->name.p);
    return -1;
  }
  t->nbytes = (size_t)nb;
  return 0;
trunc:
  utl_seterr(err, errlen, "tensor info %llu runs past the end of the file", (unsigned long long)idx);
  return -1;
}

static void free_parts(mdl_gguf *g) {
  if (g->kv)
    for (uint64_t i = 0; i < g->n_kv; i++) free((void *)g->kv[i].str_offs);
  free(g->kv);
  free(g->tensors);
  g->kv = NULL;
  g->tensors = NULL;
}

static int parse(mdl_gguf *g, char *err, size_t errlen) {
  cur c = {g->base, g->size, 0};
  uint32_t magic;
  if (rd_u32(&c, &magic) != 0 || memcmp(g->base, "GGUF", 4) != 0) {
    (void)magic;
    utl_seterr(err, errlen, "not a GGUF file (bad magic)");
    return -1;
  }
  if (rd_u32(&c, &g->version) != 0) goto trunc;
  if (g->version != 2 && g->version != 3) {
    utl_seterr(err, errlen, "GGUF version %u is not supported (2 and 3 are)", g->version);
    return -1;
  }
  uint64_t nt, nkv;
  if (rd_u64(&c, &nt) != 0 || rd_u64(&c, &nkv) != 0) goto trunc;
  // each kv needs >= 13 bytes (key length, type, 1-byte value); each tensor info >= 24
  if (nkv > left(&c) / 13) {
    utl_seterr(err, errlen, "metadata count %llu is more than the file could hold", (unsigned long long)nkv);
    return -1;
  }
  if (nt > left(&c) / 24) {
    utl_seterr(err, errlen, "tensor count %llu is more than the file could hold", (unsigned long long)nt);
    return -1;
  }
  g->kv = calloc(nkv ? (size_t)nkv : 1, sizeof *g->kv);
  g->tensors = calloc(nt ? (size_t)nt : 1, sizeof *g->tensors);
  if (!g->kv || !g->tensors) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  for (uint64_t i = 0; i < nkv; i++) {
    g->n_kv = i + 1; // so that free_parts frees what was allocated so far
    if (parse_kv(&c, &g->kv[i], i, err, errlen) != 0) return -1;
  }
  g->n_kv = nkv;
  g->alignment = 32;
  const mdl_gguf_kv *al = mdl_gguf_find(g, "general.alignment");
  if (al) {
    int64_t a;
    if (mdl_gguf_get_i64(g, "general.alignment", &a) != 0 || a <= 0 || a > (int64_t)GGUF_MAX_ALIGN || (a & (a - 1)) != 0) {
      utl_seterr(err, errlen, "general.alignment is not a power of two integer up to %u", GGUF_MAX_ALIGN);
      return -1;
    }
    g->alignment = (uint64_t)a;
  }
  for (uint64_t i = 0; i < nt; i++) {
    if (parse_tensor(&c, &g->tensors[i], i, err, errlen) != 0) return -1;
  }
  g->n_tensors = nt;
  // data section: aligned start; each tensor aligned and inside the file
  uint64_t ds = ((uint64_t)c.pos + g->alignment - 1) / g->alignment * g->alignment;
  if (nt > 0 && ds > g->size) {
    utl_seterr(err, errlen, "data section starts at %llu, past the end of the file (%zu bytes)", (unsigned long long)ds, g->size);
    return -1;
  }
  uint64_t room = g->size > ds ? g->size - ds : 0;
  for (uint64_t i = 0; i < nt; i++) {
    mdl_gguf_tensor *t = &g->tensors[i];
    int nl = (int)(t->name.n > 200 ? 200 : t->name.n);
    if (t->offset % g->alignment != 0) {
      utl_seterr(err, errlen, "tensor '%.*s': offset %llu is not aligned to %llu", nl, t->name.p, (unsigned long long)t->offset,
             (unsigned long long)g->alignment);
      return -1;
    }
    if (t->offset > room || t->nbytes > room - t->offset) {
      utl_seterr(err, errlen, "tensor '%.*s': data [%llu, +%zu) runs past the end of the file", nl, t->name.p,
             (unsigned long long)t->offset, t->nbytes);
      return -1;
    }
    t->data = g->base + ds + t->offset;
  }
  return check_dups(g, err, errlen);
trunc:
  utl_seterr(err, errlen, "GGUF header runs past the end of the file");
  return -1;
}

static int open_common(const uint8_t *base, size_t size, int mapped, mdl_gguf **out, char *err, size_t errlen) {
  mdl_gguf *g = calloc(1, sizeof *g);
  if (!g) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  g->base = base;
  g->size = size;
  g->mapped = mapped;
  if (parse(g, err, errlen) != 0) {
    free_parts(g);
    g->mapped = 0; // the caller unmaps on failure
    free(g);
    return -1;
  }
  *out = g;
  return 0;
}

int mdl_gguf_open(const char *path, mdl_gguf **out, char *err, size_t errlen) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    utl_seterr(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    utl_seterr(err, errlen, "%s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    utl_seterr(err, errlen, "%s: not a regular file", path);
    close(fd);
    return -1;
  }
  if (st.st_size < 24) {
    utl_seterr(err, errlen, "%s: file of %lld bytes is too small to be GGUF", path, (long long)st.st_size);
    close(fd);
    return -1;
  }
  size_t size = (size_t)st.st_size;
  void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    utl_seterr(err, errlen, "%s: mmap: %s", path, strerror(errno));
    return -1;
  }
  char e2[256];
  if (open_common(m, size, 1, out, e2, sizeof e2) != 0) {
    munmap(m, size);
    utl_seterr(err, errlen, "%s: %s", path, e2);
    return -1;
  }
  return 0;
}

int mdl_gguf_from_memory(const void *buf, size_t len, mdl_gguf **out, char *err, size_t errlen) {
  *out = NULL;
  if (!buf || len < 24) {
    utl_seterr(err, errlen, "buffer of %zu bytes is too small to be GGUF", len);
    return -1;
  }
  return open_common(buf, len, 0, out, err, errlen);
}

void mdl_gguf_close(mdl_gguf *g) {
  if (!g) return;
  free_parts(g);
  if (g->mapped) munmap((void *)g->base, g->size);
  free(g->owned);
  free(g);
}

int mdl_str_eq(mdl_str s, const char *c) {
  size_t n = strlen(c);
  return s.n == n && (n == 0 || memcmp(s.p, c, n) == 0);
}

const mdl_gguf_kv *mdl_gguf_find(const mdl_gguf *g, const char *key) {
  if (!g || !key) return NULL;
  for (uint64_t i = 0; i < g->n_kv; i++)
    if (mdl_str_eq(g->kv[i].key, key)) return &g->kv[i];
  return NULL;
}

const mdl_gguf_tensor *mdl_gguf_tensor_find(const mdl_gguf *g, const char *name) {
  if (!g || !name) return NULL;
  for (uint64_t i = 0; i < g->n_tensors; i++)
    if (mdl_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
  return NULL;
}

// Reads an integer of type t at p; -1 for non-integer types or a u64 above INT64_MAX.
static int load_int(mdl_gguf_vtype t, const uint8_t *p, int64_t *out) {
  switch (t) {
  case MDL_GGUF_U8: { uint8_t v; memcpy(&v, p, 1); *out = v; return 0; }
  case MDL_GGUF_I8: { int8_t v; memcpy(&v, p, 1); *out = v; return 0; }
  case MDL_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); *out = v; return 0; }
  case MDL_GGUF_I16: { int16_t v; memcpy(&v, p, 2); *out = v; return 0; }
  case MDL_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); *out = v; return 0; }
  case MDL_GGUF_I32: { int32_t v; memcpy(&v, p, 4); *out = v; return 0; }
  case MDL_GGUF_I64: { int64_t v; memcpy(&v, p, 8); *out = v; return 0; }
  case MDL_GGUF_U64: {
    uint64_t v;
    memcpy(&v, p, 8);
    if (v > (uint64_t)INT64_MAX) return -1;
    *out = (int64_t)v;
    return 0;
  }
  default: return -1;
  }
}

static int load_float(mdl_gguf_vtype t, const uint8_t *p, float *out) {
  if (t == MDL_GGUF_F32) {
    memcpy(out, p, 4);
    return 0;
  }
  if (t == MDL_GGUF_F64) {
    double d;
    memcpy(&d, p, 8);
    *out = (float)d;
    return 0;
  }
  return -1;
}

int mdl_gguf_get_i64(const mdl_gguf *g, const char *key, int64_t *out) {
  const mdl_gguf_kv *kv = mdl_gguf_find(g, key);
  if (!kv) return -1;
  return load_int(kv->type, kv->val, out);
}

int mdl_gguf_get_f32(const mdl_gguf *g, const char *key, float *out) {
  const mdl_gguf_kv *kv = mdl_gguf_find(g, key);
  if (!kv) return -1;
  return load_float(kv->type, kv->val, out);
}

int mdl_gguf_get_str(const mdl_gguf *g, const char *key, mdl_str *out) {
  const mdl_gguf_kv *kv = mdl_gguf_find(g, key);
  if (!kv || kv->type != MDL_GGUF_STR) return -1;
  uint64_t n;
  memcpy(&n, kv->val, 8);
  out->p = (const char *)kv->val + 8;
  out->n = n;
  return 0;
}

int mdl_gguf_arr_str(const mdl_gguf_kv *kv, uint64_t i, mdl_str *out) {
  if (!kv || kv->type != MDL_GGUF_ARR || kv->arr_type != MDL_GGUF_STR || i >= kv->arr_n || !kv->str_offs) return -1;
  const uint8_t *p = kv->val + kv->str_offs[i];
  uint64_t n;
  memcpy(&n, p, 8);
  out->p = (const char *)p + 8;
  out->n = n;
  return 0;
}

int mdl_gguf_arr_i64(const mdl_gguf_kv *kv, uint64_t i, int64_t *out) {
  if (!kv || kv->type != MDL_GGUF_ARR || i >= kv->arr_n) return -1;
  int sz = vtype_size(kv->arr_type);
  if (sz <= 0) return -1;
  return load_int(kv->arr_type, kv->val + (size_t)i * (size_t)sz, out);
}

int mdl_gguf_arr_f32(const mdl_gguf_kv *kv, uint64_t i, float *out) {
  if (!kv || kv->type != MDL_GGUF_ARR || i >= kv->arr_n) return -1;
  int sz = vtype_size(kv->arr_type);
  if (sz <= 0) return -1;
  return load_float(kv->arr_type, kv->val + (size_t)i * (size_t)sz, out);
}
