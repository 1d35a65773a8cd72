// tests/cmd/test_inspect.cc: `dserve inspect` prints a GGUF's weight-type mix (on the SmolLM2 model the tests use).
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "tests/run_dserve.h"

namespace {

using cmdtest::run_dserve;

const char *kModel = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(Inspect, PrintsTheTypeMixMostTensorsFirst) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  ASSERT_EQ(access(kModel, R_OK), 0) << "the real model is needed: " << kModel << " (run scripts/setup.sh)";
  std::string out, err;
  ASSERT_EQ(run_dserve(std::string("inspect '") + kModel + "'", &out, &err), 0) << err;
  // 272 tensors: 210 Q4_1 (the matrices), 61 F32 (the norms), 1 Q8_0 (token_embd.weight)
  EXPECT_NE(out.find("types                  210 Q4_1, 61 F32, 1 Q8_0\n"), std::string::npos) << out;
}

} // namespace
