// tests/kv/test_prefix_tiers.cc: the prefix store's host and disk tiers (spill, restore, per-tier counters), bad
// inputs, key listings and the router's snapshot of them.
#include "tests/kv/prefix_util.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>

namespace {

using namespace kvtest;

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
  for (int32_t id : scrub) ASSERT_EQ(kv_pool_write_block(pool, id, zero.data()), 0);
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

// The descriptor this process has open on path (the store keeps its file private; the test reaches it through
// /proc/self/fd), or -1.
int open_fd_of(const std::string &path) {
  char want[PATH_MAX];
  if (!realpath(path.c_str(), want)) return -1;
  for (int fd = 3; fd < 4096; fd++) {
    char link[64], got[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, got, sizeof got - 1);
    if (n <= 0) continue;
    got[n] = 0;
    if (!strcmp(got, want)) return fd;
  }
  return -1;
}

// A disk tier whose writes fail (here its file is swapped for /dev/full: ENOSPC, what a full file system says) counts
// every block it could not take and says so once (issue 39 item 9: it used to drop them silently). The blocks leave
// the store, as they would with no disk tier.
TEST_F(Prefix, ADiskTierThatCannotWriteCountsAndLogsOnce) {
  make_pool(8);
  std::string path = std::string(::testing::TempDir()) + "dserve_prefix_full_" + std::to_string(getpid()) + ".kv";
  make_store(2, nullptr, 0, 0, 4, path.c_str()); // pool, then disk
  int fd = open_fd_of(path), full = open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_GE(full, 0);
  ASSERT_EQ(dup2(full, fd), fd);
  close(full);
  std::vector<int32_t> p = seq(4 * BS + 1, 70);
  kv_blocks b{};
  ASSERT_EQ(compute(p, &b), 4);
  kv_blocks_release(pool, &b);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(kv_prefix_evict_for(st, 8), 4);
  std::string log = ::testing::internal::GetCapturedStderr();
  kv_prefix_stats t = stats();
  EXPECT_EQ(t.refused[2], 4u);
  EXPECT_EQ(t.refused[0] + t.refused[1], 0u);
  EXPECT_EQ(t.blocks[2], 0);
  EXPECT_EQ(t.removed, 4u);
  EXPECT_EQ(t.demoted, 0u);
  EXPECT_EQ(kv_pool_free_blocks(pool), 8);
  std::string line = "prefix: prefix cache: the disk tier " + path + " refused a block (write failed: No space left on "
                     "device)";
  size_t at = log.find(line);
  EXPECT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find("refused a block", at + line.size()), std::string::npos) << "logged more than once: " << log;
}

// A block the disk tier cannot read back ends a restore, with err: the blocks before it are the caller's (one reference
// each, returned, not lost: a -1 here used to strand them in the pool for good), and the pool is whole again once
// they are given back and evicted.
TEST_F(Prefix, AFailedDiskReadKeepsTheBlocksRestoredBeforeIt) {
  make_pool(8);
  std::string path = std::string(::testing::TempDir()) + "dserve_prefix_rd_" + std::to_string(getpid()) + ".kv";
  make_store(2, nullptr, 0, 2, 4, path.c_str()); // pool, host 2, disk 4
  std::vector<int32_t> p = seq(4 * BS + 1, 90);
  kv_blocks b{};
  ASSERT_EQ(compute(p, &b), 4);
  kv_blocks_release(pool, &b);
  EXPECT_EQ(kv_prefix_evict_for(st, 8), 4);
  int counts[3];
  ASSERT_EQ(kv_prefix_peek(st, p.data(), (int)p.size(), 0, counts), 4);
  ASSERT_EQ(counts[1], 2); // the first two in host memory, the last two on disk
  ASSERT_EQ(counts[2], 2);
  int fd = open_fd_of(path), wronly = open("/dev/full", O_WRONLY | O_CLOEXEC); // reads of it fail (EBADF)
  ASSERT_GE(fd, 0);
  ASSERT_GE(wronly, 0);
  ASSERT_EQ(dup2(wronly, fd), fd);
  close(wronly);
  std::vector<int32_t> r(8);
  char err[256] = "";
  int n = kv_prefix_restore(st, p.data(), (int)p.size(), 0, r.data(), 8, err, sizeof err);
  EXPECT_EQ(n, 2);
  EXPECT_NE(std::string(err).find("cannot read block from disk tier"), std::string::npos) << err;
  for (int i = 0; i < n && i < 2; i++) EXPECT_EQ(kv_pool_refcount(pool, r[i]), 2); // store and caller
  r.resize(n > 0 ? (size_t)n : 0);
  unref_all(r);
  EXPECT_GE(kv_prefix_evict_for(st, 8), 0);
  EXPECT_EQ(kv_pool_free_blocks(pool), 8);
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
  ctl_peer *p1 = ctl_hub_connect(router, "w0", "127.0.0.1", ctl_hub_port(worker), 5000, err, sizeof err);
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
  ctl_peer *p2 = ctl_hub_connect(router, "w0", "127.0.0.1", ctl_hub_port(worker), 5000, err, sizeof err);
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
  ctl_peer *p3 = ctl_hub_connect(router, "w0", "127.0.0.1", ctl_hub_port(worker), 5000, err, sizeof err);
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
