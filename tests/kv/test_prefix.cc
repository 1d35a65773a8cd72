// tests/server/test_prefix.cc: block hash chain, pool refcounts, and the prefix block store (match/insert, sharing, LRU, collisions, events, tiers, per-tier counters, key snapshots).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <utility>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "kv/blockhash.h"
#include "ctl/hub.h"
#include "kv/events.h"
#include "kv/pool.h"
#include "kv/prefix.h"
}

namespace {

void *t_alloc(krn_ctx *, size_t n) { return std::calloc(1, n); }
void t_free(krn_ctx *, void *p) { std::free(p); }

constexpr int BS = 4;

struct Prefix : ::testing::Test {
  krn_backend be{};
  krn_ctx kc{};
  mdl_llama_cfg cfg{};
  kv_pool *pool = nullptr;
  kv_prefix *st = nullptr;
  char err[256] = {0};

  void SetUp() override {
    be.name = "test";
    be.alloc = t_alloc;
    be.free = t_free;
    kc.be = &be;
    cfg.n_layer = 2;
    cfg.n_kv_head = 1;
    cfg.head_dim = 4;
    cfg.n_head = 2;
    cfg.n_embd = 8;
  }
  void TearDown() override {
    kv_prefix_free(st);
    kv_pool_free(pool);
  }
  void make_pool(int blocks) {
    kv_pool_opts o{};
    o.type = KRN_F32;
    o.block_size = BS;
    o.budget_bytes = mdl_kv_block_bytes(&cfg, KRN_F32, BS) * (size_t)blocks;
    ASSERT_EQ(kv_pool_new(&cfg, &kc, &o, &pool, err, sizeof err), 0) << err;
  }
  void make_store(int budget, kv_blockhash_fn fn = nullptr, int max_events = 0, int host = 0, int disk = 0,
                  const char *path = nullptr) {
    kv_prefix_opts o{};
    o.budget_blocks = budget;
    o.hash = fn;
    o.max_events = max_events;
    o.host_blocks = host;
    o.disk_blocks = disk;
    o.disk_path = path;
    ASSERT_EQ(kv_prefix_new(pool, &o, &st, err, sizeof err), 0) << err;
  }
  // A sequence's prompt computed: blocks reserved for every token, then its full blocks inserted.
  int compute(const std::vector<int32_t> &toks, kv_blocks *b) {
    EXPECT_EQ(kv_blocks_reserve(pool, b, (int)toks.size()), 0);
    return kv_prefix_insert(st, toks.data(), (int)toks.size(), b->ids, b->n);
  }
  std::vector<int32_t> match(const std::vector<int32_t> &toks) {
    std::vector<int32_t> ids(toks.size() / BS + 1);
    int n = kv_prefix_match(st, toks.data(), (int)toks.size(), ids.data(), (int)ids.size());
    ids.resize(n);
    return ids;
  }
  void unref_all(const std::vector<int32_t> &ids) {
    for (int32_t id : ids) kv_pool_unref(pool, id);
  }
  std::vector<kv_event> drain() {
    std::vector<kv_event> ev(kv_prefix_pending_events(st) + 1);
    ev.resize(kv_prefix_drain_events(st, ev.data(), (int)ev.size()));
    return ev;
  }
  kv_prefix_stats stats() {
    kv_prefix_stats s;
    kv_prefix_get_stats(st, &s);
    return s;
  }
};

std::vector<int32_t> seq(int n, int32_t start) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; i++) v[i] = start + i;
  return v;
}

std::vector<uint64_t> keys_of(const std::vector<int32_t> &t, kv_blockhash_fn fn = nullptr) {
  std::vector<uint64_t> k(t.size() / BS + 1);
  k.resize(kv_blockhash_chain(fn, t.data(), (int)t.size(), BS, k.data(), (int)k.size()));
  return k;
}

TEST(BlockHash, ChainCoversEveryEarlierToken) {
  std::vector<int32_t> a = seq(16, 100);
  std::vector<uint64_t> ka = keys_of(a);
  ASSERT_EQ(ka.size(), 4u);
  EXPECT_EQ(ka, keys_of(a)); // deterministic
  for (int pos = 0; pos < 16; pos++) {
    std::vector<int32_t> b = a;
    b[pos] ^= 1;
    std::vector<uint64_t> kb = keys_of(b);
    for (int blk = 0; blk < 4; blk++) {
      if (blk < pos / BS) EXPECT_EQ(kb[blk], ka[blk]) << pos << " " << blk;
      else EXPECT_NE(kb[blk], ka[blk]) << pos << " " << blk; // this block and every later one
    }
  }
  // The same tokens under a different parent give a different key.
  std::vector<int32_t> rep = {7, 7, 7, 7, 7, 7, 7, 7};
  std::vector<uint64_t> kr = keys_of(rep);
  EXPECT_NE(kr[0], kr[1]);
  EXPECT_EQ(kr[0], kv_blockhash(KV_BLOCKHASH_ROOT, rep.data(), BS));
  EXPECT_EQ(kr[1], kv_blockhash(kr[0], rep.data() + BS, BS));
  // Partial blocks have no key; bad arguments give none.
  EXPECT_EQ(keys_of(seq(7, 0)).size(), 1u);
  uint64_t k[4];
  EXPECT_EQ(kv_blockhash_chain(nullptr, a.data(), 3, BS, k, 4), 0);
  EXPECT_EQ(kv_blockhash_chain(nullptr, a.data(), 16, 0, k, 4), 0);
  EXPECT_EQ(kv_blockhash_chain(nullptr, a.data(), 16, BS, k, 2), 2);
}

TEST_F(Prefix, PoolRefcountsAllocAppendAndBlockCopy) {
  make_pool(6);
  kv_blocks b{};
  ASSERT_EQ(kv_blocks_reserve(pool, &b, 2 * BS), 0);
  int32_t x = b.ids[0];
  EXPECT_EQ(kv_pool_refcount(pool, x), 1);
  kv_pool_ref(pool, x);
  EXPECT_EQ(kv_pool_refcount(pool, x), 2);
  kv_blocks_release(pool, &b);
  EXPECT_EQ(kv_pool_free_blocks(pool), 5); // x is still held
  EXPECT_EQ(kv_pool_refcount(pool, x), 1);
  kv_pool_unref(pool, x);
  EXPECT_EQ(kv_pool_refcount(pool, x), 0);
  EXPECT_EQ(kv_pool_free_blocks(pool), 6);
  kv_pool_unref(pool, x); // free already: ignored
  kv_pool_ref(pool, x);   // free: ignored
  kv_pool_unref(pool, 99);
  EXPECT_EQ(kv_pool_refcount(pool, x), 0);
  EXPECT_EQ(kv_pool_refcount(pool, -1), 0);
  EXPECT_EQ(kv_pool_free_blocks(pool), 6);
  // alloc is all or nothing
  int32_t ids[7];
  EXPECT_LT(kv_pool_alloc(pool, ids, 7), 0);
  EXPECT_EQ(kv_pool_free_blocks(pool), 6);
  ASSERT_EQ(kv_pool_alloc(pool, ids, 2), 0);
  EXPECT_EQ(kv_pool_refcount(pool, ids[0]), 1);
  // append adopts the references
  kv_blocks c{};
  ASSERT_EQ(kv_blocks_append(pool, &c, ids, 2), 0);
  ASSERT_EQ(kv_blocks_reserve(pool, &c, 3 * BS), 0); // grows past the adopted ones
  EXPECT_EQ(c.n, 3);
  EXPECT_EQ(c.ids[0], ids[0]);
  // block bytes round trip, and the copy lands in the block's chunks only
  size_t bb = kv_pool_block_bytes(pool);
  EXPECT_EQ(bb, mdl_kv_block_bytes(&cfg, KRN_F32, BS));
  std::vector<unsigned char> in(bb), out(bb);
  for (size_t i = 0; i < bb; i++) in[i] = (unsigned char)(i * 7 + 3);
  ASSERT_EQ(kv_pool_write_block(pool, c.ids[1], in.data()), 0);
  ASSERT_EQ(kv_pool_read_block(pool, c.ids[1], out.data()), 0);
  EXPECT_EQ(in, out);
  const mdl_kv *kv = kv_pool_kv(pool);
  size_t chunk = mdl_kv_chunk_bytes(&cfg, kv);
  EXPECT_EQ(std::memcmp(mdl_kv_chunk(&cfg, kv, 1, 1, c.ids[1]), in.data() + 3 * chunk, chunk), 0);
  ASSERT_EQ(kv_pool_read_block(pool, c.ids[0], out.data()), 0);
  EXPECT_NE(in, out);
  EXPECT_LT(kv_pool_read_block(pool, 6, out.data()), 0);
  kv_blocks_release(pool, &c);
  EXPECT_EQ(kv_pool_free_blocks(pool), 6);
}

TEST_F(Prefix, BadOptionsAreRefused) {
  make_pool(4);
  kv_prefix_opts o{};
  EXPECT_LT(kv_prefix_new(pool, &o, &st, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "budget"), nullptr) << err;
  o.budget_blocks = 2;
  o.disk_blocks = 3;
  EXPECT_LT(kv_prefix_new(pool, &o, &st, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "disk_path"), nullptr) << err;
  o.disk_path = "/nonexistent-dir-dserve/x.kv";
  EXPECT_LT(kv_prefix_new(pool, &o, &st, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "/nonexistent-dir-dserve/x.kv"), nullptr) << err;
  EXPECT_EQ(st, nullptr);
  kv_prefix_free(nullptr);
}

TEST_F(Prefix, MatchInsertRoundTripLeavesTheLastToken) {
  make_pool(32);
  make_store(16);
  std::vector<int32_t> p = seq(10 * BS + 2, 1);
  kv_blocks b{};
  EXPECT_EQ(compute(p, &b), 10); // the partial 11th block is not cached
  EXPECT_EQ(stats().blocks[0], 10);
  std::vector<int32_t> m = match(p);
  ASSERT_EQ(m.size(), 10u);
  for (int i = 0; i < 10; i++) {
    EXPECT_EQ(m[i], b.ids[i]);
    EXPECT_EQ(kv_pool_refcount(pool, m[i]), 3); // sequence, store, matcher
  }
  unref_all(m);
  // A prompt that is exactly the cached blocks keeps its last block to compute.
  std::vector<int32_t> exact(p.begin(), p.begin() + 3 * BS);
  std::vector<int32_t> m2 = match(exact);
  EXPECT_EQ(m2.size(), 2u);
  unref_all(m2);
  std::vector<int32_t> one_more(p.begin(), p.begin() + 3 * BS + 1);
  std::vector<int32_t> m3 = match(one_more);
  EXPECT_EQ(m3.size(), 3u);
  unref_all(m3);
  // Inserting the same prompt again adds nothing.
  EXPECT_EQ(kv_prefix_insert(st, p.data(), (int)p.size(), b.ids, b.n), 0);
  kv_prefix_stats s = stats();
  EXPECT_EQ(s.queries, 3u);
  EXPECT_EQ(s.hit_queries, 3u);
  EXPECT_EQ(s.hit_blocks[0], 10u + 2 + 3);
  EXPECT_EQ(s.hit_tokens[0], (10u + 2 + 3) * BS);
  EXPECT_EQ(s.query_blocks, 10u + 2 + 3);
  EXPECT_EQ(s.inserted, 10u);
  kv_blocks_release(pool, &b);
  EXPECT_EQ(kv_pool_free_blocks(pool), 32 - 10); // the store's blocks
  kv_prefix_clear(st);
  EXPECT_EQ(kv_pool_free_blocks(pool), 32);
  EXPECT_TRUE(match(p).empty());
}

TEST_F(Prefix, PartialPrefixStopsAtTheFirstDifferentBlock) {
  make_pool(16);
  make_store(16);
  std::vector<int32_t> a = seq(4 * BS, 1);
  kv_blocks b{};
  compute(a, &b);
  std::vector<int32_t> q = a;
  q[2 * BS + 1] = 999; // block 2 differs
  std::vector<int32_t> m = match(q);
  EXPECT_EQ(m.size(), 2u);
  unref_all(m);
  q = a;
  q[0] = 999; // the first block differs: nothing, although later blocks hold the same tokens
  EXPECT_TRUE(match(q).empty());
  EXPECT_TRUE(match(std::vector<int32_t>(a.begin() + BS, a.end())).empty()); // shifted: not a prefix
  EXPECT_EQ(stats().hit_queries, 1u);
  EXPECT_EQ(stats().queries, 3u);
  kv_blocks_release(pool, &b);
}

TEST_F(Prefix, SharedPrefixBetweenTwoSequences) {
  make_pool(16);
  make_store(16);
  std::vector<int32_t> sys = seq(3 * BS, 500);
  std::vector<int32_t> p1 = sys, p2 = sys;
  for (int i = 0; i < 2 * BS + 1; i++) {
    p1.push_back(10 + i);
    p2.push_back(50 + i);
  }
  kv_blocks s1{}, s2{};
  EXPECT_EQ(compute(p1, &s1), 5);
  EXPECT_EQ(kv_pool_free_blocks(pool), 16 - 6);
  // The second request reuses the system prompt's blocks and computes only the rest.
  std::vector<int32_t> m = match(p2);
  ASSERT_EQ(m.size(), 3u);
  ASSERT_EQ(kv_blocks_append(pool, &s2, m.data(), (int)m.size()), 0);
  ASSERT_EQ(kv_blocks_reserve(pool, &s2, (int)p2.size()), 0);
  EXPECT_EQ(s2.n, 6);
  EXPECT_EQ(kv_pool_free_blocks(pool), 16 - 6 - 3);
  EXPECT_EQ(kv_prefix_insert(st, p2.data(), (int)p2.size(), s2.ids, s2.n), 2);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(s2.ids[i], s1.ids[i]);
    EXPECT_EQ(kv_pool_refcount(pool, s1.ids[i]), 3);
  }
  EXPECT_EQ(kv_pool_refcount(pool, s2.ids[3]), 2);
  EXPECT_EQ(kv_pool_refcount(pool, s2.ids[5]), 1); // partial block: the sequence's alone
  std::vector<kv_event> ev = drain();
  ASSERT_EQ(ev.size(), 7u);
  std::vector<uint64_t> k1 = keys_of(p1), k2 = keys_of(p2);
  for (int i = 0; i < 5; i++) EXPECT_EQ(ev[i].key, k1[i]);
  EXPECT_EQ(ev[5].key, k2[3]);
  EXPECT_EQ(ev[6].key, k2[4]);
  for (auto &e : ev) EXPECT_EQ(e.kind, KV_EVENT_ADDED);
  kv_blocks_release(pool, &s1);
  kv_blocks_release(pool, &s2);
  EXPECT_EQ(kv_pool_free_blocks(pool), 16 - 7);
  kv_prefix_clear(st);
  EXPECT_EQ(kv_pool_free_blocks(pool), 16);
  ev = drain();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KV_EVENT_CLEARED);
}

TEST_F(Prefix, LruEvictionUnderBudgetIsLeafFirst) {
  make_pool(16);
  make_store(4);
  std::vector<int32_t> a = seq(2 * BS, 100), b = seq(2 * BS, 200), c = seq(2 * BS, 300);
  kv_blocks sa{}, sb{}, sc{};
  compute(a, &sa);
  compute(b, &sb);
  kv_blocks_release(pool, &sa);
  kv_blocks_release(pool, &sb);
  drain();
  a.push_back(1); // so both blocks of a may match
  unref_all(match(a)); // a is now more recent than b
  compute(c, &sc);
  kv_blocks_release(pool, &sc);
  std::vector<kv_event> ev = drain();
  std::vector<uint64_t> kb = keys_of(b), kc = keys_of(c);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].kind, KV_EVENT_ADDED);
  EXPECT_EQ(ev[0].key, kc[0]);
  EXPECT_EQ(ev[1].key, kc[1]);
  EXPECT_EQ(ev[2].kind, KV_EVENT_REMOVED); // b's leaf goes before its parent
  EXPECT_EQ(ev[2].key, kb[1]);
  EXPECT_EQ(ev[3].kind, KV_EVENT_REMOVED);
  EXPECT_EQ(ev[3].key, kb[0]);
  b.push_back(1);
  c.push_back(1);
  EXPECT_TRUE(match(b).empty());
  std::vector<int32_t> ma = match(a), mc = match(c);
  EXPECT_EQ(ma.size(), 2u);
  EXPECT_EQ(mc.size(), 2u);
  unref_all(ma);
  unref_all(mc);
  EXPECT_EQ(stats().blocks[0], 4);
  EXPECT_EQ(stats().removed, 2u);
  EXPECT_EQ(kv_pool_free_blocks(pool), 12);
}

TEST_F(Prefix, SharedParentOutlivesItsChildren) {
  make_pool(16);
  make_store(3);
  // Two prompts under one first block; the older branch goes first, then the parent stays while any child does.
  std::vector<int32_t> root = seq(BS, 1), x = root, y = root;
  for (int i = 0; i < BS; i++) {
    x.push_back(100 + i);
    y.push_back(200 + i);
  }
  kv_blocks sx{}, sy{}, sz{};
  compute(x, &sx);
  compute(y, &sy);
  kv_blocks_release(pool, &sx);
  kv_blocks_release(pool, &sy);
  EXPECT_EQ(stats().blocks[0], 3);
  std::vector<int32_t> z = seq(BS, 900);
  compute(z, &sz); // over budget by one: x's leaf (the LRU leaf) goes, not the shared root
  kv_blocks_release(pool, &sz);
  x.push_back(0);
  y.push_back(0);
  std::vector<int32_t> mx = match(x), my = match(y);
  EXPECT_EQ(mx.size(), 1u);
  EXPECT_EQ(my.size(), 2u);
  unref_all(mx);
  unref_all(my);
}

TEST_F(Prefix, EvictionNeverFreesABlockInUse) {
  make_pool(8);
  make_store(2);
  std::vector<int32_t> a = seq(2 * BS, 100), b = seq(2 * BS, 200);
  kv_blocks sa{}, sb{};
  compute(a, &sa);
  compute(b, &sb);                     // over budget, but every block is in use
  EXPECT_EQ(stats().blocks[0], 4);
  EXPECT_EQ(kv_prefix_evict_for(st, 8), 0);
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(kv_pool_refcount(pool, sa.ids[i]), 2);
    EXPECT_EQ(kv_pool_refcount(pool, sb.ids[i]), 2);
  }
  std::vector<int32_t> m = match(std::vector<int32_t>(a.begin(), a.end()));
  EXPECT_EQ(m.size(), 1u); // a is still cached and is now the most recent
  kv_blocks_release(pool, &sb); // b unused by sequences now
  EXPECT_EQ(kv_pool_free_blocks(pool), 4);
  EXPECT_EQ(kv_prefix_evict_for(st, 5), 1); // one block is enough
  EXPECT_EQ(kv_pool_free_blocks(pool), 5);
  EXPECT_EQ(kv_prefix_evict_for(st, 8), 1); // b's other block; a's are in use
  EXPECT_EQ(kv_pool_refcount(pool, sa.ids[0]), 3);
  EXPECT_EQ(kv_pool_refcount(pool, sa.ids[1]), 2);
  unref_all(m);
  kv_blocks_release(pool, &sa);
  EXPECT_EQ(kv_prefix_evict_for(st, 8), 2);
  EXPECT_EQ(kv_pool_free_blocks(pool), 8);
  EXPECT_EQ(stats().blocks[0], 0);
}

uint64_t const_hash(uint64_t, const int32_t *, int) { return 42; }
uint64_t first_token_blind(uint64_t parent, const int32_t *t, int n) { // ignores the first token
  return kv_blockhash(parent, t + 1, n - 1);
}

TEST_F(Prefix, HashCollisionIsRejectedByTheTokenCompare) {
  make_pool(16);
  make_store(16, first_token_blind);
  std::vector<int32_t> a = seq(2 * BS + 1, 10), b = a;
  b[0] = 77; // same key as a's first block, different tokens
  kv_blocks sa{}, sb{};
  EXPECT_EQ(compute(a, &sa), 2);
  EXPECT_TRUE(match(b).empty()); // the key matches, the tokens do not
  EXPECT_EQ(compute(b, &sb), 0); // refused: the key belongs to another block
  EXPECT_EQ(stats().collisions, 1u);
  std::vector<int32_t> m = match(a);
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], sa.ids[0]);
  unref_all(m);
  kv_blocks_release(pool, &sa);
  kv_blocks_release(pool, &sb);
  kv_prefix_free(st);
  st = nullptr;
  // Every key equal: only the first block of the first prompt is ever cached; nothing wrong is served.
  make_store(16, const_hash);
  EXPECT_EQ(compute(a, &sa), 1);
  EXPECT_EQ(stats().collisions, 1u);
  EXPECT_TRUE(match(b).empty());
  m = match(a);
  EXPECT_EQ(m.size(), 1u);
  unref_all(m);
  kv_blocks_release(pool, &sa);
}

TEST_F(Prefix, EventsDrainInOrderAndOverflowClears) {
  make_pool(16);
  make_store(16, nullptr, 3);
  std::vector<int32_t> a = seq(2 * BS, 1);
  kv_blocks sa{};
  compute(a, &sa);
  EXPECT_EQ(kv_prefix_pending_events(st), 2);
  kv_event ev[8];
  EXPECT_EQ(kv_prefix_drain_events(st, ev, 1), 1);
  EXPECT_EQ(ev[0].key, keys_of(a)[0]);
  EXPECT_EQ(kv_prefix_drain_events(st, ev, 8), 1);
  EXPECT_EQ(ev[0].key, keys_of(a)[1]);
  EXPECT_EQ(kv_prefix_drain_events(st, ev, 8), 0);
  kv_blocks_release(pool, &sa);
  // Four adds into a queue of three: the router is told to forget, then learns what follows.
  std::vector<int32_t> b = seq(4 * BS, 100);
  kv_blocks sb{};
  compute(b, &sb);
  int n = kv_prefix_drain_events(st, ev, 8);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(ev[0].kind, KV_EVENT_CLEARED);
  EXPECT_EQ(ev[1].kind, KV_EVENT_ADDED);
  EXPECT_EQ(ev[1].key, keys_of(b)[3]);
  EXPECT_EQ(stats().events_lost, 3u);
  kv_blocks_release(pool, &sb);
}

// Pattern bytes for block i of a prompt: what a forward pass would have written.
std::vector<unsigned char> pattern(size_t bytes, int i) {
  std::vector<unsigned char> v(bytes);
  for (size_t k = 0; k < bytes; k++) v[k] = (unsigned char)(k * 13 + (size_t)i * 101 + 5);
  return v;
}

TEST_F(Prefix, TiersSpillToHostAndDiskAndRestoreRealBytes) {
  make_pool(8);
  std::string path = std::string(::testing::TempDir()) + "dserve_prefix_" + std::to_string(getpid()) + ".kv";
  make_store(2, nullptr, 0, 2, 4, path.c_str());
  ASSERT_EQ(access(path.c_str(), F_OK), 0);
  size_t bb = kv_pool_block_bytes(pool);
  std::vector<int32_t> p = seq(6 * BS + 1, 40);
  kv_blocks s{};
  ASSERT_EQ(kv_blocks_reserve(pool, &s, (int)p.size()), 0);
  for (int i = 0; i < 6; i++) ASSERT_EQ(kv_pool_write_block(pool, s.ids[i], pattern(bb, i).data()), 0);
  EXPECT_EQ(kv_prefix_insert(st, p.data(), (int)p.size(), s.ids, s.n), 6); // over budget: all in use
  EXPECT_EQ(stats().blocks[0], 6);
  kv_blocks_release(pool, &s);
  // Leaf first out of the pool; the host tier passes its LRU leaves on to disk: 0, 1 end in host DRAM.
  EXPECT_EQ(kv_prefix_evict_for(st, 8), 6);
  kv_prefix_stats t = stats();
  EXPECT_EQ(t.blocks[0], 0);
  EXPECT_EQ(t.blocks[1], 2);
  EXPECT_EQ(t.blocks[2], 4);
  EXPECT_EQ(t.demoted, 6u + 4u);
  EXPECT_EQ(t.removed, 0u);
  EXPECT_EQ(kv_prefix_pending_events(st), 6); // adds only: moving between tiers is no event
  int counts[3];
  EXPECT_EQ(kv_prefix_peek(st, p.data(), (int)p.size(), 0, counts), 6);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[1], 2);
  EXPECT_EQ(counts[2], 4);
  // Scrub every free pool block so a restore cannot pass by finding old bytes.
  int nfree = kv_pool_free_blocks(pool);
  ASSERT_EQ(nfree, 8);
  std::vector<int32_t> scrub(nfree);
  ASSERT_EQ(kv_pool_alloc(pool, scrub.data(), nfree), 0);
  std::vector<unsigned char> zero(bb, 0);
  for (int32_t id : scrub) kv_pool_write_block(pool, id, zero.data());
  unref_all(scrub);
  EXPECT_TRUE(match(p).empty()); // nothing in the pool
  std::vector<int32_t> r(8);
  int nr = kv_prefix_restore(st, p.data(), (int)p.size(), 0, r.data(), 8, err, sizeof err);
  ASSERT_EQ(nr, 6) << err;
  std::vector<unsigned char> got(bb);
  for (int i = 0; i < 6; i++) {
    ASSERT_EQ(kv_pool_read_block(pool, r[i], got.data()), 0);
    EXPECT_EQ(got, pattern(bb, i)) << "block " << i;
    EXPECT_EQ(kv_pool_refcount(pool, r[i]), 2); // store and caller
  }
  t = stats();
  EXPECT_EQ(t.hit_blocks[0], 0u);
  EXPECT_EQ(t.hit_blocks[1], 2u);
  EXPECT_EQ(t.hit_blocks[2], 4u);
  EXPECT_EQ(t.hit_tokens[2], 4u * BS);
  EXPECT_EQ(t.hit_queries, 1u);
  EXPECT_EQ(t.blocks[0], 6); // over budget while in use
  EXPECT_EQ(t.blocks[1] + t.blocks[2], 0);
  // Now cached in the pool: a match finds all six.
  std::vector<int32_t> m = match(p);
  EXPECT_EQ(m, std::vector<int32_t>(r.begin(), r.begin() + 6));
  unref_all(m);
  r.resize(6);
  unref_all(r);
  // The next insert trims to the budget: the two first blocks stay in the pool.
  kv_blocks so{};
  compute(seq(BS, 9000), &so);
  kv_blocks_release(pool, &so);
  t = stats();
  EXPECT_EQ(t.blocks[0], 2);
  EXPECT_EQ(t.blocks[1] + t.blocks[2], 5);
  EXPECT_EQ(kv_prefix_peek(st, p.data(), (int)p.size(), 0, counts), 6);
  EXPECT_EQ(counts[0], 1); // block 0 (the new prompt's block is the other resident)
  kv_prefix_clear(st);
  EXPECT_EQ(kv_pool_free_blocks(pool), 8);
  kv_prefix_free(st);
  st = nullptr;
  EXPECT_NE(access(path.c_str(), F_OK), 0); // the store removed its file
}

TEST_F(Prefix, RestoreStopsWhenThePoolIsShort) {
  make_pool(5);
  make_store(1, nullptr, 0, 4);
  std::vector<int32_t> p = seq(4 * BS + 1, 7);
  kv_blocks s{};
  compute(p, &s);
  kv_blocks_release(pool, &s);
  EXPECT_EQ(kv_prefix_evict_for(st, 5), 4);
  int32_t hold[4];
  ASSERT_EQ(kv_pool_alloc(pool, hold, 4), 0); // someone else holds 4 of 5 blocks
  int32_t r[4];
  EXPECT_EQ(kv_prefix_restore(st, p.data(), (int)p.size(), 0, r, 4, err, sizeof err), 1);
  EXPECT_EQ(kv_pool_free_blocks(pool), 0);
  unref_all(std::vector<int32_t>(hold, hold + 4));
  kv_pool_unref(pool, r[0]);
  // the rest is still in the host tier, in chain order after the restored block
  int counts[3];
  EXPECT_EQ(kv_prefix_peek(st, p.data(), (int)p.size(), 1, counts), 3);
  EXPECT_EQ(counts[1], 3);
}

TEST_F(Prefix, BadInputsAreHarmless) {
  make_pool(8);
  make_store(4);
  std::vector<int32_t> p = seq(3 * BS, 1);
  int32_t bogus[3] = {5, 6, 7}; // free blocks: not the caller's to give
  EXPECT_EQ(kv_prefix_insert(st, p.data(), (int)p.size(), bogus, 3), 0);
  EXPECT_EQ(kv_pool_free_blocks(pool), 8);
  EXPECT_EQ(kv_prefix_insert(st, nullptr, 12, bogus, 3), 0);
  EXPECT_EQ(kv_prefix_insert(st, p.data(), BS - 1, bogus, 3), 0);
  int32_t out[4];
  EXPECT_EQ(kv_prefix_match(st, nullptr, 12, out, 4), 0);
  EXPECT_EQ(kv_prefix_match(st, p.data(), 0, out, 4), 0);
  EXPECT_EQ(kv_prefix_match(st, p.data(), (int)p.size(), nullptr, 4), 0);
  kv_blocks b{};
  compute(p, &b);
  kv_blocks_release(pool, &b);
  // restore whose n_have is not what match returned gives nothing
  EXPECT_EQ(kv_prefix_restore(st, p.data(), (int)p.size(), 5, out, 4, err, sizeof err), 0);
  EXPECT_EQ(kv_prefix_restore(st, p.data(), (int)p.size(), 0, nullptr, 4, err, sizeof err), 0);
  // without lower tiers, restore returns pool blocks like match does
  EXPECT_EQ(kv_prefix_restore(st, p.data(), (int)p.size(), 0, out, 4, err, sizeof err), 2);
  kv_pool_unref(pool, out[0]);
  kv_pool_unref(pool, out[1]);
  EXPECT_EQ(kv_prefix_evict_for(st, 8), 3);
  EXPECT_EQ(kv_pool_free_blocks(pool), 8);
  EXPECT_EQ(kv_prefix_block_size(st), BS);
}

// Tokens in the unit vLLM uses: every lookup queries its whole prompt at the pool; what the pool lacks is the
// host tier's query, what both lack the disk tier's; hits are the tokens each tier served.
TEST_F(Prefix, TierCountersForMissPoolHitHostAndDiskRestore) {
  make_pool(8);
  std::string path = std::string(::testing::TempDir()) + "dserve_tiers_" + std::to_string(getpid()) + ".kv";
  make_store(2, nullptr, 0, 2, 4, path.c_str());
  std::vector<int32_t> p = seq(6 * BS + 1, 40);
  const uint64_t N = p.size();
  auto expect = [&](const char *what, std::vector<uint64_t> q, std::vector<uint64_t> h) {
    kv_prefix_stats t = stats();
    for (int k = 0; k < 3; k++) {
      EXPECT_EQ(t.tier_query_tokens[k], q[k]) << what << ": queries of tier " << k;
      EXPECT_EQ(t.hit_tokens[k], h[k]) << what << ": hits of tier " << k;
      EXPECT_LE(t.hit_tokens[k], t.tier_query_tokens[k]) << what;
    }
    EXPECT_EQ(t.tier_query_tokens[0], t.query_tokens) << what;
  };
  // A miss: the whole prompt reaches every tier, nothing is served.
  EXPECT_TRUE(match(p).empty());
  expect("miss", {N, N, N}, {0, 0, 0});
  // Cached, then pushed out of the pool: blocks 0, 1 in host DRAM, 2..5 on disk.
  kv_blocks s{};
  compute(p, &s);
  kv_blocks_release(pool, &s);
  EXPECT_EQ(kv_prefix_evict_for(st, 8), 6);
  ASSERT_EQ(stats().blocks[1], 2);
  ASSERT_EQ(stats().blocks[2], 4);
  // The lookup finds nothing in the pool, two blocks in host DRAM: the disk tier is asked for the rest.
  EXPECT_TRUE(match(p).empty());
  expect("lookup before restore", {2 * N, 2 * N, 2 * N - 2 * BS}, {0, 0, 0});
  std::vector<int32_t> r(8, -1);
  ASSERT_EQ(kv_prefix_restore(st, p.data(), (int)N, 0, r.data(), 8, err, sizeof err), 6) << err;
  r.resize(6);
  unref_all(r);
  expect("host and disk restore", {2 * N, 2 * N, 2 * N - 2 * BS}, {0, 2 * BS, 4 * BS});
  // Everything back in the pool: a pool hit of 6 blocks; the one token left reaches the lower tiers.
  std::vector<int32_t> m = match(p);
  EXPECT_EQ(m.size(), 6u);
  unref_all(m);
  expect("pool hit", {3 * N, 2 * N + 1, 2 * N - 2 * BS + 1}, {6 * BS, 2 * BS, 4 * BS});
  // The next insert trims the pool to its budget of 2: blocks 2..5 go to host (2) and disk (2); a lookup
  // of a longer prompt with the same start finds 2 in the pool, 2 in host DRAM, 2 on disk.
  kv_blocks so{};
  compute(seq(BS, 9000), &so);
  kv_blocks_release(pool, &so);
  std::vector<int32_t> longer = seq(8 * BS, 40);
  int counts[3];
  ASSERT_EQ(kv_prefix_peek(st, longer.data(), (int)longer.size(), 0, counts), 6);
  m = match(longer);
  ASSERT_EQ(counts[0], (int)m.size());
  uint64_t L = longer.size(), h0 = m.size() * BS;
  r.assign(8, -1);
  ASSERT_EQ(kv_prefix_restore(st, longer.data(), (int)L, (int)m.size(), r.data(), 8, err, sizeof err), 6 - (int)m.size());
  unref_all(m);
  r.resize(6 - m.size());
  unref_all(r);
  expect("mixed", {3 * N + L, 2 * N + 1 + L - h0, 2 * N - 2 * BS + 1 + L - h0 - (uint64_t)counts[1] * BS},
         {6 * BS + h0, 2 * BS + (uint64_t)counts[1] * BS, 4 * BS + (uint64_t)counts[2] * BS});
  EXPECT_TRUE(kv_prefix_has_tier(st, 0) && kv_prefix_has_tier(st, 1) && kv_prefix_has_tier(st, 2));
}

TEST_F(Prefix, TierCountersSkipTiersThatAreNotConfigured) {
  make_pool(8);
  make_store(4, nullptr, 0, 4); // pool and host DRAM, no disk
  std::vector<int32_t> p = seq(3 * BS + 1, 1);
  kv_blocks s{};
  compute(p, &s);
  kv_blocks_release(pool, &s);
  unref_all(match(p));
  kv_prefix_stats t = stats();
  EXPECT_EQ(t.tier_query_tokens[0], p.size());
  EXPECT_EQ(t.hit_tokens[0], 3u * BS);
  EXPECT_EQ(t.tier_query_tokens[1], 1u); // the token the pool did not hold
  EXPECT_EQ(t.tier_query_tokens[2], 0u);
  EXPECT_FALSE(kv_prefix_has_tier(st, 2));
  EXPECT_FALSE(kv_prefix_has_tier(st, 3));
  EXPECT_FALSE(kv_prefix_has_tier(st, -1));
}

TEST_F(Prefix, KeysListEveryTierLeastRecentFirst) {
  make_pool(8);
  make_store(2, nullptr, 0, 2);
  EXPECT_EQ(kv_prefix_keys(st, nullptr, 0), 0);
  std::vector<int32_t> a = seq(2 * BS, 1), b = seq(2 * BS, 500);
  kv_blocks sa{}, sb{};
  compute(a, &sa);
  kv_blocks_release(pool, &sa);
  compute(b, &sb); // over the budget of 2: a's blocks go to host DRAM, leaf first
  kv_blocks_release(pool, &sb);
  ASSERT_EQ(stats().blocks[0], 2);
  ASSERT_EQ(stats().blocks[1], 2);
  std::vector<uint64_t> ka = keys_of(a), kb = keys_of(b);
  ASSERT_EQ(kv_prefix_keys(st, nullptr, 0), 4);
  std::vector<uint64_t> got(4);
  ASSERT_EQ(kv_prefix_keys(st, got.data(), 4), 4);
  // host tier first (its LRU end: a's leaf, demoted first), then the pool (b's leaf is older than its head)
  EXPECT_EQ(got, (std::vector<uint64_t>{ka[1], ka[0], kb[1], kb[0]}));
  std::vector<uint64_t> part(3, 7);
  EXPECT_EQ(kv_prefix_keys(st, part.data(), 2), 4); // the total, but only 2 written
  EXPECT_EQ(part, (std::vector<uint64_t>{ka[1], ka[0], 7}));
  kv_prefix_clear(st);
  EXPECT_EQ(kv_prefix_keys(st, got.data(), 4), 0);
}

// The events of kv_events messages a router-side hub receives, by the peer they came from, until want in all.
struct KvHeard {
  std::vector<std::pair<ctl_peer *, kv_event>> ev;
  int messages = 0;
  std::vector<kv_event> from(ctl_peer *p) const {
    std::vector<kv_event> out;
    for (const auto &e : ev)
      if (e.first == p) out.push_back(e.second);
    return out;
  }
};
KvHeard recv_kv_events(ctl_hub *h, size_t want) {
  KvHeard out;
  ctl_event ev;
  while (out.ev.size() < want && ctl_hub_next(h, &ev, 5000) == 1) {
    const cJSON *op = cJSON_GetObjectItem(ev.msg, "op");
    if (ev.msg && cJSON_IsString(op) && !strcmp(op->valuestring, "kv_events")) {
      out.messages++;
      const cJSON *e;
      cJSON_ArrayForEach(e, cJSON_GetObjectItem(ev.msg, "events")) {
        kv_event k{};
        k.kind = cJSON_GetArrayItem(e, 0)->valueint;
        k.key = strtoull(cJSON_GetArrayItem(e, 1)->valuestring, nullptr, 10);
        out.ev.push_back({ev.peer, k});
      }
    }
    ctl_event_done(&ev);
  }
  return out;
}

TEST_F(Prefix, RouterHelloGetsASnapshotInChunks) {
  make_pool(700);
  make_store(700);
  // 600 blocks in the store: more than one kv_events message (512 events at most).
  std::vector<int32_t> p = seq(600 * BS, 3);
  kv_blocks s{};
  ASSERT_EQ(compute(p, &s), 600);
  kv_blocks_release(pool, &s);
  std::vector<uint64_t> want(600);
  ASSERT_EQ(kv_prefix_keys(st, want.data(), 600), 600);
  ctl_hub_opts wo = {};
  wo.name = "w0";
  wo.role = "both";
  wo.host = "127.0.0.1";
  wo.secret = "prefix-test-secret";
  ctl_hub_opts ro = {};
  ro.name = "r0";
  ro.role = "router";
  ro.secret = "prefix-test-secret";
  ctl_hub *worker = nullptr, *router = nullptr;
  ASSERT_EQ(ctl_hub_new(&wo, &worker, err, sizeof err), 0) << err;
  ASSERT_EQ(ctl_hub_new(&ro, &router, err, sizeof err), 0) << err;
  ctl_peer *p1 = ctl_hub_connect(router, "127.0.0.1", ctl_hub_port(worker), 5000, err, sizeof err);
  ASSERT_NE(p1, nullptr) << err;
  kv_events kv{};
  ctl_event ev;
  ASSERT_EQ(ctl_hub_next(worker, &ev, 5000), 1);
  // The pending ADDED events (600) are flushed first (no router yet to hear them), then the snapshot.
  kv_events_on_event(&kv, &ev, st);
  ctl_event_done(&ev);
  EXPECT_EQ(kv.n, 1);
  EXPECT_EQ(kv_prefix_pending_events(st), 0);
  KvHeard heard = recv_kv_events(router, 601);
  EXPECT_EQ(heard.messages, 2);
  std::vector<kv_event> got = heard.from(p1);
  ASSERT_EQ(got.size(), 601u);
  EXPECT_EQ(got[0].kind, KV_EVENT_CLEARED);
  for (size_t i = 1; i < got.size(); i++) {
    EXPECT_EQ(got[i].kind, KV_EVENT_ADDED);
    EXPECT_EQ(got[i].key, want[i - 1]);
  }
  // A second router that connects later: the first hears the new block's event, the second a snapshot of
  // all 601 keys.
  std::vector<int32_t> q = seq(BS, 90000);
  kv_blocks sq{};
  compute(q, &sq);
  kv_blocks_release(pool, &sq);
  ctl_peer *p2 = ctl_hub_connect(router, "127.0.0.1", ctl_hub_port(worker), 5000, err, sizeof err);
  ASSERT_NE(p2, nullptr) << err;
  ASSERT_EQ(ctl_hub_next(worker, &ev, 5000), 1);
  kv_events_on_event(&kv, &ev, st);
  ctl_event_done(&ev);
  EXPECT_EQ(kv.n, 2);
  heard = recv_kv_events(router, 1 + 602);
  EXPECT_EQ(heard.messages, 3);
  got = heard.from(p1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, KV_EVENT_ADDED);
  EXPECT_EQ(got[0].key, keys_of(q)[0]);
  got = heard.from(p2);
  ASSERT_EQ(got.size(), 602u);
  EXPECT_EQ(got[0].kind, KV_EVENT_CLEARED);
  std::vector<uint64_t> snap, all = want;
  all.push_back(keys_of(q)[0]);
  for (size_t i = 1; i < got.size(); i++) {
    EXPECT_EQ(got[i].kind, KV_EVENT_ADDED);
    snap.push_back(got[i].key);
  }
  std::sort(snap.begin(), snap.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(snap, all);
  // No store: the router is added, nothing is sent.
  kv_events none{};
  ctl_peer *p3 = ctl_hub_connect(router, "127.0.0.1", ctl_hub_port(worker), 5000, err, sizeof err);
  ASSERT_NE(p3, nullptr) << err;
  ASSERT_EQ(ctl_hub_next(worker, &ev, 5000), 1);
  kv_events_on_event(&none, &ev, nullptr);
  ctl_event_done(&ev);
  EXPECT_EQ(none.n, 1);
  EXPECT_EQ(ctl_hub_next(router, &ev, 200), 0);
  kv_events_fini(&none);
  kv_events_fini(&kv);
  for (ctl_peer *pp : {p1, p2, p3}) ctl_peer_unref(pp);
  ctl_hub_free(router);
  ctl_hub_free(worker);
}

} // namespace
