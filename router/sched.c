// router/sched.c: the scheduling policy: least-loaded (or best KV-overlap) both worker, or decode worker + prefill worker.
#include "router/sched.h"

#include <stdlib.h>

int rtr_sched_disagg(const rtr_disagg_rule *rule, int n_uncached, const rtr_sched_worker *dec,
                     const rtr_sched_worker *pre) {
  if (n_uncached < rule->min_tokens) return 0;
  if (rule->policy == CFG_DISAGG_THRESHOLD) return 1;
  int dec_busy = dec->inflight > 0 || dec->running > 0 || dec->waiting > 0;
  return dec_busy && (long)pre->inflight + pre->waiting <= rule->max_prefill_queue;
}

// A prefill worker that may hand its KV to decode worker d: the same pool layout (kv_type, block size, shape).
static int pairs_with(const rtr_sched_worker *p, const rtr_sched_worker *d) {
  int pb = p->block_size > 0 ? p->block_size : 16, db = d->block_size > 0 ? d->block_size : 16;
  return p->kv_type == d->kv_type && pb == db && p->n_layer == d->n_layer && p->kv_parts == d->kv_parts &&
         p->kv_width == d->kv_width && p->kv_groups == d->kv_groups;
}

int rtr_sched_pick(const rtr_sched_worker *w, int n, int n_prompt, const rtr_disagg_rule *rule,
                   rtr_sched_target *out) {
  int best_both = -1, best_dec = -1, best_pre = -1;
  long both_load = 0, dec_load = 0, pre_load = 0;
  for (int i = 0; i < n; i++) {
    if (!w[i].up) continue;
    if (w[i].role == CFG_ROLE_BOTH) {
      long load = (long)w[i].inflight + w[i].running + w[i].waiting;
      if (best_both < 0 || load < both_load) best_both = i, both_load = load;
    } else if (w[i].role == CFG_ROLE_DECODE) {
      long load = (long)(w[i].inflight > w[i].running ? w[i].inflight : w[i].running);
      if (best_dec < 0 || load < dec_load || (load == dec_load && w[i].free_blocks > w[best_dec].free_blocks))
        best_dec = i, dec_load = load;
    }
  }
  if (best_both >= 0) {
    out->decode = best_both;
    out->prefill = -1;
    return 0;
  }
  if (best_dec < 0) return -1;
  for (int i = 0; i < n; i++) {
    if (!w[i].up || w[i].role != CFG_ROLE_PREFILL || !pairs_with(&w[i], &w[best_dec])) continue;
    long load = (long)w[i].inflight + w[i].waiting;
    if (best_pre < 0 || load < pre_load) best_pre = i, pre_load = load;
  }
  out->decode = best_dec;
  out->prefill = best_pre >= 0 && rtr_sched_disagg(rule, n_prompt, &w[best_dec], &w[best_pre]) ? best_pre : -1;
  return 0;
}

static long queue_of(const rtr_sched_worker *w) {
  return w->role == CFG_ROLE_PREFILL ? (long)w->inflight + w->waiting : (long)w->inflight + w->running + w->waiting;
}

// The best worker of role among w by score (that pairs with decode worker pair, when not NULL); -1 when none is up.
// keys: scratch (max_keys).
static int best_by_kv(const rtr_sched_worker *w, int n, cfg_role role, const rtr_sched_worker *pair,
                      const int32_t *prompt, int n_prompt, const rtr_kvindex *x, const rtr_kvindex_weights *wt,
                      uint64_t *keys, int max_keys, int *overlap_out) {
  int best = -1, keys_bs = 0, n_keys = 0, best_ov = 0;
  double best_score = 0;
  long best_q = 0;
  for (int i = 0; i < n; i++) {
    if (!w[i].up || w[i].role != role || (pair && !pairs_with(&w[i], pair))) continue;
    int bs = w[i].block_size > 0 ? w[i].block_size : 16;
    if (bs != keys_bs) { // workers normally share one block size: the chain is computed once
      n_keys = kv_blockhash_chain(NULL, prompt, n_prompt, bs, keys, max_keys);
      keys_bs = bs;
    }
    long q = queue_of(&w[i]);
    int ov = rtr_kvindex_overlap(x, i, keys, n_keys);
    int n_blocks = n_prompt / bs;
    double sc = rtr_kvindex_score(wt, ov, n_blocks, (int)(q > 1000000 ? 1000000 : q), w[i].free_blocks,
                                  w[i].total_blocks);
    if (best < 0 || sc > best_score || (sc == best_score && q < best_q)) {
      best = i;
      best_score = sc;
      best_q = q;
      best_ov = ov;
    }
  }
  if (overlap_out) *overlap_out = best_ov;
  return best;
}

int rtr_sched_pick_kv(const rtr_sched_worker *w, int n, const int32_t *prompt, int n_prompt,
                      const rtr_disagg_rule *rule, const rtr_kvindex *x, const rtr_kvindex_weights *wt,
                      rtr_sched_target *out, int *overlap_out) {
  if (overlap_out) *overlap_out = 0;
  rtr_sched_target load;
  if (rtr_sched_pick(w, n, n_prompt, rule, &load) < 0) return -1;
  rtr_kvindex_weights dflt = rtr_kvindex_weights_default();
  if (!wt) wt = &dflt;
  int min_bs = 0;
  for (int i = 0; i < n; i++) {
    int bs = w[i].block_size > 0 ? w[i].block_size : 16;
    if (!min_bs || bs < min_bs) min_bs = bs;
  }
  int max_keys = n_prompt > 0 && min_bs > 0 ? n_prompt / min_bs : 0;
  uint64_t *keys = x && max_keys > 0 ? malloc((size_t)max_keys * sizeof *keys) : NULL;
  if (!keys) { // no index, no full block, or no memory: by load
    *out = load;
    return 0;
  }
  if (w[load.decode].role == CFG_ROLE_BOTH) {
    out->decode = best_by_kv(w, n, CFG_ROLE_BOTH, NULL, prompt, n_prompt, x, wt, keys, max_keys, overlap_out);
    out->prefill = -1;
  } else {
    // The decode worker that would prefill the prompt itself, and what it holds of it: a handoff (which load
    // asked for on the whole prompt) must still be worth it for the uncached rest.
    int ov = 0, local = best_by_kv(w, n, CFG_ROLE_DECODE, NULL, prompt, n_prompt, x, wt, keys, max_keys, &ov);
    int bs = w[local].block_size > 0 ? w[local].block_size : 16;
    if (load.prefill >= 0 && (ov == 0 || rtr_sched_disagg(rule, n_prompt - ov * bs, &w[local], &w[load.prefill]))) {
      out->decode = load.decode;
      out->prefill = best_by_kv(w, n, CFG_ROLE_PREFILL, &w[load.decode], prompt, n_prompt, x, wt, keys, max_keys,
                                overlap_out);
    } else {
      out->decode = local;
      out->prefill = -1;
      if (overlap_out) *overlap_out = ov;
    }
  }
  free(keys);
  return 0;
}

int rtr_sched_prefix_peer(const rtr_sched_worker *w, int n, const int32_t *prompt, int n_prompt,
                          const rtr_kvindex *x, int chosen, int min_blocks, int *blocks_out) {
  *blocks_out = 0;
  if (!x || chosen < 0 || chosen >= n || w[chosen].role != CFG_ROLE_PREFILL || n_prompt < 2) return -1;
  int bs = w[chosen].block_size > 0 ? w[chosen].block_size : 16;
  int max_keys = (n_prompt - 1) / bs;
  if (max_keys < 1) return -1;
  uint64_t *keys = malloc((size_t)max_keys * sizeof *keys);
  if (!keys) return -1;
  int n_keys = kv_blockhash_chain(NULL, prompt, n_prompt, bs, keys, max_keys);
  int own = rtr_kvindex_overlap(x, chosen, keys, n_keys), best = -1, best_ov = 0;
  for (int i = 0; i < n; i++) {
    if (i == chosen || !w[i].up || w[i].role != CFG_ROLE_PREFILL || !pairs_with(&w[i], &w[chosen])) continue;
    int ov = rtr_kvindex_overlap(x, i, keys, n_keys);
    if (ov > best_ov) best = i, best_ov = ov;
  }
  free(keys);
  if (best < 0 || best_ov - own < (min_blocks > 0 ? min_blocks : 1)) return -1;
  *blocks_out = best_ov;
  return best;
}
