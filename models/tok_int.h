// models/tok_int.h: the tokenizer's private state, shared by its files (tokenizer.c: load and encode; tok_decode.c).
#ifndef DSERVE_MDL_TOK_INT_H
#define DSERVE_MDL_TOK_INT_H

#include <stddef.h>
#include <stdint.h>

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
  int split_digits; // smollm: every \p{N} code point is its own chunk before the GPT-2 split
  int32_t eog[8];
  int n_eog;
};

#endif
