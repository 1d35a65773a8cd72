// tests/server/test_worker_cmd.cc: the worker command line: --device overrides the config's device, bad values are refused.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels/krn.h"

namespace {

// Runs the dserve binary with args (stderr folded into the output); returns its exit status.
int run(const std::string &args, std::string *out) {
  std::string cmd = std::string("timeout 60 ") + DSERVE_BINARY + " " + args + " 2>&1";
  FILE *p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

struct WorkerCmd : ::testing::Test {
  std::string dir, cfg;
  void SetUp() override {
    char tmpl[] = "/tmp/dserve-workercmd-XXXXXX";
    dir = mkdtemp(tmpl);
    cfg = dir + "/c.json";
    // The model file need not exist: the device is checked before anything is loaded.
    std::ofstream(cfg) << R"({"model": "absent.gguf", "workers": [{"name": "w0", "role": "both", "port": 0}]})";
  }
  void TearDown() override {
    unlink(cfg.c_str());
    rmdir(dir.c_str());
  }
};

TEST_F(WorkerCmd, BadDeviceIsRefused) {
  std::string out;
  EXPECT_EQ(run("both --config " + cfg + " --name w0 --device gpu7", &out), 2) << out;
  EXPECT_NE(out.find("--device"), std::string::npos) << out;
  EXPECT_NE(out.find("gpu7"), std::string::npos) << out;
}

TEST_F(WorkerCmd, DeviceOverridesTheConfig) {
  if (krn_cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: the worker would start and serve";
  std::string out;
  // The config says cpu; the override asks for a GPU this machine lacks, and the error names it.
  EXPECT_EQ(run("both --config " + cfg + " --name w0 --device cuda:1", &out), 1) << out;
  EXPECT_NE(out.find("device cuda:1"), std::string::npos) << out;
}

} // namespace
