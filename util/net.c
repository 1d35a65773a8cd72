// util/net.c: socket helpers every module that writes to a socket shares.
#include "util/net.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>

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
