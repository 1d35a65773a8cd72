// tests/util/test_util.cc: the byte buffer (growth, binary content, printf, sticky out-of-memory), utl_seterr, the
// growable array, the monotonic clock and the once-a-minute gate of repeated log lines.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "util/buf.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/repeat.h"
#include "util/vec.h"

TEST(Buf, EmptyTakeIsAnEmptyString) {
  utl_buf b = {};
  char *s = utl_buf_take(&b);
  ASSERT_NE(s, nullptr);
  EXPECT_STREQ(s, "");
  EXPECT_EQ(b.p, nullptr);
  free(s);
}

TEST(Buf, AppendsGrowAndStayTerminated) {
  utl_buf b = {};
  std::string want;
  for (int i = 0; i < 1000; i++) {
    ASSERT_EQ(utl_buf_printf(&b, "%d,", i), 0);
    want += std::to_string(i) + ",";
    ASSERT_EQ(b.n, want.size());
    ASSERT_EQ(b.p[b.n], '\0');
  }
  ASSERT_EQ(utl_buf_adds(&b, "end"), 0);
  want += "end";
  EXPECT_GE(b.cap, b.n + 1);
  char *s = utl_buf_take(&b);
  EXPECT_EQ(std::string(s), want);
  free(s);
}

TEST(Buf, BinaryContentKeepsNuls) {
  utl_buf b = {};
  const char bytes[] = {'a', 0, 'b', 0};
  ASSERT_EQ(utl_buf_add(&b, bytes, sizeof bytes), 0);
  ASSERT_EQ(utl_buf_add(&b, bytes, 0), 0);
  EXPECT_EQ(b.n, sizeof bytes);
  EXPECT_EQ(memcmp(b.p, bytes, sizeof bytes), 0);
  utl_buf_reset(&b);
  EXPECT_EQ(b.n, 0u);
  EXPECT_STREQ(b.p, "");
  utl_buf_free(&b);
  EXPECT_EQ(b.p, nullptr);
  utl_buf_free(&b); // freeing an empty buffer is a no-op
}

TEST(Buf, OutOfMemoryIsStickyAndTakeReturnsNull) {
  utl_buf b = {};
  ASSERT_EQ(utl_buf_adds(&b, "abc"), 0);
  // A size no allocator can grant is refused without touching memory; every later call fails too.
  EXPECT_EQ(utl_buf_add(&b, "x", (size_t)-1 / 2), -1);
  EXPECT_TRUE(b.oom);
  EXPECT_EQ(utl_buf_adds(&b, "more"), -1);
  EXPECT_EQ(utl_buf_printf(&b, "%d", 1), -1);
  EXPECT_EQ(utl_buf_take(&b), nullptr);
  EXPECT_EQ(b.p, nullptr);
  EXPECT_FALSE(b.oom); // take leaves it empty and usable
  ASSERT_EQ(utl_buf_adds(&b, "ok"), 0);
  utl_buf_free(&b);
}

TEST(Err, FillsTruncatesAndIgnoresNull) {
  char e[8];
  utl_seterr(e, sizeof e, "%s %d", "value", 12345);
  EXPECT_STREQ(e, "value 1"); // truncated to 7 characters and the NUL
  utl_seterr(nullptr, 10, "ignored");
  char one[1] = {'x'};
  utl_seterr(one, 0, "ignored");
  EXPECT_EQ(one[0], 'x');
}

TEST(Vec, PushGrowsAndKeepsEveryElement) {
  int *a = nullptr, n = 0, cap = 0;
  for (int i = 0; i < 1000; i++) ASSERT_EQ(UTL_VEC_PUSH(a, n, cap, i * 3), 0);
  ASSERT_EQ(n, 1000);
  ASSERT_GE(cap, 1000);
  for (int i = 0; i < 1000; i++) ASSERT_EQ(a[i], i * 3);
  free(a);
}

TEST(Vec, ReserveRefusesWhatCannotBeAllocatedAndLosesNothing) {
  long *a = nullptr;
  int n = 0, cap = 0;
  ASSERT_EQ(UTL_VEC_PUSH(a, n, cap, 7L), 0);
  long *before = a;
  int cap_before = cap;
  EXPECT_EQ(utl_vec_reserve((void **)&a, &cap, 2000000000, sizeof *a * 1024 * 1024), -1); // bytes overflow
  EXPECT_EQ(utl_vec_reserve((void **)&a, &cap, -1, sizeof *a), 0); // nothing needed
  EXPECT_EQ(a, before);
  EXPECT_EQ(cap, cap_before);
  EXPECT_EQ(a[0], 7L);
  free(a);
}

TEST(Clock, UnitsAgreeAndNeverGoBack) {
  int64_t ns0 = utl_now_ns(), ms0 = utl_now_ms();
  struct timespec d = {0, 20 * 1000 * 1000};
  nanosleep(&d, nullptr);
  int64_t ns1 = utl_now_ns(), us1 = utl_now_us(), ms1 = utl_now_ms();
  EXPECT_GE(ns1 - ns0, 20 * 1000 * 1000);
  EXPECT_GE(ms1 - ms0, 19);
  EXPECT_GE(us1, ns1 / 1000); // read after ns1
  EXPECT_NEAR(utl_now_s() * 1e3, utl_now_ms_f(), 5.0);
}

TEST(Repeat, OncePerPeriodPerKeyWithACountOfWhatWasHeld) {
  utl_repeat r = {};
  r.period_ms = 60000;
  long held = -1;
  EXPECT_EQ(utl_repeat_pass(&r, "worker d0", 1000, &held), 1); // the first line logs
  EXPECT_EQ(held, 0);
  for (int i = 1; i <= 29; i++) EXPECT_EQ(utl_repeat_pass(&r, "worker d0", 1000 + 2000 * i, &held), 0); // every 2 s
  EXPECT_EQ(utl_repeat_pass(&r, "worker d1", 3000, &held), 1); // another key has its own minute
  EXPECT_EQ(utl_repeat_pass(&r, "worker d0", 61000, &held), 1); // a minute on: logs, and says what it held
  EXPECT_EQ(held, 29);
  EXPECT_EQ(utl_repeat_pass(&r, "worker d0", 62000, &held), 0);
  EXPECT_EQ(utl_repeat_pass(&r, "worker d0", 121000, &held), 1);
  EXPECT_EQ(held, 1);
  // more keys than slots: the stalest is forgotten, and a forgotten key logs at once rather than never
  for (int i = 0; i < UTL_REPEAT_SLOTS + 4; i++) {
    std::string k = "k" + std::to_string(i);
    EXPECT_EQ(utl_repeat_pass(&r, k.c_str(), 200000 + i, &held), 1) << k;
  }
  EXPECT_EQ(utl_repeat_pass(&r, "worker d0", 200100, &held), 1);
  r.period_ms = 0; // no gate: every line
  EXPECT_EQ(utl_repeat_pass(&r, "worker d0", 200101, &held), 1);
}
