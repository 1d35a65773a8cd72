// prefill/serve.c: answers prefix_pull: writes the prompt blocks our prefix store holds into a peer prefill worker's pool.
#include "prefill/serve.h"
#include "proto/prefix.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/wire.h"
#include "util/log.h"

#define MAX_PULL_BLOCKS (1 << 20) // tokens / block_size in one pull at most (a prompt is far shorter)

struct pfl_sink {
  pfl_sink *next;
  ctl_peer *peer;              // (owned reference) its control connection to us
  char kvx_peer[KVX_MAX_NAME]; // its kvxfer agent, loaded from the first pull's kvx_md
  wrk_kv_remote remote;        // its pool, from the first pull's kv_layout
};

struct pfl_sending {
  pfl_sending *next;
  char id[96];
  ctl_peer *to;     // (owned reference)
  int32_t *blocks;  // (owned) (n) our pool blocks being read, each with a reference we hold (pinned)
  int n;
  kvx_xfer *x;      // (owned)
};

void pfl_serve_init(pfl_serve *s, kvx_agent *kvx, kv_pool *kv, kv_prefix *prefix, const char *name) {
  memset(s, 0, sizeof *s);
  s->kvx = kvx;
  s->kv = kv;
  s->prefix = prefix;
  s->name = name;
}

static void sending_free(pfl_serve *s, pfl_sending *p) {
  kvx_xfer_free(p->x);
  for (int i = 0; i < p->n; i++) kv_pool_unref(s->kv, p->blocks[i]);
  free(p->blocks);
  ctl_peer_unref(p->to);
  free(p);
}

void pfl_serve_fini(pfl_serve *s) {
  while (s->sending) {
    pfl_sending *p = s->sending;
    s->sending = p->next;
    sending_free(s, p);
  }
  while (s->sinks) {
    pfl_sink *k = s->sinks;
    s->sinks = k->next;
    ctl_peer_unref(k->peer);
    free(k);
  }
  s->n_sending = 0;
}

static void reply(ctl_peer *to, const char *id, int n_blocks, const char *fail) {
  cJSON *m = fail ? prt_prefix_fail_encode(&(prt_prefix_fail){id, fail}, NULL, 0)
                  : prt_prefix_pulled_encode(&(prt_prefix_pulled){id, n_blocks}, NULL, 0);
  if (m) ctl_peer_send(to, m);
  cJSON_Delete(m);
}

// The peer's pool and kvxfer name: loaded from this pull when the connection has not pulled before.
static pfl_sink *sink_for(pfl_serve *s, ctl_peer *from, const prt_prefix_pull *pm, char *err, size_t errlen) {
  for (pfl_sink *k = s->sinks; k; k = k->next)
    if (k->peer == from) return k;
  pfl_sink *k = calloc(1, sizeof *k);
  if (!k) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  if (kv_wire_check_layout(pm->has_layout ? &pm->kv_layout : NULL, s->kv, &k->remote, err, errlen) ||
      kv_wire_load_md(pm->kvx_md, s->kvx, k->kvx_peer, sizeof k->kvx_peer, err, errlen)) {
    free(k);
    return NULL;
  }
  if (k->remote.n_blocks < 1) {
    snprintf(err, errlen, "the peer's kv_layout has no blocks");
    free(k);
    return NULL;
  }
  ctl_peer_ref(from);
  k->peer = from;
  k->next = s->sinks;
  s->sinks = k;
  return k;
}

void pfl_serve_on_pull(pfl_serve *s, ctl_peer *from, const cJSON *msg) {
  prt_prefix_pull pm; // on a malformed pull, its id as far as it was read (NULL: none)
  char err[256], why[300];
  int malformed = prt_prefix_pull_decode(msg, &pm, err, sizeof err);
  if (!pm.id || strlen(pm.id) >= sizeof ((pfl_sending *)0)->id) {
    utl_warn(s->name, "prefix_pull from %s without a usable id: ignored", ctl_peer_name(from));
    prt_prefix_pull_free(&pm);
    return;
  }
  const char *id = pm.id;
  const mdl_kv *kv = kv_pool_kv(s->kv);
  if (mdl_kv_groups(kv) > 1) { // peers with this model never ask (prefill/fetch.c): say why to one that does
    reply(from, id, 0, "this worker's KV pool keeps a sliding-window model's layer groups apart: no prefix fetch");
    prt_prefix_pull_free(&pm);
    return;
  }
  int bs = kv->block_size, n_tok = pm.n_tokens;
  int nb = n_tok / bs, first = pm.first;
  if (malformed || n_tok < bs || n_tok % bs || nb > MAX_PULL_BLOCKS || first >= nb) {
    snprintf(why, sizeof why, "bad prefix_pull: %s",
             malformed ? err : "tokens must be whole blocks and first one of them");
    reply(from, id, 0, why);
    prt_prefix_pull_free(&pm);
    return;
  }
  pfl_sink *k = sink_for(s, from, &pm, err, sizeof err);
  if (!k) {
    reply(from, id, 0, err);
    prt_prefix_pull_free(&pm);
    return;
  }
  // One token past the last block: the store always leaves a caller one token to compute, a pull needs none
  // (the extra token is never compared: it lies in the block after the last one matched).
  int32_t *toks = malloc(((size_t)n_tok + 1) * sizeof *toks), *theirs = pm.blocks; // theirs: (owned by pm)
  int32_t *ours = malloc((size_t)nb * sizeof *ours);
  pfl_sending *p = calloc(1, sizeof *p);
  int got = 0;
  const char *bad = NULL;
  if (!toks || !ours || !p) bad = "out of memory";
  for (int i = 0; !bad && i <= pm.n_blocks; i++) // one block id per block from first, each in the peer's pool
    if (pm.n_blocks != nb - first || (i < pm.n_blocks && theirs[i] >= k->remote.n_blocks))
      bad = "bad prefix_pull: tokens and blocks must be integers (blocks: one per block from first, in the peer's "
            "pool)";
  if (!bad) memcpy(toks, pm.tokens, (size_t)n_tok * sizeof *toks);
  if (!bad && s->prefix) {
    toks[n_tok] = 0;
    got = kv_prefix_match(s->prefix, toks, n_tok + 1, ours, nb);
    for (int i = 0; i < got && i < first; i++) kv_pool_unref(s->kv, ours[i]); // the peer holds these
  }
  int n = got > first ? got - first : 0;
  if (!bad && n > 0) {
    char note[128];
    int len = snprintf(note, sizeof note, "pull:%s", id);
    if (kv_wire_write_blocks(s->kvx, s->kv, k->kvx_peer, &k->remote, ours + first, theirs, n, 0,
                                kv_pool_cfg(s->kv)->n_layer, note, (size_t)len, &p->x, err, sizeof err))
      bad = err;
  }
  if (bad || n == 0) {
    for (int i = first; i < got; i++) kv_pool_unref(s->kv, ours[i]);
    reply(from, id, 0, bad);
    utl_debug(s->name, "prefix_pull %s from %s: %s", id, ctl_peer_name(from), bad ? bad : "not cached here");
    free(toks);
    prt_prefix_pull_free(&pm);
    free(ours);
    free(p);
    return;
  }
  memmove(ours, ours + first, (size_t)n * sizeof *ours);
  snprintf(p->id, sizeof p->id, "%s", id);
  ctl_peer_ref(from);
  p->to = from;
  p->blocks = ours;
  p->n = n;
  p->next = s->sending;
  s->sending = p;
  s->n_sending++;
  utl_debug(s->name, "prefix_pull %s from %s: writing blocks %d..%d", id, ctl_peer_name(from), first, got - 1);
  free(toks);
  prt_prefix_pull_free(&pm);
}

void pfl_serve_on_close(pfl_serve *s, ctl_peer *peer) {
  for (pfl_sink **pp = &s->sinks; *pp;) {
    pfl_sink *k = *pp;
    if (k->peer != peer) {
      pp = &k->next;
      continue;
    }
    *pp = k->next;
    ctl_peer_unref(k->peer);
    free(k);
  }
}

void pfl_serve_poll(pfl_serve *s) {
  for (pfl_sending **pp = &s->sending; *pp;) {
    pfl_sending *p = *pp;
    int st = kvx_xfer_poll(p->x);
    if (st == KVX_PENDING) {
      pp = &p->next;
      continue;
    }
    if (st == KVX_DONE) {
      reply(p->to, p->id, p->n, NULL);
      s->served_blocks += p->n;
    } else {
      char msg[320];
      snprintf(msg, sizeof msg, "KV write failed: %s", kvx_xfer_error(p->x));
      reply(p->to, p->id, 0, msg);
      utl_warn(s->name, "prefix_pull %s: %s", p->id, msg);
    }
    *pp = p->next;
    s->n_sending--;
    sending_free(s, p);
  }
}
