// tests/kv/test_prefix.cc: block hash chain, pool refcounts, and the prefix block store (match/insert, sharing, LRU,
// collisions, events); its tiers, counters and snapshots: test_prefix_tiers.cc.
#include "tests/kv/prefix_util.h"

namespace {

using namespace kvtest;

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
  EXPECT_EQ(s.unused, 0); // the sequence still holds every cached block
  kv_blocks_release(pool, &b);
  EXPECT_EQ(kv_pool_free_blocks(pool), 32 - 10); // the store's blocks
  EXPECT_EQ(stats().unused, 10);                  // now only the store: cached, evictable
  std::vector<int32_t> m4 = match(one_more);      // a new sequence holds the first 3 again
  EXPECT_EQ(stats().unused, 7);
  unref_all(m4);
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

// A repeated request recomputes the block its prompt ends in (a match never takes the block of the last prompt
// token), so the store already holds a copy of it, which nobody else uses. The store takes the sequence's copy and
// frees its own: kept, that copy would be the parent of the sequence's later blocks and could not be evicted while
// they are in use, and a sequence that needs the whole pool would wait for it forever (issue 39 item 6: a stream
// that stopped at kv 100% until its deadline).
TEST_F(Prefix, ARecomputedBlockReplacesTheUnusedCachedCopy) {
  make_pool(4);
  make_store(4);
  std::vector<int32_t> toks = seq(4 * BS, 100); // the first run: all four blocks, then it ends
  kv_blocks a{};
  ASSERT_EQ(compute(toks, &a), 4);
  kv_blocks_release(pool, &a);
  EXPECT_EQ(kv_pool_free_blocks(pool), 0);
  // The second run of the same prompt (2 blocks and 1 token) matches 2 blocks and computes the third itself.
  kv_blocks b{};
  std::vector<int32_t> prompt(toks.begin(), toks.begin() + 2 * BS + 1), m = match(prompt);
  ASSERT_EQ(m.size(), 2u);
  ASSERT_EQ(kv_blocks_append(pool, &b, m.data(), 2), 0);
  ASSERT_EQ(kv_prefix_evict_for(st, 1), 1); // the cached block 3 (a leaf) gives way
  ASSERT_EQ(kv_blocks_reserve(pool, &b, 3 * BS), 0);
  EXPECT_EQ(kv_prefix_insert(st, toks.data(), 3 * BS, b.ids, b.n), 0); // block 2 was cached: nothing new
  EXPECT_EQ(kv_pool_free_blocks(pool), 1); // the store's copy of block 2 was freed for the sequence's
  EXPECT_EQ(kv_pool_refcount(pool, b.ids[2]), 2);
  ASSERT_EQ(kv_blocks_reserve(pool, &b, 4 * BS), 0); // so the fourth block is there for it
  EXPECT_EQ(kv_prefix_insert(st, toks.data(), 4 * BS, b.ids, b.n), 1);
  EXPECT_EQ(stats().blocks[0], 4);
  kv_blocks_release(pool, &b);
  // A copy someone else uses stays the store's: replacing it would free nothing.
  kv_blocks c{}, d{};
  m = match(toks);
  ASSERT_EQ(m.size(), 3u);
  ASSERT_EQ(kv_blocks_append(pool, &c, m.data(), 3), 0);
  ASSERT_EQ(kv_prefix_evict_for(st, 1), 1);
  int32_t cached2 = c.ids[2];
  m = match(prompt);
  ASSERT_EQ(kv_blocks_append(pool, &d, m.data(), 2), 0);
  ASSERT_EQ(kv_blocks_reserve(pool, &d, 3 * BS), 0);
  EXPECT_EQ(kv_prefix_insert(st, toks.data(), 3 * BS, d.ids, d.n), 0);
  EXPECT_EQ(kv_pool_refcount(pool, cached2), 2); // c's and the store's
  EXPECT_EQ(kv_pool_refcount(pool, d.ids[2]), 1);
  kv_blocks_release(pool, &c);
  kv_blocks_release(pool, &d);
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

} // namespace
