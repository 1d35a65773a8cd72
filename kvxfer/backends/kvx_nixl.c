// kvxfer/backends/kvx_nixl.c: the nixl backend's verbs: NIXL's C API (libnixl_capi.so, loaded with dlopen) with its UCX plugin moves the bytes; NIXL's metadata travels in kvxfer's metadata blob and the notification on kvxfer's authenticated connection.
//
// Per agent: one NIXL agent (same name) with one UCX backend. Every region kvxfer registers is registered with
// NIXL (DRAM, or VRAM on opts.cuda_device for CUDA memory). kvx_pack_md carries NIXL's own metadata blob (its UCX
// worker address and the remote keys of the registered regions) in the nixl section, so it reaches only the
// peers the application hands kvxfer's blob to (dserve: over the control connection, after the shared secret).
// A request runs on the core's connection worker: one NIXL transfer of the whole descriptor list, polled to
// completion (NIXL's UCX backend flushes the endpoint before it reports done: the bytes are in the peer's
// memory), then the notification as a WRITE_END/READ_END frame on the core's authenticated tcp connection, which
// the peer's listener queues like any other backend's.
//
// Where the library comes from: $DSERVE_NIXL_LIB (the path of libnixl_capi.so), else the nixl-cu12 wheel in the
// project venv ($DSERVE_VENV, else $DSERVE_CACHE/venv, else ~/.cache/dserve/venv: lib/python3*/site-packages/
// .nixl_cu12.mesonpy.libs/), else the loader's path. NIXL finds its plugins next to libnixl.so (plugins/, or
// $NIXL_PLUGIN_DIR); the UCX libraries come through the wheel's own rpath. The library is never dlclose'd: NIXL
// and UCX keep process-wide state and threads whose teardown at dlclose is not safe; dlopen's reference count
// makes later agents reuse it.
#include <dlfcn.h>
#include <glob.h>
#include <ifaddrs.h>
#include <arpa/inet.h>
#include <inttypes.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/backends/kvx_nixl_api.h"
#include "kvxfer/kvx_int.h"

typedef struct nixl_state {  // a->be_state[KVX_BE_NIXL]
  kvx_nixl_api api;
  nxa_agent agent;    // (owned)
  nxa_backend ucx;    // (owned)
  nxa_opt opt;        // (owned) optional arguments naming the UCX backend
  pthread_mutex_t mu;  // every call into NIXL: the agent is made without NIXL's own locking
  char lib[512];       // where libnixl_capi.so was found
} nixl_state;

static const char *nixl_why(int st) {
  switch (st) {
    case NXA_E_PARAM: return "invalid parameter";
    case NXA_E_BACKEND: return "backend error";
    case NXA_E_STATE: return "invalid state";
    case NXA_E_EXCEPTION: return "exception inside NIXL";
    case NXA_E_TELEMETRY: return "no telemetry";
    case NXA_E_NOT_FOUND: return "not found (peer metadata not loaded, or no backend serves the request)";
    default: return "unknown NIXL status";
  }
}

// ---- finding and loading the library ----
static void *try_open(const char *path, char *tried, size_t cap) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    size_t n = strlen(tried);
    if (n < cap) snprintf(tried + n, cap - n, "%s%s", n ? "; " : "", e ? e : path);
  }
  return h;
}

// The wheel in a venv: its libs folder under any python3.x's site-packages.
static void *open_in_venv(const char *venv, char *path, size_t pcap, char *tried, size_t cap) {
  char pat[600];
  snprintf(pat, sizeof pat, "%s/lib/python3*/site-packages/.nixl_cu1*.mesonpy.libs/libnixl_capi.so", venv);
  glob_t g;
  void *h = NULL;
  if (glob(pat, 0, NULL, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc && !h; i++)
      if ((h = try_open(g.gl_pathv[i], tried, cap))) snprintf(path, pcap, "%s", g.gl_pathv[i]);
    globfree(&g);
  }
  return h;
}

static void *open_lib(char *path, size_t pcap, char *err, size_t errlen) {
  char tried[768] = "";
  // The wheel bundles its own libibverbs and libnl-route for UCX's InfiniBand modules; dserve links the system's
  // (the rdma backend). With both in one process, the system libnl-route's destructor crashes at exit (seen:
  // SIGSEGV in rtnl_tc_unregister after every test passed). UCX reads its module list when libucs loads, from
  // its environment only, so unless the operator chose one, UCX loads only its cma and CUDA modules (tcp, posix,
  // sysv and self are built in). NIXL over InfiniBand in dserve: set UCX_MODULES yourself, at that risk; the
  // rdma backend is the supported path there. setenv before any NIXL thread exists (overwrite 0: never replaces).
  setenv("UCX_MODULES", "cma,cuda", 0);
  const char *env = getenv("DSERVE_NIXL_LIB");
  if (env && *env) {
    void *h = try_open(env, tried, sizeof tried);
    if (h) snprintf(path, pcap, "%s", env);
    else utl_seterr(err, errlen, "nixl: DSERVE_NIXL_LIB=%s does not load: %s", env, tried);
    return h;
  }
  char venv[400] = "";
  const char *v = getenv("DSERVE_VENV"), *c = getenv("DSERVE_CACHE"), *home = getenv("HOME");
  if (v && *v) snprintf(venv, sizeof venv, "%s", v);
  else if (c && *c) snprintf(venv, sizeof venv, "%s/venv", c);
  else if (home && *home) snprintf(venv, sizeof venv, "%s/.cache/dserve/venv", home);
  void *h = venv[0] ? open_in_venv(venv, path, pcap, tried, sizeof tried) : NULL;
  if (!h && (h = try_open("libnixl_capi.so", tried, sizeof tried))) snprintf(path, pcap, "libnixl_capi.so");
  if (!h)
    utl_seterr(err, errlen,
               "nixl: libnixl_capi.so not found (set DSERVE_NIXL_LIB to it, or let scripts/setup.sh install the "
               "nixl-cu12 wheel into %s): %s",
               venv[0] ? venv : "the venv", tried[0] ? tried : "no candidate");
  return h;
}

static int load_api(kvx_nixl_api *t, char *path, size_t pcap, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  if (!(t->lib = open_lib(path, pcap, err, errlen))) return -1;
  struct {
    const char *sym;
    void **fn;
  } syms[] = {
#define S(f) {"nixl_capi_" #f, (void **)&t->f}
      S(create_configured_agent), S(destroy_agent),       S(get_plugin_params),  S(destroy_mem_list),
      S(destroy_params),     S(params_add),          S(create_backend),     S(destroy_backend),
      S(create_opt_args),    S(destroy_opt_args),    S(opt_args_add_backend), S(get_local_md),
      S(load_remote_md),     S(invalidate_remote_md), S(create_reg_dlist),   S(destroy_reg_dlist),
      S(reg_dlist_add_desc), S(register_mem),        S(deregister_mem),     S(create_xfer_dlist),
      S(destroy_xfer_dlist), S(xfer_dlist_add_desc), S(create_xfer_req),    S(post_xfer_req),
      S(get_xfer_status),    S(release_xfer_req),    S(destroy_xfer_req),
#undef S
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].fn = dlsym(t->lib, syms[i].sym);
    if (!*syms[i].fn) {
      utl_seterr(err, errlen, "nixl: %s lacks %s (NIXL 1.5's C API expected)", path, syms[i].sym);
      return -1;  // the handle stays open (never closed: see the top of the file)
    }
  }
  return 0;
}

// Whether UCX_TLS names only shared-memory (and loopback) transports.
static int shm_only_tls(const char *tls) {
  if (!tls || !*tls || tls[0] == '^') return 0;
  static const char *const shm[] = {"shm", "sm", "posix", "sysv", "cma", "xpmem", "knem", "self", NULL};
  char buf[256];
  snprintf(buf, sizeof buf, "%s", tls);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int ok = 0;
    for (int i = 0; shm[i] && !ok; i++) ok = !strcmp(tok, shm[i]);
    if (!ok) return 0;
  }
  return 1;
}

// The interface holding the IPv4 address host: 0 and the name, 1 when host names every interface (0.0.0.0), -1 when no interface holds it.
static int iface_of(const char *host, char *name, size_t cap) {
  struct in_addr want;
  if (inet_pton(AF_INET, host, &want) != 1) return -1;
  if (want.s_addr == htonl(INADDR_ANY)) return 1;
  struct ifaddrs *ifs;
  if (getifaddrs(&ifs)) return -1;
  int rc = -1;
  for (struct ifaddrs *i = ifs; i && rc < 0; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == want.s_addr) {
      snprintf(name, cap, "%s", i->ifa_name);
      rc = 0;
    }
  freeifaddrs(ifs);
  return rc;
}

static void nixl_fini(kvx_agent *a) {
  nixl_state *s = a->be_state[KVX_BE_NIXL];
  if (!s) return;
  if (s->opt) s->api.destroy_opt_args(s->opt);
  // The agent owns its backends: destroying the agent tears the UCX backend down (destroy_backend frees only our
  // handle to it).
  if (s->ucx) s->api.destroy_backend(s->ucx);
  if (s->agent) s->api.destroy_agent(s->agent);
  pthread_mutex_destroy(&s->mu);
  free(s);
  a->be_state[KVX_BE_NIXL] = NULL;
}

static int nixl_init(kvx_agent *a, char *err, size_t errlen) {
  nixl_state *s = calloc(1, sizeof *s);
  if (!s) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  pthread_mutex_init(&s->mu, NULL);
  a->be_state[KVX_BE_NIXL] = s;
  kvx_nixl_api *t = &s->api;
  if (load_api(t, s->lib, sizeof s->lib, err, errlen)) {
    nixl_fini(a);
    return -1;
  }
  nxa_mems mems = NULL;
  nxa_params params = NULL;
  // NIXL's plain create_agent runs its progress thread with no delay: poll() with a zero timeout, a core per
  // agent spinning even when idle. With a delay, the thread sleeps until UCX signals work (or the delay passes:
  // NIXL's guard against missed wakeups).
  nxa_config cfg = {.prog_thread = true, .listen_thread = false, .listen_port = 0, .thread_sync = 0,
                    .num_workers = 1, .pthr_delay_us = 1000, .lthr_delay_us = 100000, .capture_telemetry = false};
  int st = t->create_configured_agent(a->name, &cfg, &s->agent);
  const char *step = "create_configured_agent";
  if (st == NXA_OK) st = t->get_plugin_params(s->agent, "UCX", &mems, &params), step = "get_plugin_params(UCX)";
  // UCX's tcp transport listens on every network device it uses: NET_DEVICES keeps it to the interface holding
  // the kvxfer host (UCX_NET_DEVICES in the environment wins: on an RDMA host, name the HCA there too).
  char dev[IF_NAMESIZE + 1] = "", ucx_cfg[64] = "";
  const char *ucx_devs = getenv("UCX_NET_DEVICES");
  if (st == NXA_OK && !(ucx_devs && *ucx_devs)) {
    int k = iface_of(a->listen_host, dev, sizeof dev);
    if (k == 0) {
      snprintf(ucx_cfg, sizeof ucx_cfg, "NET_DEVICES=%s", dev);
      st = t->params_add(params, "engine_config", ucx_cfg), step = "params_add(engine_config)";
    } else if (k < 0) {
      kvx_log(a, "nixl: no interface holds %s: UCX uses every network device (set UCX_NET_DEVICES to restrict it)",
              a->listen_host);
    }
  }
  // Shared-memory transports alone cannot report a dead peer, and UCX refuses its peer error mode without one:
  // then the mode is none and kvxfer's own deadline (nixl_run) is what fails a transfer to a dead peer.
  int shm_only = shm_only_tls(getenv("UCX_TLS"));
  if (st == NXA_OK && shm_only)
    st = t->params_add(params, "ucx_error_handling_mode", "none"), step = "params_add(ucx_error_handling_mode)";
  if (st == NXA_OK) st = t->create_backend(s->agent, "UCX", params, &s->ucx), step = "create_backend(UCX)";
  if (st == NXA_OK) st = t->create_opt_args(&s->opt), step = "create_opt_args";
  if (st == NXA_OK) st = t->opt_args_add_backend(s->opt, s->ucx), step = "opt_args_add_backend";
  if (params) t->destroy_params(params);
  if (mems) t->destroy_mem_list(mems);
  if (st != NXA_OK) {
    utl_seterr(err, errlen, "nixl: %s failed: %s (%d) (library %s; is the UCX plugin in its plugins/ folder?)", step,
               nixl_why(st), st, s->lib);
    nixl_fini(a);
    return -1;
  }
  kvx_log(a, "nixl: %s, UCX on %s%s", s->lib, ucx_devs && *ucx_devs ? ucx_devs : dev[0] ? dev : "every device",
          shm_only ? " (shared memory only: dead peers found by kvxfer's deadline)" : "");
  return 0;
}

// ---- memory ----
static uint64_t dev_of(const kvx_agent *a, int mem) { return mem == KVX_MEM_CUDA ? (uint64_t)a->cuda_device : 0; }

// Registers (reg = 1) or deregisters one region with NIXL (s->mu held).
static int reg_one(nixl_state *s, const kvx_region *r, uint64_t dev, int reg) {
  kvx_nixl_api *t = &s->api;
  nxa_rlist l = NULL;
  int st = t->create_reg_dlist(r->mem == KVX_MEM_CUDA ? NXA_MEM_VRAM : NXA_MEM_DRAM, &l);
  if (st == NXA_OK) st = t->reg_dlist_add_desc(l, (uintptr_t)r->addr, r->len, dev, NULL, 0);
  if (st == NXA_OK) st = reg ? t->register_mem(s->agent, l, s->opt) : t->deregister_mem(s->agent, l, s->opt);
  if (l) t->destroy_reg_dlist(l);
  return st;
}

static int nixl_reg(kvx_agent *a, kvx_region *r, char *err, size_t errlen) {
  nixl_state *s = a->be_state[KVX_BE_NIXL];
  uint64_t dev = dev_of(a, r->mem);
  pthread_mutex_lock(&s->mu);
  int st = reg_one(s, r, dev, 1);
  pthread_mutex_unlock(&s->mu);
  if (st != NXA_OK) {
    utl_seterr(err, errlen, "nixl: registering %s memory 0x%" PRIx64 "+%" PRIu64 " failed: %s (%d)",
               r->mem == KVX_MEM_CUDA ? "CUDA" : "host", r->addr, r->len, nixl_why(st), st);
    return -1;
  }
  r->word[KVX_BE_NIXL] = dev;  // the device id NIXL knows the region by; peers name it in their descriptors
  return 0;
}

static void nixl_dereg(kvx_agent *a, kvx_region *r) {
  nixl_state *s = a->be_state[KVX_BE_NIXL];
  pthread_mutex_lock(&s->mu);
  int st = reg_one(s, r, r->word[KVX_BE_NIXL], 0);
  pthread_mutex_unlock(&s->mu);
  if (st != NXA_OK) kvx_log(a, "nixl: deregistering 0x%" PRIx64 " failed: %s", r->addr, nixl_why(st));
}

// ---- metadata: the section is n_regions uint64 device ids (in a->regions order), the SHA-256 of NIXL's blob,
// then the blob ----
static int nixl_pack_md(kvx_agent *a, utl_buf *out, char *err, size_t errlen) {
  nixl_state *s = a->be_state[KVX_BE_NIXL];
  for (kvx_region *r = a->regions; r; r = r->next) utl_buf_add(out, &r->word[KVX_BE_NIXL], sizeof(uint64_t));
  void *md = NULL;
  size_t len = 0;
  pthread_mutex_lock(&s->mu);
  int st = s->api.get_local_md(s->agent, &md, &len);
  pthread_mutex_unlock(&s->mu);
  if (st != NXA_OK || !md || !len) {
    free(md);
    utl_seterr(err, errlen, "nixl: get_local_md failed: %s (%d)", nixl_why(st), st);
    return -1;
  }
  uint8_t dig[32];
  utl_sha256(md, len, dig);
  utl_buf_add(out, dig, sizeof dig);
  utl_buf_add(out, md, len);
  free(md);  // NIXL's C API mallocs it for the caller
  return 0;
}

static int nixl_load_md(kvx_agent *a, kvx_peer *p, const uint8_t *sec, size_t len, char *err, size_t errlen) {
  nixl_state *s = a->be_state[KVX_BE_NIXL];
  size_t words = p->n_regions * sizeof(uint64_t) + 32;
  if (len <= words) {
    utl_seterr(err, errlen, "metadata: nixl section of %zu bytes for %zu regions", len, p->n_regions);
    return -1;
  }
  if (!strcmp(p->name, a->name)) return 0;  // our own blob: the core refuses it with its own words
  // NIXL keeps half of a blob it failed to parse and then refuses that agent's good one: a damaged blob must
  // never reach it.
  uint8_t dig[32];
  utl_sha256(sec + words, len - words, dig);
  if (!utl_ct_equal(dig, sec + words - 32, 32)) {
    utl_seterr(err, errlen, "metadata: peer '%s''s nixl section is damaged (digest mismatch)", p->name);
    return -1;
  }
  for (size_t i = 0; i < p->n_regions; i++) memcpy(&p->regions[i].word[KVX_BE_NIXL], sec + i * 8, 8);
  char *name = NULL;
  pthread_mutex_lock(&s->mu);
  int st = s->api.load_remote_md(s->agent, sec + words, len - words, &name);
  if (st != NXA_OK) {
    // NIXL refuses a second blob for an agent it knows: forget the peer and load once more (a peer's new
    // metadata replaces the old).
    s->api.invalidate_remote_md(s->agent, p->name);
    st = s->api.load_remote_md(s->agent, sec + words, len - words, &name);
  }
  int same = st == NXA_OK && name && !strcmp(name, p->name);
  if (st == NXA_OK && !same && name) s->api.invalidate_remote_md(s->agent, name);
  pthread_mutex_unlock(&s->mu);
  if (st != NXA_OK)
    utl_seterr(err, errlen, "metadata: NIXL refused peer '%s''s nixl section: %s (%d)", p->name, nixl_why(st), st);
  else if (!same)
    utl_seterr(err, errlen, "metadata: the nixl section names agent '%s', the blob '%s'", name ? name : "?", p->name);
  free(name);
  return st == NXA_OK && same ? 0 : -1;
}

// ---- requests ----
static int nixl_check(const kvx_xfer *x, char *err, size_t errlen) {
  for (size_t i = 1; i < x->n_segs; i++)
    if (x->segs[i].lmem != x->segs[0].lmem || x->segs[i].rmem != x->segs[0].rmem) {
      utl_seterr(err, errlen, "nixl: a request mixes host and CUDA memory on one side (one NIXL list, one kind)");
      return -1;
    }
  return 0;
}

// Builds x's local and remote descriptor lists (s->mu held).
static int make_lists(nixl_state *s, const kvx_xfer *x, nxa_xlist *l, nxa_xlist *r) {
  kvx_nixl_api *t = &s->api;
  int lm = x->segs[0].lmem == KVX_MEM_CUDA ? NXA_MEM_VRAM : NXA_MEM_DRAM;
  int rm = x->segs[0].rmem == KVX_MEM_CUDA ? NXA_MEM_VRAM : NXA_MEM_DRAM;
  int st = t->create_xfer_dlist(lm, l);
  if (st == NXA_OK) st = t->create_xfer_dlist(rm, r);
  for (size_t i = 0; st == NXA_OK && i < x->n_segs; i++) {
    const kvx_seg *g = &x->segs[i];
    st = t->xfer_dlist_add_desc(*l, (uintptr_t)g->laddr, g->len, g->lword);
    if (st == NXA_OK) st = t->xfer_dlist_add_desc(*r, (uintptr_t)g->raddr, g->len, g->rword);
  }
  return st;
}

// Polling is what moves a transfer over UCX's tcp transport (each status call progresses the worker, which sends
// what the socket takes): sleeping between polls capped a 1 MiB WRITE at ~0.25 GB/s. So a wait spins, then
// yields the CPU between polls for this long, and only then sleeps in 50 us steps.
#define NIXL_YIELD_NS 20000000

// A transfer gets the agent's stall timeout plus its bytes at 100 MB/s: NIXL shows no progress short of done.
static int64_t deadline_ms(const kvx_agent *a, const kvx_xfer *x) {
  return utl_now_ms() + a->timeout_ms + (int64_t)(x->total / 100000);
}

static int nixl_run(kvx_conn *c, kvx_xfer *x, char *why, size_t cap) {
  kvx_agent *a = c->a;
  nixl_state *s = a->be_state[KVX_BE_NIXL];
  kvx_nixl_api *t = &s->api;
  nxa_xlist l = NULL, r = NULL;
  nxa_req q = NULL;
  pthread_mutex_lock(&s->mu);
  int st = make_lists(s, x, &l, &r);
  const char *step = "building descriptor lists";
  if (st == NXA_OK)
    st = t->create_xfer_req(s->agent, x->op == KVX_WRITE ? NXA_OP_WRITE : NXA_OP_READ, l, r, c->peer, &q, s->opt),
    step = "create_xfer_req";
  if (st == NXA_OK) st = t->post_xfer_req(s->agent, q, s->opt), step = "post_xfer_req";
  pthread_mutex_unlock(&s->mu);
  // Waits spin briefly (a small transfer completes in microseconds), then sleep in short steps.
  int64_t end = deadline_ms(a, x), t0 = utl_now_ns();
  while (st == NXA_IN_PROG) {
    int64_t waited = utl_now_ns() - t0;
    if (waited < KVX_SPIN_NS)
      kvx_cpu_relax();
    else if (waited < NIXL_YIELD_NS)
      sched_yield();
    else
      usleep(50);
    pthread_mutex_lock(&s->mu);
    st = t->get_xfer_status(s->agent, q);
    pthread_mutex_unlock(&s->mu);
    step = "transfer";
    if (st == NXA_IN_PROG && (utl_now_ms() > end || atomic_load(&a->closing))) break;
  }
  int leak = 0;
  pthread_mutex_lock(&s->mu);
  // Releasing an unfinished request asks NIXL to abort it; when it cannot, the handle is left to NIXL (the
  // memory behind it may still be written: the peer is presumed gone).
  if (q && t->release_xfer_req(s->agent, q) != NXA_OK && st == NXA_IN_PROG) leak = 1;
  if (q && !leak) t->destroy_xfer_req(q);
  if (l) t->destroy_xfer_dlist(l);
  if (r) t->destroy_xfer_dlist(r);
  pthread_mutex_unlock(&s->mu);
  if (st == NXA_IN_PROG) {
    utl_seterr(why, cap, "nixl: transfer of %" PRIu64 " bytes not done after %" PRId64 " ms (peer dead or stalled)%s",
               x->total, (utl_now_ns() - t0) / 1000000, leak ? "; NIXL could not abort it" : "");
    return -2;
  }
  if (st != NXA_OK) {
    utl_seterr(why, cap, "nixl: %s failed: %s (%d)", step, nixl_why(st), st);
    return -1;
  }
  // The bytes are in the peer's memory: the notification follows them on the authenticated connection.
  if (x->has_notif && kvx_conn_send_end(c, x, 0)) {
    utl_seterr(why, cap, "notification could not be sent (peer gone?)");
    return -2;
  }
  return 0;
}

// auto brings nixl up only where DSERVE_NIXL_LIB names the library: loading NIXL and UCX costs every agent time,
// threads and memory, and auto would pick nixl only for peers on other hosts; a library that merely sits in the
// venv is used by backend "nixl" alone.
static int nixl_auto_up(void) {
  const char *e = getenv("DSERVE_NIXL_LIB");
  return e && *e;
}

const kvx_backend kvx_nixl_backend = {
    .name = "nixl",
    .rank = 20,  // auto: other hosts without a shared rdma device, where the operator brought it up (nixl_auto_up)
    .caps = KVX_CAP_LOCAL | KVX_CAP_REMOTE | KVX_CAP_HOST | KVX_CAP_CUDA | KVX_CAP_AUTO_FAR | KVX_CAP_SOME_REGIONS,
    .auto_up = nixl_auto_up,
    .listener = KVX_LS_TCP,
    .init = nixl_init,
    .fini = nixl_fini,
    .reg = nixl_reg,
    .dereg = nixl_dereg,
    .pack_md = nixl_pack_md,
    .load_md = nixl_load_md,
    .check = nixl_check,
    .run = nixl_run,
};
