// tests/models/test_grammar_num.cc: JSON Schema's numeric keywords in the grammar (models/json_schema_num.c): every
// integer in the bounds (and a multiple) is accepted and nothing outside is, checked value by value; numbers with
// bounds accept only values inside them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "grammar_util.h"

namespace {

struct IntCase {
  const char *schema;
  long lo, hi, mult; // the integers the schema allows: lo..hi, multiples of mult
};

TEST(GrammarNumbers, IntegerRangesValueByValue) {
  const IntCase cases[] = {
      {R"({"type":"integer","minimum":0,"maximum":100})", 0, 100, 1},
      {R"({"type":"integer","minimum":1,"maximum":10})", 1, 10, 1},
      {R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":120})", 1, 119, 1},
      {R"({"type":"integer","minimum":-37,"maximum":512})", -37, 512, 1},
      {R"({"type":"integer","minimum":-1000,"maximum":-5})", -1000, -5, 1},
      {R"({"type":"integer","minimum":18})", 18, 1L << 40, 1},
      {R"({"type":"integer","maximum":-3})", -(1L << 40), -3, 1},
      {R"({"type":"integer","minimum":2.5,"maximum":7.5})", 3, 7, 1},
      {R"({"type":"integer","minimum":5,"exclusiveMinimum":9,"maximum":90,"exclusiveMaximum":40})", 10, 39, 1},
      {R"({"type":"integer","minimum":3,"exclusiveMinimum":true,"maximum":9})", 4, 9, 1}, // draft 4's boolean form
      {R"({"type":"integer","minimum":999,"maximum":1001})", 999, 1001, 1},
      {R"({"type":"integer","multipleOf":7})", -(1L << 40), 1L << 40, 7},
      {R"({"type":"integer","multipleOf":5,"minimum":-23,"maximum":101})", -23, 101, 5},
      {R"({"type":"integer","multipleOf":12,"exclusiveMinimum":0})", 1, 1L << 40, 12},
      {R"({"type":"number","multipleOf":3,"maximum":30})", -(1L << 40), 30, 3}, // whole multiples: integers
      {R"({"minimum":10,"maximum":20})", 10, 20, 1}, // numeric keywords imply a number
  };
  for (const IntCase &c : cases) {
    Grammar g(c.schema);
    ASSERT_EQ(g.rc, 0) << c.schema << ": " << g.err;
    for (long v = -1300; v <= 1300; v++) {
      bool want = v >= c.lo && v <= c.hi && v % c.mult == 0;
      EXPECT_EQ(g.ok(std::to_string(v)), want) << c.schema << " at " << v;
    }
    for (const char *bad : {"-0", "007", "+5", "", "-", "1e2"}) EXPECT_REJECTS(g, bad) << " in " << c.schema;
  }
  Grammar big(R"({"type":"integer","minimum":123456789012,"maximum":123456799999})");
  ASSERT_EQ(big.rc, 0) << big.err;
  EXPECT_ACCEPTS(big, "123456789012");
  EXPECT_ACCEPTS(big, "123456799999");
  EXPECT_ACCEPTS(big, "123456790000");
  EXPECT_REJECTS(big, "123456789011");
  EXPECT_REJECTS(big, "123456800000");
  Grammar m7(R"({"type":"integer","multipleOf":7})");
  EXPECT_ACCEPTS(m7, "700000000000007");
  EXPECT_REJECTS(m7, "700000000000008");
}

// v written as the grammar writes numbers: no trailing zeros after the point, no point for a whole number.
std::string canonical(long k, int decimals) {
  char s[64];
  snprintf(s, sizeof s, "%.*f", decimals, (double)k / std::pow(10.0, decimals));
  std::string r = s;
  if (r.find('.') != std::string::npos) {
    while (r.back() == '0') r.pop_back();
    if (r.back() == '.') r.pop_back();
  }
  return r == "-0" ? "0" : r;
}

// A number under bounds, value by value on a grid of hundredths (and of thousandths near the bounds): accepted
// exactly when inside, whole numbers and fractions alike.
TEST(GrammarNumbers, NumberBoundsValueByValue) {
  struct Case {
    const char *schema;
    double lo, hi;
    bool lo_excl, hi_excl;
  } cases[] = {
      {R"({"type":"number","minimum":0,"maximum":1})", 0, 1, false, false},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":5})", 0, 5, true, true},
      {R"({"type":"number","minimum":-2.5,"maximum":3.25})", -2.5, 3.25, false, false},
      {R"({"type":"number","maximum":0})", -1e300, 0, false, false},
      {R"({"type":"number","exclusiveMaximum":0})", -1e300, 0, false, true},
      {R"({"type":"number","minimum":1.5})", 1.5, 1e300, false, false},
      {R"({"type":"number","minimum":0.25,"maximum":0.75})", 0.25, 0.75, false, false},
      {R"({"type":"number","exclusiveMinimum":0.25,"exclusiveMaximum":0.75})", 0.25, 0.75, true, true},
      {R"({"type":"number","minimum":0.1,"maximum":0.9})", 0.1, 0.9, false, false},
      {R"({"type":"number","minimum":-0.75,"maximum":-0.05})", -0.75, -0.05, false, false},
      {R"({"type":"number","exclusiveMinimum":-1.125,"maximum":2.375})", -1.125, 2.375, true, false},
      {R"({"type":"number","minimum":0.333,"maximum":0.334})", 0.333, 0.334, false, false},
      {R"({"type":"number","minimum":2.5,"maximum":2.5})", 2.5, 2.5, false, false},
  };
  for (const Case &c : cases) {
    Grammar g(c.schema);
    ASSERT_EQ(g.rc, 0) << c.schema << ": " << g.err;
    for (int decimals : {2, 3}) {
      long span = decimals == 2 ? 400 : 4000;
      for (long k = -span; k <= span; k++) {
        std::string p = canonical(k, decimals);
        double v = strtod(p.c_str(), nullptr);
        bool inside = (c.lo_excl ? v > c.lo : v >= c.lo) && (c.hi_excl ? v < c.hi : v <= c.hi);
        EXPECT_EQ(g.ok(p), inside) << c.schema << " at " << p;
      }
    }
    for (const char *bad : {"0.50", "1.", ".5", "-0", "1e0", "0.0"}) EXPECT_REJECTS(g, bad) << " in " << c.schema;
  }
  Grammar neg(R"({"type":"number","maximum":0})");
  EXPECT_ACCEPTS(neg, "-12.75");
  EXPECT_ACCEPTS(neg, "-0.0000000000000001"); // 16 decimals
  EXPECT_REJECTS(neg, "-0.00000000000000001"); // 17: past the grammar's digits
}

// multipleOf a power of ten below one: at most that many decimals, with the bounds.
TEST(GrammarNumbers, DecimalMultiples) {
  Grammar g(R"({"type":"number","multipleOf":0.01,"minimum":-1.5,"maximum":2.125})");
  ASSERT_EQ(g.rc, 0) << g.err;
  for (long k = -4000; k <= 4000; k++) {
    std::string p = canonical(k, 3);
    double v = strtod(p.c_str(), nullptr);
    EXPECT_EQ(g.ok(p), v >= -1.5 && v <= 2.125 && k % 10 == 0) << p;
  }
  Grammar free(R"({"type":"number","multipleOf":0.1})");
  ASSERT_EQ(free.rc, 0) << free.err;
  EXPECT_ACCEPTS(free, "-123456.7");
  EXPECT_REJECTS(free, "0.75");
  Grammar whole(R"({"type":"integer","multipleOf":0.01,"maximum":3})"); // every integer is a multiple
  ASSERT_EQ(whole.rc, 0) << whole.err;
  EXPECT_ACCEPTS(whole, "3");
  EXPECT_REJECTS(whole, "2.5");
  Grammar e(R"({"enum":[0.07, 0.075],"multipleOf":0.01})");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_ACCEPTS(e, "0.07");
  EXPECT_REJECTS(e, "0.075");
}

TEST(GrammarNumbers, EnumValuesOutsideTheBoundsAreLeftOut) {
  Grammar g(R"({"enum":[1,5,9,"x"],"minimum":2,"maximum":8})");
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_ACCEPTS(g, "5");
  EXPECT_ACCEPTS(g, "\"x\"");
  EXPECT_REJECTS(g, "1");
  EXPECT_REJECTS(g, "9");
}

TEST(GrammarNumbers, Errors) {
  struct Case {
    const char *schema;
    int rc;
    const char *needle;
  } cases[] = {
      {R"({"type":"integer","minimum":5,"maximum":4})", -1, "nothing can satisfy"},
      {R"({"type":"integer","minimum":4.2,"maximum":4.8})", -1, "nothing can satisfy"},
      {R"({"type":"integer","exclusiveMinimum":3,"exclusiveMaximum":4})", -1, "nothing can satisfy"},
      {R"({"type":"number","minimum":2,"exclusiveMaximum":2})", -1, "nothing can satisfy"},
      {R"({"type":"integer","multipleOf":10,"minimum":11,"maximum":19})", -1, "multiple of 10"},
      {R"({"type":"integer","minimum":"3"})", -1, "'minimum' must be a number"},
      {R"({"type":"integer","multipleOf":0})", -1, "'multipleOf' must be"},
      {R"({"type":"integer","exclusiveMaximum":true})", -1, "'exclusiveMaximum': true needs 'maximum'"},
      {R"({"type":"number","multipleOf":0.05})", MDL_GRAMMAR_UNSUPPORTED, "'multipleOf' 0.05"},
      {R"({"type":"number","multipleOf":0.01,"minimum":0.001,"maximum":0.009})", -1, "multiple of 0.01"},
      {R"({"type":"integer","multipleOf":100000})", MDL_GRAMMAR_UNSUPPORTED, "'multipleOf' over"},
      {R"({"type":"integer","minimum":1e17})", MDL_GRAMMAR_UNSUPPORTED, "16 digits"},
      {R"({"type":"number","minimum":0.7,"maximum":0.3})", -1, "nothing can satisfy"},
      {R"({"type":"number","exclusiveMinimum":0.5,"maximum":0.5})", -1, "nothing can satisfy"},
      {R"({"type":"number","minimum":1e-50})", MDL_GRAMMAR_UNSUPPORTED, "more than 40 decimals"},
      {R"({"type":"object","properties":{"a":{"type":"integer","minimum":9,"maximum":1}}})", -1, "#/properties/a"},
  };
  for (const Case &c : cases) {
    Grammar g(c.schema);
    EXPECT_EQ(g.rc, c.rc) << c.schema << ": " << g.err;
    EXPECT_NE(strstr(g.err, c.needle), nullptr) << c.schema << ": " << g.err;
    EXPECT_EQ(g.g, nullptr);
  }
}

} // namespace

// Numbers in a schema are read from their literals, never through a double (issue 39 item 7): bounds beyond 2^53,
// decimals beyond a double's 17 digits and big const / enum values are kept exactly, and what cannot be kept exactly
// is refused naming the keyword and the place.
TEST(GrammarNumbers, LiteralsAreExact) {
  Grammar big(R"({"type":"integer","minimum":9007199254740993,"maximum":9007199254740993})");
  ASSERT_EQ(big.rc, 0) << big.err;
  EXPECT_ACCEPTS(big, "9007199254740993");
  EXPECT_REJECTS(big, "9007199254740992");
  EXPECT_REJECTS(big, "9007199254740994");
  Grammar excl(R"({"type":"integer","exclusiveMinimum":9007199254740992,"exclusiveMaximum":9007199254740995})");
  ASSERT_EQ(excl.rc, 0) << excl.err;
  EXPECT_REJECTS(excl, "9007199254740992");
  EXPECT_ACCEPTS(excl, "9007199254740993");
  EXPECT_ACCEPTS(excl, "9007199254740994");
  EXPECT_REJECTS(excl, "9007199254740995");
  Grammar c1(R"({"const":0.30000000000000004})");
  ASSERT_EQ(c1.rc, 0) << c1.err;
  EXPECT_ACCEPTS(c1, "0.30000000000000004");
  EXPECT_REJECTS(c1, "0.3");
  Grammar c2(R"({"type":"integer","const":123456789012345678})");
  ASSERT_EQ(c2.rc, 0) << c2.err;
  EXPECT_ACCEPTS(c2, "123456789012345678");
  EXPECT_REJECTS(c2, "1.2345678901234568e+17");
  Grammar e(R"({"type":"integer","enum":[9007199254740993,9007199254740992,1.0,1.5,2e1],"maximum":9007199254740992})");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_ACCEPTS(e, "9007199254740992");
  EXPECT_REJECTS(e, "9007199254740993"); // above the maximum by one: a double cannot tell them apart
  EXPECT_ACCEPTS(e, "1.0");              // an integer written with a fraction, as the schema wrote it
  EXPECT_REJECTS(e, "1.5");
  EXPECT_ACCEPTS(e, "2e1");
  Grammar d(R"({"type":"number","minimum":0.30000000000000004,"maximum":0.30000000000000005})");
  ASSERT_EQ(d.rc, 0) << d.err;
  EXPECT_ACCEPTS(d, "0.30000000000000004");
  EXPECT_ACCEPTS(d, "0.30000000000000005"); // as many decimals as the bounds have (17, one past a double's 16)
  EXPECT_REJECTS(d, "0.3");
  EXPECT_REJECTS(d, "0.30000000000000006");
  Grammar m(R"({"enum":[0.3,0.7,0.75],"multipleOf":0.1})");
  ASSERT_EQ(m.rc, 0) << m.err;
  EXPECT_ACCEPTS(m, "0.3"); // 0.3 / 0.1 is 2.9999999999999996 in doubles
  EXPECT_ACCEPTS(m, "0.7");
  EXPECT_REJECTS(m, "0.75");

  struct Case {
    const char *schema;
    int rc;
    const char *needle;
  } cases[] = {
      {R"({"type":"number","multipleOf":0.10000000000000001})", MDL_GRAMMAR_UNSUPPORTED,
       "'multipleOf' 0.10000000000000001"},
      {R"({"properties":{"a":{"minimum":1.00000000000000000000000000000000000000001}}})", MDL_GRAMMAR_UNSUPPORTED,
       "#/properties/a"},
      {R"({"const":1,"const":2})", -1, "a duplicate key at byte 11, at const"},
      {R"({"const":01})", -1, "a malformed number"},
      {R"({"enum":["\udc00"]})", -1, "a lone UTF-16 surrogate"},
  };
  for (const Case &c : cases) {
    Grammar g(c.schema);
    EXPECT_EQ(g.rc, c.rc) << c.schema << ": " << g.err;
    EXPECT_NE(strstr(g.err, c.needle), nullptr) << c.schema << ": " << g.err;
  }
}
