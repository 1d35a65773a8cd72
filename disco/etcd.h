// disco/etcd.h: a small etcd v3 client over etcd's HTTP/JSON gateway (libcurl): leases, put, range, delete, watch.
//
// What dserve needs of etcd and no more. Every call goes to the first endpoint that answers (the last one that did
// is tried first); keys and values are bytes (base64 on the wire, as the gateway wants). Errors are a negative
// status and a message in the caller's buffer: DSC_EUNAVAIL when no endpoint answered (etcd down or unreachable),
// DSC_ENOTFOUND for a lease etcd does not know, DSC_EPROTO for an answer that does not parse or an etcd error.
// A client is safe to share between threads (unary calls take its lock; a watch runs on a handle of its own).
#ifndef DSERVE_DSC_ETCD_H
#define DSERVE_DSC_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DSC_OK = 0, DSC_EUNAVAIL = -1, DSC_ENOTFOUND = -2, DSC_EPROTO = -3, DSC_ENOMEM = -4, DSC_ESTOPPED = -5,
       DSC_EEXISTS = -6 };

typedef struct dsc_etcd dsc_etcd;

// Where etcd is and how to prove who we are (etcd's own TLS and auth: docs/deploy.md). Strings are copied.
typedef struct dsc_etcd_opts {
  const char *const *endpoints; // (n_endpoints) "http://host:port" or "https://host:port"
  int n_endpoints;
  const char *ca_file;       // https: the CA that signed etcd's certificate (NULL: the system's)
  const char *cert_file;     // https: our client certificate and its key (etcd --client-cert-auth); NULL: none
  const char *key_file;
  const char *user;          // etcd auth: user name (NULL: no auth) and the file holding its password
  const char *password_file;
  int timeout_ms;            // each unary call's bound (0: 2000)
} dsc_etcd_opts;

typedef struct dsc_kv {
  char *key;        // (owned) NUL-terminated (keys dserve writes are text)
  char *value;      // (owned) (value_len) bytes, NUL-terminated as well
  size_t value_len;
  int64_t mod_revision;
  int64_t create_revision; // the put that created the key (its first since it was last deleted)
  int64_t lease;
} dsc_kv;

// A watch event: a put (kv.value set) or a delete (kv.value NULL).
typedef struct dsc_event {
  int is_delete;
  dsc_kv kv;
} dsc_event;

int dsc_etcd_new(const dsc_etcd_opts *o, dsc_etcd **out, char *err, size_t errlen) UTL_WARN_UNUSED;
void dsc_etcd_free(dsc_etcd *c); // NULL is a no-op

// A lease of ttl_s seconds; *id its id.
int dsc_lease_grant(dsc_etcd *c, int ttl_s, int64_t *id, char *err, size_t errlen) UTL_WARN_UNUSED;
// One keep-alive of lease id: *ttl_left its TTL now. DSC_ENOTFOUND when etcd no longer knows the lease (expired).
int dsc_lease_keepalive(dsc_etcd *c, int64_t id, int *ttl_left, char *err, size_t errlen) UTL_WARN_UNUSED;
int dsc_lease_revoke(dsc_etcd *c, int64_t id, char *err, size_t errlen) UTL_WARN_UNUSED; // its keys go with it
// key = value (value_len bytes), attached to lease (0: none).
int dsc_put(dsc_etcd *c, const char *key, const void *value, size_t value_len, int64_t lease, char *err,
            size_t errlen) UTL_WARN_UNUSED;
// Every key under prefix (or exactly key when prefix is 0): *kvs (owned by the caller, dsc_kvs_free) (*n), and the
// store's revision the answer reflects in *revision (a watch from *revision + 1 misses nothing after it).
// Puts key only when etcd holds no such key (one transaction: compare its create revision with 0). DSC_EEXISTS when it
// holds one: *holder is that key's record (the caller frees its fields with dsc_kv_clear).
int dsc_put_if_absent(dsc_etcd *c, const char *key, const void *value, size_t value_len, int64_t lease,
                      dsc_kv *holder, char *err, size_t errlen) UTL_WARN_UNUSED;
int dsc_range(dsc_etcd *c, const char *key, int prefix, dsc_kv **kvs, int *n, int64_t *revision, char *err,
              size_t errlen) UTL_WARN_UNUSED;
int dsc_delete(dsc_etcd *c, const char *key, int prefix, char *err, size_t errlen) UTL_WARN_UNUSED;
void dsc_kvs_free(dsc_kv *kvs, int n);
void dsc_kv_clear(dsc_kv *kv); // frees one record's fields and zeroes it

// Watches every key under prefix from start_revision (0: from now), calling on_event for each change in order, until
// the stream breaks (returns DSC_EUNAVAIL: etcd went away; the caller resyncs), stop() returns non-zero (checked at
// least every 200 ms; returns DSC_ESTOPPED), or on_event returns non-zero (returns DSC_ESTOPPED). DSC_EPROTO when
// etcd cancels the watch (its start revision was compacted: the caller ranges anew). *last_revision: the highest
// revision seen (start_revision - 1 when none).
typedef int (*dsc_event_fn)(void *arg, const dsc_event *ev);
int dsc_watch(dsc_etcd *c, const char *prefix, int64_t start_revision, dsc_event_fn on_event, int (*stop)(void *arg),
              void *arg, int64_t *last_revision, char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
