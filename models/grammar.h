// models/grammar.h: grammar-constrained decoding: a context-free grammar over bytes, a matcher that follows it byte by
// byte (a pushdown automaton: a set of stacks), and the mask of the vocabulary's tokens that can continue it.
//
// A grammar is built rule by rule (mdl_grammar_builder), checked and frozen (mdl_grammar_finish), then shared: it is
// immutable apart from a locked cache of token masks per matcher state, and reference counted. A matcher is one
// request's position in it. The mask walks a trie of the vocabulary's token bytes (mdl_grammar_vocab) from the
// matcher's stacks, pruning a subtree at the first byte no stack can take. JSON Schema compiles to a grammar in
// models/json_schema.c (mdl_grammar_from_json_schema).
#ifndef DSERVE_MDL_GRAMMAR_H
#define DSERVE_MDL_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "models/tokenizer.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- building ----

// Bounds a grammar (and so a schema) may not pass: symbols over all rules, and rules.
#define MDL_GRAMMAR_MAX_SYMS (1u << 22)
#define MDL_GRAMMAR_MAX_RULES (1u << 20)

// A symbol is a byte set's id (a terminal: one byte in the set) or MDL_GRAMMAR_REF(rule) (a nonterminal).
#define MDL_GRAMMAR_REF(rule) (0x80000000u | (uint32_t)(rule))

typedef struct mdl_grammar_builder mdl_grammar_builder;

// One alternative being written: a sequence of symbols. Zero-initialise; free with mdl_grammar_seq_free. Pushing
// never fails visibly: on out of memory the sequence is marked and mdl_grammar_alt refuses it.
typedef struct mdl_grammar_seq {
  uint32_t *sym; // (owned) (n)
  int n, cap;
  int oom;
} mdl_grammar_seq;

mdl_grammar_builder *mdl_grammar_builder_new(void); // NULL on out of memory
void mdl_grammar_builder_free(mdl_grammar_builder *b);
int mdl_grammar_rule_new(mdl_grammar_builder *b);   // a new rule with no alternative yet; -1 when out of memory/room
// The id of the byte set set (256 bits, bit b = byte b), shared by equal sets; -1 when out of memory.
int mdl_grammar_set(mdl_grammar_builder *b, const uint8_t set[32]);
void mdl_grammar_seq_push(mdl_grammar_seq *s, uint32_t sym);
void mdl_grammar_seq_append(mdl_grammar_seq *s, const mdl_grammar_seq *tail);
void mdl_grammar_seq_bytes(mdl_grammar_builder *b, mdl_grammar_seq *s, const void *bytes, size_t n); // literal
void mdl_grammar_seq_range(mdl_grammar_builder *b, mdl_grammar_seq *s, uint8_t lo, uint8_t hi);     // one byte
void mdl_grammar_seq_free(mdl_grammar_seq *s);
// Adds s (copied) as an alternative of rule. 0, or -1 (out of memory, too large, or s is marked).
int mdl_grammar_alt(mdl_grammar_builder *b, int rule, const mdl_grammar_seq *s);
// A rule matching item repeated min..max times (max < 0: no bound), with sep between two items (sep may be NULL).
// Right-recursive, so a long repetition keeps the matcher's stacks flat. The rule id, or -1.
int mdl_grammar_repeat(mdl_grammar_builder *b, const mdl_grammar_seq *item, const mdl_grammar_seq *sep, int min,
                       int max);
int mdl_grammar_builder_failed(const mdl_grammar_builder *b); // 1 once something ran out of memory or room

typedef struct mdl_grammar mdl_grammar;

// Freezes the rules reachable from root into a grammar (*out, one reference). Alternatives that can never finish
// (they need a rule with no finite expansion) are dropped; fails when root itself has none, or when a rule can reach
// itself without consuming a byte (left recursion: the matcher would loop). b stays the caller's to free.
int mdl_grammar_finish(mdl_grammar_builder *b, int root, mdl_grammar **out, char *err, size_t errlen) UTL_WARN_UNUSED;
mdl_grammar *mdl_grammar_ref(mdl_grammar *g); // one more reference; returns g
void mdl_grammar_unref(mdl_grammar *g);       // NULL is a no-op; the last reference frees it
int mdl_grammar_n_rules(const mdl_grammar *g);
size_t mdl_grammar_n_elems(const mdl_grammar *g);

// 1 when the n bytes at s are a complete sentence of g.
int mdl_grammar_matches(const mdl_grammar *g, const void *s, size_t n);

// JSON Schema (schema: the schema's JSON text, len bytes; models/json_schema.c, docs/openai.md lists the keywords).
// schema NULL: any JSON object (response_format json_object). 0; -1 with err for a schema that is not valid JSON or
// not a schema; MDL_GRAMMAR_UNSUPPORTED with err naming the keyword (and where it is) for what is not supported.
#define MDL_GRAMMAR_UNSUPPORTED (-2)
int mdl_grammar_from_json_schema(const char *schema, size_t len, mdl_grammar **out, char *err,
                                 size_t errlen) UTL_WARN_UNUSED;

// Tool calls (tool_choice "required" or a named function): open CALL close, or with parallel one or more of them
// separated by sep, where CALL is {"name": NAME, "ARGS_KEY": ARGS} for one of the tools (args_key NULL: "arguments";
// Llama 3's templates write "parameters"): tools (len bytes) is the
// JSON text of an array of {"name": string, "parameters": JSON Schema (absent: any JSON object)}, each parameters
// schema compiled as mdl_grammar_from_json_schema does (its own root for local $refs). open, close and sep are the
// template's literals (models/chat.h mdl_chat_tool_style). The statuses are mdl_grammar_from_json_schema's; err names
// the tool whose schema failed.
int mdl_grammar_from_tool_calls(const char *tools, size_t len, const char *open, const char *close, const char *sep,
                                const char *args_key, int parallel, mdl_grammar **out, char *err,
                                size_t errlen) UTL_WARN_UNUSED;

// ---- vocabulary ----

typedef struct mdl_grammar_vocab mdl_grammar_vocab; // immutable: share it between matchers and threads

// The trie of t's text tokens (normal, byte and user-defined ones; control, unknown and unused tokens are never
// allowed by a grammar) and its end-of-generation tokens (mdl_tok_is_eog), allowed only where the grammar may end.
int mdl_grammar_vocab_from_tok(const mdl_tok *t, mdl_grammar_vocab **out, char *err, size_t errlen) UTL_WARN_UNUSED;
// The same from explicit pieces (piece[i] NULL or len[i] 0: not a text token) and end-of-generation ids.
int mdl_grammar_vocab_new(int n_vocab, const char *const *piece, const size_t *len, const int32_t *eog, int n_eog,
                          mdl_grammar_vocab **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void mdl_grammar_vocab_free(mdl_grammar_vocab *v);
int mdl_grammar_vocab_n(const mdl_grammar_vocab *v);           // n_vocab: a mask has (n_vocab + 31) / 32 words
int mdl_grammar_vocab_is_eog(const mdl_grammar_vocab *v, int32_t token);

// ---- matching ----

typedef struct mdl_grammar_matcher mdl_grammar_matcher; // one request's position; not thread-safe

// g and v are borrowed and must outlive the matcher; v may be NULL for byte-level use (no tokens, no masks).
int mdl_grammar_matcher_new(const mdl_grammar *g, const mdl_grammar_vocab *v, mdl_grammar_matcher **out, char *err,
                            size_t errlen) UTL_WARN_UNUSED;
void mdl_grammar_matcher_free(mdl_grammar_matcher *m);
// Advances by n bytes: 0, or -1 when the grammar cannot take them (the state is then unchanged).
int mdl_grammar_matcher_accept_bytes(mdl_grammar_matcher *m, const void *bytes, size_t n);
// 1 when the grammar can take the n bytes next (the state is not changed).
int mdl_grammar_matcher_can_take(mdl_grammar_matcher *m, const void *bytes, size_t n);
// Advances by a token's bytes; an end-of-generation token is taken only where the grammar may end and ends the
// matcher. 0, or -1 (rejected: the matcher is then dead and allows only end-of-generation, so the output ends).
int mdl_grammar_matcher_accept_token(mdl_grammar_matcher *m, int32_t token);
// bits ((n_vocab + 31) / 32 words): bit t set when token t can come next. End-of-generation tokens are set only
// where the output may end; a finished or dead matcher allows only them.
void mdl_grammar_matcher_mask(mdl_grammar_matcher *m, uint32_t *bits);
// The mask from the grammar's cache only: 1 when this state's mask was there (bits filled), else 0 (bits undefined).
int mdl_grammar_matcher_mask_cached(mdl_grammar_matcher *m, uint32_t *bits);
// A mask costs at most this many parse steps (about 40 ms on a 2-core machine). A grammar so ambiguous that one
// mask needs more (nested repetitions in a pattern, e.g. "^([a-z]{1,9}){1,9}$": each split is a reading of its own)
// is cut there: mdl_grammar_matcher_too_costly says so, the mask allows only end-of-generation, and the caller ends
// the request with an error rather than slow every request that shares the worker. The grammar remembers it: every
// other matcher of it is too costly at its next walk, at no cost (n rows of one request pay the bound once).
#define MDL_GRAMMAR_MASK_WORK 1000000
// What a worker tells the client then (code grammar_too_complex, HTTP 400).
#define MDL_GRAMMAR_TOO_COSTLY_MESSAGE                                                                              \
  "the response_format or tool schema is too ambiguous to follow: one token needed over 1000000 parse steps "      \
  "(nested repetitions in a pattern, such as ^([a-z]{1,9}){1,9}$, read each text many ways); simplify the schema"
int mdl_grammar_matcher_too_costly(const mdl_grammar_matcher *m);
// 1 when token can come next (the mask's bit for it, computed for that token alone; the state is not changed).
int mdl_grammar_matcher_allows(mdl_grammar_matcher *m, int32_t token);
int mdl_grammar_matcher_can_end(const mdl_grammar_matcher *m); // the output so far is a complete sentence
// Nothing but the end can come: complete with no possible continuation, ended by end-of-generation, or dead.
int mdl_grammar_matcher_done(const mdl_grammar_matcher *m);

#ifdef __cplusplus
}
#endif
#endif
