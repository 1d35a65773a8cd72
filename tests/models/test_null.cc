// tests/models/test_null.cc: the null model: its GGUF and vocabulary, deterministic logits, the step's time (on a fake
// clock), its refusals.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <time.h>
#include <vector>

extern "C" {
#include "kernels/krn.h"
#include "models/llama.h"
#include "models/null.h"
#include "models/sampler.h"
#include "models/tokenizer.h"
}

namespace {

const mdl_null_opts kOpts = {20.0, 50.0, 36864};

// The null model loaded as a worker loads it (the GGUF with options, then mdl_llama_load).
struct Null {
  mdl_gguf *g = nullptr;
  mdl_llama *m = nullptr;
  krn_ctx kc{};
  char err[256] = "";
  explicit Null(const mdl_null_opts &o = kOpts) {
    kc.be = krn_cpu_by_name("scalar");
    if (mdl_null_gguf(&o, &g, err, sizeof err) == 0 && mdl_llama_load(g, &kc, &m, err, sizeof err) != 0) m = nullptr;
  }
  ~Null() {
    mdl_llama_free(m);
    mdl_gguf_close(g);
  }
  int n_vocab() const { return mdl_llama_config(m)->n_vocab; }
};

// A fake clock: now is what the test says; a sleep records its deadline and moves now there.
struct FakeClock {
  int64_t now = 1000000;
  std::vector<int64_t> sleeps;
  std::vector<int> layers_done_at; // index into sleeps when each layer callback ran
  static int64_t now_us(void *a) { return static_cast<FakeClock *>(a)->now; }
  static void sleep_until(void *a, int64_t t) {
    auto *c = static_cast<FakeClock *>(a);
    c->sleeps.push_back(t);
    if (t > c->now) c->now = t;
  }
  static void on_layer(void *a, int layer) {
    auto *c = static_cast<FakeClock *>(a);
    EXPECT_EQ(layer, (int)c->layers_done_at.size());
    c->layers_done_at.push_back((int)c->sleeps.size());
  }
  mdl_null_clock clock() { return {now_us, sleep_until, this}; }
};

std::vector<int32_t> encode(const mdl_tok *t, const std::string &s) {
  int32_t *ids = nullptr;
  size_t n = 0;
  char err[128];
  EXPECT_EQ(mdl_tok_encode(t, s.data(), s.size(), 1, &ids, &n, err, sizeof err), 0) << err;
  std::vector<int32_t> v(ids, ids + n);
  free(ids);
  return v;
}

TEST(NullModel, VocabularyRoundTripsAnyText) {
  mdl_gguf *g = nullptr;
  mdl_tok *t = nullptr;
  char err[256];
  ASSERT_EQ(mdl_null_gguf(nullptr, &g, err, sizeof err), 0) << err; // a router's: the vocabulary only
  ASSERT_EQ(mdl_tok_load(g, &t, err, sizeof err), 0) << err;
  mdl_str arch;
  ASSERT_EQ(mdl_gguf_get_str(g, "general.architecture", &arch), 0);
  EXPECT_TRUE(mdl_str_eq(arch, "null"));
  for (std::string s : {" bako dule", "Hello, World!\n{\"a\": 1}", "caf\xc3\xa9 \xe2\x82\xac 42", " gusi gusi", ""}) {
    std::vector<int32_t> ids = encode(t, s);
    char *text = nullptr;
    size_t len = 0;
    ASSERT_EQ(mdl_tok_decode(t, ids.data(), ids.size(), &text, &len, err, sizeof err), 0) << err;
    EXPECT_EQ(std::string(text, len), s);
    free(text);
  }
  EXPECT_EQ(encode(t, " togo guse").size(), 2u); // a word is one token (two generated ones)
  std::vector<int32_t> chat = encode(t, "<|im_start|>user\nhi<|im_end|>");
  EXPECT_TRUE(mdl_tok_is_control(t, chat.front()));
  EXPECT_TRUE(mdl_tok_is_eog(t, chat.back())); // ChatML's end of turn ends a generation
  mdl_tok_free(t);
  mdl_gguf_close(g);
}

TEST(NullModel, LogitsDependOnPositionAndTokenOnlyAndGreedyPicksWords) {
  Null a, b;
  ASSERT_NE(a.m, nullptr) << a.err;
  ASSERT_NE(b.m, nullptr) << b.err;
  int V = a.n_vocab();
  FakeClock ca, cb;
  mdl_null_clock k1 = ca.clock(), k2 = cb.clock();
  char err[256];
  ASSERT_EQ(mdl_null_set_clock(a.m, &k1, err, sizeof err), 0);
  ASSERT_EQ(mdl_null_set_clock(b.m, &k2, err, sizeof err), 0);
  // a: one prompt of 5 tokens with logits of every row; b: the same tokens one decode step at a time, beside another
  // sequence: row i of a equals b's step at position i (batch-invariant, as drafts need)
  std::vector<int32_t> toks = {400, 401, 402, 1000, 7};
  std::vector<float> all(toks.size() * V), one(2 * V);
  mdl_seq q{toks.data(), (int)toks.size(), 0, nullptr, 0, 1};
  ASSERT_EQ(mdl_llama_forward_all(a.m, nullptr, &q, all.data(), err, sizeof err), 0) << err;
  int32_t other = 999;
  for (size_t i = 0; i < toks.size(); i++) {
    mdl_seq s[2] = {{&other, 1, 77, nullptr, 0, 1}, {&toks[i], 1, (int)i, nullptr, 0, 1}};
    ASSERT_EQ(mdl_llama_forward(b.m, nullptr, s, 2, one.data(), nullptr, nullptr, err, sizeof err), 0) << err;
    EXPECT_EQ(0, memcmp(one.data() + V, all.data() + i * V, V * sizeof(float))) << "row " << i;
  }
  // a different token or position gives different logits; greedy picks a word (a normal token), never the end
  EXPECT_NE(mdl_null_logit(a.m, 3, 400, 700), mdl_null_logit(a.m, 3, 401, 700));
  EXPECT_NE(mdl_null_logit(a.m, 3, 400, 700), mdl_null_logit(a.m, 4, 400, 700));
  mdl_gguf *g = a.g;
  mdl_tok *t = nullptr;
  ASSERT_EQ(mdl_tok_load(g, &t, err, sizeof err), 0) << err;
  int best = mdl_argmax(all.data(), V);
  char piece[32];
  size_t n = mdl_tok_piece(t, best, piece, sizeof piece);
  EXPECT_EQ(mdl_tok_type(t, best), MDL_TOK_NORMAL);
  EXPECT_EQ(piece[0], ' ');
  EXPECT_GE(n, 5u);
  EXPECT_FALSE(mdl_tok_is_eog(t, best));
  mdl_tok_free(t);
}

TEST(NullModel, SameSeedSameTokensOtherSeedOtherTokens) {
  Null a;
  ASSERT_NE(a.m, nullptr) << a.err;
  int V = a.n_vocab();
  FakeClock c;
  mdl_null_clock k = c.clock();
  char err[256];
  ASSERT_EQ(mdl_null_set_clock(a.m, &k, err, sizeof err), 0);
  auto run = [&](uint64_t seed) {
    mdl_sampling sp{};
    sp.temperature = 1.0f;
    sp.top_p = 1.0f;
    sp.repetition_penalty = 1.0f;
    sp.seed = seed;
    sp.no_logprob = 1;
    int32_t tok = 450;
    mdl_sampler *s = nullptr;
    EXPECT_EQ(mdl_sampler_new(&sp, V, &tok, 1, &s, err, sizeof err), 0) << err;
    std::vector<int32_t> out;
    std::vector<float> lg(V);
    for (int pos = 0; pos < 24; pos++) {
      mdl_seq q{&tok, 1, pos, nullptr, 0, 1};
      EXPECT_EQ(mdl_llama_forward(a.m, nullptr, &q, 1, lg.data(), nullptr, nullptr, err, sizeof err), 0) << err;
      mdl_sampled sd;
      mdl_sampler_sample(s, lg.data(), &sd);
      out.push_back(tok = sd.token);
    }
    mdl_sampler_free(s);
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(NullModel, AStepTakesStepMsWhateverTheBatchPlusPromptTokens) {
  Null a;
  ASSERT_NE(a.m, nullptr) << a.err;
  int V = a.n_vocab(), L = mdl_llama_config(a.m)->n_layer;
  ASSERT_EQ(L, MDL_NULL_LAYERS);
  char err[256];
  for (int n : {1, 7, 256}) { // decode rows: 20 ms whatever the batch
    FakeClock c;
    mdl_null_clock k = c.clock();
    ASSERT_EQ(mdl_null_set_clock(a.m, &k, err, sizeof err), 0);
    std::vector<int32_t> toks(n, 500);
    std::vector<mdl_seq> s(n);
    for (int i = 0; i < n; i++) s[i] = {&toks[i], 1, 10 + i, nullptr, 0, 1};
    std::vector<float> lg((size_t)n * V);
    int64_t t0 = c.now;
    ASSERT_EQ(mdl_llama_forward(a.m, nullptr, s.data(), n, lg.data(), FakeClock::on_layer, &c, err, sizeof err), 0);
    EXPECT_EQ(mdl_null_step_us(a.m, s.data(), n), 20000);
    ASSERT_EQ((int)c.sleeps.size(), L);
    EXPECT_EQ(c.sleeps.back(), t0 + 20000) << n;
    for (int l = 0; l < L; l++) { // each layer is done at its share of the step, after its wait
      EXPECT_EQ(c.sleeps[l], t0 + 20000 * (l + 1) / L);
      EXPECT_EQ(c.layers_done_at[l], l + 1);
    }
  }
  // a prompt chunk of 100 tokens and a decode row: 20 ms + 99 x 50 us
  FakeClock c;
  mdl_null_clock k = c.clock();
  ASSERT_EQ(mdl_null_set_clock(a.m, &k, err, sizeof err), 0);
  std::vector<int32_t> p(100, 600);
  int32_t d = 601;
  mdl_seq s[2] = {{p.data(), 100, 0, nullptr, 0, 0}, {&d, 1, 5, nullptr, 0, 1}};
  std::vector<float> lg(2 * V);
  int64_t t0 = c.now;
  ASSERT_EQ(mdl_llama_forward(a.m, nullptr, s, 2, lg.data(), nullptr, nullptr, err, sizeof err), 0);
  EXPECT_EQ(c.sleeps.back(), t0 + 20000 + 99 * 50);
}

TEST(NullModel, TheRealClockWaitsAtLeastTheStep) {
  Null a(mdl_null_opts{3.0, 0.0, 36864});
  ASSERT_NE(a.m, nullptr) << a.err;
  std::vector<float> lg(a.n_vocab());
  int32_t t = 500;
  mdl_seq q{&t, 1, 0, nullptr, 0, 1};
  char err[256];
  timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ(mdl_llama_forward(a.m, nullptr, &q, 1, lg.data(), nullptr, nullptr, err, sizeof err), 0) << err;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  EXPECT_GE((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec), 3000000L); // a lower bound only
}

TEST(NullModel, KvGeometryGivesTheBytesPerToken) {
  for (long b : {36864L, 1024L, 8192L}) {
    Null a(mdl_null_opts{1.0, 0.0, b});
    ASSERT_NE(a.m, nullptr) << a.err;
    EXPECT_EQ(mdl_kv_block_bytes(mdl_llama_config(a.m), KRN_F16, 16), (size_t)b * 16);
    char err[128];
    EXPECT_EQ(mdl_kv_type_check(mdl_llama_config(a.m), nullptr, KRN_Q8_0, err, sizeof err), 0) << err;
  }
}

TEST(NullModel, BadOptionsAndMissingKeysAreRefused) {
  mdl_gguf *g = nullptr;
  char err[256];
  mdl_null_opts odd{20, 50, 1000};
  EXPECT_NE(mdl_null_gguf(&odd, &g, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("null_kv_bytes_per_token"), std::string::npos) << err;
  mdl_null_opts neg{-1, 50, 36864};
  EXPECT_NE(mdl_null_gguf(&neg, &g, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("null_step_ms"), std::string::npos) << err;
  // a router's GGUF (no options) has the vocabulary but no step: loading it as a model says what is missing
  ASSERT_EQ(mdl_null_gguf(nullptr, &g, err, sizeof err), 0) << err;
  krn_ctx kc{};
  kc.be = krn_cpu_by_name("scalar");
  mdl_llama *m = nullptr;
  EXPECT_NE(mdl_llama_load(g, &kc, &m, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("null."), std::string::npos) << err;
  mdl_gguf_close(g);
  // a path that fails to open is that error, never the null model
  EXPECT_NE(mdl_model_open("/no/such/model.gguf", &kOpts, &g, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("/no/such/model.gguf"), std::string::npos) << err;
  EXPECT_NE(mdl_model_open("./null", &kOpts, &g, err, sizeof err), 0);
  ASSERT_EQ(mdl_model_open("null", &kOpts, &g, err, sizeof err), 0) << err;
  mdl_gguf_close(g);
  // a token outside the vocabulary is an error, not a read past the logits
  Null a;
  ASSERT_NE(a.m, nullptr);
  int32_t bad = 1 << 20;
  mdl_seq q{&bad, 1, 0, nullptr, 0, 1};
  std::vector<float> lg(a.n_vocab());
  EXPECT_NE(mdl_llama_forward(a.m, nullptr, &q, 1, lg.data(), nullptr, nullptr, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("vocabulary"), std::string::npos) << err;
}

} // namespace
