// tests/util/test_json.cc: the JSON pre-pass (util/json.h): each problem found with its path and byte offset, and
// what it must not take for one.
#include <gtest/gtest.h>

#include <string>

extern "C" {
#include "util/json.h"
}

namespace {

struct Check {
  int rc;
  utl_json_issue is;
  explicit Check(const std::string &t, int depth = 1000) { rc = utl_json_check(t.data(), t.size(), depth, &is); }
};

TEST(UtlJson, FindsEachProblemWithItsPlace) {
  struct Case {
    std::string text;
    utl_json_problem what;
    size_t at;
    const char *path;
  } cases[] = {
      {R"({"a":1,"a":2})", UTL_JSON_DUP_KEY, 7, "a"},
      {R"({"a":{"b":[1,{"c":0,"\u0063":1}]}})", UTL_JSON_DUP_KEY, 20, "a.b[1].\\u0063"},
      {R"({"":1,"":2})", UTL_JSON_DUP_KEY, 6, ""},
      {R"([[[[[1]]]]])", UTL_JSON_TOO_DEEP, 4, "[0][0][0][0]"},
      {R"({"s":"x\ud800"})", UTL_JSON_SURROGATE, 7, "s"},
      {R"({"s":"\udfff\ud800"})", UTL_JSON_SURROGATE, 6, "s"},
      {R"({"k\ud800":1})", UTL_JSON_SURROGATE, 3, "k\\ud800"},
      {R"(["a\u0000"])", UTL_JSON_NUL, 3, "[0]"},
      {std::string("[\"a\0\"]", 6), UTL_JSON_NUL, 3, "[0]"},
      {R"({"n":[1,-01]})", UTL_JSON_BAD_NUMBER, 8, "n[1]"},
      {R"([1.])", UTL_JSON_BAD_NUMBER, 1, "[0]"},
      {R"([1e])", UTL_JSON_BAD_NUMBER, 1, "[0]"},
      {R"([-])", UTL_JSON_BAD_NUMBER, 1, "[0]"},
  };
  for (const Case &c : cases) {
    Check k(c.text, 4);
    ASSERT_EQ(k.rc, 1) << c.text;
    EXPECT_EQ(k.is.what, c.what) << c.text;
    EXPECT_EQ(k.is.at, c.at) << c.text;
    EXPECT_STREQ(k.is.path, c.path) << c.text;
  }
}

TEST(UtlJson, AcceptsWhatIsFine) {
  for (const char *t : {R"({"a":{"a":1},"b":{"a":2}})", R"({"a":"a","b":"\"a\":"})", R"(["\ud83d\ude00", "\\ud800"])",
                        R"([0, -0, 1.5e+10, 2E-3, 10, -0.0])", R"({"k":"\u0041","K":1})", "[[[]]]"}) {
    Check k(t, 3);
    EXPECT_EQ(k.rc, 0) << t << ": " << utl_json_problem_name(k.is.what) << " at " << k.is.at;
  }
  std::string many = "{"; // many keys in one object: found by hashing, not pairwise
  for (int i = 0; i < 50000; i++) many += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  Check big(many + "}");
  EXPECT_EQ(big.rc, 0);
  Check dup(many + ",\"k49999\":2}");
  ASSERT_EQ(dup.rc, 1);
  EXPECT_STREQ(dup.is.path, "k49999");
}

} // namespace
