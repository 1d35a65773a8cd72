// kvxfer/kvx_int.h: kvxfer internals shared by the core and the backends (not for users of the library).
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
#include "kvxfer/kvx_crypto.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { KVX_BE_TCP = 0, KVX_BE_SHM = 1, KVX_BE_RDMA = 2, KVX_BE_NCCL = 3, KVX_NBE = 4 };
#define KVX_OP_NOTIFY 3  // internal xfer op: a standalone notification

// ---- wire: frames on tcp / unix sockets (little-endian hosts only) ----
#define KVX_FRAME_MAGIC 0x4658564bu  // "KVXF"
enum {
  KVX_F_WRITE = 1,       // addr,len,key: len payload bytes follow, land at addr
  KVX_F_WRITE_END = 2,   // req: end of a WRITE; len = notif bytes that follow; reply ACK
  KVX_F_READ = 3,        // req,addr,len,key: send those bytes back as READ_DATA
  KVX_F_READ_END = 4,    // req: end of a READ; len = notif bytes; reply ACK
  KVX_F_NOTIF = 5,       // len bytes of a standalone notification
  KVX_F_ACK = 6,         // req done
  KVX_F_READ_DATA = 7,   // req,addr,len: payload follows
  KVX_F_ERR = 8,         // len bytes of reason; the connection closes after it
  KVX_F_FDS_REQ = 9,     // shm: send me your exportable regions' fds
  KVX_F_FD = 10,         // shm: key,addr,len, req = file offset; one fd via SCM_RIGHTS
  KVX_F_FDS_END = 11,
  KVX_F_RDMA_QP = 12,    // rdma: len bytes of kvx_rdma_qpinfo follow; reply the same op
  KVX_F_NCCL_INIT = 13,  // nccl: len bytes (ncclUniqueId) follow; reply ACK after comm init
  KVX_F_NCCL_XFER = 14,  // nccl: req, flags = op, len bytes = n * kvx_desc then notif; reply ACK
};
#define KVX_FL_NOTIF 1u  // a notification travels with this *_END frame

typedef struct kvx_hdr {
  uint32_t magic;
  uint16_t op;
  uint16_t flags;
  uint64_t req;
  uint64_t addr;
  uint64_t len;
  uint64_t key;
} kvx_hdr;  // 40 bytes

// ---- regions ----
typedef struct kvx_rregion {  // a region a peer exported to us
  uint64_t key, addr, len;
  uint32_t mem, flags, rkey;  // flags: KVX_RF_*
} kvx_rregion;
#define KVX_RF_SHM 1u  // spans a whole kvx_host_alloc allocation: mappable by same-host peers

struct kvx_region {
  kvx_agent *agent;  // (borrowed)
  uint64_t key;      // random, names the region on the wire
  uint64_t addr, len;
  int mem;
  int shm_fd;        // memfd of the kvx_host_alloc allocation it spans, or -1 (borrowed)
  uint64_t shm_off;  // file offset of addr in shm_fd
  uint64_t shm_size; // whole allocation bytes
  void *rdma_mr;     // struct ibv_mr * (owned) or NULL
  uint32_t rkey, lkey;  // rdma keys (0 without rdma)
  kvx_region *next;
};

// ---- requests ----
typedef struct kvx_seg {
  uint64_t laddr, raddr, len, rkey;  // rkey: the remote region's key
  uint32_t lmr, rmr;                 // rdma lkey / rkey
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
  size_t cursor;  // backend scratch: tcp READ_DATA segments received
  kvx_xfer *qnext;  // backend queue link
};

// ---- peers ----
typedef struct kvx_peer {
  char name[KVX_MAX_NAME];
  char host_id[96];
  uint32_t backends;  // bit per KVX_BE_*
  char tcp_host[64];
  int tcp_port;
  char shm_path[108];
  kvx_rregion *regions;  // (n_regions) (owned)
  size_t n_regions;
  int be;        // chosen KVX_BE_*
  void *conn[KVX_NBE];  // per-backend connection state (owned by that backend)
  struct kvx_peer *next;
} kvx_peer;

typedef struct kvx_backend {
  const char *name;
  int (*init)(kvx_agent *a, char *err, size_t errlen);  // listeners, devices
  void (*stop)(kvx_agent *a);  // closing: wake this backend's threads (shutdown its fds); must not block
  void (*fini)(kvx_agent *a);  // after every backend thread has exited: free what init made
  int (*reg)(kvx_agent *a, kvx_region *r, char *err, size_t errlen);
  void (*dereg)(kvx_agent *a, kvx_region *r);
  // post/notify/drop run with a->mu held and must not block on I/O.
  int (*post)(kvx_agent *a, kvx_peer *p, kvx_xfer *x, char *err, size_t errlen);
  void (*drop)(kvx_agent *a, kvx_peer *p, const char *why);
} kvx_backend;

int kvx_no_init(kvx_agent *a, char *err, size_t errlen);
void kvx_no_stop(kvx_agent *a);
void kvx_no_fini(kvx_agent *a);
int kvx_no_reg(kvx_agent *a, kvx_region *r, char *err, size_t errlen);
void kvx_no_dereg(kvx_agent *a, kvx_region *r);
int kvx_no_post(kvx_agent *a, kvx_peer *p, kvx_xfer *x, char *err, size_t errlen);
void kvx_no_drop(kvx_agent *a, kvx_peer *p, const char *why);

extern const kvx_backend kvx_tcp_backend, kvx_shm_backend, kvx_rdma_backend, kvx_nccl_backend;
// Indexed by KVX_BE_* (defined in kvx.c).
extern const kvx_backend *const kvx_backends[KVX_NBE];

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
  int cuda_device;
  char shm_dir[200];
  void (*log)(void *, const char *);
  void *log_ud;
  uint32_t enabled;  // bit per KVX_BE_* that init'ed
  pthread_mutex_t mu;  // peers, notifs
  pthread_cond_t cv;
  pthread_rwlock_t reg_lock;  // regions: read while bytes move in or out of them
  kvx_region *regions;
  kvx_peer *peers;
  kvx_notif *notifs;  // ring of queued notifications
  size_t n_notifs, cap_notifs, head_notifs;
  int efd;  // eventfd
  KVX_ATOMIC(int) closing;  // set once by kvx_agent_free; read by every backend thread
  pthread_mutex_t thr_mu;  // threads (separate: threads start while mu is held)
  pthread_cond_t thr_cv;
  int threads;  // live backend threads (detached); kvx_agent_free waits for 0
  KVX_ATOMIC(uint64_t) next_id;
  KVX_ATOMIC(uint64_t) auth_failures;  // kvx_auth_failures
  void *be_state[KVX_NBE];  // (owned by each backend)
};

// Core services for the backends.
void kvx_log(kvx_agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Counts one refused connection (kvx_auth_failures) and logs why.
void kvx_auth_refused(kvx_agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvx_signal(kvx_agent *a);  // wake kvx_agent_fd
void kvx_push_notif(kvx_agent *a, const char *peer, const void *msg, size_t len);
// Completes x (rc 0 = done, <0 = error with the formatted reason) and drops the backend's reference.
void kvx_xfer_finish(kvx_xfer *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void kvx_xfer_unref(kvx_xfer *x);
// Finds the registered region holding [addr, addr+len) (reg_lock held by the caller).
kvx_region *kvx_find_local(kvx_agent *a, uint64_t addr, uint64_t len);
// The peer named name (agent lock held by the caller), or NULL.
kvx_peer *kvx_peer_find(kvx_agent *a, const char *name);
// Region by key that holds [addr, addr+len), or NULL with why filled (reg_lock held).
kvx_region *kvx_check_access(kvx_agent *a, uint64_t key, uint64_t addr, uint64_t len, char *why, size_t cap);
int kvx_thread_start(kvx_agent *a, void *(*fn)(void *), void *arg, char *err, size_t errlen);
void kvx_thread_exit(kvx_agent *a);  // last call of every thread started by kvx_thread_start
int64_t kvx_now_ms(void);

// ---- crypto (kvx_sha256.c): kvxfer/kvx_crypto.h ----

// ---- wire helpers (kvx_wire.c) ----
// Blocking I/O; a call stalled longer than timeout_ms (0 = no limit) fails. 0 ok, <0 error (why filled).
int kvx_send_all(int fd, const void *buf, size_t len, int timeout_ms);
int kvx_sendv_all(int fd, struct iovec *iov, int n, int timeout_ms);
// idle_ok: EAGAIN before the first byte returns 1 (nothing arrived) instead of an error.
int kvx_recv_all(int fd, void *buf, size_t len, int timeout_ms, int idle_ok);
int kvx_send_frame(int fd, uint16_t op, uint16_t flags, uint64_t req, uint64_t addr, uint64_t len, uint64_t key,
                   const void *payload, size_t plen, int timeout_ms);
// Handshakes. Client: proves the secret to the server and checks the server's proof.
int kvx_handshake_client(int fd, const char *my_name, const void *secret, size_t slen, int timeout_ms, char *err,
                         size_t errlen);
// Server: verifies the client; fills peer_name (KVX_MAX_NAME) on success. Both refuse an empty secret.
int kvx_handshake_server(int fd, const void *secret, size_t slen, int timeout_ms, char *peer_name, char *err,
                         size_t errlen);
int kvx_tcp_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen);
void kvx_sock_timeouts(int fd, int timeout_ms);  // SO_RCVTIMEO/SO_SNDTIMEO and TCP_USER_TIMEOUT
int kvx_valid_name(const char *s);

// Hooks the tcp server loop calls for side-channel frames (kvx_rdma.c / kvx_nccl.c).
// Each reads its payload from fd and replies; <0 closes the connection with why filled.
int kvx_rdma_serve_qp(kvx_agent *a, const char *peer, int fd, const kvx_hdr *h, char *why, size_t cap);
int kvx_nccl_serve(kvx_agent *a, const char *peer, int fd, const kvx_hdr *h, void **state, char *why, size_t cap);
void kvx_nccl_serve_end(kvx_agent *a, void *state);

#ifdef __cplusplus
}
#endif
#endif
