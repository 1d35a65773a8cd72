// ctl/frame.h: the framed control protocol between router and workers: length-prefixed JSON messages.
#ifndef DSERVE_CTL_FRAME_H
#define DSERVE_CTL_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// A frame is a 4-byte big-endian length, then that many bytes of one JSON object with an "op" field.
// The message catalogue and the handoff sequence are in docs/protocol.md.
// Once sealed (ctl_frame_seal, after the hub's handshake), the length counts the JSON text's AES-256-GCM ciphertext
// and its 16-byte tag, and is the sealed message's additional data: each direction has its own key and counts its
// frames, so a frame that was changed, repeated, dropped or reordered fails to open and the connection is dead.
#define CTL_FRAME_MAX_FRAME (16u << 20)

// Sockets. host is an IPv4 address or name; port 0 picks a free port (bound_port tells which).
// Both return the socket fd, or -1 with err filled.
int ctl_frame_listen(const char *host, int port, int *bound_port, char *err, size_t errlen) UTL_WARN_UNUSED;
int ctl_frame_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen) UTL_WARN_UNUSED;

typedef struct ctl_frame ctl_frame;
#define CTL_FRAME_UNSEALED "sealed control frame failed to open"

ctl_frame *ctl_frame_new(int fd); // takes ownership of fd; NULL on out of memory (fd closed)
void ctl_frame_free(ctl_frame *c);
int ctl_frame_fd(const ctl_frame *c);
// Seals every later frame: sent ones under tx_key with the direction label tx_label, received ones opened under
// rx_key with rx_label (util/crypto.h utl_seal). Called once, before anything else is sent or received after the
// handshake. 0, or -1 (out of memory).
int ctl_frame_seal(ctl_frame *c, const uint8_t tx_key[32], const char tx_label[4], const uint8_t rx_key[32],
                   const char rx_label[4]) UTL_WARN_UNUSED;
int ctl_frame_sealed(const ctl_frame *c); // 1 once ctl_frame_seal succeeded
// Sends one message whole. Thread-safe (a mutex orders frames). 0, or -1 when the peer is gone.
int ctl_frame_send(ctl_frame *c, const cJSON *msg) UTL_WARN_UNUSED;
// Receives the next message into *msg (caller frees with cJSON_Delete). One reader thread per connection.
// Returns 1 with a message, 0 when timeout_ms passed first (-1 = wait forever), -1 when the connection
// closed, sent a malformed frame or (sealed) one that failed to open (err says which, the last beginning with
// CTL_FRAME_UNSEALED; the connection is then unusable).
int ctl_frame_recv(ctl_frame *c, cJSON **msg, int timeout_ms, char *err, size_t errlen) UTL_WARN_UNUSED;
// 1 when a whole frame is already buffered (a poll() on the fd would not show it).
int ctl_frame_pending(const ctl_frame *c);

#ifdef __cplusplus
}
#endif
#endif
