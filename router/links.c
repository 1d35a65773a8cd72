// router/links.c: the worker links: connect and keep alive, dispatch worker messages, retry, pick a choice's workers.
// stats and kv_events go to link_stats.c; a choice's token/done/error go on to relay.c.
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/krn.h"
#include "models/chat.h"
#include "models/llama.h"
#include "proto/hello.h"
#include "proto/proto.h"
#include "proto/request.h"
#include "router/server_int.h"
#include "util/log.h"

#define STATS_EVERY_MS 1000

// Cancels choice ci at its worker(s) still linked.
static void send_cancel(rtr_server *s, rtr_req *r, int ci) {
  rtr_choice *c = &r->ch[ci];
  cJSON *m = prt_cancel_encode(&(prt_cancel){c->id}, NULL, 0);
  int links[2] = {c->link, c->plink};
  for (int k = 0; k < 2 && m; k++)
    if (links[k] >= 0 && s->links[links[k]].peer) ctl_peer_send(s->links[links[k]].peer, m);
  cJSON_Delete(m);
}

// ---------------------------------------------------------------------------------------------------------------
// links (one thread each) and the dispatcher

// token / done / error of choice ci, decoded. One that does not decode fails the choice as a worker error would.
static void on_choice_msg(rtr_server *s, rtr_link *l, rtr_req *r, int ci, const char *op, const cJSON *m) {
  char why[256] = "";
  int bad;
  if (!strcmp(op, PRT_OP_TOKEN)) {
    prt_token t;
    if (!(bad = prt_token_decode(m, &t, why, sizeof why))) s->hooks.on_token(s, r, ci, &t);
    prt_token_free(&t);
  } else if (!strcmp(op, PRT_OP_DONE)) {
    prt_done d;
    if (!(bad = prt_done_decode(m, &d, why, sizeof why))) s->hooks.on_done(s, r, ci, &d);
  } else {
    prt_error e;
    if (!(bad = prt_error_decode(m, &e, why, sizeof why))) s->hooks.on_error(s, r, ci, &e);
    why[0] = 0; // a malformed error reads as one without a message, as it always did
  }
  if (bad) {
    if (why[0]) utl_warn(LOGC, "worker %s: %s", l->cfg->name, why);
    prt_error e = {.id = r->ch[ci].id, .message = "the worker failed"};
    s->hooks.on_error(s, r, ci, &e);
  }
}

static void send_waiting_locked(rtr_server *s);
static void move_all_locked(rtr_server *s, int li);

// A token, done or error message m (op o) for the choice its id names; one for a choice that has moved on or ended
// is dropped.
static void on_choice_id_msg(rtr_server *s, rtr_link *l, const char *id, const char *o, const cJSON *m) {
  int ci;
  rtr_req *r = rtr_req_find_locked(s, id, &ci);
  int backlog = r && r->ch[ci].plink >= 0 && r->ch[ci].state != RTR_CH_DONE &&
                !rtr_choice_handed_off(&r->ch[ci]); // counted in the prefill backlog
  if (r) on_choice_msg(s, l, r, ci, o, m);
  if (backlog) rtr_scale_update_locked(s); // (r may be gone now) it may have left the backlog
}

// token_batch (docs/protocol.md): one step's token messages from one worker, each handled as a lone token would be.
static void on_tokens(rtr_server *s, rtr_link *l, const cJSON *m) {
  char why[256];
  const cJSON *items = prt_tokens_items(m, why, sizeof why), *it;
  if (!items) {
    utl_warn(LOGC, "worker %s: %s", l->cfg->name, why);
    return;
  }
  cJSON_ArrayForEach(it, items) {
    const char *id = prt_id(it);
    if (id) on_choice_id_msg(s, l, id, PRT_OP_TOKEN, it);
    else utl_warn(LOGC, "worker %s: token_batch: an item without an id", l->cfg->name);
  }
}

static void link_down_locked(rtr_server *s, rtr_link *l) {
  if (!l->peer) return;
  utl_warn(LOGC, "worker %s (%s:%d) disconnected", l->cfg->name, l->cfg->host, l->cfg->port);
  ctl_peer_unref(l->peer);
  l->peer = NULL;
  l->up = 0;
  int li = (int)(l - s->links);
  if (s->kv) rtr_kvindex_remove_worker(s->kv, li);
  rtr_error e;
  rtr_fail(&e, 503, "server_error", NULL, "worker_failure", "worker %s disconnected", l->cfg->name);
  for (rtr_req *r = s->reqs, *n; r; r = n) {
    n = r->next;
    int hit = 0;
    for (int i = 0; i < r->n_ch && !hit; i++)
      if (r->ch[i].state != RTR_CH_DONE &&
          (r->ch[i].link == li || (r->ch[i].plink == li && !rtr_choice_handed_off(&r->ch[i]))) &&
          (r->ch[i].link != li || rtr_move_choice_locked(s, r, i, 1) < 0))
        hit = 1;
    if (hit) rtr_fail_locked(s, r, &e);
  }
  l->inflight = 0;
  rtr_kv_gauge_update_locked(s);
  pthread_cond_broadcast(&s->link_cv);
}

// The link whose peer is p. A worker may speak (its kv_events snapshot) as soon as it has sent hello_ok, before
// the link thread (or member dialer) that connected has stored the peer: a message from an unknown peer while a link
// of that worker's name is connecting waits for it (polling, at most ~2 s) instead of being dropped. Called with mu
// held; releases it while waiting.
static rtr_link *link_of_locked(rtr_server *s, ctl_peer *p, int is_msg) {
  // the link of the last message first: a worker's messages come in runs (a step's batch, its done messages)
  if (s->last_link >= 0 && s->last_link < s->n_links && s->links[s->last_link].peer == p) return &s->links[s->last_link];
  for (int tries = 0;; tries++) {
    int connecting = 0;
    for (int i = 0; i < s->n_links; i++) {
      if (s->links[i].peer == p) {
        s->last_link = i;
        return &s->links[i];
      }
      connecting |= s->links[i].connecting && !strcmp(s->links[i].cfg->name, ctl_peer_name(p));
    }
    // a member's first connection is made by members.c's dialer, before the member has a link
    connecting |= s->hooks.member_dialling && s->hooks.member_dialling(s, ctl_peer_name(p));
    if (!is_msg || !connecting || s->stopping || tries >= 2000) return NULL;
    pthread_mutex_unlock(&s->mu);
    usleep(1000);
    pthread_mutex_lock(&s->mu);
  }
}

void *rtr_dispatcher_main(void *arg) {
  rtr_server *s = arg;
  for (;;) {
    ctl_event ev;
    int got = ctl_hub_next(s->hub, &ev, 200);
    pthread_mutex_lock(&s->mu);
    int stop = s->stopping;
    if (got) {
      rtr_link *l = link_of_locked(s, ev.peer, ev.msg != NULL);
      if (l && !ev.msg) {
        link_down_locked(s, l);
      } else if (l) {
        const char *id = prt_id(ev.msg), *o = prt_op(ev.msg);
        if (!strcmp(o, PRT_OP_PONG)) { // from the worker's hub thread: alive, however busy its compute loop is
          l->last_stats_ms = utl_now_ms();
          l->silent_moved = 0;
        } else if (!strcmp(o, PRT_OP_DRAINING)) { // SIGTERM: what it runs moves elsewhere where another worker is up
          utl_log(LOGC, "worker %s is draining; moving its streams", l->cfg->name);
          l->draining = 1;
          move_all_locked(s, (int)(l - s->links));
          rtr_kv_gauge_update_locked(s);
        } else if (!strcmp(o, PRT_OP_STATS_OK)) {
          rtr_link_on_stats(s, l, ev.msg);
        } else if (!strcmp(o, PRT_OP_KV_EVENTS)) {
          rtr_link_on_kv_events(s, l, ev.msg);
        } else if (!strcmp(o, PRT_OP_TOKENS)) {
          s->defer_wake = 1; // the readers wake after the unlock below (rtr_wake_flush)
          on_tokens(s, l, ev.msg);
          s->defer_wake = 0;
        } else if (id &&
                   (!strcmp(o, PRT_OP_TOKEN) || !strcmp(o, PRT_OP_DONE) || !strcmp(o, PRT_OP_ERROR))) {
          on_choice_id_msg(s, l, id, o, ev.msg);
        } else {
          utl_debug(LOGC, "worker %s: ignored message op '%s'", l->cfg->name, o);
        }
      }
    }
    if (!stop) {
      if (s->n_held > 0) send_waiting_locked(s); // no scan of every request per message: only while some wait
      rtr_req *who;
      rtr_error e;
      // no worker for its next choice: a request with none running fails as a new one would; one whose choices run
      // (or wait for a worker, migration_wait_ms) tries again on the next round
      if (rtr_send_new_locked(s, NULL, &who, &e) < 0 && (e.status != 503 || who->slots == 0)) rtr_fail_locked(s, who, &e);
    }
    pthread_mutex_unlock(&s->mu);
    rtr_wake_flush(s);
    if (got) ctl_event_done(&ev);
    if (stop && !got) break;
  }
  return NULL;
}


// l's KV layout in words, for the log line that names two.
static void layout_str(const rtr_link *l, char *out, size_t n) {
  snprintf(out, n, "%d layers x %d part%s of %d values, kv_type %s, blocks of %d, %d layer group%s", l->n_layer,
           l->kv_parts, l->kv_parts == 1 ? "" : "s", l->kv_width, krn_kv_type_str(l->kv_type), l->block_size,
           l->kv_groups, l->kv_groups == 1 ? "" : "s");
}

// l (a prefill or decode worker) just came up: every up worker of the other role whose KV layout differs is never
// paired with it (rtr_sched_pick): their link would be refused at the hello, and a latent or other-type block is
// never read as this one's. Said once per link-up, naming both layouts, so a mixed deployment is seen at once.
static void log_unpaired_locked(rtr_server *s, const rtr_link *l) {
  if (l->cfg->role != CFG_ROLE_PREFILL && l->cfg->role != CFG_ROLE_DECODE) return;
  for (int i = 0; i < s->n_links; i++) {
    const rtr_link *o = &s->links[i];
    if (o == l || !o->up || o->gone || o->cfg->role == l->cfg->role ||
        (o->cfg->role != CFG_ROLE_PREFILL && o->cfg->role != CFG_ROLE_DECODE))
      continue;
    if (o->kv_type == l->kv_type && o->block_size == l->block_size && o->n_layer == l->n_layer &&
        o->kv_parts == l->kv_parts && o->kv_width == l->kv_width && o->kv_groups == l->kv_groups)
      continue;
    const rtr_link *p = l->cfg->role == CFG_ROLE_PREFILL ? l : o, *d = p == l ? o : l;
    char pl[160], dl[160];
    layout_str(p, pl, sizeof pl);
    layout_str(d, dl, sizeof dl);
    utl_log(LOGC, "KV layouts differ: prefill worker %s holds %s, decode worker %s %s: never paired (%s prefills "
            "its own prompts); both must serve the same model with the same kv_type and block_size",
            p->cfg->name, pl, d->cfg->name, dl, d->cfg->name);
  }
}

// p (hello_ok read) becomes l's peer: the link is up.
static void link_up_locked(rtr_server *s, rtr_link *l, ctl_peer *p) {
  prt_hello_ok ho; // a malformed hello_ok reads as one without a worker's fields
  int read = !prt_hello_ok_decode(ctl_peer_hello(p), &ho, NULL, 0);
  l->n_ctx = read && ho.has_worker ? ho.n_ctx : 0;
  l->block_size = read && ho.has_layout && ho.kv_layout.block_size >= 1 ? ho.kv_layout.block_size : 16;
  l->kv_type = read && ho.has_layout ? ho.kv_layout.type : -1;
  l->n_layer = read && ho.has_layout ? ho.kv_layout.n_layer : 0;
  l->kv_parts = read && ho.has_layout ? ho.kv_layout.parts : 0;
  l->kv_width = read && ho.has_layout ? ho.kv_layout.width : 0;
  l->kv_groups = read && ho.has_layout ? ho.kv_layout.n_groups : 0;
  if (s->kv) rtr_kvindex_remove_worker(s->kv, (int)(l - s->links)); // a new process: it tells us anew
  l->peer = p;
  l->up = 1;
  l->draining = l->silent_moved = 0;
  l->inflight = 0;
  l->fails = 0;
  l->last_err[0] = 0;
  l->last_stats_ms = utl_now_ms();
  l->last_stats_sent_ms = 0;
  utl_log(LOGC, "worker %s (%s, %s:%d) connected", l->cfg->name, cfg_role_name(l->cfg->role), l->cfg->host,
          l->cfg->port);
  log_unpaired_locked(s, l);
  rtr_kv_gauge_update_locked(s);
}

typedef struct link_arg {
  rtr_server *s; // (borrowed)
  int li;
} link_arg;

// A link's thread. s->links may move while mu is let go (members that join grow it): l is found again by its index
// after every wait.
static void *link_main(void *arg) {
  link_arg a = *(link_arg *)arg;
  free(arg);
  rtr_server *s = a.s;
  rtr_link *l;
  int backoff = 100;
  pthread_mutex_lock(&s->mu);
  while ((l = &s->links[a.li]), !s->stopping && !l->gone) {
    if (!l->peer) {
      l->connecting = 1;
      char host[sizeof l->cfg->host];
      int port = l->cfg->port; // a member's address may change (members.c) while we connect
      char name[sizeof l->cfg->name]; // the member the proof is for: a listener that is another refuses it
      snprintf(host, sizeof host, "%s", l->cfg->host);
      snprintf(name, sizeof name, "%s", l->cfg->name);
      pthread_mutex_unlock(&s->mu);
      char err[256] = "";
      ctl_peer *p = ctl_hub_connect(s->hub, name, host, port, 1000, err, sizeof err);
      pthread_mutex_lock(&s->mu);
      l = &s->links[a.li];
      l->connecting = 0;
      if (p && !s->stopping && !l->gone && !l->peer && port == l->cfg->port && !strcmp(host, l->cfg->host)) {
        backoff = 100;
        link_up_locked(s, l, p);
        continue;
      }
      if (p) {
        ctl_peer_close(p);
        ctl_peer_unref(p);
        if (s->stopping || l->gone) break;
        continue; // its address changed while we connected: the new one
      }
      l->fails++;
      snprintf(l->last_err, sizeof l->last_err, "%s", err);
      utl_debug(LOGC, "worker %s: %s (retry in %d ms)", l->cfg->name, err, backoff);
      struct timespec dl = utl_deadline_ms(backoff);
      pthread_cond_timedwait(&s->link_cv, &s->mu, &dl);
      backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
      continue;
    }
    int64_t t = utl_now_ms();
    // not scaled by DSERVE_TIMEOUT_SCALE: the pong comes from the hub thread, however slow a (sanitized) compute step
    int dead_ms = s->rc->link_dead_ms;
    if (t - l->last_stats_ms > dead_ms) {
      utl_warn(LOGC, "worker %s answered nothing for %d ms; closing its link", l->cfg->name, dead_ms);
      ctl_peer_close(l->peer); // the dispatcher sees the close at once and fails (or moves) its requests
      l->last_stats_ms = t;
    } else if (s->rc->migrate_silent_ms > 0 && t - l->last_stats_ms > s->rc->migrate_silent_ms && !l->silent_moved) {
      // Its hub thread, which answers pings whatever the compute loop does, is silent: the process is stopped, hung
      // or cut off. Its streams continue elsewhere now rather than after link_dead_ms.
      utl_warn(LOGC, "worker %s answered nothing for %d ms; moving its streams", l->cfg->name, s->rc->migrate_silent_ms);
      l->silent_moved = 1;
      move_all_locked(s, (int)(l - s->links));
      continue;
    } else if (t - l->last_stats_sent_ms >= STATS_EVERY_MS) {
      cJSON *m = prt_bare_encode(PRT_OP_STATS), *ping = prt_bare_encode(PRT_OP_PING);
      ctl_peer *p = l->peer;
      l->last_stats_sent_ms = t;
      pthread_mutex_unlock(&s->mu);
      if (m) ctl_peer_send(p, m);
      if (ping) ctl_peer_send(p, ping);
      cJSON_Delete(m);
      cJSON_Delete(ping);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    struct timespec dl = utl_deadline_ms(250);
    pthread_cond_timedwait(&s->link_cv, &s->mu, &dl);
  }
  l->thread_done = 1;
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

int rtr_link_start_locked(rtr_server *s, int li) {
  link_arg *a = malloc(sizeof *a);
  if (!a) return -1;
  *a = (link_arg){s, li};
  rtr_link *l = &s->links[li];
  if (pthread_create(&l->thread, NULL, link_main, a)) {
    free(a);
    return -1;
  }
  l->has_thread = 1;
  return 0;
}

int rtr_server_links_up(rtr_server *s) {
  pthread_mutex_lock(&s->mu);
  int n = 0;
  for (int i = 0; i < s->n_links; i++) n += s->links[i].up;
  pthread_mutex_unlock(&s->mu);
  return n;
}

int rtr_server_serving_up(rtr_server *s) {
  pthread_mutex_lock(&s->mu);
  int n = 0;
  for (int i = 0; i < s->n_links; i++)
    n += s->links[i].up && !s->links[i].draining && !s->links[i].gone && s->links[i].cfg->role != CFG_ROLE_PREFILL;
  pthread_mutex_unlock(&s->mu);
  return n;
}

// ---------------------------------------------------------------------------------------------------------------
// where a choice goes

// The `generate` message (docs/protocol.md) for choice ci. How the router fills the fields the catalogue leaves open:
// max_tokens is always set (n_ctx - prompt when the client gave none); the sampling fields the client left out carry
// the server's defaults (config "sampling", GGUF general.sampling.*, llama-server's; see docs/openai.md), so the
// worker always gets every one explicitly; sampling.seed is seed + ci (a request without one got a random seed in
// http.c, so its choices differ and a retry of a choice repeats it); sampling.logprobs is -1 for none; stop_ids is empty (the worker ends at
// its own end-of-generation tokens unless ignore_eos); deadline_ms is a budget in ms from receipt, not a clock time.
// A moved choice (rtr_move_choice_locked) sends the prompt followed by the tokens it has streamed, with resume = their
// count: the worker continues the same stream (max_tokens still counts from the client's prompt).
// mode "prefill" names its decode worker, "decode" its prefill worker, "local" neither; prefix_peer (or NULL) and
// prefix_blocks are the prefix fetch hint. NULL on out of memory.
static cJSON *generate_msg(rtr_server *s, rtr_req *r, int ci, const char *mode, const char *prefill,
                           const char *decode, const char *prefix_peer, int prefix_blocks) {
  const rtr_request *q = &r->q;
  const rtr_choice *c = &r->ch[ci];
  int32_t *prompt = malloc((size_t)(c->n_prompt + c->n_gen) * sizeof *prompt);
  prt_bias *bias = q->n_bias ? malloc((size_t)q->n_bias * sizeof *bias) : NULL;
  cJSON *m = NULL;
  if (!prompt || (q->n_bias && !bias)) goto out;
  memcpy(prompt, c->prompt, (size_t)c->n_prompt * sizeof *prompt);
  if (c->n_gen) memcpy(prompt + c->n_prompt, c->gen, (size_t)c->n_gen * sizeof *prompt);
  for (int i = 0; i < q->n_bias; i++) bias[i] = (prt_bias){q->bias[i].id, q->bias[i].bias};
  prt_generate g = {.id = c->id, .prompt = prompt, .n_prompt = c->n_prompt + c->n_gen, .max_tokens = c->max_tokens,
                    .stop = (const char **)q->stop, .n_stop = q->n_stop, .ignore_eos = q->ignore_eos,
                    .no_spec = q->no_spec,
                    .deadline_ms = s->rc->request_timeout_ms,
                    .mode = mode, .prefill = prefill, .decode = decode, .prefix_peer = prefix_peer,
                    .prefix_blocks = prefix_peer ? prefix_blocks : 0, .resume = c->n_gen,
                    .embed = q->kind == RTR_EMBEDDING ? mdl_pool_name(s->embd_pool) : NULL};
  char traceparent[UTL_TRACEPARENT_LEN + 1];
  rtr_observe_traceparent(r, traceparent); // the workers' spans join the request's trace
  if (traceparent[0]) g.traceparent = traceparent;
  g.sampling = (prt_sampling){.temperature = q->temperature, .top_k = q->top_k, .top_p = q->top_p,
                              .min_p = q->min_p, .presence_penalty = q->presence_penalty,
                              .frequency_penalty = q->frequency_penalty,
                              .repetition_penalty = q->repetition_penalty, .has_seed = q->has_seed, // always (http.c)
                              .seed = (double)(q->seed + ci), .logprobs = q->logprobs, .logit_bias = bias,
                              .n_logit_bias = q->n_bias};
  if (q->response_format != RTR_FORMAT_TEXT) { // structured outputs: every sampler of the choice follows this grammar
    g.grammar = (prt_grammar){.type = q->json_schema ? PRT_GRAMMAR_JSON_SCHEMA : PRT_GRAMMAR_JSON,
                              .schema = q->json_schema}; // cJSON's own print: valid JSON
  } else if (q->tool_choice == RTR_TOOLS_REQUIRED || q->tool_choice == RTR_TOOLS_NAMED) { // a call must come
    const mdl_chat_tool_style *st = rtr_tool_style_of(s, q); // the call format the template shows the model
    g.grammar = (prt_grammar){.type = PRT_GRAMMAR_TOOL_CALLS, .tools = q->call_tools, .open = st->call_open,
                              .close = st->call_close, .sep = st->call_sep, .args_key = st->args_key,
                              // Llama 3's call is the whole reply: one call
                              .parallel = q->parallel_tool_calls && st->format != MDL_TOOL_FMT_LLAMA3};
  }
  m = prt_generate_encode(&g, NULL, 0);
out:
  free(prompt);
  free(bias);
  return m;
}

// Picks the worker(s) for choice ci and builds its generate message(s): msgs[*n..] (owned by the caller) for the links
// to[*n..]; *n grows by 1 (colocated) or 2 (prefill + decode). w: (s->n_links) scratch. 0, or -1 with e.
int rtr_route_choice_locked(rtr_server *s, rtr_req *r, int ci, rtr_sched_worker *w, cJSON **msgs, int *to, int *n,
                            rtr_error *e) {
  for (int i = 0; i < s->n_links; i++) {
    rtr_link *l = &s->links[i];
    w[i] = (rtr_sched_worker){l->up && !l->draining && !l->silent_moved && !l->gone, l->cfg->role, l->running,
                              l->waiting, l->free_blocks, l->total_blocks, l->inflight, l->block_size, l->kv_type,
                              l->n_layer, l->kv_parts, l->kv_width, l->kv_groups};
    if (r->q.kind == RTR_EMBEDDING && l->cfg->role == CFG_ROLE_PREFILL) w[i].up = 0; // runs where it is sent: local
  }
  rtr_choice *c = &r->ch[ci];
  // A moved choice is routed on what its next worker computes: the prompt and the tokens streamed so far.
  int32_t *toks = (int32_t *)c->prompt;
  int n_toks = c->n_prompt;
  if (c->n_gen) {
    if (!(toks = malloc((size_t)(c->n_prompt + c->n_gen) * sizeof *toks)))
      return rtr_fail(e, 500, "server_error", NULL, "internal_error", "out of memory");
    memcpy(toks, c->prompt, (size_t)c->n_prompt * sizeof *toks);
    memcpy(toks + c->n_prompt, c->gen, (size_t)c->n_gen * sizeof *toks);
    n_toks += c->n_gen;
  }
  rtr_sched_target pick;
  rtr_kvindex_weights wt = {s->rc->w_overlap, s->rc->w_queue, s->rc->w_free};
  rtr_disagg_rule rule = {s->rc->disagg_policy, s->rc->disagg_threshold, s->rc->disagg_max_prefill_queue};
  int picked = rtr_sched_pick_kv(w, s->n_links, toks, n_toks, &rule, s->kv, &wt, &pick, NULL);
  int fetch_blocks, peer = picked >= 0 && pick.prefill >= 0 && s->rc->prefix_fetch
                               ? rtr_sched_prefix_peer(w, s->n_links, toks, n_toks, s->kv, pick.prefill,
                                                       s->rc->prefix_fetch_min_blocks, &fetch_blocks)
                               : -1;
  if (toks != c->prompt) free(toks);
  if (picked < 0) return rtr_fail(e, 503, "server_error", NULL, "no_worker", "no worker that can generate is available");
  c->link = pick.decode;
  c->plink = pick.prefill;
  s->links[pick.decode].inflight++;
  if (pick.prefill >= 0) rtr_scale_update_locked(s); // the prefill backlog grew
  if (pick.prefill >= 0) {
    s->links[pick.prefill].inflight++;
    // with a peer prefill worker that holds more of the prefix: the prefill worker may fetch it
    msgs[*n] = generate_msg(s, r, ci, "prefill", NULL, s->links[pick.decode].cfg->name,
                            peer >= 0 ? s->links[peer].cfg->name : NULL, peer >= 0 ? fetch_blocks : 0);
    to[(*n)++] = pick.prefill;
    msgs[*n] = generate_msg(s, r, ci, "decode", s->links[pick.prefill].cfg->name, NULL, NULL, 0);
    to[(*n)++] = pick.decode;
  } else {
    msgs[*n] = generate_msg(s, r, ci, "local", NULL, NULL, NULL, 0);
    to[(*n)++] = pick.decode;
  }
  rtr_observe_routed_locked(s, r, ci);
  return 0;
}

// The stream of choice ci has ended by its last token (an end-of-generation token, or max_tokens) though its worker's
// `done` never came: 1 after finishing it here.
static int ended_locked(rtr_server *s, rtr_req *r, int ci) {
  rtr_choice *c = &r->ch[ci];
  int eog = c->n_gen > 0 && !r->q.ignore_eos && mdl_tok_is_eog(s->tok, c->gen[c->n_gen - 1]);
  if (!eog && c->n_gen < c->max_tokens) return 0;
  prt_done d = {.id = c->id, .finish_reason = eog ? "stop" : "length", .prompt_tokens = -1,
                .completion_tokens = c->n_gen, .cached_tokens = -1, .kv_bytes = -1, .kv_ms = -1, .prefill_ms = -1};
  s->hooks.on_done(s, r, ci, &d);
  return 1;
}

// Sends choice ci (c->link and c->plink -1) to the workers the scheduler picks now, under a new id. 0 when sent;
// -1 (c unchanged but for the id) when no worker is up.
static int send_choice_locked(rtr_server *s, rtr_req *r, int ci) {
  rtr_sched_worker *w = calloc((size_t)s->n_links + 1, sizeof *w);
  cJSON *msgs[2];
  int to[2], n = 0;
  rtr_error e;
  int rc = w ? rtr_route_choice_locked(s, r, ci, w, msgs, to, &n, &e) : -1;
  free(w);
  if (rc < 0) return -1;
  for (int i = 0; i < n; i++) {
    if (ctl_peer_send(s->links[to[i]].peer, msgs[i]) < 0) ctl_peer_close(s->links[to[i]].peer); // its close moves it
    cJSON_Delete(msgs[i]);
  }
  return 0;
}

// Fair admission (docs/reliability.md, "One request's many choices"). A request's choices are sent as slots free up,
// not all at once: each free slot goes to the admitted request with the fewest choices running (the earlier admitted
// on a tie), so a small request beside one of many choices starts at its next free slot, not after all of them. One
// request holds at most capacity - capacity / 16 slots: the rest stay for a request that comes while it runs, which
// then starts at once. A slot is kept for each queued request (admit.c: its own thread takes it, and first is sent
// before the others).
int rtr_send_new_locked(rtr_server *s, rtr_req *first, rtr_req **who, rtr_error *e) {
  int share = s->capacity - s->capacity / 16;
  if (share < 1) share = 1;
  rtr_sched_worker *w = NULL;
  int rc = 0;
  while (s->n_unsent > 0 && (first || s->running_slots + s->n_waiting < s->capacity)) {
    rtr_req *best = first;
    first = NULL;
    for (rtr_req *r = best ? NULL : s->reqs; r; r = r->next) {
      while (r->next_new < r->n_ch && r->ch[r->next_new].state != RTR_CH_NEW) r->next_new++; // ended unsent
      if (!r->admitted || r->finished || r->next_new >= r->n_ch || r->slots >= share) continue;
      if (!best || r->slots < best->slots || (r->slots == best->slots && r->t_admit_us < best->t_admit_us)) best = r;
    }
    if (!best) break;
    if (!w && !(w = calloc((size_t)s->n_links + 1, sizeof *w))) {
      *who = best;
      rc = rtr_fail(e, 500, "server_error", NULL, "internal_error", "out of memory");
      break;
    }
    int ci = best->next_new, n = 0, to[2];
    cJSON *msgs[2];
    if (rtr_route_choice_locked(s, best, ci, w, msgs, to, &n, e) < 0) { // no worker now: the next call tries again
      *who = best;
      rc = -1;
      break;
    }
    rtr_choice_to(s, best, ci, RTR_CH_ROUTED);
    if (best->q.stream) s->hooks.choice_start(best, ci); // the role comes first in every choice's stream
    for (int i = 0; i < n; i++) {
      // a link that broke after the pick is closed, so that the dispatcher moves or fails the choice with its others
      if (ctl_peer_send(s->links[to[i]].peer, msgs[i]) < 0) ctl_peer_close(s->links[to[i]].peer);
      cJSON_Delete(msgs[i]);
    }
  }
  free(w);
  return rc;
}

// Mid-stream migration (docs/reliability.md). The choice is cancelled where it ran (a dead link reaches no one) and
// sent again under "<id>-<ci>-r<k>" with the tokens it has streamed, so the next worker continues the same stream; a
// choice with no token yet simply starts again. At most router.migration_limit moves per choice (a choice with no
// token may always move once: the retry of before). Messages still coming under the old id are dropped
// (rtr_req_find_locked), so the client sees each token once.
int rtr_move_choice_locked(rtr_server *s, rtr_req *r, int ci, int may_wait) {
  rtr_choice *c = &r->ch[ci];
  int limit = s->rc->migration_limit;
  if (c->completion_tokens == 0 && limit < 1) limit = 1;
  if (c->state == RTR_CH_DONE || c->state == RTR_CH_WAITING_WORKER || r->finished || !r->admitted ||
      c->resends >= limit)
    return -1;
  if (ended_locked(s, r, ci)) return 0;
  char old[64];
  int from = c->link, pfrom = c->plink;
  snprintf(old, sizeof old, "%s", c->id);
  snprintf(c->id, sizeof c->id, "%s-%d-r%d", r->id, ci, c->resends + 1);
  c->link = c->plink = -1;
  int sent = send_choice_locked(s, r, ci);
  if (sent < 0 && (!may_wait || s->rc->migration_wait_ms <= 0)) { // stays where it is (or fails, as the caller says)
    snprintf(c->id, sizeof c->id, "%s", old);
    c->link = from;
    c->plink = pfrom;
    return -1;
  }
  int nl = c->link, np = c->plink;
  snprintf(c->id, sizeof c->id, "%s", old);
  c->link = from;
  c->plink = pfrom;
  send_cancel(s, r, ci); // under the old id, to whichever of its workers is still linked
  rtr_choice_unlink_locked(s, c);
  c->link = nl;
  c->plink = np;
  c->resends++;
  rtr_observe_moved_locked(s, r, ci);
  snprintf(c->id, sizeof c->id, "%s-%d-r%d", r->id, ci, c->resends);
  rtr_choice_to(s, r, ci, sent < 0 ? RTR_CH_WAITING_WORKER : RTR_CH_ROUTED); // no worker holds it yet / the new ones
  const char *fname = from >= 0 ? s->links[from].cfg->name : "?";
  if (sent < 0) {
    utl_log(LOGC, "%s: worker %s is gone after %d tokens; no worker is up: waiting up to %d ms for one", old, fname,
            c->n_gen, s->rc->migration_wait_ms);
    return 0;
  }
  utl_log(LOGC, "%s: worker %s is gone after %d tokens; continuing on %s%s%s as %s", old, fname, c->n_gen,
          s->links[c->link].cfg->name, c->plink >= 0 ? " via " : "", c->plink >= 0 ? s->links[c->plink].cfg->name : "",
          c->id);
  return 0;
}

// Choices waiting for a worker (rtr_move_choice_locked with no worker up): sent when one is, failed at their bound.
// Also recounts s->n_held (a request freed with a choice still held would otherwise keep the scan going).
static void send_waiting_locked(rtr_server *s) {
  int64_t now = utl_now_ms();
  for (rtr_req *r = s->reqs, *nx; r; r = nx) {
    nx = r->next;
    for (int i = 0; i < r->n_ch && !r->finished; i++) {
      rtr_choice *c = &r->ch[i];
      if (c->state == RTR_CH_DECODE_LOST && now > c->until_ms) {
        // its decode worker's link stayed up (a restarted worker the prefill worker had not linked to yet, or only
        // the prefill-decode path broke): sent again while its moves last, failed after
        char pname[64], dname[64];
        snprintf(pname, sizeof pname, "%s", c->plink >= 0 ? s->links[c->plink].cfg->name : "?");
        snprintf(dname, sizeof dname, "%s", c->link >= 0 ? s->links[c->link].cfg->name : "?");
        if (rtr_move_choice_locked(s, r, i, 1) < 0) {
          rtr_error e;
          rtr_fail(&e, 503, "server_error", NULL, "worker_failure", "prefill worker %s lost decode worker %s", pname,
                   dname);
          rtr_fail_locked(s, r, &e);
          break;
        }
        continue;
      }
      if (c->state != RTR_CH_WAITING_WORKER) continue;
      if (send_choice_locked(s, r, i) == 0) {
        rtr_choice_to(s, r, i, RTR_CH_ROUTED);
        utl_log(LOGC, "%s: continuing on %s%s%s", c->id, s->links[c->link].cfg->name, c->plink >= 0 ? " via " : "",
                c->plink >= 0 ? s->links[c->plink].cfg->name : "");
      } else if (now > c->until_ms) {
        rtr_error e;
        rtr_fail(&e, 503, "server_error", NULL, "worker_failure",
                 "its worker went away and no other came up within %d ms", s->rc->migration_wait_ms);
        rtr_fail_locked(s, r, &e);
      }
    }
  }
  int held = 0;
  for (rtr_req *r = s->reqs; r; r = r->next)
    for (int i = 0; i < r->n_ch; i++)
      held += r->ch[i].state == RTR_CH_DECODE_LOST || r->ch[i].state == RTR_CH_WAITING_WORKER;
  s->n_held = held;
}

// Moves the choices running on link li elsewhere (its worker drains or is silent); those that cannot move stay.
static void move_all_locked(rtr_server *s, int li) {
  for (rtr_req *r = s->reqs, *nx; r; r = nx) {
    nx = r->next;
    for (int i = 0; i < r->n_ch; i++)
      if (r->ch[i].state != RTR_CH_DONE && r->ch[i].link == li) rtr_move_choice_locked(s, r, i, 0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// members (discovery): links that come and go

// A choice of a listed request (finished ones too: their index stays in the choice) names link li.
static int slot_in_use_locked(rtr_server *s, int li) {
  for (rtr_req *r = s->reqs; r; r = r->next)
    for (int i = 0; i < r->q.n; i++)
      if (r->ch[i].link == li || r->ch[i].plink == li) return 1;
  return 0;
}

static void capacity_locked(rtr_server *s) {
  int c = s->capacity_static;
  for (int i = 0; i < s->n_links; i++)
    if (s->links[i].is_member && !s->links[i].gone && s->links[i].cfg->role != CFG_ROLE_PREFILL)
      c += s->links[i].cfg->max_seqs;
  s->capacity = c > 0 ? c : 64;
  pthread_cond_broadcast(&s->admit_cv); // requests waiting for room may fit now
}

// Room for one more link: the array (and the KV index's workers) doubled when full. 0, or -1 out of memory.
static int grow_locked(rtr_server *s) {
  if (s->n_links < s->cap_links) return 0;
  int cap = s->cap_links ? 2 * s->cap_links : 16;
  rtr_link *nl = realloc(s->links, (size_t)(cap + 1) * sizeof *nl);
  if (!nl) return -1;
  memset(nl + s->cap_links, 0, (size_t)(cap + 1 - s->cap_links) * sizeof *nl);
  for (int i = 0; i < s->n_links; i++)
    if (nl[i].is_member) nl[i].cfg = &nl[i].member; // it pointed into the old array
  s->links = nl;
  s->cap_links = cap;
  if (s->kv && rtr_kvindex_grow(s->kv, cap) < 0) // the index is a hint: without it the link routes by load
    utl_warn(LOGC, "out of memory: the KV-aware index covers %d links", s->n_links);
  return 0;
}

int rtr_links_attach_locked(rtr_server *s, const cfg_worker *w, int64_t incarnation, ctl_peer *p) {
  int li = -1;
  // a slot a member left whose thread has ended and that no choice still names, else a new one
  for (int i = 0; i < s->n_links && li < 0; i++)
    if (s->links[i].is_member && s->links[i].gone && s->links[i].thread_done && !slot_in_use_locked(s, i)) li = i;
  if (li < 0 && grow_locked(s) == 0) li = s->n_links++;
  if (li < 0) {
    utl_err(LOGC, "out of memory: worker %s not linked", w->name);
    ctl_peer_close(p);
    ctl_peer_unref(p);
    return -1;
  }
  rtr_link *l = &s->links[li];
  if (l->has_thread) pthread_join(l->thread, NULL); // it has returned (thread_done)
  memset(l, 0, sizeof *l);
  l->s = s;
  l->member = *w;
  l->cfg = &l->member;
  l->is_member = 1;
  l->incarnation = incarnation;
  link_up_locked(s, l, p);
  if (rtr_link_start_locked(s, li) < 0) { // no keep-alive: no link (the dispatcher hears the close)
    utl_err(LOGC, "cannot start a link thread: worker %s not linked", w->name);
    l->gone = l->thread_done = 1;
    ctl_peer_close(l->peer);
    return -1;
  }
  capacity_locked(s);
  return li;
}

void rtr_links_update_locked(rtr_server *s, int li, const cfg_worker *w, int64_t incarnation) {
  rtr_link *l = &s->links[li];
  int moved = strcmp(l->member.host, w->host) || l->member.port != w->port || l->member.role != w->role;
  if (!moved && l->incarnation == incarnation) {
    l->member = *w; // capacity and the like
    capacity_locked(s);
    return;
  }
  utl_log(LOGC, "worker %s restarted (incarnation %lld -> %lld%s); dropping what the old one held", w->name,
          (long long)l->incarnation, (long long)incarnation, moved ? ", new address" : "");
  l->member = *w;
  l->incarnation = incarnation;
  if (l->peer) ctl_peer_close(l->peer); // the dispatcher hears the close: its choices move, its KV index goes
  capacity_locked(s);
  pthread_cond_broadcast(&s->link_cv);
}

void rtr_links_leave_locked(rtr_server *s, int li) {
  rtr_link *l = &s->links[li];
  if (!l->is_member || l->gone) return;
  utl_log(LOGC, "worker %s left the cluster%s", l->cfg->name, l->up && l->inflight ? "; moving its streams" : "");
  l->gone = 1;
  if (l->peer) ctl_peer_close(l->peer); // the dispatcher hears the close: its choices move (link_down_locked)
  rtr_metric *gauges[5] = {l->m_w_running, l->m_w_waiting, l->m_w_kv_usage, l->m_w_kv_running,
                           l->m_w_kv_cached}; // its series stay; they read 0
  for (int k = 0; k < 5; k++)
    if (gauges[k]) rtr_metric_set(gauges[k], 0);
  capacity_locked(s);
  pthread_cond_broadcast(&s->link_cv);
}

// What the layers below the links hear of them: a choice that ends early is cancelled at its workers (req.c).
void rtr_links_register(rtr_server *s) { s->hooks.cancel_choice = send_cancel; }
