// tests/decode/test_stopstr.cc: stop strings matched across token boundaries, never leaked, never split.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decode/stopstr.h"

// Feeds pieces; returns the text released and whether (and at which piece) a stop hit.
static std::string run(std::vector<std::string> stops, std::vector<std::string> pieces, int *hit_at) {
  std::vector<const char *> sp;
  for (auto &s : stops) sp.push_back(s.c_str());
  dec_stopstr s;
  EXPECT_EQ(dec_stopstr_init(&s, sp.data(), (int)sp.size()), 0);
  std::string text;
  *hit_at = -1;
  for (size_t i = 0; i < pieces.size(); i++) {
    char *out;
    size_t n;
    int hit = dec_stopstr_push(&s, pieces[i].data(), pieces[i].size(), &out, &n);
    text.append(out, n);
    free(out);
    if (hit) {
      *hit_at = (int)i;
      break;
    }
  }
  if (*hit_at < 0) {
    char *out;
    size_t n;
    dec_stopstr_flush(&s, &out, &n);
    text.append(out, n);
    free(out);
  }
  dec_stopstr_free(&s);
  return text;
}

TEST(StopStr, NoStopsPassesEverything) {
  int hit;
  EXPECT_EQ(run({}, {"Hello", " world"}, &hit), "Hello world");
  EXPECT_EQ(hit, -1);
}

TEST(StopStr, MatchAcrossPieces) {
  int hit;
  EXPECT_EQ(run({"\n\n"}, {"Paris", ".\n", "\nMore"}, &hit), "Paris.");
  EXPECT_EQ(hit, 2);
  EXPECT_EQ(run({"END"}, {"abc E", "N", "D tail"}, &hit), "abc ");
  EXPECT_EQ(hit, 2);
}

TEST(StopStr, EarliestOfSeveralWins) {
  int hit;
  EXPECT_EQ(run({"world", "lo w"}, {"hello world"}, &hit), "hel");
  EXPECT_EQ(hit, 0);
}

TEST(StopStr, FalseStartIsReleased) {
  int hit;
  EXPECT_EQ(run({"STOP"}, {"ST", "OCK", " market"}, &hit), "STOCK market");
  EXPECT_EQ(hit, -1);
}

TEST(StopStr, HeldTextReleasedOnFlushAndNeverSplitsUtf8) {
  int hit;
  EXPECT_EQ(run({"\xc3\xa9t\xc3\xa9"}, {"caf\xc3\xa9", "\xc3\xa9t"}, &hit), "caf\xc3\xa9\xc3\xa9t");
  EXPECT_EQ(hit, -1);
  // what is released before the flush is whole characters
  dec_stopstr s;
  const char *st[] = {"\xc3\xa9X"};
  ASSERT_EQ(dec_stopstr_init(&s, st, 1), 0);
  char *out;
  size_t n;
  dec_stopstr_push(&s, "a\xc3\xa9", 3, &out, &n);
  EXPECT_EQ(std::string(out, n), "a");
  free(out);
  dec_stopstr_push(&s, "b", 1, &out, &n);
  EXPECT_EQ(std::string(out, n), "\xc3\xa9" "b");
  free(out);
  dec_stopstr_free(&s);
}

TEST(StopStr, StopAtVeryStart) {
  int hit;
  EXPECT_EQ(run({"Hi"}, {"Hi there"}, &hit), "");
  EXPECT_EQ(hit, 0);
}
