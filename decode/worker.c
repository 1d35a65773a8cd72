// decode/worker.c: the generation loop of a both/decode worker: admit, batch, forward, sample, stream.
// A decode worker also receives prompts' KV from prefill workers (docs/protocol.md, "Handoff").
#include "decode/worker.h"
#include "decode/handoff.h"
#include "decode/worker_int.h"
#include "proto/handoff.h"
#include "proto/request.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/hub.h"
#include "decode/stopstr.h"
#include "kv/pool.h"
#include "kv/stage.h"
#include "kv/wire.h"
#include "kvxfer/kvx.h"
#include "models/sampler.h"
#include "models/tokenizer.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/vec.h"
#include "worker/engine.h"
#include "worker/genreq.h"
#include "worker/shell.h"
#include "worker/spec.h"
#include "worker/trace.h"

// A prompt's KV must arrive within handoff_timeout_ms after the prefill worker started computing it (its
// kv_started), plus a per-token allowance for the prefill compute (a CPU prefill worker under load takes ~10 ms
// per token). Before kv_started the request waits in the prefill worker's queue: the request's own deadline
// bounds that wait, or, for a request without one, HANDOFF_QUEUE_FACTOR times handoff_timeout_ms.
#define HANDOFF_MS_PER_TOKEN 50
#define HANDOFF_QUEUE_FACTOR 10
// Blocks of a handoff we gave up on while the prefill worker may still write into them stay reserved until it
// answers kv_freed, its control link closes, or KV_HOLD_MS (at most handoff_timeout_ms) passes: a responsive prefill
// worker answers within milliseconds; the bound is for one that is stopped, hung or cut off (docs/protocol.md).
#define KV_HOLD_MS 5000


// ---- messages to the router ----

static void send_token(dec_worker *w, dec_seq *s, const char *text, size_t len, const int32_t *ids, int n_ids,
                       const mdl_sampled *lp) {
  char *t = malloc(len + 1);
  if (t) {
    memcpy(t, text, len);
    t[len] = 0;
  }
  prt_sampled one;
  prt_token tm = {.id = s->req.id, .text = t ? t : "", .tokens = (int32_t *)ids, .n_tokens = n_ids, .logprobs = &one,
                  .n_logprobs = -1};
  if (lp && s->req.n_logprobs >= 0) { // one entry, the shape kv_first carries the first token in
    kv_wire_sampled_to(lp, &one);
    tm.n_logprobs = 1;
  }
  if (w->batching && dec__batch_token(w, s, &tm) == 0) {
    free(t);
    return;
  }
  dec__flush_tokens(w, s->router); // (out of memory) what the batch holds goes first
  cJSON *m = prt_token_encode(&tm, NULL, 0);
  free(t);
  if (m) ctl_peer_send(s->router, m);
  cJSON_Delete(m);
}

static void send_done(dec_worker *w, dec_seq *s, const char *finish_reason) {
  dec__flush_tokens(w, s->router); // its tokens first
  prt_done d = {.id = s->req.id, .finish_reason = finish_reason, .prompt_tokens = s->req.n_prompt,
                .completion_tokens = s->n_gen,
                .cached_tokens = s->seq.n_cached > s->remote_cached ? s->seq.n_cached : s->remote_cached,
                .cached_store_tokens = s->seq.n_cached > s->remote_cached ? s->seq.store_tokens : s->remote_store,
                .kv_bytes = s->kv_bytes, .kv_ms = s->kv_ms, .prefill_ms = s->prefill_ms,
                .spec_drafts = s->spc.drafts, .spec_drafted = s->spc.drafted, .spec_accepted = s->spc.accepted};
  cJSON *m = prt_done_encode(&d, NULL, 0);
  if (m) ctl_peer_send(s->router, m);
  cJSON_Delete(m);
}

// ---- states (docs/protocol.md, "Handoff states") ----

static int64_t handoff_ms(const dec_worker *w) { return (int64_t)w->sh.wc->handoff_timeout_ms * DSERVE_TIMEOUT_SCALE; }

// 0 when s may go to next; else logs it loudly (an assertion in a debug build) and returns -1.
static int dec_seq_check(dec_worker *w, const dec_seq *s, dec_state next) {
  if (dec_state_legal(s->state, next)) return 0;
  utl_err(w->sh.rt->w->name, "%s: illegal handoff transition %s -> %s refused", s->req.id,
          dec_state_name(s->state), dec_state_name(next));
  assert(!"illegal decode handoff transition");
  return -1;
}

// The one place a sequence changes state: checks the transition, then does what entering next requires: the
// handoffs list (entering WAIT_TABLE, leaving the handoff states), the held list (entering HELD: the caller reserved
// room), the KV timer (the queue bound at WAIT_TABLE, the arrival bound at kv_started: KV_ARRIVING, or a GOT_* state
// going to itself). 0, or -1 when refused or out of memory (s is then as it was).
static int dec_seq_to(dec_worker *w, dec_seq *s, dec_state next) {
  dec_state from = s->state;
  if (dec_seq_check(w, s, next)) return -1;
  int64_t now = utl_now_ms();
  if (next == DEC_WAIT_TABLE) {
    if (UTL_VEC_PUSH(w->handoffs, w->n_handoffs, w->cap_handoffs, s)) return -1;
    // Until kv_started the request waits in the prefill worker's queue: its own deadline bounds that (checked
    // apart), or without one HANDOFF_QUEUE_FACTOR x handoff_timeout_ms.
    s->handoff_deadline_ms = s->deadline_ms ? INT64_MAX : now + HANDOFF_QUEUE_FACTOR * handoff_ms(w);
  } else if (dec_state_in_handoff(from) && !dec_state_in_handoff(next)) {
    for (int i = 0; i < w->n_handoffs; i++)
      if (w->handoffs[i] == s) {
        memmove(w->handoffs + i, w->handoffs + i + 1, (size_t)(w->n_handoffs - i - 1) * sizeof *w->handoffs);
        w->n_handoffs--;
        break;
      }
  }
  if (next == DEC_KV_ARRIVING || (next == from && dec_state_in_handoff(next))) // kv_started: the arrival timer
    s->handoff_deadline_ms = now + handoff_ms(w) + (int64_t)HANDOFF_MS_PER_TOKEN * s->req.n_prompt;
  if (next == DEC_HELD) {
    int64_t bound = (int64_t)KV_HOLD_MS * DSERVE_TIMEOUT_SCALE;
    s->hold_until_ms = now + (handoff_ms(w) < bound ? handoff_ms(w) : bound);
    w->held[w->n_held++] = s; // room reserved by the caller (hold)
  }
  s->state = next;
  if (next != from && next != DEC_DONE)
    utl_debug(w->sh.rt->w->name, "%s: %s -> %s", s->req.id, dec_state_name(from), dec_state_name(next));
  return 0;
}

// ---- sequences ----

static void seq_free(dec_worker *w, dec_seq *s) {
  if (!s) return;
  if (s->state != DEC_DONE) dec_seq_to(w, s, DEC_DONE);
  wrk_seq_fini(&s->seq, w->sh.rt->kv);
  mdl_sampler_free(s->sampler);
  mdl_detok_free(s->detok);
  dec_stopstr_free(&s->stop);
  wrk_genreq_free(&s->req);
  ctl_peer_unref(s->router);
  free(s);
}

static ctl_peer *prefill_peer(dec_worker *w, const char *name);
static void reject(void *arg, wrk_seq *sq, int blocks_needed);

// A handoff we give up on whose prefill worker may hold the block table and still write: kv_fail tells it, and
// the blocks stay reserved (in held) until it answers kv_freed (or the bounds above). 0 when s is held now.
static int hold(dec_worker *w, dec_seq *s) {
  if (!dec_state_may_write(s->state)) return -1; // nothing more can land
  ctl_peer *p = prefill_peer(w, s->req.prefill);
  if (!p) return -1; // its control link closed: freed at once (a prefill worker drops what its link carried)
  if (utl_vec_reserve((void **)&w->held, &w->cap_held, w->n_held + 1, sizeof *w->held)) return -1;
  cJSON *m = prt_kv_fail_encode(&(prt_kv_fail){s->req.id, "the decode worker dropped the request", NULL}, NULL, 0);
  int rc = m ? ctl_peer_send(p, m) : -1;
  cJSON_Delete(m);
  if (rc) return -1;
  dec_seq_to(w, s, DEC_HELD); // legal in every state that may write
  utl_debug(w->sh.rt->w->name, "%s: kv_fail to %s; holding %d blocks until it answers", s->req.id, s->req.prefill,
            s->seq.blocks.n);
  return 0;
}

// Releases held handoffs: from prefill worker `prefill` with id (NULL: any id; prefill NULL: any worker) whose
// hold ended (now > hold_until_ms), or all matching ones when now is 0.
static void release_held(dec_worker *w, const char *prefill, const char *id, int64_t now) {
  for (int i = w->n_held - 1; i >= 0; i--) {
    dec_seq *s = w->held[i];
    if ((prefill && strcmp(s->req.prefill, prefill)) || (id && strcmp(s->req.id, id)) || (now && now <= s->hold_until_ms))
      continue;
    if (now)
      utl_warn(w->sh.rt->w->name, "%s: %s did not answer kv_fail: releasing its blocks", s->req.id, s->req.prefill);
    w->held[i] = w->held[--w->n_held];
    seq_free(w, s);
  }
}

// Takes s out of the engine (or the handoff list: dec_seq_to) and frees it (or holds its blocks: hold).
static void seq_drop(dec_worker *w, dec_seq *s) {
  if (hold(w, s) == 0) return; // a handoff is in no engine list; its blocks stay with it
  wrk_engine_remove(&w->eng, &s->seq);
  seq_free(w, s);
}

static void seq_finish(dec_worker *w, dec_seq *s, const char *reason) {
  const char *tail;
  size_t nt, n;
  char *out;
  mdl_detok_flush(s->detok, &tail, &nt);
  if (nt) { // bytes of an unfinished character at the end: released as replacement text
    if (dec_stopstr_push(&s->stop, tail, nt, &out, &n)) reason = "stop";
    if (n) send_token(w, s, out, n, NULL, 0, NULL);
    free(out);
  }
  dec_stopstr_flush(&s->stop, &out, &n); // held-back text that never became a stop string
  if (n) send_token(w, s, out, n, NULL, 0, NULL);
  free(out);
  wrk_trace_span(&w->sh, &s->req, "decode", s->t_run_us, utl_now_us(), "dserve.completion_tokens", s->n_gen);
  dec__spec_remember(w, s);
  send_done(w, s, reason);
  w->n_finished++;
  seq_drop(w, s);
}

// Records a sampled token and streams its text; finishes the choice on a stop condition (gdone: the sampler's grammar
// was complete right after sampling it). 1 when finished.
static int seq_emit(dec_worker *w, dec_seq *s, const mdl_sampled *sm, int gdone) {
  int32_t tok = sm->token;
  if (!s->t_run_us) { // a local request's first token: its prefill phase ends here
    s->t_run_us = utl_now_us();
    s->prefill_ms = (double)(s->t_run_us - s->t_recv_us) / 1000.0;
    wrk_trace_span(&w->sh, &s->req, "prefill", s->t_recv_us, s->t_run_us, "dserve.cached_tokens", s->seq.n_cached);
    if (s->seq.store_t1_us) // the shared KV tier's read at admission (worker/kvtier.h)
      wrk_trace_span(&w->sh, &s->req, "kvstore_read", s->seq.store_t0_us, s->seq.store_t1_us, "dserve.kvstore_tokens",
                     s->seq.store_tokens);
  }
  if (wrk_seq_push(&s->seq, tok)) {
    dec__flush_tokens(w, s->router);
    wrk_send_error(s->router, s->req.id, "internal_error", "out of memory");
    seq_drop(w, s);
    return 1;
  }
  s->n_gen++;
  int is_stop = !s->req.ignore_eos && mdl_tok_is_eog(w->sh.rt->tok, tok);
  for (int i = 0; i < s->req.n_stop_ids && !is_stop; i++) is_stop = s->req.stop_ids[i] == tok;
  if (is_stop) { // the stop token counts as generated and is reported, but has no text
    send_token(w, s, "", 0, &tok, 1, sm);
    seq_finish(w, s, "stop");
    return 1;
  }
  const char *piece = "";
  char *out = NULL;
  size_t n = 0, n_out = 0;
  mdl_detok_push(s->detok, tok, &piece, &n);
  int hit = dec_stopstr_push(&s->stop, piece, n, &out, &n_out);
  send_token(w, s, out ? out : "", n_out, &tok, 1, sm);
  free(out);
  if (hit || gdone) { // a stop string, or the grammar's output is complete
    seq_finish(w, s, "stop");
    return 1;
  }
  if (s->n_gen >= s->req.max_tokens || s->seq.n_toks >= w->sh.rt->n_ctx) {
    seq_finish(w, s, "length");
    return 1;
  }
  return 0;
}

// A stream moved here from another worker (req.n_resume > 0): the sampler, the detokenizer and the stop-string matcher
// are brought to where that worker left them, so that the client's text continues with nothing repeated or lost.
// When the resumed text already ends in a stop string (the last worker died between that token and its done), the
// request is done: 1 (answered, s freed); else 0.
static int resume(dec_worker *w, dec_seq *s) {
  wrk_genreq_resume_sampler(&s->req, s->sampler);
  int hit = 0;
  for (int i = s->req.n_prompt - s->req.n_resume; i < s->req.n_prompt && !hit; i++) {
    const char *piece = "";
    char *out = NULL;
    size_t n = 0, n_out = 0;
    mdl_detok_push(s->detok, s->req.prompt[i], &piece, &n);
    hit = dec_stopstr_push(&s->stop, piece, n, &out, &n_out); // out: streamed by the last worker already
    free(out);
  }
  s->n_gen = s->req.n_resume;
  if (!hit) return 0;
  if (!strcmp(s->req.mode, "decode")) { // the prefill worker computes it for nothing: it frees its side on kv_fail
    ctl_peer *p = prefill_peer(w, s->req.prefill);
    cJSON *m = prt_kv_fail_encode(&(prt_kv_fail){s->req.id, "the stream had already ended", NULL}, NULL, 0);
    if (p && m) ctl_peer_send(p, m);
    cJSON_Delete(m);
  }
  send_done(w, s, "stop");
  seq_free(w, s);
  return 1;
}

// Builds a sequence from a generate message; on a bad request replies with an error and returns NULL.
static dec_seq *seq_from_request(dec_worker *w, ctl_peer *from, const cJSON *m) {
  char code[64] = "invalid_request", e[512];
  prt_generate g;
  int malformed = prt_generate_decode(m, &g, e, sizeof e);
  const char *id = g.id ? g.id : "";
  if (atomic_load(&w->sh.sig.stop)) {
    wrk_send_error(from, id, "unavailable", "worker is shutting down");
    prt_generate_free(&g);
    return NULL;
  }
  dec_seq *s = calloc(1, sizeof *s);
  if (!s) {
    wrk_send_error(from, id, "internal_error", "out of memory");
    prt_generate_free(&g);
    return NULL;
  }
  ctl_peer_ref(from);
  s->router = from;
  if (malformed || wrk_genreq_parse(&g, mdl_tok_n_vocab(w->sh.rt->tok), w->sh.rt->n_ctx, &w->gram, &s->req, code,
                                    sizeof code, e, sizeof e)) {
    wrk_send_error(from, id, code, "%s", e);
    prt_generate_free(&g);
    seq_free(w, s);
    return NULL;
  }
  prt_generate_free(&g);
  const char *bad = NULL;
  // Both roles prefill short prompts themselves (mode local: conditional disaggregation); only a decode
  // worker takes a prompt's KV from a prefill worker (mode decode).
  int handoff = !strcmp(s->req.mode, "decode");
  if (!strcmp(s->req.mode, "prefill") || (handoff && w->sh.rt->w->role != CFG_ROLE_DECODE))
    bad = w->sh.rt->w->role == CFG_ROLE_DECODE ? "a decode worker serves modes \"local\" and \"decode\""
                                                : "a both worker serves mode \"local\"";
  else if (handoff && !s->req.prefill[0])
    bad = "mode decode needs the prefill worker's name";
  else if (s->req.embed && strcmp(s->req.mode, "local"))
    bad = "an embedding is computed where it is sent: mode \"local\"";
  if (!bad && wrk_seq_init(&s->seq, s->req.prompt, s->req.n_prompt, s)) bad = "out of memory";
  if (!bad && dec_stopstr_init(&s->stop, (const char *const *)s->req.stop, s->req.n_stop)) bad = "out of memory";
  if (!bad && mdl_sampler_new(&s->req.sampling, mdl_tok_n_vocab(w->sh.rt->tok), s->req.prompt, s->req.n_prompt,
                              &s->sampler, e, sizeof e))
    bad = e;
  if (!bad && mdl_detok_new(w->sh.rt->tok, &s->detok, e, sizeof e)) bad = e;
  dec__spec_seq_init(w, s);
  if (!bad && s->req.embed) bad = dec__embed_init(w, s);
  if (bad) {
    wrk_send_error(from, s->req.id, "invalid_request", "%s", bad);
    seq_free(w, s);
    return NULL;
  }
  s->prefill_ms = -1;
  if (resume(w, s)) return NULL;
  s->t_recv_us = utl_now_us();
  s->t_start_ms = utl_now_ms();
  s->deadline_ms = s->req.deadline_ms ? s->t_start_ms + s->req.deadline_ms : 0;
  return s;
}

// ---- dropping requests (finding them: lookup.c) ----

typedef struct drop_reason { const char *code, *message; } drop_reason;

static void drop_fn(dec_worker *w, dec_seq *s, void *arg) {
  const drop_reason *r = arg;
  if (r && r->code) wrk_send_error(s->router, s->req.id, r->code, "%s", r->message);
  seq_drop(w, s);
}

static void drop_where(dec_worker *w, dec_seq_pred match, const void *arg, const char *code, const char *message) {
  drop_reason r = {code, message};
  dec__for_each(w, match, arg, drop_fn, code ? &r : NULL);
}

// ---- handoff (decode role) ----

static ctl_peer *prefill_peer(dec_worker *w, const char *name) {
  for (int i = 0; i < w->n_prefills; i++)
    if (!strcmp(ctl_peer_name(w->prefills[i]), name) && ctl_peer_alive(w->prefills[i])) return w->prefills[i];
  return NULL;
}

static void try_send_table(dec_worker *w, dec_seq *s) {
  if (s->state != DEC_WAIT_TABLE) return;
  // Blocks of the prompt this worker already caches (an earlier turn of the conversation) are not sent again.
  s->seq.kv_from_peer = 1; // blocks before the window get no window pages: no local layer is sent into them
  int needed = kv_pool_blocks_needed(w->sh.rt->kv, s->seq.n_toks + 1, w->sh.rt->w->max_batch_tokens);
  if (!s->seq.blocks.n && needed > kv_pool_total_blocks(w->sh.rt->kv)) { // it could never be taken: say so now
    ctl_peer *p = prefill_peer(w, s->req.prefill); // which computes it for nothing: nothing written yet (no table)
    cJSON *m = prt_kv_fail_encode(&(prt_kv_fail){s->req.id, "the decode worker's KV pool is too small", NULL}, NULL, 0);
    if (p && m) ctl_peer_send(p, m);
    cJSON_Delete(m);
    reject(w, &s->seq, needed);
    return;
  }
  if (!s->seq.blocks.n && wrk_engine_take_blocks(&w->eng, &s->seq)) return; // later, when blocks come back
  ctl_peer *p = prefill_peer(w, s->req.prefill);
  if (!p) return; // sent when the prefill worker connects
  utl_debug(w->sh.rt->w->name, "%s: block table (%d blocks) to %s", s->req.id, s->seq.blocks.n, s->req.prefill);
  prt_kv_table t = {.id = s->req.id, .skip_blocks = s->seq.n_cached / kv_pool_kv(w->sh.rt->kv)->block_size};
  cJSON *m = kv_wire_table(w->sh.rt->kv, s->seq.blocks.ids, s->seq.blocks.n, &t) ? NULL
                                                                                    : prt_kv_table_encode(&t, NULL, 0);
  free(t.pages);
  if (m && ctl_peer_send(p, m) == 0) dec_seq_to(w, s, DEC_TABLE_SENT);
  cJSON_Delete(m);
}

// Both the notification and kv_first came: the sequence joins the batch (GOT_NOTIF or GOT_FIRST -> RUNNING).
static void start(dec_worker *w, dec_seq *s) {
  if (dec_seq_to(w, s, DEC_RUNNING)) return;
  s->seq.n_done = s->req.n_prompt;
  s->seq.kv_from_peer = 0; // if it is ever preempted, it computes its tokens here, window pages and all
  int skipped = s->seq.n_cached / kv_pool_kv(w->sh.rt->kv)->block_size;
  // Sliding-window layers were sent only the blocks they read again. With layer groups the others have no window
  // pages (kv_from_peer), which the prefix store sees; with one group they must not be reused.
  int dead = 0;
  s->kv_bytes = kv_wire_handoff_bytes(w->sh.rt->kv, s->req.n_prompt, skipped, &dead);
  s->seq.no_reuse = dead && kv_pool_groups(w->sh.rt->kv) == 1;
  s->kv_ms = (double)(utl_now_ms() - s->t_start_ms);
  s->t_run_us = utl_now_us(); // the transfer's tail: from the prefill worker's first token to all of the KV here
  kv_pool_discard(w->sh.rt->kv, s->seq.blocks.ids, s->seq.blocks.n); // landed: a pool nobody reads lets it go
  wrk_trace_span(&w->sh, &s->req, "kv_transfer", s->t_first_us ? s->t_first_us : s->t_run_us, s->t_run_us,
                 "dserve.kv_bytes", s->kv_bytes);
  if (wrk_engine_start(&w->eng, &s->seq)) {
    wrk_send_error(s->router, s->req.id, "internal_error", "out of memory");
    seq_free(w, s);
    return;
  }
  mdl_sampler_accept(s->sampler, s->first.token);
  seq_emit(w, s, &s->first, mdl_sampler_grammar_done(s->sampler));
}

// ---- control messages ----

static const char *msg_id(const cJSON *m) {
  const char *id = prt_id(m);
  return id ? id : "";
}

static void on_close(void *arg, ctl_peer *peer) {
  dec_worker *w = arg;
  if (!strcmp(ctl_peer_role(peer), "prefill")) {
    for (int i = 0; i < w->n_prefills; i++)
      if (w->prefills[i] == peer) {
        ctl_peer_unref(peer);
        w->prefills[i] = w->prefills[--w->n_prefills];
        break;
      }
    drop_where(w, dec__from_prefill, ctl_peer_name(peer), "worker_failure",
               "the prefill worker failed before the prompt's KV arrived");
    release_held(w, ctl_peer_name(peer), NULL, 0);
  }
  drop_where(w, dec__routed_to, peer, NULL, NULL); // nobody left to stream to
}

// A prefill worker connected: the block tables waiting for it go out now. (A router's hello is kv_events'.)
static void on_hello(void *arg, ctl_peer *from, const cJSON *m) {
  dec_worker *w = arg;
  (void)m;
  if (strcmp(ctl_peer_role(from), "prefill")) return;
  if (UTL_VEC_PUSH(w->prefills, w->n_prefills, w->cap_prefills, from)) return;
  ctl_peer_ref(from);
  for (int i = 0; i < w->n_handoffs; i++) try_send_table(w, w->handoffs[i]);
}

static void on_generate(void *arg, ctl_peer *from, const cJSON *m) {
  dec_worker *w = arg;
  dec_seq *s = seq_from_request(w, from, m);
  if (!s) return;
  int rc;
  if (!strcmp(s->req.mode, "decode")) {
    rc = dec_seq_to(w, s, DEC_WAIT_TABLE); // the handoffs list, the queue bound
    if (!rc) try_send_table(w, s);
  } else {
    rc = dec_seq_to(w, s, DEC_RUNNING) || wrk_engine_queue(&w->eng, &s->seq);
  }
  if (rc) {
    wrk_send_error(from, s->req.id, "internal_error", "out of memory");
    seq_free(w, s);
  }
}

static void on_cancel(void *arg, ctl_peer *from, const cJSON *m) {
  dec_worker *w = arg;
  prt_cancel c;
  if (prt_cancel_decode(m, &c, NULL, 0)) return;
  dec_id_key k = {c.id, from, NULL};
  dec_seq *s = dec__find(w, &k);
  if (s) seq_drop(w, s);
}

static void on_stats(void *arg, ctl_peer *from, const cJSON *msg) {
  dec_worker *w = arg;
  (void)msg;
  prt_stats_ok st;
  prt_stats_ok_init(&st);
  st.running = w->eng.n_run;
  st.waiting = w->eng.n_wait + w->n_handoffs;
  st.finished = (double)w->n_finished;
  wrk_engine_prefix_stats(&w->eng, &st);
  cJSON *m = wrk_shell_stats_new(&w->sh, &st);
  if (!m) return;
  ctl_peer_send(from, m);
  cJSON_Delete(m);
}

// The handoff's request from prefill worker `from`, still waiting for its KV; NULL when cancelled meanwhile.
static dec_seq *handoff_of(dec_worker *w, ctl_peer *from, const char *id) {
  dec_id_key k = {id, NULL, ctl_peer_name(from)};
  dec_seq *s = dec__find(w, &k);
  return s && dec_state_in_handoff(s->state) ? s : NULL;
}

// kv_fail from the prefill worker: it gave up and writes nothing more (it sends kv_fail only once none of its
// writes can still land), so the blocks are freed at once. For a handoff we hold, its kv_fail crossed ours.
static void on_kv_fail(void *arg, ctl_peer *from, const cJSON *m) {
  dec_worker *w = arg;
  prt_kv_fail f;
  if (prt_kv_fail_decode(m, &f, NULL, 0)) return;
  dec_seq *s = handoff_of(w, from, f.id);
  if (!s) {
    release_held(w, ctl_peer_name(from), f.id, 0);
    return;
  }
  dec_seq_to(w, s, DEC_FAILED); // nothing more lands: seq_drop frees at once
  // a prompt the prefill worker refused keeps its code (the router may hear the refusal from it first, or from here)
  int refused = f.code && !strcmp(f.code, "context_length_exceeded");
  wrk_send_error(s->router, s->req.id, refused ? f.code : "worker_failure", "prefill failed: %s",
                 f.message ? f.message : "unknown");
  seq_drop(w, s);
}

// kv_freed: the prefill worker answers our kv_fail; none of its writes can land any more.
static void on_kv_freed(void *arg, ctl_peer *from, const cJSON *m) {
  prt_kv_freed f;
  if (!prt_kv_freed_decode(m, &f, NULL, 0)) release_held(arg, ctl_peer_name(from), f.id, 0);
}

// kv_started: the prefill worker admitted the prompt and computes it: the KV-arrival timer (re)starts now.
static void on_kv_started(void *arg, ctl_peer *from, const cJSON *m) {
  dec_worker *w = arg;
  prt_kv_started st;
  dec_seq *s = prt_kv_started_decode(m, &st, NULL, 0) ? NULL : handoff_of(w, from, st.id);
  if (!s || s->state == DEC_KV_ARRIVING) return;
  // TABLE_SENT -> KV_ARRIVING; after the notification or kv_first (the prefill worker finished before it said
  // kv_started, or the messages crossed) the GOT_* state goes to itself: the timer restarts all the same.
  if (dec_seq_to(w, s, s->state == DEC_TABLE_SENT ? DEC_KV_ARRIVING : s->state)) return;
  utl_debug(w->sh.rt->w->name, "%s: kv_started from %s", s->req.id, ctl_peer_name(from));
}

static void on_kv_first(void *arg, ctl_peer *from, const cJSON *m) {
  dec_worker *w = arg;
  dec_seq *s = handoff_of(w, from, msg_id(m));
  if (!s) return;
  prt_kv_first kf;
  char why[160];
  if (prt_kv_first_decode(m, &kf, why, sizeof why)) {
    wrk_send_error(s->router, s->req.id, "worker_failure", "malformed kv_first from %s (%s)", ctl_peer_name(from), why);
    seq_drop(w, s);
    return;
  }
  if (s->state == DEC_GOT_FIRST) return; // a second kv_first for one handoff: the first one stands
  int notified = s->state == DEC_GOT_NOTIF;
  if (dec_seq_check(w, s, notified ? DEC_RUNNING : DEC_GOT_FIRST)) return; // e.g. a second kv_first
  kv_wire_sampled_from(&kf.first, &s->first);
  s->remote_cached = kf.cached_tokens;
  s->remote_store = kf.cached_store_tokens;
  s->prefill_ms = kf.prefill_ms;
  s->t_first_us = utl_now_us();
  utl_debug(w->sh.rt->w->name, "%s: kv_first from %s (notif %s)", s->req.id, ctl_peer_name(from),
            notified ? "in" : "not yet");
  if (notified) start(w, s);
  else dec_seq_to(w, s, DEC_GOT_FIRST);
}

static const wrk_op OPS[] = {
    {PRT_OP_HELLO, on_hello}, {PRT_OP_GENERATE, on_generate}, {PRT_OP_CANCEL, on_cancel},
    {PRT_OP_STATS, on_stats}, {PRT_OP_KV_FIRST, on_kv_first}, {PRT_OP_KV_FAIL, on_kv_fail},
    {PRT_OP_KV_STARTED, on_kv_started}, {PRT_OP_KV_FREED, on_kv_freed},
};

// kvxfer notifications: "<request id>" once a prompt's last KV write has landed.
static void take_notifs(dec_worker *w) {
  kvx_notif nb[32];
  int n;
  while ((n = kvx_get_notifs(w->sh.kvx, nb, 32)) > 0) {
    for (int i = 0; i < n; i++) {
      char id[128];
      size_t len = nb[i].len < sizeof id - 1 ? nb[i].len : sizeof id - 1;
      memcpy(id, nb[i].msg, len);
      id[len] = 0;
      free(nb[i].msg);
      dec_id_key k = {id, NULL, nb[i].peer};
      dec_seq *s = dec__find(w, &k);
      utl_debug(w->sh.rt->w->name, "notification '%s' from %s%s", id, nb[i].peer, s ? "" : " (no such request)");
      if (s && dec_state_in_handoff(s->state) && s->state != DEC_GOT_NOTIF) { // (a second one changes nothing)
        dec_state next = s->state == DEC_GOT_FIRST ? DEC_RUNNING : DEC_GOT_NOTIF;
        if (dec_seq_check(w, s, next)) continue; // e.g. before our table was sent: not from this handoff
        // Staging: the prompt's blocks landed in the mirror; the ones we cached ourselves were not sent.
        int skip = s->seq.n_cached / kv_pool_kv(w->sh.rt->kv)->block_size;
        if (w->sh.stage && kv_stage_in(w->sh.stage, s->seq.blocks.ids + skip, s->seq.blocks.n - skip)) {
          wrk_send_error(s->router, s->req.id, "internal_error", "the prompt's KV blocks are outside the pool");
          seq_drop(w, s);
          continue;
        }
        if (next == DEC_RUNNING) start(w, s);
        else dec_seq_to(w, s, DEC_GOT_NOTIF);
      }
    }
    if (n < 32) break;
  }
}

// ---- drain ----

static void tell_draining(dec_worker *w, dec_seq *s, void *arg) {
  (void)w;
  ctl_peer ***told = arg; // (n_running + n_waiting + n_handoffs + 1) routers told, NULL-terminated
  int i = 0;
  while ((*told)[i] && (*told)[i] != s->router) i++;
  if ((*told)[i]) return;
  (*told)[i] = s->router;
  cJSON *m = prt_bare_encode(PRT_OP_DRAINING);
  if (m) ctl_peer_send(s->router, m);
  cJSON_Delete(m);
}

// SIGTERM: each router with a request here hears `draining` once, and moves those requests to other workers
// (cancelling them here) where it has any; the rest finish here within drain_timeout_s.
static void announce_drain(dec_worker *w) {
  ctl_peer **told = calloc((size_t)(w->eng.n_run + w->eng.n_wait + w->n_handoffs + 1), sizeof *told);
  if (told) dec__for_each(w, dec__any, NULL, tell_draining, &told);
  free(told);
}

// ---- scheduling ----

// A sequence that reached the KV pool's size: ends as one that reaches the model's context does (vLLM at
// max_model_len, llama-server at n_ctx): finish_reason "length", with the tokens it generated and their usage.
static void end_at_pool(dec_worker *w, dec_seq *s, int blocks_needed) {
  utl_warn(w->sh.rt->w->name, "%s: finish_reason length after %d generated tokens (%d in all): the next one needs %d "
           "KV blocks and this worker's pool has %d (kv_budget_tokens / kv_budget_mb)", s->req.id, s->n_gen,
           s->seq.n_toks, blocks_needed, kv_pool_total_blocks(w->sh.rt->kv));
  seq_finish(w, s, "length");
}

static void reject(void *arg, wrk_seq *sq, int blocks_needed) {
  dec_worker *w = arg;
  dec_seq *s = OWNER(sq);
  if (s->n_gen > 0) { // preempted (or moved here) with tokens already streamed: they stand, as at the context's end
    end_at_pool(w, s, blocks_needed);
    return;
  }
  wrk_send_error(s->router, s->req.id, "context_length_exceeded",
                 "the request needs %d KV blocks; this worker's pool has %d", blocks_needed,
                 kv_pool_total_blocks(w->sh.rt->kv));
  seq_free(w, s);
}

// Emits what verification of a drafted row decided (wrk_spec_verify), in order, as plain decode would have one step at
// a time; then the accepted positions' KV stands and the rejected ones' blocks go back (wrk_engine_accept).
static void verify(dec_worker *w, dec_seq *s, const float *logits, int n_vocab) {
  wrk_verdict v;
  dec__spec_verdict(s, logits, n_vocab, &v);
  for (int j = 0; j < v.n; j++)
    if (seq_emit(w, s, &v.tok[j], v.grammar_done[j])) return; // finished (and freed)
  if (v.too_costly) { // its grammar would stall every sequence here: it ends now
    dec__flush_tokens(w, s->router);
    wrk_send_error(s->router, s->req.id, "grammar_too_complex", "%s", MDL_GRAMMAR_TOO_COSTLY_MESSAGE);
    seq_drop(w, s);
    return;
  }
  wrk_engine_accept(&w->eng, &s->seq, v.accepted);
}

// One engine step, then sampling for every row that finished its prompt or decoded a token (and its draft).
static int step(dec_worker *w, char *err, size_t errlen) {
  dec__spec_propose(w);
  int rc = wrk_engine_step(&w->eng, NULL, NULL, err, errlen);
  for (int i = w->eng.n_run - 1; i >= 0; i--) // those the plan found could not grow end now, not at their deadline
    if (i < w->eng.n_run && w->eng.run[i]->cannot_grow)
      end_at_pool(w, OWNER(w->eng.run[i]), kv_pool_blocks_needed(w->sh.rt->kv, w->eng.run[i]->n_toks, 1));
  if (rc <= 0) return rc;
  int n_vocab = mdl_tok_n_vocab(w->sh.rt->tok);
  w->batching = 1; // the step's tokens: one message per router
  for (int i = 0; i < w->eng.n_batch; i++) {
    wrk_seq *sq = w->eng.batch_of[i];
    if (sq && sq->pool) { // an embedding: answered once its whole prompt ran (decode/embed.c)
      if (sq->n_done < sq->n_toks) continue;
      dec__embed_answer(w, OWNER(sq));
      w->n_finished++;
      seq_drop(w, OWNER(sq));
      continue;
    }
    if (!sq || !w->eng.batch[i].want_logits) continue;
    dec_seq *s = OWNER(sq);
    const float *rows = w->eng.logits + (size_t)mdl_logit_row(w->eng.batch, i) * (size_t)n_vocab;
    if (s->spec_on && sq->n_toks - sq->n_done == sq->n_draft) { // a decode row (with a draft or none)
      verify(w, s, rows, n_vocab);
      continue;
    }
    mdl_sampled sm;
    mdl_sampler_sample(s->sampler, rows, &sm);
    if (mdl_sampler_grammar_too_costly(s->sampler)) { // its grammar would stall every sequence here: it ends now
      dec__flush_tokens(w, s->router);
      wrk_send_error(s->router, s->req.id, "grammar_too_complex", "%s", MDL_GRAMMAR_TOO_COSTLY_MESSAGE);
      seq_drop(w, s);
      continue;
    }
    seq_emit(w, s, &sm, mdl_sampler_grammar_done(s->sampler));
  }
  w->batching = 0;
  dec__flush_tokens(w, NULL);
  return 0;
}

// ---- process ----

// After the shared hello_ok fields: a decode worker's kvxfer metadata, which prefill workers load to write into
// its pool.
static void hello_extra(void *arg, cJSON *ok) {
  dec_worker *w = arg;
  char *md = w->sh.kvx ? kv_wire_pack_md(w->sh.kvx) : NULL;
  if (md && prt_hello_ok_add_worker(ok, &(prt_hello_ok){.kvx_md = md})) // a prefill peer then cannot write here
    utl_err(w->sh.rt->w->name, "out of memory writing the hello_ok's kvxfer metadata");
  free(md);
}

int dec_worker_run(const cfg_cluster *cfg, const cfg_worker *wc, char *err, size_t errlen) {
  dec_worker w;
  memset(&w, 0, sizeof w);
  int decode_role = wc->role == CFG_ROLE_DECODE;
  // A decode worker's pool must be mappable by a same-host prefill worker (shm backend); a both worker
  // exchanges no KV, so it has no kvxfer agent.
  wrk_shell_opts so = {.role = cfg_role_name(wc->role), .shareable_kv = decode_role && strncmp(wc->device, "cuda", 4),
                       .kvxfer = decode_role, .hello_extra = hello_extra, .ops = OPS,
                       .n_ops = sizeof OPS / sizeof OPS[0], .on_close = on_close, .worker = &w};
  if (wrk_shell_open(&w.sh, cfg, wc, &so, err, errlen)) return -1;
  if (wrk_engine_init(&w.eng, w.sh.rt, err, errlen)) { // a configured prefix tier that cannot open stops the worker
    wrk_shell_close(&w.sh);
    return -1;
  }
  wrk_grammars_init(&w.gram, w.sh.rt->tok);
  if (dec__spec_open(&w, err, errlen)) {
    wrk_grammars_fini(&w.gram);
    wrk_engine_fini(&w.eng);
    wrk_shell_close(&w.sh);
    return -1;
  }
  wrk_shell_announce(&w.sh);
  int64_t drain_until = 0;
  for (;;) {
    int busy = wrk_engine_busy(&w.eng);
    // Block while idle (a handoff wakes us through kvx progress, polled every few ms); between steps take
    // only what has already arrived.
    wrk_shell_drain(&w.sh, busy ? 0 : (w.n_handoffs ? 2 : (w.n_held ? 50 : 1000)), w.eng.prefix);
    if (w.sh.kvx) take_notifs(&w);
    for (int i = 0; i < w.n_handoffs; i++) try_send_table(&w, w.handoffs[i]);
    if (atomic_load(&w.sh.sig.stop)) {
      if (!drain_until) {
        drain_until = utl_now_ms() + (int64_t)w.sh.wc->drain_timeout_s * 1000;
        utl_log(wc->name, "draining %d running and %d waiting requests", w.eng.n_run, w.eng.n_wait + w.n_handoffs);
        announce_drain(&w);
      }
      if ((!wrk_engine_busy(&w.eng) && !w.n_handoffs) || utl_now_ms() > drain_until) break;
    }
    int64_t now = utl_now_ms();
    // Two causes, two messages: a client's deadline is the client's to widen, KV that never came is the cluster's
    drop_where(&w, dec__past_deadline, &now, "timeout", "request deadline passed");
    drop_where(&w, dec__kv_overdue, &now, "timeout",
               "the prompt's KV did not arrive from the prefill worker in time (handoff_timeout_ms)");
    release_held(&w, NULL, NULL, now);
    wrk_engine_admit(&w.eng, reject, &w);
    if (step(&w, err, errlen)) {
      utl_err(wc->name, "forward step failed: %s", err);
      drop_where(&w, dec__any, NULL, "internal_error", "forward step failed");
    }
    kv_events_flush(&w.sh.kvev, w.eng.prefix);
  }
  drop_where(&w, dec__any, NULL, "unavailable", "worker stopped before the request finished");
  while (w.n_held) seq_free(&w, w.held[--w.n_held]); // we exit: nothing can land in our pool any more
  free(w.held);
  wrk_engine_fini(&w.eng);
  wrk_grammars_fini(&w.gram);
  spc_index_free(w.spec);
  free(w.prefills); // the peers themselves die with the hub (wrk_shell_close)
  free(w.batches);  // (empty: every step sends its own)
  free(w.handoffs);
  wrk_shell_close(&w.sh);
  utl_log(wc->name, "stopped");
  return 0;
}
