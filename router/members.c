// router/members.c: the router's side of discovery: etcd's records (disco/ watcher), by key, become worker links. A
// record of another model is refused, loudly, kept (GET /v1/cluster shows it) and dialled once to tell the worker why
// (link_refused); the others are dialled by a few dialer threads, and only a member that answers the handshake gets a
// link. One that does not is dialled again with back-off and holds nothing but its
// record, so records alone (ghosts, a flood of them) cannot take the links real workers need.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/hello.h"
#include "router/server_int.h"
#include "util/log.h"

#define N_DIALERS 4           // dials at once: a ghost whose address drops packets costs one of them DIAL_TIMEOUT_MS
#define DIAL_TIMEOUT_MS 1000
#define BACKOFF_FIRST_MS 250  // a member that failed the handshake is dialled again after this, doubling each time
#define BACKOFF_MAX_MS 15000  // up to this (less up to a quarter, at random, so that ghosts do not come back together)

typedef enum { MEM_PENDING, MEM_LINKED, MEM_REFUSED } mem_state;

typedef struct member {
  char key[256];       // its etcd key: what identifies it (two records never share a name: disco/watch.c); a new
                       // lease under it is the same member registered again (its link stays)
  dsc_member m;        // its record
  cfg_worker w;        // the record as a link's settings
  mem_state state;
  int link;            // MEM_LINKED: its link's index in s->links
  uint64_t gen;        // new on every change of the record: a dial of an older record is discarded
  int dialling;        // a dialer is connecting to it
  int fails;           // handshakes failed in a row
  int backoff_ms;      // the wait after the last failure
  int64_t next_ms;     // MEM_PENDING: dialled at or after this (utl_now_ms)
  char why[320];       // MEM_REFUSED: why; MEM_PENDING: the last failed dial's error ("" none)
  int told;            // MEM_REFUSED: the worker has been told why (link_refused), once per record
  int handshake;       // MEM_PENDING: the last dial reached it and the handshake failed (another secret?)
} member;

struct rtr_members {
  member *m;           // (owned) (n, cap) guarded by s->mu
  int n, cap, n_linked, n_refused;
  uint64_t next_gen;
  unsigned seed;       // the back-off's jitter (rand_r)
  pthread_cond_t cv;   // wakes the dialers (waited on with s->mu)
  int stop;            // guarded by s->mu
  pthread_t dialers[N_DIALERS];
  int n_dialers;
  rtr_metric *m_pending, *m_linked, *m_refused, *m_dial_fail; // (owned by s->m)
};

static member *find_locked(rtr_members *ms, const char *key) {
  for (int i = 0; i < ms->n; i++)
    if (!strcmp(ms->m[i].key, key)) return &ms->m[i];
  return NULL;
}

static void gauges_locked(rtr_members *ms) {
  rtr_metric_set(ms->m_pending, ms->n - ms->n_linked - ms->n_refused);
  rtr_metric_set(ms->m_linked, ms->n_linked);
  rtr_metric_set(ms->m_refused, ms->n_refused);
}

// e's record is gone (or refused now): its link, if it has one, leaves; the record is forgotten.
static void drop_locked(rtr_server *s, member *e) {
  rtr_members *ms = s->mem;
  if (e->state == MEM_LINKED) {
    rtr_links_leave_locked(s, e->link);
    ms->n_linked--;
  } else if (e->state == MEM_REFUSED) {
    ms->n_refused--;
  } else {
    utl_debug(LOGC, "worker %s (etcd key %s) left the cluster before it was linked", e->m.name, e->key);
  }
  *e = ms->m[--ms->n];
  gauges_locked(ms);
}

int rtr_handshake_refused(const char *err) {
  // ctl_hub_connect's words when the worker answered and then refused us, or we it (ctl/hub.c); a connection that
  // could not be made says "connect" / "timed out" instead
  return err && (strstr(err, "the hello") || strstr(err, "shared secret") || strstr(err, "did not send a challenge"));
}

// A new record under key, zeroed but for its key (state MEM_PENDING); NULL on out of memory.
static member *add_locked(rtr_members *ms, const char *key) {
  if (ms->n == ms->cap) {
    int cap = ms->cap ? 2 * ms->cap : 16;
    member *nm = realloc(ms->m, (size_t)cap * sizeof *nm);
    if (!nm) return NULL;
    ms->m = nm;
    ms->cap = cap;
  }
  member *e = &ms->m[ms->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->key, sizeof e->key, "%s", key);
  return e;
}

// The watcher's join: a record appeared or changed.
static int on_join(void *arg, const char *key, int64_t lease, const dsc_member *m) {
  (void)lease;
  rtr_server *s = arg;
  rtr_members *ms = s->mem;
  pthread_mutex_lock(&s->mu);
  member *e = find_locked(ms, key);
  if (!dsc_same_model(&m->fp, &s->fp)) {
    char why[320];
    snprintf(why, sizeof why, "it serves model %s %s, this router serves %s %s (architecture, <file size>-<hash>)",
             m->fp.arch, m->fp.file_hash, s->fp.arch, s->fp.file_hash);
    utl_err(LOGC, "REFUSING worker %s (%s:%d): %s; it gets no link and no work (telling it so)", m->name, m->host,
            m->port, why);
    if (e && e->state != MEM_REFUSED) { // its record now names another model: its link goes
      drop_locked(s, e);
      e = NULL; // (its slot now holds another record)
    }
    if (!e) e = add_locked(ms, key);
    if (e) { // kept, to be shown (GET /v1/cluster) and told once (a dialer sends link_refused)
      if (e->state != MEM_REFUSED) ms->n_refused++;
      e->m = *m;
      dsc_member_to_cfg(m, &e->w);
      e->state = MEM_REFUSED;
      snprintf(e->why, sizeof e->why, "%s", why);
      e->gen = ++ms->next_gen;
      e->told = e->dialling = e->fails = e->backoff_ms = 0;
      e->next_ms = 0;
      gauges_locked(ms);
      pthread_cond_broadcast(&ms->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return 1;
  }
  for (int i = 0; i < s->n_links; i++)
    if (!s->links[i].is_member && !strcmp(s->links[i].cfg->name, m->name)) {
      utl_debug(LOGC, "worker %s is in the config and in etcd; the config's address stands", m->name);
      pthread_mutex_unlock(&s->mu);
      return 0;
    }
  cfg_worker w;
  dsc_member_to_cfg(m, &w);
  if (e && e->state == MEM_REFUSED) { // refused before, our model now: a new member
    *e = ms->m[--ms->n];
    ms->n_refused--;
    e = NULL;
  }
  if (e) {
    e->m = *m;
    e->w = w;
    if (e->state == MEM_LINKED) {
      rtr_links_update_locked(s, e->link, &w, m->incarnation);
    } else { // a new record: dialled at once (a dial of the old one in flight is discarded)
      e->gen = ++ms->next_gen;
      e->dialling = e->fails = e->backoff_ms = 0;
      e->next_ms = 0;
      pthread_cond_broadcast(&ms->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
  }
  e = add_locked(ms, key);
  if (!e) {
    pthread_mutex_unlock(&s->mu);
    utl_err(LOGC, "out of memory: worker %s (etcd key %s) not added", m->name, key);
    return 1;
  }
  e->m = *m;
  e->w = w;
  e->state = MEM_PENDING;
  e->gen = ++ms->next_gen;
  gauges_locked(ms);
  pthread_cond_broadcast(&ms->cv);
  pthread_mutex_unlock(&s->mu);
  utl_log(LOGC, "worker %s (%s, %s:%d) joined the cluster; linking", m->name, cfg_role_name(m->role), m->host,
          m->port);
  return 0;
}

static void on_leave(void *arg, const char *key, const dsc_member *m) {
  (void)m;
  rtr_server *s = arg;
  pthread_mutex_lock(&s->mu);
  member *e = find_locked(s->mem, key);
  if (e) drop_locked(s, e);
  pthread_mutex_unlock(&s->mu);
}

// links.c's dispatcher: a message from a peer no link holds yet may come from a member being dialled.
static int dialling(rtr_server *s, const char *name) {
  rtr_members *ms = s->mem;
  for (int i = 0; ms && i < ms->n; i++)
    if (ms->m[i].dialling && !strcmp(ms->m[i].m.name, name)) return 1;
  return 0;
}

// The record due for a dial: the fewest failures first (a new member never waits behind ghosts that failed before),
// then the longest due, then the newest (a worker that registers after a flood of new records whose addresses drop
// packets is not dialled after all of them). *wake: when the next one not due yet is.
static member *pick_locked(rtr_members *ms, int64_t now, int64_t *wake) {
  member *best = NULL;
  for (int i = 0; i < ms->n; i++) {
    member *e = &ms->m[i];
    if ((e->state != MEM_PENDING && (e->state != MEM_REFUSED || e->told)) || e->dialling) continue;
    if (e->next_ms > now) {
      if (e->next_ms < *wake) *wake = e->next_ms;
    } else if (!best || e->fails < best->fails ||
               (e->fails == best->fails &&
                (e->next_ms < best->next_ms || (e->next_ms == best->next_ms && e->gen > best->gen)))) {
      best = e;
    }
  }
  return best;
}

// e failed the handshake (err): dialled again after its back-off.
static void failed_locked(rtr_members *ms, member *e, const char *err) {
  e->fails++;
  if (e->state == MEM_PENDING) {
    snprintf(e->why, sizeof e->why, "%s", err);
    e->handshake = rtr_handshake_refused(err);
  }
  e->backoff_ms = !e->backoff_ms ? BACKOFF_FIRST_MS : e->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                                                                       : e->backoff_ms * 2;
  e->next_ms = utl_now_ms() + e->backoff_ms - (int)(rand_r(&ms->seed) % (unsigned)(e->backoff_ms / 4 + 1));
  rtr_metric_add(ms->m_dial_fail, 1);
  if (e->state == MEM_REFUSED)
    utl_debug(LOGC, "worker %s (%s:%d), refused: cannot tell it why: %s", e->m.name, e->w.host, e->w.port, err);
  else if (e->fails == 1)
    utl_warn(LOGC, "worker %s (%s:%d, etcd key %s): %s; it gets no link until it answers (dialled again with "
             "back-off, up to every %d s)", e->m.name, e->w.host, e->w.port, e->key, err, BACKOFF_MAX_MS / 1000);
  else
    utl_debug(LOGC, "worker %s (%s:%d): %s (%d failures; again in %d ms)", e->m.name, e->w.host, e->w.port, err,
              e->fails, e->backoff_ms);
}

static member *by_gen_locked(rtr_members *ms, uint64_t gen) {
  for (int i = 0; i < ms->n; i++)
    if (ms->m[i].gen == gen) return &ms->m[i];
  return NULL;
}

// e (refused) answered the handshake on p: tell it why it gets no link (link_refused), and close. The send is one
// small frame; mu stays held, as for ctl_peer_close.
static void tell_refused_locked(rtr_server *s, member *e, ctl_peer *p) {
  cJSON *m = prt_refused_encode(&(prt_refused){.reason = e->why, .code = "another_model"}, NULL, 0);
  int sent = m && ctl_peer_send(p, m) == 0;
  cJSON_Delete(m);
  ctl_peer_close(p);
  ctl_peer_unref(p);
  if (!sent) {
    failed_locked(s->mem, e, "the refusal could not be sent");
    return;
  }
  e->told = 1;
  utl_log(LOGC, "told worker %s (%s:%d) why it is refused", e->m.name, e->w.host, e->w.port);
}

static void *dialer_main(void *arg) {
  rtr_server *s = arg;
  rtr_members *ms = s->mem;
  pthread_mutex_lock(&s->mu);
  while (!ms->stop) {
    int64_t now = utl_now_ms(), wake = now + 1000;
    member *e = pick_locked(ms, now, &wake);
    if (!e) {
      struct timespec dl = utl_deadline_ms(wake - now + 1);
      pthread_cond_timedwait(&ms->cv, &s->mu, &dl);
      continue;
    }
    e->dialling = 1;
    uint64_t gen = e->gen;
    char host[sizeof e->w.host], name[sizeof e->w.name], err[256] = "";
    int port = e->w.port;
    snprintf(host, sizeof host, "%s", e->w.host);
    snprintf(name, sizeof name, "%s", e->w.name); // the member the proof is for: a listener that is another refuses it
    pthread_mutex_unlock(&s->mu);
    ctl_peer *p = ctl_hub_connect(s->hub, name, host, port, DIAL_TIMEOUT_MS, err, sizeof err);
    pthread_mutex_lock(&s->mu);
    e = by_gen_locked(ms, gen);
    if (e) e->dialling = 0;
    if (p && (!e || ms->stop || !ctl_peer_alive(p))) { // its record changed or went meanwhile, or p closed at once
      ctl_peer_close(p);
      ctl_peer_unref(p);
      if (!e || ms->stop) continue;
      p = NULL;
      snprintf(err, sizeof err, "%s:%d closed the connection after the handshake", host, port);
    }
    if (!e) continue;
    if (e->state == MEM_REFUSED) {
      if (p) tell_refused_locked(s, e, p); // (closes p)
      else failed_locked(ms, e, err);
      continue;
    }
    int li = p ? rtr_links_attach_locked(s, &e->w, e->m.incarnation, p) : -1; // (closes p when it fails)
    if (li < 0) {
      failed_locked(ms, e, p ? "no link could be made" : err);
      continue;
    }
    e->state = MEM_LINKED;
    e->link = li;
    ms->n_linked++;
    gauges_locked(ms);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

int rtr_members_unlinked_locked(rtr_server *s, rtr_member_info *out, int max) {
  rtr_members *ms = s->mem;
  int n = 0;
  for (int i = 0; ms && i < ms->n; i++) {
    const member *e = &ms->m[i];
    if (e->state == MEM_LINKED) continue; // its link speaks for it
    if (n < max)
      out[n] = (rtr_member_info){.name = e->m.name, .role = e->m.role, .host = e->w.host, .port = e->w.port,
                                 .incarnation = e->m.incarnation, .key = e->key, .why = e->why, .fails = e->fails,
                                 .state = e->state == MEM_REFUSED ? "refused"
                                          : e->handshake && e->fails ? "refused"
                                                                     : "pending"};
    n++;
  }
  return n;
}

int rtr_members_start(rtr_server *s, char *err, size_t errlen) {
  if (!s->cfg->has_discovery) return 0;
  mdl_str arch = {0};
  if (s->gguf) mdl_gguf_get_str(s->gguf, "general.architecture", &arch);
  snprintf(s->fp.arch, sizeof s->fp.arch, "%.*s", (int)arch.n, arch.p ? arch.p : "");
  if (s->cfg->model_null) snprintf(s->fp.file_hash, sizeof s->fp.file_hash, "null"); // as worker/shell.c says it
  else if (dsc_file_hash(s->cfg->model_path, s->fp.file_hash, sizeof s->fp.file_hash, err, errlen)) return -1;
  rtr_members *ms = calloc(1, sizeof *ms);
  if (!ms) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  utl_cond_init_monotonic(&ms->cv); // its waits are timed (utl_deadline_ms)
  ms->seed = (unsigned)utl_now_us();
  const char *help = "Workers etcd lists, by state: linked, pending (not linked yet: dialled, with back-off "
                     "after a failed handshake, until it answers), or refused (another model).";
  ms->m_pending = rtr_metrics_gauge(s->m, "dserve:members", help, "state=\"pending\"");
  ms->m_linked = rtr_metrics_gauge(s->m, "dserve:members", help, "state=\"linked\"");
  ms->m_refused = rtr_metrics_gauge(s->m, "dserve:members", help, "state=\"refused\"");
  ms->m_dial_fail = rtr_metrics_counter(s->m, "dserve:member_dial_failures_total",
                                        "Dials of members listed in etcd that failed (connection or handshake).", NULL);
  pthread_mutex_lock(&s->mu);
  s->mem = ms;
  s->hooks.member_dialling = dialling;
  for (int i = 0; i < N_DIALERS; i++)
    if (pthread_create(&ms->dialers[ms->n_dialers], NULL, dialer_main, s) == 0) ms->n_dialers++;
  pthread_mutex_unlock(&s->mu);
  if (!ms->n_dialers) {
    snprintf(err, errlen, "cannot start the member dialer threads");
    return -1; // rtr_members_stop (from rtr_server_free) frees ms
  }
  dsc_watch_fns fns = {.join = on_join, .leave = on_leave, .arg = s};
  if (dsc_watcher_start(&s->cfg->discovery, &fns, "router", &s->watcher, err, errlen)) return -1;
  utl_log(LOGC, "watching etcd %s for cluster %s's workers", s->cfg->discovery.etcd[0], s->cfg->discovery.cluster);
  return 0;
}

void rtr_members_stop(rtr_server *s) {
  dsc_watcher_stop(s->watcher); // joins its thread: no join or leave comes after this
  s->watcher = NULL;
  rtr_members *ms = s->mem;
  if (!ms) return;
  pthread_mutex_lock(&s->mu);
  ms->stop = 1;
  s->hooks.member_dialling = NULL;
  pthread_cond_broadcast(&ms->cv);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < ms->n_dialers; i++) pthread_join(ms->dialers[i], NULL);
  pthread_mutex_lock(&s->mu);
  s->mem = NULL;
  pthread_mutex_unlock(&s->mu);
  pthread_cond_destroy(&ms->cv);
  free(ms->m);
  free(ms);
}
