// util/net.c: socket helpers every module that writes to a socket shares.
#include "util/net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

int utl_send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

int utl_tcp_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen) {
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
  struct sockaddr_in sa = *(const struct sockaddr_in *)res->ai_addr;
  freeaddrinfo(res);
  sa.sin_port = htons((uint16_t)port);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  if (rc && errno == EINPROGRESS) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    rc = poll(&p, 1, timeout_ms);
    if (rc == 0) {
      errno = ETIMEDOUT;
      rc = -1;
    } else if (rc > 0) {
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
      errno = soerr;
      rc = soerr ? -1 : 0;
    }
  }
  if (rc) {
    snprintf(err, errlen, "connect to %s:%d: %s", host, port, strerror(errno));
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int utl_tcp_answers(const char *host, int port, int timeout_ms) {
  char err[160];
  int fd = port > 0 ? utl_tcp_connect(host, port, timeout_ms, err, sizeof err) : -1;
  if (fd < 0) return 0;
  close(fd);
  return 1;
}
