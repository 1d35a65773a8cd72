// worker/kvtier.c: the shared KV block tier (kvstore/) as a worker uses it: keys, space and payloads from the pool.
#include "worker/kvtier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disco/disco.h"
#include "kv/blockhash.h"
#include "kvstore/kvstore.h"
#include "util/crypto.h"
#include "util/log.h"

// One kvs_read_run (one pipelined round trip, read_timeout_ms its whole budget) asks for at most this many bytes of
// blocks: a 3,000-token prompt of SmolLM2 is 69 MB, which no store returns within 50 ms, so a long prompt reads run
// after run while every block comes back, each run with its own budget (a slow or dead store still costs one).
#define READ_BUF_BYTES ((size_t)4 << 20)
// HKDF labels: the store's MAC key is used for nothing else, and a change of the value format changes the space.
#define MAC_SALT "dserve kvstore"
#define MAC_INFO "dserve kvstore block mac v1"
#define SPACE_TAG "dserve-kvstore-space-1"

struct wrk_kvtier {
  kvs *store;             // (owned)
  char name[64];          // the worker's name (log lines)
  int bs;                 // tokens per block
  size_t bb;              // bytes per block (every layer)
  int cap_run;            // blocks one read run takes at most (READ_BUF_BYTES / bb, at least 1)
  uint8_t *buf;           // (owned) (cap_run * bb) the read run's payloads, then one block's for a write
  uint64_t *keys;         // (owned) (cap_keys) a prompt's chain keys
  kvs_block *blk;         // (owned) (cap_run)
  void **dst;             // (owned) (cap_run)
  int cap_keys;
  uint64_t hit_tokens;    // tokens served from the store (running total)
  uint64_t query_tokens;  // tokens that reached the store's lookup (what the worker's own tiers did not hold)
};

// The first line of path (the Redis password) into out; -1 with err when it cannot be read or is empty.
static int read_password(const char *path, char *out, size_t cap, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "kvstore.password_file %s: cannot open it", path);
    return -1;
  }
  if (!fgets(out, (int)cap, f)) out[0] = 0;
  fclose(f);
  out[strcspn(out, "\r\n")] = 0;
  if (!out[0]) {
    snprintf(err, errlen, "kvstore.password_file %s: the first line is empty", path);
    return -1;
  }
  return 0;
}

// What a value must have been written for: the model file's fingerprint, kv_type, the KV layout and the block size.
static int make_space(const wrk_runtime *rt, uint8_t out[32], char *err, size_t errlen) {
  const mdl_llama_cfg *mc = kv_pool_cfg(rt->kv);
  char hash[40], text[512];
  if (dsc_file_hash(rt->cfg->model_path, hash, sizeof hash, err, errlen)) return -1;
  mdl_str arch = {0};
  mdl_gguf_get_str(rt->gguf, "general.architecture", &arch);
  int n = snprintf(text, sizeof text, "%s|%.*s|%s|%s|parts=%d|width=%d|layers=%d|block=%d|bytes=%zu", SPACE_TAG,
                   (int)arch.n, arch.p ? arch.p : "", hash, rt->w->kv_type[0] ? rt->w->kv_type : "f16",
                   mdl_kv_parts(mc), mdl_kv_width(mc), mc->n_layer, kv_pool_kv(rt->kv)->block_size,
                   kv_pool_block_bytes(rt->kv));
  utl_sha256(text, (size_t)n, out);
  return 0;
}

int wrk_kvtier_open(const wrk_runtime *rt, wrk_kvtier **out, char *err, size_t errlen) {
  const cfg_kvstore *k = &rt->cfg->kvstore;
  *out = NULL;
  if (!rt->cfg->secret[0]) {
    snprintf(err, errlen, "kvstore: the cluster has no secret to key the blocks' MAC with");
    return -1;
  }
  wrk_kvtier *t = calloc(1, sizeof *t);
  if (!t) {
    snprintf(err, errlen, "kvstore: out of memory");
    return -1;
  }
  snprintf(t->name, sizeof t->name, "%s", rt->w->name);
  t->bs = kv_pool_kv(rt->kv)->block_size;
  t->bb = kv_pool_block_bytes(rt->kv);
  t->cap_run = t->bb >= READ_BUF_BYTES ? 1 : (int)(READ_BUF_BYTES / t->bb);
  const char *eps[CFG_MAX_KVSTORE_ENDPOINTS];
  for (int i = 0; i < k->n_endpoints; i++) eps[i] = k->endpoints[i];
  char password[256] = "";
  kvs_config c = {.endpoints = eps, .n_endpoints = k->n_endpoints, .cluster = k->cluster,
                  .tls_ca = k->tls_ca[0] ? k->tls_ca : NULL, .tls_cert = k->tls_cert[0] ? k->tls_cert : NULL,
                  .tls_key = k->tls_key[0] ? k->tls_key : NULL, .read_timeout_ms = k->read_timeout_ms,
                  .ttl_s = k->ttl_s, .write_queue_bytes = (size_t)(k->write_queue_mb * 1024.0 * 1024.0),
                  .block_bytes = t->bb, .block_tokens = t->bs};
  int rc = -1;
  if (k->password_file[0] && read_password(k->password_file, password, sizeof password, err, errlen)) goto done;
  c.password = password[0] ? password : NULL;
  if (utl_hkdf_sha256(rt->cfg->secret, strlen(rt->cfg->secret), MAC_SALT, strlen(MAC_SALT), MAC_INFO,
                      strlen(MAC_INFO), c.mac_key, sizeof c.mac_key)) {
    snprintf(err, errlen, "kvstore: cannot derive the MAC key (libcrypto failed)");
    goto done;
  }
  if (make_space(rt, c.space, err, errlen)) goto done;
  t->buf = malloc((size_t)t->cap_run * t->bb);
  t->blk = malloc((size_t)t->cap_run * sizeof *t->blk);
  t->dst = malloc((size_t)t->cap_run * sizeof *t->dst);
  if (!t->buf || !t->blk || !t->dst) {
    snprintf(err, errlen, "kvstore: out of memory for a read run of %d blocks", t->cap_run);
    goto done;
  }
  char why[256];
  if (kvs_open(&c, &t->store, why, sizeof why)) {
    snprintf(err, errlen, "kvstore: %s", why);
    goto done;
  }
  utl_log(t->name, "shared KV tier: redis %s%s (%zu bytes a block, read timeout %d ms)", k->endpoints[0],
          k->cluster ? " (cluster seed)" : "", t->bb, k->read_timeout_ms);
  rc = 0;
done:
  utl_wipe(password, sizeof password);
  utl_wipe(c.mac_key, sizeof c.mac_key);
  if (rc) wrk_kvtier_close(t);
  else *out = t;
  return rc;
}

void wrk_kvtier_close(wrk_kvtier *t) {
  if (!t) return;
  kvs_close(t->store);
  free(t->buf);
  free(t->blk);
  free(t->dst);
  free(t->keys);
  free(t);
}

// The chain keys of toks' first n full blocks into t->keys; -1 on out of memory.
static int chain(wrk_kvtier *t, const int32_t *toks, int n) {
  if (n > t->cap_keys) {
    uint64_t *k = realloc(t->keys, (size_t)n * sizeof *k);
    if (!k) return -1;
    t->keys = k;
    t->cap_keys = n;
  }
  return kv_blockhash_chain(NULL, toks, n * t->bs, t->bs, t->keys, n) == n ? 0 : -1;
}

static kvs_block block_at(const wrk_kvtier *t, const int32_t *toks, int i) {
  return (kvs_block){.key = t->keys[i], .parent = i ? t->keys[i - 1] : KV_BLOCKHASH_ROOT, .toks = toks + i * t->bs};
}

// One run of at most max blocks from block first: read, copied into pool blocks (ids_out). Returns how many.
static int read_run(wrk_kvtier *t, kv_pool *pool, kv_prefix *prefix, const int32_t *toks, int first, int max,
                    int32_t *ids_out) {
  int want = max < t->cap_run ? max : t->cap_run;
  for (int i = 0; i < want; i++) {
    t->blk[i] = block_at(t, toks, first + i);
    t->dst[i] = t->buf + (size_t)i * t->bb;
  }
  int got = kvs_read_run(t->store, t->blk, want, t->dst);
  if (got <= 0) return 0;
  // Room in the pool: unused cached blocks go first (as for any admission); what still does not fit is recomputed.
  if (prefix && kv_pool_free_blocks(pool) < got) kv_prefix_evict_for(prefix, got);
  if (got > kv_pool_free_blocks(pool)) got = kv_pool_free_blocks(pool);
  while (got > 0 && kv_pool_alloc(pool, ids_out, got) != 0) got--; // free pages may make fewer blocks of every group
  for (int i = 0; i < got; i++)
    if (kv_pool_write_block(pool, ids_out[i], t->dst[i])) { // cannot happen for a block just allocated whole
      utl_warn(t->name, "kvstore: cannot write a block read from the store into the pool: recomputing it");
      for (int j = i; j < got; j++) kv_pool_unref(pool, ids_out[j]);
      got = i;
    }
  return got;
}

int wrk_kvtier_read(wrk_kvtier *t, kv_pool *pool, kv_prefix *prefix, const int32_t *toks, int n_toks, int n_have,
                    int32_t *ids_out, int max) {
  if (!t) return 0;
  int full = (n_toks - 1) / t->bs; // the last token is always computed: its logits are sampled
  if (full <= n_have || max < 1) return 0;
  t->query_tokens += (uint64_t)(n_toks - n_have * t->bs);
  if (chain(t, toks, full)) return 0;
  int got = 0;
  while (n_have + got < full && got < max) {
    int left = full - n_have - got, n = read_run(t, pool, prefix, toks, n_have + got, left < max - got ? left : max - got,
                                                 ids_out + got);
    got += n;
    if (n < t->cap_run) break; // a miss (or no room) ended the run
  }
  t->hit_tokens += (uint64_t)got * (uint64_t)t->bs;
  return got;
}

void wrk_kvtier_write(wrk_kvtier *t, kv_pool *pool, const int32_t *toks, const int32_t *ids, int from, int to) {
  if (!t || to <= from || chain(t, toks, to)) return;
  for (int i = from; i < to; i++) {
    if (!kv_pool_whole(pool, ids[i]) || kv_pool_read_block(pool, ids[i], t->buf)) continue;
    kvs_block b = block_at(t, toks, i);
    kvs_write(t->store, &b, t->buf); // dropped or skipped: counted by the store
  }
}

void wrk_kvtier_stats(wrk_kvtier *t, prt_stats_ok *out) {
  if (!t) return;
  kvs_stats st;
  kvs_stats_get(t->store, &st);
  out->tiers[PRT_TIER_STORE] = (prt_tier_stats){.present = 1, .hits = (double)t->hit_tokens,
                                                .queries = (double)t->query_tokens, .refused = (double)st.queue_drops};
  out->kvstore_read_blocks = (double)st.read_blocks;
  out->kvstore_read_bytes = (double)st.read_bytes;
  out->kvstore_write_blocks = (double)st.write_blocks;
  out->kvstore_write_bytes = (double)st.write_bytes;
  out->kvstore_errors = (double)(st.errors + st.auth_failures);
  out->kvstore_timeouts = (double)st.timeouts;
  out->kvstore_mac_failures = (double)st.mac_failures;
  out->kvstore_mismatches = (double)st.mismatches;
  out->kvstore_queue_drops = (double)st.queue_drops;
  out->kvstore_up = st.up;
}
