// ctl/hub.h: the control-connection hub of every process (the router's and each worker's): listens, authenticates
// peers, connects to them, and queues their messages.
#ifndef DSERVE_CTL_HUB_H
#define DSERVE_CTL_HUB_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctl_hub ctl_hub;
typedef struct ctl_peer ctl_peer; // one authenticated control connection, reference-counted

// One queued event: a message from a peer, or msg == NULL when that peer's connection closed.
typedef struct ctl_event {
  ctl_peer *peer; // (owned reference; ctl_event_done drops it)
  cJSON *msg;     // (owned)
} ctl_event;

typedef struct ctl_hub_opts {
  const char *name;   // this process's name in hello messages
  const char *role;   // "both", "prefill", "decode", "router"
  const char *secret; // shared secret peers must prove (required: ctl_hub_new refuses "" and NULL)
  const char *host;   // listen address; NULL = do not listen (connect only)
  int port;           // 0 = ephemeral
  // Extra fields for the hello_ok this hub answers with (called from connection threads; may be NULL).
  void (*hello_extra)(void *arg, cJSON *hello_ok);
  void *hello_arg;
} ctl_hub_opts;

int ctl_hub_new(const ctl_hub_opts *o, ctl_hub **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void ctl_hub_free(ctl_hub *h);   // closes every connection, waits for their threads; pending events and
                                 // peers still referenced are freed with it
int ctl_hub_port(const ctl_hub *h);
// Control handshakes refused so far: accepted peers without a hello or without the right proof (each logged with
// its address), and connections where the other hub refused our hello. Thread-safe.
long ctl_hub_auth_failures(ctl_hub *h);
// Opens a connection to the member named member (its name in the config or in etcd) at host:port and completes the
// hello exchange (blocking, bounded by timeout_ms). The proof covers member and the address the socket reached, so a
// listener that is not that member at that address (a relay, a record that points elsewhere) refuses it; every
// frame after the hello is sealed (ctl_frame_seal). The peer then delivers events like an accepted one. Returns a
// new reference, or NULL with err.
ctl_peer *ctl_hub_connect(ctl_hub *h, const char *member, const char *host, int port, int timeout_ms, char *err,
                          size_t errlen);
// Next event, waiting up to timeout_ms (-1 = forever, 0 = poll). 1 with an event, 0 when none.
// An accepted peer's first event is its "hello" message. Thread-safe.
int ctl_hub_next(ctl_hub *h, ctl_event *ev, int timeout_ms);
void ctl_event_done(ctl_event *ev);
// Wakes a ctl_hub_next waiter (e.g. compute finished) without an event.
void ctl_hub_wake(ctl_hub *h);

int ctl_peer_send(ctl_peer *p, const cJSON *msg);    // thread-safe; -1 when the connection is gone (or p is NULL)
const char *ctl_peer_name(const ctl_peer *p);         // the name from its hello / hello_ok
const char *ctl_peer_role(const ctl_peer *p);
const cJSON *ctl_peer_hello(const ctl_peer *p);       // its hello (accepted) or hello_ok (connected)
int ctl_peer_alive(const ctl_peer *p);                // 0 for NULL
void ctl_peer_ref(ctl_peer *p);
void ctl_peer_unref(ctl_peer *p);
void ctl_peer_close(ctl_peer *p);                     // shuts the connection; a closed event follows

// The hello's proof of the shared secret: hex of HMAC-SHA256 under the secret over the listener's nonce (its
// challenge), the connector's nonce, the connector's name, the member it dialled and the "ip:port" its socket reached
// (docs/protocol.md, "Authentication").
void ctl_auth_proof(const char *secret, const char *nonce_l, const char *nonce_c, const char *name, const char *member,
                    const char *addr, char out[65]);
// The two session keys both ends derive once the proof checked: HKDF-SHA256 over the secret, salted with both nonces,
// bound to the proof; c2l seals what the connector sends, l2c what the listener sends. 0, or -1 (libcrypto failed).
int ctl_session_keys(const char *secret, const char *nonce_l, const char *nonce_c, const char *proof, uint8_t c2l[32],
                     uint8_t l2c[32]) UTL_WARN_UNUSED;
#define CTL_LABEL_C2L "ctlC" // the direction labels of the seals' nonces
#define CTL_LABEL_L2C "ctlL"
// The listener's proof back (hello_ok's auth over the connector's hello nonce): the same keyed hash over
// "listener:" + nonce, so that no connector's proof can be replayed as a listener's. A connector that sent a nonce
// refuses a hello_ok without the right one: a peer found through a hint (etcd) must know the secret too.
void ctl_auth_proof_back(const char *secret, const char *nonce, char out[65]);
int ctl_consttime_eq(const char *a, const char *b); // 1 when equal; time depends only on the lengths

#ifdef __cplusplus
}
#endif
#endif
