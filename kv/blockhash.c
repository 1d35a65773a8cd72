// kv/blockhash.c: the hash chain over token ids that names a KV block (FNV-1a with a splitmix64 finish).
#include <stddef.h>

#include "kv/blockhash.h"

#define FNV_PRIME UINT64_C(0x100000001b3)
#define FNV_BASIS UINT64_C(0xcbf29ce484222325)

static uint64_t bh_bytes(uint64_t h, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; i++) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= FNV_PRIME;
  }
  return h;
}

uint64_t kv_blockhash(uint64_t parent, const int32_t *toks, int n) {
  uint64_t h = bh_bytes(FNV_BASIS, parent, 8);
  if (n < 0) n = 0;
  h = bh_bytes(h, (uint64_t)(uint32_t)n, 4);
  for (int i = 0; i < n; i++) h = bh_bytes(h, (uint64_t)(uint32_t)toks[i], 4);
  // splitmix64 finalizer: every input bit reaches every output bit
  h ^= h >> 30;
  h *= UINT64_C(0xbf58476d1ce4e5b9);
  h ^= h >> 27;
  h *= UINT64_C(0x94d049bb133111eb);
  h ^= h >> 31;
  return h;
}

int kv_blockhash_chain(kv_blockhash_fn fn, const int32_t *toks, int n_toks, int block_size, uint64_t *keys,
                        int max_keys) {
  if (!fn) fn = kv_blockhash;
  if (block_size < 1 || n_toks < block_size || !toks || !keys || max_keys < 1) return 0;
  int n = n_toks / block_size;
  if (n > max_keys) n = max_keys;
  uint64_t parent = KV_BLOCKHASH_ROOT;
  for (int i = 0; i < n; i++) {
    parent = fn(parent, toks + (size_t)i * block_size, block_size);
    keys[i] = parent;
  }
  return n;
}
