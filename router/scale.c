// router/scale.c: the scaling signals an autoscaler keys on (KEDA, HPA), per worker role, as /metrics gauges:
// workers up, sequences running and waiting, KV held by sequences and cached, and the prompt tokens still to prefill on
// prefill workers.
#include <stdio.h>

#include "router/server_int.h"

static const cfg_role ROLES[3] = {CFG_ROLE_PREFILL, CFG_ROLE_DECODE, CFG_ROLE_BOTH};

enum { N_SERIES = 6 };

// The series of role r (created on first use; owned by s->m).
static rtr_metric *series(rtr_server *s, int k, int r) {
  static const char *const name[N_SERIES] = {"dserve:role_workers", "dserve:role_running", "dserve:role_waiting",
                                             "dserve:role_kv_running_perc", "dserve:role_prefill_backlog_tokens",
                                             "dserve:role_kv_cached_perc"};
  static const char *const help[N_SERIES] = {
      "Workers of each role linked and taking work (not draining).",
      "Sequences running on the workers of each role (their stats, every second).",
      "Sequences waiting in the workers of each role (their stats, every second).",
      "KV-cache blocks held by the sequences of the workers of each role, cached blocks left out (1 = full): what "
      "autoscaling reads.",
      "Prompt tokens sent to the workers of each role and not yet handed off (the prefill backlog).",
      "KV-cache blocks of the workers of each role that only their prefix caches hold: reusable, evicted when a "
      "sequence needs the room (1 = all)."};
  if (!s->m_role[k][r]) {
    char lab[32];
    snprintf(lab, sizeof lab, "role=\"%s\"", cfg_role_name(ROLES[r]));
    s->m_role[k][r] = rtr_metrics_gauge(s->m, name[k], help[k], lab);
  }
  return s->m_role[k][r];
}

void rtr_scale_update_locked(rtr_server *s) {
  double v[N_SERIES][3] = {{0}}, total[3] = {0};
  for (int i = 0; i < s->n_links; i++) {
    const rtr_link *l = &s->links[i];
    if (!l->up) continue;
    int r = l->cfg->role == CFG_ROLE_PREFILL ? 0 : l->cfg->role == CFG_ROLE_DECODE ? 1 : 2;
    v[0][r] += !l->draining;
    v[1][r] += l->running;
    v[2][r] += l->waiting;
    if (l->total_blocks > 0) {
      v[3][r] += rtr_link_kv_running(l) * l->total_blocks;
      v[5][r] += l->evictable_blocks;
      total[r] += l->total_blocks;
    }
  }
  // A choice sent to a prefill worker holds it until its first token streams (then the KV has been handed off).
  for (const rtr_req *q = s->reqs; q; q = q->next)
    for (int i = 0; i < q->q.n; i++) {
      const rtr_choice *c = &q->ch[i];
      if (c->plink >= 0 && c->state != RTR_CH_DONE && !rtr_choice_handed_off(c)) v[4][0] += q->n_prompt + c->n_gen;
    }
  for (int r = 0; r < 3; r++) {
    v[3][r] = total[r] > 0 ? v[3][r] / total[r] : 0;
    v[5][r] = total[r] > 0 ? v[5][r] / total[r] : 0;
    for (int k = 0; k < N_SERIES; k++)
      if (k != 4 || r == 0) rtr_metric_set(series(s, k, r), v[k][r]);
  }
}
