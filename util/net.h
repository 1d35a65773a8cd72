// util/net.h: socket helpers every module that writes to a socket shares.
#ifndef DSERVE_UTL_NET_H
#define DSERVE_UTL_NET_H

#include <stddef.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Sends all n bytes of p on socket fd (MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE; EINTR retried). 0, or -1
// when the socket failed (or its send timeout passed) before all of it went.
int utl_send_all(int fd, const void *p, size_t n) UTL_WARN_UNUSED;

// A TCP connection to host (an IPv4 address or name):port within timeout_ms, as a blocking socket (close-on-exec): the
// fd, or -1 with err ("cannot resolve ...", "connect to HOST:PORT: ...").
int utl_tcp_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen);
// Whether something listens at host:port (an IPv4 address or name): 1 when a TCP connection opened within timeout_ms
// (closed at once, nothing sent), 0 when it was refused, timed out or the name does not resolve.
int utl_tcp_answers(const char *host, int port, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
