// ctl/frame.c: length-prefixed JSON frames over stream sockets, for router <-> worker control.
#include "ctl/frame.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proto/proto.h"
#include "util/clock.h"
#include "util/crypto.h"
#include "util/net.h"

struct ctl_frame {
  int fd;
  pthread_mutex_t send_mu; // orders whole frames from several sender threads (and guards tx)
  uint8_t *buf;            // (owned) received bytes not yet returned (len of cap)
  size_t len, cap;
  utl_seal *tx, *rx;       // (owned) NULL until ctl_frame_seal; rx is the reader thread's alone
};

static int resolve(const char *host, int port, struct sockaddr_in *sa, char *err, size_t errlen) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  if (port < 0 || port > 65535) {
    snprintf(err, errlen, "port %d out of range", port);
    return -1;
  }
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res) {
    snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(rc));
    return -1;
  }
  sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return 0;
}

int ctl_frame_listen(const char *host, int port, int *bound_port, char *err, size_t errlen) {
  struct sockaddr_in sa;
  if (resolve(host, port, &sa, err, errlen)) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128)) {
    snprintf(err, errlen, "listen on %s:%d: %s", host, port, strerror(errno));
    close(fd);
    return -1;
  }
  socklen_t sl = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  if (bound_port) *bound_port = ntohs(sa.sin_port);
  return fd;
}

int ctl_frame_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen) {
  int fd = utl_tcp_connect(host, port, timeout_ms, err, errlen);
  int one = 1;
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

ctl_frame *ctl_frame_new(int fd) {
  ctl_frame *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return NULL;
  }
  c->fd = fd;
  pthread_mutex_init(&c->send_mu, NULL);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); // harmless on unix sockets (fails quietly)
  return c;
}

void ctl_frame_free(ctl_frame *c) {
  if (!c) return;
  if (c->fd >= 0) close(c->fd);
  pthread_mutex_destroy(&c->send_mu);
  utl_seal_free(c->tx);
  utl_seal_free(c->rx);
  free(c->buf);
  free(c);
}

int ctl_frame_fd(const ctl_frame *c) { return c->fd; }

int ctl_frame_seal(ctl_frame *c, const uint8_t tx_key[32], const char tx_label[4], const uint8_t rx_key[32],
                   const char rx_label[4]) {
  utl_seal *tx = utl_seal_new(tx_key, tx_label, 0), *rx = utl_seal_new(rx_key, rx_label, 1);
  if (!tx || !rx) {
    utl_seal_free(tx);
    utl_seal_free(rx);
    return -1;
  }
  pthread_mutex_lock(&c->send_mu);
  c->tx = tx;
  c->rx = rx;
  pthread_mutex_unlock(&c->send_mu);
  return 0;
}

int ctl_frame_sealed(const ctl_frame *c) { return c->rx != NULL; }

// The frame around n bytes of text: header, then the text (plain) or its ciphertext and tag (sealed; out holds
// them). 0, or -1 when libcrypto failed. send_mu held.
static int seal_text(ctl_frame *c, const char *text, size_t n, uint8_t hdr[4], uint8_t *out) {
  size_t wire = n + (c->tx ? UTL_SEAL_TAG : 0);
  hdr[0] = (uint8_t)(wire >> 24), hdr[1] = (uint8_t)(wire >> 16), hdr[2] = (uint8_t)(wire >> 8), hdr[3] = (uint8_t)wire;
  if (!c->tx) return 0;
  return utl_seal_begin(c->tx, hdr, 4) || utl_seal_update(c->tx, text, n, out) || utl_seal_end(c->tx, out + n) ? -1 : 0;
}

int ctl_frame_send(ctl_frame *c, const cJSON *msg) {
  char *text = cJSON_PrintUnformatted(msg);
  if (!text) return -1;
  size_t n = strlen(text);
  int rc = -1;
  if (n <= CTL_FRAME_MAX_FRAME) {
    uint8_t hdr[4];
    pthread_mutex_lock(&c->send_mu);
    uint8_t *sealed = c->tx ? malloc(n + UTL_SEAL_TAG) : NULL;
    if ((!c->tx || sealed) && !seal_text(c, text, n, hdr, sealed))
      rc = utl_send_all(c->fd, hdr, 4) || utl_send_all(c->fd, sealed ? sealed : (const uint8_t *)text,
                                                        n + (sealed ? UTL_SEAL_TAG : 0)) ? -1 : 0;
    pthread_mutex_unlock(&c->send_mu);
    free(sealed);
  }
  cJSON_free(text);
  return rc;
}

static size_t frame_len(const ctl_frame *c) {
  return (size_t)c->buf[0] << 24 | (size_t)c->buf[1] << 16 | (size_t)c->buf[2] << 8 | c->buf[3];
}

int ctl_frame_pending(const ctl_frame *c) { return c->len >= 4 && c->len >= 4 + frame_len(c); }

int ctl_frame_recv(ctl_frame *c, cJSON **msg, int timeout_ms, char *err, size_t errlen) {
  *msg = NULL;
  int64_t deadline = timeout_ms < 0 ? -1 : utl_now_ms() + timeout_ms;
  for (;;) {
    if (c->len >= 4) {
      size_t n = frame_len(c), tag = c->rx ? UTL_SEAL_TAG : 0;
      if (n > CTL_FRAME_MAX_FRAME + tag || n < tag) {
        snprintf(err, errlen, "control frame of %zu bytes exceeds the %u-byte limit", n, CTL_FRAME_MAX_FRAME);
        return -1;
      }
      if (c->len >= 4 + n) {
        uint8_t *text = c->buf + 4;
        if (c->rx && (utl_seal_begin(c->rx, c->buf, 4) || utl_seal_update(c->rx, text, n - tag, text) ||
                      utl_seal_end(c->rx, text + n - tag))) {
          // Changed, repeated, dropped or reordered on the way, or not sealed by the peer: nothing of it is read.
          snprintf(err, errlen, "%s (changed, repeated or reordered on the way, or not from the peer): closing",
                   CTL_FRAME_UNSEALED);
          c->len = 0;
          return -1;
        }
        cJSON *m = cJSON_ParseWithLength((const char *)text, n - tag);
        memmove(c->buf, c->buf + 4 + n, c->len - 4 - n);
        c->len -= 4 + n;
        if (!m || !cJSON_IsObject(m) || !*prt_op(m)) {
          cJSON_Delete(m);
          snprintf(err, errlen, "malformed control message (not a JSON object with a string \"op\")");
          return -1;
        }
        *msg = m;
        return 1;
      }
    }
    int wait = -1;
    if (deadline >= 0) {
      int64_t left = deadline - utl_now_ms();
      if (left <= 0) return 0;
      wait = (int)left;
    }
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int rc = poll(&p, 1, wait);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) {
      snprintf(err, errlen, "poll: %s", strerror(errno));
      return -1;
    }
    if (rc == 0) return 0;
    if (c->cap - c->len < 65536) { // no whole frame is buffered, so len < 4 + CTL_FRAME_MAX_FRAME bounds cap
      size_t cap = c->cap ? c->cap * 2 : 131072;
      uint8_t *nb = realloc(c->buf, cap);
      if (!nb) {
        snprintf(err, errlen, "out of memory for a control frame");
        return -1;
      }
      c->buf = nb;
      c->cap = cap;
    }
    ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) {
      snprintf(err, errlen, "%s", r == 0 ? "connection closed by peer" : strerror(errno));
      return -1;
    }
    c->len += (size_t)r;
  }
}
