// worker/shell.c: the bring-up, teardown and control-message dispatch every worker process shares.
#include "worker/shell.h"
#include "proto/hello.h"
#include "proto/proto.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "kv/pool.h"
#include "kv/wire.h"
#include "worker/trace.h"

// The hub's hello_extra: what a router and a peer worker read from every worker's hello_ok, then the role's
// own fields. The router reads kv_layout.block_size for its prefix keys; a peer checks the layout matches.
static void shell_hello(void *arg, cJSON *ok) {
  wrk_shell *sh = arg;
  prt_hello_ok m = {.has_worker = 1, .n_ctx = sh->rt->n_ctx, .n_vocab = mdl_tok_n_vocab(sh->rt->tok),
                    .total_blocks = kv_pool_total_blocks(sh->rt->kv), .has_layout = 1,
                    .kv_layout = kv_wire_layout(sh->rt->kv)};
  if (prt_hello_ok_add_worker(ok, &m)) // the hello has no way to fail from here: the peer refuses the short hello_ok
    utl_err(sh->wc->name, "out of memory writing the hello_ok's worker fields");
  if (sh->o.hello_extra) sh->o.hello_extra(sh->o.worker, ok);
}

// The kvxfer agent, listening where wc says (its own host, else the control host), and what it registers of
// the pool: the pool itself, or its host mirror (kv_stage_open).
static int open_kvx(wrk_shell *sh, char *err, size_t errlen) {
  const cfg_worker *wc = sh->wc;
  kvx_opts o = {.backend = wc->kvx_backend[0] ? wc->kvx_backend : "auto",
                .listen_host = wc->kvx_host[0] ? wc->kvx_host : wc->host,
                .listen_port = wc->kvx_port,
                .secret = sh->cfg->secret,
                .plaintext = wc->kvx_plaintext,
                .cuda_device = strncmp(wc->device, "cuda:", 5) ? 0 : atoi(wc->device + 5)};
  sh->kvx = kvx_agent_new(wc->name, &o, err, errlen);
  if (!sh->kvx) return -1;
  return kv_stage_open(sh->kvx, sh->rt->kv, &sh->rt->kc, wc, &sh->stage, &sh->kv_region, err, errlen);
}

// This worker's record in etcd: where it listens (the ports it bound), its model's fingerprint, its capacity and a
// new incarnation (its start time in us), so that a restart reads as a new member.
static int join_cluster(wrk_shell *sh, char *err, size_t errlen) {
  const wrk_runtime *rt = sh->rt;
  const cfg_worker *wc = rt->w;
  if (!wc->host[0] || !strcmp(wc->host, "0.0.0.0")) { // what it registers is where the others connect
    snprintf(err, errlen, "worker %s: with discovery its host must be an address the router and peers reach, not '%s'",
             wc->name, wc->host);
    return -1;
  }
  dsc_member m = {.role = wc->role, .port = ctl_hub_port(sh->hub), .kvx_port = sh->kvx ? kvx_agent_port(sh->kvx) : 0,
                  .max_seqs = wc->max_seqs, .total_blocks = kv_pool_total_blocks(rt->kv)};
  snprintf(m.name, sizeof m.name, "%s", wc->name);
  snprintf(m.host, sizeof m.host, "%s", wc->host);
  if (sh->kvx) snprintf(m.kvx_host, sizeof m.kvx_host, "%s", wc->kvx_host[0] ? wc->kvx_host : wc->host);
  mdl_str arch = {0};
  mdl_gguf_get_str(rt->gguf, "general.architecture", &arch);
  snprintf(m.fp.arch, sizeof m.fp.arch, "%.*s", (int)arch.n, arch.p ? arch.p : "");
  snprintf(m.fp.kv_type, sizeof m.fp.kv_type, "%s", wc->kv_type[0] ? wc->kv_type : "f16");
  m.fp.block_size = wc->block_size;
  if (sh->cfg->model_null) snprintf(m.fp.file_hash, sizeof m.fp.file_hash, "null"); // no file: the build's vocabulary
  else if (dsc_file_hash(sh->cfg->model_path, m.fp.file_hash, sizeof m.fp.file_hash, err, errlen)) return -1;
  struct timeval tv;
  gettimeofday(&tv, NULL);
  m.incarnation = (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
  if (sh->o.watch_peers && wrk_peers_open(&sh->cfg->discovery, &m.fp, wc->name, &sh->peers, err, errlen)) return -1;
  return dsc_registrar_start(&sh->cfg->discovery, &m, wc->name, &sh->reg, err, errlen);
}

int wrk_shell_open(wrk_shell *sh, const cfg_cluster *cfg, const cfg_worker *wc, const wrk_shell_opts *o,
                   char *err, size_t errlen) {
  memset(sh, 0, sizeof *sh);
  sh->cfg = cfg;
  sh->wc = wc;
  sh->o = *o;
  // Before any thread starts (the runtime's compute pool, kvxfer's, the hub's), so all of them inherit the
  // blocked mask and only the signal thread ever sees SIGTERM/SIGINT.
  wrk_signals_block(&sh->sig);
  if (wrk_runtime_open(cfg, wc, o->shareable_kv, &sh->rt, err, errlen)) return -1;
  if (o->kvxfer && open_kvx(sh, err, errlen)) goto fail;
  if (wrk_trace_open(sh, err, errlen)) goto fail;
  // Last, so that a peer's hello never finds the runtime or the kvxfer agent missing (shell_hello reads them).
  ctl_hub_opts ho = {.name = wc->name, .role = o->role, .secret = cfg->secret, .host = wc->host, .port = wc->port,
                     .hello_extra = shell_hello, .hello_arg = sh};
  if (ctl_hub_new(&ho, &sh->hub, err, errlen)) goto fail;
  if (wrk_signals_start(&sh->sig, sh->hub)) {
    snprintf(err, errlen, "worker %s: cannot start the signal thread", wc->name);
    goto fail;
  }
  if (cfg->has_discovery && join_cluster(sh, err, errlen)) goto fail;
  return 0;
fail:
  wrk_shell_close(sh);
  return -1;
}

void wrk_shell_close(wrk_shell *sh) {
  dsc_registrar_stop(sh->reg);
  wrk_peers_close(sh->peers);
  sh->reg = NULL;
  sh->peers = NULL;
  kv_events_fini(&sh->kvev);
  ctl_hub_free(sh->hub);
  kvx_agent_free(sh->kvx);
  kv_stage_free(sh->stage); // after the agent: its threads may still be writing into the mirror
  wrk_trace_close(sh);       // posts the spans that still wait
  wrk_runtime_close(sh->rt);
  sh->hub = NULL;
  sh->kvx = NULL;
  sh->kv_region = NULL;
  sh->stage = NULL;
  sh->rt = NULL;
}

int wrk_shell_peer(const wrk_shell *sh, const char *name, cfg_worker *out) {
  const cfg_worker *w = cfg_find_worker(sh->cfg, name);
  if (w) *out = *w;
  return w || (sh->peers && wrk_peers_find(sh->peers, name, out));
}

void wrk_shell_announce(const wrk_shell *sh) {
  const wrk_runtime *rt = sh->rt;
  char kernels[160];
  krn_describe(rt->kc.be, kernels, sizeof kernels);
  utl_log(sh->wc->name, "%s worker listening on %s:%d (%d KV blocks, kernels: %s, %d threads%s%s)", sh->o.role, sh->wc->host, ctl_hub_port(sh->hub), kv_pool_total_blocks(rt->kv),
          kernels, krn_pool_threads(rt->pool), sh->kvx ? ", kvxfer " : "",
          sh->kvx ? kvx_agent_backend(sh->kvx) : "");
}

cJSON *wrk_shell_stats_new(const wrk_shell *sh, prt_stats_ok *st) {
  st->free_blocks = kv_pool_free_blocks(sh->rt->kv);
  st->total_blocks = kv_pool_total_blocks(sh->rt->kv);
  // Running total of refused control and kvxfer connections (each also logged with the peer's address).
  st->auth_failures = (double)ctl_hub_auth_failures(sh->hub) + (double)kvx_auth_failures(sh->kvx);
  if (sh->tracer) { // its spans dropped on a full export queue: the router's dserve:trace_spans_dropped_total
    unsigned long long done, dropped, failed;
    utl_tracer_counts(sh->tracer, &done, &dropped, &failed);
    st->trace_spans_dropped = (double)dropped;
  }
  return prt_stats_ok_encode(st, NULL, 0);
}

// link_refused: a router that will give this worker no link says why (its model is not this one's), then closes. Every
// role hears it here: the operator of this worker must see it in this worker's log, not only in the router's.
static void on_refused(wrk_shell *sh, const ctl_event *ev) {
  prt_refused r;
  char why[128];
  if (prt_refused_decode(ev->msg, &r, why, sizeof why)) {
    utl_warn(sh->wc->name, "router %s sent a malformed refusal: %s", ctl_peer_name(ev->peer), why);
    return;
  }
  utl_err(sh->wc->name, "REFUSED by router '%s': %s; this worker gets no link and no work from that router until its "
          "record changes (serve the router's model, or register in another cluster)", ctl_peer_name(ev->peer),
          r.reason);
}

static void dispatch(wrk_shell *sh, const ctl_event *ev) {
  // ctl_frame_recv passes on only JSON objects whose "op" is a string.
  const char *op = prt_op(ev->msg);
  if (!strcmp(op, PRT_OP_REFUSED)) {
    on_refused(sh, ev);
    return;
  }
  for (size_t i = 0; i < sh->o.n_ops; i++)
    if (!strcmp(sh->o.ops[i].op, op)) {
      if (sh->o.ops[i].fn) sh->o.ops[i].fn(sh->o.worker, ev->peer, ev->msg);
      return;
    }
  utl_warn(sh->wc->name, "ignoring control message '%s' from %s", op, ctl_peer_name(ev->peer));
}

int wrk_shell_drain(wrk_shell *sh, int wait_ms, kv_prefix *prefix) {
  ctl_event ev;
  int n = 0;
  for (int first = 1; ctl_hub_next(sh->hub, &ev, first ? wait_ms : 0) == 1; first = 0, n++) {
    kv_events_on_event(&sh->kvev, &ev, prefix);
    if (!ev.msg) {
      if (sh->o.on_close) sh->o.on_close(sh->o.worker, ev.peer);
    } else {
      dispatch(sh, &ev);
    }
    ctl_event_done(&ev);
  }
  return n;
}
