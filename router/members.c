// router/members.c: the router's side of discovery: etcd's membership (disco/ watcher) becomes worker links, after
// the model check; a worker serving another model is refused, loudly.
#include <stdio.h>
#include <string.h>

#include "router/server_int.h"
#include "util/log.h"

// The watcher's join: a member appeared or its record changed.
static void on_join(void *arg, const dsc_member *m) {
  rtr_server *s = arg;
  if (!dsc_same_model(&m->fp, &s->fp)) {
    utl_err(LOGC, "REFUSING worker %s (%s:%d): it serves model %s %s, this router serves %s %s (architecture, "
            "<file size>-<hash>); it gets no link and no work",
            m->name, m->host, m->port, m->fp.arch, m->fp.file_hash, s->fp.arch, s->fp.file_hash);
    pthread_mutex_lock(&s->mu);
    rtr_links_leave_locked(s, m->name, -1); // its name replaced by a worker of another model: no link of that name
    pthread_mutex_unlock(&s->mu);
    return;
  }
  cfg_worker w;
  dsc_member_to_cfg(m, &w);
  pthread_mutex_lock(&s->mu);
  if (!s->stopping) rtr_links_join_locked(s, &w, m->incarnation);
  pthread_mutex_unlock(&s->mu);
}

static void on_leave(void *arg, const dsc_member *m) {
  rtr_server *s = arg;
  pthread_mutex_lock(&s->mu);
  rtr_links_leave_locked(s, m->name, m->incarnation);
  pthread_mutex_unlock(&s->mu);
}

int rtr_members_start(rtr_server *s, char *err, size_t errlen) {
  if (!s->cfg->has_discovery) return 0;
  mdl_str arch = {0};
  if (s->gguf) mdl_gguf_get_str(s->gguf, "general.architecture", &arch);
  snprintf(s->fp.arch, sizeof s->fp.arch, "%.*s", (int)arch.n, arch.p ? arch.p : "");
  if (dsc_file_hash(s->cfg->model_path, s->fp.file_hash, sizeof s->fp.file_hash, err, errlen)) return -1;
  dsc_watch_fns fns = {.join = on_join, .leave = on_leave, .arg = s};
  if (dsc_watcher_start(&s->cfg->discovery, &fns, "router", &s->watcher, err, errlen)) return -1;
  utl_log(LOGC, "watching etcd %s for cluster %s's workers", s->cfg->discovery.etcd[0], s->cfg->discovery.cluster);
  return 0;
}

void rtr_members_stop(rtr_server *s) {
  dsc_watcher_stop(s->watcher); // joins its thread: no join or leave comes after this
  s->watcher = NULL;
}
