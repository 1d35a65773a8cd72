// kvstore/kvs_read.c: kvs_read_run: one pipelined GET batch per node, every node in flight at once, MOVED/ASK
// followed once, values verified in chain order until the first miss, all within read_timeout_ms.
#include <stdlib.h>
#include <string.h>

#include "kvstore/kvs_int.h"
#include "util/clock.h"

typedef enum blk_state { B_PENDING, B_HIT, B_MISS, B_FAIL, B_MOVED, B_ASK } blk_state;

typedef struct rd_blk {
  char name[KVS_KEY_LEN + 1];
  int node;          // where it is asked (after a redirect: the node named by it)
  blk_state st;
  redisReply *r;     // (owned) its GET reply, while B_PENDING
  int asking, sent;  // this pass queued ASKING / the GET for it (so replies are matched even if a queueing failed)
} rd_blk;

static int selected(const rd_blk *b, int redirected) {
  return redirected ? b->st == B_MOVED || b->st == B_ASK : b->st == B_PENDING;
}

// The read connection of node i, opened when missing: it, or NULL (the node is marked down). Under read_mu.
static kvs_conn *read_conn(kvs *s, int i, int64_t deadline) {
  kvs_node *n = s->topo.nodes[i];
  pthread_mutex_lock(&s->mu);
  unsigned epoch = n->epoch;
  kvs_conn *spare = NULL;
  if (!(n->rc && n->rc_epoch == epoch) && n->spare && n->spare_epoch == epoch) {
    spare = n->spare; // the probe's: connected, authenticated
    n->spare = NULL;
  }
  pthread_mutex_unlock(&s->mu);
  if (n->rc && n->rc_epoch == epoch) return n->rc;
  kvs_conn_close(n->rc); // the node failed since (for the writer, say): the store may have restarted
  n->rc = spare;
  n->rc_epoch = epoch;
  if (spare) return spare;
  char err[256] = "";
  kvs_conn_rc rc =
      kvs_conn_open(n->host, n->port, s->tls, s->password, s->max_reply, deadline, &n->rc, err, sizeof err);
  n->rc_epoch = epoch;
  if (rc == KVS_C_OK) return n->rc;
  pthread_mutex_lock(&s->mu);
  if (rc == KVS_C_TIMEOUT || utl_now_ms() >= deadline) s->st.timeouts++;
  kvs_conn_failed(s, i, rc, err);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

// Sends the GETs of blocks b[0..cut) whose state is `which` (B_PENDING: the first pass; B_MOVED/B_ASK: redirected,
// ASKING first for an ASK) to their nodes and files each reply in its block. A node that fails marks its blocks
// B_FAIL. Under read_mu.
static void pass(kvs *s, rd_blk *b, int cut, int64_t deadline, int redirected) {
  kvs_conn *cs[KVS_MAX_NODES];
  int node_of[KVS_MAX_NODES], want[KVS_MAX_NODES], m = 0;
  int slot_of_node[KVS_MAX_NODES];
  for (int i = 0; i < KVS_MAX_NODES; i++) slot_of_node[i] = -1;
  for (int i = 0; i < cut; i++) b[i].asking = b[i].sent = 0;
  for (int i = 0; i < cut; i++) {
    if (!selected(&b[i], redirected)) continue;
    int nd = b[i].node;
    if (slot_of_node[nd] < 0) {
      kvs_conn *c = read_conn(s, nd, deadline);
      if (!c) {
        for (int j = i; j < cut; j++)
          if (b[j].node == nd && selected(&b[j], redirected)) b[j].st = B_FAIL;
        continue;
      }
      slot_of_node[nd] = m;
      cs[m] = c;
      node_of[m] = nd;
      want[m++] = 0;
    }
    int k = slot_of_node[nd];
    const char *argv[2] = {"GET", b[i].name};
    size_t lens[2] = {3, KVS_KEY_LEN};
    const char *ask[1] = {"ASKING"};
    size_t asklen[1] = {6};
    if (b[i].st == B_ASK && kvs_conn_cmd(cs[k], 1, ask, asklen) == 0) {
      b[i].asking = 1;
      want[k]++;
    }
    if ((b[i].st != B_ASK || b[i].asking) && kvs_conn_cmd(cs[k], 2, argv, lens) == 0) {
      b[i].sent = 1;
      want[k]++;
    }
  }
  if (!m) return;
  redisReply **reps[KVS_MAX_NODES];
  kvs_conn_rc rc[KVS_MAX_NODES];
  redisReply **all = kvs_conn_replies_new(m, want, reps);
  if (!all) { // nothing was sent: drop the queued commands with the connections
    for (int k = 0; k < m; k++) {
      kvs_conn_close(s->topo.nodes[node_of[k]]->rc);
      s->topo.nodes[node_of[k]]->rc = NULL;
    }
    for (int i = 0; i < cut; i++)
      if (b[i].st == B_PENDING || b[i].st == B_MOVED || b[i].st == B_ASK) b[i].st = B_MISS;
    return;
  }
  kvs_conn_exchange(cs, m, want, reps, rc, deadline);
  int used[KVS_MAX_NODES] = {0};
  for (int i = 0; i < cut; i++) {
    if (!selected(&b[i], redirected) || slot_of_node[b[i].node] < 0) continue;
    int k = slot_of_node[b[i].node];
    used[k] += b[i].asking; // ASKING's +OK
    if (!b[i].sent) { // out of memory for the command: this block is not read
      b[i].st = B_MISS;
      continue;
    }
    if (rc[k] != KVS_C_OK) {
      b[i].st = B_FAIL;
      continue;
    }
    b[i].r = reps[k][used[k]];
    reps[k][used[k]++] = NULL;
    b[i].st = B_PENDING;
  }
  kvs_conn_replies_free(all, m, want);
  for (int k = 0; k < m; k++) {
    if (rc[k] == KVS_C_OK) continue;
    kvs_node *n = s->topo.nodes[node_of[k]];
    kvs_conn_close(n->rc); // replies may still be on their way: the connection is out of step
    n->rc = NULL;
    pthread_mutex_lock(&s->mu);
    if (rc[k] == KVS_C_TIMEOUT) {
      s->st.timeouts++;
      kvs_mark_down(s, node_of[k], "a read timed out");
    } else {
      s->st.errors++;
      kvs_mark_down(s, node_of[k], "a read failed");
    }
    pthread_mutex_unlock(&s->mu);
  }
}

// Classifies the replies of b[0..cut) in chain order up to the first that is not a hit: verified values become B_HIT,
// redirections B_MOVED/B_ASK (with their node). Returns the first index that is neither a hit nor redirected.
static int walk(kvs *s, const kvs_block *blocks, rd_blk *b, int cut, int final) {
  for (int i = 0; i < cut; i++) {
    if (b[i].st == B_HIT) continue;
    if (b[i].st != B_PENDING || !b[i].r) return i;
    redisReply *r = b[i].r;
    char host[256];
    int port = 0, kind = final ? 0 : kvs_redirect(r, host, sizeof host, &port);
    pthread_mutex_lock(&s->mu);
    int stop = 0;
    if (kind) {
      int nd = kvs_topo_node(&s->topo, host, port);
      if (nd < 0 || s->topo.nodes[nd]->down) {
        stop = 1;
      } else {
        b[i].node = nd;
        b[i].st = kind == 1 ? B_MOVED : B_ASK;
        if (kind == 1) { // the write-behind thread reloads the map
          s->need_refresh = 1;
          pthread_cond_signal(&s->cv);
        }
      }
    } else if (r->type == REDIS_REPLY_STRING) {
      pthread_mutex_unlock(&s->mu); // the MAC is the costly part: not under mu
      kvs_verdict v = kvs_value_check(&s->c, &blocks[i], (const uint8_t *)r->str, r->len);
      pthread_mutex_lock(&s->mu);
      if (v == KVS_V_OK) {
        b[i].st = B_HIT;
      } else {
        if (v == KVS_V_MAC) s->st.mac_failures++;
        else s->st.mismatches++;
        kvs_recent_bad(s, kvs_name_hash(b[i].name)); // so the recomputed block's write replaces it
        stop = 1;
      }
    } else {
      if (r->type != REDIS_REPLY_NIL) s->st.errors++; // CLUSTERDOWN, LOADING, a redirect loop: a miss all the same
      stop = 1;
    }
    if (kind && !stop) {
      freeReplyObject(r);
      b[i].r = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (stop) return i;
  }
  return cut;
}

int kvs_read_run(kvs *s, const kvs_block *blocks, int n, void *const *dst) {
  if (!s || n <= 0) return 0;
  int64_t deadline = utl_now_ms() + s->c.read_timeout_ms;
  rd_blk *b = calloc((size_t)n, sizeof *b);
  if (!b) return 0;
  pthread_mutex_lock(&s->read_mu);
  pthread_mutex_lock(&s->mu);
  int cut = n;
  for (int i = 0; i < n; i++) {
    kvs_key_name(s->c.space, blocks[i].key, b[i].name);
    b[i].node = kvs_route(s, b[i].name);
    if (b[i].node < 0 || s->topo.nodes[b[i].node]->down) { // the run ends before a block we cannot ask for
      cut = i;
      break;
    }
  }
  if (cut == 0) s->st.read_skipped++;
  pthread_mutex_unlock(&s->mu);
  int run = 0;
  if (cut > 0) {
    pass(s, b, cut, deadline, 0);
    int stop = walk(s, blocks, b, cut, 0);
    int redirected = 0;
    for (int i = 0; i < stop; i++) redirected |= b[i].st == B_MOVED || b[i].st == B_ASK;
    if (redirected) {
      pass(s, b, stop, deadline, 1);
      stop = walk(s, blocks, b, stop, 1);
    }
    run = stop;
    size_t off = kvs_value_payload_off(s->c.block_tokens);
    for (int i = 0; i < run; i++) memcpy(dst[i], b[i].r->str + off, s->c.block_bytes);
  }
  pthread_mutex_unlock(&s->read_mu);
  for (int i = 0; i < n; i++)
    if (b[i].r) freeReplyObject(b[i].r);
  pthread_mutex_lock(&s->mu);
  s->st.read_blocks += (uint64_t)run;
  s->st.read_bytes += (uint64_t)run * s->c.block_bytes;
  if (run < n) s->st.read_misses++;
  int fail = 0;
  for (int i = 0; i < n; i++) fail |= b[i].st == B_FAIL;
  if (cut > 0 && !fail) s->st.up = 1;
  pthread_mutex_unlock(&s->mu);
  free(b);
  return run;
}
