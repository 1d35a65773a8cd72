// worker/engine.c: admission, recompute preemption and chunked batching over the paged KV pool.
#include "worker/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

// ---- step cost model and budget (pure) ----

void wrk_stepcost_init(wrk_stepcost *c, double decay) {
  memset(c, 0, sizeof *c);
  c->decay = decay > 0 && decay <= 1 ? decay : WRK_STEPCOST_DECAY;
}

double wrk_row_kpairs(int pos0, int n) { return ((double)n * pos0 + (double)n * (n + 1) / 2) / 1000.0; }

// Tokens alone, as the model was before it had the pair term. Where the steps seen so far do not spread in size
// (all decode steps of one batch), or noise makes the slope come out non-positive, the model is proportional
// (ms = per_tok_ms * n): that overestimates what extra tokens cost when part of a step is fixed, so the budget errs
// on the side of latency until steps of other sizes (the minimum prefill chunk guarantees some) separate the terms.
static void stepcost_fit_tokens(wrk_stepcost *c) {
  double mx = c->sx / c->sw, my = c->sy / c->sw;
  double vxx = c->sxx / c->sw - mx * mx, vxy = c->sxy / c->sw - mx * my;
  c->per_kpair_ms = 0;
  if (vxx >= 1.0 && vxy > 0) {
    c->per_tok_ms = vxy / vxx;
    c->fixed_ms = my - c->per_tok_ms * mx;
    if (c->fixed_ms >= 0) return;
    c->fixed_ms = 0; // a negative intercept is noise: fit through the origin instead
    c->per_tok_ms = c->sxy / c->sxx;
  } else {
    c->fixed_ms = 0;
    c->per_tok_ms = c->sy / c->sx;
  }
  if (!(c->per_tok_ms > 1e-6)) c->per_tok_ms = 1e-6; // steps measured as free (clock granularity) still cost
}

// Both terms, when the steps seen so far separate them: pairs that vary other than in proportion to tokens (prefill
// chunks at different positions, decode rows whose contexts grow), and a fit whose every term is non-negative.
// Otherwise tokens alone (a prefill-free worker, noise).
static void stepcost_fit(wrk_stepcost *c) {
  double w = c->sw, mx = c->sx / w, mz = c->sz / w, my = c->sy / w;
  double vxx = c->sxx / w - mx * mx, vzz = c->szz / w - mz * mz, vxz = c->sxz / w - mx * mz;
  double vxy = c->sxy / w - mx * my, vzy = c->szy / w - mz * my, det = vxx * vzz - vxz * vxz;
  if (vxx >= 1.0 && vzz > 1e-9 && det > 1e-3 * vxx * vzz) { // |correlation of tokens and pairs| < 0.9995
    double a = (vxy * vzz - vzy * vxz) / det, b = (vzy * vxx - vxy * vxz) / det, f = my - a * mx - b * mz;
    if (a > 1e-6 && b >= 0 && f >= 0) {
      c->fixed_ms = f;
      c->per_tok_ms = a;
      c->per_kpair_ms = b;
      return;
    }
  }
  stepcost_fit_tokens(c);
}

void wrk_stepcost_observe(wrk_stepcost *c, int tokens, double kpairs, double ms) {
  if (tokens < 1 || !(kpairs >= 0) || !isfinite(kpairs) || !(ms >= 0) || !isfinite(ms)) return;
  double x = tokens, z = kpairs, d = c->decay;
  c->sw = d * c->sw + 1;
  c->sx = d * c->sx + x;
  c->sz = d * c->sz + z;
  c->sy = d * c->sy + ms;
  c->sxx = d * c->sxx + x * x;
  c->sxz = d * c->sxz + x * z;
  c->szz = d * c->szz + z * z;
  c->sxy = d * c->sxy + x * ms;
  c->szy = d * c->szy + z * ms;
  c->n++;
  stepcost_fit(c);
}

double wrk_stepcost_predict(const wrk_stepcost *c, int tokens, double kpairs) {
  return c->n ? c->fixed_ms + c->per_tok_ms * tokens + c->per_kpair_ms * kpairs : 0;
}

int wrk_step_chunk(const wrk_stepcost *c, double target_ms, int tokens, double kpairs, int pos, int pending, int room,
                   int min_chunk) {
  int most = pending < room ? pending : room;
  if (most < 1) return 0;
  if (!(target_ms > 0) || c->n < 1) return most;
  // The prediction grows with the chunk: bisect for the largest that fits (the epsilon keeps an exact fit whole).
  int lo = 0, hi = most;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (wrk_stepcost_predict(c, tokens + mid, kpairs + wrk_row_kpairs(pos, mid)) <= target_ms + 1e-9) lo = mid;
    else hi = mid - 1;
  }
  int floor = min_chunk < most ? min_chunk : most;
  return lo > floor ? lo : floor;
}


// ---- sequences ----

int wrk_seq_init(wrk_seq *s, const int32_t *toks, int n, void *owner) {
  memset(s, 0, sizeof *s);
  s->cap = n + 64;
  s->toks = malloc((size_t)s->cap * sizeof *s->toks);
  if (!s->toks) return -1;
  memcpy(s->toks, toks, (size_t)n * sizeof *toks);
  s->n_toks = n;
  s->owner = owner;
  return 0;
}

void wrk_seq_fini(wrk_seq *s, kv_pool *kv) {
  kv_blocks_release(kv, &s->blocks);
  free(s->blocks.ids);
  free(s->toks);
  free(s->embd);
  memset(s, 0, sizeof *s);
}

int wrk_seq_push(wrk_seq *s, int32_t tok) {
  if (s->n_toks == s->cap) {
    int32_t *nt = realloc(s->toks, (size_t)s->cap * 2 * sizeof *nt);
    if (!nt) return -1;
    s->toks = nt;
    s->cap *= 2;
  }
  s->toks[s->n_toks++] = tok;
  return 0;
}

int wrk_engine_init(wrk_engine *e, wrk_runtime *rt, char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  e->rt = rt;
  wrk_stepcost_init(&e->cost, WRK_STEPCOST_DECAY);
  int blocks = (int)(rt->w->prefix_cache_mb * 1024.0 * 1024.0 / (double)kv_pool_block_bytes(rt->kv));
  if (blocks > kv_pool_total_blocks(rt->kv)) blocks = kv_pool_total_blocks(rt->kv);
  if (blocks >= 1) {
    double bb = (double)kv_pool_block_bytes(rt->kv);
    kv_prefix_opts o = {.budget_blocks = blocks,
                         .host_blocks = (int)(rt->w->prefix_host_mb * 1024.0 * 1024.0 / bb),
                         .disk_blocks = (int)(rt->w->prefix_disk_mb * 1024.0 * 1024.0 / bb),
                         .disk_path = rt->w->prefix_disk_path, .log_name = rt->w->name};
    char why[512];
    if (kv_prefix_new(rt->kv, &o, &e->prefix, why, sizeof why)) {
      snprintf(err, errlen, "worker %s: cannot open its prefix cache (prefix_cache_mb %g, prefix_host_mb %g, "
               "prefix_disk_mb %g): %s", rt->w->name, rt->w->prefix_cache_mb, rt->w->prefix_host_mb,
               rt->w->prefix_disk_mb, why);
      return -1;
    }
  }
  if (rt->cfg && rt->cfg->has_kvstore && rt->w->role != CFG_ROLE_DECODE) {
    char why[512];
    if (wrk_kvtier_open(rt, &e->kvt, why, sizeof why)) {
      snprintf(err, errlen, "worker %s: %s", rt->w->name, why);
      kv_prefix_free(e->prefix);
      e->prefix = NULL;
      return -1;
    }
  }
  return 0;
}

void wrk_engine_fini(wrk_engine *e) {
  wrk_kvtier_close(e->kvt);
  kv_prefix_free(e->prefix);
  free(e->match_ids);
  free(e->run);
  free(e->wait);
  free(e->batch);
  free(e->batch_of);
  free(e->batch_chunk);
  free(e->batch_pool);
  free(e->logits);
  memset(e, 0, sizeof *e);
}

static int grow(wrk_engine *e) {
  if (e->n_run + e->n_wait < e->cap) return 0;
  int cap = e->cap ? e->cap * 2 : 64;
  wrk_seq **r = realloc(e->run, (size_t)cap * sizeof *r);
  if (r) e->run = r;
  wrk_seq **q = realloc(e->wait, (size_t)cap * sizeof *q);
  if (q) e->wait = q;
  mdl_seq *b = realloc(e->batch, (size_t)cap * sizeof *b);
  if (b) e->batch = b;
  wrk_seq **bo = realloc(e->batch_of, (size_t)cap * sizeof *bo);
  if (bo) e->batch_of = bo;
  int *bc = realloc(e->batch_chunk, (size_t)cap * sizeof *bc);
  if (bc) e->batch_chunk = bc;
  mdl_pool_out *bp = realloc(e->batch_pool, (size_t)cap * sizeof *bp);
  if (bp) e->batch_pool = bp;
  if (!r || !q || !b || !bo || !bc || !bp) return -1;
  e->cap = cap;
  return 0;
}

static void remove_at(wrk_seq **arr, int *n, int i) {
  memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof *arr);
  (*n)--;
}

static int find(wrk_seq *const *arr, int n, const wrk_seq *s) {
  for (int i = 0; i < n; i++)
    if (arr[i] == s) return i;
  return -1;
}

int wrk_engine_queue(wrk_engine *e, wrk_seq *s) {
  if (grow(e)) return -1;
  e->wait[e->n_wait++] = s;
  return 0;
}

int wrk_engine_start(wrk_engine *e, wrk_seq *s) {
  if (grow(e)) return -1;
  e->run[e->n_run++] = s;
  return 0;
}

void wrk_engine_remove(wrk_engine *e, wrk_seq *s) {
  int i = find(e->run, e->n_run, s);
  if (i >= 0) remove_at(e->run, &e->n_run, i);
  i = find(e->wait, e->n_wait, s);
  if (i >= 0) remove_at(e->wait, &e->n_wait, i);
  i = find(e->batch_of, e->n_batch, s);
  if (i >= 0) e->batch_of[i] = NULL; // a row of the last step whose sequence is gone
  kv_blocks_release(e->rt->kv, &s->blocks);
}

int wrk_engine_busy(const wrk_engine *e) { return e->n_run > 0 || e->n_wait > 0; }


static int block_size(const wrk_engine *e) { return kv_pool_kv(e->rt->kv)->block_size; }

// The most prompt tokens one step computes (workers[i].max_batch_tokens).
static int max_chunk(const wrk_engine *e) { return e->rt->w->max_batch_tokens; }

double wrk_draft_rho(const wrk_stepcost *c, int base_tokens, int n_decode) {
  if (c->n < 1 || !(c->fixed_ms > 0) || !(c->per_tok_ms > 0)) return base_tokens <= 8 ? 0 : 1;
  double t0 = wrk_stepcost_predict(c, base_tokens, 0), rho = t0 > 0 ? c->per_tok_ms * n_decode / t0 : 1;
  return rho < 0 ? 0 : rho > 1 ? 1 : rho;
}

double wrk_engine_draft_rho(const wrk_engine *e) {
  int base = 0, n_decode = 0;
  for (int i = 0; i < e->n_run; i++) {
    const wrk_seq *s = e->run[i];
    int pending = s->n_toks - s->n_done - s->n_draft;
    base += pending < max_chunk(e) ? pending : max_chunk(e);
    n_decode += pending == 1;
  }
  if (base > max_chunk(e)) base = max_chunk(e);
  return wrk_draft_rho(&e->cost, base, n_decode);
}

void wrk_seq_drop_draft(wrk_seq *s) {
  s->n_toks -= s->n_draft;
  s->n_draft = 0;
}

void wrk_engine_accept(wrk_engine *e, wrk_seq *s, int m) {
  if (m < 0) m = 0;
  if (m > s->n_toks - s->n_done) m = s->n_toks - s->n_done;
  s->n_done += m;
  kv_blocks_truncate(e->rt->kv, &s->blocks, s->n_toks); // the next step writes position n_toks - 1 at most
  kv_blocks_slide(e->rt->kv, &s->blocks, s->n_done);
  int full = s->n_done / block_size(e);
  if (e->prefix && full > s->n_inserted && !s->no_reuse && !s->pool) {
    kv_prefix_insert(e->prefix, s->toks, s->n_done, s->blocks.ids, full);
    s->n_inserted = full;
  }
}

// Blocks of s's prompt that steps have filled since the last call go to the shared tier's write-behind queue.
static void store_computed(wrk_engine *e, wrk_seq *s) {
  int bs = block_size(e), full = (s->n_done < s->store_upto ? s->n_done : s->store_upto) / bs;
  if (!e->kvt || s->no_reuse || full <= s->n_stored) return;
  wrk_kvtier_write(e->kvt, e->rt->kv, s->toks, s->blocks.ids, s->n_stored, full);
  s->n_stored = full;
}

// After the pool, host and disk tiers (and a peer's fetched blocks): the shared tier's run of the prompt's next full
// blocks, which join s's table and the prefix store (so the next request finds them in the pool).
static void read_store(wrk_engine *e, wrk_seq *s) {
  int bs = block_size(e), have = s->blocks.n, want = (s->n_toks - 1) / bs - have;
  if (!e->kvt || s->kv_from_peer || s->no_reuse || want < 1 || s->n_done != have * bs) return;
  if (want > e->cap_match) {
    int32_t *m = realloc(e->match_ids, (size_t)want * sizeof *m);
    if (!m) return;
    e->match_ids = m;
    e->cap_match = want;
  }
  s->store_t0_us = utl_now_us();
  int n = wrk_kvtier_read(e->kvt, e->rt->kv, e->prefix, s->toks, s->n_toks, have, e->match_ids, want);
  s->store_t1_us = utl_now_us();
  if (n > 0 && kv_blocks_append(e->rt->kv, &s->blocks, e->match_ids, n)) {
    for (int i = 0; i < n; i++) kv_pool_unref(e->rt->kv, e->match_ids[i]);
    n = 0;
  }
  if (n < 1) return;
  s->n_done = s->n_cached = (have + n) * bs;
  s->store_tokens = n * bs;
  if (e->prefix) {
    kv_prefix_insert(e->prefix, s->toks, s->n_done, s->blocks.ids, have + n);
    s->n_inserted = have + n;
  }
  kv_blocks_slide(e->rt->kv, &s->blocks, s->n_done);
}

// Makes s's table cover n_tokens positions, evicting cached blocks nobody uses (LRU, leaves first) for as long as
// the pool is short: first as many as the table lacks, then one at a time (a sliding-window pool's free count is
// in whole blocks, which can say less than a table of global-only blocks needs). -1 when the cache has nothing
// left to give and the pool is still short.
static int reserve_evicting(wrk_engine *e, wrk_seq *s, int n_tokens) {
  int bs = block_size(e);
  while (kv_blocks_reserve(e->rt->kv, &s->blocks, n_tokens) != 0) {
    if (!e->prefix) return -1;
    int lack = (n_tokens + bs - 1) / bs - s->blocks.n, have = kv_pool_free_blocks(e->rt->kv);
    if (kv_prefix_evict_for(e->prefix, lack > have ? lack : have + 1) == 0) return -1;
  }
  return 0;
}

int wrk_engine_take_blocks(wrk_engine *e, wrk_seq *s) {
  int bs = block_size(e);
  if (e->prefix && s->blocks.n == 0 && !s->pool) {
    int want = s->n_toks / bs + 1;
    if (want > e->cap_match) {
      int32_t *m = realloc(e->match_ids, (size_t)want * sizeof *m);
      if (m) {
        e->match_ids = m;
        e->cap_match = want;
      }
    }
    int n = e->cap_match >= want ? kv_prefix_match(e->prefix, s->toks, s->n_toks, e->match_ids, want) : 0;
    // Blocks that were evicted to host DRAM or disk are read back: a copy costs far less than recomputing.
    char rerr[256] = "";
    int tiers[3];
    if (e->cap_match >= want && kv_prefix_peek(e->prefix, s->toks, s->n_toks, n, tiers) > tiers[0]) {
      int r = kv_prefix_restore(e->prefix, s->toks, s->n_toks, n, e->match_ids + n, want - n, rerr, sizeof rerr);
      if (r > 0) n += r;
      if (r < 0 || rerr[0]) // the prompt goes on from what came back: the rest is recomputed
        utl_warn(e->rt->w->name, "prefix blocks held in host or disk memory could not be read back (recomputing "
                 "them): %s", rerr);
    }
    // A sliding-window model's cached blocks may lack the window pages of their layers with a window (given back
    // once every holder's window passed them): the prefix ends where the window would read one of those.
    int usable = kv_pool_usable_prefix(e->rt->kv, e->match_ids, n);
    for (int i = usable; i < n; i++) kv_pool_unref(e->rt->kv, e->match_ids[i]);
    n = usable;
    if (n > 0 && kv_blocks_append(e->rt->kv, &s->blocks, e->match_ids, n) == 0) {
      s->n_done = s->n_cached = n * bs;
      s->n_inserted = n;
      kv_blocks_slide(e->rt->kv, &s->blocks, s->n_done);
    } else {
      for (int i = 0; i < n; i++) kv_pool_unref(e->rt->kv, e->match_ids[i]);
    }
  }
  s->store_tokens = 0;
  s->store_t0_us = s->store_t1_us = 0;
  read_store(e, s);
  s->n_stored = s->n_done / bs; // what came from a cache is not written again
  s->store_upto = s->n_toks;
  int upto = s->n_toks + 1;
  if (kv_pool_groups(e->rt->kv) > 1) { // window pages (kv/pool.h)
    if (s->kv_from_peer) // the peer sends no window page before the window: those blocks get none
      kv_blocks_slide(e->rt->kv, &s->blocks, s->n_toks);
    else if (s->n_done + max_chunk(e) < upto) // the rest is taken chunk by chunk (plan), as the window moves on
      upto = s->n_done + max_chunk(e);
  }
  if (reserve_evicting(e, s, upto) == 0) return 0;
  kv_blocks_release(e->rt->kv, &s->blocks); // nothing held while it waits
  s->n_done = s->n_cached = s->n_inserted = s->n_stored = s->store_tokens = 0;
  return -1;
}

// Pool blocks that someone other than the prefix store holds: running sequences, handoffs waiting for their KV,
// pushes still in flight, prefix fetches. While there are any, a sequence that finds the pool short waits for them.
static int held_outside_cache(const wrk_engine *e) {
  int held = kv_pool_total_blocks(e->rt->kv) - kv_pool_free_blocks(e->rt->kv);
  if (e->prefix) {
    kv_prefix_stats st;
    kv_prefix_get_stats(e->prefix, &st);
    held -= st.blocks[0];
  }
  return held;
}

void wrk_engine_admit(wrk_engine *e, void (*reject)(void *arg, wrk_seq *s, int blocks_needed), void *arg) {
  int max_seqs = e->rt->w->max_seqs;
  while (e->n_wait > 0 && e->n_run < max_seqs) {
    wrk_seq *s = e->wait[0];
    int needed = kv_pool_blocks_needed(e->rt->kv, s->n_toks + 1, max_chunk(e));
    if (needed > kv_pool_total_blocks(e->rt->kv)) { // it could never run: say so now, not after the others
      remove_at(e->wait, &e->n_wait, 0);
      reject(arg, s, needed);
      continue;
    }
    if (wrk_engine_take_blocks(e, s)) {
      if (e->n_run > 0 || held_outside_cache(e) > 0) break; // blocks come back as their holders finish
      remove_at(e->wait, &e->n_wait, 0);
      reject(arg, s, needed);
      continue;
    }
    remove_at(e->wait, &e->n_wait, 0);
    e->run[e->n_run++] = s;
  }
}

// Frees the blocks of the newest sequence that is neither keep nor already in this step's batch, and
// queues it first in line to be recomputed from its tokens.
static int preempt(wrk_engine *e, const wrk_seq *keep, int n_batch) {
  for (int i = e->n_run - 1; i >= 0; i--) {
    wrk_seq *v = e->run[i];
    if (v == keep || find(e->batch_of, n_batch, v) >= 0) continue;
    wrk_seq_drop_draft(v); // recomputed from its tokens: a draft is not one of them
    kv_blocks_release(e->rt->kv, &v->blocks);
    v->n_done = v->n_cached = v->n_inserted = v->n_stored = v->store_tokens = 0;
    remove_at(e->run, &e->n_run, i);
    memmove(e->wait + 1, e->wait, (size_t)e->n_wait * sizeof *e->wait);
    e->wait[0] = v;
    e->n_wait++;
    return 0;
  }
  return -1;
}

// Once every decode row has its token and blocks: each drafted row grows to its 1 + n_draft positions (logits for all
// of them) while `room` tokens last, its blocks taken from free ones or cached ones nobody uses, never from another
// sequence; a draft that does not fit is dropped. Returns the tokens added.
static int add_drafts(wrk_engine *e, int n, int room, double *kpairs) {
  int added = 0;
  for (int i = 0; i < n; i++) {
    wrk_seq *s = e->batch_of[i];
    if (s->n_draft < 1) continue;
    mdl_seq *q = &e->batch[i];
    if (added + s->n_draft > room || reserve_evicting(e, s, s->n_toks)) {
      wrk_seq_drop_draft(s);
      q->block_table = s->blocks.ids; // a failed reserve may still have moved the table as it grew
      q->n_blocks = s->blocks.n;
      continue;
    }
    *kpairs += wrk_row_kpairs(s->n_done, 1 + s->n_draft) - wrk_row_kpairs(s->n_done, 1);
    q->n_tokens = e->batch_chunk[i] = 1 + s->n_draft;
    q->want_logits = 1 + s->n_draft;
    q->block_table = s->blocks.ids; // the table may have moved as it grew
    q->n_blocks = s->blocks.n;
    added += s->n_draft;
  }
  return added;
}

int wrk_engine_plan(wrk_engine *e) {
  int cap = max_chunk(e), used = 0, n = 0, n_decode = 0, n_prefill = 0, pooled = 0;
  double kpairs = 0;
  for (int i = 0; i < e->n_run; i++) n_decode += e->run[i]->n_toks - e->run[i]->n_done - e->run[i]->n_draft == 1;
  // the target paces prefill only while something decodes and once a step has been measured (wrk_step_chunk)
  double target = n_decode > 0 ? e->rt->w->tpot_target_ms : 0;
  e->n_batch = 0;
  for (int pass = 0; pass < 2; pass++) { // pass 0: single decode tokens; pass 1: prefill chunks, oldest first
    if (pass == 1) used += add_drafts(e, n, cap - used, &kpairs);
    for (int i = 0; i < e->n_run; i++) {
      wrk_seq *s = e->run[i];
      int pending = s->n_toks - s->n_done - s->n_draft;
      if (pending < 1 || (pass == 0) != (pending == 1)) continue;
      int chunk = pass == 0 ? 1 // decode tokens never wait behind prefills
                            : wrk_step_chunk(&e->cost, target, used, kpairs, s->n_done, pending, cap - used,
                                             n_prefill == 0 ? WRK_MIN_PREFILL_CHUNK : 0);
      if (chunk < 1) break;
      if (kv_pool_blocks_needed(e->rt->kv, s->n_done + chunk, chunk) > kv_pool_total_blocks(e->rt->kv)) {
        s->cannot_grow = 1; // the pool is its context length: preempting the others would not make room
        wrk_seq_drop_draft(s);
        continue;
      }
      int ok;
      while (!(ok = !reserve_evicting(e, s, s->n_done + chunk)) && !preempt(e, s, n))
        i = find(e->run, e->n_run, s); // the list shifted
      if (!ok) { // nothing left to take blocks from: it waits for others to finish
        wrk_seq_drop_draft(s);
        continue;
      }
      e->batch[n] = (mdl_seq){.tokens = s->toks + s->n_done, .n_tokens = chunk, .pos0 = s->n_done,
                              .block_table = s->blocks.ids, .n_blocks = s->blocks.n,
                              .want_logits = !s->pool && s->n_done + chunk == s->n_toks - s->n_draft};
      e->batch_of[n] = s;
      e->batch_chunk[n] = chunk;
      e->batch_pool[n] = (mdl_pool_out){s->pool, s->embd};
      pooled |= s->pool != 0;
      n++;
      used += chunk;
      kpairs += wrk_row_kpairs(s->n_done, chunk);
      n_prefill += pass;
    }
  }
  e->n_batch = n;
  e->batch_pooled = pooled;
  if (n == 0) e->step_t0_ms = 0; // idle until the next step: that gap is no step's cost
  return n;
}

int wrk_engine_forward(wrk_engine *e, mdl_layer_done_fn on_layer, void *arg, char *err, size_t errlen) {
  int n = e->n_batch, rows = mdl_logit_rows(e->batch, n);
  int n_vocab = mdl_llama_config(e->rt->model)->n_vocab;
  if (rows > e->cap_rows) {
    float *l = realloc(e->logits, (size_t)rows * (size_t)n_vocab * sizeof *l);
    if (!l) {
      snprintf(err, errlen, "out of memory for logits");
      return -1;
    }
    e->logits = l;
    e->cap_rows = rows;
  }
  double t0 = utl_now_ms_f();
  if (e->step_t0_ms > 0) {
    wrk_stepcost_observe(&e->cost, e->step_tokens, e->step_kpairs, t0 - e->step_t0_ms);
    if (e->cost.n % 256 == 0)
      utl_debug(e->rt->w->name, "step cost %.1f ms + %.3f ms/token + %.4f ms/1000 attention pairs (last step %d "
                "tokens, %.0f thousand pairs, %.1f ms)", e->cost.fixed_ms, e->cost.per_tok_ms, e->cost.per_kpair_ms,
                e->step_tokens, e->step_kpairs, t0 - e->step_t0_ms);
  }
  e->step_t0_ms = t0;
  e->step_tokens = 0;
  e->step_kpairs = 0;
  for (int i = 0; i < n; i++) {
    e->step_tokens += e->batch_chunk[i];
    e->step_kpairs += wrk_row_kpairs(e->batch[i].pos0, e->batch_chunk[i]);
  }
  if (mdl_llama_forward_pooled(e->rt->model, kv_pool_kv(e->rt->kv), e->batch, n, e->batch_pooled ? e->batch_pool : NULL,
                               e->logits, on_layer, arg, err, errlen)) {
    e->step_t0_ms = 0;
    return -1;
  }
  for (int i = 0; i < n; i++) {
    wrk_seq *s = e->batch_of[i];
    if (!s) continue;
    s->n_done += e->batch_chunk[i] - s->n_draft; // a draft's positions count once verified (wrk_engine_accept)
    kv_blocks_slide(e->rt->kv, &s->blocks, s->n_done); // window pages no later step reads become reclaimable
    // Blocks this step filled become reusable by later requests (prompt and generated tokens alike).
    int full = s->n_done / block_size(e);
    if (e->prefix && full > s->n_inserted && !s->no_reuse && !s->pool) {
      kv_prefix_insert(e->prefix, s->toks, s->n_done, s->blocks.ids, full);
      s->n_inserted = full;
    }
    store_computed(e, s);
  }
  return 0;
}

int wrk_engine_step(wrk_engine *e, mdl_layer_done_fn on_layer, void *arg, char *err, size_t errlen) {
  if (wrk_engine_plan(e) == 0) return 0;
  return wrk_engine_forward(e, on_layer, arg, err, errlen) ? -1 : 1;
}

void wrk_engine_prefix_stats(const wrk_engine *e, prt_stats_ok *out) {
  kv_prefix_stats st = {0};
  if (e->prefix) kv_prefix_get_stats(e->prefix, &st);
  out->prefix_hits = (double)(st.hit_tokens[0] + st.hit_tokens[1] + st.hit_tokens[2]);
  wrk_kvtier_stats(e->kvt, out); // the store tier's hits count among the prefix hits too
  if (e->kvt) out->prefix_hits += out->tiers[PRT_TIER_STORE].hits;
  out->prefix_queries = (double)st.query_tokens;
  if (!e->prefix && e->kvt) out->prefix_queries = out->tiers[PRT_TIER_STORE].queries; // the store is the only lookup
  out->prefix_cached_blocks = st.blocks[0];
  out->evictable_blocks = st.unused; // 0 without a store: every held block is a sequence's
  for (int t = 0; e->prefix && t < PRT_TIER_STORE; t++) // kv_prefix's tiers are proto's, in the same order
    if (kv_prefix_has_tier(e->prefix, t))
      out->tiers[t] = (prt_tier_stats){.present = 1, .hits = (double)st.hit_tokens[t],
                                       .queries = (double)st.tier_query_tokens[t], .blocks = st.blocks[t],
                                       .refused = (double)st.refused[t]};
}
