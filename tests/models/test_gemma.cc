// tests/models/test_gemma.cc: Gemma 3 270M (SentencePiece tokenizer, gemma3 forward pass) against llama.cpp goldens
// from scripts/golden/make_gemma_golden.py; skipped, naming the file, when the GGUF is absent (scripts/fetch_gemma.sh).
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

extern "C" {
#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "models/tokenizer.h"
}

namespace {

const char *kModel = DSERVE_SOURCE_DIR "/models/weights/gemma-3-270m-q4_k_m.gguf";
const char *kTokGolden = DSERVE_SOURCE_DIR "/tests/models/golden/gemma_tokenizer.json";
[[maybe_unused]] const char *kGreedyGolden = DSERVE_SOURCE_DIR "/tests/models/golden/gemma_greedy.json";

#define SKIP_WITHOUT_MODEL()                                                                                    \
  do {                                                                                                          \
    if (access(kModel, R_OK) != 0) GTEST_SKIP() << "missing " << kModel << " (run scripts/fetch_gemma.sh)";    \
  } while (0)

std::string slurp(const char *path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string b64decode(const std::string &in) {
  static const std::string abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    size_t p = abc.find(c);
    if (p == std::string::npos) break;
    val = (val << 6) + (int)p;
    bits += 6;
    if (bits >= 0) {
      out.push_back((char)((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

bool valid_utf8(const std::string &s) {
  size_t i = 0, n = s.size();
  const unsigned char *b = (const unsigned char *)s.data();
  while (i < n) {
    unsigned c = b[i];
    int len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (!len || i + len > n) return false;
    for (int k = 1; k < len; k++)
      if ((b[i + k] & 0xC0) != 0x80) return false;
    if ((c == 0xE0 && b[i + 1] < 0xA0) || (c == 0xED && b[i + 1] > 0x9F) || (c == 0xF0 && b[i + 1] < 0x90) ||
        (c == 0xF4 && b[i + 1] > 0x8F))
      return false;
    i += len;
  }
  return true;
}

std::vector<int32_t> ints(const cJSON *a) {
  std::vector<int32_t> v;
  const cJSON *x;
  cJSON_ArrayForEach(x, a) v.push_back((int32_t)x->valuedouble);
  return v;
}

struct Tok {
  mdl_gguf *g = nullptr;
  mdl_tok *t = nullptr;
  char err[512] = {0};
  bool open() {
    if (mdl_gguf_open(kModel, &g, err, sizeof err) != 0 || mdl_tok_load(g, &t, err, sizeof err) != 0) {
      ADD_FAILURE() << err;
      return false;
    }
    return true;
  }
  ~Tok() {
    mdl_tok_free(t);
    mdl_gguf_close(g);
  }
  std::vector<int32_t> enc(const std::string &s, bool special) {
    int32_t *ids = nullptr;
    size_t n = 0;
    EXPECT_EQ(mdl_tok_encode(t, s.data(), s.size(), special, &ids, &n, err, sizeof err), 0) << err;
    std::vector<int32_t> v(ids, ids + n);
    free(ids);
    return v;
  }
  std::string dec(const std::vector<int32_t> &ids) {
    char *text = nullptr;
    size_t len = 0;
    EXPECT_EQ(mdl_tok_decode(t, ids.data(), ids.size(), &text, &len, err, sizeof err), 0) << err;
    std::string s(text ? text : "", len);
    free(text);
    return s;
  }
};

TEST(Gemma, TokenizerMetadata) {
  SKIP_WITHOUT_MODEL();
  Tok k;
  ASSERT_TRUE(k.open());
  EXPECT_EQ(mdl_tok_n_vocab(k.t), 262144);
  EXPECT_EQ(mdl_tok_bos(k.t), 2);
  EXPECT_EQ(mdl_tok_eos(k.t), 1);
  EXPECT_EQ(mdl_tok_add_bos(k.t), 1);
  EXPECT_TRUE(mdl_tok_is_eog(k.t, 1));
  int32_t eot = mdl_tok_find(k.t, "<end_of_turn>");
  ASSERT_GE(eot, 0);
  EXPECT_TRUE(mdl_tok_is_eog(k.t, eot));
  EXPECT_FALSE(mdl_tok_is_eog(k.t, mdl_tok_find(k.t, "<start_of_turn>")));
}

TEST(Gemma, TokenizerMatchesLlamaCpp) {
  SKIP_WITHOUT_MODEL();
  std::string js = slurp(kTokGolden);
  cJSON *root = cJSON_Parse(js.c_str());
  ASSERT_NE(root, nullptr) << "cannot parse " << kTokGolden;
  Tok k;
  ASSERT_TRUE(k.open());
  const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
  int n = 0, equal = 0, roundtrip = 0;
  cJSON_ArrayForEach(c, cases) {
    std::string text = b64decode(cJSON_GetObjectItem(c, "text_b64")->valuestring);
    bool special = cJSON_IsTrue(cJSON_GetObjectItem(c, "special"));
    std::vector<int32_t> want = ints(cJSON_GetObjectItem(c, "ids")), got = k.enc(text, special);
    n++;
    equal += got == want;
    EXPECT_EQ(got, want) << "text '" << text << "' (special " << special << ")";
    // SentencePiece is lossless on valid UTF-8 (rare characters come back through their byte tokens); invalid bytes
    // come back too, but a space swallowed into a stray lead byte's 4-byte character stays U+2581, as in llama.cpp
    if (k.dec(got) == text) roundtrip++;
    else if (!special && valid_utf8(text)) ADD_FAILURE() << "decode(encode(x)) != x for '" << text << "'";
  }
  std::fprintf(stderr, "gemma tokenizer: %d/%d cases equal to llama.cpp, %d round-trip\n", equal, n, roundtrip);
  EXPECT_GE(n, 60);
  cJSON_Delete(root);
}

TEST(Gemma, TokenizerByteFallbackAndSpaces) {
  SKIP_WITHOUT_MODEL();
  Tok k;
  ASSERT_TRUE(k.open());
  // an invalid byte has no character token: it is its <0xFF> byte token, and decodes back to the byte
  std::vector<int32_t> ids = k.enc("\xff", false);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids[0], mdl_tok_find(k.t, "<0xFF>"));
  EXPECT_EQ(mdl_tok_type(k.t, ids[0]), MDL_TOK_BYTE);
  EXPECT_EQ(k.dec(ids), "\xff");
  // spaces are U+2581 inside tokens and spaces again in pieces
  ids = k.enc(" hello", false);
  ASSERT_EQ(ids.size(), 1u);
  char buf[16];
  ASSERT_EQ(mdl_tok_piece(k.t, ids[0], buf, sizeof buf), 6u);
  EXPECT_EQ(std::string(buf, 6), " hello");
  // control tokens are text unless parse_special
  EXPECT_EQ(k.enc("<end_of_turn>", true), std::vector<int32_t>{mdl_tok_find(k.t, "<end_of_turn>")});
  EXPECT_GT(k.enc("<end_of_turn>", false).size(), 1u);
}

} // namespace
