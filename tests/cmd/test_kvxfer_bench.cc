// tests/cmd/test_kvxfer_bench.cc: `dserve kvxfer-bench` runs end to end on tiny sizes and refuses bad arguments (output shape only; no timing asserted).
#include <gtest/gtest.h>

#include <string>

#include "tests/run_dserve.h"

namespace {

// `dserve kvxfer-bench ARGS` with stderr folded into the output.
std::string run(const std::string &args, int *status) {
  std::string out;
  *status = cmdtest::run_dserve("kvxfer-bench " + args, &out);
  return out;
}

TEST(KvxBenchCmd, RunsAndPrintsTheTable) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  for (const char *be : {"tcp", "shm"}) {
    int st;
    std::string out = run(std::string("--backend ") + be + " --size 64K --blocks 4 --iters 3", &st);
    EXPECT_EQ(st, 0) << out;
    EXPECT_NE(out.find("raw GB/s"), std::string::npos) << out;
    EXPECT_NE(out.find("4 KiB"), std::string::npos) << out;
    EXPECT_NE(out.find("64 KiB"), std::string::npos) << out;
  }
  int st;
  std::string out = run("--backend carrier-pigeon", &st);
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("--backend tcp|shm"), std::string::npos) << out;
  out = run("--backend tcp --size 12Q", &st);
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("--size"), std::string::npos) << out;
  out = run("--backend tcp --blocks 0", &st);
  EXPECT_EQ(st, 2);
  out = run("--backend tcp --block 0", &st);
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("--block"), std::string::npos) << out;
  out = run("--backend tcp --size 64M --block 16", &st); // 4M descriptors in one message
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("blocks in the largest message"), std::string::npos) << out;
}

// --backend nccl: device memory on two GPUs. Where it cannot run (no CUDA build, no device, one GPU) it says why
// and exits non-zero; its arguments are checked first. On a machine with two GPUs it runs like the others.
TEST(KvxBenchCmd, NcclRefusesClearlyOrRuns) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  int st;
  std::string out = run("--backend nccl --devices 0,0", &st);
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("NCCL refuses two ranks of one communicator on one device"), std::string::npos) << out;
  for (const char *bad : {"1", "0,", "0,x", "-1,2", ",1"}) {
    out = run(std::string("--backend nccl --devices ") + bad, &st);
    EXPECT_EQ(st, 2) << bad;
    EXPECT_NE(out.find("want S,R"), std::string::npos) << out;
  }
  out = run("--backend tcp --devices 0,1", &st);
  EXPECT_EQ(st, 2);
  EXPECT_NE(out.find("--devices goes with --backend nccl"), std::string::npos) << out;
  out = run("--backend nccl --size 64K --blocks 4 --iters 3", &st);
  if (st == 0) { // two GPUs and NCCL: the table, against the CUDA peer copy
    EXPECT_NE(out.find("cudaMemcpyPeerAsync"), std::string::npos) << out;
    EXPECT_NE(out.find("64 KiB"), std::string::npos) << out;
  } else {
    EXPECT_EQ(st, 1) << out;
    EXPECT_TRUE(out.find("built without CUDA") != std::string::npos ||
                out.find("no usable CUDA device") != std::string::npos ||
                out.find("the nccl push needs two GPUs") != std::string::npos ||
                out.find("nccl: not built") != std::string::npos)
        << out;
    EXPECT_EQ(out.find("raw GB/s"), std::string::npos) << "printed a table without measuring: " << out;
  }
}

// --block: blocks of a fixed size (a model's KV block), m / B of them per message; sizes under B are skipped.
TEST(KvxBenchCmd, FixedBlockSize) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  int st;
  std::string out = run("--backend tcp --size 64K --block 6K --iters 3", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("blocks of 6144 bytes"), std::string::npos) << out;
  EXPECT_EQ(out.find("\n4 KiB"), std::string::npos) << out;                       // under one block: skipped
  EXPECT_NE(out.find("12 KiB         2     6 KiB"), std::string::npos) << out;    // 16 KiB holds 2 blocks
  EXPECT_NE(out.find("60 KiB        10     6 KiB"), std::string::npos) << out;    // 64 KiB holds 10
}

}  // namespace
