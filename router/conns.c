// router/conns.c: the router's connection gate: its listening socket and accept thread, the caps on open connections
// (all clients, one client address) with a quick 503 beyond them, and the deadlines for a request's head and body
// (a late body gets a 408).
// Accepted sockets go to libmicrohttpd with MHD_add_connection (the daemon has no listening socket of its own); its
// thread starts each one later and tells us (MHD_OPTION_NOTIFY_CONNECTION STARTED, matched by socket), and tells us
// again just before it closes the socket (CLOSED), which keeps the counts.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "router/server_int.h"
#include "util/err.h"
#include "util/log.h"

#define GATE_BUCKETS 1024    // per-address count table
#define GATE_LINGER 64       // refused sockets kept open (draining) so the client reads its 503 rather than a reset
#define GATE_LINGER_MS 1000  // ... for at most this long
#define GATE_TICK_MS 100     // how often head and body deadlines are checked
// A body's deadline grows by 1 s per this many bytes received: a large body on a slow link still arrives, a trickle
// gains nothing (mod_reqtimeout's MinRate)
#define GATE_BODY_MIN_RATE 4096

typedef struct gate_client { // open connections from one address
  uint32_t addr;             // IPv4, network order
  int n;
  struct gate_client *next;
} gate_client;

typedef struct gate_conn {   // one connection handed to MHD: its socket context
  int fd;                    // (borrowed: MHD closes it) valid while listed
  uint32_t addr;
  int64_t head_due_us;       // its next request head must be complete by then (0: a request is being served)
  int64_t body_due_us;       // the body being read must be complete by then, plus body_bytes / GATE_BODY_MIN_RATE s
                             // (0: no body is being read)
  int64_t body_bytes;        // ... received so far
  int killed;                // shut down for a late head or body
  struct gate_conn *prev, *next; // in pending (handed to MHD, not started yet) or in conns (started)
} gate_conn;

typedef struct linger_fd {
  int fd;
  int64_t until_us;
} linger_fd;

struct rtr_gate {
  rtr_server *s;             // (borrowed)
  int lfd;                   // listening socket (owned)
  int wake[2];               // pipe that stops the accept thread (owned)
  int spare_fd;              // /dev/null held open: given up to accept and refuse one connection when out of fds
  pthread_t thread;
  int has_thread, stop;
  int max_total, max_client;
  int64_t head_us, idle_us, body_us; // header_timeout_s, conn_timeout_s, body_timeout_s
  char busy_total[512], busy_client[512], late_body[512]; // canned 503 responses, the late body's 408
  size_t busy_total_len, busy_client_len, late_body_len;
  // accept thread only
  linger_fd linger[GATE_LINGER];
  int n_linger;
  // guarded by mu (never held while calling MHD)
  pthread_mutex_t mu;
  int n_open;
  long refused;              // connections refused with 503 so far
  gate_client *clients[GATE_BUCKETS];
  gate_conn *pending;        // handed to MHD, not started yet (counted)
  gate_conn *conns;          // started connections
};

static gate_client **client_slot(rtr_gate *g, uint32_t addr) {
  gate_client **pp = &g->clients[(addr * 2654435761u) >> 22 & (GATE_BUCKETS - 1)];
  while (*pp && (*pp)->addr != addr) pp = &(*pp)->next;
  return pp;
}

static int client_count(rtr_gate *g, uint32_t addr) {
  gate_client *c = *client_slot(g, addr);
  return c ? c->n : 0;
}

static int client_add(rtr_gate *g, uint32_t addr, int d) { // 0, or -1 out of memory
  gate_client **pp = client_slot(g, addr);
  if (!*pp) {
    if (d <= 0) return 0;
    gate_client *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->addr = addr;
    *pp = c;
  }
  (*pp)->n += d;
  if ((*pp)->n <= 0) {
    gate_client *c = *pp;
    *pp = c->next;
    free(c);
  }
  return 0;
}

static void push_conn(gate_conn **head, gate_conn *c) {
  c->prev = NULL;
  c->next = *head;
  if (*head) (*head)->prev = c;
  *head = c;
}

static void pop_conn(gate_conn **head, gate_conn *c) {
  if (c->prev) c->prev->next = c->next;
  else *head = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

static void forget_conn(rtr_gate *g, gate_conn **head, gate_conn *c) { // unlinks, uncounts and frees c
  pop_conn(head, c);
  g->n_open--;
  client_add(g, c->addr, -1);
  free(c);
}

static gate_conn *pending_of(rtr_gate *g, int fd) {
  gate_conn *c = g->pending;
  while (c && c->fd != fd) c = c->next;
  return c;
}

// A whole response with an error object, written by this thread onto a socket MHD has not answered on.
static size_t canned(char *out, size_t cap, int status, const char *type, const char *code, const char *msg) {
  rtr_error e;
  rtr_fail(&e, status, type, NULL, code, "%s", msg);
  char *j = rtr_error_json(&e);
  int n = snprintf(out, cap,
                   "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%sConnection: "
                   "close\r\n\r\n%s",
                   status == 503 ? "503 Service Unavailable" : "408 Request Timeout", j ? strlen(j) : 2,
                   status == 503 ? "Retry-After: 1\r\n" : "", j ? j : "{}");
  free(j);
  return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

static void drain(int fd) {
  char b[4096];
  for (int i = 0; i < 16 && recv(fd, b, sizeof b, MSG_DONTWAIT) > 0; i++) {}
}

// Answers a refused socket with 503 and keeps it (draining what the client still sends) for GATE_LINGER_MS, so that
// the client reads the answer instead of a connection reset.
static void refuse(rtr_gate *g, int fd, int per_client) {
  drain(fd);
  const char *b = per_client ? g->busy_client : g->busy_total;
  size_t n = per_client ? g->busy_client_len : g->busy_total_len;
  if (send(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {}
  shutdown(fd, SHUT_WR);
  pthread_mutex_lock(&g->mu);
  g->refused++;
  pthread_mutex_unlock(&g->mu);
  if (g->n_linger == GATE_LINGER) {
    close(fd);
    return;
  }
  g->linger[g->n_linger++] = (linger_fd){fd, utl_now_us() + GATE_LINGER_MS * 1000};
}

static void linger_step(rtr_gate *g, const struct pollfd *pf) { // pf: the linger entries' poll results
  int64_t t = utl_now_us();
  for (int i = 0, w = 0, n = g->n_linger; i < n; i++) {
    linger_fd l = g->linger[i];
    int done = t > l.until_us;
    if (!done && pf && pf[i].revents) {
      char b[4096];
      ssize_t k = recv(l.fd, b, sizeof b, MSG_DONTWAIT);
      done = k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR);
    }
    if (done) {
      close(l.fd);
      g->n_linger--;
    } else
      g->linger[w++] = l;
  }
}

// Shuts down connections whose request head or body is late; MHD sees the end of the socket and closes it (then
// tells us). A late body is answered 408 first: its head was read, so the client waits for an answer, and MHD has
// written nothing on the socket (it answers only once the body is complete: rtr_gate_body_done).
static void sweep_late(rtr_gate *g) {
  int64_t t = utl_now_us();
  pthread_mutex_lock(&g->mu);
  for (gate_conn *c = g->conns; c; c = c->next) {
    if (c->killed) continue;
    int late_head = c->head_due_us && t > c->head_due_us;
    int late_body = c->body_due_us && t > c->body_due_us + c->body_bytes * 1000000 / GATE_BODY_MIN_RATE;
    if (!late_head && !late_body) continue;
    c->killed = 1;
    if (late_body) {
      drain(c->fd); // unread bytes at the close would reset the connection and could lose the answer
      if (send(c->fd, g->late_body, g->late_body_len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {}
    }
    shutdown(c->fd, SHUT_RDWR);
  }
  pthread_mutex_unlock(&g->mu);
}

static void accept_one(rtr_gate *g, int fd, const struct sockaddr_in *sa, socklen_t salen) {
  uint32_t addr = sa->sin_family == AF_INET ? sa->sin_addr.s_addr : 0;
  gate_conn *c = calloc(1, sizeof *c);
  pthread_mutex_lock(&g->mu);
  // a pending connection on the same socket number never started (MHD closed it without telling): forget it
  gate_conn *stale = pending_of(g, fd);
  if (stale) forget_conn(g, &g->pending, stale);
  int over_total = g->n_open >= g->max_total, over_client = client_count(g, addr) >= g->max_client;
  if (!c || over_total || over_client || client_add(g, addr, 1) < 0) {
    pthread_mutex_unlock(&g->mu);
    free(c);
    refuse(g, fd, !over_total && over_client);
    return;
  }
  c->fd = fd;
  c->addr = addr;
  c->head_due_us = utl_now_us() + g->head_us;
  push_conn(&g->pending, c);
  g->n_open++;
  pthread_mutex_unlock(&g->mu);
  // MHD owns fd from here (it closes it on failure too); on success its thread starts the connection later, which
  // moves c to conns, and c may be gone by the time this call returns
  if (MHD_add_connection(g->s->mhd, fd, (const struct sockaddr *)sa, salen) != MHD_YES) {
    pthread_mutex_lock(&g->mu);
    if ((c = pending_of(g, fd))) forget_conn(g, &g->pending, c);
    pthread_mutex_unlock(&g->mu);
  }
}

static void *gate_main(void *arg) {
  rtr_gate *g = arg;
  struct pollfd pf[2 + GATE_LINGER];
  int64_t next_sweep = utl_now_us();
  while (!g->stop) {
    pf[0] = (struct pollfd){.fd = g->lfd, .events = POLLIN};
    pf[1] = (struct pollfd){.fd = g->wake[0], .events = POLLIN};
    for (int i = 0; i < g->n_linger; i++) pf[2 + i] = (struct pollfd){.fd = g->linger[i].fd, .events = POLLIN};
    int n_linger = g->n_linger;
    int k = poll(pf, (nfds_t)(2 + n_linger), GATE_TICK_MS);
    if (k < 0 && errno != EINTR) break;
    if (k > 0 && pf[1].revents) break;
    linger_step(g, k > 0 ? pf + 2 : NULL);
    if (k > 0 && (pf[0].revents & POLLIN)) {
      for (int i = 0; i < 64; i++) { // a burst at a time, then the sweep and the lingering sockets get their turn
        struct sockaddr_in sa;
        socklen_t salen = sizeof sa;
        int fd = accept4(g->lfd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if ((errno == EMFILE || errno == ENFILE) && g->spare_fd >= 0) { // out of fds: refuse one to make room
            close(g->spare_fd);
            fd = accept4(g->lfd, (struct sockaddr *)&sa, &salen, SOCK_CLOEXEC);
            if (fd >= 0) {
              if (send(fd, g->busy_total, g->busy_total_len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {}
              close(fd);
            }
            g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            pthread_mutex_lock(&g->mu);
            g->refused++;
            pthread_mutex_unlock(&g->mu);
          } else if (errno == EMFILE || errno == ENFILE)
            poll(NULL, 0, 50); // nothing to give up: back off rather than spin
          break;
        }
        accept_one(g, fd, &sa, salen);
      }
    }
    if (utl_now_us() >= next_sweep) {
      sweep_late(g);
      next_sweep = utl_now_us() + GATE_TICK_MS * 1000;
    }
  }
  return NULL;
}

// ---------------------------------------------------------------------------------------------------------------
// what http.c calls

// The MHD connection notification, from MHD's thread: STARTED once it took over a socket we added, CLOSED just
// before it closes the socket.
void rtr_gate_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe) {
  rtr_server *s = cls;
  rtr_gate *g = s->gate;
  if (!g) return;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&g->mu);
    gate_conn *c = ci ? pending_of(g, ci->connect_fd) : NULL;
    if (c) {
      pop_conn(&g->pending, c);
      push_conn(&g->conns, c);
    }
    pthread_mutex_unlock(&g->mu);
    *socket_context = c;
    return;
  }
  gate_conn *c = *socket_context;
  if (!c) return;
  pthread_mutex_lock(&g->mu);
  forget_conn(g, &g->conns, c);
  pthread_mutex_unlock(&g->mu);
  *socket_context = NULL;
}

static gate_conn *conn_of(struct MHD_Connection *mc) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

void rtr_gate_head_seen(rtr_server *s, struct MHD_Connection *mc) {
  gate_conn *c = s->gate ? conn_of(mc) : NULL;
  if (!c) return;
  pthread_mutex_lock(&s->gate->mu);
  c->head_due_us = 0;
  pthread_mutex_unlock(&s->gate->mu);
}

// The request's body is being read from now: it is due within body_timeout_s (plus its allowance per byte).
void rtr_gate_body_start(rtr_server *s, struct MHD_Connection *mc) {
  gate_conn *c = s->gate ? conn_of(mc) : NULL;
  if (!c) return;
  pthread_mutex_lock(&s->gate->mu);
  c->body_due_us = utl_now_us() + s->gate->body_us;
  c->body_bytes = 0;
  pthread_mutex_unlock(&s->gate->mu);
}

void rtr_gate_body_read(rtr_server *s, struct MHD_Connection *mc, size_t n) {
  gate_conn *c = s->gate ? conn_of(mc) : NULL;
  if (!c) return;
  pthread_mutex_lock(&s->gate->mu);
  c->body_bytes += (int64_t)n;
  pthread_mutex_unlock(&s->gate->mu);
}

// The body is complete: 1 when it came too late (the 408 is on the socket already: nothing more may be written),
// else 0 and the body deadline is off.
int rtr_gate_body_done(rtr_server *s, struct MHD_Connection *mc) {
  gate_conn *c = s->gate ? conn_of(mc) : NULL;
  if (!c) return 0;
  pthread_mutex_lock(&s->gate->mu);
  int late = c->killed;
  c->body_due_us = 0;
  pthread_mutex_unlock(&s->gate->mu);
  return late;
}

// A request ended: the next one's head is due within the idle timeout plus the head timeout.
void rtr_gate_request_done(rtr_server *s, struct MHD_Connection *mc) {
  gate_conn *c = s->gate ? conn_of(mc) : NULL;
  if (!c) return;
  pthread_mutex_lock(&s->gate->mu);
  c->head_due_us = utl_now_us() + s->gate->idle_us + s->gate->head_us;
  c->body_due_us = 0;
  pthread_mutex_unlock(&s->gate->mu);
}

void rtr_gate_counts(rtr_server *s, int *open, long *refused) {
  *open = 0;
  *refused = 0;
  if (!s->gate) return;
  pthread_mutex_lock(&s->gate->mu);
  *open = s->gate->n_open;
  *refused = s->gate->refused;
  pthread_mutex_unlock(&s->gate->mu);
}

// The soft limit on open files is raised (up to the hard limit) when it cannot hold max_connections: a default of
// 1024 would otherwise refuse connections long before the cap.
static void raise_nofile(int want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)want) return;
  rlim_t old = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= (rlim_t)want ? (rlim_t)want : rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
    utl_log(LOGC, "open-file limit raised from %llu to %llu for max_connections", (unsigned long long)old,
            (unsigned long long)rl.rlim_cur);
  if (rl.rlim_cur < (rlim_t)want)
    utl_logl(UTL_LOG_WARN, LOGC, "the open-file limit (%llu) is below max_connections + 256 (%d)",
             (unsigned long long)rl.rlim_cur, want);
}

int rtr_gate_listen(rtr_server *s, const struct sockaddr_in *sa, char *err, size_t errlen) {
  rtr_gate *g = calloc(1, sizeof *g);
  if (!g) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  g->s = s;
  g->lfd = g->wake[0] = g->wake[1] = g->spare_fd = -1;
  pthread_mutex_init(&g->mu, NULL);
  s->gate = g;
  const cfg_router *rc = s->rc;
  g->max_total = rc->max_connections;
  g->max_client = rc->max_connections_per_client;
  g->head_us = (int64_t)rc->header_timeout_s * 1000000;
  g->idle_us = (int64_t)rc->conn_timeout_s * 1000000;
  g->body_us = (int64_t)rc->body_timeout_s * 1000000;
  char msg[200];
  snprintf(msg, sizeof msg, "the server has too many open connections (%d); retry later", g->max_total);
  g->busy_total_len = canned(g->busy_total, sizeof g->busy_total, 503, "server_error", "too_many_connections", msg);
  snprintf(msg, sizeof msg, "too many open connections from your address (at most %d); close some and retry",
           g->max_client);
  g->busy_client_len = canned(g->busy_client, sizeof g->busy_client, 503, "server_error", "too_many_connections", msg);
  snprintf(msg, sizeof msg,
           "the request body did not arrive in time: router.body_timeout_s is %d s, plus 1 s per %d bytes received",
           rc->body_timeout_s, GATE_BODY_MIN_RATE);
  g->late_body_len = canned(g->late_body, sizeof g->late_body, 408, "invalid_request_error", "request_timeout", msg);
  raise_nofile(g->max_total + 256);
  g->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (g->lfd < 0 || setsockopt(g->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      bind(g->lfd, (const struct sockaddr *)sa, sizeof *sa) < 0 || listen(g->lfd, 1024) < 0 ||
      pipe2(g->wake, O_CLOEXEC) < 0) {
    char a[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa->sin_addr, a, sizeof a);
    utl_seterr(err, errlen, "cannot listen on %s:%d: %s", a, ntohs(sa->sin_port), strerror(errno));
    return -1;
  }
  g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return 0;
}

int rtr_gate_port(rtr_server *s) {
  struct sockaddr_in a;
  socklen_t l = sizeof a;
  if (!s->gate || getsockname(s->gate->lfd, (struct sockaddr *)&a, &l) < 0) return -1;
  return ntohs(a.sin_port);
}

int rtr_gate_start(rtr_server *s, char *err, size_t errlen) {
  rtr_gate *g = s->gate;
  if (pthread_create(&g->thread, NULL, gate_main, g) != 0) {
    utl_seterr(err, errlen, "cannot start the accept thread");
    return -1;
  }
  g->has_thread = 1;
  return 0;
}

void rtr_gate_stop(rtr_server *s) { // stops accepting; MHD still owns its connections
  rtr_gate *g = s->gate;
  if (!g || !g->has_thread) return;
  g->stop = 1;
  if (write(g->wake[1], "x", 1) < 0) {}
  pthread_join(g->thread, NULL);
  g->has_thread = 0;
}

void rtr_gate_free(rtr_server *s) { // after MHD_stop_daemon (every connection closed)
  rtr_gate *g = s->gate;
  if (!g) return;
  rtr_gate_stop(s);
  for (int i = 0; i < g->n_linger; i++) close(g->linger[i].fd);
  for (int b = 0; b < GATE_BUCKETS; b++)
    for (gate_client *c = g->clients[b], *n; c; c = n) {
      n = c->next;
      free(c);
    }
  for (int l = 0; l < 2; l++) // none, unless MHD never started one it took
    for (gate_conn *c = l ? g->conns : g->pending, *n; c; c = n) {
      n = c->next;
      free(c);
    }
  int fds[] = {g->lfd, g->wake[0], g->wake[1], g->spare_fd};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
    if (fds[i] >= 0) close(fds[i]);
  pthread_mutex_destroy(&g->mu);
  free(g);
  s->gate = NULL;
}
