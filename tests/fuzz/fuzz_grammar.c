// tests/fuzz/fuzz_grammar.c: libFuzzer target: a JSON Schema from the input compiled to a grammar, then followed byte
// by byte and token by token (masks over a small vocabulary), each step checked against the byte-level matcher.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A vocabulary of JSON-shaped pieces and the printable ASCII bytes, so masks exercise the trie walk; token 0 is the
// end of generation.
static const char *const PIECES[] = {"true", "false", "null", "\"a\"", "{\"", "\":", "\",\"", "12", "\\u00", "\n", "\t"};
enum { N_PIECES = sizeof PIECES / sizeof PIECES[0], N_BYTES = 0x7f - 0x20, N_VOCAB = 1 + N_PIECES + N_BYTES };

// Input: the schema's text up to the first 0xFF byte (all of it when there is none: then json_object mode, with the
// whole input as the bytes to follow); after the 0xFF, the bytes to follow, each one also picking a token to try (itself when
// printable, else a piece).
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *sep = memchr(data, 0xFF, size);
  const char *schema = sep ? (const char *)data : NULL;
  size_t slen = sep ? (size_t)(sep - data) : 0;
  const uint8_t *follow = sep ? sep + 1 : data;
  size_t nf = sep ? size - slen - 1 : size;
  mdl_grammar *g = NULL;
  char err[256];
  if (mdl_grammar_from_json_schema(schema, slen, &g, err, sizeof err)) {
    if (!err[0]) abort(); // every refusal says why
    return 0;
  }
  const char *piece[N_VOCAB] = {NULL};
  size_t len[N_VOCAB] = {0};
  char bytes1[N_BYTES];
  for (int i = 0; i < N_PIECES; i++) piece[i + 1] = PIECES[i], len[i + 1] = strlen(PIECES[i]);
  for (int i = 0; i < N_BYTES; i++) {
    bytes1[i] = (char)(0x20 + i);
    piece[1 + N_PIECES + i] = &bytes1[i], len[1 + N_PIECES + i] = 1;
  }
  int32_t eog = 0;
  mdl_grammar_vocab *v = NULL;
  mdl_grammar_matcher *bytes = NULL, *toks = NULL;
  if (mdl_grammar_vocab_new(N_VOCAB, piece, len, &eog, 1, &v, err, sizeof err) ||
      mdl_grammar_matcher_new(g, NULL, &bytes, err, sizeof err) || mdl_grammar_matcher_new(g, v, &toks, err, sizeof err))
    abort();
  uint32_t mask[(N_VOCAB + 31) / 32];
  for (size_t i = 0; i < nf && i < 4096; i++) {
    // the byte-level matcher: can_take agrees with accept_bytes
    int can = mdl_grammar_matcher_can_take(bytes, &follow[i], 1);
    if (can != (mdl_grammar_matcher_accept_bytes(bytes, &follow[i], 1) == 0)) abort();
    // the token matcher: the mask agrees with allows and with can_take of the piece, and a masked token is taken
    if (mdl_grammar_matcher_done(toks)) continue;
    mdl_grammar_matcher_mask(toks, mask);
    // the input byte itself when it is a printable token, else a piece
    int t = follow[i] >= 0x20 && follow[i] < 0x7f ? 1 + N_PIECES + (follow[i] - 0x20) : 1 + follow[i] % N_PIECES;
    int bit = (mask[t / 32] >> (t % 32)) & 1;
    if (bit != mdl_grammar_matcher_allows(toks, t)) abort();
    if (bit != mdl_grammar_matcher_can_take(toks, piece[t], len[t])) abort();
    // end-of-generation (token 0) where the output may end, or where no token of this vocabulary continues it
    int others = (mask[0] & ~1u) != 0;
    for (size_t w = 1; w < sizeof mask / sizeof mask[0]; w++) others |= mask[w] != 0;
    if ((mask[0] & 1) != (mdl_grammar_matcher_can_end(toks) || !others)) abort();
    if (bit && mdl_grammar_matcher_accept_token(toks, t)) abort();
  }
  mdl_grammar_matcher_free(toks);
  mdl_grammar_matcher_free(bytes);
  mdl_grammar_vocab_free(v);
  mdl_grammar_unref(g);
  return 0;
}
