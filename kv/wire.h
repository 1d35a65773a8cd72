// kv/wire.h: what prefill and decode workers tell each other about KV: pool layout, kvxfer metadata,
// the first sampled token, and the addresses of a (layer, part, block) chunk in the peer's pool.
#ifndef DSERVE_KV_WIRE_H
#define DSERVE_KV_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kv/pool.h"
#include "kvxfer/kvx.h"
#include "models/sampler.h"
#include "proto/handoff.h"
#include "proto/hello.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// A peer's KV pool as its hello_ok describes it.
typedef struct wrk_kv_remote {
  uint64_t base;       // address of its pool in its own address space
  int n_blocks;        // pages (mdl_kv)
  int n_groups;        // layer groups, the same as ours (checked)
  int n_parts;         // parts per layer and position (mdl_kv_parts: 2 K and V, 1 a latent), the same as ours
  size_t chunk_bytes;  // one (slot, part, page)
} wrk_kv_remote;

prt_kv_layout kv_wire_layout(const kv_pool *kv); // the pool as hello_ok and prefix_pull describe it
// Checks that the peer's layout (decoded from its hello_ok or prefix_pull; NULL: it sent none) matches ours (layers,
// parts and width per position, type, block size, layer groups; a mismatch names both) and reads where it lives.
int kv_wire_check_layout(const prt_kv_layout *peer, const kv_pool *local, wrk_kv_remote *out, char *err,
                         size_t errlen) UTL_WARN_UNUSED;
// Address of chunk (slot, part, page) in the peer's pool (slot: the layer's place in its group, as in ours).
uint64_t wrk_kv_remote_chunk(const wrk_kv_remote *r, int slot, int part, int page);

// Posts one kvxfer WRITE of layers [l0, l1), every part (K and V, or the latent), of our blocks local_ids (n) into
// the peer's blocks, pairwise, with notif (notif_len bytes, may be NULL) delivered after the bytes. remote_pages
// (n, n_groups): the pages of each of the peer's blocks, block by block (its block ids with one group); the pages of a
// group of [l0, l1) must exist on both sides. *out is the posted request (owned by the caller), or NULL when there was
// nothing to write (n or l1 - l0 < 1: then nothing is posted and notif is not sent). -1 with err when it cannot be
// made or posted (nothing owned).
int kv_wire_write_blocks(kvx_agent *a, const kv_pool *kv, const char *peer, const wrk_kv_remote *remote,
                            const int32_t *local_ids, const int32_t *remote_pages, int n, int l0, int l1,
                            const void *notif, size_t notif_len, kvx_xfer **out, char *err,
                            size_t errlen) UTL_WARN_UNUSED;
// A block table as the peer writes into it (kv_table): "blocks" (n ids) and, with layer groups, "pages" (n * n_groups,
// block by block; -1 where a window page was given back). kv_wire_table fills t's blocks (borrowing ids) and pages
// (malloc'ed: free t->pages; NULL with one group); -1 on out of memory. read fills pages_out (n * n_groups, malloc'ed)
// from either; -1 when they are missing or out of the peer's pool.
int kv_wire_table(const kv_pool *kv, const int32_t *ids, int n, prt_kv_table *t) UTL_WARN_UNUSED;
int kv_wire_read_table(const prt_kv_table *t, const wrk_kv_remote *r, int32_t **pages_out, int *n_out) UTL_WARN_UNUSED;

// The first of a prompt's blocks that layer `layer` reads again once the prompt (n_prompt tokens) is computed: a
// sliding-window layer sees positions (pos - window, pos] only and every later pos is >= n_prompt, so the blocks
// wholly before n_prompt - window are never read by it again and a handoff does not send them (Gemma 3's local
// layers). 0 for a global layer. The decode worker then holds blocks without those layers' KV: it does not offer
// them to its prefix cache (wrk_seq.no_reuse).
int kv_wire_first_live_block(const mdl_llama_cfg *c, int layer, int n_prompt, int block_size);
// Bytes a handoff of a prompt of n_prompt tokens moves for its blocks from `skip` on (those before are the decode
// worker's own cache): every layer from max(skip, its first live block). *dead_out (may be NULL): 1 when some
// layer's KV in a block from `skip` on is not sent (with one layer group, the blocks must not be reused; with more,
// the receiver took those blocks without window pages: wrk_seq.kv_from_peer).
double kv_wire_handoff_bytes(const kv_pool *kv, int n_prompt, int skip, int *dead_out);

// The kvxfer metadata a peer needs to write into our pool, as hello_ok's and prefix_pull's kvx_md carry it: base64 of
// kvx_pack_md (malloc'ed; NULL on failure).
char *kv_wire_pack_md(kvx_agent *a);
// Loads a peer's kvx_md (the decoded message's field; NULL: it sent none) into a; its kvxfer name into peer (cap).
int kv_wire_load_md(const char *kvx_md, kvx_agent *a, char *peer, size_t cap, char *err,
                    size_t errlen) UTL_WARN_UNUSED;

// A sampled token as every message carries it (proto's prt_sampled: kv_first, token's logprobs) from / to the
// sampler's.
void kv_wire_sampled_to(const mdl_sampled *s, prt_sampled *out);
void kv_wire_sampled_from(const prt_sampled *p, mdl_sampled *out);


#ifdef __cplusplus
}
#endif
#endif
