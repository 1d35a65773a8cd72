// tests/kvxfer/test_devices.cc: rdma and nccl backends: device discovery errors (skip with the reason when no device), auto fallback, memory-kind checks, a real rdma round trip where a device exists.
#include "kvx_test_util.h"

using namespace kvxt;

namespace {

TEST(KvxRdma, DiscoveryOrRoundTrip) {
  kvx_opts o = {};
  o.backend = "rdma";
  o.secret = "s3cret";
  o.timeout_ms = 3000;
  char err[256] = "";
  kvx_agent *a = kvx_agent_new("rdma-a", &o, err, sizeof err);
  if (!a) {
    // The code path ran up to device discovery; the message says why.
    EXPECT_TRUE(std::string(err).rfind("rdma: ", 0) == 0) << err;
    if (std::string(err).find("no RDMA device") != std::string::npos) {
      EXPECT_STREQ(err, "rdma: no RDMA device found (ibv_get_device_list returned 0 devices)");
    }
    GTEST_SKIP() << err;
  }
  kvx_agent *b = kvx_agent_new("rdma-b", &o, err, sizeof err);
  ASSERT_TRUE(b) << err;
  const size_t slot = 4096, n = 200, sz = slot * n;
  std::vector<uint8_t> src(sz), dst(sz), back(sz);
  fill(src.data(), sz, 3);
  kvx_region *r1, *r2, *r3;
  ASSERT_EQ(kvx_register(a, src.data(), sz, KVX_MEM_HOST, &r1, err, sizeof err), 0) << err;
  ASSERT_EQ(kvx_register(a, back.data(), sz, KVX_MEM_HOST, &r3, err, sizeof err), 0) << err;
  ASSERT_EQ(kvx_register(b, dst.data(), sz, KVX_MEM_HOST, &r2, err, sizeof err), 0) << err;
  ASSERT_TRUE(learn(a, b));
  EXPECT_STREQ(kvx_peer_backend(a, "rdma-b"), "rdma");
  Blocks bl((uint64_t)(uintptr_t)src.data(), (uint64_t)(uintptr_t)dst.data(), n, slot, 2);
  kvx_xfer *x;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, bl.src.data(), n, bl.dst.data(), n, "rdma-b", "done", 4, &x, err, sizeof err), 0);
  post_xfer(x);
  ASSERT_EQ(wait_xfer(a, x, 10000), KVX_DONE) << kvx_xfer_error(x);
  auto ns = wait_notifs(b, 1, 5000);
  ASSERT_EQ(ns.size(), 1u);
  EXPECT_TRUE(blocks_equal(bl, 0, 0));
  Blocks rb((uint64_t)(uintptr_t)back.data(), (uint64_t)(uintptr_t)dst.data(), n, slot, 2);
  kvx_xfer *y;
  ASSERT_EQ(kvx_xfer_new(a, KVX_READ, rb.src.data(), n, bl.dst.data(), n, "rdma-b", nullptr, 0, &y, err, sizeof err), 0);
  post_xfer(y);
  ASSERT_EQ(wait_xfer(a, y, 10000), KVX_DONE) << kvx_xfer_error(y);
  for (size_t i = 0; i < n; i++)
    EXPECT_EQ(memcmp((void *)(uintptr_t)rb.src[i].addr, (void *)(uintptr_t)bl.src[i].addr, bl.src[i].len), 0);
  kvx_xfer_free(x);
  kvx_xfer_free(y);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

TEST(KvxRdma, AutoFallsBackWhenNoDevice) {
  kvx_agent *a = agent("a", "auto"), *b = agent("b", "auto");
  ASSERT_TRUE(a && b);
  kvx_opts o = {};
  o.backend = "rdma";
  o.secret = "s3cret";
  char err[256];
  kvx_agent *r = kvx_agent_new("probe", &o, err, sizeof err);
  bool have = r != nullptr;
  kvx_agent_free(r);
  EXPECT_EQ((a->enabled >> KVX_BE_RDMA) & 1, have ? 1u : 0u);
  ASSERT_TRUE(learn(a, b));
  // One host: shm either way; a tcp-advertising peer gets tcp, never a backend it lacks.
  EXPECT_STREQ(kvx_peer_backend(a, "b"), "shm");
  kvx_agent_free(a);
  kvx_agent_free(b);
}

TEST(KvxNccl, DiscoveryAndMemoryKind) {
  kvx_opts o = {};
  o.backend = "nccl";
  o.secret = "s3cret";
  char err[256] = "";
  kvx_agent *a = kvx_agent_new("nccl-a", &o, err, sizeof err);
  if (!a) {
    std::string e = err;
    EXPECT_TRUE(e.rfind("nccl: no CUDA device", 0) == 0 || e.rfind("nccl: not built", 0) == 0) << e;
    GTEST_SKIP() << e;
  }
  // A GPU exists: the backend refuses host memory clearly (the GPU round trip needs two ranks: see the bench).
  kvx_agent *b = kvx_agent_new("nccl-b", &o, err, sizeof err);
  ASSERT_TRUE(b) << err;
  std::vector<uint8_t> h1(4096), h2(4096);
  kvx_region *r1, *r2;
  ASSERT_EQ(kvx_register(a, h1.data(), 4096, KVX_MEM_HOST, &r1, err, sizeof err), 0);
  ASSERT_EQ(kvx_register(b, h2.data(), 4096, KVX_MEM_HOST, &r2, err, sizeof err), 0);
  ASSERT_TRUE(learn(a, b));
  kvx_desc l = {(uint64_t)(uintptr_t)h1.data(), 4096}, r = {(uint64_t)(uintptr_t)h2.data(), 4096};
  kvx_xfer *x;
  ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "nccl-b", nullptr, 0, &x, err, sizeof err), 0);
  post_xfer(x);
  EXPECT_LT(wait_xfer(a, x, 30000), 0);
  EXPECT_NE(std::string(kvx_xfer_error(x)).find("CUDA memory only"), std::string::npos) << kvx_xfer_error(x);
  kvx_xfer_free(x);
  kvx_agent_free(a);
  kvx_agent_free(b);
}

TEST(KvxMemKind, HostBackendsRefuseCudaRegions) {
  for (const char *be : {"tcp", "shm"}) {
    kvx_agent *a = agent("a", be), *b = agent("b", be);
    // Registered as CUDA memory (a host pointer stands in: tcp/shm never touch it, they refuse first).
    std::vector<uint8_t> m(4096);
    uint8_t *d = (uint8_t *)kvx_host_alloc(4096, nullptr, 0);
    kvx_region *r1, *r2;
    char err[256];
    ASSERT_EQ(kvx_register(a, m.data(), 4096, KVX_MEM_CUDA, &r1, err, sizeof err), 0) << err;
    ASSERT_EQ(kvx_register(b, d, 4096, KVX_MEM_HOST, &r2, err, sizeof err), 0);
    ASSERT_TRUE(learn(a, b));
    kvx_desc l = {(uint64_t)(uintptr_t)m.data(), 4096}, r = {(uint64_t)(uintptr_t)d, 4096};
    kvx_xfer *x;
    ASSERT_EQ(kvx_xfer_new(a, KVX_WRITE, &l, 1, &r, 1, "b", nullptr, 0, &x, err, sizeof err), 0);
    EXPECT_LT(kvx_xfer_post(x), 0);
    EXPECT_NE(std::string(kvx_xfer_error(x)).find("CUDA memory needs the rdma or nccl backend"), std::string::npos)
        << be << ": " << kvx_xfer_error(x);
    kvx_xfer_free(x);
    kvx_agent_free(a);
    kvx_agent_free(b);
    kvx_host_free(d, 4096);
  }
}

}  // namespace
