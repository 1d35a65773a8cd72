// kvxfer/kvx_int.h: kvxfer internals shared by the core, the connection core and the backends (not for users of the library).
//
// Layers, top to bottom; a file calls only files below it. Where a lower one must reach a higher one it calls a hook
// the higher one registered: the backend table (kvx_backends[] of kvx.c, given to each agent as a->table), whose
// verbs the connection core runs and whose frames the listeners serve; the core never names a backend, and no
// backend calls another. tests/kvxfer/check_layers.py holds these levels (ctest KvxLayers.CallsPointDown).
//   kvx_md.c      metadata blobs: ours out, a peer's in (its backend chosen by kvx.c)
//   kvx.c         the agent: backends up and down (by their tables' rank, caps, auto_up), registration, peers, and
//                 each peer's backend (kvx_auto_pick walks the table)
//   kvx_xfer.c    requests (new, post, poll) handed to the connection core; notify; kvx_progress
//   backends/     kvx_tcp.c kvx_shm.c kvx_rdma.c kvx_nccl.c kvx_nixl.c: their verbs, frames and metadata sections,
//                 behind kvx_backend (reached only through the table)
//   kvx_listen.c  the listeners: accept, authenticate, hand each frame to the backend that registered its op
//   kvx_conn.c    the connection core: one connection per peer and backend, its queue, worker and reader threads
//   kvx_base.c    services: log, threads, wake-ups, region and peer look-up, request completion, notification queue
//   kvx_host.c    shareable host memory (kvx_host_alloc; the memfd behind it for shm)
//   kvx_wire.c    socket I/O, the record layer of sealed channels, frames, the authenticated handshake that
//                 negotiates sealing and derives its keys (crypto: util/crypto.h, libcrypto)
#ifndef DSERVE_KVX_INT_H
#define DSERVE_KVX_INT_H

#include <pthread.h>
#ifdef __cplusplus
#include <atomic>
#define KVX_ATOMIC(t) std::atomic<t>  // same layout as C11 _Atomic with gcc/clang (tests read these structs)
#else
#include <stdatomic.h>
#define KVX_ATOMIC(t) _Atomic t
#endif
#include <stdint.h>
#include <sys/uio.h>

#include "kvxfer/kvx.h"
#include "util/crypto.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { KVX_BE_TCP = 0, KVX_BE_SHM = 1, KVX_BE_RDMA = 2, KVX_BE_NCCL = 3, KVX_BE_NIXL = 4, KVX_NBE = 5 };
// The listeners the core runs; a backend names the one its peers connect to.
enum { KVX_LS_TCP = 0, KVX_LS_UNIX = 1, KVX_NLS = 2 };
#define KVX_OP_NOTIFY 3  // internal xfer op: a standalone notification

// ---- wire: frames on tcp / unix sockets (little-endian hosts only) ----
#define KVX_FRAME_MAGIC 0x4658564bu  // "KVXF"
enum {
  KVX_F_WRITE = 1,       // addr,len,key: len payload bytes follow, land at addr
  KVX_F_WRITE_END = 2,   // req: end of a WRITE; len = notif bytes that follow; reply ACK (unless KVX_FL_NOACK)
  KVX_F_READ = 3,        // req,addr,len,key: send those bytes back as READ_DATA
  KVX_F_READ_END = 4,    // req: end of a READ; len = notif bytes; reply ACK (unless KVX_FL_NOACK)
  KVX_F_NOTIF = 5,       // len bytes of a standalone notification
  KVX_F_ACK = 6,         // req done, and every answered request sent before it on the connection (one ACK may
                         // answer a run of pipelined requests: kvx_srv_ack)
  KVX_F_READ_DATA = 7,   // req, addr = descriptor count, len: payload for that many descriptors follows
  KVX_F_ERR = 8,         // len bytes of reason; the connection closes after it
  KVX_F_FDS_REQ = 9,     // shm: send me your exportable regions' fds
  KVX_F_FD = 10,         // shm: key,addr,len, req = file offset; one fd via SCM_RIGHTS
  KVX_F_FDS_END = 11,
  KVX_F_RDMA_QP = 12,    // rdma: len bytes of kvx_rdma_qpinfo follow; reply the same op
  KVX_F_NCCL_INIT = 13,  // nccl: len bytes (ncclUniqueId) follow; reply ACK after comm init
  KVX_F_NCCL_XFER = 14,  // nccl: req, flags = op, key = n, len bytes = n kvx_vdesc then notif; reply ACK (ready), ACK (done)
  KVX_F_WRITEV = 15,     // req, addr = n descriptors, len = payload bytes, key = notif bytes: n kvx_vdesc, the
                         // payloads in order, then (with KVX_FL_END) the notification; KVX_FL_END: reply ACK
  KVX_F_READV = 16,      // req, addr = n, len = bytes, key = notif bytes: n kvx_vdesc then (KVX_FL_END) the
                         // notification; reply one READ_DATA with the n payloads, then (KVX_FL_END) ACK
};
#define KVX_FL_NOTIF 1u  // a notification travels with this frame
#define KVX_FL_NOACK 2u  // *_END: the sender does not read answers (shm); no ACK
#define KVX_FL_END 4u    // WRITEV/READV: the request's last frame
#define KVX_MAX_VEC 512  // descriptors in one WRITEV/READV frame

typedef struct kvx_hdr {
  uint32_t magic;
  uint16_t op;
  uint16_t flags;
  uint64_t req;
  uint64_t addr;
  uint64_t len;
  uint64_t key;
} kvx_hdr;  // 40 bytes

typedef struct kvx_vdesc {  // one descriptor of a WRITEV/READV frame
  uint64_t addr, len, key;
} kvx_vdesc;  // 24 bytes

// ---- channels: a connection's byte stream, plain or sealed (kvx_wire.c) ----
// Plain (tx == NULL): the I/O helpers below are the socket's own syscalls. Sealed (the handshake negotiated it:
// connections through the tcp listener whose agents both seal), every byte after the handshake travels in records
//   u32 length (1..KVX_REC_MAX) | ciphertext | 16-byte tag
// AES-256-GCM under the direction's key (HKDF of the secret and both nonces), the length as additional data, the
// nonce the direction's label and the record's sequence number (utl_seal). A record is received whole and opened
// before any of its plaintext is handed out; one that fails to open (altered, replayed, reordered, malformed) kills
// the channel: every later call fails with KVX_IO_SEAL. The directions are independent: one thread may send while
// another receives.
#define KVX_REC_MAX (64u << 10)
#define KVX_REC_OVER 20u           // length and tag around a record's ciphertext
#define KVX_REC_AHEAD (16u << 10)  // read-ahead past a short record (the small records behind it come in the same recv)
#define KVX_REC_BATCH 4            // records sealed for one send (a quarter of the sends: 1..16 MiB sealed ~+40%)
enum { KVX_IO_SEAL = -4, KVX_IO_CRYPTO = -5 };  // I/O rc beside -1 closed, -2 timed out, -3 error
typedef struct kvx_chan {
  int fd;
  utl_seal *tx, *rx;  // (owned) both NULL: plain
  KVX_ATOMIC(uint64_t) *fails;  // (borrowed, may be NULL) counted once when a record fails to open (auth failures)
  // Receiving: r[0, rl) arrived; r[rp, re) is the opened record's plaintext not yet taken; the next record starts at
  // rn (rn <= rl).
  uint8_t *r;  // (KVX_REC_MAX + KVX_REC_OVER + KVX_REC_AHEAD) (owned)
  size_t rp, re, rn, rl;
  int bad;  // a record failed to open
  // Sending: t[tp, tl) of the records being sent is still to go out; they hold the caller's next tplain bytes,
  // which count as sent once they are all out. A caller told of a short send calls again from the first byte not
  // counted.
  uint8_t *t;  // (KVX_REC_BATCH * (KVX_REC_MAX + KVX_REC_OVER)) (owned)
  size_t tp, tl, tplain;
} kvx_chan;

// ---- regions ----
typedef struct kvx_rregion {  // a region a peer exported to us
  uint64_t key, addr, len;
  uint32_t mem, pad;
  uint64_t word[KVX_NBE];  // each backend's key for it, from that backend's metadata section (rdma: rkey)
} kvx_rregion;

struct kvx_region {
  kvx_agent *agent;  // (borrowed)
  uint64_t key;      // random, names the region on the wire
  uint64_t addr, len;
  int mem;
  void *priv[KVX_NBE];     // each backend's registration (owned by it: made in reg, freed in dereg)
  uint64_t word[KVX_NBE];  // each backend's key for local segments in it (rdma: lkey)
  kvx_region *next;
};

// ---- requests ----
typedef struct kvx_seg {
  uint64_t laddr, raddr, len, rkey;  // rkey: the remote region's key
  uint64_t lword, rword;             // the peer's backend's words for the local and remote region (rdma: lkey, rkey)
  int lmem, rmem;
} kvx_seg;

struct kvx_xfer {
  kvx_agent *a;  // (borrowed)
  int op;        // KVX_WRITE | KVX_READ | KVX_OP_NOTIFY
  char peer[KVX_MAX_NAME];
  kvx_seg *segs;  // (n_segs) (owned)
  size_t n_segs;
  uint64_t total;
  uint8_t *notif;  // (notif_len) (owned) or NULL
  size_t notif_len;
  int has_notif;
  KVX_ATOMIC(int) state;  // KVX_DONE, KVX_PENDING, <0
  KVX_ATOMIC(int) refs;
  pthread_mutex_t mu;  // guards err
  char err[256];
  uint64_t id;  // per-post request id
  size_t cursor;  // a backend's progress through segs (tcp: READ_DATA segments received)
  uint64_t sent;  // a backend's progress through its frames (tcp: bytes of them sent), for a run that resumes a start
  kvx_xfer *qnext;  // connection queue link
};

// ---- peers ----
typedef struct kvx_peer {
  char name[KVX_MAX_NAME];
  char host_id[96];
  uint32_t backends;  // bit per KVX_BE_*
  char tcp_host[64];  // its tcp listener (tcp, rdma, nccl)
  int tcp_port;
  char unix_path[108];   // its unix listener (shm)
  kvx_rregion *regions;  // (n_regions) (owned)
  size_t n_regions;
  int be;  // chosen KVX_BE_*
  struct kvx_conn *conn[KVX_NBE];  // our connection to it per backend, or NULL (the core's: kvx_conn.c)
  struct kvx_peer *next;
} kvx_peer;

// ---- connections (kvx_conn.c) ----
// One connection to a peer for one backend. The core connects (tcp or unix, by the backend's listener), proves
// the shared secret, queues requests, runs them one by one on the connection's worker thread, reads answers on a
// reader thread (backends with .reader), and fails every pending request when the connection drops. The backend
// only adds its verbs: open (set-up frames), run (move one request's bytes), answer (frames for the reader).
typedef struct kvx_conn {
  kvx_agent *a;  // (borrowed)
  const struct kvx_backend *be;  // (borrowed)
  char peer[KVX_MAX_NAME];
  char host[64];  // where to connect: tcp host and port, or the unix path
  int port;
  char path[108];
  KVX_ATOMIC(int) refs;  // the peer, the worker thread, the reader thread
  pthread_mutex_t mu;    // guards the fields below
  pthread_cond_t cv;
  kvx_chan ch;  // the authenticated socket (ch.fd -1 until connected), sealed or plain; closed (and freed)
                       // with the last reference. The reader thread receives on it, the sender sends: one each way
  int dead;
  int ready;         // connected, authenticated and opened: a request may start on the posting thread
  int busy;          // a request is running (on the worker, or starting on the posting thread)
  int64_t last_act;  // ms: the last byte from the peer or the last request sent (the stall timeout)
  kvx_xfer *q, *q_tail;        // posted, not yet started (each holds the backend's reference)
  kvx_xfer *pend, *pend_tail;  // sent, waiting for the peer's answer (reader backends)
  kvx_xfer *resume;  // started on the posting thread, to be finished by the worker (pending too; holds a reference)
  void *priv;  // the backend's state for this connection (owned by it: made in open, freed in close)
} kvx_conn;

// Queues x on p's connection for backend p->be, connecting first if there is none (a->mu held; does not block).
// When the connection is idle and its backend can start x on the posting thread, x is not queued but claimed:
// *now is the connection (with a reference), and the caller, once it let go of a->mu, calls kvx_conn_start.
int kvx_conn_post(kvx_agent *a, kvx_peer *p, kvx_xfer *x, kvx_conn **now, char *err, size_t errlen);
// Starts the claimed x with the backend's start (no a->mu; does not block); the worker finishes what it left.
void kvx_conn_start(kvx_conn *now, kvx_xfer *x);
// Closes every connection to p (a->mu held): their pending requests fail with why.
void kvx_conn_drop(kvx_agent *a, kvx_peer *p, const char *why);
// Marks c dead and fails its queued and pending requests (any thread; once).
void kvx_conn_fail(kvx_conn *c, const char *why);
// The pending request with this id, with a reference the caller drops (kvx_xfer_unref), or NULL.
kvx_xfer *kvx_conn_pending(kvx_conn *c, uint64_t id);
// The frame that ends a request whose bytes have moved: *_END with its notification; ack = the peer answers ACK.
int kvx_conn_send_end(kvx_conn *c, const kvx_xfer *x, int ack);

// ---- listeners (kvx_listen.c) ----
// A served connection: accepted, authenticated (and for unix sockets, this user's), read by one thread that
// hands each frame to the backend that registered its op.
typedef struct kvx_srv {
  kvx_agent *a;  // (borrowed)
  kvx_chan ch;  // the socket; read only through kvx_srv_recv / kvx_srv_recvv (they keep the read-ahead)
  int ls;  // KVX_LS_*: the listener it came in through
  char peer[KVX_MAX_NAME];
  uint8_t *nbuf;         // (KVX_MAX_NOTIF) scratch for notifications (owned)
  uint8_t *rbuf;         // (KVX_SRV_RBUF) read-ahead (owned): rbuf[rpos, rlen) arrived, not yet taken
  size_t rpos, rlen;
  uint64_t ack;          // a deferred ACK: every request up to this one is done (0 = none)
  void *state[KVX_NBE];  // a backend's state for this connection (owned by it: freed in its serve_end)
} kvx_srv;

// Read-ahead of a served connection: a small frame (header, descriptors, payload, notification) comes in with one
// recv; larger reads go straight to their destination.
#define KVX_SRV_RBUF (16u << 10)
// A deferred ACK waits for at most this many payload bytes of the frames behind it (tens of us).
#define KVX_SRV_ACK_HOLD (256u << 10)
// Every read on a served connection (rc as kvx_recv_all's). A deferred ACK goes out before it would wait.
int kvx_srv_recv(kvx_srv *v, void *p, size_t n, int timeout_ms, int idle_ok);
int kvx_srv_recvv(kvx_srv *v, struct iovec *iov, int n, int timeout_ms, int idle_ok);  // advances iov
// Acknowledges request req: deferred while more frames are already there to read, so that one ACK answers a run of
// pipelined requests (an ACK means every request before it on the connection is done too); it goes out before the
// connection waits for bytes or receives a payload larger than KVX_SRV_ACK_HOLD.
void kvx_srv_ack(kvx_srv *v, uint64_t req);
int kvx_srv_flush(kvx_srv *v);  // the deferred ACK now; 0 or <0

enum { KVX_SRV_OK = 0, KVX_SRV_REFUSE = -1, KVX_SRV_LOST = -2 };
typedef struct kvx_frame {  // a frame op a backend serves
  uint16_t op;
  // KVX_SRV_OK: next frame; REFUSE: answer ERR with why, log, close; LOST: log why, close.
  int (*serve)(kvx_srv *s, const kvx_hdr *h, char *why, size_t cap);
} kvx_frame;

typedef struct kvx_listener kvx_listener;  // (kvx_listen.c)
int kvx_listen_start(kvx_agent *a, int ls, const char *who, char *err, size_t errlen);  // once per listener
void kvx_listen_stop(kvx_agent *a);  // closing: wake the accept and serve threads (shutdown); does not block
void kvx_listen_free(kvx_agent *a);  // after every thread has exited
const char *kvx_unix_path(kvx_agent *a);  // the unix listener's socket, "" when none

// ---- backends ----
// What a backend can do (kvx_backend.caps), as NIXL's supportsLocal/supportsRemote: the core and auto read these,
// never a backend's name.
#define KVX_CAP_LOCAL (1u << 0)    // moves bytes between two agents on one host
#define KVX_CAP_REMOTE (1u << 1)   // moves bytes between hosts (without it: one host only, as shm)
#define KVX_CAP_HOST (1u << 2)     // moves host memory
#define KVX_CAP_CUDA (1u << 3)     // moves CUDA device memory (its check refuses the kinds it cannot move)
#define KVX_CAP_AUTO_FAR (1u << 4)  // auto picks it only for a peer on another host (nixl: never UCX on one host)
#define KVX_CAP_FALLBACK (1u << 5)  // the fallback (tcp): auto needs it, a backend on its listener brings it along
#define KVX_CAP_SOME_REGIONS (1u << 6)  // auto: a region it fails to register is left to the others (logged)

// One table per backend. init and run are required (kvx_no_init / kvx_no_run where the backend cannot); every
// other hook may be NULL (nothing to do).
typedef struct kvx_backend {
  const char *name;
  // auto's choice, as ggml's ggml_backend_score_t: among the backends both agents run whose caps fit where the peer
  // is, the highest rank wins. 0: auto neither brings it up nor picks it (nccl: only when asked).
  int rank;
  unsigned caps;  // KVX_CAP_*
  int (*auto_up)(void);  // auto, optional: 0 = do not bring it up on this agent (nixl: unless the operator asked)
  int listener;  // KVX_LS_*: where its peers connect (the core starts it with the backend)
  int reader;    // 1: the peer answers each request (ACK, READ_DATA) and the core's reader thread takes the answers
  const kvx_frame *frames;  // the frames it serves on its listener, ended by {0, NULL}; NULL = none
  // The agent.
  int (*init)(kvx_agent *a, char *err, size_t errlen);  // devices, state in a->be_state
  void (*stop)(kvx_agent *a);  // closing: wake this backend's own threads; must not block
  void (*fini)(kvx_agent *a);  // after every thread has exited: free what init made
  // Memory: fill r->priv / r->word for this backend.
  int (*reg)(kvx_agent *a, kvx_region *r, char *err, size_t errlen);
  void (*dereg)(kvx_agent *a, kvx_region *r);
  // Metadata: this backend's section of the blob (reg_lock held, regions in a->regions order), and loading a
  // peer's section into p (p->regions already filled, in the same order).
  int (*pack_md)(kvx_agent *a, utl_buf *out, char *err, size_t errlen);
  int (*load_md)(kvx_agent *a, kvx_peer *p, const uint8_t *sec, size_t len, char *err, size_t errlen);
  // The initiator, on a connection of the core.
  int (*check)(const kvx_xfer *x, char *err, size_t errlen);  // at post (a->mu held): can this backend move x?
  int (*open)(kvx_conn *c, char *why, size_t cap);  // after the handshake: set-up frames; <0 fails the connection
  // Moves x's bytes (never a standalone notification: the core sends those). 0: done, or for reader backends sent
  // (the answer finishes it); -1: this request failed (why); -2: the connection failed (why). Resumes what start
  // left (x->sent).
  int (*run)(kvx_conn *c, kvx_xfer *x, char *why, size_t cap);
  // Reader backends: begins x on the posting thread when the connection is idle, without blocking (it saves the
  // hop to the worker thread). 0: sent; 1: the worker is to go on with run (would block, too large, or failed:
  // the worker meets the failure itself); -1: this request failed before a byte went out (why).
  int (*start)(kvx_conn *c, kvx_xfer *x, char *why, size_t cap);
  // The reader's frames other than ACK and ERR (h read, its payload not). <0 fails the connection.
  int (*answer)(kvx_conn *c, const kvx_hdr *h, char *why, size_t cap);
  void (*close)(kvx_conn *c);  // the connection's last reference: free c->priv
  void (*serve_end)(kvx_agent *a, void *state);  // a served connection ended: free its kvx_srv state
} kvx_backend;

int kvx_no_init(kvx_agent *a, char *err, size_t errlen);
int kvx_no_run(kvx_conn *c, kvx_xfer *x, char *why, size_t cap);

extern const kvx_backend kvx_tcp_backend, kvx_shm_backend, kvx_rdma_backend, kvx_nccl_backend, kvx_nixl_backend;
// Indexed by KVX_BE_* (defined in kvx.c).
extern const kvx_backend *const kvx_backends[KVX_NBE];
// Whether b can serve a peer on this host (same_host) or on another.
static inline int kvx_backend_fits(const kvx_backend *b, int same_host) {
  return (b->caps & (same_host ? KVX_CAP_LOCAL : KVX_CAP_REMOTE)) != 0;
}
// auto's choice, walking a table of n backends (kvx_backends, or a test's): the index of the highest rank among
// those both agents run (both: bit per index) that fit where the peer is; -1 when none does.
int kvx_auto_pick(const kvx_backend *const *table, int n, uint32_t both, int same_host);

// ---- agent ----
struct kvx_agent {
  char name[KVX_MAX_NAME];
  char backend[8];  // as asked
  char host_id[96];
  char listen_host[64], advertise_host[64];
  int listen_port;
  int timeout_ms;
  char secret[256];
  size_t secret_len;
  int seal;  // seal connections through the tcp listener (kvx_opts.plaintext off)
  int cuda_device;
  char shm_dir[200];
  void (*log)(void *, const char *);
  void *log_ud;
  // The backend table (borrowed: kvx_backends, registered by kvx_agent_new): how the layers below the agent reach
  // a backend (indexed by KVX_BE_*).
  const kvx_backend *const *table;
  uint32_t enabled;  // bit per KVX_BE_* that init'ed
  pthread_mutex_t mu;  // peers, notifs
  pthread_cond_t cv;
  pthread_rwlock_t reg_lock;  // regions: read while bytes move in or out of them
  kvx_region *regions;
  kvx_peer *peers;
  kvx_notif *notifs;  // ring of queued notifications
  size_t n_notifs, cap_notifs, head_notifs;
  int efd;  // eventfd: kvx_agent_fd
  KVX_ATOMIC(int) woken;     // signalled since kvx_progress last cleared it (efd written, unless nobody could sleep)
  KVX_ATOMIC(int) fd_out;    // kvx_agent_fd was called: anyone may be asleep on efd, every signal writes it
  KVX_ATOMIC(int) sleepers;  // threads in kvx_progress's poll
  KVX_ATOMIC(int64_t) wait_ns;  // recent waits in kvx_progress (moving average): how long it spins before it sleeps
  KVX_ATOMIC(int) closing;  // set once by kvx_agent_free; read by every thread
  pthread_mutex_t thr_mu;  // threads (separate: threads start while mu is held)
  pthread_cond_t thr_cv;
  int threads;  // live threads (detached); kvx_agent_free waits for 0
  KVX_ATOMIC(uint64_t) next_id;
  KVX_ATOMIC(uint64_t) auth_failures;  // kvx_auth_failures
  kvx_listener *ls[KVX_NLS];  // (owned by kvx_listen.c) or NULL
  void *be_state[KVX_NBE];  // (owned by each backend)
};

// ---- services (kvx_base.c): what every layer and every backend uses ----
void kvx_log(kvx_agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Counts one refused connection (kvx_auth_failures) and logs why.
void kvx_auth_refused(kvx_agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvx_signal(kvx_agent *a);     // wake kvx_agent_fd and kvx_progress
void kvx_signal_fd(kvx_agent *a);  // make efd readable (kvx_signal writes it only when someone may sleep on it)
int kvx_thread_start(kvx_agent *a, void *(*fn)(void *), void *arg, char *err, size_t errlen);
void kvx_thread_exit(kvx_agent *a);  // last call of every thread started by kvx_thread_start
// Finds the registered region holding [addr, addr+len) (reg_lock held by the caller).
kvx_region *kvx_find_local(kvx_agent *a, uint64_t addr, uint64_t len);
// Region by key that holds [addr, addr+len), or NULL with why filled (reg_lock held).
kvx_region *kvx_check_access(kvx_agent *a, uint64_t key, uint64_t addr, uint64_t len, char *why, size_t cap);
// The peer named name (agent lock held by the caller), or NULL.
kvx_peer *kvx_peer_find(kvx_agent *a, const char *name);
void kvx_peer_free(kvx_peer *p);
// Completes x (rc 0 = done, <0 = error with the formatted reason) and drops the backend's reference.
void kvx_xfer_finish(kvx_xfer *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void kvx_xfer_unref(kvx_xfer *x);
// The agent's notification queue: a listener or backend queues what arrived (kvx_get_notifs drains it).
void kvx_push_notif(kvx_agent *a, const char *peer, const void *msg, size_t len);
void kvx_notifs_free(kvx_agent *a);  // with the agent: frees what nobody took
// kvx_progress spins (rather than sleeps) through waits up to this long: waking a thread on an idle CPU costs tens
// of us (a VM's halted vCPU), more than such a wait.
#define KVX_SPIN_NS 100000
static inline void kvx_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}
// The tree's one clock (util/clock.h: utl_now_ms, utl_now_ns) is what kvxfer reads; these two names stay for the
// tests written against them.
static inline int64_t kvx_now_ms(void) { return utl_now_ms(); }
static inline int64_t kvx_now_ns(void) { return utl_now_ns(); }

// ---- shareable host memory (kvx_host.c) ----
// If [addr, addr+len) is a whole kvx_host_alloc allocation: 1 with its memfd (borrowed) and the file offset of addr.
int kvx_host_lookup(uint64_t addr, uint64_t len, int *fd, uint64_t *off);

// ---- the agent (kvx.c) ----
// The backend for p by the agent's choice and what both offer (a->mu held); -1 with err when none fits.
int kvx_choose_backend(kvx_agent *a, const kvx_peer *p, char *err, size_t errlen);

// ---- crypto: util/crypto.h (libcrypto) ----

// ---- wire helpers (kvx_wire.c) ----
// Blocking I/O; a call stalled longer than timeout_ms (0 = no limit) fails.
// rc: 0 ok, 1 idle (recv with idle_ok: nothing arrived), -1 closed by peer, -2 stalled past the timeout, -3 error,
// KVX_IO_SEAL a record failed to open, KVX_IO_CRYPTO libcrypto failed to seal.
// On a channel: what the core and the backends use.
void kvx_ch_init(kvx_chan *ch, int fd);  // plain, on fd
void kvx_ch_free(kvx_chan *ch);          // its seals and buffers (not the fd); plain again
static inline int kvx_ch_sealed(const kvx_chan *ch) { return ch->tx != NULL; }
int kvx_send_all(kvx_chan *ch, const void *buf, size_t len, int timeout_ms);
int kvx_sendv_all(kvx_chan *ch, struct iovec *iov, int n, int timeout_ms);  // advances iov
// Sends what the socket takes now (never waits): bytes of the caller's through (0 when full), or <0 as above.
// Sealed, a record half sent holds the next bytes: the next send on ch must start with them (the caller resumes
// from the count it was told), and nothing else may be sent on ch before it.
int64_t kvx_sendv_now(kvx_chan *ch, struct iovec *iov, int n);
int kvx_recv_all(kvx_chan *ch, void *buf, size_t len, int timeout_ms, int idle_ok);
int kvx_recvv_all(kvx_chan *ch, struct iovec *iov, int n, int timeout_ms);  // scatter; advances iov
// What is there now (never waits): bytes (>0) from the channel's opened records and one receive, 0 when nothing,
// or <0 as above.
int64_t kvx_recvv_now(kvx_chan *ch, struct iovec *iov, int n);
// Waits until ch has something to read: plaintext or a whole record already in the channel, or bytes on the socket.
int kvx_wait_in(kvx_chan *ch, int timeout_ms);
int kvx_send_frame(kvx_chan *ch, uint16_t op, uint16_t flags, uint64_t req, uint64_t addr, uint64_t len,
                   uint64_t key, const void *payload, size_t plen, int timeout_ms);
// On a bare socket: the plain syscalls under a plain channel (and raw peers in tests).
int kvx_fd_send_all(int fd, const void *buf, size_t len, int timeout_ms);
int kvx_fd_sendv_all(int fd, struct iovec *iov, int n, int timeout_ms);
int64_t kvx_fd_sendv_now(int fd, struct iovec *iov, int n);
int kvx_fd_recv_all(int fd, void *buf, size_t len, int timeout_ms, int idle_ok);
int64_t kvx_fd_recvv_now(int fd, struct iovec *iov, int n);
int kvx_iov_advance(struct iovec **iov, int n, size_t done);  // past done bytes; returns the entries left
int kvx_wait_fd(int fd, short events, int timeout_ms);  // poll one fd: 0 ready, -2 timed out, -3 error
const char *kvx_io_why(int rc);  // words for a <0 rc of the calls above
// Handshakes (version 2), on a plain channel. seal: this side's setting for this connection (the agent's, and 0
// on unix sockets); each side's travels under the MACs and a mismatch is refused naming both. When both seal, the
// channel is sealed on success (keys from HKDF over the secret, both nonces, the name and both MACs).
// Client: proves the secret to the server and checks the server's proof.
int kvx_handshake_client(kvx_chan *ch, const char *my_name, const void *secret, size_t slen, int seal,
                         int timeout_ms, char *err, size_t errlen);
// Server: verifies the client; fills peer_name (KVX_MAX_NAME) on success. Both refuse an empty secret.
int kvx_handshake_server(kvx_chan *ch, const void *secret, size_t slen, int seal, int timeout_ms, char *peer_name,
                         char *err, size_t errlen);
int kvx_tcp_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen);
int kvx_unix_connect(const char *path, char *err, size_t errlen);
void kvx_sock_timeouts(int fd, int timeout_ms);  // TCP_NODELAY and TCP_USER_TIMEOUT
int kvx_valid_name(const char *s);

#ifdef __cplusplus
}
#endif
#endif
