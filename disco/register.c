// disco/register.c: a worker's registration: its record in etcd under a lease kept alive by a thread of its own,
// registered anew when the lease was lost, revoked when the worker stops.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disco/disco.h"
#include "disco/disco_int.h"
#include "disco/etcd.h"
#include "util/err.h"
#include "util/log.h"
#include "util/net.h"
#include "util/clock.h"

#define RETRY_MS 500 // etcd unreachable: how often it is tried again
#define PROBE_MS 1000 // how long a holder's address may take to answer before it counts as dead

struct dsc_registrar {
  dsc_etcd *etcd;        // (owned)
  char key[256];
  char host[64];         // where this worker listens: a record of the same address is its own earlier incarnation
  int port;
  char *value;           // (owned) the record's JSON
  int ttl_s;
  char log_as[64];
  pthread_t thread;
  pthread_mutex_t mu;    // guards stop, lease, registered
  pthread_cond_t cv;
  int stop;
  int64_t lease;         // 0 = none held
  int registered;
};

// Waits up to ms or until stop; returns stop.
static void set_state(dsc_registrar *r, int64_t lease, int registered) {
  pthread_mutex_lock(&r->mu);
  r->lease = lease;
  r->registered = registered;
  pthread_mutex_unlock(&r->mu);
}

// Registers r's record under a new lease unless the key holds another live worker's record (one etcd transaction:
// two workers of one name and role never overwrite each other). A record at this worker's own address is its own
// earlier incarnation (nothing else listens there now), and one whose address nothing answers at is a dead worker's
// whose lease has not lapsed yet (a restart on another port): both are replaced. 0 with *lease; DSC_EEXISTS with who
// (the live holder's address); or etcd's error.
static int register_once(dsc_registrar *r, int64_t *lease, char *who, size_t cap, char *err, size_t errlen) {
  int64_t id = 0;
  int rc = dsc_lease_grant(r->etcd, r->ttl_s, &id, err, errlen);
  if (rc) return rc;
  set_state(r, id, 0); // held from now: stop revokes it even if the put below fails
  dsc_kv holder;
  rc = dsc_put_if_absent(r->etcd, r->key, r->value, strlen(r->value), id, &holder, err, errlen);
  if (rc == DSC_EEXISTS) {
    dsc_member hm;
    char derr[128];
    int readable = !dsc_member_decode(holder.value, holder.value_len, &hm, derr, sizeof derr);
    if (readable && hm.port == r->port && !strcmp(hm.host, r->host)) {
      rc = dsc_put(r->etcd, r->key, r->value, strlen(r->value), id, err, errlen);
    } else if (readable && !utl_tcp_answers(hm.host, hm.port, PROBE_MS)) {
      utl_log(r->log_as, "replacing etcd record %s of %s:%d, where nothing answers (a dead worker's lease that has "
              "not lapsed)", r->key, hm.host, hm.port);
      rc = dsc_put(r->etcd, r->key, r->value, strlen(r->value), id, err, errlen);
    } else if (readable)
      snprintf(who, cap, "%s:%d", hm.host, hm.port);
    else
      snprintf(who, cap, "a record that does not parse (%s)", derr);
    dsc_kv_clear(&holder);
  }
  if (rc) {
    char e2[256];
    if (dsc_lease_revoke(r->etcd, id, e2, sizeof e2)) // it lapses after ttl_s anyway
      utl_debug(r->log_as, "lease %lld not revoked: %s", (long long)id, e2);
    set_state(r, 0, 0);
    return rc;
  }
  *lease = id;
  return 0;
}

static void *registrar_main(void *arg) {
  dsc_registrar *r = arg;
  pthread_mutex_lock(&r->mu);
  int64_t lease = r->lease; // dsc_registrar_start's first registration, when it made one
  pthread_mutex_unlock(&r->mu);
  int down = 0; // etcd was unreachable (logged once per outage)
  char err[512], who[160] = "", said[160] = "";
  for (;;) {
    int rc;
    if (!lease) {
      rc = register_once(r, &lease, who, sizeof who, err, sizeof err);
      if (rc == DSC_EEXISTS) { // another live worker took the name while this one was away: never overwritten
        if (strcmp(who, said))
          utl_err(r->log_as, "NOT REGISTERED: etcd key %s holds another live worker's record (%s): each worker needs "
                  "a name of its own; trying again every %d ms until that record goes", r->key, who, RETRY_MS);
        snprintf(said, sizeof said, "%s", who);
        if (dsc_nap(&r->mu, &r->cv, &r->stop, RETRY_MS)) break;
        continue;
      }
      said[0] = 0;
      if (!rc) {
        set_state(r, lease, 1);
        utl_log(r->log_as, "registered in etcd as %s (lease %llx, TTL %d s)%s", r->key, (unsigned long long)lease,
                r->ttl_s, down ? "; etcd is back" : "");
        down = 0;
      }
    } else {
      int ttl = 0;
      rc = dsc_lease_keepalive(r->etcd, lease, &ttl, err, sizeof err);
      if (rc == DSC_ENOTFOUND) { // expired while etcd was away (or revoked by hand): register anew at once
        utl_warn(r->log_as, "etcd lease %llx is gone; registering anew", (unsigned long long)lease);
        lease = 0;
        set_state(r, 0, 0);
        continue;
      }
      if (!rc && down) {
        utl_log(r->log_as, "etcd is back; registration %s kept", r->key);
        down = 0;
      }
    }
    if (rc && !down) { // once per outage; a refusal (auth, permissions) is said as such
      utl_warn(r->log_as, "etcd %s (%s); serving on, retrying every %d ms",
               rc == DSC_EUNAVAIL ? "unreachable" : "refused the registration", err, RETRY_MS);
      down = 1;
    } else if (rc && rc != DSC_EUNAVAIL) {
      utl_debug(r->log_as, "etcd: %s", err);
    }
    if (dsc_nap(&r->mu, &r->cv, &r->stop, rc ? RETRY_MS : r->ttl_s * 1000 / 3)) break;
  }
  return NULL;
}

int dsc_registrar_start(const cfg_discovery *d, const dsc_member *m, const char *log_as, dsc_registrar **out,
                        char *err, size_t errlen) {
  *out = NULL;
  dsc_registrar *r = calloc(1, sizeof *r);
  utl_buf v = {0};
  if (!r || dsc_member_encode(m, &v) || !(r->value = utl_buf_take(&v))) {
    utl_buf_free(&v);
    free(r);
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  const char *eps[CFG_MAX_ETCD];
  dsc_etcd_opts o;
  dsc_etcd_opts_of(d, eps, &o);
  if (dsc_etcd_new(&o, &r->etcd, err, errlen)) {
    free(r->value);
    free(r);
    return -1;
  }
  dsc_member_key(d->cluster, m, r->key, sizeof r->key);
  snprintf(r->host, sizeof r->host, "%s", m->host);
  r->port = m->port;
  r->ttl_s = d->lease_ttl_s;
  snprintf(r->log_as, sizeof r->log_as, "%s", log_as);
  pthread_mutex_init(&r->mu, NULL);
  utl_cond_init_monotonic(&r->cv); // dsc_nap waits on it
  // The first registration here, so that a name another live worker holds stops this one from starting.
  char who[160] = "", e2[512] = "";
  int64_t lease = 0;
  int rc = register_once(r, &lease, who, sizeof who, e2, sizeof e2);
  if (rc == DSC_EEXISTS) {
    utl_seterr(err, errlen, "the name %s is registered in etcd (key %s) by another live worker at %s: each worker "
               "needs a name of its own", m->name, r->key, who);
    r->stop = 1; // nothing to join
    dsc_registrar_stop(r);
    return -1;
  }
  if (!rc) {
    set_state(r, lease, 1);
    utl_log(r->log_as, "registered in etcd as %s (lease %llx, TTL %d s)", r->key, (unsigned long long)lease, r->ttl_s);
  } // else etcd is away or refused: the thread keeps trying (and says so), the worker serves on
  if (pthread_create(&r->thread, NULL, registrar_main, r)) {
    utl_seterr(err, errlen, "cannot start the etcd registration thread");
    r->stop = 1; // nothing to join
    dsc_registrar_stop(r);
    return -1;
  }
  *out = r;
  return 0;
}

int dsc_registrar_registered(dsc_registrar *r) {
  pthread_mutex_lock(&r->mu);
  int v = r->registered;
  pthread_mutex_unlock(&r->mu);
  return v;
}

void dsc_registrar_stop(dsc_registrar *r) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  int started = !r->stop;
  r->stop = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  if (started) pthread_join(r->thread, NULL);
  if (r->lease) {
    char err[512];
    if (dsc_lease_revoke(r->etcd, r->lease, err, sizeof err))
      utl_warn(r->log_as, "could not revoke etcd lease %llx (%s): the record goes when it expires",
               (unsigned long long)r->lease, err);
    else
      utl_log(r->log_as, "left the cluster: etcd lease %llx revoked", (unsigned long long)r->lease);
  }
  dsc_etcd_free(r->etcd);
  pthread_cond_destroy(&r->cv);
  pthread_mutex_destroy(&r->mu);
  free(r->value);
  free(r);
}
