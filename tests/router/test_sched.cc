// tests/router/test_sched.cc: the scheduling policy: both workers by load, decode + prefill pairing, nothing up.
#include <gtest/gtest.h>

#include "sched_util.h"

namespace {

rtr_sched_worker W(int up, cfg_role role, int running = 0, int waiting = 0, int inflight = 0, int free_blocks = 10) {
  rtr_sched_worker w{};
  w.up = up;
  w.role = role;
  w.running = running;
  w.waiting = waiting;
  w.inflight = inflight;
  w.free_blocks = free_blocks;
  w.total_blocks = 100;
  return w;
}

TEST(Sched, NothingUp) {
  rtr_sched_worker w[] = {W(0, CFG_ROLE_BOTH), W(1, CFG_ROLE_PREFILL)};
  rtr_sched_target t;
  EXPECT_EQ(rtr_sched_pick(w, 2, 10, Thr(100), &t), -1);
  EXPECT_EQ(rtr_sched_pick(w, 0, 10, Thr(100), &t), -1);
}

TEST(Sched, LeastLoadedBoth) {
  rtr_sched_worker w[] = {W(1, CFG_ROLE_BOTH, 3, 1, 2), W(1, CFG_ROLE_BOTH, 1, 0, 1), W(0, CFG_ROLE_BOTH),
                          W(1, CFG_ROLE_DECODE)};
  rtr_sched_target t;
  ASSERT_EQ(rtr_sched_pick(w, 4, 5000, Thr(100), &t), 0);
  EXPECT_EQ(t.decode, 1);
  EXPECT_EQ(t.prefill, -1);
}

TEST(Sched, DecodeWithPrefillForLongPrompts) {
  rtr_sched_worker w[] = {W(1, CFG_ROLE_PREFILL, 0, 4, 1), W(1, CFG_ROLE_DECODE, 5, 0, 0, 50),
                          W(1, CFG_ROLE_DECODE, 2, 0, 1, 5), W(1, CFG_ROLE_PREFILL, 0, 1, 0)};
  rtr_sched_target t;
  ASSERT_EQ(rtr_sched_pick(w, 4, 2000, Thr(1000), &t), 0);
  EXPECT_EQ(t.decode, 2);  // fewest running
  EXPECT_EQ(t.prefill, 3); // shortest queue
  ASSERT_EQ(rtr_sched_pick(w, 4, 999, Thr(1000), &t), 0); // short prompt: prefilled on the decode worker
  EXPECT_EQ(t.decode, 2);
  EXPECT_EQ(t.prefill, -1);
  w[1].running = 2; // tie on load: more free blocks wins
  w[2].inflight = 2;
  ASSERT_EQ(rtr_sched_pick(w, 4, 2000, Thr(1000), &t), 0);
  EXPECT_EQ(t.decode, 1);
}

// A prefill worker hands off only to a decode worker of the same kv_type and block size (their link refuses any other
// pair at the hello): with none, the decode worker computes the prompt itself.
TEST(Sched, PrefillPairsOnlyWithTheSameKvLayout) {
  rtr_sched_worker w[] = {W(1, CFG_ROLE_DECODE), W(1, CFG_ROLE_PREFILL), W(1, CFG_ROLE_PREFILL, 0, 3, 0)};
  w[0].kv_type = 8; // q8_0
  w[1].kv_type = 1; // f16, the idle one
  w[2].kv_type = 8;
  rtr_sched_target t;
  ASSERT_EQ(rtr_sched_pick(w, 3, 5000, Thr(100), &t), 0);
  EXPECT_EQ(t.decode, 0);
  EXPECT_EQ(t.prefill, 2); // the busier one, of the decode worker's type
  w[2].block_size = 32;
  ASSERT_EQ(rtr_sched_pick(w, 3, 5000, Thr(100), &t), 0);
  EXPECT_EQ(t.prefill, -1);
  w[2].block_size = 16; // 16 is what 0 means
  w[2].kv_type = 1;
  ASSERT_EQ(rtr_sched_pick(w, 3, 5000, Thr(100), &t), 0);
  EXPECT_EQ(t.prefill, -1);
  // The same type and block size, another shape: an MLA model's latent row (1 part) beside K and V (2 parts).
  w[1].kv_type = w[2].kv_type = 8;
  w[0].n_layer = w[1].n_layer = w[2].n_layer = 2;
  w[0].kv_parts = w[2].kv_parts = 2, w[1].kv_parts = 1;
  w[0].kv_width = w[2].kv_width = 128, w[1].kv_width = 96;
  w[0].kv_groups = w[1].kv_groups = w[2].kv_groups = 1;
  ASSERT_EQ(rtr_sched_pick(w, 3, 5000, Thr(100), &t), 0);
  EXPECT_EQ(t.prefill, 2); // the busier one: the idle one keeps a latent row
  w[2].n_layer = 3;
  ASSERT_EQ(rtr_sched_pick(w, 3, 5000, Thr(100), &t), 0);
  EXPECT_EQ(t.prefill, -1);
  w[2].n_layer = 2, w[2].kv_groups = 2; // a sliding-window pool's layer groups
  ASSERT_EQ(rtr_sched_pick(w, 3, 5000, Thr(100), &t), 0);
  EXPECT_EQ(t.prefill, -1);
}

TEST(Sched, DecodeAloneWhenNoPrefillUp) {
  rtr_sched_worker w[] = {W(0, CFG_ROLE_PREFILL), W(1, CFG_ROLE_DECODE)};
  rtr_sched_target t;
  ASSERT_EQ(rtr_sched_pick(w, 2, 5000, Thr(100), &t), 0);
  EXPECT_EQ(t.decode, 1);
  EXPECT_EQ(t.prefill, -1);
  rtr_sched_worker p[] = {W(1, CFG_ROLE_PREFILL)};
  EXPECT_EQ(rtr_sched_pick(p, 1, 5000, Thr(100), &t), -1); // prefill alone cannot generate
}

TEST(Sched, AutoDisaggregatesOnlyForABusyDecodeWorkerAndAShortPrefillQueue) {
  rtr_disagg_rule rule = {CFG_DISAGG_AUTO, 256, 1};
  rtr_sched_worker w[] = {W(1, CFG_ROLE_DECODE), W(1, CFG_ROLE_PREFILL)};
  rtr_sched_target t;
  ASSERT_EQ(rtr_sched_pick(w, 2, 2000, &rule, &t), 0);
  EXPECT_EQ(t.prefill, -1); // an idle decode worker computes the prompt as fast and skips the transfer
  w[0].running = 3;
  ASSERT_EQ(rtr_sched_pick(w, 2, 2000, &rule, &t), 0);
  EXPECT_EQ(t.decode, 0);
  EXPECT_EQ(t.prefill, 1); // busy decoding: the prompt goes where it does not stall the decode steps
  ASSERT_EQ(rtr_sched_pick(w, 2, 255, &rule, &t), 0);
  EXPECT_EQ(t.prefill, -1); // under the threshold: not worth a handoff
  w[1].inflight = 1;
  ASSERT_EQ(rtr_sched_pick(w, 2, 2000, &rule, &t), 0);
  EXPECT_EQ(t.prefill, 1); // one prompt in the prefill queue: at the limit
  w[1].waiting = 1;
  ASSERT_EQ(rtr_sched_pick(w, 2, 2000, &rule, &t), 0);
  EXPECT_EQ(t.prefill, -1); // two: over it, the prompt would wait longer there
  w[1] = W(1, CFG_ROLE_PREFILL);
  w[0] = W(1, CFG_ROLE_DECODE, 0, 0, 1); // a request sent to it and not yet started counts as busy
  ASSERT_EQ(rtr_sched_pick(w, 2, 2000, &rule, &t), 0);
  EXPECT_EQ(t.prefill, 1);
  w[0] = W(1, CFG_ROLE_DECODE, 0, 2);
  EXPECT_EQ(rtr_sched_disagg(&rule, 2000, &w[0], &w[1]), 1); // so do waiting ones
  rule.policy = CFG_DISAGG_THRESHOLD;
  w[0] = W(1, CFG_ROLE_DECODE);
  w[1].waiting = 9;
  EXPECT_EQ(rtr_sched_disagg(&rule, 2000, &w[0], &w[1]), 1); // threshold: length alone decides
  EXPECT_EQ(rtr_sched_disagg(&rule, 255, &w[0], &w[1]), 0);
}

} // namespace
