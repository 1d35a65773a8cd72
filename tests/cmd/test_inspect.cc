// tests/cmd/test_inspect.cc: `dserve inspect` prints a GGUF's weight-type mix (on the SmolLM2 model the tests use) and
// each architecture's own fields as the engine reads them (on tiny GGUFs written here).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/models/arch_gguf.h"
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

// A tiny GGUF in a temporary file (removed with this), for inspect to read.
struct TmpGguf {
  std::string path;
  explicit TmpGguf(const std::vector<uint8_t> &bytes) {
    char tmpl[] = "/tmp/dserve_inspect_XXXXXX";
    int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    path = tmpl;
    EXPECT_EQ(write(fd, bytes.data(), bytes.size()), (ssize_t)bytes.size());
    close(fd);
  }
  ~TmpGguf() { unlink(path.c_str()); }
};

std::string inspect(const std::vector<uint8_t> &bytes) {
  TmpGguf f(bytes);
  std::string out, err;
  EXPECT_EQ(run_dserve("inspect '" + f.path + "'", &out, &err), 0) << err;
  return out;
}

void has(const std::string &out, const std::string &line) {
  EXPECT_NE(out.find(line), std::string::npos) << "no '" << line << "' in:\n" << out;
}

TEST(Inspect, PrintsEachArchitecturesOwnFields) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  using namespace dserve_test::arch;
  Spec g = gemma2();
  std::string out = inspect(gguf_bytes(g, make_weights(g, 1), [](dserve_test::GgufWriter &w) {
    w.scalar<uint32_t>("gemma2.attention.sliding_window", MDL_GGUF_U32, 32);
  }));
  has(out, "engine loads it        yes: 2 layers, head dim 16, NeoX RoPE, attention scale 0.25\n");
  has(out, "attention soft-cap     50 (scores s -> cap tanh(s / cap))\n");
  has(out, "final logit soft-cap   30\n");
  has(out, "sliding window         32 tokens on 1 of 2 layers (pattern 2: layer l is local when l % 2 < 1), local RoPE "
           "base 10000\n");
  has(out, "post norms             after attention and after the FFN; embeddings times sqrt(64)\n");
  Spec p = phi3();
  out = inspect(gguf_bytes(p, make_weights(p, 2), [](dserve_test::GgufWriter &w) {
    w.scalar<uint32_t>("phi3.attention.sliding_window", MDL_GGUF_U32, 2047);
    w.scalar<uint32_t>("phi3.rope.scaling.original_context_length", MDL_GGUF_U32, 1024);
    w.scalar<float>("phi3.rope.scaling.attn_factor", MDL_GGUF_F32, 1.25f);
    put_f32(w, "rope_factors_long.weight", {8}, std::vector<float>(8, 2.0f));
    put_f32(w, "rope_factors_short.weight", {8}, std::vector<float>(8, 1.5f));
  }));
  has(out, "fused qkv              2 layers: q, k, v are row ranges of attn_qkv\n");
  has(out, "fused gate/up          gate and up are the halves of ffn_up\n");
  has(out, "sliding window         2047, not applied (as llama.cpp)\n");
  has(out, "rope scaling           linear+long, magnitude 1.25, long factors at the trained context 4096");
  Spec q = qwen3();
  out = inspect(gguf_bytes(q, make_weights(q, 3)));
  has(out, "engine loads it        yes: 2 layers, head dim 32, NeoX RoPE");
  has(out, "q/k norm               per-head RMS norms of q and k before RoPE\n");
  Spec m = qwen3();
  m.arch = "mamba";
  out = inspect(gguf_bytes(m, make_weights(m, 4)));
  has(out, "engine loads it        no: model: architecture 'mamba' not supported (llama, qwen2, ");
}

} // namespace
