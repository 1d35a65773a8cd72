// tests/models/test_llama_cmd.cc: `dserve generate` end to end: greedy text as llama.cpp writes it, bad arguments.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace {

const char *kModel = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";

// Runs dserve with args; returns the exit status, stdout in *out and stderr in *err.
int run(const std::string &args, std::string *out, std::string *err) {
  char errf[] = "/tmp/dserve_gen_err_XXXXXX";
  int fd = mkstemp(errf);
  if (fd < 0) return -1;
  close(fd);
  std::string cmd = std::string("'") + DSERVE_BINARY + "' " + args + " 2>" + errf;
  FILE *p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = pclose(p);
  err->clear();
  if (FILE *f = std::fopen(errf, "r")) {
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) err->append(buf, n);
    std::fclose(f);
  }
  unlink(errf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(Generate, GreedyTextMatchesLlamaCpp) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  ASSERT_EQ(access(kModel, R_OK), 0) << "the real model is needed: " << kModel << " (run scripts/setup.sh)";
  std::string out, err;
  // llama.cpp's greedy continuation (tests/models/golden/llama_greedy.json, case 0) starts " Paris.\n\nThe United"
  int rc = run(std::string("generate --model '") + kModel + "' --prompt 'The capital of France is' -n 6 --threads 2",
               &out, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_EQ(out.rfind(" Paris.\n\nThe United", 0), 0u) << out;
  EXPECT_NE(err.find("tok/s"), std::string::npos) << err;
  // chat: the template is applied and generation stops or runs to -n without error
  rc = run(std::string("generate --model '") + kModel + "' --chat --prompt 'What is the capital of France?' -n 8 "
               "--temp 0.7 --seed 3 --top-p 0.9 --threads 2",
           &out, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_FALSE(out.empty());
  EXPECT_EQ(out.find("<|im_start|>"), std::string::npos) << out;
}

TEST(Generate, BadArgumentsGiveUsageAndExitTwo) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  std::string out, err;
  EXPECT_EQ(run("generate", &out, &err), 2);
  EXPECT_NE(err.find("usage"), std::string::npos) << err;
  EXPECT_EQ(run(std::string("generate --model '") + kModel + "' --prompt x --temp -1", &out, &err), 2);
  EXPECT_NE(err.find("--temp"), std::string::npos) << err;
  EXPECT_EQ(run(std::string("generate --model '") + kModel + "' --prompt x --bogus 1", &out, &err), 2);
  EXPECT_EQ(run(std::string("generate --model '") + kModel + "' --prompt x -n", &out, &err), 2);
  EXPECT_EQ(run(std::string("generate --model '") + kModel + "' --prompt x --kernels nosuch", &out, &err), 2);
  EXPECT_NE(err.find("nosuch"), std::string::npos) << err;
  EXPECT_EQ(run("generate --model /nonexistent.gguf --prompt x", &out, &err), 1);
  EXPECT_NE(err.find("nonexistent"), std::string::npos) << err;
}

} // namespace
