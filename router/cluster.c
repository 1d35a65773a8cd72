// router/cluster.c: GET /v1/cluster, the membership view: every worker the router knows (its config's and etcd's),
// linked or not, with its state and why, its load and KV use. `dserve members` prints it as a table (docs/openai.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/server_int.h"

// One member's object, appended to arr: who and where, and its state with the reason (null when there is none).
static cJSON *entry(cJSON *arr, const char *name, cfg_role role, const char *host, int port, const char *source,
                    int64_t incarnation, const char *state, const char *why) {
  cJSON *o = cJSON_CreateObject();
  if (!o || !cJSON_AddItemToArray(arr, o)) {
    cJSON_Delete(o);
    return NULL;
  }
  char addr[96];
  snprintf(addr, sizeof addr, "%s:%d", host, port);
  cJSON_AddStringToObject(o, "name", name);
  cJSON_AddStringToObject(o, "role", cfg_role_name(role));
  cJSON_AddStringToObject(o, "address", addr);
  cJSON_AddStringToObject(o, "source", source);
  if (incarnation > 0) cJSON_AddNumberToObject(o, "incarnation", (double)incarnation); // us since 1970: exact in a double
  else cJSON_AddNullToObject(o, "incarnation");
  cJSON_AddStringToObject(o, "state", state);
  if (why && why[0]) cJSON_AddStringToObject(o, "reason", why);
  else cJSON_AddNullToObject(o, "reason");
  return o;
}

// A linked worker's load and KV use from its last stats; null before the first, and for a worker without a link (l
// NULL).
static void load(cJSON *o, const rtr_link *l) {
  if (!l || !l->up || l->total_blocks <= 0) {
    const char *k[] = {"running", "waiting", "kv_running_perc", "kv_cached_perc", "kv_blocks"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) cJSON_AddNullToObject(o, k[i]);
    return;
  }
  cJSON_AddNumberToObject(o, "running", l->running);
  cJSON_AddNumberToObject(o, "waiting", l->waiting);
  cJSON_AddNumberToObject(o, "kv_running_perc", rtr_link_kv_running(l));
  cJSON_AddNumberToObject(o, "kv_cached_perc", (double)l->evictable_blocks / l->total_blocks);
  cJSON_AddNumberToObject(o, "kv_blocks", l->total_blocks);
}

enum { ST_LINKED, ST_DRAINING, ST_DOWN, ST_PENDING, ST_REFUSED, N_ST };
static const char *const STATE[N_ST] = {"linked", "draining", "down", "pending", "refused"};

cJSON *rtr_cluster_view(rtr_server *s) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "object", "cluster");
  cJSON_AddStringToObject(root, "model", s->model);
  cJSON *arr = root ? cJSON_AddArrayToObject(root, "members") : NULL;
  if (!arr) {
    cJSON_Delete(root);
    return NULL;
  }
  int counts[N_ST] = {0};
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_links; i++) {
    const rtr_link *l = &s->links[i];
    if (l->gone) continue; // a member that left: its slot waits for another
    int k = l->up ? (l->draining ? ST_DRAINING : ST_LINKED)
                  : l->fails && rtr_handshake_refused(l->last_err) ? ST_REFUSED : ST_DOWN;
    const char *why = l->up ? (l->draining ? "the worker is draining (SIGTERM): no new work" : NULL)
                      : l->last_err[0] ? l->last_err : "not connected yet";
    cJSON *o = entry(arr, l->cfg->name, l->cfg->role, l->cfg->host, l->cfg->port, l->is_member ? "etcd" : "config",
                     l->is_member ? l->incarnation : 0, STATE[k], why);
    if (!o) break;
    cJSON_AddNumberToObject(o, "failures", l->fails);
    load(o, l);
    counts[k]++;
  }
  int n = rtr_members_unlinked_locked(s, NULL, 0);
  rtr_member_info *info = n > 0 ? malloc((size_t)n * sizeof *info) : NULL;
  n = info ? rtr_members_unlinked_locked(s, info, n) : 0;
  for (int i = 0; i < n; i++) {
    const rtr_member_info *m = &info[i];
    int k = !strcmp(m->state, STATE[ST_REFUSED]) ? ST_REFUSED : ST_PENDING;
    cJSON *o = entry(arr, m->name, m->role, m->host, m->port, "etcd", m->incarnation, STATE[k], m->why);
    if (!o) break;
    cJSON_AddStringToObject(o, "etcd_key", m->key);
    cJSON_AddNumberToObject(o, "failures", m->fails);
    load(o, NULL);
    counts[k]++;
  }
  pthread_mutex_unlock(&s->mu);
  free(info);
  cJSON *c = cJSON_AddObjectToObject(root, "counts");
  for (int k = 0; c && k < N_ST; k++) cJSON_AddNumberToObject(c, STATE[k], counts[k]);
  return root;
}
