// models/tok_unicode.h: Unicode category ranges (generated into tok_unicode.c) and the lookups the tokenizer uses.
#ifndef DSERVE_MDL_TOK_UNICODE_H
#define DSERVE_MDL_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct mdl_tok_range { uint32_t lo, hi; } mdl_tok_range; // inclusive, sorted, disjoint

extern const mdl_tok_range mdl_tok_letters[]; // \p{L}
extern const size_t mdl_tok_letters_n;
extern const mdl_tok_range mdl_tok_numbers[]; // \p{N}
extern const size_t mdl_tok_numbers_n;

int mdl_tok_is_letter(uint32_t cp);
int mdl_tok_is_number(uint32_t cp);
int mdl_tok_is_space(uint32_t cp); // the Unicode White_Space property (what \s matches)

#endif
