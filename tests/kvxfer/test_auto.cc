// tests/kvxfer/test_auto.cc: auto's choice of backend from the backend table (ranks and capabilities), on made-up
// tables and on kvxfer's own.
#include "kvx_test_util.h"

namespace {

constexpr unsigned kAnyHost = KVX_CAP_LOCAL | KVX_CAP_REMOTE | KVX_CAP_HOST;

kvx_backend fake(const char *name, int rank, unsigned caps) {
  kvx_backend b{};
  b.name = name;
  b.rank = rank;
  b.caps = caps;
  return b;
}

uint32_t bits(std::initializer_list<int> idx) {
  uint32_t m = 0;
  for (int i : idx) m |= 1u << i;
  return m;
}

// Auto on kvxfer's table: the index it picks, as a name ("" when none).
std::string pick(std::initializer_list<int> both, bool same_host) {
  int i = kvx_auto_pick(kvx_backends, KVX_NBE, bits(both), same_host);
  return i < 0 ? "" : kvx_backends[i]->name;
}

}  // namespace

TEST(KvxAuto, PicksTheHighestRankBothRun) {
  kvx_backend slow = fake("slow", 10, kAnyHost), fast = fake("fast", 30, kAnyHost), mid = fake("mid", 20, kAnyHost);
  const kvx_backend *t[] = {&slow, &fast, &mid};
  EXPECT_EQ(kvx_auto_pick(t, 3, bits({0, 1, 2}), 1), 1);
  EXPECT_EQ(kvx_auto_pick(t, 3, bits({0, 1, 2}), 0), 1);
  EXPECT_EQ(kvx_auto_pick(t, 3, bits({0, 2}), 0), 2) << "one agent does not run 'fast'";
  EXPECT_EQ(kvx_auto_pick(t, 3, bits({0}), 0), 0);
  EXPECT_EQ(kvx_auto_pick(t, 3, 0, 0), -1) << "nothing in common";
}

TEST(KvxAuto, SkipsWhatDoesNotFitWhereThePeerIs) {
  kvx_backend base = fake("base", 10, kAnyHost), local = fake("local", 40, KVX_CAP_LOCAL | KVX_CAP_HOST),
              far = fake("far", 20, kAnyHost | KVX_CAP_AUTO_FAR), off = fake("off", 0, kAnyHost),
              remote = fake("remote", 50, KVX_CAP_REMOTE | KVX_CAP_HOST);
  const kvx_backend *t[] = {&base, &local, &far, &off, &remote};
  uint32_t all = bits({0, 1, 2, 3, 4});
  EXPECT_EQ(kvx_auto_pick(t, 5, all, 1), 1) << "one host: 'remote' cannot, 'local' is the best that can";
  EXPECT_EQ(kvx_auto_pick(t, 5, all, 0), 4) << "other host: 'local' cannot";
  EXPECT_EQ(kvx_auto_pick(t, 5, bits({0, 1, 2, 3}), 0), 2);
  EXPECT_EQ(kvx_auto_pick(t, 5, bits({0, 2, 3}), 1), 0) << "one host: 'far' is for other hosts only";
  EXPECT_EQ(kvx_auto_pick(t, 5, bits({3}), 0), -1) << "rank 0: never auto's choice";
  EXPECT_EQ(kvx_auto_pick(t, 5, bits({1}), 0), -1) << "a one-host backend for a peer on another host";
}

// The rule docs/kvxfer.md states: shm on one host, else rdma (both have a device), else nixl (other hosts), else
// tcp; nccl only when asked.
TEST(KvxAuto, KvxferTableKeepsTheDocumentedRule) {
  EXPECT_EQ(pick({KVX_BE_TCP, KVX_BE_SHM, KVX_BE_RDMA, KVX_BE_NCCL, KVX_BE_NIXL}, true), "shm");
  EXPECT_EQ(pick({KVX_BE_TCP, KVX_BE_SHM, KVX_BE_RDMA, KVX_BE_NCCL, KVX_BE_NIXL}, false), "rdma");
  EXPECT_EQ(pick({KVX_BE_TCP, KVX_BE_RDMA, KVX_BE_NIXL}, true), "rdma");
  EXPECT_EQ(pick({KVX_BE_TCP, KVX_BE_SHM, KVX_BE_NCCL, KVX_BE_NIXL}, false), "nixl");
  EXPECT_EQ(pick({KVX_BE_TCP, KVX_BE_NCCL, KVX_BE_NIXL}, true), "tcp") << "never UCX on one host";
  EXPECT_EQ(pick({KVX_BE_TCP, KVX_BE_SHM}, false), "tcp") << "shm needs one host";
  EXPECT_EQ(pick({KVX_BE_TCP, KVX_BE_NCCL}, false), "tcp");
  EXPECT_EQ(pick({KVX_BE_NCCL}, true), "");
  EXPECT_EQ(pick({KVX_BE_SHM}, false), "");
}

// Each entry says what the backends table of docs/kvxfer.md says; the core reads nothing else.
TEST(KvxAuto, KvxferTableCapabilities) {
  for (int i = 0; i < KVX_NBE; i++) {
    const kvx_backend *b = kvx_backends[i];
    SCOPED_TRACE(b->name);
    EXPECT_TRUE(b->caps & KVX_CAP_LOCAL);
    EXPECT_EQ(!!(b->caps & KVX_CAP_REMOTE), i != KVX_BE_SHM);
    EXPECT_EQ(!!(b->caps & KVX_CAP_HOST), i != KVX_BE_NCCL);
    EXPECT_EQ(!!(b->caps & KVX_CAP_CUDA), i == KVX_BE_RDMA || i == KVX_BE_NCCL || i == KVX_BE_NIXL);
    EXPECT_EQ(!!(b->caps & KVX_CAP_FALLBACK), i == KVX_BE_TCP);
    EXPECT_EQ(b->rank == 0, i == KVX_BE_NCCL);
    EXPECT_EQ(b->auto_up != nullptr, i == KVX_BE_NIXL);
  }
}

// A backend that declines auto (nixl without DSERVE_NIXL_LIB) is not brought up; one with rank 0 (nccl) never is.
TEST(KvxAuto, AutoBringsUpWhatTheTableSays) {
  const char *lib = getenv("DSERVE_NIXL_LIB");
  std::string saved = lib ? lib : "";
  unsetenv("DSERVE_NIXL_LIB");
  char err[256] = "";
  kvx_opts o = {};
  o.backend = "auto";
  o.secret = "s3cret-auto";
  kvx_agent *a = kvx_agent_new("auto-up", &o, err, sizeof err);
  ASSERT_NE(a, nullptr) << err;
  EXPECT_NE(a->enabled & (1u << KVX_BE_TCP), 0u);
  EXPECT_NE(a->enabled & (1u << KVX_BE_SHM), 0u);
  EXPECT_EQ(a->enabled & (1u << KVX_BE_NCCL), 0u);
  EXPECT_EQ(a->enabled & (1u << KVX_BE_NIXL), 0u);
  kvx_agent_free(a);
  o.backend = "shm";
  a = kvx_agent_new("shm-only", &o, err, sizeof err);
  ASSERT_NE(a, nullptr) << err;
  EXPECT_EQ(a->enabled, 1u << KVX_BE_SHM) << "shm's listener is not tcp's: no fallback comes along";
  kvx_agent_free(a);
  if (lib) setenv("DSERVE_NIXL_LIB", saved.c_str(), 1);
}
