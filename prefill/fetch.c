// prefill/fetch.c: fetching a cached prefix from a peer prefill worker when the router hints one holds it: blocks are
// reserved, the peer writes them over kvxfer, and the request goes on with what arrived (docs/protocol.md, "Prefix
// fetch"). The serving side is prefill/serve.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/pool.h"
#include "kv/prefix.h"
#include "kv/stage.h"
#include "prefill/worker_int.h"
#include "proto/prefix.h"
#include "util/clock.h"
#include "util/log.h"

// Unlinks p and gives its remaining blocks back.
void pfl_pull_free(pfl_worker *w, pfl_pull *p) {
  for (pfl_pull **pp = &w->pulls; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  if (p->req) p->req->pull = NULL;
  for (int i = 0; i < p->n; i++) kv_pool_unref(w->sh.rt->kv, p->blocks[i]);
  free(p->blocks);
  free(p);
}

// The request waiting for p goes on with the first got blocks the peer wrote (0: none, it computes them),
// queued for admission like any other. Received blocks join its table and our prefix store.
void pfl_resume(pfl_worker *w, pfl_pull *p, int got) {
  pfl_req *r = p->req;
  p->req = NULL;
  r->pull = NULL;
  if (got > 0 && kv_stage_in(w->sh.stage, p->blocks, got)) got = 0; // staging: the peer wrote into our mirror
  if (got > 0 && kv_blocks_append(w->sh.rt->kv, &r->seq.blocks, p->blocks, got) == 0) { // the references move to r
    p->n -= got;
    memmove(p->blocks, p->blocks + got, (size_t)p->n * sizeof *p->blocks);
    int nb = r->seq.blocks.n, bs = block_size(w);
    r->seq.n_done = r->seq.n_cached = nb * bs;
    r->seq.n_inserted = nb;
    kv_prefix_insert(w->eng.prefix, r->seq.toks, nb * bs, r->seq.blocks.ids, nb);
    w->fetched_blocks += got;
  } else {
    w->fetch_misses++;
  }
  w->fetch_done(w, r, wrk_engine_queue(&w->eng, &r->seq) == 0);
}

// Resolves p once the peer answered and, when it wrote blocks, their notification arrived.
static void pull_step(pfl_worker *w, pfl_pull *p) {
  if (!p->answered || (p->req && p->got > 0 && !p->notified)) return;
  if (p->req) pfl_resume(w, p, p->got);
  pfl_pull_free(w, p);
}

// Asks prefill worker peer for the prompt's first want blocks (the router's hint) when our store holds fewer:
// takes what our pool holds (m blocks) into the request's table, reserves blocks for the rest and sends
// prefix_pull. 1 when the request now waits for the answer (resume queues it), 0 when it goes on without.
int pfl_start_pull(pfl_worker *w, pfl_req *r, const char *peer, int want) {
  kv_prefix *px = w->eng.prefix;
  int bs = block_size(w), n_prompt = r->req.n_prompt;
  if (want > (n_prompt - 1) / bs) want = (n_prompt - 1) / bs; // the last token is always computed
  if (!px || want < 1 || kv_prefix_peek(px, r->seq.toks, n_prompt, 0, NULL) >= want) return 0; // we hold it
  // A pool with layer groups (a sliding-window model) keeps a block as several pages that the peer's writes would
  // need one by one, and a block without its window pages must not be taken for whole: such a model computes the
  // prefix itself (docs/protocol.md, "Prefix fetch").
  if (kv_pool_groups(w->sh.rt->kv) > 1) return 0;
  cfg_worker q;
  if (pfl_peer_cfg(w, peer, CFG_ROLE_PREFILL, &q, NULL, 0)) {
    utl_warn(w->sh.rt->w->name, "%s: ignoring the prefix hint: '%s' is not another prefill worker of this cluster",
             r->req.id, peer);
    return 0;
  }
  w->fetches++;
  char err[256];
  pfl_link *src = pfl_link_for(w, peer, CFG_ROLE_PREFILL, PULL_LINK_TIMEOUT_MS, err, sizeof err);
  int32_t *ids = src ? malloc((size_t)want * sizeof *ids) : NULL;
  pfl_pull *p = ids ? calloc(1, sizeof *p) : NULL;
  if (!p) {
    utl_warn(w->sh.rt->w->name, "prefix fetch for %s from %s: %s", r->req.id, peer, src ? "out of memory" : err);
    free(ids);
    w->fetch_misses++;
    return 0;
  }
  int m = kv_prefix_match(px, r->seq.toks, n_prompt, ids, want);
  if (m > 0 && kv_blocks_append(w->sh.rt->kv, &r->seq.blocks, ids, m)) {
    for (int i = 0; i < m; i++) kv_pool_unref(w->sh.rt->kv, ids[i]);
    m = 0;
  }
  r->seq.n_done = r->seq.n_cached = m * bs;
  r->seq.n_inserted = m;
  int k = want - m, sent = 0; // m < want: the pool's blocks are among the ones peek counted
  if (kv_pool_alloc(w->sh.rt->kv, ids, k) == 0 ||
      (kv_prefix_evict_for(px, k) >= 0 && kv_pool_alloc(w->sh.rt->kv, ids, k) == 0)) {
    char *md = kv_wire_pack_md(w->sh.kvx); // the pool and kvxfer metadata, as hello_ok carries them
    prt_prefix_pull pp = {.id = r->req.id, .tokens = r->seq.toks, .n_tokens = want * bs, .first = m, .blocks = ids,
                          .n_blocks = k, .has_layout = 1, .kv_layout = kv_wire_layout(w->sh.rt->kv), .kvx_md = md};
    cJSON *msg = md ? prt_prefix_pull_encode(&pp, NULL, 0) : NULL;
    sent = msg && ctl_peer_send(src->peer, msg) == 0;
    cJSON_Delete(msg);
    free(md);
    if (!sent)
      for (int i = 0; i < k; i++) kv_pool_unref(w->sh.rt->kv, ids[i]);
  }
  if (!sent) { // no blocks to spare, or the link dropped: compute (what our pool held stays in the table)
    free(ids);
    free(p);
    w->fetch_misses++;
    return 0;
  }
  int64_t now = utl_now_ms();
  *p = (pfl_pull){.next = w->pulls, .req = r, .src = src, .blocks = ids, .first = m, .n = k,
                  .wait_until_ms = now + PULL_WAIT_MS, .hold_until_ms = now + PULL_HOLD_MS};
  snprintf(p->id, sizeof p->id, "%s", r->req.id);
  w->pulls = p;
  r->pull = p;
  utl_debug(w->sh.rt->w->name, "%s: fetching blocks %d..%d from %s", r->req.id, m, want - 1, peer);
  return 1;
}

// prefix_pulled / prefix_fail from the peer asked.
void pfl_on_pulled(pfl_worker *w, ctl_peer *from, const cJSON *m, int failed) {
  prt_prefix_pulled ok = {0};
  prt_prefix_fail no = {0};
  char why[256] = "";
  int bad = failed ? prt_prefix_fail_decode(m, &no, why, sizeof why) : prt_prefix_pulled_decode(m, &ok, why, sizeof why);
  const char *id = failed ? no.id : ok.id;
  if (bad) { // a pulled without a usable n_blocks counts as 0 blocks, as a fail
    if (!(id = prt_id(m))) return;
    utl_warn(w->sh.rt->w->name, "from %s: %s", ctl_peer_name(from), why);
  }
  for (pfl_pull *p = w->pulls; p; p = p->next) {
    if (p->answered || p->src->peer != from || strcmp(p->id, id)) continue;
    p->answered = 1;
    p->got = !failed && !bad && ok.n_blocks <= p->n ? ok.n_blocks : 0;
    if (failed)
      utl_warn(w->sh.rt->w->name, "prefix fetch for %s from %s failed: %s", p->id, p->src->name,
               no.message ? no.message : "no reason given");
    pull_step(w, p);
    return;
  }
}

// kvxfer notifications "pull:<id>": a peer's writes for that fetch have landed.
void pfl_take_notifs(pfl_worker *w) {
  kvx_notif nb[32];
  int n;
  while ((n = kvx_get_notifs(w->sh.kvx, nb, 32)) > 0)
    for (int i = 0; i < n; i++) {
      pfl_pull *p = NULL;
      if (nb[i].len > 5 && !memcmp(nb[i].msg, "pull:", 5))
        for (p = w->pulls; p; p = p->next)
          if (!strcmp(p->src->name, nb[i].peer) && strlen(p->id) == nb[i].len - 5 &&
              !memcmp(p->id, nb[i].msg + 5, nb[i].len - 5))
            break;
      if (p && !p->notified) {
        p->notified = 1;
        pull_step(w, p);
      } else {
        utl_debug(w->sh.rt->w->name, "unexpected kvxfer notification (%zu bytes) from %s", nb[i].len, nb[i].peer);
      }
      free(nb[i].msg);
    }
}

int pfl_n_fetching(const pfl_worker *w) {
  int n = 0;
  for (const pfl_pull *p = w->pulls; p; p = p->next) n += p->req != NULL;
  return n;
}

