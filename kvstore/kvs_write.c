// kvstore/kvs_write.c: the write-behind thread's batch: per node, pipelined EXISTS, then SET (EX ttl) of the blocks
// the store lacks, MOVED/ASK followed once; every block ends written, skipped or dropped, and counted.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvstore/kvs_int.h"
#include "util/clock.h"

typedef enum wr_state { W_DROP, W_CHECK, W_SET, W_DONE, W_SKIP } wr_state;

typedef struct wr_blk {
  kvs_item *it;
  int node;
  wr_state st;
  int redirect;      // 1 MOVED, 2 ASK: to node, after the batch
  int asking, sent;  // this round trip queued ASKING / the command for it
  uint8_t *val;      // (owned) the encoded value, while W_SET
  size_t len;
} wr_blk;

// The write connection of node i (opened when missing): it, or NULL (marked down).
static kvs_conn *write_conn(kvs *s, int i, int64_t deadline) {
  kvs_node *n = s->topo.nodes[i];
  if (!n->wc && kvs_probe_node(s, i, deadline) < 0) return NULL;
  return n->wc;
}

static void node_failed(kvs *s, int i, kvs_conn_rc rc) {
  kvs_node *n = s->topo.nodes[i];
  kvs_conn_close(n->wc);
  n->wc = NULL;
  pthread_mutex_lock(&s->mu);
  if (rc == KVS_C_TIMEOUT) s->st.timeouts++;
  else s->st.errors++;
  kvs_mark_down(s, i, rc == KVS_C_TIMEOUT ? "a write timed out" : "a write failed");
  pthread_mutex_unlock(&s->mu);
}

// Queues a command for every block of b[0..n) in state `st` (EXISTS for W_CHECK, SET for W_SET) on its node's
// connection, exchanges them all at once and hands each block its reply (NULL when its node failed: then W_DROP).
static void round_trip(kvs *s, wr_blk *b, int n, wr_state st, redisReply **reply, int64_t deadline) {
  kvs_conn *cs[KVS_MAX_NODES];
  int slot_of_node[KVS_MAX_NODES], node_of[KVS_MAX_NODES], want[KVS_MAX_NODES], m = 0;
  for (int i = 0; i < KVS_MAX_NODES; i++) slot_of_node[i] = -1;
  char ttl[24];
  snprintf(ttl, sizeof ttl, "%d", s->c.ttl_s);
  for (int i = 0; i < n; i++) {
    reply[i] = NULL;
    b[i].asking = b[i].sent = 0;
    if (b[i].st != st) continue;
    int nd = b[i].node;
    if (slot_of_node[nd] < 0) {
      kvs_conn *c = write_conn(s, nd, deadline);
      if (!c) {
        for (int j = i; j < n; j++)
          if (b[j].node == nd && b[j].st == st) b[j].st = W_DROP;
        continue;
      }
      slot_of_node[nd] = m;
      cs[m] = c;
      node_of[m] = nd;
      want[m++] = 0;
    }
    int k = slot_of_node[nd];
    int ask = b[i].redirect == 2;
    const char *asking[1] = {"ASKING"};
    size_t asklen[1] = {6};
    if (ask && kvs_conn_cmd(cs[k], 1, asking, asklen) == 0) {
      b[i].asking = 1;
      want[k]++;
    }
    const char *argv[5] = {st == W_SET ? "SET" : "EXISTS", b[i].it->name, (const char *)b[i].val, "EX", ttl};
    size_t lens[5] = {st == W_SET ? 3 : 6, KVS_KEY_LEN, b[i].len, 2, strlen(ttl)};
    int argc = st == W_CHECK ? 2 : s->c.ttl_s > 0 ? 5 : 3;
    if ((!ask || b[i].asking) && kvs_conn_cmd(cs[k], argc, argv, lens) == 0) {
      b[i].sent = 1;
      want[k]++;
    }
  }
  if (!m) return;
  redisReply **reps[KVS_MAX_NODES], **all = kvs_conn_replies_new(m, want, reps);
  kvs_conn_rc rc[KVS_MAX_NODES];
  if (!all) {
    for (int k = 0; k < m; k++) node_failed(s, node_of[k], KVS_C_IO);
    for (int i = 0; i < n; i++)
      if (b[i].st == st) b[i].st = W_DROP;
    return;
  }
  kvs_conn_exchange(cs, m, want, reps, rc, deadline);
  int used[KVS_MAX_NODES] = {0};
  for (int i = 0; i < n; i++) {
    if (b[i].st != st || slot_of_node[b[i].node] < 0) continue;
    int k = slot_of_node[b[i].node];
    used[k] += b[i].asking; // ASKING's +OK
    if (!b[i].sent || rc[k] != KVS_C_OK) { // out of memory for the command, or the node failed
      b[i].st = W_DROP;
      continue;
    }
    reply[i] = reps[k][used[k]];
    reps[k][used[k]++] = NULL;
  }
  kvs_conn_replies_free(all, m, want);
  for (int k = 0; k < m; k++)
    if (rc[k] != KVS_C_OK) node_failed(s, node_of[k], rc[k]);
}

// Reads each block's reply to the round trip in state st and moves it on; redirections go to their node once.
static void settle(kvs *s, wr_blk *b, int n, wr_state st, redisReply **reply, int *redirected) {
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < n; i++) {
    redisReply *r = reply[i];
    if (!r) continue;
    char host[256];
    int port = 0, kind = b[i].redirect ? 0 : kvs_redirect(r, host, sizeof host, &port);
    if (kind) {
      int nd = kvs_topo_node(&s->topo, host, port);
      if (nd >= 0 && !s->topo.nodes[nd]->down) {
        b[i].node = nd;
        b[i].redirect = kind;
        *redirected = 1;
        if (kind == 1) s->need_refresh = 1;
      } else {
        b[i].st = W_DROP;
      }
    } else if (st == W_CHECK) {
      // EXISTS answers 1 when the block is there: skip it; anything else: write it
      b[i].st = r->type == REDIS_REPLY_INTEGER && r->integer == 1 ? W_SKIP : W_SET;
    } else if (r->type == REDIS_REPLY_STATUS) {
      b[i].st = W_DONE;
    } else {
      s->st.errors++; // OOM (maxmemory with noeviction), CLUSTERDOWN, READONLY: this block is dropped
      b[i].st = W_DROP;
    }
    freeReplyObject(r);
  }
  pthread_mutex_unlock(&s->mu);
}

void kvs_write_batch(kvs *s, kvs_item **items, int n) {
  wr_blk b[KVS_BATCH];
  redisReply *reply[KVS_BATCH];
  int64_t deadline = utl_now_ms() + s->write_timeout_ms;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < n; i++) {
    // A key whose value a read refused is overwritten: EXISTS would say it is there.
    int bad = kvs_recent_is_bad(s, kvs_name_hash(items[i]->name));
    b[i] = (wr_blk){.it = items[i], .node = kvs_route(s, items[i]->name), .st = bad ? W_SET : W_CHECK};
    if (b[i].node < 0 || s->topo.nodes[b[i].node]->down) b[i].st = W_DROP;
  }
  pthread_mutex_unlock(&s->mu);
  int redirected = 0;
  round_trip(s, b, n, W_CHECK, reply, deadline);
  settle(s, b, n, W_CHECK, reply, &redirected);
  if (redirected) { // EXISTS asked the wrong node: ask the right one
    redirected = 0;
    round_trip(s, b, n, W_CHECK, reply, deadline);
    settle(s, b, n, W_CHECK, reply, &redirected);
  }
  for (int i = 0; i < n; i++) {
    if (b[i].st != W_SET) continue;
    b[i].len = kvs_value_len(s->c.block_tokens, s->c.block_bytes);
    b[i].val = malloc(b[i].len);
    if (b[i].val) kvs_value_encode(&s->c, &b[i].it->b, b[i].it->payload, b[i].val);
    else b[i].st = W_DROP;
  }
  redirected = 0;
  round_trip(s, b, n, W_SET, reply, deadline);
  settle(s, b, n, W_SET, reply, &redirected);
  if (redirected) {
    round_trip(s, b, n, W_SET, reply, deadline);
    settle(s, b, n, W_SET, reply, &redirected);
  }
  int64_t now = utl_now_ms();
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < n; i++) {
    if (b[i].st == W_DONE) {
      s->st.write_blocks++;
      s->st.write_bytes += s->c.block_bytes;
      kvs_recent_add(s, kvs_name_hash(b[i].it->name), now);
    } else if (b[i].st == W_SKIP) {
      s->st.write_skipped++;
      kvs_recent_add(s, kvs_name_hash(b[i].it->name), now);
    } else {
      s->st.queue_drops++; // its node is down, failed or refused it
    }
    s->q_bytes -= b[i].it->bytes;
    free(b[i].val);
    free(b[i].it);
  }
  s->done += (uint64_t)n;
  pthread_cond_broadcast(&s->done_cv);
  pthread_mutex_unlock(&s->mu);
}
