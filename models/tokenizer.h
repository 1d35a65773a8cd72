// models/tokenizer.h: GPT-2 byte-level BPE and SentencePiece tokenizers built from GGUF metadata (tokenizer.ggml.*), plus
// streaming detokenizer.
#ifndef DSERVE_MDL_TOKENIZER_H
#define DSERVE_MDL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "models/gguf.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// The longest token text accepted at load (bytes); a vocabulary with a longer token is refused.
#define MDL_TOK_MAX_PIECE 512

// GGUF token types (tokenizer.ggml.token_type).
enum { MDL_TOK_NORMAL = 1, MDL_TOK_UNKNOWN = 2, MDL_TOK_CONTROL = 3, MDL_TOK_USER = 4, MDL_TOK_UNUSED = 5, MDL_TOK_BYTE = 6 };

typedef struct mdl_tok mdl_tok; // immutable once loaded: safe to share between threads

// Loads tokenizer.ggml.model "gpt2" with pre-tokenizer tokenizer.ggml.pre "smollm", "llama-bpe" (Llama 3), "qwen2"
// (Qwen 2.5) or "gpt2"/"default" (an unknown name is a load error naming these), or "llama"
// (SentencePiece: tokenizer.ggml.scores, <0xXX> byte fallback, U+2581 for spaces, tokenizer.ggml.add_space_prefix).
// Everything is copied: the tokenizer does not borrow from g.
int mdl_tok_load(const mdl_gguf *g, mdl_tok **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void mdl_tok_free(mdl_tok *t);

// Encodes len bytes of text (no BOS is added). Control tokens written in the text (<|im_start|> ...) are matched only
// when parse_special; user-defined tokens always. Invalid UTF-8 bytes are encoded as U+FFFD (gpt2) or as their <0xXX>
// byte tokens (SentencePiece), as llama.cpp does.
// *ids (n_ids) is malloc'ed; the caller frees it. Linear-ish in len (no quadratic paths).
int mdl_tok_encode(const mdl_tok *t, const char *text, size_t len, int parse_special, int32_t **ids, size_t *n_ids,
                   char *err, size_t errlen) UTL_WARN_UNUSED;
// mdl_tok_encode with parse_special, except that a control token's text overlapping one of the spans ((n_spans, 2)
// offset and length pairs into text, in order: the request's own text in a rendered chat, mdl_chat_render) is
// encoded as ordinary text. Outside the spans the ids are exactly mdl_tok_encode's.
int mdl_tok_encode_guarded(const mdl_tok *t, const char *text, size_t len, const size_t *spans, size_t n_spans,
                           int32_t **ids, size_t *n_ids, char *err, size_t errlen) UTL_WARN_UNUSED;

int mdl_tok_n_vocab(const mdl_tok *t);
int32_t mdl_tok_bos(const mdl_tok *t); // -1 when the model has none
int32_t mdl_tok_eos(const mdl_tok *t);
int32_t mdl_tok_pad(const mdl_tok *t);
int32_t mdl_tok_unk(const mdl_tok *t);
int mdl_tok_add_bos(const mdl_tok *t); // tokenizer.ggml.add_bos_token (0 for SmolLM2)
// End of generation (llama.cpp's set): eos, tokenizer.ggml.eot_token_id and eom_token_id, and <|im_end|>,
// <|endoftext|>, <|eot_id|>, <|eom_id|>, <|end|>, <|end_of_text|>, <end_of_turn>, <EOT>, <end_of_utterance> when the
// vocabulary has them.
int mdl_tok_is_eog(const mdl_tok *t, int32_t id);
int mdl_tok_is_control(const mdl_tok *t, int32_t id);
int mdl_tok_type(const mdl_tok *t, int32_t id); // MDL_TOK_*, 0 when id is out of range

int32_t mdl_tok_find(const mdl_tok *t, const char *piece); // id of this exact token text, -1 if none

// Raw bytes of one token (byte-level unmapped; control/user tokens as their text). Returns the full length; copies
// at most cap bytes (no NUL added). 0 for an out-of-range id.
size_t mdl_tok_piece(const mdl_tok *t, int32_t id, char *buf, size_t cap);

// Concatenated pieces of ids (n) into *text (malloc'ed, NUL-terminated, *len bytes without the NUL). The bytes are
// returned as they are (possibly invalid UTF-8). Fails on an out-of-range id.
int mdl_tok_decode(const mdl_tok *t, const int32_t *ids, size_t n, char **text, size_t *len, char *err,
                   size_t errlen) UTL_WARN_UNUSED;

// Incremental detokenizer: emits text only at complete UTF-8 characters; bytes that cannot start or continue a valid
// character are emitted as U+FFFD at once, and an incomplete tail is emitted as U+FFFD by flush, so a stream never
// stalls. Control tokens are emitted as their text (callers stop at mdl_tok_is_eog before pushing them).
typedef struct mdl_detok mdl_detok;
// T borrowed: must outlive the detok
int mdl_detok_new(const mdl_tok *t, mdl_detok **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void mdl_detok_free(mdl_detok *d);
// Appends the piece of id; *text (borrowed, valid until the next call on d) gets the newly complete text, *len bytes
// (possibly 0). Returns 0, or -1 for an out-of-range id (which adds nothing).
int mdl_detok_push(mdl_detok *d, int32_t id, const char **text, size_t *len);
// Emits whatever is held back (as U+FFFD) and resets d for a new stream.
void mdl_detok_flush(mdl_detok *d, const char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
