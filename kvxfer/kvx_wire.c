// kvxfer/kvx_wire.c: socket helpers under the connection core: full (scatter/gather) sends and receives with stall timeouts, the record layer of sealed channels, frames, connecting, the authenticated handshake.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
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

int kvx_fd_recv_all(int fd, void *buf, size_t len, int timeout_ms, int idle_ok) {
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

int64_t kvx_fd_recvv_now(int fd, struct iovec *iov, int n) {
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

int kvx_fd_sendv_all(int fd, struct iovec *iov, int n, int timeout_ms) {
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

int64_t kvx_fd_sendv_now(int fd, struct iovec *iov, int n) {
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

int kvx_fd_send_all(int fd, const void *buf, size_t len, int timeout_ms) {
  struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
  return kvx_fd_sendv_all(fd, &v, 1, timeout_ms);
}

// ---- channels: plain, or sealed records (kvx_int.h) ----
void kvx_ch_init(kvx_chan *ch, int fd) { *ch = (kvx_chan){.fd = fd}; }

void kvx_ch_free(kvx_chan *ch) {
  utl_seal_free(ch->tx);
  utl_seal_free(ch->rx);
  free(ch->r);
  free(ch->t);
  kvx_ch_init(ch, ch->fd);
}

// Makes ch sealed under the two keys (tx for what it sends); 0 or -1 (out of memory).
static int ch_seal(kvx_chan *ch, const uint8_t tx_key[32], const char tx_label[4], const uint8_t rx_key[32],
                   const char rx_label[4]) {
  ch->tx = utl_seal_new(tx_key, tx_label, 0);
  ch->rx = utl_seal_new(rx_key, rx_label, 1);
  ch->r = malloc(KVX_REC_MAX + KVX_REC_OVER + KVX_REC_AHEAD);
  ch->t = malloc(KVX_REC_BATCH * (KVX_REC_MAX + KVX_REC_OVER));
  if (ch->tx && ch->rx && ch->r && ch->t) return 0;
  kvx_ch_free(ch);
  return -1;
}

static int ch_fail(kvx_chan *ch) {  // a record failed to open: the channel is dead, counted once
  if (!ch->bad && ch->fails) atomic_fetch_add(ch->fails, 1);
  ch->bad = 1;
  return KVX_IO_SEAL;
}

// Opens the next record if it is all in r: 1 opened (its plaintext at r[rp, re)), 0 not all there, or KVX_IO_SEAL.
static int rec_open(kvx_chan *ch) {
  if (ch->rl - ch->rn < 4) return 0;
  uint8_t *p = ch->r + ch->rn;
  uint32_t len;
  memcpy(&len, p, 4);
  if (len == 0 || len > KVX_REC_MAX) return ch_fail(ch);
  if (ch->rl - ch->rn < (size_t)len + KVX_REC_OVER) return 0;
  if (utl_seal_begin(ch->rx, p, 4) || utl_seal_update(ch->rx, p + 4, len, p + 4) ||
      utl_seal_end(ch->rx, p + 4 + len))
    return ch_fail(ch);
  ch->rp = ch->rn + 4;
  ch->re = ch->rp + len;
  ch->rn = ch->re + UTL_SEAL_TAG;
  return 1;
}

// One receive towards the next record (r holds no plaintext and no whole record): bytes (>0), 0 when nothing is
// there, or <0. It asks for the rest of the record, and past it only behind a short record (or before its length
// is known), so that a stream of full records lands each in place with nothing to move.
static int64_t rec_fill(kvx_chan *ch) {
  if (ch->rn) {  // what is left is the start of the next record: to the front
    memmove(ch->r, ch->r + ch->rn, ch->rl - ch->rn);
    ch->rl -= ch->rn;
    ch->rn = ch->rp = ch->re = 0;
  }
  size_t want = 4 + KVX_REC_AHEAD - (ch->rl < 4 ? ch->rl : 4);
  if (ch->rl >= 4) {
    uint32_t len;
    memcpy(&len, ch->r, 4);
    if (len == 0 || len > KVX_REC_MAX) return ch_fail(ch);  // (rec_open said so already; kept for clarity)
    want = (size_t)len + KVX_REC_OVER - ch->rl + (len < KVX_REC_AHEAD ? KVX_REC_AHEAD : 0);
  }
  ssize_t r;
  do r = recv(ch->fd, ch->r + ch->rl, want, MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  if (r > 0) {
    ch->rl += (size_t)r;
    return r;
  }
  if (r == 0) return -1;
  if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
  return errno == ECONNRESET ? -1 : -3;
}

// A place in a caller's iovec list: sealed calls read and fill the caller's entries without changing them (as
// kvx_fd_recvv_now does), so that a caller's own advance by the count returned is the only one.
typedef struct iov_at {
  const struct iovec *v;
  int n;       // entries
  int i;       // the current one
  size_t off;  // bytes of it already done
} iov_at;

static size_t at_span(iov_at *a) {  // bytes of the current entry left (0: none left at all); skips empty ones
  while (a->i < a->n && a->off == a->v[a->i].iov_len) a->i++, a->off = 0;
  return a->i < a->n ? a->v[a->i].iov_len - a->off : 0;
}

static uint8_t *at_ptr(const iov_at *a) { return (uint8_t *)a->v[a->i].iov_base + a->off; }

static void at_skip(iov_at *a, size_t k) {
  while (k) {
    size_t m = at_span(a);
    if (!m) return;
    m = m < k ? m : k;
    a->off += m;
    k -= m;
  }
}

int64_t kvx_recvv_now(kvx_chan *ch, struct iovec *iov, int n) {
  if (!ch->rx) return kvx_fd_recvv_now(ch->fd, iov, n);
  if (ch->bad) return KVX_IO_SEAL;
  iov_at at = {iov, n, 0, 0};
  int64_t got = 0;
  size_t span;
  while ((span = at_span(&at))) {
    if (ch->rp < ch->re) {  // opened plaintext first
      size_t k = ch->re - ch->rp < span ? ch->re - ch->rp : span;
      memcpy(at_ptr(&at), ch->r + ch->rp, k);
      ch->rp += k;
      at.off += k;
      got += (int64_t)k;
      continue;
    }
    int o = rec_open(ch);
    if (o < 0) return o;
    if (o) continue;
    int64_t r = rec_fill(ch);
    if (r == KVX_IO_SEAL) return r;
    if (r <= 0) return got ? got : r;  // an error meets the caller at its next call
  }
  return got;
}

int kvx_wait_in(kvx_chan *ch, int timeout_ms) {
  if (ch->rx && (ch->rp < ch->re || ch->bad)) return 0;
  if (ch->rx) {
    int o = rec_open(ch);
    if (o) return o < 0 ? o : 0;
  }
  return kvx_wait_fd(ch->fd, POLLIN, timeout_ms);
}

int kvx_recvv_all(kvx_chan *ch, struct iovec *iov, int n, int timeout_ms) {
  n = kvx_iov_advance(&iov, n, 0); // plain or sealed alike: kvx_recvv_now takes the channel's way
  while (n > 0) {
    int64_t r = kvx_recvv_now(ch, iov, n);
    if (r < 0) return (int)r;
    if (r > 0) {
      n = kvx_iov_advance(&iov, n, (size_t)r);
      continue;
    }
    int w = kvx_wait_fd(ch->fd, POLLIN, timeout_ms);
    if (w < 0) return w;
  }
  return 0;
}

int kvx_recv_all(kvx_chan *ch, void *buf, size_t len, int timeout_ms, int idle_ok) {
  if (!ch->rx) return kvx_fd_recv_all(ch->fd, buf, len, timeout_ms, idle_ok);
  struct iovec v = {.iov_base = buf, .iov_len = len}, *iov = &v;
  int n = len ? 1 : 0;
  size_t got = 0;
  while (n > 0) {
    int64_t r = kvx_recvv_now(ch, iov, n);
    if (r < 0) return (int)r;
    if (r > 0) {
      got += (size_t)r;
      n = kvx_iov_advance(&iov, n, (size_t)r);
      continue;
    }
    int w = kvx_wait_fd(ch->fd, POLLIN, timeout_ms);
    if (w == -2 && idle_ok && got == 0) return 1;
    if (w < 0) return w;
  }
  return 0;
}

// Seals the caller's next bytes (at, at least one) into up to KVX_REC_BATCH records in t, for one send.
static int rec_seal(kvx_chan *ch, iov_at at) {
  ch->tp = ch->tl = ch->tplain = 0;
  for (int r = 0; r < KVX_REC_BATCH && at_span(&at); r++) {
    uint8_t *rec = ch->t + ch->tl, *o = rec + 4, *end;
    iov_at m = at;
    size_t len = 0, span;
    while (len < KVX_REC_MAX && (span = at_span(&m))) {
      size_t k = span < KVX_REC_MAX - len ? span : KVX_REC_MAX - len;
      len += k;
      m.off += k;
    }
    uint32_t l = (uint32_t)len;
    memcpy(rec, &l, 4);
    if (utl_seal_begin(ch->tx, rec, 4)) return KVX_IO_CRYPTO;
    for (end = o + len; o < end;) {
      span = at_span(&at);
      size_t k = span < (size_t)(end - o) ? span : (size_t)(end - o);
      if (utl_seal_update(ch->tx, at_ptr(&at), k, o)) return KVX_IO_CRYPTO;
      at.off += k;
      o += k;
    }
    if (utl_seal_end(ch->tx, o)) return KVX_IO_CRYPTO;
    ch->tl += 4 + len + UTL_SEAL_TAG;
    ch->tplain += len;
  }
  return 0;
}

int64_t kvx_sendv_now(kvx_chan *ch, struct iovec *iov, int n) {
  if (!ch->tx) return kvx_fd_sendv_now(ch->fd, iov, n);
  int64_t done = 0;
  iov_at at = {iov, n, 0, 0};
  for (;;) {
    while (ch->tp < ch->tl) {  // the records under way (they hold the caller's next tplain bytes) go out first
      ssize_t w = send(ch->fd, ch->t + ch->tp, ch->tl - ch->tp, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return done;
      if (w < 0) return (errno == EPIPE || errno == ECONNRESET) ? -1 : -3;
      ch->tp += (size_t)w;
    }
    if (ch->tplain) {
      done += (int64_t)ch->tplain;
      at_skip(&at, ch->tplain);
      ch->tplain = 0;
    }
    if (!at_span(&at)) return done;
    int rc = rec_seal(ch, at);
    if (rc) return rc;
  }
}

int kvx_sendv_all(kvx_chan *ch, struct iovec *iov, int n, int timeout_ms) {
  if (!ch->tx) return kvx_fd_sendv_all(ch->fd, iov, n, timeout_ms);
  n = kvx_iov_advance(&iov, n, 0);
  while (n > 0) {
    int64_t w = kvx_sendv_now(ch, iov, n);
    if (w < 0) return (int)w;
    n = kvx_iov_advance(&iov, n, (size_t)w);
    if (n > 0) {
      int r = kvx_wait_fd(ch->fd, POLLOUT, timeout_ms);
      if (r < 0) return r;
    }
  }
  return 0;
}

int kvx_send_all(kvx_chan *ch, const void *buf, size_t len, int timeout_ms) {
  struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
  return kvx_sendv_all(ch, &v, 1, timeout_ms);
}

int kvx_send_frame(kvx_chan *ch, uint16_t op, uint16_t flags, uint64_t req, uint64_t addr, uint64_t len,
                   uint64_t key, const void *payload, size_t plen, int timeout_ms) {
  kvx_hdr h = {.magic = KVX_FRAME_MAGIC, .op = op, .flags = flags, .req = req, .addr = addr, .len = len, .key = key};
  struct iovec v[2] = {{.iov_base = &h, .iov_len = sizeof h}, {.iov_base = (void *)payload, .iov_len = plen}};
  return kvx_sendv_all(ch, v, plen ? 2 : 1, timeout_ms);
}

const char *kvx_io_why(int rc) {
  switch (rc) {
    case -1: return "connection closed by peer";
    case -2: return "timed out";
    case KVX_IO_SEAL: return "a sealed record failed to open (altered, replayed, reordered or malformed)";
    case KVX_IO_CRYPTO: return "sealing failed (libcrypto)";
    default: return strerror(errno);
  }
}

// Handshake, version 2 (a version 1 agent's greeting is "KVXH"; each side refuses the other's):
//   S->C  "KVH2" nonce_s[32]
//   C->S  "KVC2" name_len(u16) name nonce_c[32] seal_c(u8) mac_c = HMAC(secret, "kvx-client-2"|nonce_s|nonce_c|name|seal_c)
//   S->C  "KVS2" status(u32: 0 ok, 1 refused, 2 seal settings differ) seal_s(u8) pad[3]
//         mac_s = HMAC(secret, "kvx-server-2"|nonce_c|nonce_s|name|seal_c|seal_s) (zeros when refused)
// When both seal, the keys: HKDF-SHA256(secret, salt nonce_s|nonce_c, info "kvx-seal-2"|name|mac_c|mac_s), 64 bytes:
// client-to-server then server-to-client. Fresh nonces make them fresh per connection; the MACs bind them to this
// exchange, so a settings byte changed on the way fails a MAC.
#define HS_S 0x3248564bu  // "KVH2"
#define HS_S1 0x4858564bu // "KVXH": version 1
#define HS_C 0x3243564bu  // "KVC2"
#define HS_R 0x3253564bu  // "KVS2"
enum { HS_OK = 0, HS_REFUSED = 1, HS_MISMATCH = 2 };
#define HS_REPLY 44

static void mac(const void *secret, size_t slen, const char *label, const uint8_t *n1, const uint8_t *n2,
                const char *name, const uint8_t *seal, size_t nseal, uint8_t out[32]) {
  const void *parts[5] = {label, n1, n2, name, seal};
  size_t lens[5] = {strlen(label), 32, 32, strlen(name), nseal};
  utl_hmac_sha256(secret, slen, parts, lens, 5, out);
}

static const char *onoff(int seal) { return seal ? "on" : "off"; }

// Both ends' keys, and ch sealed with them (client: 1 on the connecting side).
static int hs_keys(kvx_chan *ch, int client, const void *secret, size_t slen, const uint8_t *ns, const uint8_t *nc,
                   const char *name, const uint8_t *mac_c, const uint8_t *mac_s, char *err, size_t errlen) {
  uint8_t salt[64], info[10 + KVX_MAX_NAME + 64], k[64];
  size_t nl = strlen(name), o = 0;
  memcpy(salt, ns, 32);
  memcpy(salt + 32, nc, 32);
  memcpy(info, "kvx-seal-2", 10), o += 10;
  memcpy(info + o, name, nl), o += nl;
  memcpy(info + o, mac_c, 32), o += 32;
  memcpy(info + o, mac_s, 32), o += 32;
  int rc = utl_hkdf_sha256(secret, slen, salt, sizeof salt, info, o, k, sizeof k);
  if (!rc) rc = client ? ch_seal(ch, k, "kvC>", k + 32, "kvS>") : ch_seal(ch, k + 32, "kvS>", k, "kvC>");
  utl_wipe(k, sizeof k);
  if (rc) utl_seterr(err, errlen, "handshake: cannot set up sealing (libcrypto or memory)");
  return rc;
}

int kvx_handshake_client(kvx_chan *ch, const char *my_name, const void *secret, size_t slen, int seal,
                         int timeout_ms, char *err, size_t errlen) {
  if (!secret || !slen) {
    utl_seterr(err, errlen, "handshake: no shared secret");
    return -1;
  }
  uint8_t in[36];
  int rc = kvx_fd_recv_all(ch->fd, in, sizeof in, timeout_ms, 0);
  if (rc) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  uint32_t magic;
  memcpy(&magic, in, 4);
  if (magic != HS_S) {
    utl_seterr(err, errlen, magic == HS_S1 ? "handshake: peer runs an older kvxfer (handshake version 1, no sealing): "
                                             "upgrade it"
                                           : "handshake: not a kvxfer agent (bad greeting)");
    return -1;
  }
  uint8_t nc[32], out[4 + 2 + KVX_MAX_NAME + 32 + 1 + 32], sc = seal ? 1 : 0;
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
  out[o++] = sc;
  uint8_t *mac_c = out + o;
  mac(secret, slen, "kvx-client-2", in + 4, nc, my_name, &sc, 1, mac_c), o += 32;
  if ((rc = kvx_fd_send_all(ch->fd, out, o, timeout_ms))) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  uint8_t resp[HS_REPLY];
  if ((rc = kvx_fd_recv_all(ch->fd, resp, sizeof resp, timeout_ms, 0))) {
    utl_seterr(err, errlen, "handshake: peer closed before answering (%s): refused", kvx_io_why(rc));
    return -1;
  }
  uint32_t st;
  memcpy(&magic, resp, 4);
  memcpy(&st, resp + 4, 4);
  if (magic != HS_R || (st != HS_OK && st != HS_MISMATCH)) {
    utl_seterr(err, errlen, "handshake: peer refused authentication (shared secret mismatch?)");
    return -1;
  }
  uint8_t want[32], both[2] = {sc, resp[8]};
  mac(secret, slen, "kvx-server-2", nc, in + 4, my_name, both, 2, want);
  if (!utl_ct_equal(want, resp + 12, 32)) {
    utl_seterr(err, errlen, "handshake: peer failed to prove the shared secret");
    return -1;
  }
  if (st == HS_MISMATCH || both[1] != sc) {
    utl_seterr(err, errlen, "handshake: kvxfer encryption differs: this agent's kvxfer.encrypt is %s, the peer's %s "
               "(every agent of a cluster must agree)", onoff(sc), onoff(both[1]));
    return -1;
  }
  return sc ? hs_keys(ch, 1, secret, slen, in + 4, nc, my_name, mac_c, resp + 12, err, errlen) : 0;
}

int kvx_handshake_server(kvx_chan *ch, const void *secret, size_t slen, int seal, int timeout_ms, char *peer_name,
                         char *err, size_t errlen) {
  if (!secret || !slen) {
    utl_seterr(err, errlen, "handshake: no shared secret: refusing every peer");
    return -1;
  }
  int fd = ch->fd;
  uint8_t g[36];
  uint32_t magic = HS_S;
  memcpy(g, &magic, 4);
  if (utl_random(g + 4, 32)) {
    utl_seterr(err, errlen, "getrandom: %s", strerror(errno));
    return -1;
  }
  int rc = kvx_fd_send_all(fd, g, sizeof g, timeout_ms);
  uint8_t h[6];
  if (!rc) rc = kvx_fd_recv_all(fd, h, 6, timeout_ms, 0);
  if (rc) {
    utl_seterr(err, errlen, "handshake: %s%s", kvx_io_why(rc),
               rc == -1 ? " (a kvxfer agent older than handshake version 2 closes on its greeting)" : "");
    return -1;
  }
  uint16_t nl;
  memcpy(&magic, h, 4);
  memcpy(&nl, h + 4, 2);
  if (magic != HS_C || nl == 0 || nl >= KVX_MAX_NAME) {  // (the setting byte is checked once it is read)
    utl_seterr(err, errlen, "handshake: malformed client hello");
    return -1;
  }
  uint8_t rest[KVX_MAX_NAME + 65];
  if ((rc = kvx_fd_recv_all(fd, rest, (size_t)nl + 65, timeout_ms, 0))) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  if (rest[nl + 32] > 1) {
    utl_seterr(err, errlen, "handshake: malformed client hello (sealing setting %u)", rest[nl + 32]);
    return -1;
  }
  char name[KVX_MAX_NAME];
  memcpy(name, rest, nl);
  name[nl] = 0;
  const uint8_t *nc = rest + nl, *mac_c = rest + nl + 33;
  uint8_t both[2] = {rest[nl + 32], seal ? 1 : 0}, want[32], resp[HS_REPLY] = {0};
  mac(secret, slen, "kvx-client-2", g + 4, nc, name, both, 1, want);
  magic = HS_R;
  memcpy(resp, &magic, 4);
  resp[8] = both[1];
  if (!kvx_valid_name(name) || !utl_ct_equal(want, mac_c, 32)) {
    uint32_t st = HS_REFUSED;
    memcpy(resp + 4, &st, 4);
    kvx_fd_send_all(fd, resp, sizeof resp, timeout_ms);
    utl_seterr(err, errlen, "handshake: peer '%.63s' refused: wrong shared secret%s", kvx_valid_name(name) ? name : "?",
               kvx_valid_name(name) ? "" : " or bad name");
    return -1;
  }
  // The peer proved the secret: it learns our setting (under our MAC) even when the two differ.
  uint32_t st = both[0] == both[1] ? HS_OK : HS_MISMATCH;
  memcpy(resp + 4, &st, 4);
  mac(secret, slen, "kvx-server-2", nc, g + 4, name, both, 2, resp + 12);
  if ((rc = kvx_fd_send_all(fd, resp, sizeof resp, timeout_ms))) {
    utl_seterr(err, errlen, "handshake: %s", kvx_io_why(rc));
    return -1;
  }
  if (st == HS_MISMATCH) {
    utl_seterr(err, errlen, "handshake: peer '%s' refused: kvxfer encryption differs: this agent's kvxfer.encrypt is "
               "%s, the peer's %s (every agent of a cluster must agree)", name, onoff(both[1]), onoff(both[0]));
    return -1;
  }
  if (both[1] && hs_keys(ch, 0, secret, slen, g + 4, nc, name, mac_c, resp + 12, err, errlen)) return -1;
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
