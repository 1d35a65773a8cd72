// config/config.c: the cluster config file (configs/README.md documents every key), parsed strictly with cJSON.
#include "config/config.h"
#include "config/config_int.h"

#include "ctl/secret.h"
#include "kernels/krn.h"
#include "models/null.h"
#include "util/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *cfg_role_name(cfg_role r) {
  switch (r) {
    case CFG_ROLE_BOTH: return "both";
    case CFG_ROLE_PREFILL: return "prefill";
    case CFG_ROLE_DECODE: return "decode";
  }
  return "?";
}

int cfg_role_parse(const char *s, cfg_role *out) {
  if (!s) return -1;
  if (!strcmp(s, "both")) *out = CFG_ROLE_BOTH;
  else if (!strcmp(s, "prefill")) *out = CFG_ROLE_PREFILL;
  else if (!strcmp(s, "decode")) *out = CFG_ROLE_DECODE;
  else return -1;
  return 0;
}

// Names (nodes, workers): 1..63 bytes of [A-Za-z0-9_.-].
static int cfg_name_ok(const char *s) {
  if (!*s) return 0;
  for (const char *p = s; *p; p++) {
    char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return 0;
  }
  return 1;
}

static int cfg_name(cfg_ctx *x, const char *path, const char *key, const char *val) {
  if (cfg_name_ok(val)) return 0;
  char field[256];
  cfg_join(field, sizeof field, path, key);
  return cfg_fail(x, field, "\"%s\" is not a valid name (1..63 of A-Z a-z 0-9 _ . -)", val);
}

// ---- nodes ----

typedef struct cfg_node {
  char name[64];
  char host[64]; // default address of the roles on this node ("" = 127.0.0.1)
} cfg_node;

static int cfg_add_node(cfg_cluster *c, const char *name) {
  for (int i = 0; i < c->n_nodes; i++)
    if (!strcmp(c->nodes[i], name)) return 0;
  char **nn = realloc(c->nodes, (size_t)(c->n_nodes + 1) * sizeof *nn);
  if (!nn) return -1;
  c->nodes = nn;
  nn[c->n_nodes] = strdup(name);
  if (!nn[c->n_nodes]) return -1;
  c->n_nodes++;
  return 0;
}

int cfg_has_node(const cfg_cluster *c, const char *node) {
  for (int i = 0; c && node && i < c->n_nodes; i++)
    if (!strcmp(c->nodes[i], node)) return 1;
  return 0;
}

// ---- sections ----

static const char *const K_TOP[] = {"model", "model_name", "chat_template", "chat_template_file", "secret",
                                    "secret_file", "nodes", "router", "workers", "sampling", "logging", "tracing",
                                    "discovery",
                                    "max_model_len", "kvstore", NULL};
static const char *const K_SAMPLING[] = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", NULL};
static const char *const K_NODE[] = {"host", NULL};
static const char *const K_ROUTER[] = {"node",          "host",         "port",       "api_keys",  "api_keys_file",
                                       "max_body_bytes", "conn_timeout_s", "queue_limit", "max_tokens_limit",
                                       "max_n",         "max_stop",     "request_timeout_ms", "disagg_threshold",
                                       "disagg_policy", "disagg_max_prefill_queue", "routing",       "prefix_fetch", "prefix_fetch_min_blocks",
                                       "link_dead_ms",  "drain_timeout_s", "max_connections",
                                       "max_connections_per_client", "header_timeout_s", "body_timeout_s", "max_choices",
                                       "max_request_tokens", "migration_limit",
                                       "migration_wait_ms", "migrate_silent_ms", "metrics_public",
                                       "strict_model_name", "stream_queue_bytes", "stream_flush_ms", NULL};
static const char *const K_ROUTING[] = {"overlap", "queue", "free", NULL};
static const char *const K_WORKER[] = {"name",    "node",       "role",     "host",          "port",
                                       "threads", "kernels",    "device",   "kv_budget_mb",  "kv_budget_tokens", "block_size",
                                       "kv_type", "max_seqs",   "max_batch_tokens", "kvxfer", "prefix_cache_mb",
                                       "prefix_host_mb", "prefix_disk_mb", "prefix_disk_path", "cuda_graphs", "handoff_timeout_ms",
                                       "table_timeout_ms", "drain_timeout_s", "tpot_target_ms", "spec", "null_step_ms",
                                       "null_prefill_us_per_token", "null_kv_bytes_per_token", NULL};
static const char *const K_KVX[] = {"backend", "host", "port", "staging", "encrypt", NULL};
static const char *const S_STAGING[] = {"auto", "on", "off", NULL};
static const char *const S_ONOFF[] = {"off", "on", NULL};
static const char *const S_SPEC[] = {"auto", "off", NULL};
static const char *const S_KERNELS[] = {"auto", "scalar", "avx2", "avx2vnni", "avx512", "amx", NULL};
static const char *const S_KVTYPE[] = {"f16", "f32", "q8_0", NULL};
static const char *const S_DISAGG_POLICY[] = {"auto", "threshold", NULL};
static const char *const S_BACKEND[] = {"auto", "tcp", "shm", "rdma", "nccl", "nixl", NULL};
static const char *const S_ROLE[] = {"both", "prefill", "decode", NULL};

static const char *cfg_node_host(const cfg_node *nodes, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(nodes[i].name, name) && nodes[i].host[0]) return nodes[i].host;
  return "127.0.0.1";
}

// The node a role runs on when it names none: "local", or the only node of "nodes"; NULL (required) when
// "nodes" names several.
static const char *cfg_default_node(const cfg_node *nodes, int n_nodes, int nodes_given) {
  if (!nodes_given) return "local";
  return n_nodes == 1 ? nodes[0].name : NULL;
}

// rel against the folder of path (the config file), unless rel is absolute or path has no folder.
static int cfg_resolve_path(cfg_ctx *x, const char *key, const char *rel, const char *path, char *out, size_t cap) {
  size_t n = strlen(rel);
  if (!n) return cfg_fail(x, key, "must not be empty");
  const char *slash = path ? strrchr(path, '/') : NULL;
  int w;
  if (rel[0] == '/' || !slash) w = snprintf(out, cap, "%s", rel);
  else w = snprintf(out, cap, "%.*s/%s", (int)(slash - path), path, rel);
  if (w < 0 || (size_t)w >= cap) return cfg_fail(x, key, "path too long");
  return 0;
}

static int parse_router(cfg_ctx *x, const cJSON *r, int present, cfg_router *o, const cfg_node *nodes, int n_nodes,
                      int nodes_given) {
  const char *p = "router";
  if (cfg_check_keys(x, r, p, K_ROUTER)) return -1;
  const char *dn = cfg_default_node(nodes, n_nodes, nodes_given);
  if (!present && !dn) dn = nodes[0].name;
  if (cfg_str(x, r, p, "node", o->node, sizeof o->node, dn) || cfg_name(x, p, "node", o->node)) return -1;
  if (nodes_given && present) {
    int found = 0;
    for (int i = 0; i < n_nodes; i++) found |= !strcmp(nodes[i].name, o->node);
    if (!found) return cfg_fail(x, "router.node", "\"%s\" is not a node named in \"nodes\"", o->node);
  }
  if (cfg_str(x, r, p, "host", o->host, sizeof o->host, cfg_node_host(nodes, n_nodes, o->node))) return -1;
  if (!o->host[0]) return cfg_fail(x, "router.host", "must not be empty");
  if (cfg_int32(x, r, p, "port", &o->port, 0, 65535, CFG_DEF_ROUTER_PORT, 0)) return -1;
  const cJSON *keys = cfg_item(r, "api_keys");
  if (keys) {
    if (!cJSON_IsArray(keys)) return cfg_fail(x, "router.api_keys", "expected an array of strings, got %s", cfg_type_name(keys));
    int n = cJSON_GetArraySize(keys);
    if (n > 0) {
      o->api_keys = calloc((size_t)n, sizeof *o->api_keys);
      if (!o->api_keys) return cfg_fail(x, "router.api_keys", "out of memory");
    }
    int i = 0;
    for (const cJSON *k = keys->child; k; k = k->next, i++) {
      char field[64];
      snprintf(field, sizeof field, "router.api_keys[%d]", i);
      if (!cJSON_IsString(k)) return cfg_fail(x, field, "expected a string, got %s", cfg_type_name(k));
      if (!k->valuestring[0]) return cfg_fail(x, field, "must not be empty");
      o->api_keys[i] = strdup(k->valuestring);
      if (!o->api_keys[i]) return cfg_fail(x, field, "out of memory");
      o->n_api_keys = i + 1;
    }
  }
  char kf[1024];
  if (cfg_str(x, r, p, "api_keys_file", kf, sizeof kf, "")) return -1;
  if (cfg_item(r, "api_keys_file") && !kf[0]) return cfg_fail(x, "router.api_keys_file", "must not be empty");
  if (kf[0] && cfg_resolve_path(x, "router.api_keys_file", kf, x->file, o->api_keys_file, sizeof o->api_keys_file))
    return -1;
  long long body;
  if (cfg_int(x, r, p, "max_body_bytes", &body, 1, 1LL << 40, 1 << 20, 0)) return -1;
  o->max_body_bytes = (size_t)body;
  if (cfg_int32(x, r, p, "conn_timeout_s", &o->conn_timeout_s, 1, 86400, CFG_DEF_CONN_TIMEOUT_S, 0)) return -1;
  if (cfg_int32(x, r, p, "queue_limit", &o->queue_limit, 1, 1000000, CFG_DEF_QUEUE_LIMIT, 0)) return -1;
  if (cfg_int32(x, r, p, "max_tokens_limit", &o->max_tokens_limit, 0, 1 << 30, 0, 0)) return -1;
  if (cfg_int32(x, r, p, "max_n", &o->max_n, 1, 1024, CFG_DEF_MAX_N, 0)) return -1;
  if (cfg_int32(x, r, p, "max_stop", &o->max_stop, 0, 1024, CFG_DEF_MAX_STOP, 0)) return -1;
  if (cfg_int32(x, r, p, "request_timeout_ms", &o->request_timeout_ms, 1, 86400000, CFG_DEF_REQUEST_TIMEOUT_MS, 0)) return -1;
  char policy[16];
  if (cfg_int32(x, r, p, "disagg_threshold", &o->disagg_threshold, 0, 1 << 30, CFG_DEF_DISAGG_THRESHOLD, 0) ||
      cfg_str(x, r, p, "disagg_policy", policy, sizeof policy, "auto") ||
      cfg_one_of(x, p, "disagg_policy", policy, S_DISAGG_POLICY) ||
      cfg_int32(x, r, p, "disagg_max_prefill_queue", &o->disagg_max_prefill_queue, 0, 1 << 20,
                CFG_DEF_DISAGG_MAX_PREFILL_QUEUE, 0))
    return -1;
  o->disagg_policy = strcmp(policy, "threshold") ? CFG_DISAGG_AUTO : CFG_DISAGG_THRESHOLD;
  if (cfg_int32(x, r, p, "link_dead_ms", &o->link_dead_ms, 2000, 3600000, CFG_DEF_LINK_DEAD_MS, 0)) return -1;
  if (cfg_bool(x, r, p, "prefix_fetch", &o->prefix_fetch, 0) ||
      cfg_int32(x, r, p, "prefix_fetch_min_blocks", &o->prefix_fetch_min_blocks, 1, 1 << 20,
                CFG_DEF_PREFIX_FETCH_MIN_BLOCKS, 0))
    return -1;
  if (cfg_int32(x, r, p, "drain_timeout_s", &o->drain_timeout_s, 0, 3600, CFG_DEF_DRAIN_TIMEOUT_S, 0) ||
      cfg_bool(x, r, p, "metrics_public", &o->metrics_public, 0))
    return -1;
  if (cfg_bool(x, r, p, "strict_model_name", &o->strict_model_name, 0)) return -1;
  if (cfg_int32(x, r, p, "max_connections", &o->max_connections, 1, 1000000, CFG_DEF_MAX_CONNECTIONS, 0) ||
      cfg_int32(x, r, p, "max_connections_per_client", &o->max_connections_per_client, 1, 1000000,
                CFG_DEF_MAX_CONNECTIONS_PER_CLIENT, 0) ||
      cfg_int32(x, r, p, "header_timeout_s", &o->header_timeout_s, 1, 3600, CFG_DEF_HEADER_TIMEOUT_S, 0) ||
      cfg_int32(x, r, p, "body_timeout_s", &o->body_timeout_s, 1, 3600, CFG_DEF_BODY_TIMEOUT_S, 0))
    return -1;
  if (cfg_int32(x, r, p, "max_choices", &o->max_choices, 1, 1 << 20, CFG_DEF_MAX_CHOICES, 0) ||
      cfg_int32(x, r, p, "max_request_tokens", &o->max_request_tokens, 0, 1 << 30, 0, 0))
    return -1;
  if (!cfg_item(r, "max_choices") && o->max_choices < o->max_n) o->max_choices = o->max_n; // n alone always fits
  if (cfg_int32(x, r, p, "migration_limit", &o->migration_limit, 0, 100, CFG_DEF_MIGRATION_LIMIT, 0) ||
      cfg_int32(x, r, p, "migration_wait_ms", &o->migration_wait_ms, 0, 3600000, CFG_DEF_MIGRATION_WAIT_MS, 0) ||
      cfg_int32(x, r, p, "migrate_silent_ms", &o->migrate_silent_ms, 0, 3600000, CFG_DEF_MIGRATE_SILENT_MS, 0) ||
      cfg_int32(x, r, p, "stream_queue_bytes", &o->stream_queue_bytes, 4096, 1 << 30, CFG_DEF_STREAM_QUEUE_BYTES, 0) ||
      cfg_int32(x, r, p, "stream_flush_ms", &o->stream_flush_ms, 0, 1000, 0, 0))
    return -1;
  const cJSON *rt;
  if (cfg_obj(x, r, p, "routing", &rt)) return -1;
  if (rt && cfg_check_keys(x, rt, "router.routing", K_ROUTING)) return -1;
  if (cfg_num(x, rt, "router.routing", "overlap", &o->w_overlap, 0, 0, 1e308, 1.0) ||
      cfg_num(x, rt, "router.routing", "queue", &o->w_queue, 0, 0, 1e308, 0.5) ||
      cfg_num(x, rt, "router.routing", "free", &o->w_free, 0, 0, 1e308, 0.2))
    return -1;
  return 0;
}

// The top-level "sampling" section: each key optional, has_* says which the file gives (docs: configs/README.md).
static int parse_sampling(cfg_ctx *x, const cJSON *root, cfg_sampling *o) {
  const cJSON *sp;
  const char *p = "sampling";
  memset(o, 0, sizeof *o);
  if (cfg_obj(x, root, "", p, &sp)) return -1;
  if (!sp) return 0;
  if (cfg_check_keys(x, sp, p, K_SAMPLING)) return -1;
  o->has_temperature = cfg_item(sp, "temperature") != NULL;
  o->has_top_k = cfg_item(sp, "top_k") != NULL;
  o->has_top_p = cfg_item(sp, "top_p") != NULL;
  o->has_min_p = cfg_item(sp, "min_p") != NULL;
  o->has_repetition_penalty = cfg_item(sp, "repetition_penalty") != NULL;
  if (cfg_num(x, sp, p, "temperature", &o->temperature, 0, 0, 2, 0) ||
      cfg_int32(x, sp, p, "top_k", &o->top_k, -1, 1000000, 0, 0) ||
      cfg_num(x, sp, p, "top_p", &o->top_p, 0, 1, 1, 0) || cfg_num(x, sp, p, "min_p", &o->min_p, 0, 0, 1, 0) ||
      cfg_num(x, sp, p, "repetition_penalty", &o->repetition_penalty, 0, 1, 2, 0))
    return -1;
  return 0;
}

static int cfg_device_ok(const char *d) {
  if (!strcmp(d, "cpu") || !strcmp(d, "cuda")) return 1;
  if (strncmp(d, "cuda:", 5) || !d[5]) return 0;
  for (const char *p = d + 5; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  return strlen(d + 5) <= 4;
}

static int parse_worker(cfg_ctx *x, const cJSON *w, int idx, cfg_worker *o, const cfg_node *nodes, int n_nodes,
                      int nodes_given, int ncpu) {
  char p[32], field[96];
  snprintf(p, sizeof p, "workers[%d]", idx);
  if (!cJSON_IsObject(w)) return cfg_fail(x, p, "expected an object, got %s", cfg_type_name(w));
  if (cfg_check_keys(x, w, p, K_WORKER)) return -1;
  char defname[16];
  snprintf(defname, sizeof defname, "w%d", idx);
  if (cfg_str(x, w, p, "name", o->name, sizeof o->name, defname) || cfg_name(x, p, "name", o->name)) return -1;
  if (cfg_str(x, w, p, "node", o->node, sizeof o->node, cfg_default_node(nodes, n_nodes, nodes_given)) ||
      cfg_name(x, p, "node", o->node))
    return -1;
  if (nodes_given) {
    int found = 0;
    for (int i = 0; i < n_nodes; i++) found |= !strcmp(nodes[i].name, o->node);
    snprintf(field, sizeof field, "%s.node", p);
    if (!found) return cfg_fail(x, field, "\"%s\" is not a node named in \"nodes\"", o->node);
  }
  char role[16];
  if (cfg_str(x, w, p, "role", role, sizeof role, "both") || cfg_one_of(x, p, "role", role, S_ROLE)) return -1;
  snprintf(field, sizeof field, "%s.role", p);
  if (cfg_role_parse(role, &o->role)) // cfg_one_of has checked it: never
    return cfg_fail(x, field, "\"%s\" is not a role", role);
  const char *nhost = cfg_node_host(nodes, n_nodes, o->node);
  if (cfg_str(x, w, p, "host", o->host, sizeof o->host, nhost)) return -1;
  snprintf(field, sizeof field, "%s.host", p);
  if (!o->host[0]) return cfg_fail(x, field, "must not be empty");
  if (cfg_int32(x, w, p, "port", &o->port, 0, 65535, 0, 1)) return -1;
  if (cfg_int32(x, w, p, "threads", &o->threads, 1, KRN_POOL_MAX_THREADS, ncpu, 0)) return -1;
  if (cfg_str(x, w, p, "kernels", o->kernels, sizeof o->kernels, "auto") ||
      cfg_one_of(x, p, "kernels", o->kernels, S_KERNELS))
    return -1;
  if (cfg_str(x, w, p, "device", o->device, sizeof o->device, "cpu")) return -1;
  snprintf(field, sizeof field, "%s.device", p);
  if (!cfg_device_ok(o->device)) return cfg_fail(x, field, "\"%s\" is not one of: cpu, cuda, cuda:N", o->device);
  if (!strcmp(o->device, "cuda")) snprintf(o->device, sizeof o->device, "cuda:0");
  if (cfg_str(x, w, p, "cuda_graphs", o->cuda_graphs, sizeof o->cuda_graphs, "off") ||
      cfg_one_of(x, p, "cuda_graphs", o->cuda_graphs, S_ONOFF))
    return -1;
  if (cfg_num(x, w, p, "kv_budget_mb", &o->kv_budget_mb, 0, 1, 1e7, CFG_DEF_KV_BUDGET_MB)) return -1;
  if (cfg_int32(x, w, p, "kv_budget_tokens", &o->kv_budget_tokens, 0, 1 << 30, 0, 0)) return -1;
  if (cfg_int32(x, w, p, "block_size", &o->block_size, 1, 1024, CFG_DEF_BLOCK_SIZE, 0)) return -1;
  if (cfg_str(x, w, p, "kv_type", o->kv_type, sizeof o->kv_type, "f16") ||
      cfg_one_of(x, p, "kv_type", o->kv_type, S_KVTYPE))
    return -1;
  if (cfg_int32(x, w, p, "max_seqs", &o->max_seqs, 1, 65536, CFG_DEF_MAX_SEQS, 0)) return -1;
  if (cfg_int32(x, w, p, "max_batch_tokens", &o->max_batch_tokens, 1, 1 << 20, CFG_DEF_MAX_BATCH_TOKENS, 0)) return -1;
  if (cfg_num(x, w, p, "tpot_target_ms", &o->tpot_target_ms, 0, 0, 1e6, 0)) return -1;
  if (cfg_str(x, w, p, "spec", o->spec, sizeof o->spec, CFG_DEF_SPEC) || cfg_one_of(x, p, "spec", o->spec, S_SPEC))
    return -1;
  if (cfg_int32(x, w, p, "handoff_timeout_ms", &o->handoff_timeout_ms, 1, 86400000, CFG_DEF_HANDOFF_TIMEOUT_MS, 0) ||
      cfg_int32(x, w, p, "table_timeout_ms", &o->table_timeout_ms, 1, 86400000, CFG_DEF_TABLE_TIMEOUT_MS, 0) ||
      cfg_int32(x, w, p, "drain_timeout_s", &o->drain_timeout_s, 0, 3600, CFG_DEF_DRAIN_TIMEOUT_S, 0))
    return -1;
  static const char *const null_keys[] = {"null_step_ms", "null_prefill_us_per_token", "null_kv_bytes_per_token"};
  for (int i = 0; i < 3 && !x->null_model; i++)
    if (cfg_item(w, null_keys[i])) {
      snprintf(field, sizeof field, "%s.%s", p, null_keys[i]);
      return cfg_fail(x, field, "is for model \"null\" only; this config's model is a GGUF file");
    }
  long long kvb;
  if (cfg_num(x, w, p, "null_step_ms", &o->null_step_ms, 0, 0, 60000, CFG_DEF_NULL_STEP_MS) ||
      cfg_num(x, w, p, "null_prefill_us_per_token", &o->null_prefill_us_per_token, 0, 0, 1e6,
              CFG_DEF_NULL_PREFILL_US_PER_TOKEN) ||
      cfg_int(x, w, p, "null_kv_bytes_per_token", &kvb, MDL_NULL_KV_QUANTUM, MDL_NULL_KV_QUANTUM * 4096,
              CFG_DEF_NULL_KV_BYTES_PER_TOKEN, 0))
    return -1;
  o->null_kv_bytes_per_token = (long)kvb;
  if (kvb % MDL_NULL_KV_QUANTUM) {
    snprintf(field, sizeof field, "%s.null_kv_bytes_per_token", p);
    return cfg_fail(x, field, "%lld is not a multiple of %d (%d layers of K and V, in heads of %d F16 values)", kvb,
                    MDL_NULL_KV_QUANTUM, MDL_NULL_LAYERS, MDL_NULL_HEAD_DIM);
  }
  // Default: the prefix cache may keep up to half of the KV pool (unused cached blocks are evicted on demand).
  if (cfg_num(x, w, p, "prefix_cache_mb", &o->prefix_cache_mb, 0, 0, 1e7, o->kv_budget_mb / 2)) return -1;
  // Second tier: blocks evicted from the pool are kept in host DRAM, then in one file on local disk (its path is
  // resolved against the config file's folder, as every path in the file is).
  char dpath[sizeof o->prefix_disk_path];
  if (cfg_num(x, w, p, "prefix_host_mb", &o->prefix_host_mb, 0, 0, 1e7, 0) ||
      cfg_num(x, w, p, "prefix_disk_mb", &o->prefix_disk_mb, 0, 0, 1e8, 0) ||
      cfg_str(x, w, p, "prefix_disk_path", dpath, sizeof dpath, ""))
    return -1;
  if (dpath[0]) {
    snprintf(field, sizeof field, "%s.prefix_disk_path", p);
    if (cfg_resolve_path(x, field, dpath, x->file, o->prefix_disk_path, sizeof o->prefix_disk_path)) return -1;
  }
  if (o->prefix_disk_mb > 0 && !o->prefix_disk_path[0]) {
    snprintf(field, sizeof field, "%s.prefix_disk_path", p);
    return cfg_fail(x, field, "needed when prefix_disk_mb > 0 (a file on local disk, one per worker)");
  }
  const cJSON *k;
  char kp[48];
  snprintf(kp, sizeof kp, "%s.kvxfer", p);
  if (cfg_obj(x, w, p, "kvxfer", &k)) return -1;
  if (k && cfg_check_keys(x, k, kp, K_KVX)) return -1;
  if (cfg_str(x, k, kp, "backend", o->kvx_backend, sizeof o->kvx_backend, "auto") ||
      cfg_one_of(x, kp, "backend", o->kvx_backend, S_BACKEND))
    return -1;
  if (cfg_str(x, k, kp, "host", o->kvx_host, sizeof o->kvx_host, o->host)) return -1;
  snprintf(field, sizeof field, "%s.host", kp);
  if (!o->kvx_host[0]) return cfg_fail(x, field, "must not be empty");
  if (cfg_int32(x, k, kp, "port", &o->kvx_port, 0, 65535, 0, 0)) return -1;
  if (cfg_str(x, k, kp, "staging", o->kvx_staging, sizeof o->kvx_staging, "auto") ||
      cfg_one_of(x, kp, "staging", o->kvx_staging, S_STAGING))
    return -1;
  int enc;
  if (cfg_bool(x, k, kp, "encrypt", &enc, CFG_DEF_KVX_ENCRYPT)) return -1;
  o->kvx_plaintext = !enc;
  return 0;
}

// Two listeners of the same node on the same host and non-zero port.
typedef struct cfg_listen {
  const char *node, *host, *what;
  int port;
} cfg_listen;

static int cfg_check_ports(cfg_ctx *x, const cfg_cluster *c) {
  int n = 0;
  cfg_listen *l = calloc((size_t)(2 * c->n_workers + 1), sizeof *l);
  if (!l) return cfg_fail(x, NULL, "out of memory");
  char (*names)[48] = calloc((size_t)(2 * c->n_workers + 1), sizeof *names);
  if (!names) {
    free(l);
    return cfg_fail(x, NULL, "out of memory");
  }
  if (c->has_router) {
    snprintf(names[n], sizeof names[n], "router.port");
    l[n] = (cfg_listen){c->router.node, c->router.host, names[n], c->router.port};
    n++;
  }
  for (int i = 0; i < c->n_workers; i++) {
    const cfg_worker *w = &c->workers[i];
    snprintf(names[n], sizeof names[n], "workers[%d].port", i);
    l[n] = (cfg_listen){w->node, w->host, names[n], w->port};
    n++;
    snprintf(names[n], sizeof names[n], "workers[%d].kvxfer.port", i);
    l[n] = (cfg_listen){w->node, w->kvx_host, names[n], w->kvx_port};
    n++;
  }
  int rc = 0;
  for (int i = 0; i < n && !rc; i++)
    for (int j = 0; j < i && !rc; j++)
      if (l[i].port && l[i].port == l[j].port && !strcmp(l[i].node, l[j].node) && !strcmp(l[i].host, l[j].host))
        rc = cfg_fail(x, l[i].what, "%d on %s is already used by %s", l[i].port, l[i].host, l[j].what);
  free(names);
  free(l);
  return rc;
}

// out = rel resolved against the folder of the config file path (rel itself when absolute or path has no folder).

// The first host that is not loopback (router, nodes, workers' control and kvxfer hosts) into c->remote_field:
// such a cluster listens where other machines can connect, and needs a strong secret from a file or the environment.
static void cfg_find_remote(cfg_cluster *c, const cfg_node *nodes, int n_nodes) {
  c->remote_field[0] = 0;
  if (c->has_router && !ctl_host_is_loopback(c->router.host)) {
    snprintf(c->remote_field, sizeof c->remote_field, "router.host \"%.60s\"", c->router.host);
    return;
  }
  for (int i = 0; i < n_nodes; i++)
    if (nodes[i].host[0] && !ctl_host_is_loopback(nodes[i].host)) {
      snprintf(c->remote_field, sizeof c->remote_field, "nodes.%.30s.host \"%.50s\"", nodes[i].name, nodes[i].host);
      return;
    }
  for (int i = 0; i < c->n_workers; i++) {
    const cfg_worker *w = &c->workers[i];
    if (!ctl_host_is_loopback(w->host)) {
      snprintf(c->remote_field, sizeof c->remote_field, "workers[%d].host \"%.60s\"", i, w->host);
      return;
    }
    if (!ctl_host_is_loopback(w->kvx_host)) {
      snprintf(c->remote_field, sizeof c->remote_field, "workers[%d].kvxfer.host \"%.50s\"", i, w->kvx_host);
      return;
    }
  }
}

static int cfg_build(cfg_ctx *x, const cJSON *root, const char *path, cfg_cluster *c) {
  if (!cJSON_IsObject(root)) return cfg_fail(x, NULL, "expected a JSON object at the top, got %s", cfg_type_name(root));
  if (cfg_check_keys(x, root, "", K_TOP)) return -1;
  char model[1024];
  if (cfg_str(x, root, "", "model", model, sizeof model, NULL)) return -1;
  // "null" exactly asks for the null model (models/null.h); a file of that name is "./null"
  c->model_null = x->null_model = !strcmp(model, "null");
  if (c->model_null) snprintf(c->model_path, sizeof c->model_path, "null");
  else if (cfg_resolve_path(x, "model", model, path, c->model_path, sizeof c->model_path)) return -1;
  if (cfg_str(x, root, "", "model_name", c->model_name, sizeof c->model_name, "") ||
      cfg_str(x, root, "", "chat_template", c->chat_template, sizeof c->chat_template, "") ||
      cfg_str(x, root, "", "secret", c->secret, sizeof c->secret, "") ||
      cfg_str(x, root, "", "secret_file", model, sizeof model, ""))
    return -1;
  if (model[0] && cfg_resolve_path(x, "secret_file", model, path, c->secret_file, sizeof c->secret_file)) return -1;
  if (cfg_item(root, "secret_file") && !model[0]) return cfg_fail(x, "secret_file", "must not be empty");
  // the per-request context bound (prompt + max_tokens), 0: the GGUF's training context (`dserve serve -c` sets it)
  if (cfg_int32(x, root, "", "max_model_len", &c->max_model_len, 0, 1 << 24, 0, 0)) return -1;
  if (cfg_str(x, root, "", "chat_template_file", model, sizeof model, "")) return -1;
  if (cfg_item(root, "chat_template_file") && !model[0]) return cfg_fail(x, "chat_template_file", "must not be empty");
  if (model[0] &&
      cfg_resolve_path(x, "chat_template_file", model, path, c->chat_template_file, sizeof c->chat_template_file))
    return -1;
  c->secret_from = c->secret[0] ? CTL_SECRET_INLINE : CTL_SECRET_NONE;
  if (parse_sampling(x, root, &c->sampling) || cfg_parse_observe(x, root, c)) return -1;

  // nodes: optional; when given, every role's node must be one of them.
  const cJSON *jn;
  if (cfg_obj(x, root, "", "nodes", &jn)) return -1;
  int n_nodes = jn ? cJSON_GetArraySize(jn) : 0;
  cfg_node *nodes = n_nodes ? calloc((size_t)n_nodes, sizeof *nodes) : NULL;
  if (n_nodes && !nodes) return cfg_fail(x, "nodes", "out of memory");
  int rc = 0, i = 0;
  if (jn && !n_nodes) rc = cfg_fail(x, "nodes", "expected at least one node");
  for (const cJSON *it = jn ? jn->child : NULL; it && !rc; it = it->next, i++) {
    char np[128];
    snprintf(np, sizeof np, "nodes.%.100s", it->string);
    if (!cfg_name_ok(it->string) || strlen(it->string) >= sizeof nodes[i].name) {
      rc = cfg_fail(x, np, "not a valid node name (1..63 of A-Z a-z 0-9 _ . -)");
      break;
    }
    if (!cJSON_IsObject(it)) {
      rc = cfg_fail(x, np, "expected an object, got %s", cfg_type_name(it));
      break;
    }
    snprintf(nodes[i].name, sizeof nodes[i].name, "%s", it->string);
    if (cfg_check_keys(x, it, np, K_NODE) || cfg_str(x, it, np, "host", nodes[i].host, sizeof nodes[i].host, "")) rc = -1;
    else if (cfg_add_node(c, nodes[i].name)) rc = cfg_fail(x, "nodes", "out of memory");
  }

  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu < 1) ncpu = 1;
  if (ncpu > KRN_POOL_MAX_THREADS) ncpu = KRN_POOL_MAX_THREADS;

  const cJSON *jr = NULL;
  if (!rc) rc = cfg_obj(x, root, "", "router", &jr);
  if (!rc) {
    c->has_router = jr != NULL;
    static const cJSON empty_obj = {.type = cJSON_Object};
    rc = parse_router(x, jr ? jr : &empty_obj, jr != NULL, &c->router, nodes, n_nodes, jn != NULL);
    if (!rc && c->has_router && cfg_add_node(c, c->router.node)) rc = cfg_fail(x, "router", "out of memory");
  }

  const cJSON *jd = rc ? NULL : cfg_item(root, "discovery");
  c->has_discovery = jd != NULL;
  if (jd && cfg_parse_discovery(jd, path, x->file, &c->discovery, x->err, x->errlen)) rc = -1;
  const cJSON *jk = rc ? NULL : cfg_item(root, "kvstore");
  c->has_kvstore = jk != NULL;
  if (jk && cfg_parse_kvstore(x, jk, path, &c->kvstore)) rc = -1;
  const cJSON *jw = rc ? NULL : cfg_item(root, "workers");
  if (!rc && !jw && !jd) rc = cfg_fail(x, "workers", "missing (an array of at least one worker, or a discovery section)");
  if (!rc && jw && !cJSON_IsArray(jw)) rc = cfg_fail(x, "workers", "expected an array, got %s", cfg_type_name(jw));
  if (!rc && jw) {
    int n = cJSON_GetArraySize(jw);
    if (n < 1 && !jd) rc = cfg_fail(x, "workers", "expected at least one worker (or a discovery section)");
    else if (n >= 1 && !(c->workers = calloc((size_t)n, sizeof *c->workers))) rc = cfg_fail(x, "workers", "out of memory");
    i = 0;
    for (const cJSON *it = rc ? NULL : jw->child; it && !rc; it = it->next, i++) {
      rc = parse_worker(x, it, i, &c->workers[i], nodes, n_nodes, jn != NULL, (int)ncpu);
      if (rc) break;
      c->n_workers = i + 1;
      for (int j = 0; j < i && !rc; j++)
        if (!strcmp(c->workers[j].name, c->workers[i].name)) {
          char f[48];
          snprintf(f, sizeof f, "workers[%d].name", i);
          rc = cfg_fail(x, f, "\"%s\" is already the name of workers[%d]", c->workers[i].name, j);
        }
      if (!rc && cfg_add_node(c, c->workers[i].node)) rc = cfg_fail(x, "workers", "out of memory");
    }
  }
  if (!rc) {
    int has_decode = 0;
    for (i = 0; i < c->n_workers; i++) has_decode |= c->workers[i].role == CFG_ROLE_DECODE;
    for (i = 0; i < c->n_workers && !rc; i++)
      if (c->workers[i].role == CFG_ROLE_PREFILL && !has_decode && !c->has_discovery) {
        char f[48];
        snprintf(f, sizeof f, "workers[%d].role", i);
        rc = cfg_fail(x, f, "a prefill worker needs a decode worker in the cluster, and there is none");
      }
  }
  if (!rc) rc = cfg_check_ports(x, c);
  if (!rc) cfg_find_remote(c, nodes, n_nodes);
  free(nodes);
  return rc;
}

// line:column of byte offset off in json
static void cfg_where(const char *json, size_t len, size_t off, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < off && i < len; i++) {
    if (json[i] == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

int cfg_parse(const char *json, size_t len, const char *path_for_errors, cfg_cluster **out, char *err,
                     size_t errlen) {
  cfg_ctx x = {path_for_errors, err, errlen, 0};
  if (err && errlen) err[0] = 0;
  if (!out) return cfg_fail(&x, NULL, "no output pointer");
  *out = NULL;
  if (!json) return cfg_fail(&x, NULL, "no text");
  // a key twice (cJSON keeps the first, a reader of the file the last), nesting past the limit, a lone surrogate,
  // a NUL or a malformed number: refused where it is, by the pre-pass every JSON input goes through (util/json.h)
  utl_json_issue is;
  int bad = utl_json_check(json, len, CJSON_NESTING_LIMIT, &is);
  if (bad < 0) return cfg_fail(&x, NULL, "out of memory");
  if (bad) {
    int line, col;
    cfg_where(json, len, is.at, &line, &col);
    return cfg_fail(&x, is.path[0] ? is.path : NULL, "%s (line %d, column %d)",
                    is.what == UTL_JSON_DUP_KEY ? "duplicate key" : utl_json_problem_name(is.what), line, col);
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
  if (!root) {
    int line, col;
    size_t off = end && end >= json ? (size_t)(end - json) : 0;
    cfg_where(json, len, off, &line, &col);
    return cfg_fail(&x, NULL, "not valid JSON (near line %d, column %d)", line, col);
  }
  for (const char *p = end; p && p < json + len; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != 0) {
      int line, col;
      cfg_where(json, len, (size_t)(p - json), &line, &col);
      cJSON_Delete(root);
      return cfg_fail(&x, NULL, "text after the JSON object (line %d, column %d)", line, col);
    }
  cfg_cluster *c = calloc(1, sizeof *c);
  if (!c) {
    cJSON_Delete(root);
    return cfg_fail(&x, NULL, "out of memory");
  }
  if (path_for_errors) snprintf(c->path, sizeof c->path, "%s", path_for_errors);
  int rc = cfg_build(&x, root, path_for_errors, c);
  cJSON_Delete(root);
  if (rc) {
    cfg_free(c);
    return -1;
  }
  *out = c;
  return 0;
}

int cfg_read_text(const char *path, char **text, size_t *len_out, char *err, size_t errlen) {
  cfg_ctx x = {path, err, errlen, 0};
  *text = NULL;
  *len_out = 0;
  if (!path) return cfg_fail(&x, NULL, "no path");
  FILE *f = fopen(path, "rb");
  if (!f) return cfg_fail(&x, NULL, "cannot open: %s", strerror(errno));
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      if (cap >= (64u << 20)) {
        free(buf);
        fclose(f);
        return cfg_fail(&x, NULL, "larger than 64 MiB");
      }
      cap = cap ? cap * 2 : 8192;
      char *nb = realloc(buf, cap + 1);
      if (!nb) {
        free(buf);
        fclose(f);
        return cfg_fail(&x, NULL, "out of memory");
      }
      buf = nb;
    }
    size_t r = fread(buf + len, 1, cap - len, f);
    len += r;
    if (r == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return cfg_fail(&x, NULL, "read error");
  }
  buf[len] = 0;
  *text = buf;
  *len_out = len;
  return 0;
}

int cfg_load(const char *path, cfg_cluster **out, char *err, size_t errlen) {
  if (out) *out = NULL;
  char *buf = NULL;
  size_t len = 0;
  if (cfg_read_text(path, &buf, &len, err, errlen)) return -1;
  int rc = cfg_load_text(buf, len, path, out, err, errlen);
  free(buf);
  return rc;
}

int cfg_load_text(const char *json, size_t len, const char *path, cfg_cluster **out, char *err, size_t errlen) {
  int rc = cfg_parse(json, len, path, out, err, errlen);
  if (rc == 0 && (cfg_resolve_secret(*out, err, errlen) || cfg_read_api_keys(*out, err, errlen))) {
    cfg_free(*out);
    *out = NULL;
    return -1;
  }
  return rc;
}

void cfg_free(cfg_cluster *c) {
  if (!c) return;
  ctl_secret_wipe(c->secret, sizeof c->secret);
  for (int i = 0; i < c->router.n_api_keys; i++) free(c->router.api_keys[i]);
  free(c->router.api_keys);
  free(c->workers);
  for (int i = 0; i < c->n_nodes; i++) free(c->nodes[i]);
  free(c->nodes);
  free(c);
}

const cfg_worker *cfg_find_worker(const cfg_cluster *c, const char *name) {
  for (int i = 0; c && name && i < c->n_workers; i++)
    if (!strcmp(c->workers[i].name, name)) return &c->workers[i];
  return NULL;
}

int cfg_set_device(cfg_cluster *c, const char *worker, const char *device, char *err, size_t errlen) {
  cfg_worker *w = (cfg_worker *)cfg_find_worker(c, worker);
  if (!w) {
    snprintf(err, errlen, "no worker named '%s'", worker ? worker : "");
    return -1;
  }
  if (!device || !cfg_device_ok(device)) {
    snprintf(err, errlen, "device \"%s\" is not one of: cpu, cuda, cuda:N", device ? device : "");
    return -1;
  }
  snprintf(w->device, sizeof w->device, "%s", strcmp(device, "cuda") ? device : "cuda:0");
  return 0;
}

#define DEFAULT(field, value) \
  if (o->field <= 0) o->field = (value)

void cfg_router_defaults(cfg_router *o) {
  DEFAULT(conn_timeout_s, CFG_DEF_CONN_TIMEOUT_S);
  DEFAULT(max_n, CFG_DEF_MAX_N);
  DEFAULT(max_stop, CFG_DEF_MAX_STOP);
  DEFAULT(request_timeout_ms, CFG_DEF_REQUEST_TIMEOUT_MS);
  DEFAULT(link_dead_ms, CFG_DEF_LINK_DEAD_MS);
  DEFAULT(max_connections, CFG_DEF_MAX_CONNECTIONS);
  DEFAULT(max_connections_per_client, CFG_DEF_MAX_CONNECTIONS_PER_CLIENT);
  DEFAULT(header_timeout_s, CFG_DEF_HEADER_TIMEOUT_S);
  DEFAULT(body_timeout_s, CFG_DEF_BODY_TIMEOUT_S);
  DEFAULT(max_choices, o->max_n > CFG_DEF_MAX_CHOICES ? o->max_n : CFG_DEF_MAX_CHOICES);
  DEFAULT(stream_queue_bytes, CFG_DEF_STREAM_QUEUE_BYTES);
}

void cfg_worker_defaults(cfg_worker *o) {
  DEFAULT(block_size, CFG_DEF_BLOCK_SIZE);
  DEFAULT(max_seqs, CFG_DEF_MAX_SEQS);
  DEFAULT(max_batch_tokens, CFG_DEF_MAX_BATCH_TOKENS);
  DEFAULT(null_kv_bytes_per_token, CFG_DEF_NULL_KV_BYTES_PER_TOKEN); // (a zero step time is a valid one)
}
