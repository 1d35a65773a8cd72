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

int utl_tcp_answers(const char *host, int port, int timeout_ms) {
  char svc[16];
  snprintf(svc, sizeof svc, "%d", port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (port <= 0 || port > 65535 || getaddrinfo(host, svc, &hints, &res) || !res) return 0;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), up = 0;
  if (fd >= 0) {
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    if (rc == 0) {
      up = 1;
    } else if (errno == EINPROGRESS) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int soerr = 0;
      socklen_t sl = sizeof soerr;
      up = poll(&p, 1, timeout_ms) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) && soerr == 0;
    }
    close(fd);
  }
  freeaddrinfo(res);
  return up;
}
