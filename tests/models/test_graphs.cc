// tests/models/test_graphs.cc: the forward pass's step graphs, on a cpu backend that records ops the way cuda stream capture does.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "models/gguf.h"
#include "models/llama.h"
#include "tests/cuda/synth_model.h"

namespace {

// The scalar table, with every op recorded instead of run between graph_begin and graph_end (arguments
// copied, as a captured kernel's are) and replayed by graph_launch. Copies during a recording fail the test:
// cuda capture would break on them.
struct Recorder {
  const krn_backend *base = krn_cpu_scalar();
  std::vector<std::function<void()>> *cur = nullptr; // the recording in progress
  bool stale_next = false;                           // the next launch reports a scratch reallocation
  int begins = 0, launches = 0;
} g;

using Ops = std::vector<std::function<void()>>;

template <class F> void op(F f) {
  if (g.cur) g.cur->push_back(f);
  else f();
}
void r_upload(krn_ctx *c, void *d, const void *s, size_t n) {
  EXPECT_EQ(g.cur, nullptr) << "upload while recording";
  g.base->upload(c, d, s, n);
}
void r_download(krn_ctx *c, void *d, const void *s, size_t n) {
  EXPECT_EQ(g.cur, nullptr) << "download while recording";
  g.base->download(c, d, s, n);
}
void r_matmul(krn_ctx *c, float *y, const void *w, krn_type wt, const float *x, int n, int k, int m) {
  op([=] { g.base->matmul(c, y, w, wt, x, n, k, m); });
}
void r_get_rows(krn_ctx *c, float *out, const void *w, krn_type wt, const int32_t *ids, int n, int k) {
  op([=] { g.base->get_rows(c, out, w, wt, ids, n, k); });
}
void r_rmsnorm(krn_ctx *c, float *out, const float *x, const float *w, int n, int d, float eps) {
  op([=] { g.base->rmsnorm(c, out, x, w, n, d, eps); });
}
void r_rope(krn_ctx *c, float *x, const int32_t *pos, int n, int nh, int hd, float theta, int neox) {
  op([=] { g.base->rope(c, x, pos, n, nh, hd, theta, neox); });
}
void r_swiglu(krn_ctx *c, float *out, const float *gate, const float *up, int64_t n) {
  op([=] { g.base->swiglu(c, out, gate, up, n); });
}
void r_softmax(krn_ctx *c, float *x, int n, int d) { op([=] { g.base->softmax(c, x, n, d); }); }
void r_add(krn_ctx *c, float *y, const float *x, int64_t n) { op([=] { g.base->add(c, y, x, n); }); }
void r_kv_store(krn_ctx *c, const float *k, const float *v, const krn_attn_args *a) {
  const krn_attn_args A = *a;
  op([=] { g.base->kv_store(c, k, v, &A); });
}
void r_attention(krn_ctx *c, float *out, const float *q, const krn_attn_args *a) {
  const krn_attn_args A = *a;
  op([=] { g.base->paged_attention(c, out, q, &A); });
}
int r_begin(krn_ctx *) {
  EXPECT_EQ(g.cur, nullptr);
  g.cur = new Ops;
  g.begins++;
  return 0;
}
void *r_end(krn_ctx *) {
  Ops *o = g.cur;
  g.cur = nullptr;
  return o;
}
int r_launch(krn_ctx *, void *h) {
  if (g.stale_next) {
    g.stale_next = false;
    return -1;
  }
  for (auto &f : *(Ops *)h) f();
  g.launches++;
  return 0;
}
void r_free(krn_ctx *, void *h) { delete (Ops *)h; }

krn_backend recorder_table() {
  krn_backend b = *krn_cpu_scalar();
  b.name = "recorder";
  b.upload = r_upload;
  b.download = r_download;
  b.matmul = r_matmul;
  b.get_rows = r_get_rows;
  b.rmsnorm = r_rmsnorm;
  b.rope = r_rope;
  b.swiglu = r_swiglu;
  b.softmax = r_softmax;
  b.add = r_add;
  b.kv_store = r_kv_store;
  b.paged_attention = r_attention;
  b.graph_begin = r_begin;
  b.graph_end = r_end;
  b.graph_launch = r_launch;
  b.graph_free = r_free;
  return b;
}

// A model and its pool on one table.
struct Side {
  krn_ctx kc{};
  mdl_llama *m = nullptr;
  std::vector<uint8_t> pool;
  mdl_kv kv{};
  char err[256] = "";
  Side(mdl_gguf *gg, const krn_backend *be) {
    kc.be = be;
    EXPECT_EQ(mdl_llama_load(gg, &kc, &m, err, sizeof err), 0) << err;
    kv.type = KRN_F16;
    kv.block_size = 16;
    kv.n_blocks = 12;
    pool.assign(mdl_kv_block_bytes(mdl_llama_config(m), KRN_F16, 16) * kv.n_blocks, 0);
    kv.base = pool.data();
  }
  ~Side() { mdl_llama_free(m); }
};

struct Graphs : ::testing::Test {
  std::vector<uint8_t> bytes = dserve_test::synth_model(dserve_test::tiny_shape(), 5);
  mdl_gguf *gg = nullptr;
  krn_backend rec = recorder_table();
  void SetUp() override {
    g = Recorder{};
    char err[256];
    ASSERT_EQ(mdl_gguf_from_memory(bytes.data(), bytes.size(), &gg, err, sizeof err), 0) << err;
  }
  void TearDown() override { mdl_gguf_close(gg); }
};

int argmax(const float *v, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[b]) b = i;
  return b;
}

// Sequences of the batch: tokens so far and their blocks (4 blocks each, distinct).
struct Seqs {
  std::vector<std::vector<int32_t>> toks;
  std::vector<std::vector<int32_t>> bt;
  std::vector<mdl_seq> batch(bool decode) {
    std::vector<mdl_seq> out;
    for (size_t i = 0; i < toks.size(); i++) {
      mdl_seq s{};
      s.n_tokens = decode ? 1 : (int)toks[i].size();
      s.pos0 = decode ? (int)toks[i].size() - 1 : 0;
      s.tokens = toks[i].data() + s.pos0;
      s.block_table = bt[i].data();
      s.n_blocks = (int)bt[i].size();
      s.want_logits = 1;
      out.push_back(s);
    }
    return out;
  }
};

TEST_F(Graphs, DecodeStepsReplayAndMatchPlainSteps) {
  Side plain(gg, krn_cpu_scalar()), graphed(gg, &rec);
  ASSERT_TRUE(plain.m && graphed.m);
  ASSERT_EQ(mdl_llama_set_graphs(graphed.m, 1, graphed.err, sizeof graphed.err), 0) << graphed.err;
  const int V = mdl_llama_config(plain.m)->n_vocab;
  Seqs sq;
  sq.toks = {{1, 2, 3, 4, 5}, {9, 8, 7}, {100, 200, 300, 400, 500, 600, 700}};
  sq.bt = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
  std::vector<float> lp(3 * V), lg(3 * V);
  int steps = 0;
  long replayed = 0, recorded = 0;
  for (int step = 0; step < 24; step++) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    if (step == 12) { // one sequence finishes: a new batch size, a new shape
      sq.toks.pop_back();
      sq.bt.pop_back();
    }
    if (step == 18) g.stale_next = true; // the backend moved scratch: the graph is recorded again
    auto b = sq.batch(step > 0);
    const int n = (int)b.size();
    ASSERT_EQ(mdl_llama_forward(plain.m, &plain.kv, b.data(), n, lp.data(), nullptr, nullptr, plain.err, sizeof plain.err), 0)
        << plain.err;
    ASSERT_EQ(mdl_llama_forward(graphed.m, &graphed.kv, b.data(), n, lg.data(), nullptr, nullptr, graphed.err,
                                sizeof graphed.err), 0)
        << graphed.err;
    // Same ops on the same data in the same order: the cpu result is bit for bit the plain one.
    for (int i = 0; i < n * V; i++) ASSERT_EQ(lg[i], lp[i]) << "logit " << i;
    for (int i = 0; i < n; i++) sq.toks[i].push_back(argmax(lp.data() + (size_t)i * V, V));
    steps++;
  }
  mdl_llama_graph_stats(graphed.m, &replayed, &recorded);
  // steps 1..23 are decode steps; 1 (batch 3, first sight) and 12 (batch 2, first sight) run plainly;
  // 2 and 13 record; 18 finds its graph stale and records again; the rest replay.
  EXPECT_EQ(recorded, 3);
  EXPECT_EQ(replayed, 21);
  EXPECT_EQ(g.begins, 3);
  EXPECT_EQ(g.launches, 21);
  long pr = -1;
  mdl_llama_graph_stats(plain.m, &pr, nullptr);
  EXPECT_EQ(pr, 0);
}

TEST_F(Graphs, OnlyPureDecodeStepsAreRecorded) {
  Side graphed(gg, &rec);
  ASSERT_TRUE(graphed.m);
  ASSERT_EQ(mdl_llama_set_graphs(graphed.m, 1, graphed.err, sizeof graphed.err), 0) << graphed.err;
  const int V = mdl_llama_config(graphed.m)->n_vocab;
  Seqs sq;
  sq.toks = {{1, 2, 3}, {4, 5}};
  sq.bt = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  std::vector<float> lo(2 * V);
  int layers = 0;
  auto count = [](void *arg, int) { ++*(int *)arg; };
  for (int step = 0; step < 4; step++) { // with a layer callback (the prefill worker's): never a graph
    auto b = sq.batch(step > 0);
    ASSERT_EQ(mdl_llama_forward(graphed.m, &graphed.kv, b.data(), 2, lo.data(), count, &layers, graphed.err,
                                sizeof graphed.err), 0);
    for (int i = 0; i < 2; i++) sq.toks[i].push_back(argmax(lo.data() + (size_t)i * V, V));
  }
  for (int step = 0; step < 4; step++) { // one row without logits: not a pure decode step either
    auto b = sq.batch(true);
    b[1].want_logits = 0;
    ASSERT_EQ(mdl_llama_forward(graphed.m, &graphed.kv, b.data(), 2, lo.data(), nullptr, nullptr, graphed.err,
                                sizeof graphed.err), 0);
    for (int i = 0; i < 2; i++) sq.toks[i].push_back(1 + step + i);
  }
  long replayed = -1, recorded = -1;
  mdl_llama_graph_stats(graphed.m, &replayed, &recorded);
  EXPECT_EQ(recorded, 0);
  EXPECT_EQ(replayed, 0);
  EXPECT_EQ(layers, 4 * mdl_llama_config(graphed.m)->n_layer);
  ASSERT_EQ(mdl_llama_set_graphs(graphed.m, 0, graphed.err, sizeof graphed.err), 0);
}

TEST_F(Graphs, BackendWithoutGraphsRefuses) {
  Side plain(gg, krn_cpu_scalar());
  ASSERT_TRUE(plain.m);
  EXPECT_EQ(mdl_llama_set_graphs(plain.m, 1, plain.err, sizeof plain.err), -1);
  EXPECT_NE(std::string(plain.err).find("scalar"), std::string::npos) << plain.err;
  EXPECT_EQ(mdl_llama_set_graphs(plain.m, 0, plain.err, sizeof plain.err), 0); // off is always fine
}

} // namespace
