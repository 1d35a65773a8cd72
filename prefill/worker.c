// prefill/worker.c: computes prompts in chunked batches and pushes each layer's KV to the decode worker
// as soon as that layer is done, then sends the first token (docs/protocol.md, "Handoff"); a prefix a peer
// prefill worker holds is fetched by fetch.c.
#include "prefill/worker.h"
#include "proto/handoff.h"
#include "proto/proto.h"
#include "proto/request.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/pool.h"
#include "kv/stage.h"
#include "models/tokenizer.h"
#include "prefill/worker_int.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/vec.h"
#include "worker/trace.h"

// ---- requests ----

static int pfl_req_to(pfl_worker *w, pfl_req *r, pfl_state next);

static void req_free(pfl_worker *w, pfl_req *r) {
  if (!r) return;
  if (r->state != PFL_DONE) pfl_req_to(w, r, PFL_DONE);
  if (r->pull) r->pull->req = NULL; // the fetch's blocks stay reserved until the peer answers
  for (int i = 0; i < r->n_xf; i++) kvx_xfer_free(r->xf[i]);
  free(r->xf);
  kv_pool_discard(w->sh.rt->kv, r->seq.blocks.ids, r->seq.blocks.n); // sent: a pool nobody reads lets it go
  wrk_engine_remove(&w->eng, &r->seq);
  wrk_seq_fini(&r->seq, w->sh.rt->kv);
  mdl_sampler_free(r->sampler);
  free(r->remote);
  free(r->fail_msg);
  wrk_genreq_free(&r->req);
  ctl_peer_unref(r->router);
  free(r);
}

// Sends the decode worker of link op (kv_fail with message, kv_freed or kv_started) for request id.
// code: kv_fail's error code for the request (NULL: the decode worker's own, worker_failure).
static void tell_decode(pfl_link *l, const char *op, const char *id, const char *message, const char *code) {
  if (!l || !l->peer) return;
  cJSON *m = !strcmp(op, PRT_OP_KV_FAIL)    ? prt_kv_fail_encode(&(prt_kv_fail){id, message, code}, NULL, 0)
             : !strcmp(op, PRT_OP_KV_FREED) ? prt_kv_freed_encode(&(prt_kv_freed){id}, NULL, 0)
                                            : prt_kv_started_encode(&(prt_kv_started){id}, NULL, 0);
  if (m) ctl_peer_send(l->peer, m);
  cJSON_Delete(m);
}

// The one place a request changes state (docs/protocol.md, "Handoff states"): refuses an illegal transition (logged
// loudly; an assertion in a debug build), then does what entering next requires: PUSHING tells the decode worker
// kv_started (its KV-arrival timer starts). 0, or -1 when refused.
static int pfl_req_to(pfl_worker *w, pfl_req *r, pfl_state next) {
  pfl_state from = r->state;
  if (!pfl_state_legal(from, next)) {
    utl_err(w->sh.rt->w->name, "%s: illegal handoff transition %s -> %s refused", r->req.id, pfl_state_name(from),
            pfl_state_name(next));
    assert(!"illegal prefill handoff transition");
    return -1;
  }
  r->state = next;
  if (next == PFL_PUSHING) tell_decode(r->link, PRT_OP_KV_STARTED, r->req.id, NULL, NULL);
  if (next != from && next != PFL_DONE)
    utl_debug(w->sh.rt->w->name, "%s: %s -> %s", r->req.id, pfl_state_name(from), pfl_state_name(next));
  return 0;
}

static int writes_pending(const pfl_req *r) {
  for (int i = 0; i < r->n_xf; i++)
    if (kvx_xfer_poll(r->xf[i]) == KVX_PENDING) return 1;
  return 0;
}

// Stops r: no more pushes. With no write in flight it tells the decode worker (tell, msg) and frees r now;
// otherwise reap does both once every posted write finished, so a kv_fail or kv_freed never precedes bytes
// that could still land in the decode worker's blocks.
static void stop_req(pfl_worker *w, pfl_req *r, int tell, const char *msg) {
  if (tell > r->tell) r->tell = tell;
  if (tell == TELL_FAIL && msg && !r->fail_msg) r->fail_msg = strdup(msg);
  if (writes_pending(r)) {
    pfl_req_to(w, r, PFL_STOPPING); // reap frees it
    return;
  }
  if (r->tell == TELL_FAIL)
    tell_decode(r->link, PRT_OP_KV_FAIL, r->req.id, r->fail_msg ? r->fail_msg : "prefill failed", NULL);
  else if (r->tell == TELL_FREED) tell_decode(r->link, PRT_OP_KV_FREED, r->req.id, NULL, NULL);
  req_free(w, r);
}

// Fails r with code (worker_failure; decode_failure when the decode worker it hands to is what broke, which the
// router reads as "move it once my own link to that worker goes down too").
static void fail_with(pfl_worker *w, pfl_req *r, const char *code, const char *fmt, const char *detail) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, detail);
  wrk_send_error(r->router, r->req.id, code, "%s", msg);
  stop_req(w, r, TELL_FAIL, msg);
}

void pfl_fail(pfl_worker *w, pfl_req *r, const char *fmt, const char *detail) {
  fail_with(w, r, "worker_failure", fmt, detail);
}

// Posts one WRITE of layers [l0, l1) of our blocks [b0, b1) into the decode worker's matching blocks.
static int write_layers(pfl_worker *w, pfl_req *r, int l0, int l1, int b0, int b1) {
  char err[256];
  kvx_xfer *x = NULL;
  const int32_t *theirs = r->remote + (size_t)b0 * (size_t)mdl_kv_groups(kv_pool_kv(w->sh.rt->kv)); // (n, groups)
  if (b1 > b0 && kv_wire_write_blocks(w->sh.kvx, w->sh.rt->kv, r->link->kvx_peer, &r->link->remote,
                                         r->seq.blocks.ids + b0, theirs, b1 - b0, l0, l1, NULL, 0, &x, err,
                                         sizeof err)) {
    utl_err(w->sh.rt->w->name, "KV push for %s failed: %s", r->req.id, err);
    return -1;
  }
  if (x) {
    if (!r->t_push0_us) r->t_push0_us = utl_now_us();
    if (UTL_VEC_PUSH(r->xf, r->n_xf, r->cap_xf, x)) {
      kvx_xfer_free(x);
      return -1;
    }
    w->bytes_pushed += (double)(l1 - l0) * (double)r->link->remote.n_parts * (double)(b1 - b0) *
                       (double)r->link->remote.chunk_bytes;
  }
  return 0;
}

// Posts the WRITEs of layers [l0, l1) of our blocks [b0, b1): one per run of layers that start at the same block (a
// sliding-window layer from its first live block: kv_wire_first_live_block), then notif when with_notif.
static int push(pfl_worker *w, pfl_req *r, int l0, int l1, int b0, int b1, int with_notif) {
  if (b1 > r->n_remote) b1 = r->n_remote;
  const mdl_llama_cfg *c = kv_pool_cfg(w->sh.rt->kv);
  for (int l = l0; l < l1;) {
    int from = kv_wire_first_live_block(c, l, r->req.n_prompt, block_size(w)), l_end = l + 1;
    while (l_end < l1 && kv_wire_first_live_block(c, l_end, r->req.n_prompt, block_size(w)) == from) l_end++;
    if (write_layers(w, r, l, l_end, from > b0 ? from : b0, b1)) return -1;
    l = l_end;
  }
  char err[256];
  // The notification is queued behind this peer's earlier writes, so it lands after all of them.
  if (with_notif && kvx_notify(w->sh.kvx, r->link->kvx_peer, r->req.id, strlen(r->req.id), err, sizeof err)) return -1;
  return 0;
}

// Blocks whose every position is computed once n_done tokens are (the prompt's last block counts when
// the whole prompt is done).
static int full_blocks(const pfl_worker *w, const pfl_req *r, int n_done) {
  int bs = block_size(w);
  return n_done >= r->req.n_prompt ? (r->req.n_prompt + bs - 1) / bs : n_done / bs;
}

// Catches up on everything computed before the table arrived: all layers of every finished block. A table that came
// before the first step leaves pushed_blocks at its skip_blocks (the decode worker's own prefix cache): those are
// never pushed, nor counted in kv_bytes_pushed, so it may not go back below them.
static int catch_up(pfl_worker *w, pfl_req *r) {
  int upto = full_blocks(w, r, r->seq.n_done);
  if (upto <= r->pushed_blocks) return 0;
  if (push(w, r, 0, kv_pool_cfg(w->sh.rt->kv)->n_layer, r->pushed_blocks, upto, 0)) return -1;
  r->pushed_blocks = upto;
  return 0;
}

// Layer `layer` of this step has landed in our pool: push it for the live requests.
static void push_layer(pfl_worker *w, int layer) {
  for (int i = 0; i < w->eng.n_batch; i++) {
    wrk_seq *sq = w->eng.batch_of[i];
    if (!sq) continue;
    pfl_req *r = OWNER(sq);
    if (!r->live || r->state == PFL_PUSH_FAILED) continue;
    if (push(w, r, layer, layer + 1, r->step_b0, r->step_b1, 0)) pfl_req_to(w, r, PFL_PUSH_FAILED);
  }
}

// mdl_layer_done_fn: layer `layer`'s KV writes are queued. The backend may run ahead of us (cuda): mark
// them, then push the layer before, waiting only for its marker, so the device computes this layer
// meanwhile; flush_layers pushes the last layer once the forward pass returns. (The cpu backends' events
// are trivial, so CPU runs take this same path.)
static void on_layer(void *arg, int layer) {
  pfl_worker *w = arg;
  if (!w->layer_ev[0]) { // a backend without events: its writes have landed
    push_layer(w, layer);
    return;
  }
  krn_event_record(&w->sh.rt->kc, w->layer_ev[layer & 1]);
  if (layer > 0) {
    krn_event_wait(&w->sh.rt->kc, w->layer_ev[(layer - 1) & 1]);
    push_layer(w, layer - 1);
  }
}

static void flush_layers(pfl_worker *w) {
  if (!w->layer_ev[0]) return;
  int last = kv_pool_cfg(w->sh.rt->kv)->n_layer - 1;
  krn_event_wait(&w->sh.rt->kc, w->layer_ev[last & 1]);
  push_layer(w, last);
}

// The prompt is computed and the table known (COMPUTED when the table comes; TABLE or PUSHING when a step computes
// its last token): every write posted, then the notification and kv_first -> HANDED_OFF. 0, or -1 when one failed.
static int finish(pfl_worker *w, pfl_req *r) {
  if (r->pushed_blocks < full_blocks(w, r, r->req.n_prompt) && catch_up(w, r)) return -1;
  if (push(w, r, 0, 0, 0, 0, 1)) return -1; // the notification
  int64_t now = utl_now_us();
  prt_kv_first kf = {.id = r->req.id, .cached_tokens = r->seq.n_cached, .cached_store_tokens = r->seq.store_tokens,
                     .prefill_ms = (double)(now - r->t_recv_us) / 1000.0};
  wrk_trace_span(&w->sh, &r->req, "prefill", r->t_recv_us, now, "dserve.cached_tokens", r->seq.n_cached);
  if (r->seq.store_t1_us) // the shared KV tier's read at admission (worker/kvtier.h)
    wrk_trace_span(&w->sh, &r->req, "kvstore_read", r->seq.store_t0_us, r->seq.store_t1_us, "dserve.kvstore_tokens",
                   r->seq.store_tokens);
  kv_wire_sampled_to(&r->first, &kf.first);
  cJSON *m = prt_kv_first_encode(&kf, NULL, 0);
  int rc = m ? ctl_peer_send(r->link->peer, m) : -1;
  cJSON_Delete(m);
  if (rc) return -1;
  return pfl_req_to(w, r, PFL_HANDED_OFF);
}

// Frees requests whose writes have all completed (their blocks are no longer read).
static void reap(pfl_worker *w) {
  for (int i = w->eng.n_run - 1; i >= 0; i--) {
    pfl_req *r = OWNER(w->eng.run[i]);
    if (!pfl_state_draining(r->state)) continue;
    int pending = 0, bad = 0;
    for (int j = 0; j < r->n_xf; j++) {
      int st = kvx_xfer_poll(r->xf[j]);
      pending |= st == KVX_PENDING;
      bad |= st < 0;
    }
    if (bad) utl_warn(w->sh.rt->w->name, "a KV write failed after the handoff");
    if (pending) continue;
    if (r->state == PFL_HANDED_OFF && r->t_push0_us) // its layer-wise writes, from the first posted to all landed
      wrk_trace_span(&w->sh, &r->req, "kv_push", r->t_push0_us, utl_now_us(), "dserve.writes", r->n_xf);
    if (r->tell == TELL_FAIL)
    tell_decode(r->link, PRT_OP_KV_FAIL, r->req.id, r->fail_msg ? r->fail_msg : "prefill failed", NULL);
    else if (r->tell == TELL_FREED) tell_decode(r->link, PRT_OP_KV_FREED, r->req.id, NULL, NULL);
    req_free(w, r);
  }
}

static int is(const pfl_req *r, const char *id, const char *decode, int any) {
  return (any || !pfl_state_draining(r->state)) && !strcmp(r->req.id, id) &&
         (!decode || (r->link && !strcmp(r->link->name, decode)));
}

// The request id (from decode worker decode, when not NULL) that is not handed off yet (any: or handed off, its
// writes still in flight): queued, running or waiting for a prefix fetch.
static pfl_req *find_req(pfl_worker *w, const char *id, const char *decode, int any) {
  for (int l = 0; l < 2; l++) {
    wrk_seq **arr = l ? w->eng.wait : w->eng.run;
    int n = l ? w->eng.n_wait : w->eng.n_run;
    for (int i = 0; i < n; i++)
      if (is(OWNER(arr[i]), id, decode, any)) return OWNER(arr[i]);
  }
  for (pfl_pull *p = w->pulls; p; p = p->next)
    if (p->req && is(p->req, id, decode, any)) return p->req;
  return NULL;
}
static pfl_req *find(pfl_worker *w, const char *id, const char *decode) { return find_req(w, id, decode, 0); }

static void keep_early(pfl_worker *w, ctl_peer *from, const cJSON *m) {
  if (w->n_early == w->cap_early) {
    int cap = w->cap_early ? w->cap_early * 2 : 16;
    struct early_table *ne = realloc(w->early, (size_t)cap * sizeof *ne);
    if (!ne) return;
    w->early = ne;
    w->cap_early = cap;
  }
  ctl_peer_ref(from);
  w->early[w->n_early++] = (struct early_table){cJSON_Duplicate(m, 1), from, utl_now_ms() + table_timeout_ms(w)};
}

static void drop_early(pfl_worker *w, int i) {
  cJSON_Delete(w->early[i].msg);
  ctl_peer_unref(w->early[i].from);
  w->early[i] = w->early[--w->n_early];
}

// kv_table: the decode worker's blocks for a request (a wrk_op; take_early_table calls it too).
static void on_table(void *arg, ctl_peer *from, const cJSON *m) {
  pfl_worker *w = arg;
  const char *id = prt_id(m);
  if (!id) return;
  pfl_req *r = find(w, id, ctl_peer_name(from));
  if (!r) { // its generate has not arrived yet (or it was cancelled: then the table expires unused)
    keep_early(w, from, m);
    return;
  }
  if (r->state != PFL_WAIT_TABLE && r->state != PFL_COMPUTED) return; // it has one
  int n = 0, need = (r->req.n_prompt + block_size(w) - 1) / block_size(w);
  prt_kv_table t;
  char why[160] = "";
  int ok = prt_kv_table_decode(m, &t, why, sizeof why) == 0;
  ok = ok && kv_wire_read_table(&t, &r->link->remote, &r->remote, &n) == 0 && n >= need;
  // Leading blocks the decode worker already holds (its own prefix cache) are not pushed.
  int sk = ok && t.skip_blocks <= n ? t.skip_blocks : 0;
  prt_kv_table_free(&t);
  if (!ok) {
    if (why[0]) utl_warn(w->sh.rt->w->name, "%s", why);
    pfl_fail(w, r, "the decode worker sent a bad block table for %s", r->req.id);
    return;
  }
  r->n_remote = n;
  if (sk > r->pushed_blocks) r->pushed_blocks = sk;
  if (r->state == PFL_COMPUTED) { // computed before its table came: everything goes now
    if (finish(w, r)) fail_with(w, r, "decode_failure", "KV push to %s failed", r->link->name);
    return;
  }
  pfl_req_to(w, r, PFL_TABLE);
  if (r->pull) return; // waiting for a prefix fetch: its first step pushes every layer of what it has by then
  if (catch_up(w, r)) fail_with(w, r, "decode_failure", "KV push to %s failed", r->link->name);
}

// Hands over the decode worker's block table if it came before the request did.
void pfl_take_early_table(pfl_worker *w, pfl_req *r) {
  for (int i = 0; i < w->n_early; i++) {
    const char *eid = prt_id(w->early[i].msg); // an early message is kept only when it has one
    if (!strcmp(eid, r->req.id) && !strcmp(ctl_peer_name(w->early[i].from), r->link->name)) {
      cJSON *m = w->early[i].msg;
      ctl_peer *from = w->early[i].from;
      w->early[i] = w->early[--w->n_early];
      if (prt_is(m, PRT_OP_KV_FAIL)) { // the decode worker gave up on it already
        wrk_send_error(r->router, r->req.id, "worker_failure", "decode worker %s dropped the request", r->link->name);
        req_free(w, r); // it was told kv_freed when its kv_fail came
      } else {
        on_table(w, from, m); // may fail (and free) r
      }
      cJSON_Delete(m);
      ctl_peer_unref(from);
      return;
    }
  }
}

// ---- control messages ----

// Calls fn on every queued or running request, last first in each list: fn may free it (or fail it).
static void each_req(pfl_worker *w, void (*fn)(pfl_worker *, pfl_req *, const void *), const void *arg) {
  for (int l = 0; l < 2; l++) {
    wrk_seq **arr = l ? w->eng.wait : w->eng.run;
    int *n = l ? &w->eng.n_wait : &w->eng.n_run;
    for (int i = *n - 1; i >= 0; i--)
      if (i < *n) fn(w, OWNER(arr[i]), arg);
  }
}

static void close_req(pfl_worker *w, pfl_req *r, const void *peer) {
  if (r->router == peer) stop_req(w, r, TELL_NONE, NULL); // the router went away: nobody wants it (the decode
                                                          // worker drops it too and asks with kv_fail)
  else if (r->link && r->link->peer == peer && !pfl_state_draining(r->state))
    fail_with(w, r, "decode_failure", "decode worker %s failed", r->link->name);
}

static void on_close(void *arg, ctl_peer *peer) {
  pfl_worker *w = arg;
  each_req(w, close_req, peer);
  for (pfl_pull **pp = &w->pulls; *pp;) {
    pfl_pull *p = *pp;
    if (p->req && p->req->router == peer) req_free(w, p->req);
    else if (p->req && p->req->link->peer == peer)
      fail_with(w, p->req, "decode_failure", "decode worker %s failed", p->req->link->name);
    if (p->src->peer != peer) {
      pp = &p->next;
      continue;
    }
    // The peer is gone: it writes nothing more, so the request computes the prefix and the blocks go back.
    if (p->req) pfl_resume(w, p, 0);
    pfl_pull_free(w, p); // *pp is now the next one
  }
  pfl_serve_on_close(&w->serve, peer);
}

static void on_generate(void *arg, ctl_peer *from, const cJSON *m) {
  pfl_worker *w = arg;
  char code[64] = "", e[512];
  prt_generate g; // on a malformed message, its id and routing names as far as they were read (proto/request.h)
  int malformed = prt_generate_decode(m, &g, e, sizeof e);
  const char *id = g.id ? g.id : "";
  pfl_req *r = calloc(1, sizeof *r);
  if (!r) {
    prt_generate_free(&g);
    return;
  }
  ctl_peer_ref(from);
  r->router = from;
  r->t_recv_us = utl_now_us();
  const char *bad = NULL;
  int link_failed = 0, decode_down = 0;
  cfg_worker dc;
  if (atomic_load(&w->sh.sig.stop)) bad = "worker is shutting down";
  else if (malformed) bad = e; // e.g. a malformed prefix_peer / prefix_blocks hint
  else if (wrk_genreq_parse(&g, mdl_tok_n_vocab(w->sh.rt->tok), w->sh.rt->n_ctx, &w->gram, &r->req, code, sizeof code,
                            e, sizeof e))
    bad = e;
  else if (r->req.embed) // the router sends embeddings to decode and both workers (docs/openai.md)
    bad = "a prefill worker computes no embeddings: decode and both workers do";
  else if (strcmp(r->req.mode, "prefill") || !r->req.decode[0])
    bad = "a prefill worker serves mode \"prefill\" with a decode worker";
  else if (!(r->link = pfl_link_for(w, r->req.decode, CFG_ROLE_DECODE, LINK_TIMEOUT_MS, e, sizeof e))) {
    bad = e, link_failed = 1;
    decode_down = pfl_peer_cfg(w, r->req.decode, CFG_ROLE_DECODE, &dc, NULL, 0) == 0; // ours, unreachable
  }
  else if (wrk_seq_init(&r->seq, r->req.prompt, r->req.n_prompt, r) ||
           mdl_sampler_new(&r->req.sampling, mdl_tok_n_vocab(w->sh.rt->tok), r->req.prompt, r->req.n_prompt,
                           &r->sampler, e, sizeof e))
    bad = "out of memory";
  if (bad) {
    // The decode worker reserved blocks for it: kv_fail frees them at once (docs/protocol.md, "Handoff"). When
    // the link to it is what failed, its handoff timeout or the router's cancel frees them.
    char le[256];
    pfl_link *l = r->link;
    if (!l && !link_failed && g.decode && g.mode && !strcmp(g.mode, "prefill") && g.decode[0])
      l = pfl_link_for(w, g.decode, CFG_ROLE_DECODE, LINK_TIMEOUT_MS, le, sizeof le);
    if (l && g.id) tell_decode(l, PRT_OP_KV_FAIL, g.id, bad, NULL);
    // decode_failure: the router sends it again once that decode worker is back (or moves it), as for a handoff the
    // decode worker's death broke.
    const char *ecode = bad == e && code[0] == 'c' ? code : "worker_failure";
    wrk_send_error(from, id, decode_down ? "decode_failure" : ecode, "%s", bad);
    r->link = NULL;
    req_free(w, r);
    prt_generate_free(&g);
    return;
  }
  pfl_req_to(w, r, PFL_WAIT_TABLE);
  wrk_genreq_resume_sampler(&r->req, r->sampler); // a moved stream: its first token continues the sampler's draws
  int64_t now = utl_now_ms();
  r->table_deadline_ms = now + table_timeout_ms(w);
  r->deadline_ms = r->req.deadline_ms ? now + r->req.deadline_ms : 0;
  // The router's hint (router.prefix_fetch): prefill worker prefix_peer holds the first prefix_blocks blocks.
  int pulling = g.prefix_peer && pfl_start_pull(w, r, g.prefix_peer, g.prefix_blocks);
  prt_generate_free(&g);
  if (!pulling && wrk_engine_queue(&w->eng, &r->seq)) {
    pfl_fail(w, r, "out of memory%s", "");
    return;
  }
  pfl_take_early_table(w, r);
}

static void on_prefix_pull(void *arg, ctl_peer *from, const cJSON *m) {
  pfl_serve_on_pull(&((pfl_worker *)arg)->serve, from, m);
}
static void on_prefix_pulled(void *arg, ctl_peer *from, const cJSON *m) { pfl_on_pulled(arg, from, m, 0); }
static void on_prefix_fail(void *arg, ctl_peer *from, const cJSON *m) { pfl_on_pulled(arg, from, m, 1); }

static void on_cancel(void *arg, ctl_peer *from, const cJSON *m) {
  pfl_worker *w = arg;
  prt_cancel c;
  pfl_req *r = prt_cancel_decode(m, &c, NULL, 0) ? NULL : find(w, c.id, NULL);
  if (r && (r->router == from || (r->link && r->link->peer == from))) stop_req(w, r, TELL_NONE, NULL);
}

// kv_fail from a decode worker: it gave up on the request (its handoff timeout, the router's cancel, its
// deadline...) and holds the blocks it reserved until we answer kv_freed: we push nothing more, and answer once
// none of our writes into those blocks can still land (at once when none is in flight). An id we do not know
// yet (its generate is still on the way) leaves a marker so that generate is dropped when it comes.
static void on_kv_fail(void *arg, ctl_peer *from, const cJSON *m) {
  pfl_worker *w = arg;
  prt_kv_fail f;
  char why[160];
  if (prt_kv_fail_decode(m, &f, why, sizeof why)) {
    utl_warn(w->sh.rt->w->name, "ignored from %s: %s", ctl_peer_name(from), why);
    return;
  }
  const char *name = ctl_peer_name(from);
  utl_debug(w->sh.rt->w->name, "%s: kv_fail from %s", f.id, name);
  pfl_req *r = find_req(w, f.id, name, 1);
  if (r) {
    stop_req(w, r, TELL_FREED, NULL);
    return;
  }
  for (int i = w->n_early - 1; i >= 0; i--) { // a table that came before its request: it will never be used
    const char *eid = prt_id(w->early[i].msg);
    if (!strcmp(eid, f.id) && !strcmp(ctl_peer_name(w->early[i].from), name)) drop_early(w, i);
  }
  cJSON *a = prt_kv_freed_encode(&(prt_kv_freed){f.id}, NULL, 0);
  if (a) ctl_peer_send(from, a);
  cJSON_Delete(a);
  keep_early(w, from, m); // the marker: take_early_table drops the request
}

// kv_started to the decode worker of each request whose prompt a step has begun to compute (or whose prefix cache hit
// left nothing to compute) once its table is known (the table comes from the decode worker after it got the request,
// so the decode worker knows the id): its KV-arrival timer starts now. Not at admission: under load a hundred
// admitted prompts wait their turn for steps, and that wait is the request deadline's to bound (seen with 1P1D and
// 1,000 queued requests under ASan: KV-arrival timeouts).
static void send_started(pfl_worker *w) {
  for (int i = 0; i < w->eng.n_run; i++) {
    pfl_req *r = OWNER(w->eng.run[i]);
    if (r->state != PFL_TABLE) continue;
    if (r->seq.n_done == r->seq.n_cached && r->seq.n_done < r->seq.n_toks) continue; // no step has computed any of it
    pfl_req_to(w, r, PFL_PUSHING); // sends kv_started
  }
}

static void on_stats(void *arg, ctl_peer *from, const cJSON *msg) {
  pfl_worker *w = arg;
  (void)msg;
  prt_stats_ok st;
  prt_stats_ok_init(&st);
  st.running = w->eng.n_run;
  st.waiting = w->eng.n_wait;
  st.kv_bytes_pushed = w->bytes_pushed;
  st.prefix_fetches = w->fetches;
  st.prefix_fetched_blocks = w->fetched_blocks;
  st.prefix_fetch_misses = w->fetch_misses;
  st.prefix_served_blocks = w->serve.served_blocks;
  wrk_engine_prefix_stats(&w->eng, &st);
  cJSON *m = wrk_shell_stats_new(&w->sh, &st);
  if (!m) return;
  ctl_peer_send(from, m);
  cJSON_Delete(m);
}

// "hello" needs nothing here (a router's is kv_events'; a peer prefill worker's link needs no bookkeeping).
static const wrk_op OPS[] = {
    {PRT_OP_HELLO, NULL},
    {PRT_OP_GENERATE, on_generate},
    {PRT_OP_KV_TABLE, on_table},
    {PRT_OP_PREFIX_PULL, on_prefix_pull},
    {PRT_OP_PREFIX_PULLED, on_prefix_pulled},
    {PRT_OP_PREFIX_FAIL, on_prefix_fail},
    {PRT_OP_CANCEL, on_cancel},
    {PRT_OP_KV_FAIL, on_kv_fail},
    {PRT_OP_STATS, on_stats},
};

static void reject(void *arg, wrk_seq *sq, int blocks_needed) {
  pfl_worker *w = arg;
  pfl_req *r = OWNER(sq);
  char msg[256];
  snprintf(msg, sizeof msg, "the prompt needs %d KV blocks; this prefill worker's pool has %d", blocks_needed,
           kv_pool_total_blocks(w->sh.rt->kv));
  // The router hears it twice, from here and from the decode worker (which fails the request when told); both say
  // context_length_exceeded, so whichever comes first, the client gets the 400 with the reason.
  wrk_send_error(r->router, r->req.id, "context_length_exceeded", "%s", msg);
  tell_decode(r->link, PRT_OP_KV_FAIL, r->req.id, msg, "context_length_exceeded"); // never admitted: nothing written
  req_free(w, r);
}

static void expire_req(pfl_worker *w, pfl_req *r, const void *now_ms) {
  int64_t now = *(const int64_t *)now_ms;
  if (pfl_state_draining(r->state)) return;
  if (r->deadline_ms && now > r->deadline_ms) pfl_fail(w, r, "request deadline passed%s", "");
  else if ((r->state == PFL_WAIT_TABLE || r->state == PFL_COMPUTED) && now > r->table_deadline_ms)
    pfl_fail(w, r, "decode worker %s never sent its block table", r->link->name);
}

static void expire(pfl_worker *w) {
  int64_t now = utl_now_ms();
  for (int i = w->n_early - 1; i >= 0; i--)
    if (now > w->early[i].expires_ms) drop_early(w, i);
  each_req(w, expire_req, &now);
  for (pfl_pull **pp = &w->pulls; *pp;) {
    pfl_pull *p = *pp;
    if (p->req && p->req->deadline_ms && now > p->req->deadline_ms) {
      pfl_fail(w, p->req, "request deadline passed%s", "");
    } else if (p->req && now > p->wait_until_ms) {
      utl_warn(w->sh.rt->w->name, "prefix fetch for %s from %s timed out: computing it", p->id, p->src->name);
      pfl_resume(w, p, 0);
    }
    // A request that went on without its fetch leaves the blocks reserved until the peer can no longer write.
    if (!p->req && (p->answered || now > p->hold_until_ms)) {
      pfl_pull_free(w, p); // *pp is now the next one
      continue;
    }
    pp = &p->next;
  }
}

// One step: plan which blocks each row completes, compute (pushing per layer), then sample first tokens.
static int step(pfl_worker *w, char *err, size_t errlen) {
  for (int i = 0; i < w->eng.n_run; i++) {
    pfl_req *r = OWNER(w->eng.run[i]);
    r->live = pfl_state_pushes(r->state);
  }
  int planned = wrk_engine_plan(&w->eng);
  for (int i = w->eng.n_run - 1; i >= 0; i--) { // admission refuses such prompts: this is only a safety net
    pfl_req *r = i < w->eng.n_run ? OWNER(w->eng.run[i]) : NULL;
    if (r && r->seq.cannot_grow && !pfl_state_draining(r->state))
      fail_with(w, r, "context_length_exceeded", "%s", "the prompt needs more KV blocks than this worker's pool has");
  }
  if (planned == 0) return 0;
  for (int i = 0; i < w->eng.n_batch; i++) { // the blocks each row completes, pushed layer by layer
    pfl_req *r = OWNER(w->eng.batch_of[i]);
    r->step_b0 = r->pushed_blocks;
    r->step_b1 = full_blocks(w, r, r->seq.n_done + w->eng.batch_chunk[i]);
  }
  if (wrk_engine_forward(&w->eng, on_layer, w, err, errlen)) return -1;
  flush_layers(w);
  int n_vocab = mdl_tok_n_vocab(w->sh.rt->tok);
  for (int i = 0; i < w->eng.n_batch; i++) {
    wrk_seq *sq = w->eng.batch_of[i];
    if (!sq) continue;
    pfl_req *r = OWNER(sq);
    if (r->live) r->pushed_blocks = r->step_b1;
    int computed = w->eng.batch[i].want_logits; // the prompt is done: its first token
    if (computed) mdl_sampler_sample(r->sampler, w->eng.logits + (size_t)i * (size_t)n_vocab, &r->first);
    if (computed && mdl_sampler_grammar_too_costly(r->sampler)) // its grammar would stall the worker: it ends here
      fail_with(w, r, "grammar_too_complex", "%s", MDL_GRAMMAR_TOO_COSTLY_MESSAGE);
    else if (r->state == PFL_PUSH_FAILED || (computed && pfl_state_pushes(r->state) && finish(w, r)))
      fail_with(w, r, "decode_failure", "KV push to %s failed", r->link->name);
    else if (computed && r->state == PFL_WAIT_TABLE)
      pfl_req_to(w, r, PFL_COMPUTED); // its table has not come: finish when it does
  }
  return 0;
}

// A request whose prefix fetch ended (fetch.c) was queued, or could not be.
static void fetch_done(pfl_worker *w, pfl_req *r, int ok) {
  if (ok) pfl_take_early_table(w, r);
  else pfl_fail(w, r, "out of memory%s", "");
}

int pfl_worker_run(const cfg_cluster *cfg, const cfg_worker *wc, char *err, size_t errlen) {
  pfl_worker w;
  memset(&w, 0, sizeof w);
  w.fetch_done = fetch_done;
  // A host pool is shareable: a peer prefill worker on this host writes fetched prefixes into it over shm.
  // The shared hello_ok fields are all a prefill worker says (the router reads kv_layout.block_size for its
  // prefix keys); decode workers send no kvxfer metadata to it, it loads theirs.
  wrk_shell_opts so = {.role = "prefill", .shareable_kv = strncmp(wc->device, "cuda", 4) != 0, .kvxfer = 1,
                       .watch_peers = 1, .ops = OPS, .n_ops = sizeof OPS / sizeof OPS[0], .on_close = on_close, .worker = &w};
  if (wrk_shell_open(&w.sh, cfg, wc, &so, err, errlen)) return -1;
  if (krn_event_new(&w.sh.rt->kc, &w.layer_ev[0], err, errlen) ||
      krn_event_new(&w.sh.rt->kc, &w.layer_ev[1], err, errlen) ||
      wrk_engine_init(&w.eng, w.sh.rt, err, errlen)) { // a configured prefix tier that cannot open stops the worker
    for (int i = 0; i < 2; i++) krn_event_free(&w.sh.rt->kc, w.layer_ev[i]);
    wrk_shell_close(&w.sh);
    return -1;
  }
  wrk_grammars_init(&w.gram, w.sh.rt->tok);
  pfl_serve_init(&w.serve, w.sh.kvx, w.sh.rt->kv, w.eng.prefix, wc->name);
  wrk_shell_announce(&w.sh);
  for (;;) {
    int waiting_only = w.eng.n_wait == 0;
    for (int i = 0; waiting_only && i < w.eng.n_run; i++)
      if (OWNER(w.eng.run[i])->seq.n_done < OWNER(w.eng.run[i])->seq.n_toks) waiting_only = 0;
    // Idle, or only waiting for tables, writes and prefix fetches (kvxfer progress is polled): block briefly;
    // otherwise take what has arrived.
    int idle = !wrk_engine_busy(&w.eng) && !w.pulls && !w.serve.n_sending;
    wrk_shell_drain(&w.sh, idle ? 1000 : (waiting_only ? 2 : 0), w.eng.prefix);
    pfl_take_notifs(&w);
    pfl_serve_poll(&w.serve);
    if (atomic_load(&w.sh.sig.stop) && !wrk_engine_busy(&w.eng) && !pfl_n_fetching(&w)) break;
    expire(&w);
    reap(&w);
    wrk_engine_admit(&w.eng, reject, &w);
    send_started(&w);
    if (step(&w, err, errlen)) {
      utl_err(wc->name, "forward step failed: %s", err);
      while (w.eng.n_run) pfl_fail(&w, OWNER(w.eng.run[0]), "forward step failed%s", "");
    }
    send_started(&w); // those the step began
    kv_events_flush(&w.sh.kvev, w.eng.prefix);
  }
  while (w.eng.n_run) req_free(&w, OWNER(w.eng.run[0]));
  while (w.eng.n_wait) req_free(&w, OWNER(w.eng.wait[0]));
  while (w.pulls) {
    req_free(&w, w.pulls->req);
    pfl_pull_free(&w, w.pulls);
  }
  while (w.n_early) drop_early(&w, 0);
  free(w.early);
  pfl_serve_fini(&w.serve);
  wrk_engine_fini(&w.eng);
  wrk_grammars_fini(&w.gram);
  for (int i = 0; i < w.n_links; i++) free(w.links[i]); // their peers die with the hub (wrk_shell_close)
  free(w.links);
  for (int i = 0; i < 2; i++) krn_event_free(&w.sh.rt->kc, w.layer_ev[i]);
  wrk_shell_close(&w.sh);
  utl_log(wc->name, "stopped");
  return 0;
}
