// server/hub.h: a worker's control-connection hub: listens, authenticates peers, and queues their messages.
#ifndef DSERVE_SRV_HUB_H
#define DSERVE_SRV_HUB_H

#include <stddef.h>

#include <cjson/cJSON.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct srv_hub srv_hub;
typedef struct srv_peer srv_peer; // one authenticated control connection, reference-counted

// One queued event: a message from a peer, or msg == NULL when that peer's connection closed.
typedef struct srv_event {
  srv_peer *peer; // (owned reference; srv_event_done drops it)
  cJSON *msg;     // (owned)
} srv_event;

typedef struct srv_hub_opts {
  const char *name;   // this process's name in hello messages
  const char *role;   // "both", "prefill", "decode", "router"
  const char *secret; // shared secret peers must prove (required: srv_hub_new refuses "" and NULL)
  const char *host;   // listen address; NULL = do not listen (connect only)
  int port;           // 0 = ephemeral
  // Extra fields for the hello_ok this hub answers with (called from connection threads; may be NULL).
  void (*hello_extra)(void *arg, cJSON *hello_ok);
  void *hello_arg;
} srv_hub_opts;

int srv_hub_new(const srv_hub_opts *o, srv_hub **out, char *err, size_t errlen);
void srv_hub_free(srv_hub *h);   // closes every connection, waits for their threads; pending events and
                                 // peers still referenced are freed with it
int srv_hub_port(const srv_hub *h);
// Control handshakes refused so far: accepted peers without a hello or without the right proof (each logged with
// its address), and connections where the other hub refused our hello. Thread-safe.
long srv_hub_auth_failures(srv_hub *h);
// Opens a connection to another hub and completes the hello exchange (blocking, bounded by timeout_ms).
// The peer then delivers events like an accepted one. Returns a new reference, or NULL with err.
srv_peer *srv_hub_connect(srv_hub *h, const char *host, int port, int timeout_ms, char *err, size_t errlen);
// Next event, waiting up to timeout_ms (-1 = forever, 0 = poll). 1 with an event, 0 when none.
// An accepted peer's first event is its "hello" message. Thread-safe.
int srv_hub_next(srv_hub *h, srv_event *ev, int timeout_ms);
void srv_event_done(srv_event *ev);
// Wakes a srv_hub_next waiter (e.g. compute finished) without an event.
void srv_hub_wake(srv_hub *h);

int srv_peer_send(srv_peer *p, const cJSON *msg);    // thread-safe; -1 when the connection is gone (or p is NULL)
const char *srv_peer_name(const srv_peer *p);         // the name from its hello / hello_ok
const char *srv_peer_role(const srv_peer *p);
const cJSON *srv_peer_hello(const srv_peer *p);       // its hello (accepted) or hello_ok (connected)
int srv_peer_alive(const srv_peer *p);                // 0 for NULL
void srv_peer_ref(srv_peer *p);
void srv_peer_unref(srv_peer *p);
void srv_peer_close(srv_peer *p);                     // shuts the connection; a closed event follows

// The hello's proof of the shared secret: hex of a keyed hash over the nonce the listener sent.
void srv_auth_proof(const char *secret, const char *nonce, char out[65]);
int srv_consttime_eq(const char *a, const char *b); // 1 when equal; time depends only on the lengths

#ifdef __cplusplus
}
#endif
#endif
