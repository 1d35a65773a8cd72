// kvstore/kvs_int.h: kvstore internals shared by its files (not for users of the library).
//
// Layers, top to bottom; a file calls only files below it:
//   kvstore.c    the store: open/close, read runs, the write-behind thread, probes and back-off, stats
//   kvs_topo.c   nodes and the slot map: CLUSTER SLOTS, MOVED/ASK replies, CRC16 key slots
//   kvs_conn.c   one connection to one node: nonblocking socket, AUTH, pipelined commands (hiredis formats them
//                and parses replies; the socket and the deadline are ours), several connections in flight at once
//   kvs_parse.c  hiredis's reply parser with bounds (array sizes, one reply's bytes)
//   kvs_tls.c    TLS over those sockets (libssl): the client context, the handshake, record I/O
//   kvs_value.c  keys and values: the header, the MAC, verification
#ifndef DSERVE_KVS_INT_H
#define DSERVE_KVS_INT_H

#include <hiredis/hiredis.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvstore/kvstore.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" { // the tests check the slots and the value size
#endif

// ---- kvs_parse.c
// hiredis's reply parser, bounded: an array of more than KVS_MAX_ARRAY elements (CLUSTER SLOTS of a fully
// fragmented cluster is 16384) and more than max_pending bytes of one unfinished reply are protocol errors.
// The struct must not move after kvs_parser_init (the reader points into it).
#define KVS_MAX_ARRAY 65536
typedef struct kvs_parser {
  redisReader *rd;                                       // (owned)
  redisReplyObjectFunctions fn;                          // hiredis's, createArray bounded
  void *(*array)(const redisReadTask *task, int elements); // hiredis's createArray
  size_t max_pending;
} kvs_parser;
int kvs_parser_init(kvs_parser *p, size_t max_pending) UTL_WARN_UNUSED; // 0, or -1 (out of memory)
void kvs_parser_free(kvs_parser *p);
int kvs_parser_feed(kvs_parser *p, const char *buf, size_t n) UTL_WARN_UNUSED; // 0, or -1
// The next whole reply (the caller frees it with freeReplyObject): 0 with *out (NULL: none yet), or -1 (a protocol
// error, a refused array, an unfinished reply past max_pending).
int kvs_parser_get(kvs_parser *p, redisReply **out) UTL_WARN_UNUSED;

// ---- kvs_value.c
// A value: header (KVS_HDR bytes, little-endian: "DSVK", version u32, space[32], key u64, parent u64,
// block_tokens u32, reserved u32 (0), payload length u64), then block_tokens int32 tokens, the payload, then the
// HMAC-SHA256 (32 bytes) of everything before it under mac_key.
#define KVS_MAGIC "DSVK"
#define KVS_VERSION 1u
#define KVS_HDR 72
#define KVS_MAC 32
size_t kvs_value_len(int block_tokens, size_t block_bytes);
// Writes the value of b (toks: block_tokens of them; payload: block_bytes) into out (kvs_value_len bytes).
void kvs_value_encode(const kvs_config *c, const kvs_block *b, const void *payload, uint8_t *out);
typedef enum kvs_verdict { KVS_V_OK = 0, KVS_V_MAC = 1, KVS_V_MISMATCH = 2 } kvs_verdict;
// Checks v (n bytes) against c and b: the MAC first (a value too short to hold one fails it), then magic, version,
// space, key, parent, block_tokens, the tokens and the length. KVS_V_OK: the payload is at v + kvs_value_payload_off.
kvs_verdict kvs_value_check(const kvs_config *c, const kvs_block *b, const uint8_t *v, size_t n);
size_t kvs_value_payload_off(int block_tokens);

typedef enum kvs_conn_rc { KVS_C_OK = 0, KVS_C_IO = -1, KVS_C_TIMEOUT = -2, KVS_C_AUTH = -3 } kvs_conn_rc;

// ---- kvs_tls.c
// A client context: the store's certificate must chain to ca (NULL: the system's trust store) and name the endpoint;
// cert and key (both or neither) are ours, for a store that asks for one. NULL with err when a file does not load.
SSL_CTX *kvs_tls_ctx_new(const char *ca, const char *cert, const char *key, char *err, size_t errlen);
void kvs_tls_ctx_free(SSL_CTX *ctx); // NULL is fine
// The handshake on connected nonblocking socket fd, verifying the certificate names host, by deadline_ms.
kvs_conn_rc kvs_tls_connect(SSL_CTX *ctx, int fd, const char *host, int64_t deadline_ms, SSL **out, char *err,
                            size_t errlen);
void kvs_tls_free(SSL *ssl); // NULL is fine; the socket is the caller's
// Record I/O: bytes moved (> 0), 0 when it would block (poll the socket, both ways), -1 when the connection failed.
long kvs_tls_send(SSL *ssl, const void *p, size_t n);
long kvs_tls_recv(SSL *ssl, void *p, size_t n);

// ---- kvs_conn.c
typedef struct kvs_conn kvs_conn;
// Connects to host:port (with tls, TLS over it), and with a password AUTHs, all by deadline_ms (utl_now_ms clock).
// KVS_C_OK with *out, or an error with err (KVS_C_AUTH: the store refused the password).
// max_reply: the most bytes one reply may have (a longer one is a protocol error: the connection fails).
kvs_conn_rc kvs_conn_open(const char *host, int port, SSL_CTX *tls, const char *password, size_t max_reply,
                          int64_t deadline_ms, kvs_conn **out, char *err, size_t errlen);
void kvs_conn_close(kvs_conn *c); // NULL is fine
// Appends one command (argc arguments, binary-safe) to c's send buffer: 0, or -1 (out of memory).
int kvs_conn_cmd(kvs_conn *c, int argc, const char **argv, const size_t *lens) UTL_WARN_UNUSED;
// Sends what each of cs[0..n) has queued and reads want[i] replies from cs[i] into reps[i][0..want[i]) (replies the
// caller frees with freeReplyObject), every connection in flight at once, until deadline_ms. rc[i]: KVS_C_OK, or
// KVS_C_IO / KVS_C_TIMEOUT (then some of reps[i] may be NULL and the connection is useless: close it).
// One table for the replies of an exchange with n connections: reps[i] points at connection i's want[i] slots (all
// NULL). The table, or NULL (out of memory); kvs_conn_replies_free frees it with the replies still in it (a caller
// that keeps a reply takes it out and sets its slot to NULL).
redisReply **kvs_conn_replies_new(int n, const int *want, redisReply ***reps);
void kvs_conn_replies_free(redisReply **all, int n, const int *want);
void kvs_conn_exchange(kvs_conn **cs, int n, const int *want, redisReply ***reps, kvs_conn_rc *rc,
                       int64_t deadline_ms);
// One command, one reply, by deadline_ms: KVS_C_OK with *reply, or an error.
kvs_conn_rc kvs_conn_call(kvs_conn *c, int argc, const char **argv, const size_t *lens, int64_t deadline_ms,
                          redisReply **reply);

// ---- kvs_topo.c
#define KVS_SLOTS 16384
#define KVS_MAX_NODES 64
typedef struct kvs_node {
  char host[256];
  int port;
  kvs_conn *rc;           // (owned) the readers' connection; only under kvs.read_mu
  unsigned rc_epoch;      // the node's epoch when rc was opened (under kvs.read_mu)
  unsigned epoch;         // counts the node's failures (under kvs.mu): an rc from an older epoch is dropped
  kvs_conn *spare;        // (owned) a read connection a probe opened, for the readers to take (under kvs.mu)
  unsigned spare_epoch;   // the node's epoch when spare was opened (under kvs.mu)
  kvs_conn *wc;           // (owned) the write-behind thread's connection; only that thread
  int down;               // 1: reads and writes skip this node until a probe reaches it (under kvs.mu)
  int64_t next_probe_ms;  // when the next probe may run (under kvs.mu)
  int backoff_ms;         // the wait after the next failed probe (under kvs.mu)
  int logged;             // 1: its being down was logged (once until it comes back; under kvs.mu)
  int auth_logged;        // 1: a refused password was logged for it (once; under kvs.mu)
} kvs_node;
typedef struct kvs_topo {
  kvs_node *nodes[KVS_MAX_NODES]; // (owned, n_nodes) never removed, so an index stays valid
  int n_nodes;
  int16_t slot[KVS_SLOTS];        // the node serving each slot, -1 unknown (cluster only)
  int have_map;                   // 1: a CLUSTER SLOTS answer filled slot[]
} kvs_topo;
uint16_t kvs_crc16(const void *p, size_t n);           // CRC16-CCITT (XMODEM), Redis Cluster's
int kvs_key_slot(const char *key, size_t n);           // its slot, honouring a {hash tag}
int kvs_topo_node(kvs_topo *t, const char *host, int port); // index of host:port, added when new; -1 when full
void kvs_topo_free(kvs_topo *t);                       // closes and frees every node
// Fills t->slot from a CLUSTER SLOTS reply r asked of host (an empty address in it means host): 0, or -1 with err.
int kvs_topo_load(kvs_topo *t, const redisReply *r, const char *host, char *err, size_t errlen);
// A "MOVED slot host:port" or "ASK slot host:port" error reply: 1 (moved) or 2 (ask) with *host (hostlen) and *port,
// 0 when r is not one.
int kvs_redirect(const redisReply *r, char *host, size_t hostlen, int *port);
// Splits "host:port" (the last ':'): 0, or -1 (no port, or out of 1..65535).
int kvs_split_endpoint(const char *ep, char *host, size_t hostlen, int *port);

// ---- the store (struct kvs), shared by kvstore.c, kvs_read.c, kvs_write.c and kvs_state.c
#define KVS_LOGC "kvstore"
#define KVS_RECENT 4096        // keys known present (direct-mapped): writes of them are skipped
#define KVS_BATCH 64           // blocks the write-behind thread takes at once
#define KVS_BACKOFF_MIN_MS 100 // first wait before probing a node that failed
#define KVS_BACKOFF_MAX_MS 1000 // the longest: a store that returns is used again within about a second

typedef struct kvs_item { // one queued write, with its tokens and payload after it in the same allocation
  struct kvs_item *next;
  kvs_block b;                 // b.toks points into this allocation
  char name[KVS_KEY_LEN + 1];
  size_t bytes;                // what it counts against write_queue_bytes
  uint8_t *payload;            // (block_bytes) inside this allocation
} kvs_item;

// A key we wrote or saw present lately (writes of it are skipped), or (bad) one whose value a read refused: the
// next write of it overwrites without asking EXISTS, so a forged or corrupt value heals instead of staying.
typedef struct kvs_recent { uint64_t h; int64_t t_ms; int bad; } kvs_recent;

struct kvs {
  kvs_config c;                // endpoints and password point into this struct's copies
  char *password;              // (owned) NULL: no AUTH
  SSL_CTX *tls;                // (owned) NULL: plain TCP
  char **endpoints;            // (owned, c.n_endpoints)
  int write_timeout_ms;        // one write batch's budget
  size_t max_reply;            // the longest reply a connection accepts: a value, or a cluster's CLUSTER SLOTS
  pthread_mutex_t mu;          // topo (slot map, node states), need_refresh, the queue, recent, stats
  pthread_mutex_t read_mu;     // one reader at a time owns the nodes' read connections
  pthread_cond_t cv;           // wakes the write-behind thread: work, a node down, or stop
  pthread_cond_t done_cv;      // wakes kvs_flush: a batch finished
  kvs_topo topo;
  int need_refresh;            // cluster: a MOVED was seen, or the map is missing: reload CLUSTER SLOTS
  int64_t refresh_ms;          // when the map was last asked for (at most one try per KVS_BACKOFF_MIN_MS)
  kvs_item *head, *tail;       // the queue (owned)
  size_t q_bytes;              // queued plus in flight
  uint64_t enq, done;          // blocks queued / finished (written, skipped or dropped) so far
  kvs_recent recent[KVS_RECENT];
  int stop;
  int thr_started;
  pthread_t thr;
  kvs_stats st;
};

// kvs_state.c. "Under mu": the caller holds s->mu.
uint64_t kvs_name_hash(const char *name);                 // a key's digest as a number, never 0
int kvs_recent_has(kvs *s, uint64_t h, int64_t now_ms);   // under mu: known present
void kvs_recent_add(kvs *s, uint64_t h, int64_t now_ms);  // under mu
void kvs_recent_bad(kvs *s, uint64_t h);                  // under mu: a read refused its value
int kvs_recent_is_bad(kvs *s, uint64_t h);                // under mu
int kvs_route(kvs *s, const char *name);                  // under mu: the node serving name, -1 none known
void kvs_mark_down(kvs *s, int i, const char *why);       // under mu: node i is skipped until a probe reaches it
void kvs_conn_failed(kvs *s, int i, kvs_conn_rc rc, const char *err); // under mu: connecting to i failed (counted)
// Reaches node i anew (connect, AUTH, PING) and keeps that connection as its write connection: 0, or -1 (marked
// down). The write-behind thread's (or kvs_open's before it starts).
int kvs_probe_node(kvs *s, int i, int64_t deadline_ms);
// Probes every node whose back-off has passed, then (cluster) reloads the map when missing or stale. Same thread.
void kvs_probe_due(kvs *s, int timeout_ms);

// kvs_write.c: writes a batch taken from the queue (the write-behind thread); frees the items.
void kvs_write_batch(kvs *s, kvs_item **items, int n);

#ifdef __cplusplus
}
#endif
#endif
