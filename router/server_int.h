// router/server_int.h: the router's private structs and the calls between its files, layer by layer (req, links,
// admit, relay, http, server), with the hooks through which a lower layer reaches a higher one.
#ifndef DSERVE_RTR_SERVER_INT_H
#define DSERVE_RTR_SERVER_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "ctl/hub.h"
#include "disco/disco.h"
#include "models/chat.h"
#include "proto/request.h"
#include "proto/stats.h"
#include "router/choice.h"
#include "router/kvindex.h"
#include "router/metrics.h"
#include "router/openai.h"
#include "router/reqtab.h"
#include "router/router.h"
#include "router/sched.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/trace.h"

struct MHD_Connection;
struct MHD_Daemon;
struct sockaddr_in;
typedef struct rtr_gate rtr_gate;
typedef struct rtr_members rtr_members;

#define LOGC "router"
#define WAIT_TICK_MS 100     // how often a waiting connection checks its client is still there
#define RTR_DECODE_LOST_MS 500 // how long a choice whose prefill worker lost its decode worker waits for the
                               // router's own link to that worker to go down (then it moves and waits for a worker)
                               // before it is sent again as it is (or fails when its moves are used up)

enum { RTR_N_KVS = 9 }; // the kvstore_* counters of stats_ok the router exports (observe.c, KVS_SERIES)

typedef struct rtr_link {
  rtr_server *s;               // (borrowed)
  const cfg_worker *cfg;   // (borrowed) from s->cfg, or &member for a worker that joined through discovery
  // A worker of the membership (members.c): its settings from its etcd record (changed only under s->mu; the link
  // thread copies the address before it connects), the incarnation they came with, and whether it has left (its
  // thread ends, its slot may take another member once the thread has). A member gets a link only once it has
  // answered the handshake (members.c dials it first): a record alone holds no slot.
  cfg_worker member;
  int is_member;
  int64_t incarnation;
  int gone;
  int thread_done;             // its thread has returned (join it before a new one starts in the slot)
  ctl_peer *peer;              // (reference owned while up) guarded by s->mu; NULL when down
  int up;
  int draining;                // the worker said `draining` (SIGTERM): no new work; its choices move elsewhere
  int silent_moved;            // its pong is overdue by router.migrate_silent_ms: its choices were moved (reset by a pong)
  int n_ctx;
  int block_size;              // hello_ok kv_layout.block_size (16 when absent): the prompt's key chain
  int kv_type;                 // hello_ok kv_layout.type (-1 when absent): who may hand off to whom
  int n_layer, kv_parts, kv_width, kv_groups; // hello_ok kv_layout's shape (0 when absent): the same, to hand off
  int running, waiting, free_blocks, total_blocks, inflight;
  int evictable_blocks;        // stats_ok evictable_blocks: cached blocks no sequence holds (0 when absent)
  double prefix_hits, prefix_queries, kv_pushed; // last cumulative values seen
  double auth_failures;        // stats_ok auth_failures: the worker's refused control + kvxfer connections (running
                               // total since the worker started; a restart starts it again)
  int connecting;              // 1 while the link thread is connecting (its peer may speak before it is stored)
  int fails;                   // connects failed in a row (0 once up); last_err: the last one's error ("" none)
  char last_err[256];
  // Per prefix-cache tier (pool, host, disk, store: stats_ok prefix_tiers): last cumulative hits / queries seen, and the
  // series {worker, tier} of hits, queries, resident blocks and refused blocks, created when the worker first reports
  // the tier (refused: tier_last[t][2]).
  double tier_last[PRT_N_TIERS][3];
  rtr_metric *m_tier[PRT_N_TIERS][4]; // (owned by s->m) hits, queries, blocks (not the store's), refused (not the pool's)
  int64_t last_stats_ms, last_stats_sent_ms; // last_stats_ms: when the worker last answered (stats_ok or pong)
  // observe.c: the worker's series {model_name, worker, role} (created with the link's first stats) and what the
  // router counted for it: prompt tokens routed to it, tokens it generated, handoffs it took part in
  rtr_metric *m_w_running, *m_w_waiting, *m_w_kv_usage, *m_w_prompt, *m_w_gen, *m_w_handoffs; // (owned by s->m)
  rtr_metric *m_w_spans_dropped; // (owned by s->m) created when the worker first reports trace_spans_dropped
  rtr_metric *m_w_kv_running, *m_w_kv_cached; // (owned by s->m) its KV split: held by sequences / cached, evictable
  double n_prompt_tokens, n_gen_tokens, n_handoffs, spans_dropped_last;
  rtr_metric *m_w_kvs[RTR_N_KVS]; // (owned by s->m) the shared KV tier's counters (observe.c), once the worker sends them
  double kvs_last[RTR_N_KVS];
  rtr_metric *m_w_kvs_up;      // (owned by s->m) dserve:kvstore_up, once the worker sends kvstore_up
  pthread_t thread;
  int has_thread;
} rtr_link;

typedef struct rtr_choice {
  char id[64];
  int index;                   // OpenAI's: group * n + i for a completion's prompt group (its position in r->ch)
  const int32_t *prompt;       // (borrowed: r->prompt) (n_prompt) its prompt's token ids
  int n_prompt;
  int max_tokens;              // the client's, else up to the context after its prompt
  int link, plink;             // decode/both link, prefill link (-1: local)
  rtr_ch_state state;          // router/choice.h; changed by rtr_choice_to only
  int64_t until_ms;            // RTR_CH_DECODE_LOST: sent again then (RTR_DECODE_LOST_MS) unless its decode worker's
                               // link went down first; RTR_CH_WAITING_WORKER: failed then (router.migration_wait_ms)
  char finish[16];
  utl_buf text;                // (owned) non-stream accumulation
  // Non-stream logprobs, kept as JSON text (a tree of cJSON nodes per top-logprob cost ~10 KB a token): the
  // elements of each array new_lp makes (chat: content; completions: tokens, token_logprobs, top_logprobs,
  // text_offset), comma-separated.
  utl_buf lp_text[4];          // (owned)
  int completion_tokens, cached_tokens, prompt_tokens;
  int cached_store_tokens;     // of cached_tokens, read from the shared KV tier (done's cached_store_tokens)
  int resends;                 // times sent again after its decode/both worker died, went silent or drained
  int32_t *gen;                // (owned) (n_gen) the token ids streamed so far: a moved choice resumes from them
  int n_gen, cap_gen;
  int64_t last_tok_us;
  size_t text_offset;
  utl_buf held;                // (owned) tools on, streamed: text not sent yet: a tail that may begin a call's opening
                               // tag, or everything from that tag on (read for calls when the choice ends)
  int in_call;                 // held begins with a call's beginning (rtr_tool_hold)
  int began;                   // tools on, streamed: content went out (a Llama 3 reply can no longer be a call)
  // observe.c: the access log's and the phase histograms' view of the choice
  char workers[96];            // every worker it ran on, in order: "p0>d0" (prefill>decode) or "d0"; a move adds ",d1"
  int64_t t_sent_us, t_first_us, t_move_us; // routed (last time), its first token, moved (0: no move pending a token)
  double kv_bytes, prefill_ms, kv_ms;        // from done: KV moved to its decode worker, the phases' times (-1: none)
  int64_t spec_drafted, spec_accepted;       // from done: speculative decoding's drafted and accepted tokens
  float *embd;                 // (owned) (n_embd) an embedding choice's vector, from its done; NULL until then
  int n_embd;
} rtr_choice;

typedef struct rtr_req {
  rtr_server *s;               // (borrowed)
  int refs;                    // guarded by s->mu: list + connection + stream response
  pthread_cond_t cv;
  rtr_request q;               // (owned) the validated request
  int32_t *prompt;             // (owned) (n_prompt) token ids: every prompt's, back to back (one unless a completion
                               // gave a list); each choice points at its own
  int n_prompt;                // all prompts' tokens (usage's prompt_tokens)
  char id[48];
  long created;
  rtr_choice *ch;              // (owned) (n_ch): q.n per prompt
  int n_ch;
  int n_done;
  int failed;
  rtr_error err;
  int finished;                // every choice finished (or the request failed)
  int listed;                  // in s->reqs
  int admitted;                // out of the admission queue: its choices are sent as slots allow (links.c)
  int slots;                   // its choices sent and not done: each holds a slot of admission capacity
  int next_new;                // admitted: the choices before it have left RTR_CH_NEW (sent, or ended unsent)
  int waiting;                 // in the admission queue
  struct rtr_req *next, *prev, *wnext; // s->reqs (doubly linked: leaving it costs O(1)) / s->wait lists
  // A stream's output, in two stages so that its SSE text is formatted by its own connection's thread, not under
  // s->mu (relay.c, rtr_out_*): pend (guarded by s->mu) holds records the dispatcher queued: preformatted SSE bytes,
  // or a text delta of one choice to be formatted; the connection's reader swaps pend with taken (reader-owned,
  // empty), formats taken into out (reader-owned) outside the lock, and hands out out_pos..out.n to the client.
  utl_buf pend, taken;         // (owned)
  utl_buf out;                 // (owned) stream bytes, those not yet read at out_pos..out.n
  rtr_resp_stream resp;        // (owned) q.api RTR_API_RESPONSES, streamed: the chunks' translation into its events
  size_t out_pos;
  int out_end;                 // (s->mu) the trailer is in pend: the stream ends once pend and out are read
  int wake_queued;             // (s->mu) on s->wake: the dispatcher wakes its reader after letting go of s->mu
  int paced;                   // (s->mu) its reader sleeps until flush_due_us (router.stream_flush_ms): a token
                               // does not wake it
  int64_t flush_due_us;        // (reader) the earliest time its reader takes the queue again; 0 at once
  int slow;                    // (s->mu) its client stopped reading: pend passed router.stream_queue_bytes, the stream
                               // was ended (cancelled, its connection closed) and counted
  int fd;                      // client socket (for disconnect checks)
  struct MHD_Connection *conn; // (borrowed) its connection, for restoring the idle timeout
  int64_t t_arrival_us, t_admit_us, t_first_us;
  // Tracing (observe.c): traced when the router has a tracer and the request is sampled; trace holds its trace id and
  // the router's request span id (the parent of every span of the request, the workers' too, as the traceparent of
  // its generate messages); parent_span: the caller's span from the traceparent header (all zero: none).
  int traced;
  utl_trace_ctx trace;
  uint8_t parent_span[8];
  const char *route;           // (static) "/v1/chat/completions" or "/v1/completions"
} rtr_req;

// What a lower layer asks a higher one, registered by the higher one when the server is built (server.c): the router
// calls downward only (http -> relay -> admit -> links -> req), and these are the ways back up. All but client_gone
// are called with s->mu held.
typedef struct rtr_hooks {
  int (*client_gone)(int fd); // http.c: the client's socket (fd; -1: unknown) was closed or broke
  void (*cancel_choice)(rtr_server *s, rtr_req *r, int ci); // links.c: cancel choice ci at its linked workers
  void (*on_token)(rtr_server *s, rtr_req *r, int ci, const prt_token *m); // relay.c: a worker's messages for ci
  void (*on_done)(rtr_server *s, rtr_req *r, int ci, const prt_done *m);
  void (*on_error)(rtr_server *s, rtr_req *r, int ci, const prt_error *m);
  void (*choice_start)(rtr_req *r, int ci); // relay.c: a streamed choice was routed (its first chunk)
  void (*stream_end)(rtr_req *r);          // relay.c: a streamed request ended (its trailer)
  int (*member_dialling)(rtr_server *s, const char *name); // members.c: 1 while a member of that name is being dialled
                                                           // (not set without discovery)
} rtr_hooks;

struct rtr_server {
  const cfg_cluster *cfg;       // (borrowed)
  const cfg_router *rc;        // = &rc_own
  cfg_router rc_own;           // the config's router section with cfg_router_defaults applied (api_keys borrowed)
  const mdl_gguf *gguf;        // (borrowed)
  int has_template;            // the GGUF has a tokenizer.chat_template (read for ChatML's default system prompt)
  // The chat template family (models/chat.h) chats render with: the config's chat_template, else the GGUF template's
  // family, else ChatML when the vocabulary has ChatML's tokens (SmolLM2's template assumed); NULL: not a chat model.
  const mdl_chat_template *chat; // NULL too when jinja renders
  struct mdl_jinja *jinja;     // (owned) the Jinja template chats render with (chat_template_file's, else the GGUF's),
                               // unless the config names a family; NULL: chat (a family) renders
  const mdl_chat_tool_style *jinja_tools; // jinja's call format (models/chat.h), NULL: none known here
  char chat_source[1100];      // which template renders, for the log and /v1/models ("the GGUF's ... (Jinja)")
  const mdl_tok *tok;          // (borrowed)
  int n_ctx;
  int embd_pool;               // /v1/embeddings: the GGUF's pooling (MDL_POOL_*: mdl_gguf_pooling), sent in generate
  int n_embd;                  // the model's width (<arch>.embedding_length; 0 without a GGUF)
  char embd_refusal[200];      // why embeddings are refused ("" when served): a pooling of none or rank, a bad key
  char model[128];
  struct MHD_Daemon *mhd;
  rtr_gate *gate;              // (owned) listening socket, accept thread, connection caps (conns.c)
  int port;
  ctl_hub *hub;
  pthread_t dispatcher;
  int has_dispatcher;
  pthread_mutex_t mu;          // guards links, requests, admission, counters
  pthread_cond_t link_cv;      // wakes link threads
  pthread_cond_t admit_cv;
  int stopping;
  int draining;                // rtr_server_drain: new requests get 503, queued ones are failed
  int n_live;                  // generation requests whose connection or response still holds them
  // (owned) (n_links, cap_links): the config's workers, then members that joined; it grows (realloc, under mu), so
  // a link's address holds only while mu is held: whoever lets go of mu finds its link again by index
  rtr_link *links;
  int n_links, cap_links;
  int last_link;               // the link the dispatcher's last message came from (-1: none), tried first
  // (owned) (n_wake, cap_wake) the readers a token_batch gave output, each with a reference: woken once the batch is
  // handled and s->mu let go, so that a woken reader does not block at once on the mutex the dispatcher still holds
  // (with a thread per stream, that second sleep was half the router's context switches); defer_wake: collecting
  rtr_req **wake;
  int n_wake, cap_wake, defer_wake;
  int capacity_static;         // the config's workers' max_seqs (capacity = this + the members' that are linked)
  dsc_watcher *watcher;        // (owned) the membership in etcd (config "discovery"); NULL without
  rtr_members *mem;            // (owned) members.c's records and their dialers; NULL without discovery
  dsc_fingerprint fp;          // the router's own model: a member serving another model is refused
  rtr_req *reqs;               // active requests (linked through next and prev)
  rtr_reqtab reqtab;           // the same requests by id: a worker's message finds its request in O(1)
  int n_held;                  // choices in RTR_CH_DECODE_LOST or RTR_CH_WAITING_WORKER (rtr_choice_to counts them):
                               // the dispatcher looks for them (send_waiting_locked) only while there are some
  rtr_req *wait_head, *wait_tail; // admission queue
  int n_waiting, running_slots, capacity; // requests queued; choices sent and not done; slots (decode max_seqs)
  int n_unsent;                // choices of admitted requests not sent yet (RTR_CH_NEW)
  unsigned long long next_id;
  long started;
  rtr_kvindex *kv;             // (owned) which worker (by link index) holds which prefix blocks; guarded by mu
  rtr_metrics *m;              // (owned)
  rtr_metric *m_running, *m_waiting, *m_prompt, *m_gen, *m_ttft, *m_itl, *m_e2e, *m_queue, *m_kv_usage,
      *m_prefix_hits, *m_prefix_queries, *m_kv_bytes, *m_kv_pushed, *m_kv_time, *m_ok_stop, *m_ok_length, *m_fail;
  rtr_metric *m_slow_ended;    // dserve:streams_ended_slow_total: streams ended because their client stopped reading
  rtr_metric *m_prefill_time, *m_transfer_time, *m_decode_time, *m_migrations, *m_handoffs; // observe.c
  rtr_metric *m_spec_drafts, *m_spec_drafted, *m_spec_accepted;                            // observe.c
  rtr_metric *m_spans_dropped;  // dserve:trace_spans_dropped_total (NULL without tracing)
  utl_tracer *tracer;           // (owned) NULL: tracing off (the config has no "tracing" section)
  pthread_t stats_thread;       // observe.c: the stats lines (logging.stats_interval_s)
  int has_stats_thread;
  // dserve:auth_failures_total (NULL until created): grown in links.c from every worker's stats_ok auth_failures and
  // the router hub's own refusals (ctl_hub_auth_failures); hub_auth_last: the hub's count already added.
  rtr_metric *m_auth_failures;
  double hub_auth_last;
  rtr_metric *m_role[6][3];    // (owned by m) scale.c's per-role series {workers, running, waiting, kv held by
                               // sequences, prefill backlog, kv cached} x {prefill, decode, both}; NULL until first set
  rtr_hooks hooks;             // the upper layers' answers (see rtr_hooks)
};

// The Jinja template q renders with: its own chat_template's, else the server's unless q names a family; NULL: a
// family renders (rtr_chat_of).
static inline const struct mdl_jinja *rtr_jinja_of(const rtr_server *s, const rtr_request *q) {
  return q->chat_jinja ? q->chat_jinja : q->chat_family ? NULL : s->jinja;
}

// The chat template family q renders with when no Jinja template does: its own chat_template's, else the server's
// (NULL: not a chat model, or a Jinja template renders).
static inline const mdl_chat_template *rtr_chat_of(const rtr_server *s, const rtr_request *q) {
  return rtr_jinja_of(s, q) ? NULL : q->chat_family ? q->chat_family : s->chat;
}

// The format q's calls are written in: the Jinja template's (detected from its text) or the family's; Hermes when
// neither has one (a prompt with tools was refused then: calls come only where the prompt had tools).
static inline const mdl_chat_tool_style *rtr_tool_style_of(const rtr_server *s, const rtr_request *q) {
  char err[160];
  const mdl_chat_tool_style *st = q->chat_jinja ? q->chat_jinja_tools
                                  : rtr_jinja_of(s, q) ? s->jinja_tools
                                                       : mdl_chat_template_tools(rtr_chat_of(s, q), err, sizeof err);
  return st ? st : mdl_chat_tool_style_of(NULL, err, sizeof err);
}

// prompt.c: the prompt text of chat request q (q->msgs) rendered by its template (rtr_jinja_of, else rtr_chat_of):
// *text malloc'ed, *spans ((*n_spans, 2), malloc'ed) the request's own text in it (mdl_tok_encode_guarded). 0, or -1
// with e: not a chat model, tools the template cannot express, kwargs a family cannot take, the template's
// raise_exception or runtime error (400s, docs/openai.md).
int rtr_chat_prompt(rtr_server *s, const rtr_request *q, char **text, size_t **spans, size_t *n_spans,
                    rtr_error *e) UTL_WARN_UNUSED;

// A disaggregated choice whose decode worker streams: it holds all the KV, its prefill worker (plink) no longer matters.
static inline int rtr_choice_handed_off(const rtr_choice *c) { return c->plink >= 0 && c->state == RTR_CH_STREAMING; }

// The files' calls, layer by layer from the bottom. Those named *_locked, and rtr_out_event, are made with s->mu
// held; rtr_admit_and_send takes it itself.

// req.c: a request's life (the bottom layer)
void rtr_req_unref_locked(rtr_req *r);
void rtr_wake_reader_locked(rtr_server *s, rtr_req *r); // r's stream has output: wakes its reader, or queues the
                                                         // wake on s->wake while s->defer_wake
void rtr_wake_flush(rtr_server *s); // (s->mu NOT held) wakes what s->wake holds and drops their references
void rtr_release_slots_locked(rtr_server *s, rtr_req *r);
void rtr_fail_locked(rtr_server *s, rtr_req *r, const rtr_error *e); // fails the request, cancels its other choices
void rtr_cancel_locked(rtr_server *s, rtr_req *r);                   // the client left: cancel what still runs
void rtr_choice_unlink_locked(rtr_server *s, rtr_choice *c); // its workers' inflight counts no longer hold it
void rtr_choice_end_locked(rtr_server *s, rtr_req *r, int ci);  // choice ci finished (done, error or cancelled)
// The one place choice ci changes state (docs/protocol.md, "Handoff states"): refuses an illegal transition (logged;
// an assertion in a debug build), then does what entering next requires: STREAMING frees the prefill worker's
// inflight count, DECODE_LOST and WAITING_WORKER set until_ms, DONE counts the choice done. 0, or -1 when refused.
int rtr_choice_to(rtr_server *s, rtr_req *r, int ci, rtr_ch_state next);
void rtr_finish_locked(rtr_server *s, rtr_req *r); // every choice ended: trailer, metrics, slots, off the list
int rtr_req_list_locked(rtr_server *s, rtr_req *r); // r (its id set) joins s->reqs and the table: 0, -1 out of memory
// The request choice id names (its own current id: messages under an id it moved away from find nothing), NULL when
// none does; *ci its index.
rtr_req *rtr_req_find_locked(rtr_server *s, const char *id, int *ci);
typedef enum rtr_wait { RTR_WAIT_MORE, RTR_WAIT_GONE, RTR_WAIT_TIMEOUT } rtr_wait;
// One bounded wait (WAIT_TICK_MS) for r to change, s->mu held: GONE when the client left (r is cancelled), TIMEOUT
// when r passed the router's bound (r is failed with 504 timeout), MORE otherwise.
rtr_wait rtr_wait_locked(rtr_server *s, rtr_req *r);

// links.c: worker links, the dispatcher, routing a choice to workers and moving it
void rtr_links_register(rtr_server *s); // s->hooks.cancel_choice
void *rtr_dispatcher_main(void *arg); // arg: the rtr_server
// Starts link li's thread (it connects, keeps the link alive, reconnects). 0, or -1 when the thread did not start.
int rtr_link_start_locked(rtr_server *s, int li);
// link_stats.c (dispatcher thread, s->mu held): the KV-use gauges from every link up (and the scaler's inputs);
// a worker's stats_ok into its link, counters and gauges; its kv_events into the KV index.
void rtr_kv_gauge_update_locked(rtr_server *s);
void rtr_link_on_stats(rtr_server *s, rtr_link *l, const cJSON *msg);
void rtr_link_on_kv_events(rtr_server *s, rtr_link *l, const cJSON *m);
int rtr_route_choice_locked(rtr_server *s, rtr_req *r, int ci, rtr_sched_worker *w, cJSON **msgs, int *to, int *n,
                            rtr_error *e);
// Choice ci leaves its decode/both worker (dead, silent or draining) for another one; with may_wait and no worker
// up, it waits for one (router.migration_wait_ms). 0: re-sent or waiting; -1: it cannot move (the caller decides).
int rtr_move_choice_locked(rtr_server *s, rtr_req *r, int ci, int may_wait);
// Fair admission: sends admitted requests' unsent choices while slots are free, each slot to the request with the
// fewest choices running; first (may be NULL: just admitted, its slot given by the queue) gets one before the others.
// 0, or -1 with e and *who (the request whose choice found no worker; left unsent).
int rtr_send_new_locked(rtr_server *s, rtr_req *first, rtr_req **who, rtr_error *e);

// Discovery (members.c calls these with s->mu held). A member that answered the handshake (p: a reference the
// link takes) gets a link: a slot a member left, else a new one (the array grows: no fixed count); its index, or -1
// out of memory (p is then closed). Its record changed (a restart: new incarnation or address): the old peer is
// closed and its choices move as on any link loss, and the link connects to the new address. It leaves: no new work,
// its peer closed, its choices move.
int rtr_links_attach_locked(rtr_server *s, const cfg_worker *w, int64_t incarnation, ctl_peer *p);
void rtr_links_update_locked(rtr_server *s, int li, const cfg_worker *w, int64_t incarnation);
void rtr_links_leave_locked(rtr_server *s, int li);

// scale.c: the per-role scaling signals (/metrics), recomputed from the links and the requests in flight
void rtr_scale_update_locked(rtr_server *s);
// The share of l's KV blocks its sequences hold (total - free - evictable over total; 0 before its first stats).
// Inline: observe.c, which calls no other router file, reads it too.
static inline double rtr_link_kv_running(const rtr_link *l) {
  if (l->total_blocks <= 0) return 0;
  int held = l->total_blocks - l->free_blocks - l->evictable_blocks;
  return held > 0 ? (double)held / l->total_blocks : 0;
}

// A member the router knows but has no link to (members.c), as GET /v1/cluster shows it; strings borrowed, valid while
// mu is held.
typedef struct rtr_member_info {
  const char *name, *host, *key, *why; // key: its etcd key; why: "" or why it is refused / the last dial's error
  cfg_role role;
  int port, fails;                     // fails: dials failed in a row
  int64_t incarnation;
  const char *state;                   // "pending" (being dialled) or "refused" (another model, or its handshake)
} rtr_member_info;
// Writes the first max records without a link into out and returns how many there are (like snprintf).
int rtr_members_unlinked_locked(rtr_server *s, rtr_member_info *out, int max);
// 1 when err (ctl_hub_connect's) says the worker answered and the handshake failed (another shared secret, version
// or member), not that it could not be reached (members.c; cluster.c asks it of config workers too).
int rtr_handshake_refused(const char *err);
// GET /v1/cluster's body: every worker, linked or not, with its state, load and KV use (cluster.c); NULL when out of
// memory.
cJSON *rtr_cluster_view(rtr_server *s);

// members.c: discovery's watcher, whose joins and leaves become links (after the model check and a handshake)
int rtr_members_start(rtr_server *s, char *err, size_t errlen); // no-op without a discovery section
void rtr_members_stop(rtr_server *s); // the watcher and the dialers; before s->stopping (no link comes after)

// admit.c: admission (slots, the wait queue), then every choice routed and sent
int rtr_admit_and_send(rtr_server *s, rtr_req *r, rtr_error *e); // 0, or -1 with e (the caller fails r)

// relay.c: the OpenAI layer's output
void rtr_relay_register(rtr_server *s); // s->hooks.on_token, on_done, on_error, choice_start, stream_end
void rtr_out_event(rtr_req *r, cJSON *obj); // "data: JSON\n\n" onto r's stream; consumes obj
// The stream reader's side (http.c, outside s->mu): the records r->taken holds, formatted as SSE onto r->out.
void rtr_out_format(rtr_req *r);
cJSON *rtr_final_response(rtr_req *r);

// observe.c: the access log, the stats lines, the phase histograms, per-worker series and the request's spans. Called
// from the layers above (links, relay, http, server); it calls none of them.
// The series it updates (server.c, once); the phase histograms get the latency histograms' bounds (n_bounds).
void rtr_observe_metrics(rtr_server *s, const double *bounds, int n_bounds);
int rtr_observe_start(rtr_server *s, char *err, size_t errlen);     // tracer and stats thread (after the links)
void rtr_observe_stop(rtr_server *s);                               // joins the thread, flushes the spans
void rtr_observe_begin(rtr_server *s, rtr_req *r, const char *traceparent); // r arrived (http.c): its trace
void rtr_observe_routed_locked(rtr_server *s, rtr_req *r, int ci);  // ci sent to c->link (and c->plink)
void rtr_observe_moved_locked(rtr_server *s, rtr_req *r, int ci);   // ci is moving to another worker
void rtr_observe_token_locked(rtr_server *s, rtr_req *r, int ci, int n_tokens, int64_t now_us);
void rtr_observe_done_locked(rtr_server *s, rtr_req *r, int ci, const prt_done *m);
void rtr_observe_stats_locked(rtr_server *s, rtr_link *l, const prt_stats_ok *m); // l's stats_ok m was read
// The traceparent of r's generate messages into out ("" when r is not traced).
void rtr_observe_traceparent(const rtr_req *r, char out[UTL_TRACEPARENT_LEN + 1]);
// r's answer went out with HTTP status (http.c, once per request): the access log line, the request's spans.
void rtr_observe_end(rtr_server *s, rtr_req *r, int status);

// conns.c: the listening socket and accept thread in front of MHD; caps on open connections; request-head deadline
int rtr_gate_listen(rtr_server *s, const struct sockaddr_in *sa, char *err, size_t errlen); // binds (s->gate)
int rtr_gate_port(rtr_server *s);
int rtr_gate_start(rtr_server *s, char *err, size_t errlen); // the accept thread, once s->mhd runs
void rtr_gate_stop(rtr_server *s);                            // stops accepting
void rtr_gate_free(rtr_server *s);                            // after MHD_stop_daemon; NULL gate is a no-op
// MHD_OPTION_NOTIFY_CONNECTION callback (cls: the rtr_server)
void rtr_gate_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe);
void rtr_gate_head_seen(rtr_server *s, struct MHD_Connection *c);    // a request head arrived
void rtr_gate_body_start(rtr_server *s, struct MHD_Connection *c);   // its body is read from now (body_timeout_s)
void rtr_gate_body_read(rtr_server *s, struct MHD_Connection *c, size_t n); // n more body bytes (extend the deadline)
// The body is complete: 1 when it was late (a 408 went out, the socket is shut down: answer nothing), else 0.
int rtr_gate_body_done(rtr_server *s, struct MHD_Connection *c);
void rtr_gate_request_done(rtr_server *s, struct MHD_Connection *c); // a request ended (the next head is due)
void rtr_gate_counts(rtr_server *s, int *open, long *refused);

// http.c: the routes (the top layer)
void rtr_http_register(rtr_server *s); // s->hooks.client_gone
// MHD_OPTION_NOTIFY_COMPLETED and the access handler (cls: the rtr_server)
enum MHD_Result rtr_http_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *body, size_t *body_size, void **con_cls);
void rtr_http_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);

#endif
