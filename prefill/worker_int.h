// prefill/worker_int.h: the prefill worker's state, shared by its files: worker.c (requests, pushes, the loop) and
// fetch.c (fetching a cached prefix from a peer prefill worker).
#ifndef DSERVE_PFL_WORKER_INT_H
#define DSERVE_PFL_WORKER_INT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "ctl/hub.h"
#include "kv/wire.h"
#include "kvxfer/kvx.h"
#include "models/sampler.h"
#include "prefill/handoff.h"
#include "prefill/serve.h"
#include "worker/engine.h"
#include "worker/genreq.h"
#include "worker/shell.h"

#define LINK_TIMEOUT_MS 5000   // connecting to a decode worker
#define PULL_LINK_TIMEOUT_MS 1000 // connecting to a peer prefill worker for a prefix fetch
#define PULL_WAIT_MS 5000       // a request waits this long for its prefix fetch, then computes the prefix itself
#define PULL_HOLD_MS 30000      // blocks of an unanswered fetch stay reserved this long (the peer may still write)

// One decode worker this prefill worker pushes to, or a peer prefill worker it fetches prefixes from.
typedef struct pfl_link {
  char name[64];
  ctl_peer *peer;         // (owned reference) our control connection to it
  wrk_kv_remote remote;   // its pool
  char kvx_peer[KVX_MAX_NAME]; // decode workers only (a prefill peer writes to us, not we to it)
} pfl_link;

struct pfl_req;

// A prefix fetch in progress: the peer src writes prompt blocks [first, first + n) into our blocks.
typedef struct pfl_pull {
  struct pfl_pull *next;
  struct pfl_req *req;    // (borrowed) the request waiting for it; NULL once it went on without it
  pfl_link *src;          // (borrowed)
  char id[96];            // the request's id; the peer's notification is "pull:<id>"
  int32_t *blocks;        // (owned) (n) our pool blocks the peer writes, each with a reference we hold
  int first, n;
  int answered, got;      // the peer answered (prefix_pulled / prefix_fail), saying it wrote got blocks
  int notified;           // its notification arrived: the bytes have landed
  int64_t wait_until_ms;  // the request stops waiting then
  int64_t hold_until_ms;  // unanswered, the blocks are given back then
} pfl_pull;

typedef struct pfl_req {
  wrk_seq seq;            // the prompt in our own pool
  wrk_genreq req;
  ctl_peer *router;       // (owned reference)
  pfl_link *link;         // (borrowed)
  pfl_pull *pull;         // (borrowed) the prefix fetch it waits for; NULL once queued in the engine
  mdl_sampler *sampler;   // (owned) for the first token
  int32_t *remote;        // (owned) (n_remote) the decode worker's blocks for this prompt
  int n_remote;
  pfl_state state;        // where its handoff is (prefill/handoff.h); changed by pfl_req_to only
  int live;               // this step pushes it layer by layer (its state pushed when the step began)
  int pushed_blocks;      // leading blocks already pushed for every layer
  int step_b0, step_b1;   // blocks this step completes: [b0, b1)
  kvx_xfer **xf;          // (owned) (n_xf) posted writes; our blocks stay until they finish
  int n_xf, cap_xf;
  mdl_sampled first;      // the first token, once the prompt is computed
  int tell;               // PFL_STOPPING: what reap tells the decode worker once the writes finished: TELL_*
  char *fail_msg;         // (owned) kv_fail's message for TELL_FAIL
  int64_t table_deadline_ms, deadline_ms;
  int64_t t_recv_us, t_push0_us; // the generate arrived; its first KV write was posted (0: none yet) (spans)
} pfl_req;

typedef struct pfl_worker {
  wrk_shell sh;           // runtime, hub, signals, kvx (pushes KV, takes fetched prefixes) and its staging mirror
  wrk_engine eng;
  krn_event *layer_ev[2]; // (owned) markers after layer l's KV writes, at [l & 1]; NULL on a backend without events
  pfl_link **links;       // (owned) (n_links) each (owned)
  int n_links;
  pfl_pull *pulls;        // (owned list) prefix fetches in progress
  pfl_serve serve;        // prefix fetches peers ask of us
  double fetches, fetched_blocks, fetch_misses; // prefix fetch counters (stats_ok)
  double bytes_pushed;
  wrk_grammars gram;      // response_format grammars (compiled, cached) and the token trie the samplers mask with
  // Block tables that arrived before their request: the router's generate and the decode worker's
  // kv_table travel on different connections, so either may come first.
  struct early_table {
    cJSON *msg;           // (owned)
    ctl_peer *from;       // (owned reference)
    int64_t expires_ms;
  } *early;               // (owned) (n_early)
  int n_early, cap_early;
  // worker.c's answer to fetch.c (which it calls, and which calls it only through this): request r, whose fetch
  // ended, is queued for admission (ok) or could not be (out of memory: r must be failed).
  void (*fetch_done)(struct pfl_worker *w, pfl_req *r, int ok);
} pfl_worker;

#define OWNER(sq) ((pfl_req *)(sq)->owner)

// What a request that stops tells its decode worker once none of its writes can land any more.
enum { TELL_NONE, TELL_FAIL /* kv_fail: we gave up */, TELL_FREED /* kv_freed: it gave up, we write no more */ };

static inline int block_size(const pfl_worker *w) { return kv_pool_kv(w->sh.rt->kv)->block_size; }
// How long a decode worker may take to send a request's block table (workers[i].table_timeout_ms).
static inline int64_t table_timeout_ms(const pfl_worker *w) { return (int64_t)w->sh.wc->table_timeout_ms * DSERVE_TIMEOUT_SCALE; }

// links.c
// The configuration of worker name when it is another worker of role in this cluster; else NULL, and why in err
// (which may be NULL).
int pfl_peer_cfg(pfl_worker *w, const char *name, cfg_role role, cfg_worker *out, char *err, size_t errlen);
// The control link to worker name of role, connecting (bounded by timeout_ms) when there is none or it dropped.
pfl_link *pfl_link_for(pfl_worker *w, const char *name, cfg_role role, int timeout_ms, char *err, size_t errlen);

// worker.c
// Fails r: error to the router (fmt with detail), kv_fail to the decode worker once no write of r can land; frees r.
void pfl_fail(pfl_worker *w, pfl_req *r, const char *fmt, const char *detail);
void pfl_take_early_table(pfl_worker *w, pfl_req *r); // hands over a block table that came before r did

// fetch.c (docs/protocol.md, "Prefix fetch")
// Asks prefill worker peer for r's first want blocks when our store holds fewer. 1 when r now waits for the
// answer (pfl_resume queues it and tells w->fetch_done), 0 when it goes on without.
int pfl_start_pull(pfl_worker *w, pfl_req *r, const char *peer, int want);
// The request waiting for p goes on with the first got blocks the peer wrote (0: none, it computes them).
void pfl_resume(pfl_worker *w, pfl_pull *p, int got);
void pfl_pull_free(pfl_worker *w, pfl_pull *p);  // unlinks p and gives its remaining blocks back
void pfl_on_pulled(pfl_worker *w, ctl_peer *from, const cJSON *m, int failed); // prefix_pulled / prefix_fail
void pfl_take_notifs(pfl_worker *w);              // kvxfer notifications "pull:<id>"
int pfl_n_fetching(const pfl_worker *w);          // requests waiting for a fetch

#endif
