// tests/fuzz/fuzz_kvxfer.c: libFuzzer target: kvxfer tcp frame decoding against exported regions, and peer metadata.
// At init an agent (tcp, 127.0.0.1 port 0) registers two regions inside a guarded buffer. Each input is turned into
// frames sent by an authenticated client; the receiver must refuse anything outside a region and never touch the
// guard bytes. The raw input is also loaded as a peer metadata blob (kvx_load_remote_md).
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define GUARD 4096
#define REG_LEN 4096
#define SECRET "fuzz-secret"
// Loaded once for the process (libFuzzer has no context argument).
static kvx_agent *g_agent;
static uint8_t *g_mem;        // (GUARD, REG_LEN, GUARD, REG_LEN, GUARD) bytes; guards hold 0xA5 (owned)
static kvx_region *g_reg[2];  // (borrowed from g_agent)
static int g_port;

static void quiet(void *ud, const char *line) { (void)ud; (void)line; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  char err[256];
  // Plain: the frames are decoded above the record layer, and the fuzzer writes them as they are.
  kvx_opts o = {.backend = "tcp", .listen_host = "127.0.0.1", .timeout_ms = 500, .secret = SECRET, .log = quiet,
                .plaintext = 1};
  g_agent = kvx_agent_new("fuzz-rx", &o, err, sizeof err);
  if (!g_agent) {
    fprintf(stderr, "fuzz_kvxfer: kvx_agent_new: %s\n", err);
    abort();
  }
  g_port = kvx_agent_port(g_agent);
  g_mem = malloc(3 * GUARD + 2 * REG_LEN);
  if (!g_mem) abort();
  memset(g_mem, 0xA5, 3 * GUARD + 2 * REG_LEN);
  for (int i = 0; i < 2; i++)
    if (kvx_register(g_agent, g_mem + GUARD + (size_t)i * (REG_LEN + GUARD), REG_LEN, KVX_MEM_HOST, &g_reg[i], err,
                     sizeof err) != 0) {
      fprintf(stderr, "fuzz_kvxfer: kvx_register: %s\n", err);
      abort();
    }
  return 0;
}

static void check_guards(void) {
  for (int gi = 0; gi < 3; gi++) {
    const uint8_t *g = g_mem + (size_t)gi * (GUARD + REG_LEN);
    for (size_t i = 0; i < GUARD; i++)
      if (g[i] != 0xA5) {
        fprintf(stderr, "fuzz_kvxfer: guard %d byte %zu written by a frame\n", gi, i);
        abort();
      }
  }
}

// Input -> wire bytes. Each frame: 1 selector byte, then a 40-byte kvx_hdr whose fields are rewritten so that the
// fuzzer reaches valid regions easily: selector bit 0..1 picks the key (region 0, region 1, the raw value, key+1),
// bit 2 makes addr relative to the chosen region's start (signed offset), bit 3 keeps the raw magic; then
// min(len, rest, 8192) payload bytes when the op carries a payload (WRITE, WRITEV, READV, *_END, NOTIF).
static size_t build(const uint8_t *d, size_t n, uint8_t *out, size_t cap) {
  size_t i = 0, o = 0;
  while (i + 1 + sizeof(kvx_hdr) <= n && o + sizeof(kvx_hdr) <= cap) {
    uint8_t sel = d[i++];
    kvx_hdr h;
    memcpy(&h, d + i, sizeof h);
    i += sizeof h;
    const kvx_region *r = g_reg[(sel >> 4) & 1];
    switch (sel & 3) {
      case 0: h.key = g_reg[0]->key; r = g_reg[0]; break;
      case 1: h.key = g_reg[1]->key; r = g_reg[1]; break;
      case 2: break;
      case 3: h.key = r->key + 1; break;
    }
    if (sel & 4) h.addr = r->addr + (uint64_t)(int64_t)(int16_t)h.addr;
    if (!(sel & 8)) h.magic = KVX_FRAME_MAGIC;
    if (sel & 0x20) h.op = (uint16_t)(1 + h.op % 16);
    if (sel & 0x40) h.len %= 2 * REG_LEN;
    memcpy(out + o, &h, sizeof h);
    o += sizeof h;
    if (h.op == KVX_F_WRITE || h.op == KVX_F_WRITE_END || h.op == KVX_F_READ_END || h.op == KVX_F_NOTIF ||
        h.op == KVX_F_WRITEV || h.op == KVX_F_READV) { // WRITEV/READV: descriptors (and data) follow
      size_t p = n - i;
      if (h.len < p) p = (size_t)h.len;
      if (p > 8192) p = 8192;
      if (p > cap - o) p = cap - o;
      memcpy(out + o, d + i, p);
      i += p;
      o += p;
    }
  }
  if (i < n && o < cap) { // a trailing partial frame, as is
    size_t p = n - i < cap - o ? n - i : cap - o;
    memcpy(out + o, d + i, p);
    o += p;
  }
  return o;
}

static void send_frames(const uint8_t *wire, size_t n) {
  char err[256];
  int fd = kvx_tcp_connect("127.0.0.1", g_port, 2000, err, sizeof err);
  if (fd < 0) {
    fprintf(stderr, "fuzz_kvxfer: connect: %s\n", err);
    abort();
  }
  kvx_chan ch;
  kvx_ch_init(&ch, fd);
  if (kvx_handshake_client(&ch, "fuzz-tx", SECRET, strlen(SECRET), 0, 2000, err, sizeof err) != 0) {
    fprintf(stderr, "fuzz_kvxfer: handshake: %s\n", err);
    abort();
  }
  // Write the frames while draining replies (READ_DATA, ACK, ERR), then half-close and read to the receiver's close.
  static uint8_t sink[65536];
  size_t off = 0;
  int wr_open = 1;
  for (;;) {
    if (wr_open && off == n) {
      shutdown(fd, SHUT_WR);
      wr_open = 0;
    }
    struct pollfd p = {.fd = fd, .events = (short)(POLLIN | (wr_open ? POLLOUT : 0))};
    int rc = poll(&p, 1, 5000);
    if (rc == 0) {
      fprintf(stderr, "fuzz_kvxfer: the receiver neither read nor closed for 5 s\n");
      abort();
    }
    if (rc < 0) continue;
    if (p.revents & POLLIN || p.revents & (POLLHUP | POLLERR)) {
      ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && p.revents & (POLLHUP | POLLERR))) break;
    }
    if (wr_open && (p.revents & POLLOUT)) {
      ssize_t w = send(fd, wire + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) off += (size_t)w;
      else if (w < 0) wr_open = 0; // the receiver closed on a bad frame
    }
  }
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 65536) return 0;
  static uint8_t wire[65536 + 4096];
  size_t n = build(data, size, wire, sizeof wire);
  send_frames(wire, n);
  check_guards();
  kvx_notif ns[16];
  int k;
  while ((k = kvx_get_notifs(g_agent, ns, 16)) > 0)
    for (int i = 0; i < k; i++) free(ns[i].msg);
  // The same bytes as a peer's metadata blob.
  char peer[KVX_MAX_NAME], err[256];
  if (kvx_load_remote_md(g_agent, data, size, peer, sizeof peer, err, sizeof err) == 0) kvx_invalidate_peer(g_agent, peer);
  return 0;
}
