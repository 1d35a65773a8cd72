// kvstore/kvs_conn.c: one connection to one Redis node: our nonblocking socket (TLS over it when configured) and
// deadline, hiredis's command formatting and reply parser, pipelined commands, and several connections' round trips
// in flight at once.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvstore/kvs_int.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/net.h"

struct kvs_conn {
  int fd;
  SSL *ssl;        // (owned) NULL: plain TCP
  kvs_parser parse; // replies parsed from what has arrived
  utl_buf out;     // commands queued, not yet sent
  size_t sent;     // bytes of out already on the socket
};

void kvs_conn_close(kvs_conn *c) {
  if (!c) return;
  kvs_tls_free(c->ssl);
  if (c->fd >= 0) close(c->fd);
  kvs_parser_free(&c->parse);
  utl_buf_free(&c->out);
  free(c);
}

int kvs_conn_cmd(kvs_conn *c, int argc, const char **argv, const size_t *lens) {
  char *cmd = NULL;
  int n = redisFormatCommandArgv(&cmd, argc, argv, lens);
  if (n < 0) return -1;
  int rc = utl_buf_add(&c->out, cmd, (size_t)n);
  redisFreeCommand(cmd);
  return rc;
}

static int remaining(int64_t deadline_ms) {
  int64_t r = deadline_ms - utl_now_ms();
  return r < 0 ? 0 : r > 1000000 ? 1000000 : (int)r;
}

// Writes what the socket takes now: 0 (maybe some left), or -1 (the socket failed).
static int pump_out(kvs_conn *c) {
  while (c->sent < c->out.n) {
    if (c->ssl) {
      long k = kvs_tls_send(c->ssl, c->out.p + c->sent, c->out.n - c->sent);
      if (k <= 0) return (int)k; // 0: would block
      c->sent += (size_t)k;
      continue;
    }
    ssize_t k = send(c->fd, c->out.p + c->sent, c->out.n - c->sent, MSG_NOSIGNAL);
    if (k > 0) {
      c->sent += (size_t)k;
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return 0;
    } else {
      return -1;
    }
  }
  utl_buf_reset(&c->out);
  c->sent = 0;
  return 0;
}

// Moves parsed replies into reps until want: 0, or -1 (a protocol error).
static int take(kvs_conn *c, redisReply **reps, int want, int *got) {
  while (*got < want) {
    redisReply *r = NULL;
    if (kvs_parser_get(&c->parse, &r) < 0) return -1;
    if (!r) return 0;
    reps[(*got)++] = r;
  }
  return 0;
}

// Reads what has arrived into the parser, taking replies (into reps, up to want) after every chunk: hiredis moves the
// unparsed rest of its buffer to the front each time it hands out a reply, so a buffer holding a whole pipeline of
// large values would be copied once per reply. 0, or -1 (closed by the peer, the socket failed, a protocol error).
static int pump_in(kvs_conn *c, redisReply **reps, int want, int *got) {
  char buf[65536];
  for (;;) {
    long k;
    if (c->ssl) { // read until it would block: a record's rest may wait in libssl, where poll cannot see it
      k = kvs_tls_recv(c->ssl, buf, sizeof buf);
      if (k == 0) return 0;
    } else {
      k = recv(c->fd, buf, sizeof buf, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      if (k == 0) k = -1; // closed
    }
    if (k < 0) return -1;
    if (kvs_parser_feed(&c->parse, buf, (size_t)k) < 0 || take(c, reps, want, got) < 0) return -1;
    if (!c->ssl && (size_t)k < sizeof buf) return 0;
  }
}

redisReply **kvs_conn_replies_new(int n, const int *want, redisReply ***reps) {
  int total = 0;
  for (int i = 0; i < n; i++) total += want[i];
  redisReply **all = calloc((size_t)total + 1, sizeof *all);
  for (int i = 0, off = 0; all && i < n; i++) {
    reps[i] = all + off;
    off += want[i];
  }
  return all;
}

void kvs_conn_replies_free(redisReply **all, int n, const int *want) {
  int total = 0;
  for (int i = 0; i < n; i++) total += want[i];
  for (int j = 0; all && j < total; j++)
    if (all[j]) freeReplyObject(all[j]);
  free(all);
}

void kvs_conn_exchange(kvs_conn **cs, int n, const int *want, redisReply ***reps, kvs_conn_rc *rc,
                       int64_t deadline_ms) {
  int got[KVS_MAX_NODES] = {0}, open = 0;
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < want[i]; j++) reps[i][j] = NULL;
    rc[i] = KVS_C_OK;
    if (pump_out(cs[i]) < 0 || take(cs[i], reps[i], want[i], &got[i]) < 0) rc[i] = KVS_C_IO;
    if (rc[i] == KVS_C_OK && (got[i] < want[i] || cs[i]->out.n)) open++;
  }
  struct pollfd p[KVS_MAX_NODES];
  int idx[KVS_MAX_NODES];
  while (open > 0) {
    int m = 0;
    for (int i = 0; i < n; i++) {
      if (rc[i] != KVS_C_OK || (got[i] >= want[i] && !cs[i]->out.n)) continue;
      p[m] = (struct pollfd){.fd = cs[i]->fd, .events = (short)(POLLIN | (cs[i]->out.n ? POLLOUT : 0))};
      // (TLS: a read that needs the socket writable, a key update while our buffer is full, is rare enough to wait
      // for the next POLLIN or the deadline; polling POLLOUT always would spin.)
      idx[m++] = i;
    }
    int left = remaining(deadline_ms);
    int k = left > 0 ? poll(p, (nfds_t)m, left) : 0;
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) { // the budget is spent: whoever has not answered has timed out
      for (int j = 0; j < m; j++) rc[idx[j]] = k < 0 ? KVS_C_IO : KVS_C_TIMEOUT;
      break;
    }
    open = 0;
    for (int j = 0; j < m; j++) {
      int i = idx[j];
      // TLS: a write may wait on a read (a renegotiation), so pump out again on POLLIN as well
      if (p[j].revents & (POLLOUT | (cs[i]->ssl ? POLLIN : 0)) && pump_out(cs[i]) < 0) rc[i] = KVS_C_IO;
      if (rc[i] == KVS_C_OK && p[j].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (pump_in(cs[i], reps[i], want[i], &got[i]) < 0) rc[i] = KVS_C_IO;
        if (rc[i] == KVS_C_IO && got[i] >= want[i]) rc[i] = KVS_C_OK; // every reply came before the close
      }
      if (rc[i] == KVS_C_OK && (got[i] < want[i] || cs[i]->out.n)) open++;
    }
  }
}

kvs_conn_rc kvs_conn_call(kvs_conn *c, int argc, const char **argv, const size_t *lens, int64_t deadline_ms,
                          redisReply **reply) {
  *reply = NULL;
  if (kvs_conn_cmd(c, argc, argv, lens) < 0) return KVS_C_IO;
  int want = 1;
  redisReply **reps = reply;
  kvs_conn_rc rc;
  kvs_conn_exchange(&c, 1, &want, &reps, &rc, deadline_ms);
  return rc;
}

kvs_conn_rc kvs_conn_open(const char *host, int port, SSL_CTX *tls, const char *password, size_t max_reply,
                          int64_t deadline_ms, kvs_conn **out, char *err, size_t errlen) {
  *out = NULL;
  int left = remaining(deadline_ms);
  int fd = left > 0 ? utl_tcp_connect(host, port, left, err, errlen) : -1;
  if (fd < 0) {
    if (left <= 0) utl_seterr(err, errlen, "connect to %s:%d: no time left", host, port);
    return KVS_C_IO;
  }
  kvs_conn *c = calloc(1, sizeof *c);
  if (!c || kvs_parser_init(&c->parse, max_reply) < 0) {
    close(fd);
    free(c);
    utl_seterr(err, errlen, "out of memory");
    return KVS_C_IO;
  }
  c->fd = fd;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (tls) {
    kvs_conn_rc rc = kvs_tls_connect(tls, fd, host, deadline_ms, &c->ssl, err, errlen);
    if (rc != KVS_C_OK) {
      kvs_conn_close(c);
      return rc;
    }
  }
  if (password) {
    const char *argv[2] = {"AUTH", password};
    size_t lens[2] = {4, strlen(password)};
    redisReply *r = NULL;
    kvs_conn_rc rc = kvs_conn_call(c, 2, argv, lens, deadline_ms, &r);
    if (rc != KVS_C_OK || r->type != REDIS_REPLY_STATUS) {
      if (rc == KVS_C_OK) { // the store answered, and it was no
        utl_seterr(err, errlen, "AUTH at %s:%d refused: %.*s", host, port, (int)(r->len > 200 ? 200 : r->len),
                   r->str ? r->str : "");
        rc = KVS_C_AUTH;
      } else {
        utl_seterr(err, errlen, "AUTH at %s:%d: %s", host, port, rc == KVS_C_TIMEOUT ? "timed out" : "I/O error");
      }
      if (r) freeReplyObject(r);
      kvs_conn_close(c);
      return rc;
    }
    freeReplyObject(r);
  }
  *out = c;
  return KVS_C_OK;
}
