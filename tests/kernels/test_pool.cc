// tests/kernels/test_pool.cc: the thread pool: every thread runs once per run, many runs in a row, bad sizes refused.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include <unistd.h>

#include "kernels/krn.h"

namespace {
struct Tally {
  std::vector<std::atomic<int>> hits;
  std::atomic<int> bad_nth{0};
  int want_nth;
  explicit Tally(int n) : hits(n), want_nth(n) {}
};
void tally(void *vp, int ith, int nth) {
  Tally *t = (Tally *)vp;
  if (nth != t->want_nth || ith < 0 || ith >= nth) { t->bad_nth++; return; }
  t->hits[ith]++;
}
} // namespace

class KrnPool : public ::testing::TestWithParam<int> {};

TEST_P(KrnPool, EveryThreadOncePerRun) {
  int n = GetParam();
  char err[128] = "";
  krn_pool *p = krn_pool_new(n, err, sizeof err);
  ASSERT_NE(p, nullptr) << err;
  EXPECT_EQ(krn_pool_threads(p), n);
  Tally t(n);
  const int runs = n <= 2 ? 20000 : 2000; // 4 threads oversubscribe a 2-core machine: fewer runs
  for (int r = 0; r < runs; r++) krn_pool_run(p, tally, &t);
  EXPECT_EQ(t.bad_nth.load(), 0);
  for (int i = 0; i < n; i++) EXPECT_EQ(t.hits[i].load(), runs) << "thread " << i;
  krn_pool_free(p);
}

// Workers that went to sleep between runs are woken again.
TEST_P(KrnPool, WakesAfterSleeping) {
  int n = GetParam();
  krn_pool *p = krn_pool_new(n, nullptr, 0);
  ASSERT_NE(p, nullptr);
  Tally t(n);
  for (int r = 0; r < 3; r++) {
    krn_pool_run(p, tally, &t);
    usleep(20000);
  }
  for (int i = 0; i < n; i++) EXPECT_EQ(t.hits[i].load(), 3);
  krn_pool_free(p);
}

INSTANTIATE_TEST_SUITE_P(Threads, KrnPool, ::testing::Values(1, 2, 4));

TEST(KrnPoolErrors, BadSizesAndNull) {
  char err[128] = "";
  EXPECT_EQ(krn_pool_new(0, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("out of range"), std::string::npos) << err;
  EXPECT_EQ(krn_pool_new(-3, nullptr, 0), nullptr);
  krn_pool_free(nullptr);
  EXPECT_EQ(krn_pool_threads(nullptr), 1);
  // a NULL pool runs the task inline as thread 0 of 1
  Tally t(1);
  krn_pool_run(nullptr, tally, &t);
  EXPECT_EQ(t.hits[0].load(), 1);
}
