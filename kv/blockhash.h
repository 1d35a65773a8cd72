// kv/blockhash.h: the hash chain over token ids that names a KV block (shared by the worker's prefix store and the router's index).
#ifndef DSERVE_KV_BLOCKHASH_H
#define DSERVE_KV_BLOCKHASH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The parent key of a sequence's first block.
#define KV_BLOCKHASH_ROOT UINT64_C(0x9e3779b97f4a7c15)

// A block key function: key(block i) = fn(key(block i - 1), tokens of block i). Pure (no state).
typedef uint64_t (*kv_blockhash_fn)(uint64_t parent, const int32_t *toks, int n);

// The default: FNV-1a over the parent key's 8 bytes, n and each token's 4 bytes (little-endian),
// finished with the splitmix64 avalanche. Deterministic across hosts and processes (no seed), so a router
// computes the same keys as every worker.
uint64_t kv_blockhash(uint64_t parent, const int32_t *toks /* (n) */, int n);

// The keys of the full blocks of toks: keys[i] = key of tokens [i*block_size, (i+1)*block_size), chained
// from KV_BLOCKHASH_ROOT. Writes min(n_toks / block_size, max_keys) keys and returns how many (0 when
// block_size < 1 or n_toks < block_size). fn NULL means kv_blockhash.
int kv_blockhash_chain(kv_blockhash_fn fn, const int32_t *toks /* (n_toks) */, int n_toks, int block_size,
                        uint64_t *keys /* (max_keys) */, int max_keys);

// A change to one worker's set of cached blocks, in the order it happened; the worker ships them to the
// router (control message `kv_events`), which applies them to its index (router/kvindex.h).
enum {
  KV_EVENT_ADDED = 1,   // key: the worker now holds this block
  KV_EVENT_REMOVED = 2, // key: the worker no longer holds it
  KV_EVENT_CLEARED = 3, // key unused (0): forget every key of this worker (store cleared, or events were lost)
};
typedef struct kv_event {
  uint64_t key;
  int kind; // KV_EVENT_*
} kv_event;

#ifdef __cplusplus
}
#endif
#endif
