// tests/cmd/test_worker.cc: the worker command line: --device overrides the config's device, bad values are refused.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels/krn.h"
#include "tests/run_dserve.h"
#include "tests/test_secret.h"

namespace {

// `dserve ARGS` with stderr folded into the output.
int run(const std::string &args, std::string *out) { return cmdtest::run_dserve(args, out); }

struct WorkerCmd : ::testing::Test {
  std::string dir, cfg;
  void SetUp() override {
    char tmpl[] = "/tmp/dserve-workercmd-XXXXXX";
    dir = mkdtemp(tmpl);
    cfg = dir + "/c.json";
    // The model file need not exist: the device is checked before anything is loaded.
    std::ofstream(cfg) << R"({"model": "absent.gguf", "secret": ")" DSERVE_TEST_SECRET
                       << R"(", "workers": [{"name": "w0", "role": "both", "port": 0}]})";
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

// Every role refuses to start without a shared secret (nothing listens unauthenticated); `dserve launch` is the one
// that makes a per-launch secret (tests/launch/test_launch.cc).
TEST_F(WorkerCmd, NoSecretIsRefused) {
  std::string bare = dir + "/bare.json";
  std::ofstream(bare) << R"({"model": "absent.gguf", "router": {"port": 0},
                             "workers": [{"name": "w0", "role": "both", "port": 0}]})";
  unsetenv("DSERVE_SECRET"); // the children inherit this environment
  unsetenv("DSERVE_SECRET_FILE");
  std::string out;
  EXPECT_EQ(run("both --config " + bare + " --name w0", &out), 2) << out;
  EXPECT_NE(out.find("no shared secret"), std::string::npos) << out;
  EXPECT_EQ(run("router --config " + bare, &out), 2) << out;
  EXPECT_NE(out.find("no shared secret"), std::string::npos) << out;
  unlink(bare.c_str());
}

// A prefix tier that is configured but cannot open stops the worker with the reason (issue 39 item 10: it used to
// run without a prefix cache and say nothing). Both worker shells: dec_worker_run (both, decode) and pfl_worker_run.
TEST_F(WorkerCmd, APrefixTierThatCannotOpenStopsTheWorker) {
  std::string c = dir + "/tier.json", bad = dir + "/no-such-dir/tier.bin";
  std::ofstream(c) << R"({"model": ")" DSERVE_SOURCE_DIR R"(/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf",
    "secret": ")" DSERVE_TEST_SECRET R"(", "router": {"port": 0},
    "workers": [{"name": "w0", "role": "both", "port": 0, "threads": 1, "kv_budget_mb": 8,
                 "prefix_disk_mb": 4, "prefix_disk_path": ")" << bad << R"("},
                {"name": "p0", "role": "prefill", "port": 0, "threads": 1, "kv_budget_mb": 8,
                 "prefix_disk_mb": 4, "prefix_disk_path": ")" << bad << R"("},
                {"name": "d0", "role": "decode", "port": 0, "threads": 1, "kv_budget_mb": 8}]})";
  for (const char *role : {"both", "prefill"}) {
    std::string out;
    EXPECT_EQ(run(std::string(role) + " --config " + c + " --name " + (role[0] == 'b' ? "w0" : "p0"), &out), 1)
        << role << ": " << out;
    EXPECT_NE(out.find("cannot open its prefix cache"), std::string::npos) << role << ": " << out;
    EXPECT_NE(out.find(bad + ": No such file or directory"), std::string::npos) << role << ": " << out;
  }
  unlink(c.c_str());
}

} // namespace
