// kv/pool.h: the paged KV block pool: blocks sized from a byte budget, handed out to sequences, whose
// sliding-window layers' pages go back once the window has passed them.
#ifndef DSERVE_KV_POOL_H
#define DSERVE_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "models/llama.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_pool kv_pool;
typedef struct kv_stage kv_stage; // kv/stage.h

typedef struct kv_pool_opts {
  size_t budget_bytes;  // the pool holds floor(budget / mdl_kv_block_bytes) blocks
  krn_type type;        // KRN_F16 (default), KRN_F32 or KRN_Q8_0 (mdl_kv_type_check)
  int block_size;       // 16
  int shareable;        // 1: host memory from kvx_host_alloc (a peer on this host may map it: shm backend)
  int plain;            // 1: one layer group even for a model with sliding-window layers (nothing given back)
  int unread;           // 1: nothing reads the KV (the null model): kv_pool_discard gives its pages back
} kv_pool_opts;

// Layer groups (models/llama.h, mdl_kv). For a model with sliding-window layers the pool keeps each block as one page
// per layer group, the global groups' and the local ones' (window pages). A block table pins the window pages of its
// blocks until kv_blocks_slide says its window has passed them; unpinned window pages stay attached (the prefix
// store can still serve the block) but are reclaimed, least recently unpinned first, when a new block finds the free
// list short. A block without some window page is not whole: it serves only as the early part of a longer prefix
// (kv_pool_usable_prefix). Models without such layers have one group: a page is a block, nothing changes.

// kc chooses where the blocks live (host for cpu backends, device memory for cuda).
int kv_pool_new(const mdl_llama_cfg *cfg, krn_ctx *kc, const kv_pool_opts *o, kv_pool **out, char *err,
                   size_t errlen) UTL_WARN_UNUSED;
void kv_pool_free(kv_pool *p);
const mdl_kv *kv_pool_kv(const kv_pool *p);   // the view the forward pass takes
void *kv_pool_base(const kv_pool *p, size_t *bytes); // the whole buffer (for kvxfer registration)
int kv_pool_free_blocks(const kv_pool *p);  // whole blocks that free and reclaimable pages make
int kv_pool_total_blocks(const kv_pool *p); // whole blocks the pool holds
// Pages on the free list; *reclaimable (may be NULL): unpinned window pages that a new block may take.
int kv_pool_free_pages(const kv_pool *p, int *reclaimable);
int kv_pool_groups(const kv_pool *p);  // layer groups (1: the plain layout)
int kv_pool_window(const kv_pool *p);  // the local groups' sliding window in tokens (0: none)
const mdl_llama_cfg *kv_pool_cfg(const kv_pool *p);
size_t kv_pool_block_bytes(const kv_pool *p); // one block over all layers and parts (mdl_kv_block_bytes)
// The host mirror peers reach instead of the pool (kv/stage.h sets it), or NULL: kv_wire's layout and
// writes go through it.
void kv_pool_set_stage(kv_pool *p, kv_stage *s); // s borrowed
kv_stage *kv_pool_stage(const kv_pool *p);

// Reference counts. A block handed out (kv_blocks_reserve, kv_pool_alloc) has count 1; every holder
// (a sequence's table, the prefix store) owns one reference, and the block returns to the free list when
// the last one is dropped. A shared block is full and read-only: nobody writes a block whose count is > 1.
// All three are thread-safe; ref/unref on a block that is free (count 0) or out of range are ignored.
void kv_pool_ref(kv_pool *p, int32_t block);
void kv_pool_unref(kv_pool *p, int32_t block);
int kv_pool_refcount(const kv_pool *p, int32_t block); // 0 when free (or out of range)
int kv_pool_whole(const kv_pool *p, int32_t block);    // 1: held and has every group's page
// How many of the leading blocks ids (n), all held, a sequence may take as its cached prefix: the largest m <= n whose
// blocks the window of position m * block_size reads are whole (n with one group).
int kv_pool_usable_prefix(const kv_pool *p, const int32_t *ids, int n);
// Takes n free blocks (each with count 1) into ids (n): all or nothing; -1 when the pool is short.
int kv_pool_alloc(kv_pool *p, int32_t *ids, int n) UTL_WARN_UNUSED;
// A pool made with opts.unread (host memory only): the whole memory pages inside blocks ids (n) go back to the
// system, reading as zeros after, so that KV moved for the null model, which nobody reads, does not stay resident
// (docs/design.md, "The null model"). Called where a handoff's KV has landed (decode) or been sent (prefill); a
// no-op for every other pool. Pages a block shares with a neighbour stay.
void kv_pool_discard(kv_pool *p, const int32_t *ids, int n);
// The most blocks' worth of pages one sequence of n_tokens positions holds at once when it is computed chunk
// positions per step: every block with one group; with layer groups, every block's global pages and the window
// pages of the blocks a step's window reads. More than kv_pool_total_blocks: the pool can never hold it.
int kv_pool_blocks_needed(const kv_pool *p, int n_tokens, int chunk);
// Copy one block's bytes (every layer's parts, in mdl_kv_chunk order: layer 0 K, layer 0 V, layer 1 K, ...; one
// latent chunk per layer for MLA) to / from a host buffer of kv_pool_block_bytes(p) bytes. Uses the backend's
// download/upload (memcpy when the backend has none). -1 on a bad block id or a block that is not whole.
int kv_pool_read_block(const kv_pool *p, int32_t block, void *host_dst) UTL_WARN_UNUSED;
int kv_pool_write_block(kv_pool *p, int32_t block, const void *host_src) UTL_WARN_UNUSED;

// A sequence's block table: grows as positions are added. Thread-compatible (one owner per table);
// the pool's alloc/free are thread-safe.
typedef struct kv_blocks {
  int32_t *ids;  // (n) (owned)
  int n, cap;
  int slid;      // leading blocks whose window pages this table does not pin (kv_blocks_slide); may exceed n
} kv_blocks;
// Makes b cover n_tokens positions; allocates only what is missing: pinned, with every group's pages, except blocks
// before b->slid, which get only the global groups' (set slid first, with kv_blocks_slide, for a table whose
// window has passed blocks it has yet to take). -1 (and nothing taken) when the pool is short; an empty b then holds
// no memory either.
int kv_blocks_reserve(kv_pool *p, kv_blocks *b, int n_tokens) UTL_WARN_UNUSED;
// Drops b's reference on every block (a block no one else holds returns to the pool); b is empty and
// reusable after.
void kv_blocks_release(kv_pool *p, kv_blocks *b);
// Keeps the blocks that cover n_tokens positions and drops b's reference on the rest (a block no one else holds
// returns to the pool): a speculative draft's rejected positions give back the blocks only they needed. Blocks are
// dropped from the end; nothing happens when b covers no more than that.
void kv_blocks_truncate(kv_pool *p, kv_blocks *b, int n_tokens);
// Appends n blocks the caller already holds a reference on (e.g. from kv_prefix_match); the reference
// moves to b, which pins them. -1 on out of memory (nothing appended, the references stay with the caller).
int kv_blocks_append(kv_pool *p, kv_blocks *b, const int32_t *ids, int n) UTL_WARN_UNUSED;
// Once n_pos positions are computed (or before reserving them, for a table whose K and V come from a peer that sends
// the window's blocks only): unpins the window pages of the blocks the sliding window will not read again
// (mdl_kv_first_live_block), and blocks b takes after that, up to that point, get none. Returns how many blocks it
// unpinned (0 with one group).
int kv_blocks_slide(kv_pool *p, kv_blocks *b, int n_pos);

#ifdef __cplusplus
}
#endif
#endif
