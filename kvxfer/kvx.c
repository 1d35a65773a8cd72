// kvxfer/kvx.c: the kvxfer core: agents, shareable host memory, registration, metadata blobs, backend choice
// (requests and notifications: kvx_xfer.c).
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

const kvx_backend *const kvx_backends[KVX_NBE] = {&kvx_tcp_backend, &kvx_shm_backend, &kvx_rdma_backend,
                                                    &kvx_nccl_backend};

// ---- small services ----
void kvx_log(kvx_agent *a, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (a->log)
    a->log(a->log_ud, line);
  else
    fprintf(stderr, "kvx[%s]: %s\n", a->name, line);
}

void kvx_auth_refused(kvx_agent *a, const char *fmt, ...) {
  char line[480];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  uint64_t n = atomic_fetch_add(&a->auth_failures, 1) + 1;
  kvx_log(a, "%s (%" PRIu64 " refused so far)", line, n);
}

uint64_t kvx_auth_failures(kvx_agent *a) { return a ? atomic_load(&a->auth_failures) : 0; }

int64_t kvx_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void kvx_signal(kvx_agent *a) {
  uint64_t one = 1;
  ssize_t r = write(a->efd, &one, sizeof one);
  (void)r;
}

int kvx_no_init(kvx_agent *a, char *err, size_t errlen) {
  (void)a;
  utl_seterr(err, errlen, "backend not available in this build");
  return -1;
}
void kvx_no_stop(kvx_agent *a) { (void)a; }
void kvx_no_fini(kvx_agent *a) { (void)a; }
int kvx_no_reg(kvx_agent *a, kvx_region *r, char *err, size_t errlen) {
  (void)a, (void)r, (void)err, (void)errlen;
  return 0;
}
void kvx_no_dereg(kvx_agent *a, kvx_region *r) { (void)a, (void)r; }
int kvx_no_post(kvx_agent *a, kvx_peer *p, kvx_xfer *x, char *err, size_t errlen) {
  (void)a, (void)p, (void)x;
  utl_seterr(err, errlen, "backend cannot transfer");
  return -1;
}
void kvx_no_drop(kvx_agent *a, kvx_peer *p, const char *why) { (void)a, (void)p, (void)why; }

typedef struct thread_arg {
  void *(*fn)(void *);
  void *arg;
} thread_arg;

static void *thread_main(void *p) {
  thread_arg t = *(thread_arg *)p;
  free(p);
  return t.fn(t.arg);
}

int kvx_thread_start(kvx_agent *a, void *(*fn)(void *), void *arg, char *err, size_t errlen) {
  thread_arg *t = malloc(sizeof *t);
  if (!t) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  t->fn = fn;
  t->arg = arg;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_mutex_lock(&a->thr_mu);
  a->threads++;
  pthread_mutex_unlock(&a->thr_mu);
  pthread_t th;
  int rc = pthread_create(&th, &at, thread_main, t);
  pthread_attr_destroy(&at);
  if (rc) {
    free(t);
    kvx_thread_exit(a);
    utl_seterr(err, errlen, "pthread_create: %s", strerror(rc));
    return -1;
  }
  return 0;
}

void kvx_thread_exit(kvx_agent *a) {
  pthread_mutex_lock(&a->thr_mu);
  a->threads--;
  pthread_cond_broadcast(&a->thr_cv);
  pthread_mutex_unlock(&a->thr_mu);
}

// ---- shareable host memory ----
// Layout: [header page | len bytes], one memfd mapped MAP_SHARED; the header says which fd backs it.
#define HOST_MAGIC 0x54534f48585643ull  // "CVXHOST"
typedef struct host_hdr {
  uint64_t magic, size, fd;
} host_hdr;

void *kvx_host_alloc(size_t len, char *err, size_t errlen) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  if (len == 0 || len > ((size_t)1 << 46)) {
    utl_seterr(err, errlen, "kvx_host_alloc: bad length %zu", len);
    return NULL;
  }
  size_t sz = (len + pg - 1) / pg * pg;
  int fd = memfd_create("kvx-host", MFD_CLOEXEC);
  if (fd < 0) {
    utl_seterr(err, errlen, "memfd_create: %s", strerror(errno));
    return NULL;
  }
  if (ftruncate(fd, (off_t)(sz + pg)) < 0) {
    utl_seterr(err, errlen, "ftruncate %zu: %s", sz + pg, strerror(errno));
    close(fd);
    return NULL;
  }
  uint8_t *m = mmap(NULL, sz + pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    utl_seterr(err, errlen, "mmap %zu: %s", sz + pg, strerror(errno));
    close(fd);
    return NULL;
  }
  host_hdr *h = (host_hdr *)m;
  h->magic = HOST_MAGIC;
  h->size = len;
  h->fd = (uint64_t)fd;
  return m + pg;
}

void kvx_host_free(void *p, size_t len) {
  if (!p) return;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  uint8_t *m = (uint8_t *)p - pg;
  host_hdr *h = (host_hdr *)m;
  int fd = (int)h->fd;
  if (h->magic != HOST_MAGIC) return;  // not from kvx_host_alloc: leave it alone
  (void)len;  // the header knows the size
  size_t sz = (h->size + pg - 1) / pg * pg;
  munmap(m, sz + pg);
  close(fd);
}

// If [addr, addr+len) is a whole kvx_host_alloc allocation, fills its fd.
static int host_lookup(uint64_t addr, uint64_t len, int *fd, uint64_t *size) {
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return 0;
  char line[512];
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long long lo, hi, off;
    int name_at = 0;
    if (sscanf(line, "%llx-%llx %*s %llx %*s %*s %n", &lo, &hi, &off, &name_at) < 3 || !name_at) continue;
    if (addr - pg != lo || off != 0) continue;
    if (strncmp(line + name_at, "/memfd:kvx-host", 15)) break;
    host_hdr *h = (host_hdr *)(uintptr_t)lo;
    if (h->magic == HOST_MAGIC && h->size == len && hi - lo >= len + pg) {
      *fd = (int)h->fd;
      *size = h->size;
      found = 1;
    }
    break;
  }
  fclose(f);
  return found;
}

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

kvx_agent *kvx_agent_new(const char *name, const kvx_opts *opts, char *err, size_t errlen) {
  kvx_opts o = {0};
  if (opts) o = *opts;
  if (!name || !kvx_valid_name(name)) {
    utl_seterr(err, errlen, "kvx_agent_new: bad agent name (1..63 of [A-Za-z0-9._-])");
    return NULL;
  }
  const char *be = o.backend ? o.backend : "auto";
  if (strcmp(be, "auto") && be_index(be) < 0) {
    utl_seterr(err, errlen, "kvx_agent_new: unknown backend '%s' (tcp, shm, rdma, nccl, auto)", be);
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
  a->secret_len = strlen(sec);
  memcpy(a->secret, sec, a->secret_len);
  a->cuda_device = o.cuda_device;
  const char *sd = o.shm_dir ? o.shm_dir : getenv("TMPDIR");
  snprintf(a->shm_dir, sizeof a->shm_dir, "%s", sd && *sd ? sd : "/tmp");
  a->log = o.log;
  a->log_ud = o.log_ud;
  read_host_id(a->host_id, sizeof a->host_id);
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  pthread_mutex_init(&a->thr_mu, NULL);
  pthread_cond_init(&a->thr_cv, NULL);
  pthread_rwlock_init(&a->reg_lock, NULL);
  a->next_id = 1;
  a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (a->efd < 0) {
    utl_seterr(err, errlen, "eventfd: %s", strerror(errno));
    kvx_agent_free(a);
    return NULL;
  }
  // Which backends to bring up: the one asked for (plus tcp as the side channel for rdma/nccl), or for auto
  // every one that works here (tcp must).
  int want[KVX_NBE] = {0}, must[KVX_NBE] = {0};
  if (!strcmp(be, "auto")) {
    want[KVX_BE_TCP] = must[KVX_BE_TCP] = 1;
    want[KVX_BE_SHM] = want[KVX_BE_RDMA] = 1;
  } else {
    int i = be_index(be);
    want[i] = must[i] = 1;
    if (i == KVX_BE_RDMA || i == KVX_BE_NCCL) want[KVX_BE_TCP] = must[KVX_BE_TCP] = 1;
  }
  // The named backend first, so that its error (e.g. "no RDMA device") is the one reported.
  int order[KVX_NBE] = {KVX_BE_RDMA, KVX_BE_NCCL, KVX_BE_TCP, KVX_BE_SHM};
  for (int k = 0; k < KVX_NBE; k++) {
    int i = order[k];
    if (!want[i]) continue;
    char e[256] = "";
    if (kvx_backends[i]->init(a, e, sizeof e) == 0) {
      a->enabled |= 1u << i;
    } else if (must[i]) {
      utl_seterr(err, errlen, "%s", e);
      kvx_agent_free(a);
      return NULL;
    }
  }
  return a;
}

static void peer_free(kvx_peer *p) {
  if (!p) return;
  free(p->regions);
  free(p);
}

void kvx_agent_free(kvx_agent *a) {
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  a->closing = 1;
  kvx_peer *peers = a->peers;
  a->peers = NULL;
  for (kvx_peer *p = peers; p; p = p->next)
    for (int i = 0; i < KVX_NBE; i++)
      if (a->enabled & (1u << i)) kvx_backends[i]->drop(a, p, "agent closing");
  pthread_mutex_unlock(&a->mu);
  for (int i = 0; i < KVX_NBE; i++)
    if (a->enabled & (1u << i)) kvx_backends[i]->stop(a);
  pthread_mutex_lock(&a->thr_mu);
  while (a->threads > 0) pthread_cond_wait(&a->thr_cv, &a->thr_mu);
  pthread_mutex_unlock(&a->thr_mu);
  while (peers) {
    kvx_peer *n = peers->next;
    peer_free(peers);
    peers = n;
  }
  while (a->regions) {
    kvx_region *r = a->regions;
    a->regions = r->next;
    for (int i = 0; i < KVX_NBE; i++)
      if (a->enabled & (1u << i)) kvx_backends[i]->dereg(a, r);
    free(r);
  }
  for (int i = 0; i < KVX_NBE; i++)
    if (a->enabled & (1u << i)) kvx_backends[i]->fini(a);
  for (size_t k = 0; k < a->n_notifs; k++) free(a->notifs[(a->head_notifs + k) % a->cap_notifs].msg);
  free(a->notifs);
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
int kvx_agent_port(const kvx_agent *a) { return (a->enabled & (1u << KVX_BE_TCP)) ? a->listen_port : 0; }

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
  r->shm_fd = -1;
  if (getrandom(&r->key, sizeof r->key, 0) != sizeof r->key) r->key = (uint64_t)kvx_now_ms() ^ r->addr;
  if (mem == KVX_MEM_HOST) {
    int fd;
    uint64_t sz;
    if (host_lookup(r->addr, len, &fd, &sz)) {
      r->shm_fd = fd;
      r->shm_off = (uint64_t)sysconf(_SC_PAGESIZE);
      r->shm_size = sz;
    }
  }
  for (int i = 0; i < KVX_NBE; i++) {
    if (!(a->enabled & (1u << i))) continue;
    char e[256] = "";
    if (kvx_backends[i]->reg(a, r, e, sizeof e)) {
      if (!strcmp(a->backend, "auto") && i == KVX_BE_RDMA) {  // auto: the region still serves shm/tcp
        kvx_log(a, "%s; region %p+%zu will not be reachable over rdma", e, addr, len);
        continue;
      }
      utl_seterr(err, errlen, "%s", e);
      for (int j = 0; j < i; j++)
        if (a->enabled & (1u << j)) kvx_backends[j]->dereg(a, r);
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
    if (a->enabled & (1u << i)) kvx_backends[i]->dereg(a, r);
  free(r);
}

kvx_region *kvx_find_local(kvx_agent *a, uint64_t addr, uint64_t len) {
  for (kvx_region *r = a->regions; r; r = r->next)
    if (addr >= r->addr && len <= r->len && addr - r->addr <= r->len - len) return r;
  return NULL;
}

kvx_region *kvx_check_access(kvx_agent *a, uint64_t key, uint64_t addr, uint64_t len, char *why, size_t cap) {
  for (kvx_region *r = a->regions; r; r = r->next) {
    if (r->key != key) continue;
    if (addr >= r->addr && len <= r->len && addr - r->addr <= r->len - len) return r;
    utl_seterr(why, cap, "out-of-range access 0x%" PRIx64 "+%" PRIu64 " outside region 0x%" PRIx64 "+%" PRIu64, addr,
                len, r->addr, r->len);
    return NULL;
  }
  utl_seterr(why, cap, "unknown region key 0x%016" PRIx64, key);
  return NULL;
}

// ---- metadata ----
#define MD_MAGIC 0x4d58564bu  // "KVXM"
#define MD_VERSION 1u
typedef struct md_head {
  uint32_t magic, version;
  char name[KVX_MAX_NAME];
  char host_id[96];
  uint32_t backends;
  uint32_t tcp_port;
  char tcp_host[64];
  char shm_path[108];
  uint32_t n_regions;
  uint32_t pad, pad2;
} md_head;
_Static_assert(sizeof(md_head) % 8 == 0, "regions after the header stay 8-byte aligned");
typedef struct md_region {
  uint64_t key, addr, len;
  uint32_t mem, flags, rkey, pad;
} md_region;

const char *kvx_shm_path(kvx_agent *a);  // kvx_shm.c

int kvx_pack_md(kvx_agent *a, void **blob, size_t *len, char *err, size_t errlen) {
  *blob = NULL;
  *len = 0;
  pthread_rwlock_rdlock(&a->reg_lock);
  size_t n = 0;
  for (kvx_region *r = a->regions; r; r = r->next) n++;
  size_t sz = sizeof(md_head) + n * sizeof(md_region);
  uint8_t *b = calloc(1, sz);
  if (!b) {
    pthread_rwlock_unlock(&a->reg_lock);
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  md_head *h = (md_head *)b;
  h->magic = MD_MAGIC;
  h->version = MD_VERSION;
  snprintf(h->name, sizeof h->name, "%s", a->name);
  snprintf(h->host_id, sizeof h->host_id, "%s", a->host_id);
  h->backends = a->enabled;
  h->tcp_port = (uint32_t)kvx_agent_port(a);
  snprintf(h->tcp_host, sizeof h->tcp_host, "%s", a->advertise_host);
  if (a->enabled & (1u << KVX_BE_SHM)) snprintf(h->shm_path, sizeof h->shm_path, "%s", kvx_shm_path(a));
  h->n_regions = (uint32_t)n;
  md_region *m = (md_region *)(b + sizeof *h);
  for (kvx_region *r = a->regions; r; r = r->next, m++) {
    m->key = r->key;
    m->addr = r->addr;
    m->len = r->len;
    m->mem = (uint32_t)r->mem;
    m->flags = r->shm_fd >= 0 ? KVX_RF_SHM : 0;
    m->rkey = r->rkey;
  }
  pthread_rwlock_unlock(&a->reg_lock);
  *blob = b;
  *len = sz;
  return 0;
}

static int str_ok(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

kvx_peer *kvx_peer_find(kvx_agent *a, const char *name) {
  for (kvx_peer *p = a->peers; p; p = p->next)
    if (!strcmp(p->name, name)) return p;
  return NULL;
}

// Picks the backend for p (a->mu held); -1 with err when none fits.
static int choose_backend(kvx_agent *a, const kvx_peer *p, char *err, size_t errlen) {
  uint32_t both = a->enabled & p->backends;
  int same_host = !strcmp(a->host_id, p->host_id);
  if (strcmp(a->backend, "auto")) {
    int i = be_index(a->backend);
    if (!(both & (1u << i))) {
      utl_seterr(err, errlen, "peer '%s' does not offer the %s backend", p->name, a->backend);
      return -1;
    }
    if (i == KVX_BE_SHM && !same_host) {
      utl_seterr(err, errlen, "peer '%s' is on another host (%s): shm needs one host", p->name, p->host_id);
      return -1;
    }
    return i;
  }
  if ((both & (1u << KVX_BE_SHM)) && same_host) return KVX_BE_SHM;
  if (both & (1u << KVX_BE_RDMA)) return KVX_BE_RDMA;
  if (both & (1u << KVX_BE_TCP)) return KVX_BE_TCP;
  utl_seterr(err, errlen, "no backend in common with peer '%s'", p->name);
  return -1;
}

int kvx_load_remote_md(kvx_agent *a, const void *blob, size_t len, char *peer_name_out, size_t cap, char *err,
                       size_t errlen) {
  const uint8_t *b = blob;
  md_head h;
  if (!blob || len < sizeof h) {
    utl_seterr(err, errlen, "metadata: truncated (%zu bytes)", len);
    return -1;
  }
  memcpy(&h, b, sizeof h);
  if (h.magic != MD_MAGIC || h.version != MD_VERSION) {
    utl_seterr(err, errlen, "metadata: not a kvxfer v%u blob", MD_VERSION);
    return -1;
  }
  if (!str_ok(h.name, sizeof h.name) || !kvx_valid_name(h.name) || !str_ok(h.host_id, sizeof h.host_id) ||
      !str_ok(h.tcp_host, sizeof h.tcp_host) || !str_ok(h.shm_path, sizeof h.shm_path) || h.tcp_port > 65535 ||
      (h.backends >> KVX_NBE)) {
    utl_seterr(err, errlen, "metadata: malformed header");
    return -1;
  }
  if (h.n_regions > (len - sizeof h) / sizeof(md_region) || len != sizeof h + h.n_regions * sizeof(md_region)) {
    utl_seterr(err, errlen, "metadata: length %zu does not match %u regions", len, h.n_regions);
    return -1;
  }
  kvx_peer *p = calloc(1, sizeof *p);
  if (!p || !(p->regions = calloc(h.n_regions ? h.n_regions : 1, sizeof *p->regions))) {
    peer_free(p);
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  memcpy(p->name, h.name, sizeof p->name);
  memcpy(p->host_id, h.host_id, sizeof p->host_id);
  memcpy(p->tcp_host, h.tcp_host, sizeof p->tcp_host);
  memcpy(p->shm_path, h.shm_path, sizeof p->shm_path);
  p->tcp_port = (int)h.tcp_port;
  p->backends = h.backends;
  p->n_regions = h.n_regions;
  for (uint32_t i = 0; i < h.n_regions; i++) {
    md_region m;
    memcpy(&m, b + sizeof h + i * sizeof m, sizeof m);
    if (m.len == 0 || m.addr + m.len < m.addr || m.mem > KVX_MEM_CUDA) {
      peer_free(p);
      utl_seterr(err, errlen, "metadata: region %u is malformed", i);
      return -1;
    }
    p->regions[i] = (kvx_rregion){m.key, m.addr, m.len, m.mem, m.flags, m.rkey};
  }
  if (!strcmp(p->name, a->name)) {
    peer_free(p);
    utl_seterr(err, errlen, "metadata: that is this agent's own blob ('%s')", a->name);
    return -1;
  }
  pthread_mutex_lock(&a->mu);
  int be = choose_backend(a, p, err, errlen);
  if (be < 0) {
    pthread_mutex_unlock(&a->mu);
    peer_free(p);
    return -1;
  }
  p->be = be;
  kvx_peer *old = kvx_peer_find(a, p->name);
  if (old) {
    // Same endpoints and backend: keep the connections, take the new region list.
    if (old->be == p->be && !strcmp(old->tcp_host, p->tcp_host) && old->tcp_port == p->tcp_port &&
        !strcmp(old->shm_path, p->shm_path)) {
      kvx_rregion *t = old->regions;
      old->regions = p->regions;
      old->n_regions = p->n_regions;
      p->regions = t;
      memcpy(old->host_id, p->host_id, sizeof old->host_id);
      old->backends = p->backends;
      peer_free(p);
      p = NULL;
    } else {
      for (kvx_peer **pp = &a->peers; *pp; pp = &(*pp)->next)
        if (*pp == old) {
          *pp = old->next;
          break;
        }
      for (int i = 0; i < KVX_NBE; i++)
        if (a->enabled & (1u << i)) kvx_backends[i]->drop(a, old, "peer metadata replaced");
      peer_free(old);
    }
  }
  if (p) {
    p->next = a->peers;
    a->peers = p;
  }
  pthread_mutex_unlock(&a->mu);
  if (peer_name_out && cap) snprintf(peer_name_out, cap, "%s", h.name);
  return 0;
}

void kvx_invalidate_peer(kvx_agent *a, const char *peer) {
  pthread_mutex_lock(&a->mu);
  for (kvx_peer **pp = &a->peers; *pp; pp = &(*pp)->next) {
    if (strcmp((*pp)->name, peer)) continue;
    kvx_peer *p = *pp;
    *pp = p->next;
    for (int i = 0; i < KVX_NBE; i++)
      if (a->enabled & (1u << i)) kvx_backends[i]->drop(a, p, "peer invalidated");
    peer_free(p);
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
    for (int i = 0; i < KVX_NBE; i++)
      if (a->enabled & (1u << i)) kvx_backends[i]->drop(a, p, "peer endpoint changed");
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
