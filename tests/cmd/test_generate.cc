// tests/cmd/test_generate.cc: `dserve generate` end to end: greedy text as llama.cpp writes it, bad arguments.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <string>

#include "tests/run_dserve.h"

namespace {

using cmdtest::run_dserve;

const char *kModel = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(Generate, GreedyTextMatchesLlamaCpp) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  ASSERT_EQ(access(kModel, R_OK), 0) << "the real model is needed: " << kModel << " (run scripts/setup.sh)";
  std::string out, err;
  // llama.cpp's greedy continuation (tests/models/golden/llama_greedy.json, case 0) starts " Paris.\n\nThe United"
  int rc = run_dserve(std::string("generate --model '") + kModel + "' --prompt 'The capital of France is' -n 6 --threads 2",
               &out, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_EQ(out.rfind(" Paris.\n\nThe United", 0), 0u) << out;
  EXPECT_NE(err.find("tok/s"), std::string::npos) << err;
  // chat: the template is applied and generation stops or runs to -n without error
  rc = run_dserve(std::string("generate --model '") + kModel + "' --chat --prompt 'What is the capital of France?' -n 8 "
               "--temp 0.7 --seed 3 --top-p 0.9 --threads 2",
           &out, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_FALSE(out.empty());
  EXPECT_EQ(out.find("<|im_start|>"), std::string::npos) << out;
  // the weights dequantized to F32 at load and an F32 cache: the scalar kernels' greedy text (which multiply the
  // same dequantized weights exactly; it parts from llama.cpp's at a near tie, " answer" for " United")
  const std::string p = std::string("generate --model '") + kModel + "' --prompt 'The capital of France is' -n 6 "
                        "--threads 2 ";
  std::string scalar;
  ASSERT_EQ(run_dserve(p + "--kernels scalar", &scalar, &err), 0) << err;
  ASSERT_EQ(run_dserve(p + "--f32-weights --f32-kv", &out, &err), 0) << err;
  EXPECT_EQ(out, scalar);
  EXPECT_EQ(out.rfind(" Paris.\n\nThe", 0), 0u) << out;
}

// --bench ends with the roofline lines engine_bench.sh reads: a measured bandwidth, and SmolLM2's weight bytes a step
// (every tensor of the file: SmolLM2 ties its output projection to the token embedding, so a step reads all of it)
TEST(Generate, BenchPrintsTheRoofline) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  std::string out, err;
  int rc = run_dserve(std::string("generate --model '") + kModel + "' --bench --bench-prompt 16 --bench-gen 2 "
                      "--bench-batch 2 --threads 2", &out, &err);
  ASSERT_EQ(rc, 0) << err;
  double gbps = 0, mib = 0, roof = 0;
  int threads = 0;
  const char *m = strstr(out.c_str(), "memory read GB/s: ");
  const char *w = strstr(out.c_str(), "decode weight MiB per step: ");
  const char *r = strstr(out.c_str(), "roofline batch 1 tok/s: ");
  ASSERT_TRUE(m && w && r) << out;
  ASSERT_EQ(sscanf(m, "memory read GB/s: %lf (%d threads)", &gbps, &threads), 2) << out;
  ASSERT_EQ(sscanf(w, "decode weight MiB per step: %lf", &mib), 1) << out;
  ASSERT_EQ(sscanf(r, "roofline batch 1 tok/s: %lf", &roof), 1) << out;
  EXPECT_GT(gbps, 0.1) << out;
  EXPECT_EQ(threads, 2);
  EXPECT_NEAR(mib, 92.10, 0.01) << out; // the whole file's tensors: SmolLM2 ties its output to the embedding
  EXPECT_NEAR(roof, gbps * 1e9 / (mib * 1048576.0), roof * 1e-3) << out;
}

// --bench-chunks prints the fitted cost model and one table row per chunk size, in the order given, each with its
// whole-prompt timing (what bench/README.md's issue 32 table is made of). Tiny sizes: this checks the shape, not speed.
TEST(Generate, BenchChunksPrintsOneRowPerChunk) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  std::string out, err;
  int rc = run_dserve(std::string("generate --model '") + kModel + "' --bench-chunks 4,12 --bench-batch 2 "
                      "--bench-ctx 20 --bench-reps 1 --threads 2", &out, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("steps: 2 decode rows at context 20"), std::string::npos) << out;
  double fixed = -1, tok = -1, pair = -1;
  const char *m = strstr(out.c_str(), "cost model fitted to the decode and mixed steps: ");
  ASSERT_TRUE(m) << out;
  ASSERT_EQ(sscanf(m, "cost model fitted to the decode and mixed steps: %lf ms + %lf ms/token + %lf", &fixed, &tok,
                   &pair), 3) << out;
  EXPECT_GE(fixed, 0);
  EXPECT_GT(tok, 0);
  EXPECT_GE(pair, 0);
  size_t r4 = out.find("\n| 4 | "), r12 = out.find("\n| 12 | ");
  ASSERT_NE(r4, std::string::npos) << out;
  ASSERT_NE(r12, std::string::npos) << out;
  EXPECT_LT(r4, r12);
  EXPECT_NE(out.find("20-token prompt ms alone / with the decode rows"), std::string::npos) << out;
}

TEST(Generate, BadArgumentsGiveUsageAndExitTwo) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  std::string out, err;
  EXPECT_EQ(run_dserve("generate", &out, &err), 2);
  EXPECT_NE(err.find("usage"), std::string::npos) << err;
  EXPECT_EQ(run_dserve(std::string("generate --model '") + kModel + "' --prompt x --temp -1", &out, &err), 2);
  EXPECT_NE(err.find("--temp"), std::string::npos) << err;
  EXPECT_EQ(run_dserve(std::string("generate --model '") + kModel + "' --prompt x --bogus 1", &out, &err), 2);
  EXPECT_EQ(run_dserve(std::string("generate --model '") + kModel + "' --prompt x -n", &out, &err), 2);
  EXPECT_EQ(run_dserve(std::string("generate --model '") + kModel + "' --prompt x --kernels nosuch", &out, &err), 2);
  EXPECT_NE(err.find("nosuch"), std::string::npos) << err;
  EXPECT_EQ(run_dserve(std::string("generate --model '") + kModel + "' --prompt x --f32-weights=yes -n 1", &out, &err), 2);
  EXPECT_NE(err.find("unknown option --f32-weights=yes"), std::string::npos) << err;
  for (const char *bad : {"0,5", "8,,9", ",8", "8,", "5000", "x", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"}) {
    EXPECT_EQ(run_dserve(std::string("generate --model '") + kModel + "' --bench-chunks '" + bad + "'", &out, &err), 2)
        << bad;
    EXPECT_NE(err.find("--bench-chunks"), std::string::npos) << err;
  }
  EXPECT_EQ(run_dserve(std::string("generate --model '") + kModel + "' --bench-chunks 8 --bench-reps 0", &out, &err), 2);
  EXPECT_EQ(run_dserve("generate --model /nonexistent.gguf --prompt x", &out, &err), 1);
  EXPECT_NE(err.find("nonexistent"), std::string::npos) << err;
}

} // namespace
