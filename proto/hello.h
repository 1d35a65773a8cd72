// proto/hello.h: the handshake: challenge, hello (with the protocol version) and hello_ok (with a worker's KV layout).
#ifndef DSERVE_PRT_HELLO_H
#define DSERVE_PRT_HELLO_H

#include "proto/proto.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Strings in decoded structs are borrowed from the decoded cJSON: they live as long as it does.
// Encoders return a new message (owned by the caller) or NULL on out of memory (err says so).

typedef struct prt_challenge {
  const char *nonce; // (borrowed) required
  const char *name;  // (borrowed) the listener's name; may be NULL
} prt_challenge;
cJSON *prt_challenge_encode(const prt_challenge *m, char *err, size_t errlen);
int prt_challenge_decode(const cJSON *j, prt_challenge *m, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct prt_hello {
  const char *role; // (borrowed) may be NULL (the hub then says "?")
  const char *name; // (borrowed) may be NULL
  const char *auth; // (borrowed) the shared-secret proof; NULL when absent (the hub refuses it)
  int proto;        // the sender's PRT_VERSION; -1 when absent (the hub refuses it)
  const char *nonce; // (borrowed) the connector's own nonce: the listener proves the secret back in hello_ok's auth
                     // (a listener known only from a hint, etcd's membership, must prove it too); NULL when absent
  const char *member; // (borrowed) the member the connector dialled (its name in the config or etcd); NULL if absent
  const char *addr;   // (borrowed) "ip:port" the connector's socket reached; NULL when absent
} prt_hello;
cJSON *prt_hello_encode(const prt_hello *m, char *err, size_t errlen);
// Refuses a wrong type; absent fields are left to the hub (auth NULL, proto -1).
int prt_hello_decode(const cJSON *j, prt_hello *m, char *err, size_t errlen) UTL_WARN_UNUSED;

// A KV pool as a worker describes it (hello_ok, prefix_pull).
typedef struct prt_kv_layout {
  int n_layer;
  int parts, width; // per position and layer: parts (2: K and V; 1: a latent row) of width values each
  int type, block_size;
  int n_blocks; // pages
  int n_groups; // layer groups; 1 when absent
  uint64_t base; // the pool's (or its staging mirror's) address in its own process, a decimal string on the wire
} prt_kv_layout;
// Adds "kv_layout" to msg; 0, -1 on out of memory.
int prt_kv_layout_add(cJSON *msg, const prt_kv_layout *l) UTL_WARN_UNUSED;
// Reads msg's "kv_layout" (required).
int prt_kv_layout_read(const cJSON *msg, const char *op, prt_kv_layout *l, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct prt_hello_ok {
  const char *role, *name; // (borrowed) may be NULL
  int has_worker;          // n_ctx, n_vocab, total_blocks are present (a worker's)
  int n_ctx, n_vocab, total_blocks;
  int has_layout;          // kv_layout is present (decode and prefill workers)
  prt_kv_layout kv_layout;
  const char *kvx_md;      // (borrowed) base64 kvxfer metadata, or NULL
  const char *auth;        // (borrowed) the listener's proof over the hello's nonce (ctl_auth_proof_back), or NULL
} prt_hello_ok;
cJSON *prt_hello_ok_encode(const prt_hello_ok *m, char *err, size_t errlen);
// link_refused: a router tells a worker it dialled why it gives it no link (its record names another model), then closes.
typedef struct prt_refused {
  const char *reason; // (borrowed) in words, for the worker's log
  const char *code;   // (borrowed) "another_model"; NULL when absent
} prt_refused;
cJSON *prt_refused_encode(const prt_refused *m, char *err, size_t errlen);
int prt_refused_decode(const cJSON *j, prt_refused *m, char *err, size_t errlen) UTL_WARN_UNUSED;
int prt_hello_ok_decode(const cJSON *j, prt_hello_ok *m, char *err, size_t errlen) UTL_WARN_UNUSED;
// The fields a worker adds to its hub's hello_ok (the hub writes op, role and name): 0, -1 on out of memory.
int prt_hello_ok_add_worker(cJSON *msg, const prt_hello_ok *m) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
