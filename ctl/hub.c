// ctl/hub.c: accepts and opens control connections, checks the shared secret, queues messages for one loop.
#include "ctl/hub.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ctl/frame.h"
#include "proto/hello.h"
#include "proto/request.h"
#include "util/clock.h"
#include "util/crypto.h"
#include "util/log.h"
#include "util/repeat.h"

#define HELLO_TIMEOUT_MS 5000

struct ctl_peer {
  ctl_hub *hub;       // (borrowed)
  ctl_frame *ctl;       // (owned)
  cJSON *hello;       // (owned) the other side's hello / hello_ok
  char name[64], role[16];
  char addr[64];      // "ip:port" of the other end (for refusal logs)
  int refs;           // guarded by hub->mu; the connection's thread holds one while it runs
  int alive;          // guarded by hub->mu
  ctl_peer *next_all; // hub->peers list
};

typedef struct qitem {
  ctl_event ev;
  struct qitem *next;
} qitem;

struct ctl_hub {
  char name[64], role[16], secret[128];
  void (*hello_extra)(void *, cJSON *);
  void *hello_arg;
  int lfd, port;
  pthread_t acceptor;
  int has_acceptor;
  int wake_pipe[2];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  qitem *head, *tail; // event queue
  int wakeups;
  ctl_peer *peers;    // every live peer (freed when its last reference goes)
  int n_threads;      // connection threads still running (detached); ctl_hub_free waits for 0
  pthread_cond_t threads_cv;
  int stopping;
  atomic_long auth_failures; // control peers refused (bad or missing proof, no hello), and hellos refused to us
  utl_repeat refusals;       // guarded by mu: refusal lines, once a minute per member (refusal_log)
};

void ctl_auth_proof(const char *secret, const char *nonce_l, const char *nonce_c, const char *name, const char *member,
                    const char *addr, char out[65]) {
  // NUL-separated: no field can end early and begin the next (names and nonces hold no NUL).
  static const char label[] = "dserve ctl hello v2";
  const void *parts[] = {label, nonce_l, "", nonce_c, "", name, "", member, "", addr};
  size_t lens[] = {sizeof label, strlen(nonce_l), 1, strlen(nonce_c), 1, strlen(name), 1, strlen(member), 1,
                   strlen(addr)};
  uint8_t mac[32];
  utl_hmac_sha256(secret, strlen(secret), parts, lens, 10, mac);
  utl_hex(mac, 32, out);
}

int ctl_session_keys(const char *secret, const char *nonce_l, const char *nonce_c, const char *proof, uint8_t c2l[32],
                     uint8_t l2c[32]) {
  static const char label[] = "dserve ctl keys v2";
  char salt[160], info[sizeof label + 65];
  int sn = snprintf(salt, sizeof salt, "%s%c%s", nonce_l, 0, nonce_c);
  memcpy(info, label, sizeof label);
  size_t pn = strnlen(proof, 64);
  memcpy(info + sizeof label, proof, pn);
  uint8_t k[64];
  if (sn < 0 || (size_t)sn >= sizeof salt ||
      utl_hkdf_sha256(secret, strlen(secret), salt, (size_t)sn, info, sizeof label + pn, k, sizeof k))
    return -1;
  memcpy(c2l, k, 32);
  memcpy(l2c, k + 32, 32);
  utl_wipe(k, sizeof k);
  return 0;
}

void ctl_auth_proof_back(const char *secret, const char *nonce, char out[65]) {
  uint8_t mac[32];
  const void *parts[] = {"listener:", nonce};
  size_t lens[] = {9, strlen(nonce)};
  utl_hmac_sha256(secret, strlen(secret), parts, lens, 2, mac);
  utl_hex(mac, 32, out);
}

int ctl_consttime_eq(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  return na == nb && utl_ct_equal(a, b, na);
}

long ctl_hub_auth_failures(ctl_hub *h) { return h ? atomic_load(&h->auth_failures) : 0; }

// Logs a refusal at most once a minute per key (the member dialled, or the peer's claimed name and host): a peer with
// another secret is dialled again every few seconds for as long as both run. The line logged after a quiet spell
// says how many it held back; the refusals are all counted (auth_failures) either way.
static void refusal_log(ctl_hub *h, utl_log_level lvl, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refusal_log(ctl_hub *h, utl_log_level lvl, const char *key, const char *fmt, ...) {
  long held = 0;
  pthread_mutex_lock(&h->mu);
  int pass = utl_repeat_pass(&h->refusals, key, utl_now_ms(), &held);
  pthread_mutex_unlock(&h->mu);
  if (!pass) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (held)
    utl_logl(lvl, h->name, "%s [%ld more like it since the last such line, not logged: once a minute per peer]", line,
             held);
  else
    utl_logl(lvl, h->name, "%s", line);
}


// A peer-supplied name, safe to print: [A-Za-z0-9._-], else "?".
static const char *printable_name(const cJSON *v) {
  if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) > 63) return "?";
  for (const char *p = v->valuestring; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
          *p == '_' || *p == '-'))
      return "?";
  return v->valuestring;
}

static void sock_addr(int fd, int peer, char *out, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  snprintf(out, cap, "?");
  if ((peer ? getpeername(fd, (struct sockaddr *)&ss, &sl) : getsockname(fd, (struct sockaddr *)&ss, &sl))) return;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    port = ntohs(a->sin6_port);
  }
  snprintf(out, cap, "%s:%d", ip, port);
}

static void push(ctl_hub *h, ctl_peer *p, cJSON *msg) {
  qitem *q = calloc(1, sizeof *q);
  if (!q) {
    cJSON_Delete(msg);
    return;
  }
  q->ev.peer = p;
  q->ev.msg = msg;
  pthread_mutex_lock(&h->mu);
  p->refs++;
  if (h->tail) h->tail->next = q;
  else h->head = q;
  h->tail = q;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

// Unlinks and frees p; the caller holds hub->mu and p->refs is 0.
static void peer_destroy_locked(ctl_peer *p) {
  ctl_hub *h = p->hub;
  for (ctl_peer **pp = &h->peers; *pp; pp = &(*pp)->next_all)
    if (*pp == p) {
      *pp = p->next_all;
      break;
    }
  ctl_frame_free(p->ctl);
  cJSON_Delete(p->hello);
  free(p);
}

static void peer_release_locked(ctl_peer *p) {
  if (--p->refs == 0) peer_destroy_locked(p);
}

// The end of a connection thread: drop its reference, then let ctl_hub_free know it is gone.
static void thread_done(ctl_peer *p) {
  ctl_hub *h = p->hub;
  utl_crypto_thread_done(); // libcrypto's state of this detached thread goes before ctl_hub_free stops waiting for it
  pthread_mutex_lock(&h->mu);
  peer_release_locked(p);
  h->n_threads--;
  pthread_cond_broadcast(&h->threads_cv);
  pthread_mutex_unlock(&h->mu);
}

static int start_thread(ctl_hub *h, void *(*fn)(void *), ctl_peer *p) {
  pthread_t t;
  pthread_mutex_lock(&h->mu);
  h->n_threads++;
  pthread_mutex_unlock(&h->mu);
  if (pthread_create(&t, NULL, fn, p) == 0) {
    pthread_detach(t);
    return 0;
  }
  pthread_mutex_lock(&h->mu);
  h->n_threads--;
  pthread_mutex_unlock(&h->mu);
  return -1;
}

static void read_until_closed(ctl_peer *p) {
  char err[256];
  for (;;) {
    cJSON *m = NULL;
    int rc = ctl_frame_recv(p->ctl, &m, -1, err, sizeof err);
    if (rc < 0 && strstr(err, CTL_FRAME_UNSEALED)) { // someone on the path changed, replayed or dropped a frame
      long n = atomic_fetch_add(&p->hub->auth_failures, 1) + 1;
      utl_warn(p->hub->name, "control link to '%s' (%s) closed: %s (%ld refused so far)", p->name, p->addr, err, n);
    }
    if (rc <= 0) break;
    if (prt_is(m, PRT_OP_PING)) {
      // Answered here, not by the owner's event loop: proves the process is alive and reachable even while a long
      // compute step keeps its loop busy (the router's link_dead_ms check).
      cJSON *pong = prt_bare_encode(PRT_OP_PONG);
      int gone = pong && ctl_frame_send(p->ctl, pong) != 0; // the peer went away: its closed event now
      cJSON_Delete(pong);
      cJSON_Delete(m);
      if (gone) break;
      continue;
    }
    push(p->hub, p, m);
  }
  pthread_mutex_lock(&p->hub->mu);
  p->alive = 0;
  pthread_mutex_unlock(&p->hub->mu);
  push(p->hub, p, NULL); // the closed event
}

static void *reader_main(void *arg) {
  read_until_closed(arg);
  thread_done(arg);
  return NULL;
}

static ctl_peer *peer_new(ctl_hub *h, int fd) {
  ctl_peer *p = calloc(1, sizeof *p);
  if (!p) {
    close(fd);
    return NULL;
  }
  p->ctl = ctl_frame_new(fd);
  if (!p->ctl) {
    free(p);
    return NULL;
  }
  p->hub = h;
  sock_addr(fd, 1, p->addr, sizeof p->addr);
  p->refs = 1; // the connection thread's (or, until it starts, the creator's) reference
  pthread_mutex_lock(&h->mu);
  p->next_all = h->peers;
  h->peers = p;
  pthread_mutex_unlock(&h->mu);
  return p;
}

static void take_names(ctl_peer *p, cJSON *hello) {
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(hello, "name");
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(hello, "role");
  snprintf(p->name, sizeof p->name, "%s", cJSON_IsString(n) ? n->valuestring : "?");
  snprintf(p->role, sizeof p->role, "%s", cJSON_IsString(r) ? r->valuestring : "?");
  p->hello = hello;
}

static void start_reader(ctl_peer *p) {
  pthread_mutex_lock(&p->hub->mu);
  p->alive = 1;
  pthread_mutex_unlock(&p->hub->mu);
  if (start_thread(p->hub, reader_main, p)) { // no thread: the connection is dead on arrival
    pthread_mutex_lock(&p->hub->mu);
    p->alive = 0;
    peer_release_locked(p);
    pthread_mutex_unlock(&p->hub->mu);
  }
}

static void make_nonce(char out[33]) {
  uint8_t r[16];
  if (utl_random(r, sizeof r)) { // no entropy source: still unique per connection (the secret keeps it unforgeable)
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, pid = (uint64_t)getpid();
    memcpy(r, &v, 8);
    memcpy(r + 8, &pid, 8);
  }
  utl_hex(r, sizeof r, out);
}

// Seals p's connection with the session keys of this handshake; listener: 1 on the accepting side. 0, or -1.
static int seal_link(ctl_peer *p, const char *secret, const char *nonce_l, const char *nonce_c, const char *proof,
                     int listener) {
  uint8_t c2l[32], l2c[32];
  int rc = ctl_session_keys(secret, nonce_l, nonce_c, proof, c2l, l2c);
  if (!rc)
    rc = listener ? ctl_frame_seal(p->ctl, l2c, CTL_LABEL_L2C, c2l, CTL_LABEL_C2L)
                  : ctl_frame_seal(p->ctl, c2l, CTL_LABEL_C2L, l2c, CTL_LABEL_L2C);
  utl_wipe(c2l, sizeof c2l);
  utl_wipe(l2c, sizeof l2c);
  return rc;
}

// Sends a refusal the connector hears (sealed when the link is), logged by the caller.
static void send_refusal(ctl_peer *p, const char *why, const char *code) {
  cJSON *e = prt_error_encode(&(prt_error){.message = why, .code = code}, NULL, 0);
  // Best effort: the connection is closed right after either way, and the caller has logged the refusal.
  if (e) utl_ignore_status(ctl_frame_send(p->ctl, e));
  cJSON_Delete(e);
}

// The accepted hello m checked: the protocol version, the proof of the secret, then (the link sealed) that the
// connector dialled this member at this address. 0 with the link sealed, or -1 (logged, counted where it is an
// authentication failure; the connector heard why where it may).
static int check_hello(ctl_peer *p, const char *nonce, cJSON *m) {
  ctl_hub *h = p->hub;
  prt_hello hm;
  char derr[256], why[512];
  const char *who = printable_name(cJSON_GetObjectItemCaseSensitive(m, "name"));
  if (prt_hello_decode(m, &hm, derr, sizeof derr)) {
    long n = atomic_fetch_add(&h->auth_failures, 1) + 1;
    utl_warn(h->name, "refused a control peer from %s (hello as '%s'): malformed hello: %s (%ld refused so far)",
             p->addr, who, derr, n);
    return -1;
  }
  if (hm.proto != PRT_VERSION) {
    // Before the proof: a peer of another version proves the secret another way. The answer holds only versions.
    if (hm.proto < 0)
      snprintf(why, sizeof why, "hello without a protocol version (proto); %s speaks control protocol version %d",
               h->name, PRT_VERSION);
    else
      snprintf(why, sizeof why, "control protocol version %d refused: %s speaks version %d", hm.proto, h->name,
               PRT_VERSION);
    utl_warn(h->name, "refused a control peer from %s (hello as '%s'): %s", p->addr, who, why);
    send_refusal(p, why, "protocol_version");
    return -1;
  }
  char want[65] = "";
  if (hm.auth && hm.nonce && hm.name && hm.member && hm.addr)
    ctl_auth_proof(h->secret, nonce, hm.nonce, hm.name, hm.member, hm.addr, want);
  if (!want[0] || !ctl_consttime_eq(hm.auth, want)) {
    long n = atomic_fetch_add(&h->auth_failures, 1) + 1;
    char key[160], host[64];
    snprintf(host, sizeof host, "%s", p->addr);
    char *colon = strrchr(host, ':'); // its port is new on every dial: the peer is its name and host
    if (colon) *colon = 0;
    snprintf(key, sizeof key, "hello %s %s", who, host);
    if (hm.role && !strcmp(hm.role, "router") && strcmp(h->role, "router")) {
      // A router dialled this worker and cannot prove our secret: the two were given different secrets, and this
      // worker gets no work from it. An ERROR here, where the worker's operator looks (the router logs its side).
      refusal_log(h, UTL_LOG_ERROR, key, "REFUSED by a secret mismatch: router '%s' (from %s) dialled this worker "
                  "with a %s shared-secret proof: this worker and that router hold different secrets (config secret / "
                  "secret_file, DSERVE_SECRET_FILE), so it gets no work from that router (%ld refused so far)",
                  who, p->addr, hm.auth ? "wrong" : "missing", n);
    } else {
      refusal_log(h, UTL_LOG_WARN, key, "refused a control peer from %s (hello as '%s'): %s shared-secret proof "
                  "(%ld refused so far)", p->addr, who, hm.auth ? "wrong" : "missing", n);
    }
    return -1;
  }
  if (seal_link(p, h->secret, nonce, hm.nonce, hm.auth, 1)) {
    utl_warn(h->name, "refused a control peer from %s (hello as '%s'): cannot derive the session keys", p->addr, who);
    return -1;
  }
  // It knows the secret; is this the member it meant? A relay that took another member's address or name, or a
  // record that points at the wrong process, shows here: the connector dialled something that is not us.
  char here[64];
  sock_addr(ctl_frame_fd(p->ctl), 0, here, sizeof here);
  if (strcmp(hm.member, h->name) || strcmp(hm.addr, here)) {
    long n = atomic_fetch_add(&h->auth_failures, 1) + 1;
    snprintf(why, sizeof why, "it dialled member '%.64s' at %.64s, but this is '%s' at %s: a relay, or a membership "
             "record that points at another process", hm.member, hm.addr, h->name, here);
    utl_warn(h->name, "refused a control peer from %s (hello as '%s'): %s (%ld refused so far)", p->addr, who, why, n);
    send_refusal(p, why, "wrong_member");
    return -1;
  }
  return 0;
}

// Accepted connection: challenge, then a hello with the right proof for this member, else close with a logged
// reason. Every frame after the hello is sealed.
static void *handshake_main(void *arg) {
  ctl_peer *p = arg;
  ctl_hub *h = p->hub;
  char err[256] = "timed out", nonce[33];
  make_nonce(nonce);
  cJSON *ch = prt_challenge_encode(&(prt_challenge){.nonce = nonce, .name = h->name}, err, sizeof err);
  int ok = ch && ctl_frame_send(p->ctl, ch) == 0;
  cJSON_Delete(ch);
  cJSON *m = NULL;
  if (ok && ctl_frame_recv(p->ctl, &m, HELLO_TIMEOUT_MS, err, sizeof err) == 1 && prt_is(m, PRT_OP_HELLO)) {
    // Always checked: a hub has a secret (ctl_hub_new refuses to start without one), and nothing of this process
    // (hello_ok's KV layout, kvxfer metadata, the ops) reaches a peer before it proved it.
    ok = !check_hello(p, nonce, m);
  } else {
    // A health probe connects and closes without a word: neither logged nor counted.
    if (ok && (m || !(strstr(err, "closed") || strstr(err, "reset")))) {
      long n = atomic_fetch_add(&h->auth_failures, 1) + 1;
      utl_warn(h->name, "refused a control peer from %s: no hello (%s) (%ld refused so far)", p->addr,
               m ? "another op first" : err, n);
    }
    ok = 0;
  }
  if (ok) {
    char back[65] = ""; // the proof the connector asked for (its hello's nonce), before m goes to the peer
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(m, "nonce");
    if (cJSON_IsString(cn)) ctl_auth_proof_back(h->secret, cn->valuestring, back);
    take_names(p, m);
    cJSON *reply = prt_hello_ok_encode(&(prt_hello_ok){.name = h->name, .role = h->role, .auth = back[0] ? back : NULL},
                                       NULL, 0);
    if (reply && h->hello_extra) h->hello_extra(h->hello_arg, reply);
    ok = reply && ctl_frame_send(p->ctl, reply) == 0;
    cJSON_Delete(reply);
  } else {
    cJSON_Delete(m);
  }
  if (!ok) {
    pthread_mutex_lock(&h->mu);
    p->alive = 0;
    pthread_mutex_unlock(&h->mu);
    shutdown(ctl_frame_fd(p->ctl), SHUT_RDWR);
    thread_done(p);
    return NULL;
  }
  push(h, p, cJSON_Duplicate(p->hello, 1)); // the loop learns of the peer through its hello
  pthread_mutex_lock(&h->mu);
  p->alive = 1;
  pthread_mutex_unlock(&h->mu);
  read_until_closed(p);
  thread_done(p);
  return NULL;
}

static void *acceptor_main(void *arg) {
  ctl_hub *h = arg;
  for (;;) {
    struct pollfd pf[2] = {{.fd = h->lfd, .events = POLLIN}, {.fd = h->wake_pipe[0], .events = POLLIN}};
    if (poll(pf, 2, -1) < 0 && errno != EINTR) break;
    if (pf[1].revents) break; // stopping
    if (!(pf[0].revents & POLLIN)) continue;
    int fd = accept4(h->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ctl_peer *p = peer_new(h, fd);
    if (!p) continue;
    if (start_thread(h, handshake_main, p)) {
      pthread_mutex_lock(&h->mu);
      peer_release_locked(p);
      pthread_mutex_unlock(&h->mu);
    }
  }
  return NULL;
}

int ctl_hub_new(const ctl_hub_opts *o, ctl_hub **out, char *err, size_t errlen) {
  *out = NULL;
  if (!o->secret || !o->secret[0]) {
    snprintf(err, errlen, "%s: refusing to open a control hub without a shared secret (nothing listens or connects "
             "unauthenticated)", o->name ? o->name : "hub");
    return -1;
  }
  if (strlen(o->secret) >= sizeof ((ctl_hub *)0)->secret) {
    snprintf(err, errlen, "%s: shared secret too long", o->name ? o->name : "hub");
    return -1;
  }
  ctl_hub *h = calloc(1, sizeof *h);
  if (!h) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  snprintf(h->name, sizeof h->name, "%s", o->name ? o->name : "?");
  snprintf(h->role, sizeof h->role, "%s", o->role ? o->role : "?");
  snprintf(h->secret, sizeof h->secret, "%s", o->secret ? o->secret : "");
  h->hello_extra = o->hello_extra;
  h->hello_arg = o->hello_arg;
  h->lfd = -1;
  pthread_mutex_init(&h->mu, NULL);
  h->refusals.period_ms = 60000;
  utl_cond_init_monotonic(&h->cv); // ctl_hub_next waits on it with a deadline
  pthread_cond_init(&h->threads_cv, NULL);
  if (pipe2(h->wake_pipe, O_CLOEXEC)) {
    snprintf(err, errlen, "pipe: %s", strerror(errno));
    free(h);
    return -1;
  }
  if (o->host) {
    h->lfd = ctl_frame_listen(o->host, o->port, &h->port, err, errlen);
    if (h->lfd < 0 || pthread_create(&h->acceptor, NULL, acceptor_main, h)) {
      if (h->lfd >= 0) snprintf(err, errlen, "cannot start the accept thread");
      ctl_hub_free(h);
      return -1;
    }
    h->has_acceptor = 1;
  }
  *out = h;
  return 0;
}

int ctl_hub_port(const ctl_hub *h) { return h->port; }

ctl_peer *ctl_hub_connect(ctl_hub *h, const char *member, const char *host, int port, int timeout_ms, char *err,
                          size_t errlen) {
  if (!member || !member[0]) {
    snprintf(err, errlen, "no member name to dial at %s:%d: the proof names the member it is for", host, port);
    return NULL;
  }
  int fd = ctl_frame_connect(host, port, timeout_ms, err, errlen);
  if (fd < 0) return NULL;
  ctl_peer *p = peer_new(h, fd);
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  cJSON *ch = NULL, *ok = NULL;
  int good = 0;
  prt_challenge cm;
  if (ctl_frame_recv(p->ctl, &ch, timeout_ms, err, errlen) == 1 && prt_is(ch, PRT_OP_CHALLENGE) &&
      !prt_challenge_decode(ch, &cm, NULL, 0)) {
    char proof[65], mine[33], want[65], there[64];
    make_nonce(mine);
    sock_addr(fd, 1, there, sizeof there); // where our socket went: what the listener must find it is
    ctl_auth_proof(h->secret, cm.nonce, mine, h->name, member, there, proof);
    ctl_auth_proof_back(h->secret, mine, want);
    cJSON *hello = prt_hello_encode(&(prt_hello){.name = h->name, .role = h->role, .auth = proof, .proto = PRT_VERSION,
                                                 .nonce = mine, .member = member, .addr = there},
                                    err, errlen);
    prt_error refusal;
    const cJSON *back = NULL;
    err[0] = 0;
    int sent = hello && ctl_frame_send(p->ctl, hello) == 0;
    if (sent && seal_link(p, h->secret, cm.nonce, mine, proof, 0)) {
      snprintf(err, errlen, "cannot derive the session keys");
      sent = 0;
    }
    if (sent && ctl_frame_recv(p->ctl, &ok, timeout_ms, err, errlen) == 1 && prt_is(ok, PRT_OP_HELLO_OK)) {
      back = cJSON_GetObjectItemCaseSensitive(ok, "auth");
      good = cJSON_IsString(back) && ctl_consttime_eq(back->valuestring, want);
      if (!good) {
        long n = atomic_fetch_add(&h->auth_failures, 1) + 1;
        snprintf(err, errlen, "%s:%d (member %s) answered without %s proof of the shared secret: not a peer of this "
                 "cluster", host, port, member, back ? "the right" : "a");
        refusal_log(h, UTL_LOG_WARN, member, "%s (%ld refused so far)", err, n);
      }
    } else if (ok && prt_is(ok, PRT_OP_ERROR) && !prt_error_decode(ok, &refusal, NULL, 0)) {
      snprintf(err, errlen, "%s:%d (member %s) refused the hello: %s", host, port, member, refusal.message);
      refusal_log(h, UTL_LOG_WARN, member, "%s", err);
    } else if (sent && strstr(err, CTL_FRAME_UNSEALED)) {
      // What came back was not sealed with this link's keys: not the listener the proof was for, or another
      // version's plain refusal.
      long n = atomic_fetch_add(&h->auth_failures, 1) + 1;
      snprintf(err, errlen, "%s:%d (member %s) answered the hello with a frame that failed to open: not a peer of "
               "this cluster, or another protocol version", host, port, member);
      refusal_log(h, UTL_LOG_WARN, member, "%s (%ld refused so far)", err, n);
    } else if (sent && !ok) {
      long n = atomic_fetch_add(&h->auth_failures, 1) + 1;
      snprintf(err, errlen, "%s:%d (member %s) refused the hello (wrong shared secret, or another protocol version?)",
               host, port, member);
      refusal_log(h, UTL_LOG_WARN, member, "member %s (%s:%d) closed the control connection after our hello: it holds "
                  "another shared secret, or speaks another protocol version (%ld refused so far)", member, host, port,
                  n);
    }
    cJSON_Delete(hello);
  } else if (ch) {
    snprintf(err, errlen, "%s:%d did not send a challenge", host, port);
  }
  cJSON_Delete(ch);
  if (!good) {
    cJSON_Delete(ok);
    pthread_mutex_lock(&h->mu);
    peer_release_locked(p);
    pthread_mutex_unlock(&h->mu);
    return NULL;
  }
  take_names(p, ok);
  pthread_mutex_lock(&h->mu);
  p->refs++; // the caller's reference
  pthread_mutex_unlock(&h->mu);
  start_reader(p);
  return p;
}

int ctl_hub_next(ctl_hub *h, ctl_event *ev, int timeout_ms) {
  struct timespec dl = utl_deadline_ms(timeout_ms);
  pthread_mutex_lock(&h->mu);
  while (!h->head && !h->wakeups && timeout_ms != 0) {
    if (timeout_ms < 0) pthread_cond_wait(&h->cv, &h->mu);
    else if (pthread_cond_timedwait(&h->cv, &h->mu, &dl) == ETIMEDOUT) break;
  }
  qitem *q = h->head;
  if (q) {
    h->head = q->next;
    if (!h->head) h->tail = NULL;
  } else if (h->wakeups) {
    h->wakeups = 0;
  }
  pthread_mutex_unlock(&h->mu);
  if (!q) return 0;
  *ev = q->ev;
  free(q);
  return 1;
}

void ctl_hub_wake(ctl_hub *h) {
  pthread_mutex_lock(&h->mu);
  h->wakeups = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

void ctl_event_done(ctl_event *ev) {
  cJSON_Delete(ev->msg);
  ev->msg = NULL;
  if (ev->peer) ctl_peer_unref(ev->peer);
  ev->peer = NULL;
}

int ctl_peer_send(ctl_peer *p, const cJSON *msg) { return p ? ctl_frame_send(p->ctl, msg) : -1; }
const char *ctl_peer_name(const ctl_peer *p) { return p->name; }
const char *ctl_peer_role(const ctl_peer *p) { return p->role; }
const cJSON *ctl_peer_hello(const ctl_peer *p) { return p->hello; }

int ctl_peer_alive(const ctl_peer *p) {
  if (!p) return 0; // a link whose reconnect failed holds none
  pthread_mutex_lock(&p->hub->mu);
  int a = p->alive;
  pthread_mutex_unlock(&p->hub->mu);
  return a;
}

void ctl_peer_ref(ctl_peer *p) {
  pthread_mutex_lock(&p->hub->mu);
  p->refs++;
  pthread_mutex_unlock(&p->hub->mu);
}

void ctl_peer_unref(ctl_peer *p) {
  if (!p) return;
  ctl_hub *h = p->hub;
  pthread_mutex_lock(&h->mu);
  peer_release_locked(p);
  pthread_mutex_unlock(&h->mu);
}

void ctl_peer_close(ctl_peer *p) {
  if (p) shutdown(ctl_frame_fd(p->ctl), SHUT_RDWR);
}

void ctl_hub_free(ctl_hub *h) {
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  h->stopping = 1;
  pthread_mutex_unlock(&h->mu);
  if (h->has_acceptor) {
    ssize_t w = write(h->wake_pipe[1], "x", 1);
    (void)w;
    pthread_join(h->acceptor, NULL);
  }
  if (h->lfd >= 0) close(h->lfd);
  pthread_mutex_lock(&h->mu);
  for (ctl_peer *p = h->peers; p; p = p->next_all) ctl_peer_close(p);
  while (h->n_threads > 0) pthread_cond_wait(&h->threads_cv, &h->mu);
  for (qitem *q = h->head, *n; q; q = n) { // queued events hold references
    n = q->next;
    cJSON_Delete(q->ev.msg);
    peer_release_locked(q->ev.peer);
    free(q);
  }
  h->head = h->tail = NULL;
  while (h->peers) peer_destroy_locked(h->peers); // references the caller still holds die with the hub
  pthread_mutex_unlock(&h->mu);
  close(h->wake_pipe[0]);
  close(h->wake_pipe[1]);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  pthread_cond_destroy(&h->threads_cv);
  free(h);
}
