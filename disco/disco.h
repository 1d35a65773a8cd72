// disco/disco.h: cluster membership in etcd: the worker record and its key, a worker's registration under a lease
// (the registrar), and a router's view of who is up (the watcher). The etcd client itself is disco/etcd.h.
//
// Membership is a hint, never trust: whoever links to a registered worker still proves the cluster secret (ctl/).
// Keys: /dserve/<cluster>/workers/<role>/<name>, value: the record's JSON (docs/deploy.md lists its fields).
#ifndef DSERVE_DSC_DISCO_H
#define DSERVE_DSC_DISCO_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "util/buf.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// What must be equal for two workers to serve one model: the architecture and the file's identity; kv_type and
// block_size say how its KV cache is laid out (a prefill worker's handoff checks those against its decode peer).
typedef struct dsc_fingerprint {
  char arch[32];      // general.architecture
  char file_hash[40]; // "<size>-<hex FNV-1a 64 of the first DSC_HASH_BYTES bytes>" (dsc_file_hash)
  char kv_type[8];
  int block_size;
} dsc_fingerprint;

enum { DSC_HASH_BYTES = 16 << 20 }; // the GGUF's header, metadata and first tensors

typedef struct dsc_member {
  char name[64];
  cfg_role role;
  char host[64];          // control address (what a router or a peer connects to)
  int port;
  char kvx_host[64];      // kvxfer address ("" = none: a both worker)
  int kvx_port;
  dsc_fingerprint fp;
  int max_seqs;           // capacity: sequences at once, and KV blocks in its pool
  int total_blocks;
  int64_t incarnation;    // new on every start of the process (its start time in us): a restart is a new member
} dsc_member;

// "<size>-<hash>" of the file at path into out (cap >= 40). 0, or -1 with err.
int dsc_file_hash(const char *path, char *out, size_t cap, char *err, size_t errlen) UTL_WARN_UNUSED;
// 1 when a and b name the same model (architecture and file hash).
int dsc_same_model(const dsc_fingerprint *a, const dsc_fingerprint *b);
// The key prefix of a cluster's workers ("/dserve/<cluster>/workers/"), and a member's key under it.
void dsc_workers_prefix(const char *cluster, char *out, size_t cap);
void dsc_member_key(const char *cluster, const dsc_member *m, char *out, size_t cap);
int dsc_member_encode(const dsc_member *m, utl_buf *out) UTL_WARN_UNUSED; // JSON; 0, or -1 out of memory
// 0, or -1 with err
int dsc_member_decode(const char *json, size_t n, dsc_member *m, char *err, size_t errlen) UTL_WARN_UNUSED;
// A member's cfg_worker as a router or peer needs it: name, role, host, port, kvxfer address, max_seqs,
// block_size and kv_type; the rest cfg_worker_defaults.
void dsc_member_to_cfg(const dsc_member *m, cfg_worker *w);

// ---- a worker's registration (register.c) ----
// A thread that grants a lease of d->lease_ttl_s, puts m's record under it and keeps it alive (every TTL/3); when
// etcd is unreachable it logs once and retries every 500 ms, and when the lease expired meanwhile it registers
// anew. log_as: the log component (the worker's name).
typedef struct dsc_registrar dsc_registrar;
int dsc_registrar_start(const cfg_discovery *d, const dsc_member *m, const char *log_as, dsc_registrar **out,
                        char *err, size_t errlen) UTL_WARN_UNUSED;
// Stops the thread and revokes the lease (the record goes at once rather than after the TTL). NULL is a no-op.
void dsc_registrar_stop(dsc_registrar *r);
int dsc_registrar_registered(dsc_registrar *r); // 1 while the record is in etcd (as far as the last call knew)

// ---- a router's view (watch.c) ----
// A member is a record under one etcd key (attached to one lease); names are what links and handoffs use, so the
// watcher lets one key at a time hold a name: a record whose name another key's member holds is refused, loudly, and
// changes nothing for that member; when the holder leaves, the refused records of its name are considered again
// (the oldest key first). A watcher that starts gives each name to the oldest key (create_revision) naming it, as a
// watcher that was running then did.
// join: a member appeared or its record changed (a restart: a new incarnation; a new lease): key, lease and record.
// It returns 0 when the consumer takes it, non-zero when the consumer refuses it (another model): a refused record
// holds no name (and when it was a member, the consumer has dropped it). leave: its key went away (lease expired
// or revoked, deleted) or its record took another name; m is the last record the watcher saw under the key. A key the
// consumer refused also gets a leave when it goes (a consumer may keep refused records, to show them).
// Called from the watcher's thread, one at a time, in etcd's order.
typedef struct dsc_watch_fns {
  int (*join)(void *arg, const char *key, int64_t lease, const dsc_member *m);
  void (*leave)(void *arg, const char *key, const dsc_member *m);
  void *arg;
} dsc_watch_fns;
typedef struct dsc_watcher dsc_watcher;
// A thread that ranges the cluster's workers prefix (a join for each), then watches it from the range's revision.
// etcd unreachable: the members stay as they are (logged once); when it answers again: a fresh range (joins and
// leaves for what changed meanwhile) and a new watch.
int dsc_watcher_start(const cfg_discovery *d, const dsc_watch_fns *fns, const char *log_as, dsc_watcher **out,
                      char *err, size_t errlen) UTL_WARN_UNUSED;
void dsc_watcher_stop(dsc_watcher *w); // NULL is a no-op

// The client options of d (disco/etcd.h), its strings borrowed from d.
struct dsc_etcd_opts;
void dsc_etcd_opts_of(const cfg_discovery *d, const char **endpoints, struct dsc_etcd_opts *o);

#ifdef __cplusplus
}
#endif
#endif
