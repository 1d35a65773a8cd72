// server/kvpool.h: the paged KV block pool: blocks sized from a byte budget, handed out to sequences.
#ifndef DSERVE_SRV_KVPOOL_H
#define DSERVE_SRV_KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "models/llama.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct srv_kvpool srv_kvpool;
typedef struct srv_kvstage srv_kvstage; // server/kvstage.h

typedef struct srv_kvpool_opts {
  size_t budget_bytes;  // the pool holds floor(budget / mdl_kv_block_bytes) blocks
  krn_type type;        // KRN_F16 (default) or KRN_F32
  int block_size;       // 16
  int shareable;        // 1: host memory from kvx_host_alloc (a peer on this host may map it: shm backend)
} srv_kvpool_opts;

// kc chooses where the blocks live (host for cpu backends, device memory for cuda).
int srv_kvpool_new(const mdl_llama_cfg *cfg, krn_ctx *kc, const srv_kvpool_opts *o, srv_kvpool **out, char *err,
                   size_t errlen);
void srv_kvpool_free(srv_kvpool *p);
const mdl_kv *srv_kvpool_kv(const srv_kvpool *p);   // the view the forward pass takes
void *srv_kvpool_base(const srv_kvpool *p, size_t *bytes); // the whole buffer (for kvxfer registration)
int srv_kvpool_free_blocks(const srv_kvpool *p);
int srv_kvpool_total_blocks(const srv_kvpool *p);
const mdl_llama_cfg *srv_kvpool_cfg(const srv_kvpool *p);
size_t srv_kvpool_block_bytes(const srv_kvpool *p); // one block over all layers, K and V (mdl_kv_block_bytes)
// The host mirror peers reach instead of the pool (server/kvstage.h sets it), or NULL: srv_kvwire's layout and
// writes go through it.
void srv_kvpool_set_stage(srv_kvpool *p, srv_kvstage *s); // s borrowed
srv_kvstage *srv_kvpool_stage(const srv_kvpool *p);

// Reference counts. A block handed out (srv_blocks_reserve, srv_kvpool_alloc) has count 1; every holder
// (a sequence's table, the prefix store) owns one reference, and the block returns to the free list when
// the last one is dropped. A shared block is full and read-only: nobody writes a block whose count is > 1.
// All three are thread-safe; ref/unref on a block that is free (count 0) or out of range are ignored.
void srv_kvpool_ref(srv_kvpool *p, int32_t block);
void srv_kvpool_unref(srv_kvpool *p, int32_t block);
int srv_kvpool_refcount(const srv_kvpool *p, int32_t block); // 0 when free (or out of range)
// Takes n free blocks (each with count 1) into ids (n): all or nothing; -1 when the pool is short.
int srv_kvpool_alloc(srv_kvpool *p, int32_t *ids, int n);
// Copy one block's bytes (every layer's K then V chunk, in mdl_kv_chunk order: layer 0 K, layer 0 V,
// layer 1 K, ...) to / from a host buffer of srv_kvpool_block_bytes(p) bytes. Uses the backend's
// download/upload (memcpy when the backend has none). -1 on a bad block id.
int srv_kvpool_read_block(const srv_kvpool *p, int32_t block, void *host_dst);
int srv_kvpool_write_block(srv_kvpool *p, int32_t block, const void *host_src);

// A sequence's block table: grows as positions are added. Thread-compatible (one owner per table);
// the pool's alloc/free are thread-safe.
typedef struct srv_blocks {
  int32_t *ids;  // (n) (owned)
  int n, cap;
} srv_blocks;
// Makes b cover n_tokens positions; allocates only what is missing. -1 (and nothing taken) when the pool is short;
// an empty b then holds no memory either.
int srv_blocks_reserve(srv_kvpool *p, srv_blocks *b, int n_tokens);
// Drops b's reference on every block (a block no one else holds returns to the pool); b is empty and
// reusable after.
void srv_blocks_release(srv_kvpool *p, srv_blocks *b);
// Appends n blocks the caller already holds a reference on (e.g. from srv_prefix_match); the reference
// moves to b. -1 on out of memory (nothing appended, the references stay with the caller).
int srv_blocks_append(srv_blocks *b, const int32_t *ids, int n);

#ifdef __cplusplus
}
#endif
#endif
