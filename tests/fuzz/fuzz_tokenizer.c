// tests/fuzz/fuzz_tokenizer.c: libFuzzer target: BPE encode/decode round trip and the streaming detokenizer.
// The tokenizer is loaded once: from the real model when it is present (read-only mmap), otherwise from a tiny
// byte-level GGUF built here in memory. decode(encode(x)) == x is checked for valid UTF-8 inputs.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Loaded once for the process (libFuzzer has no context argument); never written after init.
static mdl_gguf *g_gguf;
static mdl_tok *g_tok;
static uint8_t *g_mem; // the in-memory GGUF when the real model is absent (owned)
// Bytes whose byte-level token the vocabulary lacks (SmolLM2 has no token for 0x1D): llama.cpp drops them when
// encoding, and so do we, so inputs holding one are left out of the round-trip check. (256)
static uint8_t g_missing[256];

// ---- a tiny GGUF writer ----
typedef struct buf { uint8_t *p; size_t n, cap; } buf;
static void put(buf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) { put_u64(b, strlen(s)); put(b, s, strlen(s)); }
static void put_key(buf *b, const char *k, uint32_t type) { put_str(b, k); put_u32(b, type); }

// GPT-2 bytes_to_unicode: byte -> UTF-8 of its printable stand-in.
static void byte_char(int byte, char out[4]) {
  int printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174 && byte <= 255);
  unsigned cp;
  if (printable) {
    cp = (unsigned)byte;
  } else {
    int k = 0;
    for (int b = 0; b < byte; b++)
      if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) k++;
    cp = 256u + (unsigned)k;
  }
  memset(out, 0, 4);
  if (cp < 0x80) {
    out[0] = (char)cp;
  } else {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
  }
}

static uint8_t *tiny_gguf(size_t *len) {
  static const char *const merges[] = {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ġ s", "o n"};
  static const char *const merged[] = {"Ġt", "he", "Ġthe", "in", "Ġa", "er", "Ġs", "on"};
  static const char *const special[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const uint64_t n_merge = sizeof merges / sizeof *merges, n_special = sizeof special / sizeof *special;
  const uint64_t n_tok = n_special + 256 + n_merge;
  buf b = {0};
  put(&b, "GGUF", 4);
  put_u32(&b, 3);
  put_u64(&b, 0); // tensors
  put_u64(&b, 7); // kvs
  put_key(&b, "tokenizer.ggml.model", 8);
  put_str(&b, "gpt2");
  put_key(&b, "tokenizer.ggml.pre", 8);
  put_str(&b, "smollm");
  put_key(&b, "tokenizer.ggml.tokens", 9);
  put_u32(&b, 8);
  put_u64(&b, n_tok);
  for (uint64_t i = 0; i < n_special; i++) put_str(&b, special[i]);
  for (int c = 0; c < 256; c++) {
    char u[4];
    byte_char(c, u);
    put_str(&b, u);
  }
  for (uint64_t i = 0; i < n_merge; i++) put_str(&b, merged[i]);
  put_key(&b, "tokenizer.ggml.token_type", 9);
  put_u32(&b, 5);
  put_u64(&b, n_tok);
  for (uint64_t i = 0; i < n_tok; i++) put_u32(&b, i < n_special ? 3 : 1);
  put_key(&b, "tokenizer.ggml.merges", 9);
  put_u32(&b, 8);
  put_u64(&b, n_merge);
  for (uint64_t i = 0; i < n_merge; i++) put_str(&b, merges[i]);
  put_key(&b, "tokenizer.ggml.bos_token_id", 4);
  put_u32(&b, 1);
  put_key(&b, "tokenizer.ggml.eos_token_id", 4);
  put_u32(&b, 2);
  *len = b.n;
  return b.p;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  char err[256];
  const char *model = getenv("DSERVE_FUZZ_MODEL"); // "" forces the tiny vocabulary
  if (!model) model = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (model[0] && mdl_gguf_open(model, &g_gguf, err, sizeof err) == 0) {
    fprintf(stderr, "fuzz_tokenizer: vocabulary of %s\n", model);
  } else {
    size_t len;
    g_mem = tiny_gguf(&len);
    if (mdl_gguf_from_memory(g_mem, len, &g_gguf, err, sizeof err) != 0) {
      fprintf(stderr, "fuzz_tokenizer: tiny GGUF refused: %s\n", err);
      abort();
    }
    fprintf(stderr, "fuzz_tokenizer: tiny in-memory vocabulary (no model file)\n");
  }
  if (mdl_tok_load(g_gguf, &g_tok, err, sizeof err) != 0) {
    fprintf(stderr, "fuzz_tokenizer: mdl_tok_load: %s\n", err);
    abort();
  }
  int n_missing = 0;
  for (int b = 0; b < 256; b++) {
    char u[5] = {0};
    byte_char(b, u);
    g_missing[b] = mdl_tok_find(g_tok, u) < 0;
    n_missing += g_missing[b];
  }
  fprintf(stderr, "fuzz_tokenizer: %d bytes have no byte-level token (left out of the round-trip check)\n", n_missing);
  return 0;
}

// 1 when s (n) is valid UTF-8: shortest forms, no surrogates, nothing past U+10FFFF.
static int utf8_valid(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    size_t k;
    uint32_t cp;
    if (c < 0x80) { i++; continue; }
    if (c >= 0xC2 && c <= 0xDF) { k = 1; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { k = 2; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { k = 3; cp = c & 0x07; }
    else return 0;
    for (size_t j = 1; j <= k; j++) {
      if (i + j >= n || (s[i + j] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return 0;
    i += k + 1;
  }
  return 1;
}

static void check(const uint8_t *data, size_t size, int parse_special, int valid) {
  char err[256];
  int32_t *ids = NULL;
  size_t n = 0;
  if (mdl_tok_encode(g_tok, (const char *)data, size, parse_special, &ids, &n, err, sizeof err) != 0) {
    if (err[0] == 0) abort();
    return;
  }
  int nv = mdl_tok_n_vocab(g_tok);
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= nv) abort();
  char *text = NULL;
  size_t len = 0;
  if (mdl_tok_decode(g_tok, ids, n, &text, &len, err, sizeof err) != 0) abort(); // every id came from encode
  if (text[len] != 0) abort();
  if (valid && (len != size || memcmp(text, data, size) != 0)) {
    fprintf(stderr, "fuzz_tokenizer: decode(encode(x)) != x (parse_special %d, %zu bytes in, %zu out)\n", parse_special,
            size, len);
    abort();
  }
  // The streaming detokenizer, fed the same ids, emits the same text when it is valid UTF-8.
  mdl_detok *d = NULL;
  if (mdl_detok_new(g_tok, &d, err, sizeof err) != 0) abort();
  char *acc = malloc(len * 3 + 16);
  size_t an = 0;
  if (!acc) abort();
  for (size_t i = 0; i < n; i++) {
    const char *t;
    size_t tl;
    if (mdl_detok_push(d, ids[i], &t, &tl) != 0) abort();
    if (an + tl > len * 3 + 16) abort(); // more than 3 bytes (U+FFFD) per input byte
    memcpy(acc + an, t, tl);
    an += tl;
  }
  const char *t;
  size_t tl;
  mdl_detok_flush(d, &t, &tl);
  if (an + tl > len * 3 + 16) abort();
  memcpy(acc + an, t, tl);
  an += tl;
  if (!utf8_valid((const uint8_t *)acc, an)) abort(); // the stream is always valid UTF-8
  if (utf8_valid((const uint8_t *)text, len) && (an != len || memcmp(acc, text, len) != 0)) {
    fprintf(stderr, "fuzz_tokenizer: streamed text differs from decode (%zu vs %zu bytes)\n", an, len);
    abort();
  }
  if (mdl_detok_push(d, nv, &t, &tl) != -1 || mdl_detok_push(d, -1, &t, &tl) != -1) abort(); // out of range
  mdl_detok_free(d);
  free(acc);
  free(text);
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 8192) return 0; // encode is linear-ish; keeps each run short
  int valid = utf8_valid(data, size);
  for (size_t i = 0; i < size && valid; i++)
    if (g_missing[data[i]]) valid = 0;
  check(data, size, 0, valid);
  check(data, size, 1, valid);
  char piece[64];
  for (size_t i = 0; i + 4 <= size && i < 64; i += 4) { // ids read off the input, in and out of range
    int32_t id;
    memcpy(&id, data + i, 4);
    (void)mdl_tok_piece(g_tok, id, piece, sizeof piece);
    (void)mdl_tok_type(g_tok, id);
    (void)mdl_tok_is_eog(g_tok, id);
  }
  return 0;
}
