// tests/models/test_llama.cc: the forward pass: batch = alone, chunked = one-shot prefill, bad input, golden vs llama.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model_util.h"

extern "C" {
#include "models/gguf.h"
#include "models/llama.h"
}

namespace {

const char *kModel = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
const char *kGolden = DSERVE_SOURCE_DIR "/tests/models/golden/llama_greedy.json";

// The golden file: one case per line; only the integer/float arrays are read.
struct Case {
  std::string kind;
  std::vector<int32_t> prompt, greedy, top_ids, strided_ids;
  std::vector<float> margins, top, strided;
};

template <class T> std::vector<T> arr(const std::string &line, const std::string &key) {
  std::vector<T> v;
  size_t at = line.find("\"" + key + "\": [");
  if (at == std::string::npos) return v;
  at = line.find('[', at) + 1;
  size_t end = line.find(']', at);
  std::stringstream ss(line.substr(at, end - at));
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back((T)std::stod(item));
  return v;
}

std::vector<Case> load_golden() {
  std::vector<Case> cs;
  std::ifstream f(kGolden);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("{\"kind\"", 0) != 0) continue;
    Case c;
    c.kind = line.substr(10, line.find('"', 10) - 10);
    c.prompt = arr<int32_t>(line, "prompt");
    c.greedy = arr<int32_t>(line, "greedy");
    c.margins = arr<float>(line, "greedy_margins");
    c.top_ids = arr<int32_t>(line, "logits_top_ids");
    c.top = arr<float>(line, "logits_top");
    c.strided_ids = arr<int32_t>(line, "logits_strided_ids");
    c.strided = arr<float>(line, "logits_strided");
    cs.push_back(c);
  }
  return cs;
}

// The model on the best cpu backend with 2 threads, and a KV cache of n_blocks blocks.
struct Engine : ModelEngine {
  bool open(int n_blocks = 512, krn_type kv_type = KRN_F16) {
    return ModelEngine::open(kModel, n_blocks, nullptr, kv_type, " (the real model is needed: run scripts/setup.sh)");
  }
};

int argmax(const float *v, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[b]) b = i;
  return b;
}

// Runs sequences through prefill and n_dec greedy decode steps, all in the same batch.
struct Seq {
  std::vector<int32_t> prompt, blocks, out;
  std::vector<float> first_logits;
  int pos = 0;
};

void run_batch(Engine &e, std::vector<Seq *> seqs, int n_dec) {
  int V = e.cfg->n_vocab, S = (int)seqs.size();
  std::vector<float> logits((size_t)S * V);
  std::vector<mdl_seq> ms(S);
  std::vector<int32_t> last(S);
  for (int step = 0; step <= n_dec; step++) {
    for (int s = 0; s < S; s++) {
      Seq *q = seqs[s];
      ms[s].tokens = step == 0 ? q->prompt.data() : &last[s];
      ms[s].n_tokens = step == 0 ? (int)q->prompt.size() : 1;
      ms[s].pos0 = q->pos;
      ms[s].block_table = q->blocks.data();
      ms[s].n_blocks = (int)q->blocks.size();
      ms[s].want_logits = 1;
    }
    ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, ms.data(), S, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0)
        << e.err;
    for (int s = 0; s < S; s++) {
      seqs[s]->pos += ms[s].n_tokens;
      const float *l = logits.data() + (size_t)s * V;
      if (step == 0) seqs[s]->first_logits.assign(l, l + V);
      last[s] = argmax(l, V);
      seqs[s]->out.push_back(last[s]);
    }
  }
}

float max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::fmax(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST(Llama, LoadsSmolLM2Config) {
  Engine e;
  ASSERT_TRUE(e.open(8));
  EXPECT_STREQ(e.cfg->arch, "llama");
  EXPECT_EQ(e.cfg->n_layer, 30);
  EXPECT_EQ(e.cfg->n_embd, 576);
  EXPECT_EQ(e.cfg->n_head, 9);
  EXPECT_EQ(e.cfg->n_kv_head, 3);
  EXPECT_EQ(e.cfg->head_dim, 64);
  EXPECT_EQ(e.cfg->n_ff, 1536);
  EXPECT_EQ(e.cfg->n_vocab, 49152);
  EXPECT_EQ(e.cfg->tied_embeddings, 1);
  EXPECT_EQ(e.cfg->rope_neox, 0);
  EXPECT_FLOAT_EQ(e.cfg->rope_theta, 100000.0f);
}

TEST(Llama, BatchOfFourEqualsEachAlone) {
  auto cs = load_golden();
  ASSERT_GE(cs.size(), 8u) << kGolden;
  Engine e;
  ASSERT_TRUE(e.open());
  const int n_dec = 16;
  int pick[4] = {0, 2, 5, 7}; // different lengths, plain and chat
  Seq alone[4], batch[4];
  for (int i = 0; i < 4; i++) {
    int nb = ((int)cs[pick[i]].prompt.size() + n_dec + 1 + 15) / 16;
    alone[i].prompt = batch[i].prompt = cs[pick[i]].prompt;
    alone[i].blocks = e.blocks(nb);
    batch[i].blocks = e.blocks(nb);
    run_batch(e, {&alone[i]}, n_dec);
  }
  // two sequences start, then two more join while the first two decode (prefill and decode mixed in one call)
  run_batch(e, {&batch[0], &batch[1]}, 0);
  {
    int V = e.cfg->n_vocab;
    std::vector<float> logits(4 * (size_t)V);
    int32_t t0 = batch[0].out.back(), t1 = batch[1].out.back();
    mdl_seq ms[4] = {
        {&t0, 1, batch[0].pos, batch[0].blocks.data(), (int)batch[0].blocks.size(), 1},
        {batch[2].prompt.data(), (int)batch[2].prompt.size(), 0, batch[2].blocks.data(), (int)batch[2].blocks.size(), 1},
        {&t1, 1, batch[1].pos, batch[1].blocks.data(), (int)batch[1].blocks.size(), 1},
        {batch[3].prompt.data(), (int)batch[3].prompt.size(), 0, batch[3].blocks.data(), (int)batch[3].blocks.size(), 1},
    };
    ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, ms, 4, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
    Seq *order[4] = {&batch[0], &batch[2], &batch[1], &batch[3]};
    for (int s = 0; s < 4; s++) {
      order[s]->pos += ms[s].n_tokens;
      const float *l = logits.data() + (size_t)s * V;
      if (order[s]->first_logits.empty()) order[s]->first_logits.assign(l, l + V);
      order[s]->out.push_back(argmax(l, V));
    }
  }
  // now all four decode together; batch[0..1] are one step ahead, so run them one less
  std::vector<Seq *> all = {&batch[0], &batch[1], &batch[2], &batch[3]};
  {
    int V = e.cfg->n_vocab;
    std::vector<float> logits(4 * (size_t)V);
    for (int step = 0; step < n_dec; step++) {
      std::vector<mdl_seq> ms;
      std::vector<Seq *> who;
      std::vector<int32_t> last(4);
      for (int s = 0; s < 4; s++) {
        if ((int)all[s]->out.size() > n_dec) continue;
        last[ms.size()] = all[s]->out.back();
        ms.push_back({&last[ms.size()], 1, all[s]->pos, all[s]->blocks.data(), (int)all[s]->blocks.size(), 1});
        who.push_back(all[s]);
      }
      if (ms.empty()) break;
      ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, ms.data(), (int)ms.size(), logits.data(), nullptr, nullptr, e.err,
                                  sizeof e.err),
                0)
          << e.err;
      for (size_t s = 0; s < who.size(); s++) {
        who[s]->pos++;
        who[s]->out.push_back(argmax(logits.data() + s * V, V));
      }
    }
  }
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(batch[i].out, alone[i].out) << "sequence " << i;
    EXPECT_LT(max_abs_diff(batch[i].first_logits, alone[i].first_logits), 1e-2f) << "sequence " << i;
  }
}

TEST(Llama, ChunkedPrefillEqualsOneShot) {
  auto cs = load_golden();
  ASSERT_GE(cs.size(), 8u) << kGolden;
  Engine e;
  ASSERT_TRUE(e.open());
  const Case &c = cs[7]; // a chat prompt of ~40 tokens: the chunks straddle a block boundary
  Seq one;
  one.prompt = c.prompt;
  one.blocks = e.blocks(8);
  run_batch(e, {&one}, 8);

  Seq two;
  two.blocks = e.blocks(8);
  int split = 19;
  two.prompt.assign(c.prompt.begin(), c.prompt.begin() + split);
  std::vector<float> logits(e.cfg->n_vocab);
  mdl_seq a = {two.prompt.data(), split, 0, two.blocks.data(), 8, 0};
  std::fill(logits.begin(), logits.end(), -123.0f);
  ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &a, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
  EXPECT_EQ(logits[0], -123.0f); // want_logits 0: row untouched
  two.pos = split;
  two.prompt.assign(c.prompt.begin() + split, c.prompt.end());
  run_batch(e, {&two}, 8);
  EXPECT_EQ(two.out, one.out);
  EXPECT_LT(max_abs_diff(two.first_logits, one.first_logits), 1e-2f);
}

// mdl_llama_forward_all: row i is what the model predicts after token i, the logits a step that ends at token i
// returns; a chunk of scored rows after a context step, as dserve perplexity runs them.
TEST(Llama, ForwardAllRowsEqualEachPrefixsLastLogits) {
  auto cs = load_golden();
  ASSERT_GE(cs.size(), 8u) << kGolden;
  Engine e;
  ASSERT_TRUE(e.open());
  const std::vector<int32_t> &p = cs[7].prompt; // ~40 tokens: straddles a block boundary
  const int n = (int)p.size(), V = e.cfg->n_vocab, split = 13;
  auto bt = e.blocks(8);
  std::vector<float> all((size_t)n * V, -123.0f);
  mdl_seq ctx = {p.data(), split, 0, bt.data(), 8, 0};
  ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &ctx, 1, nullptr, nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
  mdl_seq rest = {p.data() + split, n - split, split, bt.data(), 8, 0}; // want_logits 0: every row all the same
  ASSERT_EQ(mdl_llama_forward_all(e.m, &e.kv, &rest, all.data() + (size_t)split * V, e.err, sizeof e.err), 0) << e.err;
  EXPECT_EQ(all[0], -123.0f); // rows before the step untouched
  for (int i : {split, split + 1, 20, n - 1}) {
    auto pb = e.blocks(8);
    std::vector<float> one(V);
    mdl_seq s = {p.data(), i + 1, 0, pb.data(), 8, 1};
    ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s, 1, one.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
    std::vector<float> row(all.begin() + (size_t)i * V, all.begin() + (size_t)(i + 1) * V);
    EXPECT_LT(max_abs_diff(row, one), 1e-2f) << "row " << i;
    EXPECT_EQ(argmax(row.data(), V), argmax(one.data(), V)) << "row " << i;
  }
  EXPECT_NE(mdl_llama_forward_all(e.m, &e.kv, &rest, nullptr, e.err, sizeof e.err), 0);
  EXPECT_NE(std::string(e.err).find("no output buffer"), std::string::npos) << e.err;
}

// A draft's rows: a step of k+1 tokens with want_logits k+1 gives, bit for bit, the logits the k+1 single-token decode
// steps give, with other sequences in either step; exact speculative decoding rests on this. Both bundled models.
void draft_rows_equal_decode_steps(const char *model) {
  Engine e;
  ASSERT_TRUE(e.ModelEngine::open(model, 128, nullptr, KRN_F16));
  const int V = e.cfg->n_vocab, k = 6;
  std::vector<int32_t> p = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  for (auto &t : p) t = (t * 37) % 500 + 100;
  std::vector<int32_t> other = {300, 301, 302, 303, 304};
  auto bt_a = e.blocks(4), bt_b = e.blocks(4), bt_o = e.blocks(4);
  const int n = (int)p.size();
  // a: prompt, then k single-token greedy steps (with another sequence's prompt in the first one)
  std::vector<float> la((size_t)2 * V);
  mdl_seq s0[2] = {{p.data(), n, 0, bt_a.data(), 4, 1}, {other.data(), 5, 0, bt_o.data(), 4, 1}};
  ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, s0, 2, la.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
  std::vector<int32_t> toks = {argmax(la.data(), V)};
  std::vector<std::vector<float>> want;
  for (int j = 0; j < k; j++) {
    std::vector<float> l(V);
    mdl_seq s = {&toks[j], 1, n + j, bt_a.data(), 4, 1};
    ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s, 1, l.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
    want.push_back(l);
    toks.push_back(argmax(l.data(), V));
  }
  // b: the same prompt, then one step of its k tokens with want_logits k, behind a decode row of another sequence
  std::vector<float> lb((size_t)(k + 1) * V, -123.0f);
  mdl_seq s1 = {p.data(), n, 0, bt_b.data(), 4, 0};
  ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s1, 1, nullptr, nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
  int32_t o5 = 305;
  mdl_seq s2[2] = {{&o5, 1, 5, bt_o.data(), 4, 1}, {toks.data(), k, n, bt_b.data(), 4, k}};
  ASSERT_EQ(mdl_logit_rows(s2, 2), k + 1);
  ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, s2, 2, lb.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
  for (int j = 0; j < k; j++)
    EXPECT_EQ(0, memcmp(lb.data() + (size_t)(1 + j) * V, want[j].data(), (size_t)V * sizeof(float))) << "row " << j;
  s2[1].want_logits = k + 1;
  EXPECT_NE(mdl_llama_forward(e.m, &e.kv, s2, 2, lb.data(), nullptr, nullptr, e.err, sizeof e.err), 0);
  EXPECT_NE(std::string(e.err).find("wants logits of 7 of its 6 tokens"), std::string::npos) << e.err;
}

TEST(Llama, DraftRowsEqualDecodeStepsBitForBitSmolLM2) { draft_rows_equal_decode_steps(kModel); }
TEST(Llama, DraftRowsEqualDecodeStepsBitForBitGemma3) {
  draft_rows_equal_decode_steps(DSERVE_SOURCE_DIR "/models/weights/gemma-3-270m-q4_k_m.gguf");
}

void count_layer(void *arg, int layer) {
  int *n = (int *)arg;
  EXPECT_EQ(layer, *n);
  (*n)++;
}

TEST(Llama, LayerCallbackAndBadInput) {
  Engine e;
  ASSERT_TRUE(e.open(4));
  int32_t toks[3] = {1, 2, 3};
  std::vector<int32_t> bt = {0, 1};
  std::vector<float> logits(e.cfg->n_vocab);
  int n = 0;
  mdl_seq s = {toks, 3, 0, bt.data(), 2, 1};
  ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s, 1, logits.data(), count_layer, &n, e.err, sizeof e.err), 0) << e.err;
  EXPECT_EQ(n, e.cfg->n_layer);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));

  mdl_seq bad = s;
  int32_t big[1] = {e.cfg->n_vocab};
  bad.tokens = big;
  bad.n_tokens = 1;
  EXPECT_LT(mdl_llama_forward(e.m, &e.kv, &bad, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0);
  EXPECT_NE(std::string(e.err).find("vocabulary"), std::string::npos) << e.err;
  bad = s;
  bad.pos0 = 30; // 33 positions do not fit in 2 blocks
  EXPECT_LT(mdl_llama_forward(e.m, &e.kv, &bad, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0);
  EXPECT_NE(std::string(e.err).find("blocks hold"), std::string::npos) << e.err;
  bad = s;
  int32_t out_of_pool[2] = {0, 4};
  bad.block_table = out_of_pool;
  EXPECT_LT(mdl_llama_forward(e.m, &e.kv, &bad, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0);
  EXPECT_NE(std::string(e.err).find("outside the pool"), std::string::npos) << e.err;
  bad = s;
  bad.n_tokens = 0;
  EXPECT_LT(mdl_llama_forward(e.m, &e.kv, &bad, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0);
  EXPECT_LT(mdl_llama_forward(e.m, &e.kv, &s, 0, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0);
}

// A minimal GGUF writer for refusal tests.
struct GgufWriter {
  std::vector<uint8_t> b;
  int n_kv = 0, n_t = 0;
  std::vector<uint8_t> kvs, tinfo;
  void put(std::vector<uint8_t> &v, const void *p, size_t n) {
    v.insert(v.end(), (const uint8_t *)p, (const uint8_t *)p + n);
  }
  void str(std::vector<uint8_t> &v, const std::string &s) {
    uint64_t n = s.size();
    put(v, &n, 8);
    put(v, s.data(), n);
  }
  void kv_str(const std::string &k, const std::string &val) {
    str(kvs, k);
    uint32_t t = 8;
    put(kvs, &t, 4);
    str(kvs, val);
    n_kv++;
  }
  void kv_u32(const std::string &k, uint32_t val) {
    str(kvs, k);
    uint32_t t = 4;
    put(kvs, &t, 4);
    put(kvs, &val, 4);
    n_kv++;
  }
  void tensor(const std::string &name, uint64_t ne0, uint64_t ne1, uint32_t type) {
    str(tinfo, name);
    uint32_t nd = 2;
    put(tinfo, &nd, 4);
    put(tinfo, &ne0, 8);
    put(tinfo, &ne1, 8);
    put(tinfo, &type, 4);
    uint64_t off = 0;
    put(tinfo, &off, 8);
    n_t++;
  }
  std::vector<uint8_t> finish(size_t data_bytes) {
    b.clear();
    put(b, "GGUF", 4);
    uint32_t ver = 3;
    put(b, &ver, 4);
    uint64_t nt = n_t, nk = n_kv;
    put(b, &nt, 8);
    put(b, &nk, 8);
    put(b, kvs.data(), kvs.size());
    put(b, tinfo.data(), tinfo.size());
    while (b.size() % 32) b.push_back(0);
    b.resize(b.size() + data_bytes, 0);
    return b;
  }
};

TEST(Llama, RefusesUnsupportedArchAndType) {
  char err[512];
  krn_ctx kc{};
  kc.be = krn_cpu_scalar();
  {
    GgufWriter w;
    w.kv_str("general.architecture", "mamba");
    auto buf = w.finish(0);
    mdl_gguf *g = nullptr;
    ASSERT_EQ(mdl_gguf_from_memory(buf.data(), buf.size(), &g, err, sizeof err), 0) << err;
    mdl_llama *m = nullptr;
    EXPECT_LT(mdl_llama_load(g, &kc, &m, err, sizeof err), 0);
    EXPECT_NE(std::string(err).find("mamba"), std::string::npos) << err;
    EXPECT_EQ(m, nullptr);
    mdl_gguf_close(g);
  }
  {
    GgufWriter w;
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.block_count", 1);
    w.kv_u32("llama.embedding_length", 256);
    w.kv_u32("llama.feed_forward_length", 512);
    w.kv_u32("llama.attention.head_count", 4);
    w.tensor("token_embd.weight", 256, 64, 10); // Q2_K: 84 bytes per 256
    auto buf = w.finish(84 * 64);
    mdl_gguf *g = nullptr;
    // the reader may refuse the type already; otherwise the loader must, naming it and the tensor
    if (mdl_gguf_from_memory(buf.data(), buf.size(), &g, err, sizeof err) == 0) {
      mdl_llama *m = nullptr;
      EXPECT_LT(mdl_llama_load(g, &kc, &m, err, sizeof err), 0);
      EXPECT_EQ(m, nullptr);
    }
    EXPECT_NE(std::string(err).find("Q2_K"), std::string::npos) << err;
    EXPECT_NE(std::string(err).find("token_embd.weight"), std::string::npos) << err;
    mdl_gguf_close(g);
  }
}

// Golden: llama.cpp's greedy tokens and last-prompt-position logits for the same GGUF.
// Logits: the top 64 ids and every 768th id within kLogitTol = 1.5 absolute, argmax equal. The logit range is
// ~30-40, so that is ~4%. Why not tighter: llama.cpp quantizes activations to Q8 on the fly, and this model amplifies
// single rounding flips: a 1e-5 change in one matmul output moved the last logits by up to 0.58. The golden values
// carry that noise: the exact scalar reference (double accumulation, no activation quantization) is itself 1.30 from
// them on case 5, and rounding-level changes to the avx512 attention (summation order only) moved case 5 between
// 0.47 and 1.31 while the other cases stayed within 0.2-0.75.
// Greedy: teacher-forced on llama.cpp's tokens, so our state stays llama.cpp's; at each of the 32 steps our argmax
// must be llama.cpp's token, except at a near-tie: llama.cpp's own top1-top2 margin and our margin between our
// choice and llama.cpp's token both below kTieMargin = 0.75. Measured on the scalar reference: 10 such steps of 320,
// largest margins 0.33 (llama.cpp) and 0.45 (ours); avx512 12 steps (0.26, 0.42); avx2 13 steps (0.26, 0.56). At
// most 5% of steps (16) may be ties.
const float kLogitTol = 1.5f;
const float kTieMargin = 0.75f;

void golden_greedy_and_logits(krn_type kv_type) {
  auto cs = load_golden();
  ASSERT_GE(cs.size(), 8u) << kGolden;
  Engine e;
  ASSERT_TRUE(e.open(512, kv_type));
  int V = e.cfg->n_vocab, ties = 0;
  for (size_t ci = 0; ci < cs.size(); ci++) {
    const Case &c = cs[ci];
    ASSERT_EQ(c.greedy.size(), 32u);
    int nb = ((int)c.prompt.size() + 33 + 15) / 16;
    std::vector<int32_t> bt = e.blocks(nb);
    std::vector<float> logits(V);
    mdl_seq s = {c.prompt.data(), (int)c.prompt.size(), 0, bt.data(), nb, 1};
    ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0) << e.err;
    float d = 0;
    for (size_t i = 0; i < c.top_ids.size(); i++) d = std::fmax(d, std::fabs(logits[c.top_ids[i]] - c.top[i]));
    for (size_t i = 0; i < c.strided_ids.size(); i++)
      d = std::fmax(d, std::fabs(logits[c.strided_ids[i]] - c.strided[i]));
    EXPECT_LT(d, kLogitTol) << "case " << ci << " (" << c.kind << "): last-position logits differ by " << d;
    EXPECT_EQ(argmax(logits.data(), V), c.top_ids[0]) << "case " << ci;
    std::fprintf(stderr, "golden case %zu (%s): max |logit diff| %.4f\n", ci, c.kind.c_str(), d);
    int pos = (int)c.prompt.size();
    for (int i = 0; i < 32; i++) {
      int32_t tok = argmax(logits.data(), V);
      if (tok != c.greedy[i]) {
        float ours = logits[tok] - logits[c.greedy[i]];
        std::fprintf(stderr, "golden case %zu step %d: near-tie, llama.cpp margin %.4f, ours %.4f\n", ci, i,
                     c.margins[i], ours);
        EXPECT_LT(c.margins[i], kTieMargin) << "case " << ci << " step " << i << ": llama.cpp chose " << c.greedy[i]
                                            << " with margin " << c.margins[i] << ", we chose " << tok;
        EXPECT_LT(ours, kTieMargin) << "case " << ci << " step " << i << ": llama.cpp's token is " << ours
                                    << " below our choice " << tok;
        ties++;
      }
      if (i == 31) break;
      s = {&c.greedy[i], 1, pos++, bt.data(), nb, 1};
      ASSERT_EQ(mdl_llama_forward(e.m, &e.kv, &s, 1, logits.data(), nullptr, nullptr, e.err, sizeof e.err), 0)
          << e.err;
    }
  }
  EXPECT_LE(ties, (int)cs.size() * 32 / 20) << ties << " near-ties over " << cs.size() << " prompts x 32 tokens";
}

TEST(Llama, GoldenGreedyAndLogitsMatchLlamaCpp) { golden_greedy_and_logits(KRN_F16); }

// A Q8_0 KV cache (kv_type q8_0) keeps the same policy against llama.cpp's f16-cache goldens: same tolerances, same
// tie rule, the same bound on ties. Its own error (8 bits per value, one f16 scale per 32) is small beside them.
TEST(Llama, GoldenWithQ8_0KvCacheWithinTheSameTolerances) { golden_greedy_and_logits(KRN_Q8_0); }

} // namespace
