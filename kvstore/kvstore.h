// kvstore/kvstore.h: a shared KV block tier on Redis (one server or Redis Cluster): content-addressed, MAC'd blocks.
//
// Keys are "dsv:" + hex(SHA-256(space || key)), so the same block written by any worker is one key. A value is a
// header (magic, version, space, key, parent, block_tokens, the tokens, payload length), the payload, and an
// HMAC-SHA256 over both under mac_key; a read checks the MAC first, then every header field, and anything that does
// not match is a miss. docs/kvstore.md has the format and the cluster handling.
//
// Threads: every call is safe from several threads at once on one kvs (reads take one connection set in turn; the
// write-behind thread has its own). kvs_close must be the last call.
#ifndef DSERVE_KVS_KVSTORE_H
#define DSERVE_KVS_KVSTORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_config {
  const char *const *endpoints; int n_endpoints; // "host:port"; with cluster, seed nodes
  int cluster;                                   // 1: Redis Cluster (CLUSTER SLOTS, CRC16 slots, MOVED/ASK)
  const char *password;                          // NULL: no AUTH (the config reads password_file)
  const char *tls_ca, *tls_cert, *tls_key;       // PEM files; all NULL: plain TCP. Any set: TLS, the store's
                                                 // certificate checked against tls_ca (NULL: the system's) and the
                                                 // endpoint; cert and key (both or neither): ours
  int read_timeout_ms;                           // a read run's whole budget (0: the default, 50)
  int ttl_s;                                     // 0: no expiry (the store's eviction policy decides)
  size_t write_queue_bytes;                      // write-behind queue bound (0: the default, 64 MiB); past it blocks
                                                 // are dropped and counted
  uint8_t mac_key[32];                           // HMAC-SHA256 key (the worker derives it from the cluster secret)
  uint8_t space[32];                             // digest naming what a value must match: model fingerprint, kv_type,
                                                 // KV layout (parts, width, layers), block size; part of every key
  size_t block_bytes;                            // one block's payload (every layer), exactly
  int block_tokens;                              // tokens per block
} kvs_config;

#define KVS_DEFAULT_READ_TIMEOUT_MS 50
#define KVS_DEFAULT_WRITE_QUEUE_BYTES ((size_t)64 << 20)

typedef struct kvs kvs;
// 0, or -1 with err on a bad config only. An unreachable store or a wrong password is NOT an error: logged once
// (naming the endpoint), counted, retried with back-off in the background.
int kvs_open(const kvs_config *c, kvs **out, char *err, size_t errlen);
// NULL is fine. Drains nothing: queued writes are dropped (a batch already on the wire is let finish, at most
// max(1 s, 20 x read_timeout_ms)).
void kvs_close(kvs *s);

// One block as the store names it: its chain key (kv_blockhash) and its parent's, and its tokens (block_tokens).
typedef struct kvs_block { uint64_t key, parent; const int32_t *toks; } kvs_block;

// Reads the longest leading run of blocks[0..n) in one pipelined round trip per node, stopping at the first miss;
// hit i's verified payload (block_bytes) is copied to dst[i]. A value whose MAC, space, key, parent, tokens or length
// does not match is a miss (counted: mac_failures / mismatches), never returned. Returns the run length (0 when the
// store is down, backing off, or slower than read_timeout_ms: counted, never an error). A run shorter than n counts
// one read_misses (the blocks after the first miss are not looked at). With a cluster, the run ends before the first
// block whose node is down or failed; the other nodes are still read. dst[i] past the run is not written.
int kvs_read_run(kvs *s, const kvs_block *blocks, int n, void *const *dst);

// Queues one block for writing behind (copies toks and payload); returns 1 queued, 0 skipped (known present), -1
// dropped (queue full or store down; counted). Never blocks on the network.
int kvs_write(kvs *s, const kvs_block *b, const void *payload);

// Waits up to timeout_ms until every block queued so far has been written (or dropped): 0, or -1 when time ran out.
// For tests and an orderly drain; the serving path never needs it.
int kvs_flush(kvs *s, int timeout_ms);

typedef struct kvs_stats {
  uint64_t read_blocks, read_bytes, read_misses, write_blocks, write_bytes, write_skipped; // bytes: payload bytes
  uint64_t errors, timeouts, mac_failures, mismatches, queue_drops;
  uint64_t auth_failures; // AUTH refused (a wrong password): each time, though it is logged once per endpoint
  uint64_t read_skipped;  // read runs answered 0 at once: the store (or the first block's node) is down, backing off
  uint64_t map_loads;     // cluster: CLUSTER SLOTS answers loaded (at open, then after a MOVED or a node's return)
  int up; // 1 when the last round trip succeeded
} kvs_stats;
void kvs_stats_get(kvs *s, kvs_stats *out);

// The Redis key of block key under space: "dsv:" and 64 hex digits, NUL-terminated (KVS_KEY_LEN + 1 bytes).
#define KVS_KEY_LEN 68
void kvs_key_name(const uint8_t space[32], uint64_t key, char out[KVS_KEY_LEN + 1]);

#ifdef __cplusplus
}
#endif
#endif
