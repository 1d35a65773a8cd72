// tests/cmd/test_perplexity.cc: `dserve perplexity` on tiny GGUFs of its own: uniform logits give PPL = vocabulary
// size, a run's saved logits give KL 0 against itself, and every bad argument or file gets a message and an exit code.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tests/models/gguf_writer.h"
#include "tests/run_dserve.h"

extern "C" {
#include "kernels/krn.h"
}

namespace {

using cmdtest::run_dserve;
using dserve_test::byte_char;
using dserve_test::GgufWriter;

const int kVocab = 257; // the 256 bytes, then <|endoftext|>

// A 2-layer llama of F32 weights (random, well scaled) over a byte vocabulary; zero_output: an untied output
// projection of zeros, so every logit is 0 and every prediction uniform.
// n_vocab: tokens in the vocabulary (the extras are user-defined tokens "<extra_N>"); n_rows: rows of the embedding
// (n_vocab when -1).
std::vector<uint8_t> tiny_model(bool zero_output, bool add_bos, int n_vocab = kVocab, int n_rows = -1, bool f16 = false) {
  if (n_rows < 0) n_rows = n_vocab;
  const int E = 64, F = 128, L = 2, H = 2, KVH = 1, HD = E / H;
  GgufWriter w;
  w.str("general.architecture", "llama");
  w.scalar<uint32_t>("llama.block_count", MDL_GGUF_U32, L);
  w.scalar<uint32_t>("llama.embedding_length", MDL_GGUF_U32, E);
  w.scalar<uint32_t>("llama.feed_forward_length", MDL_GGUF_U32, F);
  w.scalar<uint32_t>("llama.attention.head_count", MDL_GGUF_U32, H);
  w.scalar<uint32_t>("llama.attention.head_count_kv", MDL_GGUF_U32, KVH);
  w.scalar<uint32_t>("llama.context_length", MDL_GGUF_U32, 256);
  w.scalar<float>("llama.attention.layer_norm_rms_epsilon", MDL_GGUF_F32, 1e-5f);
  w.scalar<float>("llama.rope.freq_base", MDL_GGUF_F32, 10000.0f);
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; b++) tokens.push_back(byte_char(b));
  tokens.push_back("<|endoftext|>");
  std::vector<int32_t> types(256, 1);
  types.push_back(3); // control
  while ((int)tokens.size() < n_vocab) {
    tokens.push_back("<extra_" + std::to_string(tokens.size()) + ">");
    types.push_back(4);
  }
  w.str("tokenizer.ggml.model", "gpt2");
  w.str("tokenizer.ggml.pre", "smollm");
  w.arr_str("tokenizer.ggml.tokens", tokens);
  w.arr<int32_t>("tokenizer.ggml.token_type", MDL_GGUF_I32, types);
  w.arr_str("tokenizer.ggml.merges", {});
  w.scalar<uint32_t>("tokenizer.ggml.eos_token_id", MDL_GGUF_U32, 256);
  w.scalar<uint32_t>("tokenizer.ggml.bos_token_id", MDL_GGUF_U32, 256);
  w.scalar<uint8_t>("tokenizer.ggml.add_bos_token", MDL_GGUF_BOOL, add_bos ? 1 : 0);
  std::mt19937 rng(5);
  auto f32 = [&](const std::string &name, std::vector<int64_t> ne, float lo, float hi) {
    size_t n = 1;
    for (auto d : ne) n *= (size_t)d;
    w.tensor(name, ne, 0 /* F32 */, n * 4);
    std::uniform_real_distribution<float> u(lo, hi);
    for (size_t i = 0; i < n; i++) {
      float x = lo == hi ? lo : u(rng);
      memcpy(&w.tensors.back().data[i * 4], &x, 4);
    }
  };
  auto mat = [&](const std::string &name, std::vector<int64_t> ne, float lo, float hi) { // f16: the matrices in F16
    if (!f16) return f32(name, ne, lo, hi);
    size_t n = (size_t)(ne[0] * ne[1]);
    w.tensor(name, ne, 1 /* F16 */, n * 2);
    std::uniform_real_distribution<float> u(lo, hi);
    for (size_t i = 0; i < n; i++) {
      krn_f16 h = krn_f32_to_f16(u(rng));
      memcpy(&w.tensors.back().data[i * 2], &h, 2);
    }
  };
  mat("token_embd.weight", {E, n_rows}, -0.2f, 0.2f); // tied: logits of a few nats, not hundreds
  f32("output_norm.weight", {E}, 0.8f, 1.2f);
  if (zero_output) f32("output.weight", {E, n_rows}, 0, 0);
  for (int l = 0; l < L; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    f32(p + "attn_norm.weight", {E}, 0.8f, 1.2f);
    mat(p + "attn_q.weight", {E, E}, -0.2f, 0.2f);
    mat(p + "attn_k.weight", {E, KVH * HD}, -0.2f, 0.2f);
    mat(p + "attn_v.weight", {E, KVH * HD}, -0.2f, 0.2f);
    mat(p + "attn_output.weight", {E, E}, -0.1f, 0.1f);
    f32(p + "ffn_norm.weight", {E}, 0.8f, 1.2f);
    mat(p + "ffn_gate.weight", {E, F}, -0.2f, 0.2f);
    mat(p + "ffn_up.weight", {E, F}, -0.2f, 0.2f);
    mat(p + "ffn_down.weight", {F, E}, -0.1f, 0.1f);
  }
  return w.bytes();
}

struct Tmp { // a temporary directory with the files a test writes, removed after
  std::string dir;
  Tmp() {
    char d[] = "/tmp/dserve_ppl_cmd_XXXXXX";
    dir = mkdtemp(d) ? d : "";
  }
  ~Tmp() {
    if (!dir.empty()) (void)!system(("rm -rf '" + dir + "'").c_str());
  }
  std::string write(const std::string &name, const void *p, size_t n) const {
    std::string path = dir + "/" + name;
    FILE *f = fopen(path.c_str(), "wb");
    if (f) {
      fwrite(p, 1, n, f);
      fclose(f);
    }
    return path;
  }
  std::string write(const std::string &name, const std::vector<uint8_t> &b) const { return write(name, b.data(), b.size()); }
  std::string write(const std::string &name, const std::string &s) const { return write(name, s.data(), s.size()); }
};

// Real English text of n bytes (a line of this file's own comment, repeated), ending in a newline.
std::string text(size_t n) {
  const std::string line = "Every bad argument or file gets a message and an exit code, never a crash or a hang.\n";
  std::string s;
  while (s.size() < n) s += line;
  s.resize(n - 1);
  return s + "\n";
}

// The number after `key` in s (NAN when absent).
double figure(const std::string &s, const std::string &key) {
  size_t at = s.find(key);
  return at == std::string::npos ? NAN : std::strtod(s.c_str() + at + key.size(), nullptr);
}

TEST(Perplexity, UniformLogitsGivePplOfTheVocabularySize) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  Tmp t;
  std::string m = t.write("uniform.gguf", tiny_model(true, false)), f = t.write("text.txt", text(201));
  std::string out, err;
  // 200 byte tokens (the trailing newline dropped, as llama-perplexity's -f drops it): 6 chunks of 32
  ASSERT_EQ(run_dserve("perplexity --model " + m + " --file " + f + " --ctx 32 --threads 2", &out, &err), 0) << err;
  EXPECT_NE(err.find("200 tokens"), std::string::npos) << err;
  EXPECT_NE(err.find("6 chunks of 32 tokens, scoring 15 per chunk"), std::string::npos) << err;
  EXPECT_NE(out.find("[6]257.0000,"), std::string::npos) << out;
  EXPECT_NE(out.find("Final estimate: PPL = 257.0000 +/- 0.00000"), std::string::npos) << out;
  // --chunks bounds them; with add_bos_token the BOS counts as a token
  std::string mb = t.write("uniform_bos.gguf", tiny_model(true, true));
  ASSERT_EQ(run_dserve("perplexity --model " + mb + " --file " + f + " --ctx 32 --chunks 2 --threads 1", &out, &err), 0)
      << err;
  EXPECT_NE(err.find("201 tokens"), std::string::npos) << err;
  EXPECT_NE(err.find("2 chunks of 32"), std::string::npos) << err;
  EXPECT_EQ(out.find("[3]"), std::string::npos) << out;
  EXPECT_NEAR(figure(out, "PPL = "), 257, 1e-3) << out;
}

TEST(Perplexity, SavedLogitsAreABaseWithKlZeroAgainstTheSameRun) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  Tmp t;
  std::string m = t.write("tiny.gguf", tiny_model(false, true)), f = t.write("text.txt", text(300));
  std::string base = t.dir + "/base.kld", out, err;
  ASSERT_EQ(run_dserve("perplexity --model " + m + " --file " + f + " --ctx 64 --kernels scalar --threads 2 "
                       "--save-logits " + base, &out, &err), 0) << err;
  double ppl = figure(out, "PPL = ");
  EXPECT_GT(ppl, 1);
  EXPECT_LT(ppl, kVocab * 4); // a random model: anything finite, but not uniform by accident
  EXPECT_NE(std::fabs(ppl - kVocab), 0);
  // 4 chunks (300 tokens with BOS, less the newline: 300 / 64) of 31 rows of 257 (+1 pad, +4) u16
  FILE *bf = fopen(base.c_str(), "rb");
  ASSERT_NE(bf, nullptr);
  fseek(bf, 0, SEEK_END);
  EXPECT_EQ(ftell(bf), 20 + 4 * 4 * 64 + 4 * 31 * 262 * 2);
  fclose(bf);
  for (const char *k : {"scalar", "auto"}) { // the same numbers on every backend (F32 weights)
    ASSERT_EQ(run_dserve("perplexity --model " + m + " --file " + f + " --kl-base " + base + " --threads 2 --kernels " + k,
                         &out, &err), 0) << err;
    EXPECT_NE(out.find("tokens: the first 256 tokens of " + f + " agree with the base file"), std::string::npos) << out;
    EXPECT_NEAR(figure(out, "PPL = "), ppl, ppl * 1e-4) << out;
    EXPECT_NEAR(figure(out, "Mean PPL(Q)/PPL(base)         : "), 1, 1e-3) << out;
    EXPECT_NEAR(figure(out, "Mean    KLD: "), 0, 1e-5) << out;
    EXPECT_LT(figure(out, "Maximum KLD: "), 1e-4) << out;
    EXPECT_NEAR(figure(out, "Same top p: "), 100, 1e-9) << out;
  }
  // the base holds its tokens: --file may be left out; a different text is scored on the base's tokens, and said so
  ASSERT_EQ(run_dserve("perplexity --model " + m + " --kl-base " + base + " --chunks 2 --threads 2", &out, &err), 0)
      << err;
  EXPECT_NE(err.find("2 chunks of 64"), std::string::npos) << err;
  EXPECT_EQ(out.find("tokens:"), std::string::npos) << out;
  std::string other = t.write("other.txt", "Something else entirely. " + text(300));
  ASSERT_EQ(run_dserve("perplexity --model " + m + " --kl-base " + base + " --file " + other + " --threads 2", &out, &err),
            0) << err;
  EXPECT_NE(out.find("differ from the base file, the first at position 1"), std::string::npos) << out;
  EXPECT_NEAR(figure(out, "Mean    KLD: "), 0, 1e-5) << out;
}

// --f32-weights: F16 matrices dequantized at load. On the scalar kernels (which multiply every weight type's scalar
// dequantization in double) the figures are the file's to the last digit; on the best kernels (F16 dot products
// there, F32 ones with the flag) within float rounding. --f32-kv changes only the KV cache's rounding.
TEST(Perplexity, F32WeightsAndKvScoreAsTheFile) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  Tmp t;
  std::string m = t.write("tiny16.gguf", tiny_model(false, true, kVocab, -1, true)), f = t.write("text.txt", text(300));
  std::string out, err, base = t.dir + "/base.kld";
  auto ppl = [&](const std::string &args) {
    EXPECT_EQ(run_dserve("perplexity --model " + m + " --file " + f + " --ctx 64 --threads 2 " + args, &out, &err), 0)
        << args << ": " << err;
    return figure(out, "PPL = ");
  };
  double file = ppl("--kernels scalar");
  EXPECT_NE(err.find("the file's weights, F16 KV"), std::string::npos) << err;
  EXPECT_EQ(ppl("--kernels scalar --f32-weights"), file);
  EXPECT_NE(err.find("F32 weights, F16 KV"), std::string::npos) << err;
  double kv32 = ppl("--kernels scalar --f32-weights --f32-kv --save-logits " + base);
  EXPECT_NE(err.find("F32 weights, F32 KV"), std::string::npos) << err;
  EXPECT_NEAR(kv32, file, file * 1e-3);
  for (const char *flags : {"", "--f32-weights"}) { // against the exact reference, as bench/accuracy.sh does
    ASSERT_EQ(run_dserve("perplexity --model " + m + " --kl-base " + base + " --threads 2 --kernels auto " + flags,
                         &out, &err), 0) << err;
    EXPECT_NEAR(figure(out, "PPL = "), kv32, kv32 * 1e-3) << flags;
    EXPECT_LT(figure(out, "Mean    KLD: "), 1e-5) << flags << out;
  }
}

TEST(Perplexity, BadArgumentsAndFilesGetAMessage) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  Tmp t;
  std::string m = t.write("tiny.gguf", tiny_model(false, false)), f = t.write("text.txt", text(300));
  std::string out, err;
  auto fails = [&](const std::string &args, int code, const std::string &says) {
    EXPECT_EQ(run_dserve("perplexity " + args, &out, &err), code) << args << ": " << err;
    EXPECT_NE(err.find(says), std::string::npos) << args << ": " << err;
  };
  fails("", 2, "--model is required");
  fails("--model " + m, 2, "--file is required");
  fails("--model " + m + " --file " + f + " --ctx 3", 2, "bad value '3' for --ctx");
  fails("--model " + m + " --file " + f + " --chunks 0", 2, "--chunks");
  fails("--model " + m + " --file " + f + " --bogus 1", 2, "unknown option --bogus");
  fails("--model " + m + " --file", 2, "--file needs a value");
  fails("--model " + m + " --file " + f + " --kernels nosuch", 2, "nosuch");
  fails("--model " + m + " --kl-base x --save-logits y", 2, "do not go together");
  fails("--model " + m + " --file " + f + " --f32-weights=1 --ctx 32", 2, "unknown option --f32-weights=1");
  fails("--model " + m + " --file " + f + " --f32-kv f16 --ctx 32", 2, "unknown option f16");
  fails("--model /nonexistent.gguf --file " + f, 1, "nonexistent");
  fails("--model " + m + " --file /nonexistent.txt", 1, "/nonexistent.txt");
  fails("--model " + m + " --file " + f + " --ctx 256", 1, "a context of 256 needs at least 512");
  fails("--model " + m + " --kl-base " + f, 1, "not a llama-perplexity logits file");
  // a base made with another context, or another vocabulary
  std::string base = t.dir + "/base.kld";
  ASSERT_EQ(run_dserve("perplexity --model " + m + " --file " + f + " --ctx 32 --chunks 1 --save-logits " + base, &out,
                       &err), 0) << err;
  fails("--model " + m + " --kl-base " + base + " --ctx 64", 1, "was made with 32");
  std::string m258 = t.write("tiny258.gguf", tiny_model(false, false, 258));
  fails("--model " + m258 + " --kl-base " + base, 1, "has a vocabulary of 257, the model 258");
  std::vector<uint8_t> b;
  if (FILE *bf = fopen(base.c_str(), "rb")) {
    int c;
    while ((c = fgetc(bf)) != EOF) b.push_back((uint8_t)c);
    fclose(bf);
  }
  ASSERT_GT(b.size(), 20u);
  b.resize(b.size() - 2);
  fails("--model " + m + " --kl-base " + t.write("cut.kld", b), 1, "its header"); // a cut file
  // a vocabulary longer than the model's logits, and a text that uses the token past them
  std::string mshort = t.write("short.gguf", tiny_model(false, false, 258, 257));
  std::string ft = t.write("extra.txt", text(100) + "<extra_257>" + text(100));
  fails("--model " + mshort + " --file " + ft + " --ctx 16", 1, "token 100 is 257, but the model has 257 logits");
  // a write that fails leaves no half-made base behind
  fails("--model " + m + " --file " + f + " --ctx 32 --save-logits /nonexistent/dir/x.kld", 1, "/nonexistent/dir/x.kld");
  // help
  EXPECT_EQ(run_dserve("perplexity --help", &out, &err), 0);
  EXPECT_NE(out.find("--kl-base"), std::string::npos) << out;
}

} // namespace
