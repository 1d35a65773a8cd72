// router/link_stats.c: what workers report on their links (stats_ok, kv_events) into the links, metrics and KV index.
// Called by the dispatcher thread (links.c) with s->mu held.
#include <stdio.h>
#include <string.h>

#include "proto/events.h"
#include "proto/stats.h"
#include "router/server_int.h"
#include "util/log.h"

void rtr_kv_gauge_update_locked(rtr_server *s) {
  double used = 0, total = 0;
  for (int i = 0; i < s->n_links; i++)
    if (s->links[i].up && s->links[i].total_blocks > 0) {
      used += s->links[i].total_blocks - s->links[i].free_blocks;
      total += s->links[i].total_blocks;
    }
  rtr_metric_set(s->m_kv_usage, total > 0 ? used / total : 0);
  rtr_scale_update_locked(s);
}

// Adds to counter c what a worker's running total v grew by since *last (a restarted worker counts anew).
static void counter_from_total(rtr_metric *c, double v, double *last) {
  rtr_metric_add(c, v >= *last ? v - *last : v);
  *last = v;
}

// stats_ok prefix_tiers {"pool"|"host"|"disk": {hits, queries, blocks, refused}} into the worker's labeled series
// (refused for host and disk: the pool tier never refuses a block).
static void on_prefix_tiers(rtr_server *s, rtr_link *l, const prt_tier_stats *tiers) {
  for (int t = 0; t < PRT_N_TIERS; t++) {
    const prt_tier_stats *o = &tiers[t];
    if (!o->present) continue;
    if (!l->m_tier[t][0]) {
      char lab[128];
      snprintf(lab, sizeof lab, "worker=\"%s\",tier=\"%s\"", l->cfg->name, prt_tier_names[t]);
      l->m_tier[t][0] = rtr_metrics_counter(s->m, "dserve:prefix_cache_tier_hits_total",
                                            "Prefix-cache hit tokens served from each tier of each worker.", lab);
      l->m_tier[t][1] = rtr_metrics_counter(s->m, "dserve:prefix_cache_tier_queries_total",
                                            "Prefix-cache tokens looked up in each tier of each worker.", lab);
      if (t != PRT_TIER_STORE) // the shared store's blocks are the store's own (Redis INFO keyspace)
        l->m_tier[t][2] = rtr_metrics_gauge(s->m, "dserve:prefix_cache_blocks",
                                            "Prefix-cache blocks resident in each tier of each worker.", lab);
      if (t != PRT_TIER_POOL)
        l->m_tier[t][3] = rtr_metrics_counter(s->m, "dserve:prefix_cache_tier_refused_total",
                                              "Blocks a prefix-cache tier could not store: full with nothing it may "
                                              "evict, a failed write (a full disk), or the store tier's "
                                              "write-behind queue full.", lab);
    }
    counter_from_total(l->m_tier[t][0], o->hits, &l->tier_last[t][0]);
    counter_from_total(l->m_tier[t][1], o->queries, &l->tier_last[t][1]);
    rtr_metric_set(l->m_tier[t][2], o->blocks);
    if (l->m_tier[t][3]) counter_from_total(l->m_tier[t][3], o->refused, &l->tier_last[t][2]);
  }
}

// A count of stats_ok: 0 when the worker did not send it.
static double count(double v) { return v >= 0 ? v : 0; }

void rtr_link_on_stats(rtr_server *s, rtr_link *l, const cJSON *msg) {
  if (l->gone) return; // a member that left: its last counts, still on the wire, no longer count
  prt_stats_ok st;
  char why[256];
  if (prt_stats_ok_decode(msg, &st, why, sizeof why)) { // still a sign of life; its counts read as absent
    utl_warn(LOGC, "worker %s: %s", l->cfg->name, why);
    prt_stats_ok_init(&st);
  }
  const prt_stats_ok *m = &st;
  l->running = (int)count(m->running);
  l->waiting = (int)count(m->waiting);
  l->free_blocks = (int)count(m->free_blocks);
  l->total_blocks = (int)count(m->total_blocks);
  l->evictable_blocks = (int)count(m->evictable_blocks);
  counter_from_total(s->m_prefix_hits, count(m->prefix_hits), &l->prefix_hits);
  counter_from_total(s->m_prefix_queries, count(m->prefix_queries), &l->prefix_queries);
  counter_from_total(s->m_kv_pushed, count(m->kv_bytes_pushed), &l->kv_pushed);
  on_prefix_tiers(s, l, m->tiers);
  // Refused connections: the worker's running total, and (checked as often) the router hub's own.
  counter_from_total(s->m_auth_failures, count(m->auth_failures), &l->auth_failures);
  counter_from_total(s->m_auth_failures, (double)ctl_hub_auth_failures(s->hub), &s->hub_auth_last);
  l->last_stats_ms = utl_now_ms();
  rtr_kv_gauge_update_locked(s);
  rtr_observe_stats_locked(s, l, m);
}

// {"op":"kv_events","events":[[kind, "key"], ...]}: applied in order to the link's index entries. A malformed
// entry is skipped (the index is a hint: a missed event costs a recomputation, never a wrong answer).
void rtr_link_on_kv_events(rtr_server *s, rtr_link *l, const cJSON *m) {
  prt_kv_events evs;
  if (!s->kv || prt_kv_events_decode(m, &evs, NULL, 0)) return;
  int li = (int)(l - s->links), n = 0;
  kv_event buf[256];
  for (int i = 0; i < evs.n; i++) {
    buf[n++] = (kv_event){.key = evs.ev[i].key, .kind = evs.ev[i].kind};
    if (n == (int)(sizeof buf / sizeof buf[0])) {
      rtr_kvindex_apply(s->kv, li, buf, n);
      n = 0;
    }
  }
  if (n) rtr_kvindex_apply(s->kv, li, buf, n);
  prt_kv_events_free(&evs);
}
