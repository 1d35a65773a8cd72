// tests/fuzz/fuzz_ctl.c: libFuzzer target: control-protocol frame reading (ctl_frame_recv) of arbitrary bytes off a socket,
// plain or (the input's first byte odd) sealed: a sealed reader must refuse what it cannot open, never deliver it.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl/frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (64u << 10)) size = 64u << 10; // stays below the socket buffer, so the write never blocks
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
  int sz = 1 << 20;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(sv[0], data + off, size - off);
    if (w <= 0) abort();
    off += (size_t)w;
  }
  close(sv[0]); // end of stream: the reader must see EOF and stop, never wait
  ctl_frame *c = ctl_frame_new(sv[1]);
  if (!c) abort();
  // Keys the input cannot know: what a sealed reader delivers must have opened, and no input opens.
  static const uint8_t tx[32] = {1}, rx[32] = {2};
  int sealed = size > 0 && (data[0] & 1);
  if (sealed && ctl_frame_seal(c, tx, "ctlL", rx, "ctlC") != 0) abort();
  char err[256];
  int frames = 0;
  for (;;) {
    cJSON *m = NULL;
    err[0] = 0;
    int rc = ctl_frame_recv(c, &m, 5000, err, sizeof err);
    if (rc == 1) {
      if (sealed) abort(); // forged without the key
      // A delivered message is a JSON object with a string "op".
      if (!m || !cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "op"))) abort();
      cJSON_Delete(m);
      if (++frames > 100000) abort();
      continue;
    }
    if (m) abort();
    if (rc == 0) abort(); // a timeout on a closed stream is a hang
    if (err[0] == 0) abort(); // an error says why
    break;
  }
  ctl_frame_free(c);
  return 0;
}
