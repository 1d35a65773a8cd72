// tests/kv/prefix_util.h: the prefix store's test fixture (a one-layer pool and a store over it) and token helpers,
// shared by test_prefix.cc and test_prefix_tiers.cc.
#ifndef DSERVE_TESTS_KV_PREFIX_UTIL_H
#define DSERVE_TESTS_KV_PREFIX_UTIL_H

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <utility>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "ctl/hub.h"
#include "kv/blockhash.h"
#include "kv/events.h"
#include "kv/pool.h"
#include "kv/prefix.h"
}

namespace kvtest { // named: both test files share the one fixture class

inline void *t_alloc(krn_ctx *, size_t n) { return std::calloc(1, n); }
inline void t_free(krn_ctx *, void *p) { std::free(p); }

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

inline std::vector<int32_t> seq(int n, int32_t start) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; i++) v[i] = start + i;
  return v;
}

inline std::vector<uint64_t> keys_of(const std::vector<int32_t> &t, kv_blockhash_fn fn = nullptr) {
  std::vector<uint64_t> k(t.size() / BS + 1);
  k.resize(kv_blockhash_chain(fn, t.data(), (int)t.size(), BS, k.data(), (int)k.size()));
  return k;
}

} // namespace kvtest
#endif
