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

// A sequence's block table: grows as positions are added. Thread-compatible (one owner per table);
// the pool's alloc/free are thread-safe.
typedef struct srv_blocks {
  int32_t *ids;  // (n) (owned)
  int n, cap;
} srv_blocks;
// Makes b cover n_tokens positions; allocates only what is missing. -1 (and nothing taken) when the pool is short.
int srv_blocks_reserve(srv_kvpool *p, srv_blocks *b, int n_tokens);
void srv_blocks_release(srv_kvpool *p, srv_blocks *b); // returns every block; b is empty and reusable after

#ifdef __cplusplus
}
#endif
#endif
