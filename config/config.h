// config/config.h: the cluster config file (one JSON file for every node), parsed strictly.
#ifndef DSERVE_CFG_CONFIG_H
#define DSERVE_CFG_CONFIG_H

#include <stddef.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cfg_role { CFG_ROLE_BOTH = 0, CFG_ROLE_PREFILL = 1, CFG_ROLE_DECODE = 2 } cfg_role;
const char *cfg_role_name(cfg_role r); // "both", "prefill", "decode"
// router.disagg_policy (router/sched.h rtr_sched_disagg says what each does)
typedef enum cfg_disagg_policy { CFG_DISAGG_AUTO = 0, CFG_DISAGG_THRESHOLD = 1 } cfg_disagg_policy;

// The one place each default lives: config.c fills a file's absent keys with these, and code that meets a config
// made without the file (tests, a zeroed field) falls back to the same constant, never to a number of its own.
#define CFG_DEF_SPEC "auto" // workers[].spec: drafts verified in the step, never changing an answer
enum {
  CFG_DEF_ROUTER_PORT = 8000,
  CFG_DEF_CONN_TIMEOUT_S = 60,
  CFG_DEF_QUEUE_LIMIT = 256,
  CFG_DEF_MAX_N = 8,
  CFG_DEF_MAX_STOP = 8,
  CFG_DEF_REQUEST_TIMEOUT_MS = 600000,
  CFG_DEF_LINK_DEAD_MS = 15000,
  CFG_DEF_DISAGG_THRESHOLD = 128,
  CFG_DEF_DISAGG_MAX_PREFILL_QUEUE = 2,
  CFG_DEF_PREFIX_FETCH_MIN_BLOCKS = 4,
  CFG_DEF_DRAIN_TIMEOUT_S = 30,
  CFG_DEF_MAX_CONNECTIONS = 4096,
  CFG_DEF_MAX_CONNECTIONS_PER_CLIENT = 256,
  CFG_DEF_HEADER_TIMEOUT_S = 10,
  CFG_DEF_BODY_TIMEOUT_S = 30,
  CFG_DEF_MAX_CHOICES = 64,
  CFG_DEF_MIGRATION_LIMIT = 2,
  CFG_DEF_MIGRATION_WAIT_MS = 10000,
  CFG_DEF_STREAM_QUEUE_BYTES = 4 << 20,
  CFG_DEF_MIGRATE_SILENT_MS = 2000,
  CFG_DEF_STATS_INTERVAL_S = 10,
  CFG_DEF_TRACE_QUEUE_SPANS = 4096,
  CFG_DEF_TRACE_FLUSH_MS = 500,
  CFG_DEF_KV_BUDGET_MB = 256,
  CFG_DEF_BLOCK_SIZE = 16,
  CFG_DEF_MAX_SEQS = 64,
  CFG_DEF_MAX_BATCH_TOKENS = 256, // the prefill chunk: bench/README.md, "Issue 32", chose it
  CFG_DEF_HANDOFF_TIMEOUT_MS = 30000,
  CFG_DEF_TABLE_TIMEOUT_MS = 30000,
  CFG_DEF_KVX_ENCRYPT = 1, // kvxfer.encrypt: seal KV bytes over the tcp backend
  CFG_DEF_NULL_KV_BYTES_PER_TOKEN = 36864, // the null model (models/null.h): KV bytes per token (F16) ...
};
#define CFG_DEF_NULL_STEP_MS 20.0             // ... a step's time whatever its batch ...
#define CFG_DEF_NULL_PREFILL_US_PER_TOKEN 50.0 // ... and each prompt token's on top

typedef struct cfg_worker {
  char name[64];          // unique in the cluster
  char node[64];          // the node that runs it
  cfg_role role;
  char host[64];          // control address it listens on (and the router connects to)
  int port;               // control port (0 = ephemeral; only for tests that read it back)
  int threads;            // compute threads (default: CPUs of the node)
  char kernels[16];       // "auto", "scalar", "avx2", "avx512"
  char device[16];        // "cpu" or "cuda:N"
  char cuda_graphs[4];    // "off" (default) or "on": decode steps replayed from CUDA graphs (models/llama.h)
  double kv_budget_mb;    // KV block pool size
  int kv_budget_tokens;   // when > 0: the pool holds this many tokens instead (llama-server's -c); kv_budget_mb unused
  int block_size;         // tokens per KV block (16)
  char kv_type[8];        // "f16", "f32" or "q8_0"
  int max_seqs;           // sequences in the running batch at most
  int max_batch_tokens;   // tokens per forward step at most (prefill chunk size); the hard cap of every step
  double tpot_target_ms;  // step scheduler: steps with decode rows aim at this many ms (0 = off: max_batch_tokens)
  char spec[8];           // speculative decoding on decode and both workers: "auto" (CFG_DEF_SPEC) or "off"
  double prefix_cache_mb; // KV blocks the prefix cache may keep across requests (0 = no reuse)
  double prefix_host_mb;  // second tier in host DRAM for blocks evicted from the pool (0 = none)
  double prefix_disk_mb;  // third tier: one file on local disk (0 = none)
  char prefix_disk_path[256];
  char kvx_backend[16];   // "auto", "tcp", "shm", "rdma", "nccl", "nixl"
  char kvx_host[64];      // kvxfer listen address
  int kvx_port;           // 0 = ephemeral (advertised through the control hello)
  char kvx_staging[8];    // "auto", "on", "off": KV moves through a host mirror of a device pool (kv/stage.h)
  int kvx_plaintext;      // kvxfer.encrypt false: KV bytes over tcp unsealed (a trusted fabric); 0, so that a section
                          // made in code seals like the default
  int handoff_timeout_ms; // decode: a prompt's KV must arrive this long after the request (plus a per-token allowance)
  int table_timeout_ms;   // prefill: the decode worker's block table must arrive this long after the request
  int drain_timeout_s;    // on SIGTERM: how long running requests may take to finish (0 = stop at once)
  // model "null" only (models/null.h; a real model refuses them): a step's time, a prompt token's, KV bytes a token
  double null_step_ms, null_prefill_us_per_token;
  long null_kv_bytes_per_token;
} cfg_worker;

typedef struct cfg_router {
  char node[64];
  char host[64];               // HTTP bind address (default 127.0.0.1)
  int port;                    // default 8000
  char **api_keys;             // (owned) (n_api_keys) empty = no auth; cfg_load adds api_keys_file's
  int n_api_keys;
  char api_keys_file[1024];    // one key per line ('#' comments, blank lines skipped), resolved against the config
                               // file's folder ("" = none); read by cfg_load, not by cfg_parse
  size_t max_body_bytes;       // default 1 MiB
  int conn_timeout_s;          // idle HTTP connection timeout, default 60
  int queue_limit;             // admitted-but-waiting requests at most; over it: 429 (default 256)
  int max_tokens_limit;        // largest max_tokens accepted (default: the model's context)
  int max_n;                   // largest n (default 8)
  int max_stop;                // stop strings at most (default 8)
  int request_timeout_ms;      // deadline of a request end to end (default 600000)
  int link_dead_ms;            // a worker link that answers no stats (sent every 1 s) this long is closed (15000)
  int disagg_threshold;        // prompts shorter than this (minus cached prefix) prefill on the decode worker (128)
  cfg_disagg_policy disagg_policy; // "auto": ... and so do longer ones when the decode worker is idle or the
                               // prefill queue is long; "threshold": length alone decides (router/sched.h)
  int disagg_max_prefill_queue; // policy auto: a prefill worker with more queued than this is not used (2)
  double w_overlap, w_queue, w_free; // KV-aware routing weights
  int prefix_fetch;            // hint a prefill worker to fetch a longer cached prefix from a peer prefill worker (0)
  int prefix_fetch_min_blocks; // ... when the peer holds at least this many more blocks (4)
  int drain_timeout_s;         // on SIGTERM: how long running requests may take to finish (default 30; 0 = none)
  int max_connections;         // open HTTP connections at most, all clients together (4096); beyond: a quick 503
  int max_connections_per_client; // ... from one client address (256)
  int header_timeout_s;        // a connection must send a request's headers within this long (10)
  int body_timeout_s;          // ... and its body within this long of the head, plus 1 s per 4 KiB received (30)
  int max_choices;             // choices per request at most: prompts x n (64, at least max_n)
  int max_request_tokens;      // sum over a request's choices of prompt + max_tokens at most (0: max_choices x the
                               // model's context, which every request within the per-choice limits fits)
  // Mid-stream migration (docs/reliability.md): a choice whose decode worker dies, goes silent or drains continues on
  // another worker from the tokens already sent, at most migration_limit times per choice (2; 0 = never, as before).
  int migration_limit;
  int migration_wait_ms;       // with no other worker up: how long a choice waits for one (a restart) (10000)
  int migrate_silent_ms;       // a worker silent this long (no pong) has its choices moved; its link stays until
                               // link_dead_ms (2000; 0 = only when the link closes)
  int metrics_public;          // GET /metrics answers without an API key (false: it needs one like every route)
  int strict_model_name;       // a request's "model" must be the served id (false: with one model, any name is it)
  int stream_queue_bytes;      // a stream's bytes not yet taken by its client's connection: past this the stream
                               // ends (a client that stopped reading) and dserve:streams_ended_slow_total counts it
  int stream_flush_ms;         // a stream's connection takes its queued tokens at most this often (0: at each token):
                               // fewer thread wakes per token, for gaps of up to this (docs/scale.md)
} cfg_router;

// Server-side sampling defaults (top-level "sampling"): what the router puts in a request that leaves a field out.
// A field the file leaves out (has_* = 0) falls back to the GGUF's general.sampling.* keys, then to llama-server's
// defaults (router/openai.h, rtr_sampling_resolve).
typedef struct cfg_sampling {
  int has_temperature, has_top_k, has_top_p, has_min_p, has_repetition_penalty; // given in the file
  double temperature;        // [0, 2]; 0 = greedy
  int top_k;                 // -1..1000000; 0 or -1 = off
  double top_p;              // (0, 1]
  double min_p;              // [0, 1]
  double repetition_penalty; // (0, 2]; 1 = off
} cfg_sampling;

// The top-level "logging" section (docs/observability.md): every role of the file logs the same way.
typedef struct cfg_logging {
  char format[8];       // "text" (default) or "json" (JSON lines); a --log-format flag or DSERVE_LOG_FORMAT wins
  int stats_interval_s; // the router's stats lines: every this many seconds while there is work (10; 0 = none)
} cfg_logging;

// The top-level "tracing" section: OpenTelemetry spans over OTLP/HTTP JSON; off when the section is absent.
typedef struct cfg_tracing {
  char endpoint[256];     // "http://HOST:PORT/PATH" of the collector ("" = tracing off)
  char service_name[64];  // resource service.name prefix ("dserve"); each role adds its name: dserve-router, dserve-p0
  double sample_ratio;    // [0, 1]: share of requests without a traceparent that are traced (1)
  int queue_spans;        // finished spans waiting for export at most; beyond: dropped and counted (4096)
  int flush_ms;           // the exporter posts at least this often while spans wait (500)
} cfg_tracing;

// The "discovery" section (configs/README.md): membership in etcd instead of (or besides) the "workers" list. Workers
// register themselves under /dserve/<cluster>/workers/<role>/<name>; routers watch that prefix (disco/disco.h).
enum { CFG_MAX_ETCD = 8, CFG_DEF_LEASE_TTL_S = 10 };
typedef struct cfg_discovery {
  char etcd[CFG_MAX_ETCD][256]; // (n_etcd) endpoints, "http://host:port" or "https://host:port"
  int n_etcd;
  char cluster[64];             // the cluster's name in the keys
  int lease_ttl_s;              // a worker that stops refreshing its lease leaves the membership this long after
  // etcd's own TLS and auth, passed through (paths resolved against the config file's folder; "" = not used)
  char ca_file[1024], cert_file[1024], key_file[1024];
  char user[64];                // etcd user; its password is the first line of password_file
  char password_file[1024];
} cfg_discovery;

// config/discovery.c: parses j (the "discovery" object) into d; path resolves relative file names, file prefixes
// errors. 0, or -1 with err naming the field.
struct cJSON;
int cfg_parse_discovery(const struct cJSON *j, const char *path, const char *file, cfg_discovery *d, char *err,
                        size_t errlen) UTL_WARN_UNUSED;

// The "kvstore" section (configs/README.md): a shared KV block tier on Redis that prefill and both workers read
// before recomputing a prompt's blocks and write behind (kvstore/kvstore.h; docs/design.md, "The shared KV tier").
enum { CFG_MAX_KVSTORE_ENDPOINTS = 16, CFG_DEF_KVSTORE_READ_TIMEOUT_MS = 50, CFG_DEF_KVSTORE_WRITE_QUEUE_MB = 64 };
typedef struct cfg_kvstore {
  char type[8];                                    // "redis" (the only one)
  char endpoints[CFG_MAX_KVSTORE_ENDPOINTS][256];  // (n_endpoints) "host:port"; with cluster, seed nodes
  int n_endpoints;
  int cluster;                                     // 1: Redis Cluster (slots, MOVED/ASK)
  char password_file[1024];                        // AUTH password: the file's first line ("" = no AUTH); resolved
                                                   // against the config file's folder, read by the worker at start
  char tls_ca[1024], tls_cert[1024], tls_key[1024]; // TLS when any is set ("" = plain TCP; no tls_ca: the system's
                                                    // trust store); cert and key, the worker's, go together
  int read_timeout_ms;                             // one read run's whole budget (50)
  int ttl_s;                                       // expiry of each written block (0 = none: the store's eviction)
  double write_queue_mb;                           // write-behind queue bound; past it blocks are dropped (64)
} cfg_kvstore;

typedef struct cfg_cluster {
  char path[1024];          // the file it came from
  char model_path[1024];    // resolved against the config file's folder when relative; "null": the null model
  int model_null;           // model is "null" exactly: no weights (models/null.h); a path never falls back to it
  char model_name[128];     // the id /v1/models reports (default: the model file's name without .gguf)
  int max_model_len;        // a request's prompt + max_tokens at most (0: the GGUF's context_length)
  char chat_template[32];   // a chat template family (models/chat.h) chats render with, winning over the Jinja
                            // templates ("" = the file's, else the GGUF's tokenizer.chat_template, else chatml)
  char chat_template_file[1024]; // a Jinja chat template file used instead of the GGUF's (resolved against the
                                 // config file's folder when relative; "" = none)
  // The cluster's shared secret, resolved by cfg_load (ctl/secret.h): config secret_file, then the
  // environment (DSERVE_SECRET_FILE, DSERVE_SECRET), then the inline "secret". Every control and kvxfer peer must
  // prove it; a role without one refuses to start (cfg_require_secret).
  char secret[128];         // "" = none found (only the launcher starts then: it makes a per-launch one)
  char secret_file[1024];   // the config's "secret_file", resolved against the config file's folder ("" = none)
  int secret_from;          // ctl_secret_from: where secret came from
  char remote_field[96];    // the first field naming a non-loopback host ("" = every host is loopback)
  int has_router;
  cfg_router router;
  cfg_sampling sampling; // the "sampling" section (all has_* 0 when absent)
  cfg_logging logging;   // the "logging" section (defaults when absent)
  cfg_tracing tracing;   // the "tracing" section (endpoint "" when absent)
  int has_discovery;        // a "discovery" section was given: workers may also come and go through etcd
  cfg_discovery discovery;
  int has_kvstore;          // a "kvstore" section was given (or dserve serve --kvstore)
  cfg_kvstore kvstore;
  cfg_worker *workers;  // (owned) (n_workers); may be empty with discovery
  int n_workers;
  char **nodes;             // (owned) (n_nodes) every node named in the file
  int n_nodes;
} cfg_cluster;

// Parses and validates path. An unknown key, a wrong type or a bad value is an error naming the field
// (e.g. "configs/x.json: workers[1].port: expected an integer 0..65535"). configs/README.md documents every key.
// cfg_load also resolves the shared secret (cfg_resolve_secret); cfg_parse only records the
// inline "secret" and "secret_file" (no file or environment is read).
int cfg_load(const char *path, cfg_cluster **out, char *err, size_t errlen) UTL_WARN_UNUSED;
// cfg_load of a config's text (path: what messages call it, and the folder relative paths resolve against).
int cfg_load_text(const char *json, size_t len, const char *path, cfg_cluster **out, char *err,
                  size_t errlen) UTL_WARN_UNUSED;
int cfg_parse(const char *json, size_t len, const char *path_for_errors, cfg_cluster **out, char *err,
                     size_t errlen) UTL_WARN_UNUSED;
void cfg_free(cfg_cluster *c);
const cfg_worker *cfg_find_worker(const cfg_cluster *c, const char *name);
// Overrides worker's device (the command line's --device): "cpu", "cuda" (= "cuda:0") or "cuda:N"; 0, or -1 with err.
int cfg_set_device(cfg_cluster *c, const char *worker, const char *device, char *err, size_t errlen) UTL_WARN_UNUSED;
int cfg_has_node(const cfg_cluster *c, const char *node); // 1 when node is one of c->nodes
// "both"/"prefill"/"decode"; -1 otherwise
int cfg_role_parse(const char *s, cfg_role *out) UTL_WARN_UNUSED;
// Fills the fields of a section made in code (a test's, a zeroed one) that are 0 where 0 is no valid value
// (timeouts, caps, sizes) with their CFG_DEF_*, as cfg_parse fills an absent key; the router and the worker runtime
// apply it once to their copy of their section, so no reader falls back on its own.
void cfg_router_defaults(cfg_router *o);
void cfg_worker_defaults(cfg_worker *o);

// config/secret.c
// Fills c->secret and c->secret_from: c->secret_file, then $DSERVE_SECRET_FILE, then $DSERVE_SECRET, then the
// inline "secret". Refuses (-1 with err naming the config file): "secret" and "secret_file" both given, an
// unreadable or weak secret, and, when c->remote_field names a non-loopback host, no secret, an inline one or one
// with fewer than CTL_SECRET_REMOTE_BITS bits. No secret on a loopback-only config is not an error here.
int cfg_resolve_secret(cfg_cluster *c, char *err, size_t errlen) UTL_WARN_UNUSED;

// Adds the keys of c->router.api_keys_file (if any) to c->router.api_keys: one per line, surrounding blanks trimmed,
// blank lines and lines starting with '#' skipped. An unreadable file or one with no key is an error naming it.
int cfg_read_api_keys(cfg_cluster *c, char *err, size_t errlen) UTL_WARN_UNUSED;

// What every role calls before it listens: 0 when c has a secret, else -1 with a message saying how to give one.
int cfg_require_secret(const cfg_cluster *c, char *err, size_t errlen) UTL_WARN_UNUSED;

// config/override.c
// One command-line override: key is a dotted path into the file ("router.port"; "workers.*.threads" sets it in
// every worker), value its text, taken as kind says.
typedef enum cfg_set_kind {
  CFG_SET_JSON = 0,   // a JSON value (a number, true, an array...)
  CFG_SET_STRING = 1, // a plain string
  CFG_SET_APPEND = 2, // a plain string appended to the array at key (made when absent)
} cfg_set_kind;
typedef struct cfg_set {
  const char *key;   // (borrowed)
  const char *value; // (borrowed)
  cfg_set_kind kind;
} cfg_set;

// The config at path (or, with path NULL, base_json) with sets applied in order, as JSON text (*out, malloc'd),
// with every relative path in it (model, secret_file, router.api_keys_file, workers[].prefix_disk_path, discovery's
// TLS and password files) made
// absolute against the file's folder (base_json: the working directory), so the text means the same from any
// folder; cfg_parse judges the values. -1 with err: unreadable file, bad JSON, a key through a non-object, a
// workers.* override when the config has no workers.
int cfg_effective_json(const char *path, const char *base_json, const cfg_set *sets, int n_sets, char **out,
                       char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
