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

#include "model_util.h"

extern "C" {
#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "models/tokenizer.h"
}

namespace {

const char *kModel = DSERVE_SOURCE_DIR "/models/weights/gemma-3-270m-q4_k_m.gguf";
const char *kTokGolden = DSERVE_SOURCE_DIR "/tests/models/golden/gemma_tokenizer.json";
const char *kGreedyGolden = DSERVE_SOURCE_DIR "/tests/models/golden/gemma_greedy.json";

#define SKIP_WITHOUT_MODEL()                                                                                    \
  do {                                                                                                          \
    if (access(kModel, R_OK) != 0) GTEST_SKIP() << "missing " << kModel << " (run scripts/fetch_gemma.sh)";    \
  } while (0)

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


// The model on the best cpu backend with 2 threads and an F16 KV cache (for a by-hand look: GEMMA_KERNELS=scalar,
// GEMMA_KV_F32=1, GEMMA_DEBUG=1 prints the compared log-probabilities).
// Gemma on the CPU; GEMMA_KERNELS names the backend and GEMMA_KV_F32 makes the cache F32 (for investigations).
struct Engine : ModelEngine {
  bool open(int n_blocks, krn_type kv_type = KRN_F16) {
    const char *name = getenv("GEMMA_KERNELS");
    const krn_backend *be = name ? krn_cpu_by_name(name) : nullptr;
    if (name && !be) {
      ADD_FAILURE() << "GEMMA_KERNELS=" << name << ": no such cpu backend";
      return false;
    }
    return ModelEngine::open(kModel, n_blocks, be, getenv("GEMMA_KV_F32") ? KRN_F32 : kv_type);
  }
};

int argmax(const std::vector<float> &v) { return (int)(std::max_element(v.begin(), v.end()) - v.begin()); }

std::vector<float> log_softmax(const std::vector<float> &l) {
  double mx = *std::max_element(l.begin(), l.end()), s = 0;
  for (float x : l) s += std::exp((double)x - mx);
  double lse = mx + std::log(s);
  std::vector<float> o(l.size());
  for (size_t i = 0; i < l.size(); i++) o[i] = (float)(l[i] - lse);
  return o;
}

TEST(Gemma, LoadsConfig) {
  SKIP_WITHOUT_MODEL();
  Engine e;
  ASSERT_TRUE(e.open(4));
  EXPECT_STREQ(e.cfg->arch, "gemma3");
  EXPECT_EQ(e.cfg->gemma3, 1);
  EXPECT_EQ(e.cfg->n_layer, 18);
  EXPECT_EQ(e.cfg->n_embd, 640);
  EXPECT_EQ(e.cfg->n_head, 4);
  EXPECT_EQ(e.cfg->n_kv_head, 1);
  EXPECT_EQ(e.cfg->head_dim, 256);
  EXPECT_EQ(e.cfg->n_vocab, 262144);
  EXPECT_EQ(e.cfg->rope_neox, 1);
  EXPECT_EQ(e.cfg->n_swa, 512);
  EXPECT_FLOAT_EQ(e.cfg->rope_theta, 1000000.0f);
  EXPECT_FLOAT_EQ(e.cfg->rope_theta_swa, 10000.0f);
  EXPECT_FLOAT_EQ(e.cfg->attn_scale, 1.0f / 16.0f);
  // llama.cpp's pattern of 6: layers 5, 11, 17 global, the rest local
  for (int l = 0; l < 18; l++) EXPECT_EQ(mdl_llama_layer_window(e.cfg, l), l % 6 == 5 ? 0 : 512) << "layer " << l;
}

// Tolerances. This model is numerically touchy: llama-server's own top-20 log-probabilities move by up to 0.69
// between its -fa on and -fa off on these prompts (its GELU is a table over f16 inputs, its flash attention keeps
// Q and V sums in f16); ours differ from its default by up to 0.89 (measured). kLogprobTol bounds the top-20 of
// the first generated position. A greedy token may differ from llama.cpp's only at a near-tie: llama.cpp's own
// top1 - top2 margin below kTieMargin, and our logit of our choice above its token by less than kLogprobTol (a
// gap between two logits moves by as much as the log-probabilities do: seen 0.52 where llama.cpp's margin was
// 0.008, after the batched matmul kernels changed the summation order); the continuations are no longer
// comparable after it, so that prompt's comparison stops there. Case 3 is the most sensitive: the exact scalar
// reference (double accumulation, no activation quantization) is 0.89 from llama.cpp there, and changes to the avx512
// attention's summation order alone moved ours between 0.83 and 1.06 (the other cases stayed below 0.65): 1.25.
const float kLogprobTol = 1.25f;
const float kTieMargin = 0.5f;

void golden_greedy_and_logprobs(krn_type kv_type) {
  std::string js = slurp(kGreedyGolden);
  cJSON *root = cJSON_Parse(js.c_str());
  ASSERT_NE(root, nullptr) << "cannot parse " << kGreedyGolden;
  Engine e;
  ASSERT_TRUE(e.open(256, kv_type));
  const int V = e.cfg->n_vocab;
  const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
  int ci = 0, n_equal = 0, n_cases = 0;
  float worst = 0;
  cJSON_ArrayForEach(c, cases) {
    std::vector<int32_t> prompt = ints(cJSON_GetObjectItem(c, "prompt")), want = ints(cJSON_GetObjectItem(c, "greedy"));
    std::vector<int32_t> top_ids = ints(cJSON_GetObjectItem(c, "top_ids"));
    std::vector<float> top_lp, margins;
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "top_logprobs")) top_lp.push_back((float)x->valuedouble);
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "greedy_margins")) margins.push_back((float)x->valuedouble);
    ASSERT_EQ(margins.size(), want.size()) << "case " << ci;
    n_cases++;
    int nb = ((int)prompt.size() + (int)want.size() + 16) / 16;
    ASSERT_LE(nb, e.kv.n_blocks);
    std::vector<int32_t> bt(nb);
    for (int i = 0; i < nb; i++) bt[i] = i; // one sequence at a time: the cache is reused
    std::vector<float> logits(V);
    mdl_seq s = {prompt.data(), (int)prompt.size(), 0, bt.data(), nb, 1};
    ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
    std::vector<float> lp = log_softmax(logits);
    float d = 0;
    for (size_t i = 0; i < top_ids.size(); i++) d = std::fmax(d, std::fabs(lp[top_ids[i]] - top_lp[i]));
    if (getenv("GEMMA_DEBUG"))
      for (size_t i = 0; i < top_ids.size(); i++) std::fprintf(stderr, "  id %d: ours %.4f llama.cpp %.4f\n", top_ids[i], lp[top_ids[i]], top_lp[i]);
    worst = std::fmax(worst, d);
    EXPECT_LT(d, kLogprobTol) << "case " << ci << ": first-position log-probabilities differ by " << d;
    int pos = (int)prompt.size(), same = 0;
    bool diverged = false;
    for (size_t i = 0; i < want.size(); i++) {
      int tok = argmax(logits);
      if (tok != want[i]) {
        float ours = logits[tok] - logits[want[i]];
        EXPECT_LT(margins[i], kTieMargin) << "case " << ci << " step " << i << ": llama.cpp chose " << want[i]
                                          << " with margin " << margins[i] << ", we chose " << tok;
        EXPECT_LT(ours, kLogprobTol) << "case " << ci << " step " << i << ": llama.cpp's token " << want[i] << " is "
                                    << ours << " below our choice " << tok;
        std::fprintf(stderr, "gemma case %d: near-tie at step %zu (llama.cpp margin %.3f, ours %.3f)\n", ci, i,
                     margins[i], ours);
        diverged = true;
        break;
      }
      same++;
      if (i + 1 == want.size()) break;
      s = {&want[i], 1, pos++, bt.data(), nb, 1};
      ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
    }
    n_equal += !diverged;
    std::fprintf(stderr, "gemma case %d: %zu prompt tokens, %d/%zu greedy tokens equal, max |logprob diff| %.4f\n", ci,
                 prompt.size(), same, want.size(), d);
    ci++;
  }
  std::fprintf(stderr, "gemma greedy: %d/%d prompts equal over all tokens, worst top-20 |logprob diff| %.4f\n", n_equal,
               n_cases, worst);
  EXPECT_GE(n_cases, 8);
  cJSON_Delete(root);
}

TEST(Gemma, GoldenGreedyAndLogprobsMatchLlamaCpp) {
  SKIP_WITHOUT_MODEL();
  golden_greedy_and_logprobs(KRN_F16);
}

// kv_type q8_0 under the same tolerance policy against llama.cpp's f16-cache goldens.
TEST(Gemma, GoldenWithQ8_0KvCacheWithinTheSameTolerances) {
  SKIP_WITHOUT_MODEL();
  golden_greedy_and_logprobs(KRN_Q8_0);
}

// A prompt past the 512-token window, prefilled in one step, equals the same prompt in chunks of 300 that start
// and end at different places relative to the window and the 16-token blocks, decoded alongside another sequence.
TEST(Gemma, ChunkedPrefillPastTheWindowEqualsOneShot) {
  SKIP_WITHOUT_MODEL();
  std::string js = slurp(kGreedyGolden);
  cJSON *root = cJSON_Parse(js.c_str());
  ASSERT_NE(root, nullptr) << "cannot parse " << kGreedyGolden;
  std::vector<int32_t> prompt;
  const cJSON *c;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
    std::vector<int32_t> p = ints(cJSON_GetObjectItem(c, "prompt"));
    if (p.size() > prompt.size()) prompt = p;
  }
  cJSON_Delete(root);
  ASSERT_GT(prompt.size(), 800u) << "the golden file has no prompt past the window";
  Engine e;
  ASSERT_TRUE(e.open(160));
  const int V = e.cfg->n_vocab, P = (int)prompt.size(), nb = (P + 2 + 15) / 16;
  std::vector<int32_t> bt1(nb), bt2(nb);
  for (int i = 0; i < nb; i++) bt1[i] = i, bt2[i] = nb + (nb - 1 - i); // the second in reverse block order
  std::vector<float> one(V), chunked(2 * (size_t)V);
  mdl_seq s = {prompt.data(), P, 0, bt1.data(), nb, 1};
  ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s, 1, one.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
  int32_t next = argmax(one);
  for (int at = 0; at < P; at += 300) {
    int n = std::min(300, P - at);
    // the last chunk shares its step with a decode token of the first sequence
    mdl_seq ms[2] = {{prompt.data() + at, n, at, bt2.data(), nb, 1}, {&next, 1, P, bt1.data(), nb, 1}};
    int ns = at + n == P ? 2 : 1;
    ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, ms, ns, chunked.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
  }
  float d = 0;
  for (int i = 0; i < V; i++) d = std::fmax(d, std::fabs(one[i] - chunked[i]));
  EXPECT_LT(d, 0.05f) << "chunked prefill past the window differs from one-shot by " << d;
  std::fprintf(stderr, "gemma chunked vs one-shot (%d tokens): max |logit diff| %.5f\n", P, d);
}

// Sliding-window attention: the SIMD backend equals the scalar reference, and a window as wide as the context
// equals no window (a row at pos sees pos - window + 1 .. pos).
TEST(Gemma, WindowedAttentionAndGeluOps) {
  const krn_backend *ref = krn_cpu_scalar(), *best = krn_cpu_best();
  ASSERT_TRUE(ref->geglu && ref->scale && ref->attn_window && best->geglu && best->scale && best->attn_window);
  const int T = 40, H = 2, KH = 1, D = 32, BS = 16, NB = 3;
  std::vector<float> q(T * H * D), k(T * KH * D), v(T * KH * D);
  unsigned r = 7;
  auto rnd = [&] { r = r * 1103515245u + 12345u; return ((r >> 8) & 0xFFFF) / 32768.0f - 1.0f; };
  for (auto *a : {&q, &k, &v})
    for (float &f : *a) f = rnd();
  std::vector<int32_t> seq(T, 0), pos(T), bt = {2, 0, 1};
  for (int i = 0; i < T; i++) pos[i] = i;
  std::vector<float> kc(NB * BS * KH * D), vc(NB * BS * KH * D);
  krn_ctx c{};
  c.be = ref;
  krn_attn_args a{};
  a.n_tokens = T, a.n_head = H, a.n_kv_head = KH, a.head_dim = D, a.block_size = BS;
  a.tok_seq = seq.data(), a.tok_pos = pos.data(), a.block_tables = bt.data(), a.max_blocks = NB;
  a.k_cache = kc.data(), a.v_cache = vc.data(), a.kv_type = KRN_F32, a.scale = 0.2f;
  ref->kv_store(&c, k.data(), v.data(), &a);
  std::vector<float> o_full(q.size()), o_wide(q.size()), o_ref(q.size()), o_simd(q.size());
  ref->paged_attention(&c, o_full.data(), q.data(), &a);
  a.window = T;
  ref->paged_attention(&c, o_wide.data(), q.data(), &a);
  EXPECT_EQ(o_full, o_wide);
  a.window = 7;
  ref->paged_attention(&c, o_ref.data(), q.data(), &a);
  float dw = 0;
  for (size_t i = 0; i < q.size(); i++) dw = std::fmax(dw, std::fabs(o_ref[i] - o_full[i]));
  EXPECT_GT(dw, 1e-3f) << "the window changed nothing";
  for (const char *name : {"avx2", "avx512"}) {
    const krn_backend *be = krn_cpu_by_name(name);
    if (!be) continue; // this CPU lacks it
    for (int w : {7, 16, 17, 33}) { // inside a block, a block exactly, across block edges
      a.window = w;
      ref->paged_attention(&c, o_ref.data(), q.data(), &a);
      krn_ctx cb{};
      cb.be = be;
      std::fill(o_simd.begin(), o_simd.end(), 0.0f);
      be->paged_attention(&cb, o_simd.data(), q.data(), &a);
      float d = 0;
      for (size_t i = 0; i < q.size(); i++) d = std::fmax(d, std::fabs(o_ref[i] - o_simd[i]));
      EXPECT_LT(d, 1e-4f) << name << " vs scalar with window " << w;
    }
  }
  a.window = 7;
  ref->paged_attention(&c, o_ref.data(), q.data(), &a);
  // row 20 by hand: positions 14..20 only
  {
    int t = 20, h = 1;
    std::vector<float> sc, o(D, 0.0f);
    float mx = -1e30f;
    for (int p = 14; p <= 20; p++) {
      float s = 0;
      for (int e2 = 0; e2 < D; e2++) s += q[(t * H + h) * D + e2] * k[p * D + e2];
      sc.push_back(s * 0.2f);
      mx = std::fmax(mx, sc.back());
    }
    float sum = 0;
    for (float &s : sc) sum += (s = std::exp(s - mx));
    for (int p = 14; p <= 20; p++)
      for (int e2 = 0; e2 < D; e2++) o[e2] += sc[p - 14] / sum * v[p * D + e2];
    for (int e2 = 0; e2 < D; e2++) EXPECT_NEAR(o_ref[(t * H + h) * D + e2], o[e2], 1e-4f);
  }
  // geglu: gelu_tanh(g) * u at known points; scale
  float g[4] = {-3.0f, -0.5f, 0.0f, 2.0f}, u[4] = {1.0f, 2.0f, 3.0f, -1.0f}, out[4];
  ref->geglu(&c, out, g, u, 4);
  EXPECT_NEAR(out[0], -0.0036373f * 1.0f, 1e-5f);
  EXPECT_NEAR(out[1], -0.1542860f * 2.0f, 1e-5f);
  EXPECT_NEAR(out[2], 0.0f, 1e-7f);
  EXPECT_NEAR(out[3], 1.9545977f * -1.0f, 1e-5f);
  float xs[3] = {1.0f, -2.0f, 0.5f};
  ref->scale(&c, xs, 4.0f, 3);
  EXPECT_EQ(xs[0], 4.0f);
  EXPECT_EQ(xs[1], -8.0f);
  EXPECT_EQ(xs[2], 2.0f);
}

} // namespace
