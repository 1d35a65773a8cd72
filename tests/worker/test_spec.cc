// tests/worker/test_spec.cc: speculative decoding in the engine and the step: a draft's rows in the plan, the blocks and
// prefix-store entries verification keeps, what a drafted token costs (rho) and verification itself (worker/spec.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

extern "C" {
#include "kv/pool.h"
#include "kv/prefix.h"
#include "models/sampler.h"
#include "worker/engine.h"
#include "worker/spec.h"
}

#include "tests/worker/engine_fixture.h"

namespace {

// A one-layer model's engine over a pool of a few blocks (no forward pass: the test does a step's bookkeeping).
struct Draft : engine_test::Engine {
  int32_t token_at(int i) const override { return i; } // ids 0..n-1
  // s's draft of k tokens, as the decode worker proposes it
  void draft(wrk_seq *s, int k) {
    for (int i = 0; i < k; i++) ASSERT_EQ(wrk_seq_push(s, 100 + i), 0);
    s->n_draft = k;
  }
  // What wrk_engine_forward does for a drafted row, without the model: n_done passes the decode token only.
  void stepped(wrk_seq *s) { s->n_done += 1; }
  // What the decode worker does after verification: the draft out, m accepted tokens and the correction in, accept.
  void verified(wrk_seq *s, int m) {
    wrk_seq_drop_draft(s);
    for (int i = 0; i < m; i++) ASSERT_EQ(wrk_seq_push(s, 100 + i), 0);
    ASSERT_EQ(wrk_seq_push(s, 55), 0);
    wrk_engine_accept(&eng, s, m);
  }
};

TEST_F(Draft, ADraftIsOneRowOfItsPositionsWithTheirLogits) {
  make(64, 0);
  wrk_seq *a = add(31, 30);
  add(17, 16);
  draft(a, 4);
  ASSERT_EQ(wrk_engine_plan(&eng), 2);
  EXPECT_EQ(chunk_of(a), 5);
  EXPECT_EQ(eng.batch[0].n_tokens, 5);
  EXPECT_EQ(eng.batch[0].pos0, 30);
  EXPECT_EQ(eng.batch[0].want_logits, 5);
  EXPECT_EQ(eng.batch[1].want_logits, 1);
  EXPECT_EQ(mdl_logit_row(eng.batch, 1), 5); // the second row's logits come after the first's five
  EXPECT_EQ(a->blocks.n, 3);                 // positions 30..34
  EXPECT_EQ(a->n_draft, 4);
}

// Rejected positions give their blocks back: after verification the pool holds what plain decode's would.
TEST_F(Draft, RejectionGivesBackTheBlocksOnlyTheDraftNeeded) {
  make(64, 0);
  wrk_seq *a = add(31, 30);
  draft(a, 4);
  ASSERT_EQ(wrk_engine_plan(&eng), 1);
  EXPECT_EQ(kv_pool_free_blocks(rt.kv), 64 - 3);
  stepped(a);
  verified(a, 0); // the first drafted token was wrong: the correction is token 31
  EXPECT_EQ(a->n_done, 31);
  EXPECT_EQ(a->n_toks, 32);
  EXPECT_EQ(a->n_draft, 0);
  EXPECT_EQ(a->blocks.n, 2);
  EXPECT_EQ(kv_pool_free_blocks(rt.kv), 64 - 2);
  ASSERT_EQ(wrk_engine_plan(&eng), 1); // the next step: a plain decode row at position 31
  EXPECT_EQ(chunk_of(a), 1);
  EXPECT_EQ(eng.batch[0].pos0, 31);
}

TEST_F(Draft, AcceptedPositionsStand) {
  make(64, 0);
  wrk_seq *a = add(31, 30);
  draft(a, 4);
  ASSERT_EQ(wrk_engine_plan(&eng), 1);
  stepped(a);
  verified(a, 3); // three held, the fourth was corrected
  EXPECT_EQ(a->n_done, 34);
  EXPECT_EQ(a->n_toks, 35);
  EXPECT_EQ(a->toks[33], 102);
  EXPECT_EQ(a->toks[34], 55);
  EXPECT_EQ(a->blocks.n, 3);
  ASSERT_EQ(wrk_engine_plan(&eng), 1);
  EXPECT_EQ(eng.batch[0].pos0, 34);
}

// A draft never takes the blocks another sequence's decode token needs, and never preempts: it is dropped instead.
TEST_F(Draft, ADraftNeverPreemptsNorStarvesADecodeRow) {
  make(4, 0);
  wrk_seq *a = add(17, 16), *b = add(17, 16); // one block each; each decode token needs a second
  draft(a, 16);                               // would need a third block for a
  ASSERT_EQ(wrk_engine_plan(&eng), 2);
  EXPECT_EQ(chunk_of(a), 1);
  EXPECT_EQ(chunk_of(b), 1);
  EXPECT_EQ(a->n_draft, 0);
  EXPECT_EQ(a->n_toks, 17); // its draft is gone from its tokens
  EXPECT_EQ(eng.n_wait, 0);
}

// A preempted sequence is recomputed from its tokens: its draft is not one of them.
TEST_F(Draft, PreemptionDropsTheDraft) {
  make(2, 0);
  wrk_seq *a = add(17, 16), *b = add(16, 15); // a's decode token needs a second block; the pool has none left
  draft(b, 2);
  ASSERT_EQ(wrk_engine_plan(&eng), 1); // a preempts b, the newest
  EXPECT_EQ(chunk_of(a), 1);
  ASSERT_EQ(eng.n_wait, 1);
  EXPECT_EQ(eng.wait[0], b);
  EXPECT_EQ(b->n_draft, 0);
  EXPECT_EQ(b->n_toks, 16);
  EXPECT_EQ(b->n_done, 0);
}

// Only accepted positions reach the prefix store: a block a rejected draft filled is never offered.
TEST_F(Draft, ThePrefixStoreSeesAcceptedPositionsOnly) {
  make(64, 1024);
  ASSERT_NE(eng.prefix, nullptr);
  wrk_seq *a = add(31, 30);
  draft(a, 4); // positions 30..34 would fill block 1
  ASSERT_EQ(wrk_engine_plan(&eng), 1);
  stepped(a);
  verified(a, 0);
  EXPECT_EQ(a->n_inserted, 1); // 31 positions computed: one full block
  draft(a, 4);
  ASSERT_EQ(wrk_engine_plan(&eng), 1);
  stepped(a);
  verified(a, 2); // positions 31..33 computed and kept: block 1 is full
  EXPECT_EQ(a->n_done, 34);
  EXPECT_EQ(a->n_inserted, 2);
}

wrk_stepcost fitted(double fixed, double per_tok, const std::vector<int> &sizes) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, WRK_STEPCOST_DECAY);
  for (int x : sizes) wrk_stepcost_observe(&c, x, 0, fixed + per_tok * x);
  return c;
}

// The cost of a drafted token: rho = per_tok_ms * n_decode / T0, from the cost model.
TEST(DraftCost, RhoFollowsTheCostModel) {
  wrk_stepcost c = fitted(40.0, 2.0, {8, 40, 8, 72});
  EXPECT_NEAR(wrk_draft_rho(&c, 1, 1), 2.0 / 42.0, 1e-6);     // memory-bound: drafts nearly free
  EXPECT_NEAR(wrk_draft_rho(&c, 64, 64), 128.0 / 168.0, 1e-6); // many sequences: most of the step is per token
  EXPECT_NEAR(wrk_draft_rho(&c, 264, 8), 16.0 / 568.0, 1e-6);  // prefill rows make the step long
  wrk_stepcost none;
  wrk_stepcost_init(&none, 0);
  EXPECT_EQ(wrk_draft_rho(&none, 2, 2), 0.0); // nothing known: light load drafts (and gives the fit other sizes)
  EXPECT_EQ(wrk_draft_rho(&none, 9, 9), 1.0);
  wrk_stepcost prop = fitted(40.0, 5.0, {8, 8, 8});
  EXPECT_EQ(wrk_draft_rho(&prop, 8, 8), 0.0);
}

TEST(DraftCost, TheLongestDraftThatPays) {
  EXPECT_EQ(wrk_spec_pays(0, 0, 0.5, 8), 8);     // too few drafted tokens to judge: optimistic
  EXPECT_EQ(wrk_spec_pays(100, 100, 0.9, 8), 8); // always accepted: pays at any rho < 1
  EXPECT_EQ(wrk_spec_pays(100, 0, 0.01, 8), 0);  // never accepted: never pays
  EXPECT_EQ(wrk_spec_pays(100, 50, 0.3, 8), 2);  // p = 0.5: E(k)/k = 0.5, 0.375, 0.29, ...
  EXPECT_EQ(wrk_spec_pays(100, 50, 0.6, 8), 0);
  EXPECT_EQ(wrk_spec_pays(100, 100, 1.0, 8), 0); // rho 1: a fully compute-bound step drafts nothing
}

// ---- verification: sampling k + 1 rows gives what k + 1 one-token steps give ----

const int V = 16;

// Logits whose greedy token at row j is want[j].
std::vector<float> rows(const std::vector<int> &want) {
  std::vector<float> l(want.size() * V, 0.0f);
  for (size_t j = 0; j < want.size(); j++) l[j * V + (size_t)want[j]] = 5.0f;
  return l;
}

mdl_sampler *sampler(float temperature, uint64_t seed) {
  mdl_sampling p{};
  p.temperature = temperature;
  p.top_p = 1;
  p.repetition_penalty = 1;
  p.seed = seed;
  mdl_sampler *s = nullptr;
  char err[128];
  EXPECT_EQ(mdl_sampler_new(&p, V, nullptr, 0, &s, err, sizeof err), 0) << err;
  return s;
}

TEST(Verify, AcceptsWhileTheSampleIsTheDraftThenTheBonus) {
  mdl_sampler *s = sampler(0, 0);
  auto l = rows({3, 4, 5, 6});
  int32_t d[3] = {3, 4, 5};
  wrk_verdict v;
  wrk_spec_verify(s, l.data(), V, d, 3, &v);
  ASSERT_EQ(v.n, 4);
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.tok[3].token, 6); // the bonus token
  EXPECT_EQ(v.too_costly, 0);
  mdl_sampler_free(s);
}

TEST(Verify, TheFirstMismatchIsTheCorrectionAndEndsTheRun) {
  mdl_sampler *s = sampler(0, 0);
  auto l = rows({3, 9, 5, 6});
  int32_t d[3] = {3, 4, 5};
  wrk_verdict v;
  wrk_spec_verify(s, l.data(), V, d, 3, &v);
  ASSERT_EQ(v.n, 2);
  EXPECT_EQ(v.accepted, 1);
  EXPECT_EQ(v.tok[0].token, 3);
  EXPECT_EQ(v.tok[1].token, 9); // sampled, not drafted; rows 2 and 3 are never sampled
  mdl_sampler_free(s);
}

// Seeded sampling: verified rows give the tokens one-token steps give, and leave the sampler where they leave it.
TEST(Verify, SeededSamplingEqualsOneTokenSteps) {
  const int n = 12;
  std::vector<float> l((size_t)n * V);
  for (size_t i = 0; i < l.size(); i++) l[i] = (float)((i * 7919) % 13) * 0.3f; // several likely tokens a row
  mdl_sampler *one = sampler(1.0f, 42);
  std::vector<int32_t> plain;
  for (int j = 0; j < n; j++) {
    mdl_sampled t;
    mdl_sampler_sample(one, l.data() + (size_t)j * V, &t);
    plain.push_back(t.token);
  }
  // the same rows verified in steps of drafts that are right, then wrong at one place
  mdl_sampler *sp = sampler(1.0f, 42);
  std::vector<int32_t> got;
  while ((int)got.size() < n) {
    int at = (int)got.size(), k = std::min(4, n - at - 1);
    std::vector<int32_t> d(plain.begin() + at, plain.begin() + at + k);
    if (k > 1) d[1] = (d[1] + 1) % V; // the second drafted token is wrong
    wrk_verdict v;
    wrk_spec_verify(sp, l.data() + (size_t)at * V, V, d.data(), k, &v);
    ASSERT_GE(v.n, 1);
    for (int j = 0; j < v.n; j++) got.push_back(v.tok[j].token);
  }
  EXPECT_EQ(got, plain);
  mdl_sampler_free(one);
  mdl_sampler_free(sp);
}

} // namespace
