// ctl/frame.h: the framed control protocol between router and workers: length-prefixed JSON messages.
#ifndef DSERVE_CTL_FRAME_H
#define DSERVE_CTL_FRAME_H

#include <stddef.h>

#include <cjson/cJSON.h>

#ifdef __cplusplus
extern "C" {
#endif

// A frame is a 4-byte big-endian length, then that many bytes of one JSON object with an "op" field.
// The message catalogue and the handoff sequence are in docs/protocol.md.
#define CTL_FRAME_MAX_FRAME (16u << 20)

// Sockets. host is an IPv4 address or name; port 0 picks a free port (bound_port tells which).
// Both return the socket fd, or -1 with err filled.
int ctl_frame_listen(const char *host, int port, int *bound_port, char *err, size_t errlen);
int ctl_frame_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen);

typedef struct ctl_frame ctl_frame;

ctl_frame *ctl_frame_new(int fd); // takes ownership of fd; NULL on out of memory (fd closed)
void ctl_frame_free(ctl_frame *c);
int ctl_frame_fd(const ctl_frame *c);
// Sends one message whole. Thread-safe (a mutex orders frames). 0, or -1 when the peer is gone.
int ctl_frame_send(ctl_frame *c, const cJSON *msg);
// Receives the next message into *msg (caller frees with cJSON_Delete). One reader thread per connection.
// Returns 1 with a message, 0 when timeout_ms passed first (-1 = wait forever), -1 when the connection
// closed or sent a malformed frame (err says which; the connection is then unusable).
int ctl_frame_recv(ctl_frame *c, cJSON **msg, int timeout_ms, char *err, size_t errlen);
// 1 when a whole frame is already buffered (a poll() on the fd would not show it).
int ctl_frame_pending(const ctl_frame *c);

#ifdef __cplusplus
}
#endif
#endif
