// tests/prefill/test_disagg.cc: a real prefill worker pushing KV into a real decode worker, driven as the router.
#include <gtest/gtest.h>

#include "tests/prefill/cluster_util.h"

namespace {

using namespace dserve_test;

const char *kModel = model_path();

const char *kPrompts[] = {
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The history of the Roman Empire spans many centuries. It began when Augustus became the first emperor "
    "and continued through periods of expansion, crisis and reform. Historians often divide it into",
    "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n"};

void disagg_equals_colocated(const std::string &backend, std::vector<WorkerSpec> workers = default_workers()) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c(backend, workers);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 3; i++) {
    auto p = encode(kPrompts[i]);
    std::string id = "r" + std::to_string(i);
    c.send("w0", gen("w" + id, p, 12, "\"mode\":\"local\""));
    c.send("p0", gen(id, p, 12, "\"mode\":\"prefill\",\"decode\":\"d0\""));
    c.send("d0", gen(id, p, 12, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  }
  auto r = collect(c, 6);
  for (int i = 0; i < 3; i++) {
    std::string id = "r" + std::to_string(i);
    EXPECT_EQ(r[id].error, "") << r[id].message << "\n" << c.log("p0") << c.log("d0");
    EXPECT_FALSE(r[id].tokens.empty());
    EXPECT_EQ(r[id].tokens, r["w" + id].tokens) << kPrompts[i];
    EXPECT_EQ(r[id].text, r["w" + id].text);
    EXPECT_GT(r[id].kv_bytes, 0);
  }
  int total = 0;
  EXPECT_EQ(free_blocks(c, "d0", &total), total);
  for (int i = 0; i < 50; i++) { // the prefill worker frees once its writes complete
    if (free_blocks(c, "p0", &total) == total) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(free_blocks(c, "p0", &total), total);
}

} // namespace

TEST(Disagg, GreedyOverTcpEqualsColocated) { disagg_equals_colocated("tcp"); }
TEST(Disagg, GreedyOverShmEqualsColocated) { disagg_equals_colocated("shm"); }

// Host staging (worker/kvstage.h), forced on for CPU pools: the prefill worker copies each layer's blocks into
// its mirror and pushes them from there; the decode worker exports only its mirror and copies a prompt's blocks
// into its pool when the notification comes. Neither pool is registered, so equal output means the KV went
// through both mirrors (they start zeroed). This is the path a GPU worker takes with a CPU peer.
std::vector<WorkerSpec> staged(bool prefill, bool decode) {
  auto w = default_workers();
  for (auto &s : w)
    if ((s.role == "prefill" && prefill) || (s.role == "decode" && decode)) s.kvx = "\"staging\": \"on\"";
  return w;
}

TEST(Disagg, GreedyThroughHostStagingOnBothSidesEqualsColocated) { disagg_equals_colocated("tcp", staged(true, true)); }

TEST(Disagg, GreedyIntoAStagingDecodeWorkerOverShmEqualsColocated) {
  disagg_equals_colocated("shm", staged(false, true));
}

TEST(Disagg, StagingIsOnlyWhereAsked) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  {
    Cluster c("tcp", staged(true, true));
    ASSERT_TRUE(c.ok());
    EXPECT_NE(c.log("p0").find("host mirror"), std::string::npos) << c.log("p0");
    EXPECT_NE(c.log("d0").find("host mirror"), std::string::npos) << c.log("d0");
  }
  { // a CPU pool without "on" does not stage
    Cluster c("tcp");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c.log("d0").find("host mirror"), std::string::npos) << c.log("d0");
  }
}

TEST(Disagg, PrefillDeathFreesTheDecodeWorkersBlocks) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("tcp");
  ASSERT_TRUE(c.ok());
  int total = 0;
  ASSERT_GT(free_blocks(c, "d0", &total), 0);
  std::vector<int> p(1000, 0);
  auto words = encode(kPrompts[1]);
  for (size_t i = 0; i < p.size(); i++) p[i] = words[i % words.size()];
  c.send("d0", gen("k", p, 8, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  c.send("p0", gen("k", p, 8, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  std::this_thread::sleep_for(std::chrono::milliseconds(300)); // mid-prefill
  kill(c.pids["p0"], SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  auto r = collect(c, 1, 10000);
  EXPECT_EQ(r["k"].error, "worker_failure");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(free_blocks(c, "d0", &total), total);
}

TEST(Disagg, DecodeWorkerReceivesOnlyTheBlocksItLacks) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("tcp");
  ASSERT_TRUE(c.ok());
  auto p = encode(kPrompts[1]); // several blocks long
  c.send("p0", gen("t1", p, 6, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("t1", p, 6, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  Result first = collect(c, 1)["t1"];
  ASSERT_EQ(first.error, "") << first.message;
  c.send("p0", gen("t2", p, 6, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("t2", p, 6, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  Result again = collect(c, 1)["t2"];
  ASSERT_EQ(again.error, "") << again.message;
  EXPECT_EQ(again.tokens, first.tokens); // the same answer from the blocks d0 kept
  EXPECT_GT(first.kv_bytes, 0);
  EXPECT_LT(again.kv_bytes, first.kv_bytes); // only the blocks d0 did not hold crossed the wire
}
