// proto/proto.h: the control protocol's op names, its version, and the helpers every message codec shares.
// Each message is one flat struct with its encoder and decoder side by side (hello.h, request.h, handoff.h,
// prefix.h, stats.h, events.h; docs/protocol.md's table is checked against prt_ops by tests/proto).
#ifndef DSERVE_PRT_PROTO_H
#define DSERVE_PRT_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#ifdef __cplusplus
extern "C" {
#endif

// The protocol version a hello carries ("proto"); a listener refuses a peer whose version differs.
#define PRT_VERSION 3 // 2: sealed frames after the hello, the proof covering the member dialled (docs/protocol.md);
                      // 3: a decode worker's tokens of one step travel as one `token_batch` message per router

// Every op, in docs/protocol.md's table order. These are the only spellings of the op names in the tree.
#define PRT_OP_CHALLENGE "challenge"
#define PRT_OP_HELLO "hello"
#define PRT_OP_HELLO_OK "hello_ok"
#define PRT_OP_GENERATE "generate"
#define PRT_OP_TOKEN "token"
#define PRT_OP_TOKENS "token_batch"
#define PRT_OP_DONE "done"
#define PRT_OP_ERROR "error"
#define PRT_OP_CANCEL "cancel"
#define PRT_OP_DRAINING "draining"
#define PRT_OP_PING "ping"
#define PRT_OP_PONG "pong"
#define PRT_OP_STATS "stats"
#define PRT_OP_STATS_OK "stats_ok"
#define PRT_OP_KV_TABLE "kv_table"
#define PRT_OP_KV_FIRST "kv_first"
#define PRT_OP_KV_STARTED "kv_started"
#define PRT_OP_KV_FAIL "kv_fail"
#define PRT_OP_KV_FREED "kv_freed"
#define PRT_OP_PREFIX_PULL "prefix_pull"
#define PRT_OP_PREFIX_PULLED "prefix_pulled"
#define PRT_OP_PREFIX_FAIL "prefix_fail"
#define PRT_OP_KV_EVENTS "kv_events"
#define PRT_OP_REFUSED "link_refused"

extern const char *const prt_ops[]; // (prt_n_ops) every PRT_OP_*, in the table's order
extern const int prt_n_ops;

// The op of message m ("" when m has no string "op"). Never NULL.
const char *prt_op(const cJSON *m);
// The request id a message is about (token, done, error, cancel, kv_*, prefix_*), NULL when it has no string "id":
// what a receiver reads to find the request before it decodes the message (or when the message does not decode).
const char *prt_id(const cJSON *m);
// 1 when m's op is op.
int prt_is(const cJSON *m, const char *op);
// A new message {"op": op} (owned by the caller), NULL on out of memory.
cJSON *prt_new(const char *op);
// A message with no field but its op (draining, ping, pong, stats), owned by the caller; NULL on out of memory.
// This is the one encoder of those four ops (every sender calls it: decode/worker.c draining, ctl/hub.c pong,
// router/links.c ping and stats), and prt_op / prt_is (or a worker's {op, handler} table) their one decoder: a
// receiver reads nothing but the op, and ignores any other field.
cJSON *prt_bare_encode(const char *op);

#ifdef __cplusplus
}
#endif
#endif
