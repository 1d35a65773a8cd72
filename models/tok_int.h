// models/tok_int.h: the tokenizer's private state, shared by its files (tokenizer.c: load and BPE encode; tok_spm.c:
// SentencePiece encode; tok_decode.c).
#ifndef DSERVE_MDL_TOK_INT_H
#define DSERVE_MDL_TOK_INT_H

#include <stddef.h>
#include <stdint.h>

#include <stdlib.h>

#include "models/tokenizer.h"

typedef struct mrg_slot {
  uint64_t key; // (left << 32) | right; MRG_EMPTY when free
  int32_t rank, merged;
} mrg_slot;
#define MRG_EMPTY UINT64_MAX

struct mdl_tok {
  int n_vocab;
  char *text;         // (owned) token texts, each NUL-terminated
  uint32_t *text_off; // (owned) (n_vocab)
  uint32_t *text_len; // (owned) (n_vocab)
  char *piece;        // (owned) decoded bytes of each token
  uint32_t *piece_off, *piece_len; // (owned) (n_vocab)
  uint8_t *type;      // (owned) (n_vocab) MDL_TOK_*
  int32_t *hmap;      // (owned) (hcap) token text -> id, -1 empty
  size_t hcap;
  mrg_slot *mmap;     // (owned) (mcap) pair of ids -> rank and merged id
  size_t mcap;
  int32_t byte_tok[256];     // id of the token for each raw byte
  uint16_t byte_to_cp[256];  // GPT-2 byte -> printable code point
  int16_t cp_to_byte[512];   // inverse, -1 where none
  int32_t *special;          // (owned) (n_special) control/user/unknown ids, longest text first
  size_t n_special;
  int32_t bos, eos, pad, unk;
  int add_bos;
  int pre;           // gpt2 BPE's pre-tokenizer (tokenizer.ggml.pre): MDL_PRE_*
  int ignore_merges; // llama-bpe: a pre-tokenized word that is a token of its own is that token, merges or not
  int spm;          // 1: tokenizer.ggml.model "llama" (SentencePiece BPE over scores), 0: GPT-2 byte-level BPE
  float *score;     // (owned) (n_vocab) spm: merge priority of each token (higher merges first); NULL for gpt2
  int add_space_prefix; // spm: a raw fragment after a special token (or at the start) gets a leading space
  int32_t eog[16];
  int n_eog;
};

// The pre-tokenizers (regular expressions in llama.cpp's src/llama-vocab.cpp, implemented by hand in tokenizer.c):
// GPT-2's; smollm's (every \p{N} code point apart, then GPT-2's); Llama 3's (llama-bpe: contractions in either case,
// one non-letter before letters, numbers in runs of up to 3, punctuation with the newlines after it, whitespace
// ending at its last newline); Qwen 2's (qwen2: Llama 3's with numbers one by one).
enum { MDL_PRE_GPT2 = 0, MDL_PRE_SMOLLM = 1, MDL_PRE_LLAMA3 = 2, MDL_PRE_QWEN2 = 3 };

// A growable array of token ids (the encoder's output).
typedef struct tok_ivec {
  int32_t *v;
  size_t n, cap;
} tok_ivec;

static inline int tok_ivec_push(tok_ivec *a, int32_t x) {
  if (a->n == a->cap) {
    size_t nc = a->cap ? a->cap * 2 : 64;
    int32_t *nv = (int32_t *)realloc(a->v, nc * sizeof *nv);
    if (!nv) return -1;
    a->v = nv;
    a->cap = nc;
  }
  a->v[a->n++] = x;
  return 0;
}

// ---- tok_vocab.c: the floor every tokenizer file calls down to ----
// Token id of the exact text p (n bytes), -1 if none.
int32_t mdl_tok_find_n(const mdl_tok *t, const char *p, size_t n);
void mdl_tok_hmap_put(mdl_tok *t, int32_t id); // id's text into the text -> id map (hmap of hcap slots)
// The merge of the pair (l, r), or NULL; mdl_tok_mrg_put adds one (mmap of mcap slots).
const mrg_slot *mdl_tok_mrg_find(const mdl_tok *t, int32_t l, int32_t r);
void mdl_tok_mrg_put(mdl_tok *t, int32_t l, int32_t r, int32_t rank, int32_t merged);
size_t mdl_tok_pow2_at_least(size_t n); // a hash map's slot count for n entries: a power of two >= n, >= 16
// The code point at s[*i] (n bytes), moving *i past it; an invalid byte reads as U+FFFD and moves one byte.
uint32_t mdl_tok_cp_next(const uint8_t *s, size_t n, size_t *i);
size_t mdl_tok_cp_put(uint8_t *out, uint32_t cp); // cp as UTF-8 into out (4 bytes room); the bytes written
// SentencePiece encoding of one raw fragment (no special tokens in it) onto out: spaces become U+2581, the
// highest-scoring adjacent pair whose concatenation is a token merges first (leftmost on ties), and a final
// piece that is no token falls back to its bytes' <0xXX> tokens, as llama.cpp's llm_tokenizer_spm does.
// prefix_space: prepend one space first. 0, or -1 when out of memory (tok_spm.c).
int mdl_tok_spm_encode(const mdl_tok *t, const uint8_t *s, size_t n, int prefix_space, tok_ivec *out);

#endif
