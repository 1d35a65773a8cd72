// kvxfer/kvx.h: the KV-cache transfer library: agents, registered regions, descriptor lists, WRITE/READ requests, notifications.
//
// Shape (after NIXL): each process makes one agent. It registers the memory a peer may
// touch, packs a metadata blob (name, endpoints, backends, host id, exported regions) and
// hands it to peers over any side channel (the control protocol). A peer that loaded the
// blob can WRITE into or READ from those regions with descriptor lists; a notification
// attached to a WRITE reaches the receiver only after every byte of that WRITE has landed.
//
// Backends: "tcp" (any two hosts), "shm" (same host: the receiver's regions, allocated with
// kvx_host_alloc, are mapped into the sender; one memcpy per byte), "rdma" (libibverbs RC
// QPs, RDMA WRITE with immediate; GPUDirect for CUDA memory), "nccl" (GPU to GPU, CUDA
// builds only), "nixl" (NIXL's C API with UCX, loaded at run time: docs/kvxfer.md), "auto"
// (per peer: shm on one host, rdma when both have a device, nixl between hosts where
// DSERVE_NIXL_LIB names it, else tcp).
//
// Safety: a peer must prove it holds the cluster's shared secret (HMAC-SHA256
// challenge/response) before any frame is accepted; after it, tcp connections are sealed
// (AES-256-GCM records under per-connection keys, unless opts.plaintext); every incoming frame is validated
// against the regions this agent registered (overflow-safe); a bad frame closes that
// connection with a logged reason and writes nothing. A peer that dies or stalls turns
// every pending request to it into an error within opts.timeout_ms.
//
// Threads: kvx_xfer_post, kvx_xfer_poll, kvx_xfer_error, kvx_get_notifs, kvx_notify,
// kvx_progress, kvx_agent_fd, kvx_register/kvx_deregister, kvx_pack_md, kvx_load_remote_md,
// kvx_invalidate_peer and kvx_xfer_new are safe to call from several threads at once on one
// agent. A single kvx_xfer must not be freed while another thread uses it. kvx_agent_free
// must be the last call on an agent (no other thread inside it).
//
// Waiting: kvx_agent_fd(agent) is an eventfd that becomes readable whenever a request
// completes or fails, or a notification arrives; put it in poll()/epoll, and when it fires
// call kvx_progress(agent, 0) (clears it), then kvx_xfer_poll your requests and
// kvx_get_notifs. kvx_progress(agent, timeout_ms) also blocks up to timeout_ms for that (it
// spins first, at most 100 us, while recent waits were that short).
#ifndef DSERVE_KVX_H
#define DSERVE_KVX_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { KVX_MEM_HOST = 0, KVX_MEM_CUDA = 1 };
enum { KVX_WRITE = 1, KVX_READ = 2 };
enum { KVX_DONE = 0, KVX_PENDING = 1 };  // kvx_xfer_poll; errors are < 0
enum { KVX_ERR = -1, KVX_ERR_TIMEOUT = -2, KVX_ERR_PEER = -3 };

#define KVX_MAX_NOTIF 65536  // bytes in one notification
#define KVX_MAX_NAME 64      // bytes in an agent name, with the NUL

typedef struct kvx_agent kvx_agent;
typedef struct kvx_region kvx_region;
typedef struct kvx_xfer kvx_xfer;

typedef struct kvx_opts {
  const char *backend;      // "tcp" | "shm" | "rdma" | "nccl" | "nixl" | "auto"; NULL = "auto"
  const char *listen_host;  // numeric IPv4 to listen on; NULL = "127.0.0.1"
  int listen_port;          // 0 = ephemeral
  const char *advertise_host;  // address put in the metadata; NULL = listen_host
  int timeout_ms;           // a peer silent this long with work pending is dead; 0 = 10000
  const char *secret;       // shared cluster secret (required: kvx_agent_new refuses NULL and ""); peers must match
  int cuda_device;          // CUDA device index for rdma/nccl with CUDA memory
  // 1: connections through the tcp listener (tcp; rdma's, nccl's and nixl's set-up frames and notifications) carry
  // plaintext after the handshake, for a trusted fabric. 0 (the default): every byte after the handshake is sealed
  // (AES-256-GCM records, docs/kvxfer.md). Both agents of a connection must agree: a mismatch is refused.
  int plaintext;
  const char *shm_dir;      // where the shm backend makes its private 0700 folder holding its 0600 unix socket;
                            // NULL = $TMPDIR or /tmp
  // Log sink for refused peers and dropped connections; NULL = stderr lines "kvx[name]: ...".
  void (*log)(void *log_ud, const char *line);
  void *log_ud;  // (borrowed)
} kvx_opts;

typedef struct kvx_desc {
  uint64_t addr;  // virtual address in the owner's address space
  uint64_t len;   // bytes
} kvx_desc;

typedef struct kvx_notif {
  char peer[KVX_MAX_NAME];  // sender's agent name
  uint8_t *msg;             // (owned by the caller after kvx_get_notifs: free with free())
  size_t len;
} kvx_notif;

// Agents. name: unique in the cluster (1..63 bytes of [A-Za-z0-9._-]).
kvx_agent *kvx_agent_new(const char *name, const kvx_opts *opts, char *err, size_t errlen);
void kvx_agent_free(kvx_agent *a);
const char *kvx_agent_name(const kvx_agent *a);
const char *kvx_agent_backend(const kvx_agent *a);  // the backend asked for ("auto" etc.)
int kvx_agent_port(const kvx_agent *a);              // bound tcp port (0 when tcp is off)
// Connections this agent refused before any frame (each logged with the peer's address, or pid and uid for shm):
// a failed or malformed handshake (wrong secret), or an shm peer of another user. Thread-safe.
uint64_t kvx_auth_failures(kvx_agent *a);

// Host memory that the shm backend can map into another process (memfd + MAP_SHARED),
// zero-filled and page aligned. Register it to export it to same-host peers.
void *kvx_host_alloc(size_t len, char *err, size_t errlen);
void kvx_host_free(void *p, size_t len);  // p from kvx_host_alloc (or NULL); len is not needed (kept for symmetry)

// Registration. Every registered region is exported to every authenticated peer in the
// next kvx_pack_md. A region is shm-exportable when it spans a whole kvx_host_alloc
// allocation; other host regions serve tcp/rdma, and the shm backend as a source.
int kvx_register(kvx_agent *a, void *addr, size_t len, int mem, kvx_region **out, char *err,
                 size_t errlen) UTL_WARN_UNUSED;
void kvx_deregister(kvx_agent *a, kvx_region *r);

// Metadata. *blob is malloc'ed (caller frees). load fills peer_name_out with the peer's
// name; loading a name again replaces what was known about it.
int kvx_pack_md(kvx_agent *a, void **blob, size_t *len, char *err, size_t errlen) UTL_WARN_UNUSED;
int kvx_load_remote_md(kvx_agent *a, const void *blob, size_t len, char *peer_name_out, size_t cap, char *err,
                       size_t errlen) UTL_WARN_UNUSED;
// Forget a peer: its connections are closed and its pending requests fail.
void kvx_invalidate_peer(kvx_agent *a, const char *peer);
// Reach a peer's tcp endpoint through another address (NAT, proxies); 0 or <0 with err.
int kvx_set_peer_endpoint(kvx_agent *a, const char *peer, const char *host, int port, char *err,
                          size_t errlen) UTL_WARN_UNUSED;
// The regions a loaded peer exported (addr, len), in its metadata's order (newest registration first);
// returns how many there are (may exceed max; only max are written), or -1 for an unknown peer.
int kvx_peer_regions(kvx_agent *a, const char *peer, kvx_desc *out, int max);
// Backend chosen for a loaded peer ("tcp", "shm", ...), or NULL when unknown.
const char *kvx_peer_backend(kvx_agent *a, const char *peer);

// Requests. local: (n_local) descriptors inside regions this agent registered; remote:
// (n_remote) descriptors inside regions the peer exported. Both lists cover the same total
// byte count and are matched in order (pairwise, or split where the boundaries differ).
// WRITE copies local -> remote, READ remote -> local. notif (<= KVX_MAX_NOTIF bytes, may be
// NULL) is delivered to the peer after all bytes have landed (WRITE) or been read (READ).
// The buffers behind the descriptors must stay valid until the request is no longer pending.
int kvx_xfer_new(kvx_agent *a, int op, const kvx_desc *local, size_t n_local, const kvx_desc *remote,
                 size_t n_remote, const char *peer, const void *notif, size_t notif_len, kvx_xfer **out,
                 char *err, size_t errlen) UTL_WARN_UNUSED;
// Non-blocking; 0, or <0 (see kvx_xfer_error); re-post after DONE reuses it
int kvx_xfer_post(kvx_xfer *x) UTL_WARN_UNUSED;
int kvx_xfer_poll(kvx_xfer *x) UTL_WARN_UNUSED;        // KVX_PENDING, KVX_DONE, or <0
const char *kvx_xfer_error(kvx_xfer *x);  // last error message ("" when none)
void kvx_xfer_free(kvx_xfer *x);       // a pending request is abandoned (its peer may still get the bytes)

// Notifications. kvx_notify sends msg to peer (queued behind that peer's earlier requests).
int kvx_notify(kvx_agent *a, const char *peer, const void *msg, size_t len, char *err, size_t errlen) UTL_WARN_UNUSED;
// Takes up to max queued notifications (oldest first); returns how many.
int kvx_get_notifs(kvx_agent *a, kvx_notif *out, int max);

int kvx_agent_fd(kvx_agent *a);
// Waits up to timeout_ms (0 = no wait, <0 = forever) for progress; 1 if there was, 0 if not.
int kvx_progress(kvx_agent *a, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
