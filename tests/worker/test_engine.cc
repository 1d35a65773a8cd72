// tests/worker/test_engine.cc: the step scheduler: step-cost model fits, chunks under a target, how a plan shares them, and
// admission over a pool the prefix cache fills (cached blocks nobody uses always give way).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

extern "C" {
#include "kv/pool.h"
#include "kv/prefix.h"
#include "worker/engine.h"
}

#include "tests/worker/engine_fixture.h"

namespace {

// Synthetic timings only: every "measured" step below is a number the test makes up, so nothing depends on the
// speed of the machine that runs it.
wrk_stepcost fitted(double fixed, double per_tok, const std::vector<int> &sizes, double decay = WRK_STEPCOST_DECAY) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, decay);
  for (int x : sizes) wrk_stepcost_observe(&c, x, 0, fixed + per_tok * x);
  return c;
}

TEST(StepCost, RecoversAFixedAndAPerTokenCost) {
  wrk_stepcost c = fitted(40.0, 2.0, {8, 40, 8, 8, 136, 9, 72, 8});
  EXPECT_EQ(c.n, 8);
  EXPECT_NEAR(c.fixed_ms, 40.0, 1e-6);
  EXPECT_NEAR(c.per_tok_ms, 2.0, 1e-9);
  EXPECT_NEAR(wrk_stepcost_predict(&c, 100, 0), 240.0, 1e-6);
}

TEST(StepCost, NothingObservedPredictsNothing) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, 0); // an out-of-range decay takes the default
  EXPECT_DOUBLE_EQ(c.decay, WRK_STEPCOST_DECAY);
  EXPECT_EQ(wrk_stepcost_predict(&c, 64, 0), 0.0);
}

// Steps of a single size cannot separate the two terms: the model is proportional, which charges every token the
// average step's cost per token (more than the marginal cost when part of the step is fixed).
TEST(StepCost, OneStepSizeIsProportional) {
  wrk_stepcost c = fitted(40.0, 5.0, {8, 8, 8, 8});
  EXPECT_EQ(c.fixed_ms, 0.0);
  EXPECT_NEAR(c.per_tok_ms, 10.0, 1e-9);
  EXPECT_NEAR(wrk_stepcost_predict(&c, 8, 0), 80.0, 1e-9);
}

TEST(StepCost, NegativeInterceptFitsThroughTheOrigin) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, 1.0);
  wrk_stepcost_observe(&c, 10, 0, 10.0); // slope 4 with intercept -30 between these two
  wrk_stepcost_observe(&c, 20, 0, 50.0);
  EXPECT_EQ(c.fixed_ms, 0.0);
  EXPECT_NEAR(c.per_tok_ms, (10.0 * 10 + 20 * 50.0) / (10.0 * 10 + 20 * 20), 1e-9);
}

TEST(StepCost, NonPositiveSlopeFallsBackToProportional) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, 1.0);
  wrk_stepcost_observe(&c, 8, 0, 100.0); // bigger steps measured faster: noise
  wrk_stepcost_observe(&c, 40, 0, 60.0);
  EXPECT_EQ(c.fixed_ms, 0.0);
  EXPECT_NEAR(c.per_tok_ms, 160.0 / 48.0, 1e-9);
  wrk_stepcost d;
  wrk_stepcost_init(&d, 1.0);
  wrk_stepcost_observe(&d, 8, 0, 0.0); // below the clock's resolution: still a positive cost, never a division by 0
  EXPECT_GT(d.per_tok_ms, 0.0);
  EXPECT_EQ(wrk_step_chunk(&d, 100, 8, 0, 0, 1000, 504, 32), 504); // nearly free tokens: the cap
}

TEST(StepCost, InvalidObservationsAreIgnored) {
  wrk_stepcost c = fitted(40.0, 2.0, {8, 40});
  wrk_stepcost before = c;
  wrk_stepcost_observe(&c, 0, 0, 10.0);
  wrk_stepcost_observe(&c, 8, 0, -1.0);
  wrk_stepcost_observe(&c, 8, 0, NAN);
  wrk_stepcost_observe(&c, 8, 0, INFINITY);
  EXPECT_EQ(c.n, before.n);
  EXPECT_EQ(c.fixed_ms, before.fixed_ms);
  EXPECT_EQ(c.per_tok_ms, before.per_tok_ms);
}

// The machine gets slower (another process takes a core): recent steps dominate, so the fit moves to the new cost.
TEST(StepCost, FollowsAChangeInCost) {
  std::vector<int> sizes;
  for (int i = 0; i < 200; i++) sizes.push_back(i % 4 == 0 ? 40 : 8);
  wrk_stepcost c = fitted(40.0, 2.0, sizes);
  for (int i = 0; i < 300; i++) {
    int x = i % 4 == 0 ? 40 : 8;
    wrk_stepcost_observe(&c, x, 0, 80.0 + 4.0 * x);
  }
  EXPECT_NEAR(c.fixed_ms, 80.0, 0.5);
  EXPECT_NEAR(c.per_tok_ms, 4.0, 0.05);
}

// Noisy steps (a deterministic +-10% pattern) still give a usable fit.
TEST(StepCost, NoisyStepsFitClose) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, WRK_STEPCOST_DECAY);
  const double noise[5] = {1.0, 1.1, 0.9, 1.05, 0.95};
  for (int i = 0; i < 100; i++) {
    int x = 8 + (i % 3) * 32;
    wrk_stepcost_observe(&c, x, 0, (30.0 + 1.5 * x) * noise[i % 5]);
  }
  EXPECT_NEAR(c.fixed_ms, 30.0, 6.0);
  EXPECT_NEAR(c.per_tok_ms, 1.5, 0.2);
}

// wrk_step_chunk's arguments below: target ms, the step's tokens and thousands of pairs so far (8 decode rows), the
// prompt's position, its pending tokens, the room left under max_batch_tokens (512 - 8), the minimum chunk.
TEST(StepChunk, OffWithoutTargetOrData) {
  wrk_stepcost c = fitted(40.0, 2.0, {8, 40});
  EXPECT_EQ(wrk_step_chunk(&c, 0, 8, 0, 0, 1000, 504, 32), 504); // tpot_target_ms 0 (or nothing decodes): the cap
  EXPECT_EQ(wrk_step_chunk(&c, -5, 8, 0, 0, 1000, 504, 32), 504);
  EXPECT_EQ(wrk_step_chunk(&c, 0, 8, 0, 0, 100, 504, 32), 100); // never more than the prompt has left
  wrk_stepcost none;
  wrk_stepcost_init(&none, WRK_STEPCOST_DECAY);
  EXPECT_EQ(wrk_step_chunk(&none, 100, 8, 0, 0, 1000, 504, 32), 504); // nothing measured yet
  EXPECT_EQ(wrk_step_chunk(&c, 100, 8, 0, 0, 1000, 0, 32), 0);        // no room: nothing, whatever the minimum
}

TEST(StepChunk, FitsTheTarget) {
  wrk_stepcost c = fitted(40.0, 2.0, {8, 40, 72});
  EXPECT_EQ(wrk_step_chunk(&c, 200, 8, 0, 0, 1000, 504, 32), 72);  // (200 - 40) / 2 - 8
  EXPECT_EQ(wrk_step_chunk(&c, 201, 8, 0, 0, 1000, 504, 32), 72);  // rounded down: never over the target
  EXPECT_EQ(wrk_step_chunk(&c, 2000, 8, 0, 0, 1000, 504, 32), 504); // max_batch_tokens stays the hard cap
  EXPECT_EQ(wrk_step_chunk(&c, 1e9, 8, 0, 0, 1000, 504, 32), 504);
}

TEST(StepChunk, MinimumChunkWhenTheTargetIsTight) {
  wrk_stepcost c = fitted(40.0, 2.0, {8, 40});
  EXPECT_EQ(wrk_step_chunk(&c, 100, 8, 0, 0, 1000, 504, 32), 32); // the fit says 22
  EXPECT_EQ(wrk_step_chunk(&c, 10, 8, 0, 0, 1000, 504, 32), 32);  // a target below the fixed cost
  EXPECT_EQ(wrk_step_chunk(&c, 10, 8, 0, 0, 1000, 504, 0), 0);    // a later prompt of the step gets no minimum
  EXPECT_EQ(wrk_step_chunk(&c, 10, 8, 0, 0, 1000, 4, 32), 4);     // the cap still wins over the minimum
}

// Steps whose attention pairs vary apart from their tokens (chunks at different positions) separate the three terms.
TEST(StepCost, RecoversThePairTerm) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, WRK_STEPCOST_DECAY);
  auto ms = [](int tokens, double kpairs) { return 7.0 + 0.5 * tokens + 0.4 * kpairs; };
  for (int i = 0; i < 40; i++) {
    int chunk = 32 << (i % 4), pos = (i % 3) * 500; // a prefill chunk at 0, 500 or 1000, with 8 decode rows at 1000
    double kp = 8 * wrk_row_kpairs(1000 + i, 1) + wrk_row_kpairs(pos, chunk);
    wrk_stepcost_observe(&c, 8 + chunk, kp, ms(8 + chunk, kp));
    wrk_stepcost_observe(&c, 8, 8 * wrk_row_kpairs(1000 + i, 1), ms(8, 8 * wrk_row_kpairs(1000 + i, 1)));
  }
  EXPECT_NEAR(c.fixed_ms, 7.0, 1e-6);
  EXPECT_NEAR(c.per_tok_ms, 0.5, 1e-9);
  EXPECT_NEAR(c.per_kpair_ms, 0.4, 1e-9);
  EXPECT_NEAR(wrk_stepcost_predict(&c, 264, 300.0), 7.0 + 132 + 120, 1e-6);
}

// Pairs in proportion to tokens (every step the same context) cannot be told from tokens: tokens alone, as before.
TEST(StepCost, PairsThatFollowTokensFitTokensAlone) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, 1.0);
  for (int x : {8, 40, 72, 8}) wrk_stepcost_observe(&c, x, x * 0.5, 40.0 + 2.0 * x);
  EXPECT_EQ(c.per_kpair_ms, 0.0);
  EXPECT_NEAR(c.fixed_ms, 40.0, 1e-6);
  EXPECT_NEAR(c.per_tok_ms, 2.0, 1e-9);
  wrk_stepcost_observe(&c, 8, -1.0, 60.0); // a negative or non-finite pair count is no observation
  wrk_stepcost_observe(&c, 8, NAN, 60.0);
  EXPECT_EQ(c.n, 4);
}

TEST(StepCost, RowPairs) {
  EXPECT_DOUBLE_EQ(wrk_row_kpairs(0, 1), 0.001);          // a first token reads itself
  EXPECT_DOUBLE_EQ(wrk_row_kpairs(999, 1), 1.0);          // a decode row at position 999 reads 1000 positions
  EXPECT_DOUBLE_EQ(wrk_row_kpairs(1000, 4), 4.010);       // 4 x 1000 before it, and 1+2+3+4 among themselves
}

// A chunk late in a long prompt reads more positions: with the pair term it gets fewer tokens for the same target.
TEST(StepChunk, LaterChunksOfALongPromptAreSmaller) {
  wrk_stepcost c;
  wrk_stepcost_init(&c, WRK_STEPCOST_DECAY);
  for (int i = 0; i < 40; i++) {
    int chunk = 32 << (i % 4), pos = (i % 3) * 500;
    double kp = wrk_row_kpairs(pos, chunk);
    wrk_stepcost_observe(&c, chunk, kp, 7.0 + 0.5 * chunk + 0.4 * kp);
  }
  int at0 = wrk_step_chunk(&c, 150, 0, 0, 0, 4000, 4000, 32);
  int at2000 = wrk_step_chunk(&c, 150, 0, 0, 2000, 4000, 4000, 32);
  EXPECT_GT(at0, at2000);
  for (int pos : {0, 2000}) { // each the largest chunk whose predicted step fits
    int k = pos ? at2000 : at0;
    EXPECT_LE(wrk_stepcost_predict(&c, k, wrk_row_kpairs(pos, k)), 150.0);
    EXPECT_GT(wrk_stepcost_predict(&c, k + 1, wrk_row_kpairs(pos, k + 1)), 150.0);
  }
}

// ---- the plan: how the budget is shared by decode rows and prefill chunks ----

struct Plan : engine_test::Engine {
  void SetUp() override { make(1024, 0); }
  int32_t token_at(int) const override { return 7; } // every prompt the same tokens
  void learn(double fixed, double per_tok) {
    for (int x : {8, 40, 8, 72}) wrk_stepcost_observe(&eng.cost, x, 0, fixed + per_tok * x);
  }
};

TEST_F(Plan, WithoutTargetPrefillTakesTheFixedBudget) {
  std::vector<wrk_seq *> dec;
  for (int i = 0; i < 8; i++) dec.push_back(add(101, 100));
  wrk_seq *p = add(1000, 0);
  learn(40, 2);
  ASSERT_EQ(wrk_engine_plan(&eng), 9);
  for (wrk_seq *d : dec) EXPECT_EQ(chunk_of(d), 1);
  EXPECT_EQ(chunk_of(p), 512 - 8);
}

TEST_F(Plan, TargetLimitsPrefillNotDecode) {
  wc.tpot_target_ms = 200; // with 40 ms + 2 ms/token: 80 tokens a step
  std::vector<wrk_seq *> dec;
  for (int i = 0; i < 8; i++) dec.push_back(add(101, 100));
  wrk_seq *p1 = add(300, 0), *p2 = add(300, 0);
  ASSERT_EQ(wrk_engine_plan(&eng), 10); // before any measured step: the fixed budget
  EXPECT_EQ(chunk_of(p1), 300);
  EXPECT_EQ(chunk_of(p2), 512 - 8 - 300);
  learn(40, 2);
  ASSERT_EQ(wrk_engine_plan(&eng), 9);
  for (wrk_seq *d : dec) EXPECT_EQ(chunk_of(d), 1);
  EXPECT_EQ(chunk_of(p1), 72);
  EXPECT_EQ(chunk_of(p2), 0); // FIFO: the older prompt first
}

TEST_F(Plan, SeveralPromptsShareAStep) {
  wc.tpot_target_ms = 200;
  std::vector<wrk_seq *> dec;
  for (int i = 0; i < 8; i++) dec.push_back(add(101, 100));
  wrk_seq *p1 = add(50, 20), *p2 = add(300, 0); // p1 has 30 prompt tokens left
  learn(40, 2);
  ASSERT_EQ(wrk_engine_plan(&eng), 10);
  EXPECT_EQ(chunk_of(p1), 30);
  EXPECT_EQ(chunk_of(p2), 80 - 8 - 30);
  EXPECT_TRUE(eng.batch[8].want_logits); // p1's last chunk gives its first token
}

TEST_F(Plan, TightTargetStillGivesTheMinimumChunk) {
  wc.tpot_target_ms = 20; // below the fixed cost
  for (int i = 0; i < 8; i++) add(101, 100);
  wrk_seq *p = add(300, 0);
  learn(40, 2);
  ASSERT_EQ(wrk_engine_plan(&eng), 9);
  EXPECT_EQ(chunk_of(p), WRK_MIN_PREFILL_CHUNK);
}

// With the attention term learned, a prompt's chunk 2000 tokens in is smaller than its first one under the same
// target, and the decode rows still get their tokens.
TEST_F(Plan, ChunksAfterALongPrefixAreSmaller) {
  wc.tpot_target_ms = 150;
  std::vector<wrk_seq *> dec;
  for (int i = 0; i < 8; i++) dec.push_back(add(101, 100));
  wrk_seq *fresh = add(3000, 0);
  for (int i = 0; i < 40; i++) {
    int chunk = 32 << (i % 4), pos = (i % 3) * 500;
    double kp = wrk_row_kpairs(pos, chunk);
    wrk_stepcost_observe(&eng.cost, chunk, kp, 7.0 + 0.5 * chunk + 0.4 * kp);
  }
  ASSERT_EQ(wrk_engine_plan(&eng), 9);
  int first = chunk_of(fresh);
  fresh->n_done = 2000;
  ASSERT_EQ(kv_blocks_reserve(rt.kv, &fresh->blocks, 2000), 0);
  ASSERT_EQ(wrk_engine_plan(&eng), 9);
  for (wrk_seq *d : dec) EXPECT_EQ(chunk_of(d), 1);
  EXPECT_GT(first, chunk_of(fresh));
  EXPECT_GE(chunk_of(fresh), WRK_MIN_PREFILL_CHUNK);
  double kp = 8 * wrk_row_kpairs(100, 1) + wrk_row_kpairs(2000, chunk_of(fresh));
  EXPECT_LE(wrk_stepcost_predict(&eng.cost, 8 + chunk_of(fresh), kp), 150.0);
}

// No starvation under the tightest target: the oldest prompt gets at least WRK_MIN_PREFILL_CHUNK every step, so a
// prompt of N tokens has its first token within ceil(N / 32) steps of becoming the oldest, whatever arrives after it
// (newer prompts at position 0 are cheaper per token, and still wait their turn).
TEST_F(Plan, TheOldestPromptProgressesEveryStep) {
  wc.tpot_target_ms = 1; // below any step's cost: only the minimum chunk
  for (int i = 0; i < 8; i++) add(101, 100);
  wrk_seq *old = add(3000, 2000), *young = add(500, 0);
  for (int i = 0; i < 40; i++) {
    int chunk = 32 << (i % 4), pos = (i % 3) * 500;
    double kp = wrk_row_kpairs(pos, chunk);
    wrk_stepcost_observe(&eng.cost, chunk, kp, 7.0 + 0.5 * chunk + 0.4 * kp);
  }
  int steps = 0;
  while (old->n_done < old->n_toks && steps < 1000) {
    ASSERT_GE(wrk_engine_plan(&eng), 9);
    EXPECT_EQ(chunk_of(old), std::min(WRK_MIN_PREFILL_CHUNK, old->n_toks - old->n_done));
    EXPECT_EQ(chunk_of(young), 0);
    for (int i = 0; i < eng.n_batch; i++)
      if (eng.batch_chunk[i] > 1) eng.batch_of[i]->n_done += eng.batch_chunk[i]; // the forward, without the model
    steps++;
  }
  EXPECT_EQ(steps, (1000 + WRK_MIN_PREFILL_CHUNK - 1) / WRK_MIN_PREFILL_CHUNK);
  ASSERT_GE(wrk_engine_plan(&eng), 9); // then the younger one
  EXPECT_EQ(chunk_of(young), WRK_MIN_PREFILL_CHUNK);
}

// A decode worker of 1P1D does no prefill: every row decodes, whatever the target or the cap.
TEST_F(Plan, DecodeOnlyRunsFullBatches) {
  wc.tpot_target_ms = 1;
  wc.max_batch_tokens = 16;
  std::vector<wrk_seq *> dec;
  for (int i = 0; i < 40; i++) dec.push_back(add(33, 32));
  learn(40, 2);
  ASSERT_EQ(wrk_engine_plan(&eng), 40);
  for (wrk_seq *d : dec) EXPECT_EQ(chunk_of(d), 1);
}

// Prefill alone (a prefill worker, or a both worker between generations): nothing to protect, full chunks.
TEST_F(Plan, PrefillOnlyTakesTheCap) {
  wc.tpot_target_ms = 50;
  wrk_seq *p = add(1000, 0);
  learn(40, 2);
  ASSERT_EQ(wrk_engine_plan(&eng), 1);
  EXPECT_EQ(chunk_of(p), 512);
}

// ---- growth past the whole pool ----

struct Growth : Plan {
  void SetUp() override {} // each test sizes its own pool
};

// A sequence whose next token needs more blocks than the pool has (it holds them all) can never grow: the plan marks
// it instead of leaving it in run forever (issue 39 item 6: it used to sit at kv 100% until the request's deadline).
// It keeps its place and its blocks; the role ends it.
TEST_F(Growth, ASequenceThatOutgrowsThePoolIsMarked) {
  make(16, 0);
  wrk_seq *s = add(16 * 16 + 1, 16 * 16); // position 256 needs a 17th block
  EXPECT_EQ(wrk_engine_plan(&eng), 0);
  EXPECT_EQ(s->cannot_grow, 1);
  ASSERT_EQ(eng.n_run, 1);
  EXPECT_EQ(eng.run[0], s);
  EXPECT_EQ(s->blocks.n, 16);
  EXPECT_EQ(eng.n_wait, 0);
}

// One that only lacks what others hold still preempts the newest of them, as before, and is not marked.
TEST_F(Growth, ASequenceThatFitsThePoolPreemptsInstead) {
  make(4, 0);
  wrk_seq *a = add(33, 32), *b = add(33, 32); // two blocks each; a's next token needs a third
  ASSERT_EQ(wrk_engine_plan(&eng), 1);
  EXPECT_EQ(a->cannot_grow, 0);
  EXPECT_EQ(chunk_of(a), 1);
  ASSERT_EQ(eng.n_wait, 1);
  EXPECT_EQ(eng.wait[0], b);
  EXPECT_EQ(b->cannot_grow, 0);
}

// ---- admission and growth over a pool the prefix cache holds: cached blocks nobody uses give way ----

struct CachedPool : Plan {
  std::vector<wrk_seq *> rejected;
  void SetUp() override {} // each test sizes its own pool
  void make(int pool_blocks) {
    Plan::make(pool_blocks, 1024); // the cache may keep the whole pool
    ASSERT_NE(eng.prefix, nullptr);
  }
  static void on_reject(void *arg, wrk_seq *s, int) { static_cast<CachedPool *>(arg)->rejected.push_back(s); }
  wrk_seq *queue(int n, int32_t first_tok) {
    std::vector<int32_t> toks(n);
    for (int i = 0; i < n; i++) toks[i] = first_tok + i;
    seqs.push_back(std::make_unique<wrk_seq>());
    wrk_seq *s = seqs.back().get();
    EXPECT_EQ(wrk_seq_init(s, toks.data(), n, nullptr), 0);
    EXPECT_EQ(wrk_engine_queue(&eng, s), 0);
    return s;
  }
  bool running(const wrk_seq *s) const {
    for (int i = 0; i < eng.n_run; i++)
      if (eng.run[i] == s) return true;
    return false;
  }
  // What a step does once s's prompt is computed: its full blocks enter the cache; then s finishes.
  void finish_into_cache(wrk_seq *s) {
    s->n_done = s->n_toks;
    ASSERT_GT(kv_prefix_insert(eng.prefix, s->toks, s->n_toks, s->blocks.ids, s->blocks.n), 0);
    wrk_engine_remove(&eng, s);
  }
};

// A long prompt after a different long prompt (issue 29: 400 context_length_exceeded while the server was idle):
// the first prompt's cached blocks are evicted for the second.
TEST_F(CachedPool, ASecondLongPromptEvictsTheFirstOnesCachedBlocks) {
  make(40);
  wrk_seq *a = queue(400, 1000); // 26 blocks with its first token
  wrk_engine_admit(&eng, on_reject, this);
  ASSERT_TRUE(running(a));
  finish_into_cache(a);
  kv_prefix_stats st;
  kv_prefix_get_stats(eng.prefix, &st);
  ASSERT_EQ(st.blocks[0], 25);
  ASSERT_EQ(kv_pool_free_blocks(rt.kv), 15);
  wrk_seq *b = queue(400, 5000); // shares nothing with a
  wrk_engine_admit(&eng, on_reject, this);
  EXPECT_TRUE(rejected.empty());
  ASSERT_TRUE(running(b));
  EXPECT_EQ(b->blocks.n, 26);
  kv_prefix_get_stats(eng.prefix, &st);
  EXPECT_LE(st.blocks[0], 40 - 26);
}

// A request as long as the whole pool still runs once the cache gives everything back; one longer is refused.
TEST_F(CachedPool, APromptThatFitsTheEmptyPoolIsNeverRefused) {
  make(20);
  wrk_seq *a = queue(300, 1000);
  wrk_engine_admit(&eng, on_reject, this);
  ASSERT_TRUE(running(a));
  finish_into_cache(a);
  wrk_seq *b = queue(20 * 16 - 1, 7000); // needs all 20 blocks
  wrk_engine_admit(&eng, on_reject, this);
  ASSERT_TRUE(rejected.empty());
  EXPECT_TRUE(running(b));
  wrk_engine_remove(&eng, b);
  wrk_seq *c = queue(20 * 16, 9000); // 21 blocks: never fits
  wrk_engine_admit(&eng, on_reject, this);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0], c);
}

// Blocks held outside the running list (a decode worker's handoff waiting for its KV): a sequence that finds the
// pool short waits for them instead of being refused, and runs once they come back.
TEST_F(CachedPool, AShortPoolWaitsForBlocksHeldOutsideTheBatch) {
  make(20);
  kv_blocks held{};
  ASSERT_EQ(kv_blocks_reserve(rt.kv, &held, 15 * 16), 0);
  wrk_seq *a = queue(100, 1000); // 7 blocks, 5 free
  wrk_engine_admit(&eng, on_reject, this);
  EXPECT_TRUE(rejected.empty());
  EXPECT_FALSE(running(a));
  EXPECT_EQ(eng.n_wait, 1);
  kv_blocks_release(rt.kv, &held);
  wrk_engine_admit(&eng, on_reject, this);
  EXPECT_TRUE(rejected.empty());
  EXPECT_TRUE(running(a));
}

// Growth during decode takes cached blocks before it preempts a running sequence.
TEST_F(CachedPool, GrowthEvictsCachedBlocksBeforePreempting) {
  make(30);
  wrk_seq *a = queue(300, 1000); // 19 blocks, cached afterwards
  wrk_engine_admit(&eng, on_reject, this);
  finish_into_cache(a);
  wrk_seq *b = queue(100, 5000), *c = queue(100, 6000); // 7 blocks each
  wrk_engine_admit(&eng, on_reject, this);
  ASSERT_TRUE(running(b));
  ASSERT_TRUE(running(c));
  ASSERT_LT(kv_pool_free_blocks(rt.kv), 2);
  b->n_done = b->n_toks; // b's prompt computed; its next chunk is 40 new tokens (3 more blocks)
  c->n_done = c->n_toks - 1; // c decodes
  for (int i = 0; i < 40; i++) ASSERT_EQ(wrk_seq_push(b, 42), 0);
  ASSERT_EQ(wrk_engine_plan(&eng), 2);
  EXPECT_TRUE(running(b));
  EXPECT_TRUE(running(c)); // not preempted: the cache gave the blocks
  EXPECT_GE(b->blocks.n, (140 + 15) / 16);
}

} // namespace
