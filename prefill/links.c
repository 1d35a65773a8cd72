// prefill/links.c: the prefill worker's control links to its peers: the decode workers it hands prompts to and the
// prefill workers it fetches prefixes from (worker.c and fetch.c both call down here).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/wire.h"
#include "prefill/worker_int.h"
#include "util/clock.h"
#include "util/log.h"

// The settings of worker name into *d when it is another worker of role in this cluster (its config file, or etcd's
// membership with discovery): 0; else -1, and why in err (which may be NULL).
int pfl_peer_cfg(pfl_worker *w, const char *name, cfg_role role, cfg_worker *d, char *err, size_t errlen) {
  if (wrk_shell_peer(&w->sh, name, d) && d->role == role && strcmp(name, w->sh.rt->w->name)) return 0;
  if (err)
    snprintf(err, errlen, "'%s' is not a%s %s worker of this cluster", name, role == CFG_ROLE_PREFILL ? "nother" : "",
             cfg_role_name(role));
  return -1;
}

// The control link to worker name of role, connecting (bounded by timeout_ms) when there is none or it dropped.
// A decode worker's link also loads its kvxfer metadata (we write into its pool); either checks that the
// peer's KV layout matches ours.
pfl_link *pfl_link_for(pfl_worker *w, const char *name, cfg_role role, int timeout_ms, char *err, size_t errlen) {
  pfl_link *l = NULL;
  for (int i = 0; i < w->n_links; i++)
    if (!strcmp(w->links[i]->name, name)) l = w->links[i];
  if (l && ctl_peer_alive(l->peer)) return l;
  cfg_worker d;
  // With discovery, the router may have seen a new member in etcd a moment before this worker's own watcher did:
  // the name gets the link's time bound to appear before it is refused.
  for (int64_t until = utl_now_ms() + timeout_ms; pfl_peer_cfg(w, name, role, &d, err, errlen);) {
    if (!w->sh.peers || utl_now_ms() >= until) return NULL;
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  }
  if (!l) {
    pfl_link **nl = realloc(w->links, (size_t)(w->n_links + 1) * sizeof *nl);
    if (nl) w->links = nl;
    if (!nl || !(l = calloc(1, sizeof *l))) {
      snprintf(err, errlen, "out of memory");
      return NULL;
    }
    w->links[w->n_links++] = l;
    snprintf(l->name, sizeof l->name, "%s", name);
  }
  ctl_peer_unref(l->peer); // a dropped link: reconnect
  l->peer = ctl_hub_connect(w->sh.hub, name, d.host, d.port, timeout_ms, err, errlen);
  if (!l->peer) return NULL;
  prt_hello_ok ok;
  char why[200];
  int bad = prt_hello_ok_decode(ctl_peer_hello(l->peer), &ok, why, sizeof why);
  if (bad) snprintf(err, errlen, "%s", why);
  else
    bad = kv_wire_check_layout(ok.has_layout ? &ok.kv_layout : NULL, w->sh.rt->kv, &l->remote, err, errlen) ||
          (role == CFG_ROLE_DECODE && kv_wire_load_md(ok.kvx_md, w->sh.kvx, l->kvx_peer, sizeof l->kvx_peer, err, errlen));
  if (bad) {
    ctl_peer_close(l->peer);
    ctl_peer_unref(l->peer);
    l->peer = NULL;
    return NULL;
  }
  if (role == CFG_ROLE_DECODE)
    utl_log(w->sh.rt->w->name, "linked to decode worker %s (kvxfer %s)", name,
            kvx_peer_backend(w->sh.kvx, l->kvx_peer) ? kvx_peer_backend(w->sh.kvx, l->kvx_peer) : "?");
  else
    utl_log(w->sh.rt->w->name, "linked to prefill worker %s (prefix fetch)", name);
  return l;
}
