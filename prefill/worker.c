// prefill/worker.c: computes prompts in chunked batches and pushes each layer's KV to the decode worker
// as soon as that layer is done, then sends the first token (docs/protocol.md, "Handoff").
#include "prefill/worker.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvxfer/kvx.h"
#include "models/sampler.h"
#include "models/tokenizer.h"
#include "server/engine.h"
#include "server/genreq.h"
#include "server/hub.h"
#include "server/kvevents.h"
#include "server/kvpool.h"
#include "server/kvwire.h"
#include "server/runtime.h"

#define LINK_TIMEOUT_MS 5000   // connecting to a decode worker
#define TABLE_TIMEOUT_MS (30000 * DSERVE_TIMEOUT_SCALE) // a decode worker that never sends the block table

// One decode worker this prefill worker pushes to.
typedef struct pfl_link {
  char name[64];
  srv_peer *peer;         // (owned reference) our control connection to it
  srv_kv_remote remote;   // its pool
  char kvx_peer[KVX_MAX_NAME];
} pfl_link;

typedef struct pfl_req {
  srv_seq seq;            // the prompt in our own pool
  srv_genreq req;
  srv_peer *router;       // (owned reference)
  pfl_link *link;         // (borrowed)
  mdl_sampler *sampler;   // (owned) for the first token
  int32_t *remote;        // (owned) (n_remote) the decode worker's blocks for this prompt
  int n_remote;
  int have_table;
  int live;               // the table was known when the current step began: push layer by layer
  int pushed_blocks;      // leading blocks already pushed for every layer
  int step_b0, step_b1;   // blocks this step completes: [b0, b1)
  kvx_xfer **xf;          // (owned) (n_xf) posted writes; our blocks stay until they finish
  int n_xf, cap_xf;
  int computed;           // the prompt is done and first holds the first token
  mdl_sampled first;
  int failed;
  int handed_off;         // nothing left to do but let the posted writes finish (then reap frees it)
  int64_t table_deadline_ms, deadline_ms;
} pfl_req;

typedef struct pfl_worker {
  srv_runtime *rt;        // (owned)
  srv_hub *hub;           // (owned)
  srv_engine eng;
  kvx_agent *kvx;         // (owned)
  kvx_region *kv_region;  // (owned by kvx)
  pfl_link *links;        // (owned) (n_links)
  int n_links;
  srv_kvevents kvev;      // connected routers, told of the prefix store's changes (kv_events)
  srv_signals sig;
  const srv_config *cfg;  // (borrowed)
  double bytes_pushed;
  // Block tables that arrived before their request: the router's generate and the decode worker's
  // kv_table travel on different connections, so either may come first.
  struct early_table {
    cJSON *msg;           // (owned)
    srv_peer *from;       // (owned reference)
    int64_t expires_ms;
  } *early;               // (owned) (n_early)
  int n_early, cap_early;
} pfl_worker;

#define OWNER(sq) ((pfl_req *)(sq)->owner)

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int block_size(const pfl_worker *w) { return srv_kvpool_kv(w->rt->kv)->block_size; }

// ---- links to decode workers ----

static pfl_link *link_for(pfl_worker *w, const char *decode, char *err, size_t errlen) {
  for (int i = 0; i < w->n_links; i++)
    if (!strcmp(w->links[i].name, decode)) {
      if (srv_peer_alive(w->links[i].peer)) return &w->links[i];
      srv_peer_unref(w->links[i].peer); // reconnect below
      w->links[i].peer = NULL;
    }
  const srv_worker_cfg *d = srv_config_worker(w->cfg, decode);
  if (!d || d->role != SRV_ROLE_DECODE) {
    snprintf(err, errlen, "'%s' is not a decode worker of this cluster", decode);
    return NULL;
  }
  pfl_link *l = NULL;
  for (int i = 0; i < w->n_links; i++)
    if (!strcmp(w->links[i].name, decode)) l = &w->links[i];
  if (!l) {
    pfl_link *nl = realloc(w->links, (size_t)(w->n_links + 1) * sizeof *nl);
    if (!nl) {
      snprintf(err, errlen, "out of memory");
      return NULL;
    }
    w->links = nl;
    l = &w->links[w->n_links++];
    memset(l, 0, sizeof *l);
    snprintf(l->name, sizeof l->name, "%s", decode);
  }
  l->peer = srv_hub_connect(w->hub, d->host, d->port, LINK_TIMEOUT_MS, err, errlen);
  if (!l->peer) return NULL;
  const cJSON *hello = srv_peer_hello(l->peer);
  if (srv_kvwire_read_layout(hello, w->rt->kv, &l->remote, err, errlen) ||
      srv_kvwire_load_md(hello, w->kvx, l->kvx_peer, sizeof l->kvx_peer, err, errlen)) {
    srv_peer_close(l->peer);
    srv_peer_unref(l->peer);
    l->peer = NULL;
    return NULL;
  }
  fprintf(stderr, "dserve %s: linked to decode worker %s (kvxfer %s)\n", w->rt->w->name, decode,
          kvx_peer_backend(w->kvx, l->kvx_peer) ? kvx_peer_backend(w->kvx, l->kvx_peer) : "?");
  return l;
}

// ---- requests ----

static void req_free(pfl_worker *w, pfl_req *r) {
  if (!r) return;
  for (int i = 0; i < r->n_xf; i++) kvx_xfer_free(r->xf[i]);
  free(r->xf);
  srv_engine_remove(&w->eng, &r->seq);
  srv_seq_fini(&r->seq, w->rt->kv);
  mdl_sampler_free(r->sampler);
  free(r->remote);
  srv_genreq_free(&r->req);
  srv_peer_unref(r->router);
  free(r);
}

static void fail(pfl_worker *w, pfl_req *r, const char *fmt, const char *detail) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, detail);
  if (r->link && r->link->peer) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "op", "kv_fail");
    cJSON_AddStringToObject(m, "id", r->req.id);
    cJSON_AddStringToObject(m, "message", msg);
    srv_peer_send(r->link->peer, m);
    cJSON_Delete(m);
  }
  srv_send_error(r->router, r->req.id, "worker_failure", "%s", msg);
  req_free(w, r);
}

// Posts one WRITE of layers [l0, l1) of our blocks [b0, b1) into the decode worker's matching blocks.
static int push(pfl_worker *w, pfl_req *r, int l0, int l1, int b0, int b1, int with_notif) {
  if (b1 > r->n_remote) b1 = r->n_remote;
  int n = (l1 - l0) * 2 * (b1 > b0 ? b1 - b0 : 0);
  if (n <= 0 && !with_notif) return 0;
  const mdl_llama_cfg *c = srv_kvpool_cfg(w->rt->kv);
  const mdl_kv *kv = srv_kvpool_kv(w->rt->kv);
  size_t chunk = mdl_kv_chunk_bytes(c, kv);
  kvx_desc *loc = malloc((size_t)(n ? n : 1) * sizeof *loc), *rem = malloc((size_t)(n ? n : 1) * sizeof *rem);
  int k = 0;
  if (!loc || !rem) {
    free(loc);
    free(rem);
    return -1;
  }
  for (int l = l0; l < l1; l++)
    for (int kvi = 0; kvi < 2; kvi++)
      for (int b = b0; b < b1; b++) {
        loc[k] = (kvx_desc){(uint64_t)(uintptr_t)mdl_kv_chunk(c, kv, l, kvi, r->seq.blocks.ids[b]), chunk};
        rem[k] = (kvx_desc){srv_kv_remote_chunk(&r->link->remote, l, kvi, r->remote[b]), chunk};
        k++;
      }
  char err[256];
  kvx_xfer *x = NULL;
  int rc = 0;
  if (k > 0) {
    rc = kvx_xfer_new(w->kvx, KVX_WRITE, loc, (size_t)k, rem, (size_t)k, r->link->kvx_peer, NULL, 0, &x, err,
                      sizeof err);
    if (!rc) rc = kvx_xfer_post(x);
    if (rc) {
      fprintf(stderr, "dserve %s: KV push for %s failed: %s\n", w->rt->w->name, r->req.id,
              x ? kvx_xfer_error(x) : err);
      kvx_xfer_free(x);
      x = NULL;
    }
  }
  free(loc);
  free(rem);
  if (rc) return -1;
  if (x) {
    if (r->n_xf == r->cap_xf) {
      int cap = r->cap_xf ? r->cap_xf * 2 : 64;
      kvx_xfer **nx = realloc(r->xf, (size_t)cap * sizeof *nx);
      if (!nx) {
        kvx_xfer_free(x);
        return -1;
      }
      r->xf = nx;
      r->cap_xf = cap;
    }
    r->xf[r->n_xf++] = x;
    w->bytes_pushed += (double)k * (double)chunk;
  }
  // The notification is queued behind this peer's earlier writes, so it lands after all of them.
  if (with_notif && kvx_notify(w->kvx, r->link->kvx_peer, r->req.id, strlen(r->req.id), err, sizeof err)) return -1;
  return 0;
}

// Blocks whose every position is computed once n_done tokens are (the prompt's last block counts when
// the whole prompt is done).
static int full_blocks(const pfl_worker *w, const pfl_req *r, int n_done) {
  int bs = block_size(w);
  return n_done >= r->req.n_prompt ? (r->req.n_prompt + bs - 1) / bs : n_done / bs;
}

// Catches up on everything computed before the table arrived: all layers of every finished block.
static int catch_up(pfl_worker *w, pfl_req *r) {
  int upto = full_blocks(w, r, r->seq.n_done);
  if (push(w, r, 0, srv_kvpool_cfg(w->rt->kv)->n_layer, r->pushed_blocks, upto, 0)) return -1;
  r->pushed_blocks = upto;
  return 0;
}

// mdl_layer_done_fn: layer `layer` of this step is in our pool; push it for the live requests.
static void on_layer(void *arg, int layer) {
  pfl_worker *w = arg;
  for (int i = 0; i < w->eng.n_batch; i++) {
    srv_seq *sq = w->eng.batch_of[i];
    if (!sq) continue;
    pfl_req *r = OWNER(sq);
    if (!r->live || r->failed) continue;
    if (push(w, r, layer, layer + 1, r->step_b0, r->step_b1, 0)) r->failed = 1;
  }
}

// After the prompt is computed, the table known and every write posted: notify and send kv_first.
static int maybe_finish(pfl_worker *w, pfl_req *r) {
  if (!r->computed || !r->have_table) return 0;
  if (r->pushed_blocks < full_blocks(w, r, r->req.n_prompt) && catch_up(w, r)) return -1;
  if (!r->handed_off && !r->failed) {
    if (push(w, r, 0, 0, 0, 0, 1)) return -1; // the notification
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "op", "kv_first");
    cJSON_AddStringToObject(m, "id", r->req.id);
    cJSON_AddNumberToObject(m, "cached_tokens", r->seq.n_cached);
    srv_kvwire_add_sampled(m, &r->first);
    int rc = srv_peer_send(r->link->peer, m);
    cJSON_Delete(m);
    if (rc) return -1;
    r->handed_off = 1;
  }
  return 0;
}

// Frees requests whose writes have all completed (their blocks are no longer read).
static void reap(pfl_worker *w) {
  for (int i = w->eng.n_run - 1; i >= 0; i--) {
    pfl_req *r = OWNER(w->eng.run[i]);
    if (!r->handed_off) continue;
    int pending = 0, bad = 0;
    for (int j = 0; j < r->n_xf; j++) {
      int st = kvx_xfer_poll(r->xf[j]);
      pending |= st == KVX_PENDING;
      bad |= st < 0;
    }
    if (bad) fprintf(stderr, "dserve %s: a KV write failed after the handoff\n", w->rt->w->name);
    if (!pending) req_free(w, r);
  }
}

static pfl_req *find(pfl_worker *w, const char *id, const char *decode) {
  for (int l = 0; l < 2; l++) {
    srv_seq **arr = l ? w->eng.wait : w->eng.run;
    int n = l ? w->eng.n_wait : w->eng.n_run;
    for (int i = 0; i < n; i++) {
      pfl_req *r = OWNER(arr[i]);
      if (!r->handed_off && !strcmp(r->req.id, id) && (!decode || (r->link && !strcmp(r->link->name, decode))))
        return r;
    }
  }
  return NULL;
}

static void keep_early(pfl_worker *w, srv_peer *from, const cJSON *m) {
  if (w->n_early == w->cap_early) {
    int cap = w->cap_early ? w->cap_early * 2 : 16;
    struct early_table *ne = realloc(w->early, (size_t)cap * sizeof *ne);
    if (!ne) return;
    w->early = ne;
    w->cap_early = cap;
  }
  srv_peer_ref(from);
  w->early[w->n_early++] = (struct early_table){cJSON_Duplicate(m, 1), from, now_ms() + TABLE_TIMEOUT_MS};
}

static void drop_early(pfl_worker *w, int i) {
  cJSON_Delete(w->early[i].msg);
  srv_peer_unref(w->early[i].from);
  w->early[i] = w->early[--w->n_early];
}

static void on_table(pfl_worker *w, srv_peer *from, const cJSON *m) {
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id"), *blocks = cJSON_GetObjectItemCaseSensitive(m, "blocks");
  if (!cJSON_IsString(id)) return;
  pfl_req *r = find(w, id->valuestring, srv_peer_name(from));
  if (!r) { // its generate has not arrived yet (or it was cancelled: then the table expires unused)
    keep_early(w, from, m);
    return;
  }
  if (r->have_table) return;
  int n = cJSON_IsArray(blocks) ? cJSON_GetArraySize(blocks) : 0;
  int need = (r->req.n_prompt + block_size(w) - 1) / block_size(w);
  r->remote = n ? malloc((size_t)n * sizeof *r->remote) : NULL;
  int ok = n >= need && r->remote;
  const cJSON *b;
  int i = 0;
  cJSON_ArrayForEach(b, blocks) {
    if (!ok) break;
    if (!cJSON_IsNumber(b) || b->valuedouble < 0 || b->valuedouble >= r->link->remote.n_blocks) ok = 0;
    else r->remote[i++] = (int32_t)b->valuedouble;
  }
  if (!ok) {
    fail(w, r, "the decode worker sent a bad block table for %s", r->req.id);
    return;
  }
  // Leading blocks the decode worker already holds (its own prefix cache) are not pushed.
  const cJSON *skip = cJSON_GetObjectItemCaseSensitive(m, "skip_blocks");
  int sk = cJSON_IsNumber(skip) && skip->valuedouble >= 0 && skip->valuedouble <= n ? (int)skip->valuedouble : 0;
  r->n_remote = n;
  r->have_table = 1;
  if (sk > r->pushed_blocks) r->pushed_blocks = sk;
  if (catch_up(w, r) || maybe_finish(w, r)) fail(w, r, "KV push to %s failed", r->link->name);
}

static void handle(pfl_worker *w, srv_event *ev) {
  srv_kvevents_on_event(&w->kvev, ev);
  if (!ev->msg) { // a connection closed
    for (int l = 0; l < 2; l++) {
      srv_seq **arr = l ? w->eng.wait : w->eng.run;
      int *n = l ? &w->eng.n_wait : &w->eng.n_run;
      for (int i = *n - 1; i >= 0; i--) {
        if (i >= *n) continue;
        pfl_req *r = OWNER(arr[i]);
        if (r->router == ev->peer) req_free(w, r); // the router went away: nobody wants it
        else if (r->link && r->link->peer == ev->peer && !r->handed_off)
          fail(w, r, "decode worker %s failed", r->link->name);
      }
    }
    return;
  }
  const char *op = cJSON_GetObjectItem(ev->msg, "op")->valuestring;
  if (!strcmp(op, "generate")) {
    char code[64], e[512];
    const cJSON *idj = cJSON_GetObjectItemCaseSensitive(ev->msg, "id");
    const char *id = cJSON_IsString(idj) ? idj->valuestring : "";
    pfl_req *r = calloc(1, sizeof *r);
    if (!r) return;
    srv_peer_ref(ev->peer);
    r->router = ev->peer;
    const char *bad = NULL;
    if (atomic_load(&w->sig.stop)) bad = "worker is shutting down";
    else if (srv_genreq_parse(ev->msg, mdl_tok_n_vocab(w->rt->tok), w->rt->n_ctx, &r->req, code, sizeof code, e,
                              sizeof e))
      bad = e;
    else if (strcmp(r->req.mode, "prefill") || !r->req.decode[0])
      bad = "a prefill worker serves mode \"prefill\" with a decode worker";
    else if (!(r->link = link_for(w, r->req.decode, e, sizeof e)))
      bad = e;
    else if (srv_seq_init(&r->seq, r->req.prompt, r->req.n_prompt, r) ||
             mdl_sampler_new(&r->req.sampling, mdl_tok_n_vocab(w->rt->tok), r->req.prompt, r->req.n_prompt,
                             &r->sampler, e, sizeof e) ||
             srv_engine_queue(&w->eng, &r->seq))
      bad = "out of memory";
    if (bad) {
      srv_send_error(ev->peer, id, bad == e && code[0] == 'c' ? code : "worker_failure", "%s", bad);
      r->link = NULL;
      req_free(w, r);
      return;
    }
    int64_t now = now_ms();
    r->table_deadline_ms = now + TABLE_TIMEOUT_MS;
    r->deadline_ms = r->req.deadline_ms ? now + r->req.deadline_ms : 0;
    for (int i = 0; i < w->n_early; i++) {
      const cJSON *eid = cJSON_GetObjectItemCaseSensitive(w->early[i].msg, "id");
      if (!strcmp(eid->valuestring, r->req.id) && !strcmp(srv_peer_name(w->early[i].from), r->link->name)) {
        cJSON *m = w->early[i].msg;
        srv_peer *from = w->early[i].from;
        w->early[i] = w->early[--w->n_early];
        on_table(w, from, m);
        cJSON_Delete(m);
        srv_peer_unref(from);
        break;
      }
    }
  } else if (!strcmp(op, "kv_table")) {
    on_table(w, ev->peer, ev->msg);
  } else if (!strcmp(op, "cancel")) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(ev->msg, "id");
    pfl_req *r = cJSON_IsString(id) ? find(w, id->valuestring, NULL) : NULL;
    if (r && (r->router == ev->peer || (r->link && r->link->peer == ev->peer))) {
      if (r->n_xf) r->handed_off = 1; // writes in flight read our blocks: reap frees it after them
      else req_free(w, r);
    }
  } else if (!strcmp(op, "stats")) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "op", "stats_ok");
    cJSON_AddNumberToObject(m, "running", w->eng.n_run);
    cJSON_AddNumberToObject(m, "waiting", w->eng.n_wait);
    cJSON_AddNumberToObject(m, "free_blocks", srv_kvpool_free_blocks(w->rt->kv));
    cJSON_AddNumberToObject(m, "total_blocks", srv_kvpool_total_blocks(w->rt->kv));
    cJSON_AddNumberToObject(m, "kv_bytes_pushed", w->bytes_pushed);
    srv_engine_add_prefix_stats(&w->eng, m);
    srv_peer_send(ev->peer, m);
    cJSON_Delete(m);
  } else if (strcmp(op, "hello")) {
    fprintf(stderr, "dserve %s: ignoring control message '%s' from %s\n", w->rt->w->name, op,
            srv_peer_name(ev->peer));
  }
}

static void drain_events(pfl_worker *w, int wait_ms) {
  srv_event ev;
  for (int first = 1; srv_hub_next(w->hub, &ev, first ? wait_ms : 0) == 1; first = 0) {
    handle(w, &ev);
    srv_event_done(&ev);
  }
}

static void reject(void *arg, srv_seq *sq, int blocks_needed) {
  pfl_worker *w = arg;
  pfl_req *r = OWNER(sq);
  srv_send_error(r->router, r->req.id, "context_length_exceeded",
                 "the prompt needs %d KV blocks; this prefill worker's pool has %d", blocks_needed,
                 srv_kvpool_total_blocks(w->rt->kv));
  req_free(w, r);
}

static void expire(pfl_worker *w) {
  int64_t now = now_ms();
  for (int i = w->n_early - 1; i >= 0; i--)
    if (now > w->early[i].expires_ms) drop_early(w, i);
  for (int l = 0; l < 2; l++) {
    srv_seq **arr = l ? w->eng.wait : w->eng.run;
    int *n = l ? &w->eng.n_wait : &w->eng.n_run;
    for (int i = *n - 1; i >= 0; i--) {
      if (i >= *n) continue;
      pfl_req *r = OWNER(arr[i]);
      if (r->handed_off) continue;
      if (r->deadline_ms && now > r->deadline_ms) fail(w, r, "request deadline passed%s", "");
      else if (!r->have_table && now > r->table_deadline_ms)
        fail(w, r, "decode worker %s never sent its block table", r->link->name);
    }
  }
}

// One step: plan which blocks each row completes, compute (pushing per layer), then sample first tokens.
static int step(pfl_worker *w, char *err, size_t errlen) {
  for (int i = 0; i < w->eng.n_run; i++) {
    pfl_req *r = OWNER(w->eng.run[i]);
    r->live = r->have_table && !r->failed;
  }
  if (srv_engine_plan(&w->eng) == 0) return 0;
  for (int i = 0; i < w->eng.n_batch; i++) { // the blocks each row completes, pushed layer by layer
    pfl_req *r = OWNER(w->eng.batch_of[i]);
    r->step_b0 = r->pushed_blocks;
    r->step_b1 = full_blocks(w, r, r->seq.n_done + w->eng.batch_chunk[i]);
  }
  if (srv_engine_forward(&w->eng, on_layer, w, err, errlen)) return -1;
  int n_vocab = mdl_tok_n_vocab(w->rt->tok);
  for (int i = 0; i < w->eng.n_batch; i++) {
    srv_seq *sq = w->eng.batch_of[i];
    if (!sq) continue;
    pfl_req *r = OWNER(sq);
    if (r->live) r->pushed_blocks = r->step_b1;
    if (w->eng.batch[i].want_logits) {
      mdl_sampler_sample(r->sampler, w->eng.logits + (size_t)i * (size_t)n_vocab, &r->first);
      r->computed = 1;
    }
    if (r->failed || maybe_finish(w, r)) fail(w, r, "KV push to %s failed", r->link->name);
  }
  return 0;
}

static void hello_extra(void *arg, cJSON *ok) {
  pfl_worker *w = arg;
  cJSON_AddNumberToObject(ok, "n_ctx", w->rt->n_ctx);
  cJSON_AddNumberToObject(ok, "n_vocab", mdl_tok_n_vocab(w->rt->tok));
  cJSON_AddNumberToObject(ok, "total_blocks", srv_kvpool_total_blocks(w->rt->kv));
  srv_kvwire_add_layout(ok, w->rt->kv); // the router reads kv_layout.block_size for its prefix keys
}

int pfl_worker_run(const srv_config *cfg, const srv_worker_cfg *wc, char *err, size_t errlen) {
  pfl_worker w;
  memset(&w, 0, sizeof w);
  w.cfg = cfg;
  srv_signals_block(&w.sig);
  if (srv_runtime_open(cfg, wc, 0, &w.rt, err, errlen)) return -1;
  kvx_opts o = {.backend = wc->kvx_backend[0] ? wc->kvx_backend : "auto",
                .listen_host = wc->kvx_host[0] ? wc->kvx_host : wc->host,
                .listen_port = wc->kvx_port,
                .secret = cfg->secret};
  size_t bytes;
  void *base = srv_kvpool_base(w.rt->kv, &bytes);
  w.kvx = kvx_agent_new(wc->name, &o, err, errlen);
  srv_hub_opts ho = {.name = wc->name, .role = "prefill", .secret = cfg->secret, .host = wc->host, .port = wc->port,
                     .hello_extra = hello_extra, .hello_arg = &w};
  if (!w.kvx ||
      kvx_register(w.kvx, base, bytes, strncmp(wc->device, "cuda", 4) ? KVX_MEM_HOST : KVX_MEM_CUDA, &w.kv_region,
                   err, errlen) ||
      srv_hub_new(&ho, &w.hub, err, errlen) || srv_signals_start(&w.sig, w.hub)) {
    srv_hub_free(w.hub);
    kvx_agent_free(w.kvx);
    srv_runtime_close(w.rt);
    return -1;
  }
  srv_engine_init(&w.eng, w.rt, err, errlen);
  fprintf(stderr, "dserve %s: prefill worker listening on %s:%d (%d KV blocks, %s kernels, %d threads, kvxfer %s)\n",
          wc->name, wc->host, srv_hub_port(w.hub), srv_kvpool_total_blocks(w.rt->kv), w.rt->kc.be->name,
          krn_pool_threads(w.rt->pool), kvx_agent_backend(w.kvx));
  for (;;) {
    int waiting_only = w.eng.n_wait == 0;
    for (int i = 0; waiting_only && i < w.eng.n_run; i++)
      if (OWNER(w.eng.run[i])->seq.n_done < OWNER(w.eng.run[i])->seq.n_toks) waiting_only = 0;
    // Idle, or only waiting for tables and writes: block briefly; otherwise take what has arrived.
    drain_events(&w, !srv_engine_busy(&w.eng) ? 1000 : (waiting_only ? 2 : 0));
    if (atomic_load(&w.sig.stop) && !srv_engine_busy(&w.eng)) break;
    expire(&w);
    reap(&w);
    srv_engine_admit(&w.eng, reject, &w);
    if (step(&w, err, errlen)) {
      fprintf(stderr, "dserve %s: forward step failed: %s\n", wc->name, err);
      while (w.eng.n_run) fail(&w, OWNER(w.eng.run[0]), "forward step failed%s", "");
    }
    srv_kvevents_flush(&w.kvev, w.eng.prefix);
  }
  while (w.eng.n_run) req_free(&w, OWNER(w.eng.run[0]));
  while (w.eng.n_wait) req_free(&w, OWNER(w.eng.wait[0]));
  while (w.n_early) drop_early(&w, 0);
  free(w.early);
  srv_engine_fini(&w.eng);
  srv_kvevents_fini(&w.kvev);
  srv_hub_free(w.hub);
  free(w.links);
  kvx_agent_free(w.kvx);
  srv_runtime_close(w.rt);
  fprintf(stderr, "dserve %s: stopped\n", wc->name);
  return 0;
}
