// tests/kvxfer/test_bench_cmd.cc: `dserve kvxfer-bench` runs end to end on tiny sizes and refuses bad arguments (output shape only; no timing asserted).
#include <sys/stat.h>

#include <string>

#include "kvx_test_util.h"

namespace {

std::string run(const std::string &args, int *status) {
  std::string cmd = std::string(DSERVE_BINARY) + " kvxfer-bench " + args + " 2>&1";
  FILE *f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int st = f ? pclose(f) : -1;
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

TEST(KvxBenchCmd, RunsAndPrintsTheTable) {
  struct stat sb;
  if (stat(DSERVE_BINARY, &sb)) GTEST_SKIP() << "dserve is not built (" << DSERVE_BINARY << ")";
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
}

}  // namespace
