// kvxfer/kvx_wire.c: socket helpers under the connection core: full (scatter/gather) sends and receives with stall timeouts, frames, connecting, the authenticated handshake.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

_Static_assert(sizeof(kvx_hdr) == 40, "kvx_hdr is 40 bytes on the wire");

int kvx_wait_fd(int fd, short ev, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = ev};
  for (;;) {
    int r = poll(&p, 1, timeout_ms > 0 ? timeout_ms : -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -3;
    if (r == 0) return -2;
    return 0;
  }
}

int kvx_iov_advance(struct iovec **iov, int n, size_t done) {
  struct iovec *v = *iov;
  while (n > 0 && done >= v->iov_len) {
    done -= v->iov_len;
    v++;
    n--;
  }
  if (n > 0) {
    v->iov_base = (uint8_t *)v->iov_base + done;
    v->iov_len -= done;
  }
  *iov = v;
  return n;
}

int kvx_recv_all(int fd, void *buf, size_t len, int timeout_ms, int idle_ok) {
  uint8_t *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(fd, p + got, len - got, MSG_DONTWAIT);
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    if (n == 0) return -1;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno == ECONNRESET ? -1 : -3;
    int w = kvx_wait_fd(fd, POLLIN, timeout_ms);
    if (w == -2 && idle_ok && got == 0) return 1;
    if (w < 0) return w;
  }
  return 0;
}

// Bytes one recvmsg asks for. A socket's incoming packets wait in its backlog while a recvmsg copies out, so one
// call for megabytes holds back the ACKs that let the sender go on (loopback: 4 MiB frames ran at ~80% of the rate
// of 64 KiB calls). Many small iovecs still share a call.
#define RECV_CHUNK (64u << 10)

int64_t kvx_recvv_now(int fd, struct iovec *iov, int n) {
  n = kvx_iov_advance(&iov, n, 0);
  if (n <= 0) return 0;
  size_t want = 0;
  int k = 0;
  while (k < n && k < 1024 && want < RECV_CHUNK) want += iov[k++].iov_len;
  size_t last = iov[k - 1].iov_len;  // cut for this call, restored after it
  if (want > RECV_CHUNK) iov[k - 1].iov_len -= want - RECV_CHUNK;
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
  ssize_t r;
  do r = recvmsg(fd, &m, MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  iov[k - 1].iov_len = last;
  if (r > 0) return r;
  if (r == 0) return -1;
  if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
  return errno == ECONNRESET ? -1 : -3;
}

int kvx_recvv_all(int fd, struct iovec *iov, int n, int timeout_ms) {
  n = kvx_iov_advance(&iov, n, 0);
  while (n > 0) {
    int64_t r = kvx_recvv_now(fd, iov, n);
    if (r < 0) return (int)r;
    if (r > 0) {
      n = kvx_iov_advance(&iov, n, (size_t)r);
      continue;
    }
    int w = kvx_wait_fd(fd, POLLIN, timeout_ms);
    if (w < 0) return w;
  }
  return 0;
}

int kvx_sendv_all(int fd, struct iovec *iov, int n, int timeout_ms) {
  n = kvx_iov_advance(&iov, n, 0);
  while (n > 0) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)(n > 1024 ? 1024 : n)};
    ssize_t w = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return (errno == EPIPE || errno == ECONNRESET) ? -1 : -3;
      int r = kvx_wait_fd(fd, POLLOUT, timeout_ms);
      if (r < 0) return r;
      continue;
    }
    n = kvx_iov_advance(&iov, n, (size_t)w);
  }
  return 0;
}

int64_t kvx_sendv_now(int fd, struct iovec *iov, int n) {
  int64_t sent = 0;
  n = kvx_iov_advance(&iov, n, 0);
  while (n > 0) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)(n > 1024 ? 1024 : n)};
    ssize_t w = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return (errno == EPIPE || errno == ECONNRESET) ? -1 : -3;
    }
    sent += w;
    n = kvx_iov_advance(&iov, n, (size_t)w);
  }
  return sent;
}

int kvx_send_all(int fd, const void *buf, size_t len, int timeout_ms) {
  struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
  return kvx_sendv_all(fd, &v, 1, timeout_ms);
}

int kvx_send_frame(int fd, uint16_t op, uint16_t flags, uint64_t req, uint64_t addr, uint64_t len, uint64_t key,
                   const void *payload, size_t plen, int timeout_ms) {
  kvx_hdr h = {.magic = KVX_FRAME_MAGIC, .op = op, .flags = flags, .req = req, .addr = addr, .len = len, .key = key};
  struct iovec v[2] = {{.iov_base = &h, .iov_len = sizeof h}, {.iov_base = (void *)payload, .iov_len = plen}};
  return kvx_sendv_all(fd, v, plen ? 2 : 1, timeout_ms);
}

const char *kvx_io_why(int rc) {
  switch (rc) {
    case -1: return "connection closed by peer";
    case -2: return "timed out";
    default: return strerror(errno);
  }
}

// Handshake:
//   S->C  "KVXH" nonce_s[32]
//   C->S  "KVXC" name_len(u16) name nonce_c[32] HMAC(secret, "kvx-client"|nonce_s|nonce_c|name)
//   S->C  "KVXS" status(u32: 0 ok, 1 refused) HMAC(secret, "kvx-server"|nonce_c|nonce_s|name)
#define HS_S 0x4858564bu
#define HS_C 0x4358564bu
#define HS_R 0x5358564bu

static void mac(const void *secret, size_t slen, const char *label, const uint8_t *n1, const uint8_t *n2,
                const char *name, uint8_t out[32]) {
  const void *parts[4] = {label, n1, n2, name};
  size_t lens[4] = {strlen(label), 32, 32, strlen(name)};
  utl_hmac_sha256(secret, slen, parts, lens, 4, out);
}

int kvx_handshake_client(int fd, const char *my_name, const void *secret, size_t slen, int timeout_ms, char *err,
                         size_t errlen) {
  if (!secret || !slen) {
    utl_seterr(err, errlen, "handshake: no shared secret");
    return -1;
  }
  uint8_t in[36];
  int rc = kvx_recv_all(fd, in, sizeof in, timeout_ms, 0);
  if (rc) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  uint32_t magic;
  memcpy(&magic, in, 4);
  if (magic != HS_S) {
    utl_seterr(err, errlen, "handshake: not a kvxfer agent (bad greeting)");
    return -1;
  }
  uint8_t nc[32], out[4 + 2 + KVX_MAX_NAME + 64];
  if (utl_random(nc, 32)) {
    utl_seterr(err, errlen, "handshake: getrandom: %s", strerror(errno));
    return -1;
  }
  uint16_t nl = (uint16_t)strlen(my_name);
  size_t o = 0;
  magic = HS_C;
  memcpy(out + o, &magic, 4), o += 4;
  memcpy(out + o, &nl, 2), o += 2;
  memcpy(out + o, my_name, nl), o += nl;
  memcpy(out + o, nc, 32), o += 32;
  mac(secret, slen, "kvx-client", in + 4, nc, my_name, out + o), o += 32;
  if ((rc = kvx_send_all(fd, out, o, timeout_ms))) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  uint8_t resp[40];
  if ((rc = kvx_recv_all(fd, resp, sizeof resp, timeout_ms, 0))) {
    utl_seterr(err, errlen, "handshake: peer closed before answering (%s): refused", kvx_io_why(rc));
    return -1;
  }
  uint32_t st;
  memcpy(&magic, resp, 4);
  memcpy(&st, resp + 4, 4);
  if (magic != HS_R || st != 0) {
    utl_seterr(err, errlen, "handshake: peer refused authentication (shared secret mismatch?)");
    return -1;
  }
  uint8_t want[32];
  mac(secret, slen, "kvx-server", nc, in + 4, my_name, want);
  if (!utl_ct_equal(want, resp + 8, 32)) {
    utl_seterr(err, errlen, "handshake: peer failed to prove the shared secret");
    return -1;
  }
  return 0;
}

int kvx_handshake_server(int fd, const void *secret, size_t slen, int timeout_ms, char *peer_name, char *err,
                         size_t errlen) {
  if (!secret || !slen) {
    utl_seterr(err, errlen, "handshake: no shared secret: refusing every peer");
    return -1;
  }
  uint8_t g[36];
  uint32_t magic = HS_S;
  memcpy(g, &magic, 4);
  if (utl_random(g + 4, 32)) {
    utl_seterr(err, errlen, "getrandom: %s", strerror(errno));
    return -1;
  }
  int rc = kvx_send_all(fd, g, sizeof g, timeout_ms);
  uint8_t h[6];
  if (!rc) rc = kvx_recv_all(fd, h, 6, timeout_ms, 0);
  if (rc) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  uint16_t nl;
  memcpy(&magic, h, 4);
  memcpy(&nl, h + 4, 2);
  if (magic != HS_C || nl == 0 || nl >= KVX_MAX_NAME) {
    utl_seterr(err, errlen, "handshake: malformed client hello");
    return -1;
  }
  uint8_t rest[KVX_MAX_NAME + 64];
  if ((rc = kvx_recv_all(fd, rest, (size_t)nl + 64, timeout_ms, 0))) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  char name[KVX_MAX_NAME];
  memcpy(name, rest, nl);
  name[nl] = 0;
  uint8_t want[32], resp[40] = {0};
  mac(secret, slen, "kvx-client", g + 4, rest + nl, name, want);
  magic = HS_R;
  memcpy(resp, &magic, 4);
  if (!kvx_valid_name(name) || !utl_ct_equal(want, rest + nl + 32, 32)) {
    uint32_t st = 1;
    memcpy(resp + 4, &st, 4);
    kvx_send_all(fd, resp, sizeof resp, timeout_ms);
    utl_seterr(err, errlen, "handshake: peer '%.63s' refused: wrong shared secret%s", kvx_valid_name(name) ? name : "?",
                kvx_valid_name(name) ? "" : " or bad name");
    return -1;
  }
  mac(secret, slen, "kvx-server", rest + nl, g + 4, name, resp + 8);
  if ((rc = kvx_send_all(fd, resp, sizeof resp, timeout_ms))) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  memcpy(peer_name, name, (size_t)nl + 1);
  return 0;
}

void kvx_sock_timeouts(int fd, int timeout_ms) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  unsigned ut = (unsigned)timeout_ms;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
}

int kvx_tcp_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 || port <= 0 || port > 65535) {
    utl_seterr(err, errlen, "bad tcp endpoint %s:%d", host, port);
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    utl_seterr(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
    utl_seterr(err, errlen, "connect %s:%d: %s", host, port, strerror(errno));
    close(fd);
    return -1;
  }
  int w = kvx_wait_fd(fd, POLLOUT, timeout_ms);
  int soerr = 0;
  socklen_t sl = sizeof soerr;
  if (w == 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
  if (w < 0 || soerr) {
    utl_seterr(err, errlen, "connect %s:%d: %s", host, port, w == -2 ? "timed out" : strerror(soerr ? soerr : errno));
    close(fd);
    return -1;
  }
  kvx_sock_timeouts(fd, timeout_ms);
  return fd;
}

int kvx_unix_connect(const char *path, char *err, size_t errlen) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    utl_seterr(err, errlen, "unix socket path '%s' is too long", path);
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    utl_seterr(err, errlen, "connect %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

int kvx_valid_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n >= KVX_MAX_NAME) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return 0;
  }
  return 1;
}
