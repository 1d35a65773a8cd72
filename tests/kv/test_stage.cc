// tests/kv/test_stage.cc: host staging of KV transfers: when a worker stages, address mapping, the advertised layout, copies out and in, bad ranges.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "kv/stage.h"
#include "kv/wire.h"
#include "kvxfer/kvx.h"
}

namespace {

// A "device" backend on host memory: ctx_init is set (so the pool counts as device memory, as cuda's does),
// and every copy is counted.
struct Counts {
  int upload = 0, download = 0, ready = 0, reg = 0, unreg = 0;
} g;
void *t_alloc(krn_ctx *, size_t n) { return std::calloc(1, n); }
void t_free(krn_ctx *, void *p) { std::free(p); }
void t_upload(krn_ctx *, void *d, const void *s, size_t n) { g.upload++, std::memcpy(d, s, n); }
void t_download(krn_ctx *, void *d, const void *s, size_t n) { g.download++, std::memcpy(d, s, n); }
void t_ready(krn_ctx *, void *d, const void *s, size_t n) { g.ready++, std::memcpy(d, s, n); }
int t_init(krn_ctx *, int, char *, size_t) { return 0; }
int t_reg(krn_ctx *, void *, size_t) { return g.reg++, 0; }
void t_unreg(krn_ctx *, void *) { g.unreg++; }

struct KvStage : ::testing::Test {
  krn_backend dev{}, host{};
  krn_ctx kc{};
  mdl_llama_cfg cfg{};
  cfg_worker wc{};
  kv_pool *pool = nullptr;
  kvx_agent *agent = nullptr;
  char err[256] = {0};
  void SetUp() override {
    g = Counts{};
    for (krn_backend *b : {&dev, &host}) {
      b->alloc = t_alloc;
      b->free = t_free;
      b->upload = t_upload;
      b->download = t_download;
    }
    dev.name = "fakedev";
    dev.ctx_init = t_init;
    dev.download_ready = t_ready;
    dev.host_register = t_reg;
    dev.host_unregister = t_unreg;
    host.name = "fakehost";
    cfg.n_layer = 3;
    cfg.n_kv_head = 2;
    cfg.head_dim = 4;
    cfg.n_head = 2;
    cfg.n_embd = 8;
    snprintf(wc.name, sizeof wc.name, "w");
    snprintf(wc.kvx_backend, sizeof wc.kvx_backend, "tcp");
    snprintf(wc.kvx_staging, sizeof wc.kvx_staging, "auto");
    kvx_opts o{};
    o.backend = "tcp";
    o.listen_host = "127.0.0.1";
    o.secret = "s3cret";
    agent = kvx_agent_new("stagetest", &o, err, sizeof err);
    ASSERT_NE(agent, nullptr) << err;
  }
  void TearDown() override {
    kvx_agent_free(agent);
    kv_pool_free(pool);
  }
  void make_pool(krn_backend *be, int n_blocks) {
    kc.be = be;
    kv_pool_opts po{};
    po.type = KRN_F16;
    po.block_size = 4;
    po.budget_bytes = mdl_kv_block_bytes(&cfg, KRN_F16, 4) * (size_t)n_blocks;
    ASSERT_EQ(kv_pool_new(&cfg, &kc, &po, &pool, err, sizeof err), 0) << err;
  }
  uint8_t *base() { return (uint8_t *)kv_pool_base(pool, nullptr); }
  size_t bytes() {
    size_t b = 0;
    kv_pool_base(pool, &b);
    return b;
  }
};

TEST_F(KvStage, DevicePoolOverTcpStagesAndCopiesChunksOutOfThePool) {
  make_pool(&dev, 8);
  kv_stage *st = nullptr;
  kvx_region *reg = nullptr;
  ASSERT_EQ(kv_stage_open(agent, pool, &kc, &wc, &st, &reg, err, sizeof err), 0) << err;
  ASSERT_NE(st, nullptr);
  EXPECT_NE(reg, nullptr);
  EXPECT_EQ(g.reg, 1); // the mirror is pinned by the backend
  for (size_t i = 0; i < bytes(); i++) base()[i] = (uint8_t)(i * 7 + 1);
  const mdl_kv *kv = kv_pool_kv(pool);
  const size_t chunk = mdl_kv_chunk_bytes(&cfg, kv);
  uint8_t *c13 = (uint8_t *)mdl_kv_chunk(&cfg, kv, 1, 0, 3), *c14 = (uint8_t *)mdl_kv_chunk(&cfg, kv, 1, 0, 4);
  uint8_t *c26 = (uint8_t *)mdl_kv_chunk(&cfg, kv, 2, 1, 6);
  uint8_t *m13 = (uint8_t *)(uintptr_t)kv_stage_addr(st, c13);
  EXPECT_NE((void *)m13, (void *)c13);
  EXPECT_EQ((uintptr_t)kv_stage_addr(st, c14) - (uintptr_t)m13, (uintptr_t)(c14 - c13)); // same layout
  // the mirror starts zeroed; out copies exactly the named chunks, neighbours as one copy
  std::vector<uint8_t> zero(chunk, 0);
  EXPECT_EQ(std::memcmp(m13, zero.data(), chunk), 0);
  kvx_desc r[3] = {{(uint64_t)(uintptr_t)c13, chunk}, {(uint64_t)(uintptr_t)c14, chunk}, {(uint64_t)(uintptr_t)c26, chunk}};
  ASSERT_EQ(kv_stage_out(st, r, 3), 0);
  EXPECT_EQ(g.ready, 2);
  EXPECT_EQ(g.download, 0); // download_ready, not download: no wait for the whole queue
  EXPECT_EQ(std::memcmp(m13, c13, 2 * chunk), 0);
  EXPECT_EQ(std::memcmp((void *)(uintptr_t)kv_stage_addr(st, c26), c26, chunk), 0);
  uint8_t *c00 = (uint8_t *)mdl_kv_chunk(&cfg, kv, 0, 0, 0);
  EXPECT_EQ(std::memcmp((void *)(uintptr_t)kv_stage_addr(st, c00), zero.data(), chunk), 0); // untouched
  EXPECT_DOUBLE_EQ(kv_stage_bytes_out(st), 3.0 * chunk);
  // a range that leaves the pool copies nothing
  kvx_desc bad[2] = {{(uint64_t)(uintptr_t)c00, chunk}, {(uint64_t)(uintptr_t)(base() + bytes() - chunk / 2), chunk}};
  EXPECT_EQ(kv_stage_out(st, bad, 2), -1);
  EXPECT_EQ(g.ready, 2);
  // the layout peers get names the mirror
  EXPECT_EQ(kv_pool_stage(pool), st);
  EXPECT_EQ(kv_wire_layout(pool).base, kv_stage_addr(st, base()));
  kvx_deregister(agent, reg);
  kv_stage_free(st);
  EXPECT_EQ(g.unreg, 1);
  EXPECT_EQ(kv_pool_stage(pool), nullptr); // the pool is reached directly again
  EXPECT_EQ(kv_wire_layout(pool).base, (uint64_t)(uintptr_t)base());
}

TEST_F(KvStage, ReceivedBlocksAreCopiedIntoThePoolEveryLayerKAndV) {
  make_pool(&dev, 8);
  kv_stage *st = nullptr;
  kvx_region *reg = nullptr;
  ASSERT_EQ(kv_stage_open(agent, pool, &kc, &wc, &st, &reg, err, sizeof err), 0) << err;
  ASSERT_NE(st, nullptr);
  uint8_t *mirror = (uint8_t *)(uintptr_t)kv_stage_addr(st, base());
  for (size_t i = 0; i < bytes(); i++) mirror[i] = (uint8_t)(i * 13 + 5); // what a peer wrote
  const int32_t blocks[] = {2, 3, 6};
  ASSERT_EQ(kv_stage_in(st, blocks, 3), 0);
  EXPECT_EQ(g.upload, cfg.n_layer * 2 * 2); // runs {2,3} and {6} of each (layer, K|V)
  const mdl_kv *kv = kv_pool_kv(pool);
  const size_t chunk = mdl_kv_chunk_bytes(&cfg, kv);
  for (int l = 0; l < cfg.n_layer; l++)
    for (int k = 0; k < 2; k++)
      for (int blk = 0; blk < 8; blk++) {
        uint8_t *p = (uint8_t *)mdl_kv_chunk(&cfg, kv, l, k, blk);
        bool copied = blk == 2 || blk == 3 || blk == 6;
        std::vector<uint8_t> zero(chunk, 0);
        EXPECT_EQ(std::memcmp(p, copied ? (void *)(uintptr_t)kv_stage_addr(st, p) : zero.data(), chunk), 0)
            << "layer " << l << " kv " << k << " block " << blk;
      }
  EXPECT_DOUBLE_EQ(kv_stage_bytes_in(st), 3.0 * cfg.n_layer * 2 * chunk);
  const int32_t bad[] = {1, 8};
  EXPECT_EQ(kv_stage_in(st, bad, 2), -1);
  EXPECT_EQ(g.upload, cfg.n_layer * 2 * 2);
  kvx_deregister(agent, reg);
  kv_stage_free(st);
}

TEST_F(KvStage, WhoStages) {
  struct Case { krn_backend *be; const char *backend, *staging; bool stages; } cases[] = {
      {&dev, "tcp", "auto", true},   {&dev, "shm", "auto", true},  {&dev, "auto", "auto", true},
      {&dev, "nccl", "auto", false}, {&dev, "tcp", "off", false},  {&host, "tcp", "auto", false},
      {&host, "shm", "auto", false}, {&host, "tcp", "on", true},   {&dev, "shm", "on", true},
  };
  for (auto &c : cases) {
    SCOPED_TRACE(std::string(c.be->name) + " " + c.backend + " " + c.staging);
    make_pool(c.be, 2);
    snprintf(wc.kvx_backend, sizeof wc.kvx_backend, "%s", c.backend);
    snprintf(wc.kvx_staging, sizeof wc.kvx_staging, "%s", c.staging);
    kv_stage *st = nullptr;
    kvx_region *reg = nullptr;
    ASSERT_EQ(kv_stage_open(agent, pool, &kc, &wc, &st, &reg, err, sizeof err), 0) << err;
    EXPECT_NE(reg, nullptr);
    EXPECT_EQ(st != nullptr, c.stages);
    if (!st) { // peers reach the pool itself
      EXPECT_EQ(kv_stage_addr(st, base() + 5), (uint64_t)(uintptr_t)(base() + 5));
      EXPECT_EQ(kv_stage_out(st, nullptr, 0), 0);
      EXPECT_EQ(kv_stage_in(st, nullptr, 3), 0);
    }
    kvx_deregister(agent, reg);
    kv_stage_free(st);
    kv_pool_free(pool);
    pool = nullptr;
  }
}

TEST_F(KvStage, StagingOnWithNcclIsRefused) {
  make_pool(&dev, 2);
  snprintf(wc.kvx_backend, sizeof wc.kvx_backend, "nccl");
  snprintf(wc.kvx_staging, sizeof wc.kvx_staging, "on");
  kv_stage *st = nullptr;
  kvx_region *reg = nullptr;
  EXPECT_EQ(kv_stage_open(agent, pool, &kc, &wc, &st, &reg, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("nccl"), std::string::npos) << err;
  EXPECT_EQ(st, nullptr);
  EXPECT_EQ(reg, nullptr);
  kv_stage_free(nullptr); // no-op
}

} // namespace
