// kv/stage.h: host staging of KV transfers, for a pool in device memory that a peer's kvxfer backend cannot reach.
//
// A worker whose KV pool is in GPU memory can only hand it to kvxfer directly when the backend moves GPU
// memory (rdma with GPUDirect, nccl). Otherwise (tcp, shm, rdma without GPUDirect, or a CPU peer) KV moves
// through a host mirror of the pool: same layout, same block ids, registered with kvxfer instead of the pool.
// A sender copies each (layer, part, block) chunk from the pool into its mirror slot before pushing it from
// there; a receiver advertises the mirror, lets the prefill worker write into it, and copies a prompt's
// blocks into the pool once the notification says they have all landed. The peer never knows:
// kv_stage_open hangs the stage on the pool (kv_pool_set_stage), and kv_wire's layout and block
// writes go through it.
// Whether a worker stages is its kvxfer "staging" setting (configs/README.md); "on" also works for a CPU
// pool, which is how the CPU-only tests cover this path end to end.
#ifndef DSERVE_KV_STAGE_H
#define DSERVE_KV_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "kernels/krn.h"
#include "kv/pool.h"
#include "kvxfer/kvx.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_stage kv_stage;

// Registers with agent a what peers reach for pool: the pool itself, or (staging) a host mirror of it.
// kc is the context the pool was allocated on (borrowed; must outlive the stage). *stage is NULL when the
// worker does not stage; *region is owned by the agent. 0, or -1 with err (nothing registered).
int kv_stage_open(kvx_agent *a, kv_pool *pool, krn_ctx *kc, const cfg_worker *wc, kv_stage **stage,
                     kvx_region **region, char *err, size_t errlen) UTL_WARN_UNUSED;
// Frees the mirror. Call after kvx_agent_free (the agent's threads may still be writing into it). NULL: no-op.
void kv_stage_free(kv_stage *s);

// The address a transfer names for pool memory p (inside the pool): its mirror slot, or p itself when s is NULL.
uint64_t kv_stage_addr(const kv_stage *s, const void *p);

// Sender: copies n ranges of the pool (addresses inside the pool, already written: the caller has waited for
// their writer's event) into their mirror slots; adjacent ranges are copied as one. No-op when s is NULL.
// 0, or -1 when a range lies outside the pool (nothing copied).
int kv_stage_out(kv_stage *s, const kvx_desc *ranges, size_t n) UTL_WARN_UNUSED;
// Receiver: blocks (n) of the pool have landed in the mirror (every layer and part): copies them into the pool.
// No-op when s is NULL. 0, or -1 on a block id outside the pool (nothing copied).
int kv_stage_in(kv_stage *s, const int32_t *blocks, int n) UTL_WARN_UNUSED;

// Counters for logs and tests: bytes copied out of / into the pool through the mirror.
double kv_stage_bytes_out(const kv_stage *s);
double kv_stage_bytes_in(const kv_stage *s);

#ifdef __cplusplus
}
#endif
#endif
