// kvxfer/kvx.c: the agent, the top of the core: backends brought up and down by what their table entries say, registration, peers and each peer's backend (auto: kvx_auto_pick).
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

const kvx_backend *const kvx_backends[KVX_NBE] = {&kvx_tcp_backend, &kvx_shm_backend, &kvx_rdma_backend,
                                                    &kvx_nccl_backend, &kvx_nixl_backend};

// ---- agent ----
static void read_host_id(char *out, size_t cap) {
  char boot[64] = "?", host[64] = "?";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) strcpy(boot, "?");
    fclose(f);
    boot[strcspn(boot, "\n")] = 0;
  }
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = 0;
  snprintf(out, cap, "%.40s/%.40s", boot, host);
}

static int be_index(const char *name) {
  for (int i = 0; i < KVX_NBE; i++)
    if (!strcmp(kvx_backends[i]->name, name)) return i;
  return -1;
}

// Brings up backend i: its own init, then the listener its peers connect to (shared by the backends on it).
static int be_start(kvx_agent *a, int i, char *err, size_t errlen) {
  const kvx_backend *b = kvx_backends[i];
  if (b->init(a, err, errlen)) return -1;
  if (!a->ls[b->listener] && kvx_listen_start(a, b->listener, b->name, err, errlen)) {
    if (b->fini) b->fini(a);
    return -1;
  }
  a->enabled |= 1u << i;
  return 0;
}

kvx_agent *kvx_agent_new(const char *name, const kvx_opts *opts, char *err, size_t errlen) {
  kvx_opts o = {0};
  if (opts) o = *opts;
  if (!name || !kvx_valid_name(name)) {
    utl_seterr(err, errlen, "kvx_agent_new: bad agent name (1..63 of [A-Za-z0-9._-])");
    return NULL;
  }
  const char *be = o.backend ? o.backend : "auto";
  if (strcmp(be, "auto") && be_index(be) < 0) {
    utl_seterr(err, errlen, "kvx_agent_new: unknown backend '%s' (tcp, shm, rdma, nccl, nixl, auto)", be);
    return NULL;
  }
  const char *lh = o.listen_host ? o.listen_host : "127.0.0.1";
  const char *ah = o.advertise_host ? o.advertise_host : lh;
  const char *sec = o.secret ? o.secret : "";
  if (!sec[0]) {
    utl_seterr(err, errlen, "kvx_agent_new: a shared secret is required (peers prove it before any frame)");
    return NULL;
  }
  if (strlen(lh) >= 64 || strlen(ah) >= 64 || strlen(sec) >= 256 || o.listen_port < 0 || o.listen_port > 65535 ||
      o.timeout_ms < 0) {
    utl_seterr(err, errlen, "kvx_agent_new: bad options (host, port, timeout or secret too long)");
    return NULL;
  }
  kvx_agent *a = calloc(1, sizeof *a);
  if (!a) {
    utl_seterr(err, errlen, "out of memory");
    return NULL;
  }
  snprintf(a->name, sizeof a->name, "%s", name);
  snprintf(a->backend, sizeof a->backend, "%s", be);
  snprintf(a->listen_host, sizeof a->listen_host, "%s", lh);
  snprintf(a->advertise_host, sizeof a->advertise_host, "%s", ah);
  a->listen_port = o.listen_port;
  a->timeout_ms = o.timeout_ms ? o.timeout_ms : 10000;
  a->seal = !o.plaintext;
  a->secret_len = strlen(sec);
  memcpy(a->secret, sec, a->secret_len);
  a->cuda_device = o.cuda_device;
  const char *sd = o.shm_dir ? o.shm_dir : getenv("TMPDIR");
  snprintf(a->shm_dir, sizeof a->shm_dir, "%s", sd && *sd ? sd : "/tmp");
  a->log = o.log;
  a->log_ud = o.log_ud;
  read_host_id(a->host_id, sizeof a->host_id);
  a->table = kvx_backends;
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  pthread_mutex_init(&a->thr_mu, NULL);
  pthread_cond_init(&a->thr_cv, NULL);
  pthread_rwlock_init(&a->reg_lock, NULL);
  a->next_id = 1;
  a->wait_ns = 0;
  a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (a->efd < 0) {
    utl_seterr(err, errlen, "eventfd: %s", strerror(errno));
    kvx_agent_free(a);
    return NULL;
  }
  // Which backends to bring up: the one asked for (with the fallback on its listener, when it is not the fallback:
  // a peer of theirs can always fall back to it), or for auto every one with a rank that does not decline (the
  // fallback must come up).
  int want[KVX_NBE] = {0}, must[KVX_NBE] = {0};
  int asked = be_index(be);
  for (int i = 0; i < KVX_NBE; i++) {
    const kvx_backend *b = kvx_backends[i];
    int fallback = (b->caps & KVX_CAP_FALLBACK) != 0;
    if (asked < 0) {
      want[i] = fallback || (b->rank > 0 && (!b->auto_up || b->auto_up()));
      must[i] = fallback;  // auto leaves out what does not work here
    } else {
      want[i] = must[i] = i == asked || (fallback && !(kvx_backends[asked]->caps & KVX_CAP_FALLBACK) &&
                                         b->listener == kvx_backends[asked]->listener);
    }
  }
  // The fallback last, so that the asked backend's error (e.g. "no RDMA device") is the one reported.
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < KVX_NBE; i++) {
      int fallback = (kvx_backends[i]->caps & KVX_CAP_FALLBACK) != 0;
      if (!want[i] || fallback != pass) continue;
      char e[256] = "";
      if (be_start(a, i, e, sizeof e) && must[i]) {
        utl_seterr(err, errlen, "%s", e);
        kvx_agent_free(a);
        return NULL;
      }
    }
  return a;
}

void kvx_agent_free(kvx_agent *a) {
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  a->closing = 1;
  kvx_peer *peers = a->peers;
  a->peers = NULL;
  for (kvx_peer *p = peers; p; p = p->next) kvx_conn_drop(a, p, "agent closing");
  pthread_mutex_unlock(&a->mu);
  kvx_listen_stop(a);
  for (int i = 0; i < KVX_NBE; i++)
    if ((a->enabled & (1u << i)) && kvx_backends[i]->stop) kvx_backends[i]->stop(a);
  pthread_mutex_lock(&a->thr_mu);
  while (a->threads > 0) pthread_cond_wait(&a->thr_cv, &a->thr_mu);
  pthread_mutex_unlock(&a->thr_mu);
  while (peers) {
    kvx_peer *n = peers->next;
    kvx_peer_free(peers);
    peers = n;
  }
  while (a->regions) {
    kvx_region *r = a->regions;
    a->regions = r->next;
    for (int i = 0; i < KVX_NBE; i++)
      if ((a->enabled & (1u << i)) && kvx_backends[i]->dereg) kvx_backends[i]->dereg(a, r);
    free(r);
  }
  for (int i = 0; i < KVX_NBE; i++)
    if ((a->enabled & (1u << i)) && kvx_backends[i]->fini) kvx_backends[i]->fini(a);
  kvx_listen_free(a);
  kvx_notifs_free(a);
  if (a->efd >= 0) close(a->efd);
  pthread_rwlock_destroy(&a->reg_lock);
  pthread_cond_destroy(&a->cv);
  pthread_cond_destroy(&a->thr_cv);
  pthread_mutex_destroy(&a->thr_mu);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

const char *kvx_agent_name(const kvx_agent *a) { return a->name; }
const char *kvx_agent_backend(const kvx_agent *a) { return a->backend; }
int kvx_agent_port(const kvx_agent *a) { return a->ls[KVX_LS_TCP] ? a->listen_port : 0; }

// ---- registration ----
int kvx_register(kvx_agent *a, void *addr, size_t len, int mem, kvx_region **out, char *err, size_t errlen) {
  *out = NULL;
  if (!addr || !len || (uint64_t)(uintptr_t)addr + len < (uint64_t)(uintptr_t)addr) {
    utl_seterr(err, errlen, "kvx_register: bad range %p+%zu", addr, len);
    return -1;
  }
  if (mem != KVX_MEM_HOST && mem != KVX_MEM_CUDA) {
    utl_seterr(err, errlen, "kvx_register: bad memory kind %d", mem);
    return -1;
  }
  kvx_region *r = calloc(1, sizeof *r);
  if (!r) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  r->agent = a;
  r->addr = (uint64_t)(uintptr_t)addr;
  r->len = len;
  r->mem = mem;
  if (getrandom(&r->key, sizeof r->key, 0) != sizeof r->key) r->key = (uint64_t)utl_now_ms() ^ r->addr;
  for (int i = 0; i < KVX_NBE; i++) {
    if (!(a->enabled & (1u << i)) || !kvx_backends[i]->reg) continue;
    char e[256] = "";
    if (kvx_backends[i]->reg(a, r, e, sizeof e)) {
      if (!strcmp(a->backend, "auto") && (kvx_backends[i]->caps & KVX_CAP_SOME_REGIONS)) {  // the others serve it
        kvx_log(a, "%s; region %p+%zu will not be reachable over %s", e, addr, len, kvx_backends[i]->name);
        continue;
      }
      utl_seterr(err, errlen, "%s", e);
      for (int j = 0; j < i; j++)
        if ((a->enabled & (1u << j)) && kvx_backends[j]->dereg) kvx_backends[j]->dereg(a, r);
      free(r);
      return -1;
    }
  }
  pthread_rwlock_wrlock(&a->reg_lock);
  r->next = a->regions;
  a->regions = r;
  pthread_rwlock_unlock(&a->reg_lock);
  *out = r;
  return 0;
}

void kvx_deregister(kvx_agent *a, kvx_region *r) {
  if (!r) return;
  pthread_rwlock_wrlock(&a->reg_lock);  // waits for bytes moving in or out of it
  for (kvx_region **pp = &a->regions; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      break;
    }
  pthread_rwlock_unlock(&a->reg_lock);
  for (int i = 0; i < KVX_NBE; i++)
    if ((a->enabled & (1u << i)) && kvx_backends[i]->dereg) kvx_backends[i]->dereg(a, r);
  free(r);
}

// ---- peers ----
int kvx_auto_pick(const kvx_backend *const *table, int n, uint32_t both, int same_host) {
  int best = -1;
  for (int i = 0; i < n; i++) {
    const kvx_backend *b = table[i];
    if (!(both & (1u << i)) || b->rank <= 0 || !kvx_backend_fits(b, same_host)) continue;
    if (same_host && (b->caps & KVX_CAP_AUTO_FAR)) continue;
    if (best < 0 || b->rank > table[best]->rank) best = i;
  }
  return best;
}

int kvx_choose_backend(kvx_agent *a, const kvx_peer *p, char *err, size_t errlen) {
  uint32_t both = a->enabled & p->backends;
  int same_host = !strcmp(a->host_id, p->host_id);
  if (strcmp(a->backend, "auto")) {
    int i = be_index(a->backend);
    const kvx_backend *b = kvx_backends[i];
    if (!(both & (1u << i))) {
      utl_seterr(err, errlen, "peer '%s' does not offer the %s backend", p->name, a->backend);
      return -1;
    }
    if (!kvx_backend_fits(b, same_host)) {
      if (same_host)
        utl_seterr(err, errlen, "peer '%s' is on this host (%s): %s needs two hosts", p->name, p->host_id, b->name);
      else
        utl_seterr(err, errlen, "peer '%s' is on another host (%s): %s needs one host", p->name, p->host_id, b->name);
      return -1;
    }
    return i;
  }
  int i = kvx_auto_pick(kvx_backends, KVX_NBE, both, same_host);
  if (i < 0) utl_seterr(err, errlen, "no backend in common with peer '%s'", p->name);
  return i;
}

void kvx_invalidate_peer(kvx_agent *a, const char *peer) {
  pthread_mutex_lock(&a->mu);
  for (kvx_peer **pp = &a->peers; *pp; pp = &(*pp)->next) {
    if (strcmp((*pp)->name, peer)) continue;
    kvx_peer *p = *pp;
    *pp = p->next;
    kvx_conn_drop(a, p, "peer invalidated");
    kvx_peer_free(p);
    break;
  }
  pthread_mutex_unlock(&a->mu);
}

int kvx_set_peer_endpoint(kvx_agent *a, const char *peer, const char *host, int port, char *err, size_t errlen) {
  if (!host || strlen(host) >= 64 || port <= 0 || port > 65535) {
    utl_seterr(err, errlen, "kvx_set_peer_endpoint: bad endpoint");
    return -1;
  }
  pthread_mutex_lock(&a->mu);
  kvx_peer *p = kvx_peer_find(a, peer);
  if (p) {
    kvx_conn_drop(a, p, "peer endpoint changed");
    snprintf(p->tcp_host, sizeof p->tcp_host, "%s", host);
    p->tcp_port = port;
  }
  pthread_mutex_unlock(&a->mu);
  if (!p) utl_seterr(err, errlen, "unknown peer '%s'", peer);
  return p ? 0 : -1;
}

int kvx_peer_regions(kvx_agent *a, const char *peer, kvx_desc *out, int max) {
  pthread_mutex_lock(&a->mu);
  kvx_peer *p = kvx_peer_find(a, peer);
  int n = p ? (int)p->n_regions : -1;
  for (int i = 0; p && i < n && i < max; i++) out[i] = (kvx_desc){p->regions[i].addr, p->regions[i].len};
  pthread_mutex_unlock(&a->mu);
  return n;
}

const char *kvx_peer_backend(kvx_agent *a, const char *peer) {
  pthread_mutex_lock(&a->mu);
  kvx_peer *p = kvx_peer_find(a, peer);
  const char *n = p ? kvx_backends[p->be]->name : NULL;
  pthread_mutex_unlock(&a->mu);
  return n;
}
