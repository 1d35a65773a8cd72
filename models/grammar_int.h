// models/grammar_int.h: the frozen grammar's and the vocabulary trie's layouts, shared by grammar.c (building),
// grammar_vocab.c (the trie) and grammar_match.c (matching).
#ifndef DSERVE_MDL_GRAMMAR_INT_H
#define DSERVE_MDL_GRAMMAR_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "models/grammar.h"

// An element: 2 bits of kind, 30 of value. Each alternative is its terminals and rule references, then E_ALT (another
// alternative of the same rule follows) or E_END (the rule's last one); a position at either means "this alternative
// is done: return to the caller".
enum { E_TERM = 0, E_REF = 1, E_ALT = 2, E_END = 3 };
#define E_KIND(e) ((e) >> 30)
#define E_VAL(e) ((e) & 0x3fffffffu)
#define E_MAKE(k, v) (((uint32_t)(k) << 30) | (uint32_t)(v))

// One cached mask: the allowed tokens of one matcher state over one vocabulary.
typedef struct gr_mask_entry {
  uint64_t vocab_id;  // the vocabulary's content hash
  uint64_t hash;      // of key
  uint32_t *key;      // (owned) (n_key) the state: its stacks' positions, top to bottom, each stack ended by ~0u
  uint32_t n_key;
  uint32_t *bits;     // (owned) ((n_vocab + 31) / 32)
  uint32_t n_words;
  uint64_t used;      // last use (LRU tick)
} gr_mask_entry;

// For a byte set B over a vocabulary: the tokens made only of B's bytes, and the trie nodes one byte outside B*
// (their parent's path is in B*, their own byte is not), in preorder. A state that every byte of B leaves as it is
// accepts the former whole and needs a walk only from the latter (models/grammar_match.c).
typedef struct gr_loop_entry {
  uint64_t vocab_id;
  uint8_t set[32];    // B
  uint32_t *bits;     // (owned) ((n_vocab + 31) / 32) the tokens in B+
  uint32_t *esc;      // (owned) (n_esc) pairs: a trie node, its parent (0: the root)
  uint32_t n_esc;
  uint64_t used;
} gr_loop_entry;

#define GR_LOOP_MAX 8 // byte sets kept per grammar (a JSON schema has a few: string characters, pattern classes)

// Mask cache bound per grammar, in bytes of masks (at least GR_CACHE_MIN entries whatever the vocabulary).
#define GR_CACHE_BYTES (2u << 20)
#define GR_CACHE_MIN 16

struct mdl_grammar {
  atomic_int refs;
  atomic_int too_costly; // some matcher's mask passed MDL_GRAMMAR_MASK_WORK: every matcher of it ends at its next walk
  uint32_t *elem;      // (owned) (n_elem) E_MAKE(kind, value): value = byte set id (E_TERM) or rule id (E_REF)
  uint32_t n_elem;
  uint32_t *alt;       // (owned) (n_alt) where each alternative starts in elem
  uint32_t *rule_alt;  // (owned) (n_rule + 1) rule r's alternatives are alt[rule_alt[r] .. rule_alt[r + 1])
  int n_rule;
  uint8_t (*set)[32];  // (owned) (n_set) the terminals' byte sets
  int n_set;
  int root;
  // What a byte can start, so a matcher enters only the alternatives that can take it (models/grammar_match.c)
  uint8_t (*first_alt)[32];  // (owned) (n_alt) bytes a non-empty expansion of the alternative can start with
  uint8_t *alt_nullable;     // (owned) (n_alt) 1 when the alternative can expand to nothing
  uint8_t (*first_rule)[32]; // (owned) (n_rule) the union over the rule's alternatives
  uint8_t *rule_nullable;    // (owned) (n_rule)
  pthread_mutex_t mu;     // guards the mask cache below (matchers on several threads share a grammar)
  gr_mask_entry *cache;   // (owned) (n_cache)
  int n_cache, cap_cache;
  uint64_t tick;
  gr_loop_entry loop[GR_LOOP_MAX]; // (owned) (n_loop) under mu too
  int n_loop;
};

// A vocabulary's token trie (models/grammar_vocab.c), read by the matcher's walks.
struct mdl_grammar_vocab {
  int n_vocab;
  char *blob;          // (owned) every text token's bytes
  uint32_t *piece_off; // (owned) (n_vocab)
  uint32_t *piece_len; // (owned) (n_vocab) 0: not a text token (never allowed by a grammar)
  uint32_t n_node;     // trie nodes in preorder: node 0 is the root, a node's children follow it
  uint8_t *byte;       // (owned) (n_node) the byte on the edge into the node
  uint32_t *end;       // (owned) (n_node) one past the node's subtree: its next sibling
  uint32_t *tok_off;   // (owned) (n_node + 1) tokens whose bytes end at node i: tok[tok_off[i] .. tok_off[i + 1])
  int32_t *tok;        // (owned)
  int32_t *eog;        // (owned) (n_eog) end-of-generation tokens
  int n_eog;
  uint32_t *eog_bits;  // (owned) ((n_vocab + 31) / 32)
  uint64_t id;         // content hash: names the vocabulary in a grammar's mask cache
};

#endif
