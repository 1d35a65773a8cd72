// kv/prefix.h: the cross-request KV block store: full blocks keyed by a token hash chain, shared by refcount, evicted LRU (pool, then host DRAM, then a disk file).
#ifndef DSERVE_KV_PREFIX_H
#define DSERVE_KV_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "kv/blockhash.h"
#include "kv/pool.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// One store per worker, over that worker's pool. Thread-compatible: one thread (the worker's compute
// thread) calls every function; the pool itself may be used by other threads meanwhile.
//
// Entries. Each entry is one FULL block of a prompt: its key (kv_blockhash chain), its parent entry,
// its block_size token ids, and where its bytes are:
//   tier 0: a pool block, on which the store holds one reference (kv_pool_ref);
//   tier 1: a slot of a host-DRAM arena (optional, host_blocks > 0);
//   tier 2: a slot of one file on local disk (optional, disk_blocks > 0).
// A lookup walks the chain from the root and compares the parent ENTRY and the block's tokens, not only
// the key, so a hash collision can never serve another prompt's KV. Keys of live entries are unique: a
// block whose key collides with a different live block is not cached (counted in stats.collisions), and
// neither is anything after it in that prompt.
//
// Eviction is LRU per tier, leaf first: an entry is a candidate only when none of its children is in the
// same or a higher tier (a parent is never evicted before its children; there are no orphans, so the
// children of an evicted parent can never be matched). A match touches its chain leaf first, so parents
// stay more recent than their children. A tier-0 candidate must also be unused (pool refcount 1: only the
// store holds it). An evicted tier-0 block moves to tier 1 if configured, else tier 2, else is dropped;
// tier 1 spills to tier 2 the same way; tier 2 drops its LRU leaf.
//
// Events (for the router's index): KV_EVENT_ADDED when a key enters the store (any tier), KV_EVENT_REMOVED
// when it leaves every tier, KV_EVENT_CLEARED on kv_prefix_clear or when pending events overflowed
// max_events (the pending ones are then discarded: the router forgets this worker and relearns).
// Moves between tiers send no event: the worker still holds the block.

typedef struct kv_prefix kv_prefix;

typedef struct kv_prefix_opts {
  int budget_blocks;     // most pool blocks the store keeps (tier 0); >= 1
  kv_blockhash_fn hash; // NULL: kv_blockhash (what the router computes); other functions for tests only
  int max_events;        // pending events kept between drains; 0: 4096
  int host_blocks;       // tier 1 arena slots (0: no tier 1); the arena is host_blocks * block bytes
  int disk_blocks;       // tier 2 file slots (0: no tier 2)
  const char *disk_path; // tier 2 file (created or truncated; removed by kv_prefix_free); needed when disk_blocks > 0
  const char *log_name;  // the component of its log lines (the worker's name; copied); NULL: "prefix"
} kv_prefix_opts;

typedef struct kv_prefix_stats {
  uint64_t queries;       // kv_prefix_match calls
  uint64_t hit_queries;   // calls that found at least one block (any tier, counting kv_prefix_restore)
  uint64_t query_blocks;  // blocks asked about: sum of (n_toks - 1) / block_size
  uint64_t query_tokens;  // sum of n_toks
  uint64_t hit_blocks[3]; // blocks served, by tier (0 pool, 1 host DRAM, 2 disk)
  uint64_t hit_tokens[3]; // hit_blocks * block_size
  // Tokens that reached each tier, per kv_prefix_match (one lookup): tier 0 every lookup's n_toks (so equal to
  // query_tokens); tier 1 / 2, when configured, the tokens the tiers before it did not hold (n_toks minus the
  // tokens of the chain's blocks found in lower-numbered tiers). hit_tokens[t] <= tier_query_tokens[t]; the
  // unit is the one vLLM's prefix_cache_queries / prefix_cache_hits use.
  uint64_t tier_query_tokens[3];
  uint64_t inserted;      // entries created
  uint64_t removed;       // entries dropped from every tier (eviction or clear)
  uint64_t demoted;       // moves to a lower tier
  uint64_t collisions;    // inserts refused because the key belonged to a different block
  uint64_t events_lost;   // events discarded on overflow
  // Blocks a tier could not store, by tier: full with nothing it may evict, or its write failed (the disk tier: a
  // full file system, an I/O error). Such a block goes to the next tier, else leaves the store (or stays where it
  // was when it has children). The first refusal of each tier is logged once (WARN) with its reason.
  uint64_t refused[3];
  int blocks[3];          // entries resident per tier now
  int unused;             // tier-0 entries only the store references (pool refcount 1): cached, no sequence holds
                          // them, evictable when a sequence needs the room
} kv_prefix_stats;

// pool (borrowed) must outlive the store. -1 with err on bad options, out of memory or a disk file that
// cannot be created.
int kv_prefix_new(kv_pool *pool, const kv_prefix_opts *o, kv_prefix **out, char *err, size_t errlen) UTL_WARN_UNUSED;
// Drops the store's references (blocks still used by sequences stay theirs) and removes the disk file.
void kv_prefix_free(kv_prefix *s);

// The longest cached prefix of toks (n_toks) that is in the pool (tier 0): writes the block ids into
// block_ids_out and returns how many (0..max_blocks). Counts one lookup in the stats, per tier (what the
// host and disk tiers hold after the pool prefix counts as a query there; kv_prefix_restore counts their hits). Each returned block carries a NEW reference for the
// caller (hand it to kv_blocks_append, or drop it with kv_pool_unref). Matches at most
// (n_toks - 1) / block_size blocks, so the caller always has at least one token left to compute (the one
// whose logits it samples): pass the whole prompt. The matched entries become most recently used.
int kv_prefix_match(kv_prefix *s, const int32_t *toks, int n_toks, int32_t *block_ids_out, int max_blocks);

// How many blocks after the first n_have of toks are in tier 1 / tier 2 (the same limit as match),
// without touching anything: counts[0] pool, counts[1] host, counts[2] disk, in chain order (counts[0]
// counts only pool blocks after n_have). Returns the total. Lets the caller decide whether reading back is
// cheaper than recomputing.
int kv_prefix_peek(const kv_prefix *s, const int32_t *toks, int n_toks, int n_have, int counts[3]);

// Continues a match: after the n_have leading blocks kv_prefix_match returned for the same toks, copies
// the next cached blocks from tier 1 / tier 2 back into newly allocated pool blocks (evicting unused
// tier-0 entries when the pool is short) and returns how many it wrote into block_ids_out (each with a
// reference for the caller, like match). Stops at the first block that is not cached or when the pool
// cannot give a block. A block that cannot be read from the disk file (that entry is dropped) ends it too, with err
// set: the blocks before it are returned (they hold the caller's references), and -1 when there were none.
int kv_prefix_restore(kv_prefix *s, const int32_t *toks, int n_toks, int n_have, int32_t *block_ids_out,
                       int max_blocks, char *err, size_t errlen) UTL_WARN_UNUSED;

// After a sequence's prompt is computed: its first min(n_toks / block_size, n_blocks) blocks (block_ids,
// the sequence's table, whose K/V for those positions are complete) enter the store, which takes its own
// reference on each. A block already cached in the pool keeps its cached copy (the sequence's stays its own), unless
// nobody else uses that copy or it lost window pages the caller's has: the entry then takes the caller's copy (the
// old one is freed); a block cached only in tier 1/2 is promoted to the caller's pool block. Then evicts down to the
// budget.
// Returns the number of new entries, -1 on out of memory (what was inserted before stays).
int kv_prefix_insert(kv_prefix *s, const int32_t *toks, int n_toks, const int32_t *block_ids, int n_blocks);

// Evicts unused tier-0 entries (LRU, leaf first) until the pool has n_free_needed free blocks or nothing
// more can go. Returns the number of pool blocks given back.
int kv_prefix_evict_for(kv_prefix *s, int n_free_needed);

// Drops every entry of every tier (blocks in use by sequences stay theirs); queues KV_EVENT_CLEARED.
void kv_prefix_clear(kv_prefix *s);

// Moves up to max pending events, oldest first, into out (max); returns how many. The rest stay queued.
int kv_prefix_drain_events(kv_prefix *s, kv_event *out, int max);
int kv_prefix_pending_events(const kv_prefix *s);

void kv_prefix_get_stats(const kv_prefix *s, kv_prefix_stats *out);
int kv_prefix_has_tier(const kv_prefix *s, int tier); // 1 when tier (0 pool, 1 host, 2 disk) is configured

// The keys of every entry in the store (every tier), least recently used first: the disk tier's, then the
// host tier's, then the pool's, each from its LRU end (parents are more recent than their children, so an index
// that keeps only its newest keys keeps the heads of the chains). Writes the first min(total, max) into
// keys_out (max; may be NULL when max is 0) and returns the total, like snprintf: call with max 0 to size.
int kv_prefix_keys(const kv_prefix *s, uint64_t *keys_out, int max);
int kv_prefix_block_size(const kv_prefix *s);

#ifdef __cplusplus
}
#endif
#endif
