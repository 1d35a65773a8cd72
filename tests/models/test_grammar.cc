// tests/models/test_grammar.cc: grammar-constrained decoding: JSON Schema keywords accept/reject texts, token masks
// over SmolLM2's vocabulary against brute force (and their cost), and constrained generation with the real model.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cjson/cJSON.h>

extern "C" {
#include "models/chat.h"
#include "models/gguf.h"
#include "models/grammar.h"
#include "models/llama.h"
#include "models/sampler.h"
#include "models/tokenizer.h"
}

#include "grammar_util.h"

namespace {

[[maybe_unused]] const char *kModel = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";


TEST(Grammar, JsonObjectMode) {
  Grammar g(nullptr);
  ASSERT_EQ(g.rc, 0) << g.err;
  for (const char *t : {"{}", "{ }", "{\"a\": 1}", "{\"a\":[1,2,{\"b\":null}],\"c\":true}", "{\n  \"a\": \"x\\n\"\n}",
                        "{\"a\": -0.5e+10, \"b\": \"\\u00e9\\\"\"}", "{\"\": {}}"})
    EXPECT_ACCEPTS(g, t);
  for (const char *t : {"[]", "\"x\"", " {}", "{}x", "{} ", "{\"a\":}", "{\"a\" 1}", "{\"a\":01}", "{'a':1}",
                        "{\"a\":1,}", "{\"a\":tru}", "{\"a\":\"\x01\"}", "{\"a\":\"\\ud800\"}"})
    EXPECT_REJECTS(g, t);
}

TEST(Grammar, Types) {
  Grammar s(R"({"type":"string"})"), n(R"({"type":"number"})"), i(R"({"type":"integer"})"), b(R"({"type":"boolean"})"),
      z(R"({"type":"null"})"), l(R"({"type":["integer","null"]})"), any("{}"), t("true");
  for (Grammar *g : {&s, &n, &i, &b, &z, &l, &any, &t}) ASSERT_EQ(g->rc, 0) << g->err;
  EXPECT_ACCEPTS(s, "\"héllo \\\"w\\\" \\t\"");
  EXPECT_REJECTS(s, "hello");
  EXPECT_ACCEPTS(n, "-12.5e3");
  EXPECT_ACCEPTS(n, "0");
  EXPECT_REJECTS(n, "1.");
  EXPECT_REJECTS(n, "+1");
  EXPECT_REJECTS(n, "12345678901234567"); // 17 integer digits: bounded so a model cannot count forever
  EXPECT_ACCEPTS(i, "-42");
  EXPECT_REJECTS(i, "4.2");
  EXPECT_ACCEPTS(b, "false");
  EXPECT_REJECTS(b, "null");
  EXPECT_ACCEPTS(z, "null");
  EXPECT_ACCEPTS(l, "7");
  EXPECT_ACCEPTS(l, "null");
  EXPECT_REJECTS(l, "\"7\"");
  for (Grammar *g : {&any, &t}) {
    EXPECT_ACCEPTS(*g, "[1, \"a\", {\"b\": [null]}]");
    EXPECT_ACCEPTS(*g, "\"x\"");
  }
}

TEST(Grammar, PropertiesInOrderRequiredOptional) {
  Grammar g(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},
               "required":["a","c"],"additionalProperties":false})");
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_ACCEPTS(g, "{\"a\":1,\"c\":true}");
  EXPECT_ACCEPTS(g, "{\"a\": 1, \"b\": \"x\", \"c\": false}");
  EXPECT_ACCEPTS(g, "{\n  \"a\": 1,\n  \"c\": true\n}");
  EXPECT_REJECTS(g, "{\"c\":true,\"a\":1}");          // schema order
  EXPECT_REJECTS(g, "{\"a\":1}");                     // c is required
  EXPECT_REJECTS(g, "{\"a\":1,\"c\":true,\"d\":1}");  // no other properties
  EXPECT_REJECTS(g, "{}");
  EXPECT_REJECTS(g, "{\"a\":\"1\",\"c\":true}");
  Grammar opt(R"({"properties":{"x":{"type":"null"},"y":{"type":"null"}}})"); // type implied by properties
  ASSERT_EQ(opt.rc, 0) << opt.err;
  for (const char *t : {"{}", "{\"x\":null}", "{\"y\":null}", "{\"x\":null,\"y\":null}"}) EXPECT_ACCEPTS(opt, t);
  EXPECT_REJECTS(opt, "{,\"y\":null}");
  EXPECT_REJECTS(opt, "{\"x\":null,}");
  Grammar req(R"({"type":"object","required":["k"]})"); // required without a schema: any value
  ASSERT_EQ(req.rc, 0) << req.err;
  EXPECT_ACCEPTS(req, "{\"k\":[1]}");
  EXPECT_REJECTS(req, "{}");
}

TEST(Grammar, AdditionalProperties) {
  Grammar map(R"({"type":"object","additionalProperties":{"type":"integer"}})"),
      none(R"({"type":"object","additionalProperties":false})"), open(R"({"type":"object"})");
  for (Grammar *g : {&map, &none, &open}) ASSERT_EQ(g->rc, 0) << g->err;
  EXPECT_ACCEPTS(map, "{\"x\":1,\"y\":2}");
  EXPECT_ACCEPTS(map, "{}");
  EXPECT_REJECTS(map, "{\"x\":\"a\"}");
  EXPECT_ACCEPTS(none, "{}");
  EXPECT_REJECTS(none, "{\"x\":1}");
  EXPECT_ACCEPTS(open, "{\"x\":{\"y\":[]}}");
  // A required property 'properties' does not list takes additionalProperties' schema (issue 29: "z" was any value,
  // and the model wrote {"a": 1, "z": 123} with finish_reason stop).
  Grammar req(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"},)"
              R"("required":["z"]})"),
      req_any(R"({"type":"object","required":["z"]})");
  ASSERT_EQ(req.rc, 0) << req.err;
  ASSERT_EQ(req_any.rc, 0) << req_any.err;
  EXPECT_ACCEPTS(req, "{\"a\":1,\"z\":true}");
  EXPECT_ACCEPTS(req, "{\"z\":false}");
  EXPECT_REJECTS(req, "{\"a\":1,\"z\":123}");
  EXPECT_REJECTS(req, "{\"a\":1}");
  EXPECT_ACCEPTS(req_any, "{\"z\":[1,\"x\"]}");
}

TEST(Grammar, EnumConst) {
  Grammar e(R"({"enum":["red","green",1,null,{"a":[true]}]})"), c(R"({"const":"on"})"),
      typed(R"({"type":"string","enum":["a",1]})");
  for (Grammar *g : {&e, &c, &typed}) ASSERT_EQ(g->rc, 0) << g->err;
  for (const char *t : {"\"red\"", "\"green\"", "1", "null", "{\"a\":[true]}"}) EXPECT_ACCEPTS(e, t);
  for (const char *t : {"\"blue\"", "\"re\"", "2", "{\"a\": [true]}"}) EXPECT_REJECTS(e, t);
  EXPECT_ACCEPTS(c, "\"on\"");
  EXPECT_REJECTS(c, "\"off\"");
  EXPECT_ACCEPTS(typed, "\"a\"");
  EXPECT_REJECTS(typed, "1"); // not a string: the type filters the enum
}

TEST(Grammar, ItemsMinMax) {
  Grammar g(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})"),
      empty(R"({"type":"array","maxItems":0})"), any(R"({"type":"array"})");
  for (Grammar *x : {&g, &empty, &any}) ASSERT_EQ(x->rc, 0) << x->err;
  for (const char *t : {"[1]", "[1, 2]", "[ 1,2 ,3 ]"}) EXPECT_ACCEPTS(g, t);
  for (const char *t : {"[]", "[1,2,3,4]", "[\"1\"]", "[1,]"}) EXPECT_REJECTS(g, t);
  EXPECT_ACCEPTS(empty, "[]");
  EXPECT_REJECTS(empty, "[1]");
  EXPECT_ACCEPTS(any, "[[], {}, \"x\"]");
}

TEST(Grammar, AnyOfOneOfAllOf) {
  Grammar a(R"({"anyOf":[{"type":"string"},{"type":"null"}],"title":"x"})"),
      o(R"({"oneOf":[{"type":"object","properties":{"k":{"const":1}},"required":["k"]},{"type":"integer"}]})"),
      all(R"({"allOf":[{"type":"boolean"}]})");
  for (Grammar *g : {&a, &o, &all}) ASSERT_EQ(g->rc, 0) << g->err;
  EXPECT_ACCEPTS(a, "\"s\"");
  EXPECT_ACCEPTS(a, "null");
  EXPECT_REJECTS(a, "1");
  EXPECT_ACCEPTS(o, "{\"k\":1}");
  EXPECT_ACCEPTS(o, "5");
  EXPECT_REJECTS(o, "{\"k\":2}");
  EXPECT_ACCEPTS(all, "true");
}

TEST(Grammar, LocalRefsAndRecursion) {
  Grammar tree(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
                   "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})"),
      old(R"({"definitions":{"a~b":{"type":"integer"}},"type":"object","properties":{"x":{"$ref":"#/definitions/a~0b"}}})"),
      self(R"({"type":"array","items":{"$ref":"#"},"maxItems":2})");
  for (Grammar *g : {&tree, &old, &self}) ASSERT_EQ(g->rc, 0) << g->err;
  EXPECT_ACCEPTS(tree, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4}]}]}");
  EXPECT_REJECTS(tree, "{\"v\":1,\"kids\":[{}]}");
  EXPECT_ACCEPTS(old, "{\"x\":3}");
  EXPECT_ACCEPTS(self, "[[],[[]]]");
  EXPECT_REJECTS(self, "[[],[],[]]");
}

TEST(Grammar, Formats) {
  Grammar d(R"({"type":"string","format":"date"})"), t(R"({"type":"string","format":"time"})"),
      dt(R"({"type":"string","format":"date-time"})"), u(R"({"type":"string","format":"uuid"})"),
      e(R"({"type":"string","format":"email"})");
  for (Grammar *g : {&d, &t, &dt, &u, &e}) ASSERT_EQ(g->rc, 0) << g->err;
  EXPECT_ACCEPTS(d, "\"2024-02-29\"");
  for (const char *x : {"\"2024-13-01\"", "\"2024-1-01\"", "\"24-01-01\"", "\"2024-01-32\""}) EXPECT_REJECTS(d, x);
  EXPECT_ACCEPTS(t, "\"12:30:00Z\"");
  EXPECT_ACCEPTS(t, "\"23:59:59.123+02:00\"");
  EXPECT_REJECTS(t, "\"24:00:00Z\"");
  EXPECT_REJECTS(t, "\"12:30:00\""); // RFC 3339 wants the offset
  EXPECT_ACCEPTS(dt, "\"2024-05-01T08:00:00Z\"");
  EXPECT_REJECTS(dt, "\"2024-05-01 08:00:00Z\"");
  EXPECT_ACCEPTS(u, "\"123e4567-e89b-12d3-a456-426614174000\"");
  EXPECT_REJECTS(u, "\"123e4567-e89b-12d3-a456-42661417400\"");
  EXPECT_ACCEPTS(e, "\"a.b+c@mail.example.org\"");
  for (const char *x : {"\"ab\"", "\"a@b\"", "\"a@b.c\"", "\"@b.com\""}) EXPECT_REJECTS(e, x);
}

TEST(Grammar, Patterns) {
  Grammar a(R"({"type":"string","pattern":"^[a-z]+\\d{2,3}$"})"), un(R"({"type":"string","pattern":"ab"})"),
      alt(R"({"type":"string","pattern":"^(cat|dog)s?$|^x+$"})"), esc(R"({"pattern":"^\\w+@x\\.com$"})"),
      q(R"({"pattern":"^[\"\\\\a]+$"})"), neg(R"({"pattern":"^[^a-c]{2}$"})"), dot(R"({"pattern":"^a.c$"})"),
      uni(R"({"pattern":"^[а-я]+ é$"})"), grp(R"({"pattern":"^(?:ab){2}(?<n>c)*$"})");
  for (Grammar *g : {&a, &un, &alt, &esc, &q, &neg, &dot, &uni, &grp}) ASSERT_EQ(g->rc, 0) << g->err;
  EXPECT_ACCEPTS(a, "\"abc12\"");
  EXPECT_ACCEPTS(a, "\"z123\"");
  for (const char *x : {"\"abc1\"", "\"Abc12\"", "\"abc1234\"", "\"12\""}) EXPECT_REJECTS(a, x);
  EXPECT_ACCEPTS(un, "\"xxabyy\""); // unanchored: anything around
  EXPECT_REJECTS(un, "\"xxa\"");
  for (const char *x : {"\"cat\"", "\"dogs\"", "\"xxx\""}) EXPECT_ACCEPTS(alt, x);
  for (const char *x : {"\"cats!\"", "\"\"", "\"catx\""}) EXPECT_REJECTS(alt, x);
  EXPECT_ACCEPTS(esc, "\"a_1@x.com\"");
  EXPECT_REJECTS(esc, "\"a@xcom\"");
  EXPECT_ACCEPTS(q, "\"\\\"a\\\\\""); // the decoded string "a\ (quote and backslash escaped in JSON)
  EXPECT_REJECTS(q, "\"\"a\"");
  EXPECT_ACCEPTS(neg, "\"xy\"");
  EXPECT_ACCEPTS(neg, "\"\\n\\\"\"");
  EXPECT_REJECTS(neg, "\"xa\"");
  EXPECT_ACCEPTS(dot, "\"abc\"");
  EXPECT_ACCEPTS(dot, "\"a€c\"");
  EXPECT_REJECTS(dot, "\"a\\nc\"");
  EXPECT_ACCEPTS(uni, "\"привет é\"");
  EXPECT_REJECTS(uni, "\"hello é\"");
  EXPECT_ACCEPTS(grp, "\"abab\"");
  EXPECT_ACCEPTS(grp, "\"ababccc\"");
  EXPECT_REJECTS(grp, "\"ab\"");
  Grammar any(R"({"pattern":"^a[^]b$"})"); // ECMA-262: [^] is any character
  ASSERT_EQ(any.rc, 0) << any.err;
  EXPECT_ACCEPTS(any, "\"a]b\"");
  EXPECT_ACCEPTS(any, "\"a\\nb\"");
  EXPECT_REJECTS(any, "\"ab\"");
}

TEST(Grammar, Lengths) {
  Grammar g(R"({"type":"string","minLength":2,"maxLength":3})"), big(R"({"type":"string","maxLength":1000000})");
  ASSERT_EQ(g.rc, 0) << g.err;
  ASSERT_EQ(big.rc, 0) << big.err;
  for (const char *x : {"\"ab\"", "\"abc\"", "\"éé\"", "\"\\n\\u00e9\""}) EXPECT_ACCEPTS(g, x);
  for (const char *x : {"\"a\"", "\"abcd\"", "\"\""}) EXPECT_REJECTS(g, x);
  EXPECT_ACCEPTS(big, "\"x\"");
}

TEST(Grammar, WhitespaceIsBounded) {
  Grammar g(nullptr);
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_ACCEPTS(g, "{\n" + std::string(20, ' ') + "\"a\": 1}");
  EXPECT_REJECTS(g, "{\n" + std::string(21, ' ') + "\"a\": 1}");
  EXPECT_REJECTS(g, "{\n\n\"a\": 1}");
  EXPECT_ACCEPTS(g, "{\"a\":\t1}");
}

TEST(Grammar, Errors) {
  struct Case {
    const char *schema;
    int rc;
    const char *needle;
  } cases[] = {
      {R"J({"type":"integer","not":{}})J", MDL_GRAMMAR_UNSUPPORTED, "'not'"},
      {R"J({"type":"object","properties":{"a":{"not":{}}}})J", MDL_GRAMMAR_UNSUPPORTED, "#/properties/a"},
      {R"J({"$ref":"http://x/y"})J", MDL_GRAMMAR_UNSUPPORTED, "local"},
      {R"J({"type":"string","pattern":"(a)\\1"})J", MDL_GRAMMAR_UNSUPPORTED, "'pattern'"},
      {R"J({"type":"string","pattern":"a(?=b)"})J", MDL_GRAMMAR_UNSUPPORTED, "lookahead"},
      {R"J({"type":"string","format":"uri"})J", MDL_GRAMMAR_UNSUPPORTED, "'format'"},
      {R"J({"type":"string","format":"date","maxLength":3})J", MDL_GRAMMAR_UNSUPPORTED, "maxLength"},
      {R"J({"type":"array","items":[{"type":"string"}]})J", MDL_GRAMMAR_UNSUPPORTED, "'items'"},
      {R"J({"type":"object","anyOf":[{}]})J", MDL_GRAMMAR_UNSUPPORTED, "'anyOf'"},
      {R"J({"type":"strnig"})J", -1, "'type'"},
      {R"J({"type":"string","pattern":"a(b"})J", -1, "'pattern'"},
      {R"J({"type":"string","pattern":"a{2"})J", -1, "'pattern'"},
      {R"J({"enum":[]})J", -1, "'enum'"},
      {R"J({"$ref":"#/$defs/missing"})J", -1, "points at nothing"},
      {R"J({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})J", -1, "nothing can satisfy"},
      {R"J({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"})J", -1, "refers to itself"},
      {R"J({"type":"string","pattern":"^(a*)*$"})J", -1, "refers to itself"},
      {R"J({"type":"object","properties":{"c":{"$ref":"#"}},"required":["c"]})J", -1, "nothing can satisfy"},
      {R"J({"type":"array","minItems":3,"maxItems":2})J", -1, "maxItems"},
      // unsatisfiable: refused (a 400 at the router), never compiled into a grammar that cannot end
      {R"J({"additionalProperties":false,"required":["x"]})J", -1, "nothing can satisfy"},
      {R"J({"type":"string","pattern":"^[]$"})J", -1, "matches nothing"}, // ECMA-262: [] is the empty class
      {"false", -1, "false"},
      {"{\"type\":", -1, "not valid JSON"},
      {"[1]", -1, "object or a boolean"},
  };
  for (const Case &c : cases) {
    Grammar g(c.schema);
    EXPECT_EQ(g.rc, c.rc) << c.schema << ": " << g.err;
    EXPECT_NE(strstr(g.err, c.needle), nullptr) << c.schema << ": " << g.err;
    EXPECT_EQ(g.g, nullptr);
  }
}

TEST(Grammar, MatcherStepsAndEnd) {
  Grammar g(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  ASSERT_EQ(g.rc, 0) << g.err;
  char err[128];
  mdl_grammar_matcher *m = nullptr;
  ASSERT_EQ(mdl_grammar_matcher_new(g.g, nullptr, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(mdl_grammar_matcher_accept_bytes(m, "{\"n\":1", 6), 0);
  EXPECT_FALSE(mdl_grammar_matcher_can_end(m));
  EXPECT_EQ(mdl_grammar_matcher_accept_bytes(m, "x", 1), -1); // rejected: state unchanged
  EXPECT_TRUE(mdl_grammar_matcher_can_take(m, "2}", 2));
  EXPECT_FALSE(mdl_grammar_matcher_done(m));
  EXPECT_EQ(mdl_grammar_matcher_accept_bytes(m, "2}", 2), 0);
  EXPECT_TRUE(mdl_grammar_matcher_can_end(m));
  EXPECT_TRUE(mdl_grammar_matcher_done(m)); // nothing can follow the closing brace
  EXPECT_EQ(mdl_grammar_matcher_accept_bytes(m, " ", 1), -1);
  mdl_grammar_matcher_free(m);
  // a long value keeps the matcher's frames bounded (compaction)
  Grammar s(R"({"type":"string"})");
  ASSERT_EQ(mdl_grammar_matcher_new(s.g, nullptr, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(mdl_grammar_matcher_accept_bytes(m, "\"", 1), 0);
  for (int i = 0; i < 100000; i++) ASSERT_EQ(mdl_grammar_matcher_accept_bytes(m, "ab\\n", 4), 0);
  EXPECT_EQ(mdl_grammar_matcher_accept_bytes(m, "\"", 1), 0);
  EXPECT_TRUE(mdl_grammar_matcher_done(m));
  mdl_grammar_matcher_free(m);
}

// A vocabulary of a few pieces: masks against what each token's bytes do.
TEST(Grammar, MaskTinyVocabulary) {
  const char *pieces[] = {"{", "}", "{\"", "\"", "a", "\":", " ", "1", "1}", "}x", nullptr, "EOS"};
  const int V = 12;
  size_t lens[V];
  for (int i = 0; i < V; i++) lens[i] = pieces[i] ? strlen(pieces[i]) : 0;
  int32_t eog[] = {11};
  char err[128];
  mdl_grammar_vocab *v = nullptr;
  ASSERT_EQ(mdl_grammar_vocab_new(V, pieces, lens, eog, 1, &v, err, sizeof err), 0) << err;
  Grammar g(R"({"type":"object","properties":{"a":{"type":"integer"}}})");
  ASSERT_EQ(g.rc, 0) << g.err;
  mdl_grammar_matcher *m = nullptr;
  ASSERT_EQ(mdl_grammar_matcher_new(g.g, v, &m, err, sizeof err), 0) << err;
  auto allowed = [&]() {
    uint32_t bits[1];
    mdl_grammar_matcher_mask(m, bits);
    std::string s;
    for (int i = 0; i < V; i++)
      if (bits[0] >> i & 1) s += std::to_string(i) + " ";
    return s;
  };
  EXPECT_EQ(allowed(), "0 2 ");
  ASSERT_EQ(mdl_grammar_matcher_accept_token(m, 0), 0);
  EXPECT_EQ(allowed(), "1 3 6 "); // "}" closes the empty object, "\"" starts the key, " " is whitespace
  ASSERT_EQ(mdl_grammar_matcher_accept_token(m, 3), 0);
  EXPECT_EQ(allowed(), "4 ");
  ASSERT_EQ(mdl_grammar_matcher_accept_token(m, 4), 0);
  ASSERT_EQ(mdl_grammar_matcher_accept_token(m, 5), 0);
  ASSERT_EQ(mdl_grammar_matcher_accept_token(m, 7), 0);
  EXPECT_EQ(allowed(), "1 6 7 8 "); // more digits, whitespace, or the end; "}x" cannot end it
  ASSERT_EQ(mdl_grammar_matcher_accept_token(m, 1), 0);
  EXPECT_EQ(allowed(), "11 "); // complete: only the end
  EXPECT_TRUE(mdl_grammar_matcher_done(m));
  ASSERT_EQ(mdl_grammar_matcher_accept_token(m, 11), 0);
  EXPECT_EQ(mdl_grammar_matcher_accept_token(m, 4), -1);
  mdl_grammar_matcher_free(m);
  mdl_grammar_vocab_free(v);
}

// ---- SmolLM2's vocabulary ----

// The real tokenizer and its trie, loaded once per test process.
struct Vocab {
  mdl_gguf *g = nullptr;
  mdl_tok *t = nullptr;
  mdl_grammar_vocab *v = nullptr;
  std::string err;
  Vocab() {
    char e[256] = "";
    if (mdl_gguf_open(kModel, &g, e, sizeof e) || mdl_tok_load(g, &t, e, sizeof e) ||
        mdl_grammar_vocab_from_tok(t, &v, e, sizeof e))
      err = e;
  }
  ~Vocab() {
    mdl_grammar_vocab_free(v);
    mdl_tok_free(t);
    mdl_gguf_close(g);
  }
  static Vocab &get() {
    static Vocab x;
    return x;
  }
  std::vector<int32_t> encode(const std::string &text) {
    int32_t *ids = nullptr;
    size_t n = 0;
    char e[256];
    EXPECT_EQ(mdl_tok_encode(t, text.data(), text.size(), 0, &ids, &n, e, sizeof e), 0) << e;
    std::vector<int32_t> out(ids, ids + n);
    free(ids);
    return out;
  }
  std::string piece(int32_t id) {
    std::string s(mdl_tok_piece(t, id, nullptr, 0), '\0');
    mdl_tok_piece(t, id, s.data(), s.size());
    return s;
  }
};

#define NEED_VOCAB(V)                                                                                                  \
  Vocab &V = Vocab::get();                                                                                             \
  ASSERT_TRUE(V.v) << "the real model is needed: " << kModel << ": " << V.err << " (run scripts/setup.sh)"

const char *kPerson = R"({"type":"object","properties":{
  "name":{"type":"string","minLength":1,"maxLength":40},
  "age":{"type":"integer"},
  "email":{"type":"string","format":"email"},
  "tags":{"type":"array","items":{"enum":["admin","user","guest"]},"maxItems":3},
  "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","pattern":"^\\d{5}$"}},
             "required":["city"],"additionalProperties":false},
  "score":{"anyOf":[{"type":"number"},{"type":"null"}]}},
  "required":["name","age","tags"],"additionalProperties":false})";
const char *kPersonText = "{\"name\": \"Ada Lovelace\", \"age\": 36, \"email\": \"ada@math.example.org\", "
                          "\"tags\": [\"admin\", \"user\"], \"address\": {\"city\": \"London\", \"zip\": \"12345\"}, "
                          "\"score\": -1.5e2}";

void check_masks(Vocab &V, const char *schema, const std::string &text);

// The mask at every prefix of a valid text equals what each token's bytes do from there (one by one).
TEST(GrammarMask, MatchesBruteForceOnSmolLM2) {
  NEED_VOCAB(V);
  const char *any_text = "{\"k\": [1, {\"é\": \"caf\u00e9 \\\"x\\\" ✓\"}], \"n\": null,\n \"b\": true}";
  for (int which = 0; which < 2; which++) {
    SCOPED_TRACE(which ? "json_object" : "person schema");
    check_masks(V, which ? nullptr : kPerson, which ? any_text : kPersonText);
  }
}

void check_masks(Vocab &V, const char *schema, const std::string &text) {
  Grammar g(schema);
  ASSERT_EQ(g.rc, 0) << g.err;
  ASSERT_TRUE(g.ok(text)) << text;
  int n_vocab = mdl_tok_n_vocab(V.t), W = (n_vocab + 31) / 32;
  std::vector<uint32_t> bits(W);
  std::vector<std::string> pieces(n_vocab);
  for (int i = 0; i < n_vocab; i++) {
    int ty = mdl_tok_type(V.t, i);
    if (ty == MDL_TOK_NORMAL || ty == MDL_TOK_BYTE || ty == MDL_TOK_USER) pieces[i] = V.piece(i);
  }
  char err[128];
  int checked = 0;
  for (size_t at = 0; at <= text.size(); at += (at < 40 || at + 10 > text.size()) ? 1 : 7) {
    mdl_grammar_matcher *m = nullptr;
    ASSERT_EQ(mdl_grammar_matcher_new(g.g, V.v, &m, err, sizeof err), 0) << err;
    ASSERT_EQ(mdl_grammar_matcher_accept_bytes(m, text.data(), at), 0) << at;
    mdl_grammar_matcher_mask(m, bits.data());
    int can_end = mdl_grammar_matcher_can_end(m), n_allowed = 0;
    for (int t = 0; t < n_vocab; t++) {
      bool want = mdl_tok_is_eog(V.t, t) ? can_end
                                          : !pieces[t].empty() &&
                                                mdl_grammar_matcher_can_take(m, pieces[t].data(), pieces[t].size());
      bool got = bits[t >> 5] >> (t & 31) & 1;
      n_allowed += got;
      ASSERT_EQ(got, want) << "prefix " << at << " [" << text.substr(0, at) << "] token " << t << " ["
                           << pieces[t] << "]";
    }
    EXPECT_GT(n_allowed, 0);
    mdl_grammar_matcher_free(m);
    checked++;
  }
  EXPECT_GT(checked, 30);
}

TEST(GrammarMask, EndOfGenerationOnlyAtTheEnd) {
  NEED_VOCAB(V);
  Grammar g(R"({"type":"integer"})");
  ASSERT_EQ(g.rc, 0) << g.err;
  char err[128];
  mdl_grammar_matcher *m = nullptr;
  ASSERT_EQ(mdl_grammar_matcher_new(g.g, V.v, &m, err, sizeof err), 0) << err;
  int n_vocab = mdl_tok_n_vocab(V.t);
  std::vector<uint32_t> bits((n_vocab + 31) / 32);
  int32_t eos = mdl_tok_eos(V.t);
  ASSERT_TRUE(mdl_grammar_vocab_is_eog(V.v, eos));
  mdl_grammar_matcher_mask(m, bits.data());
  EXPECT_FALSE(bits[eos >> 5] >> (eos & 31) & 1); // nothing written yet
  ASSERT_EQ(mdl_grammar_matcher_accept_bytes(m, "12", 2), 0);
  mdl_grammar_matcher_mask(m, bits.data());
  EXPECT_TRUE(bits[eos >> 5] >> (eos & 31) & 1);  // a complete integer: the end may come
  int32_t three = mdl_tok_find(V.t, "3");
  ASSERT_GE(three, 0);
  EXPECT_TRUE(bits[three >> 5] >> (three & 31) & 1); // or more digits
  EXPECT_FALSE(mdl_grammar_matcher_done(m));
  ASSERT_EQ(mdl_grammar_matcher_accept_token(m, eos), 0);
  EXPECT_TRUE(mdl_grammar_matcher_done(m));
  mdl_grammar_matcher_free(m);
}

// The mask's cost per token over a realistic output, cold (a fresh grammar: every state walks the trie) and warm
// (the same grammar again: the states' masks are cached). Printed for the record; the bound is loose (sanitizers).
TEST(GrammarMask, CostPerToken) {
  NEED_VOCAB(V);
  std::vector<int32_t> toks = V.encode(kPersonText);
  int n_vocab = mdl_tok_n_vocab(V.t);
  std::vector<uint32_t> bits((n_vocab + 31) / 32);
  for (const char *schema : {kPerson, (const char *)nullptr}) {
    Grammar g(schema);
    ASSERT_EQ(g.rc, 0) << g.err;
    for (int pass = 0; pass < 2; pass++) {
      char err[128];
      mdl_grammar_matcher *m = nullptr;
      ASSERT_EQ(mdl_grammar_matcher_new(g.g, V.v, &m, err, sizeof err), 0) << err;
      double total = 0, worst = 0;
      for (int32_t t : toks) {
        auto t0 = std::chrono::steady_clock::now();
        mdl_grammar_matcher_mask(m, bits.data());
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        total += ms;
        worst = std::fmax(worst, ms);
        ASSERT_TRUE(bits[t >> 5] >> (t & 31) & 1) << "token " << t << " [" << V.piece(t) << "]";
        ASSERT_EQ(mdl_grammar_matcher_accept_token(m, t), 0);
      }
      EXPECT_TRUE(mdl_grammar_matcher_done(m));
      printf("mask cost (%s, %s, %d-token vocabulary): %.3f ms/token on average over %zu tokens, worst %.3f ms\n",
             schema ? "person schema" : "json_object", pass ? "warm" : "cold", n_vocab, total / toks.size(),
             toks.size(), worst);
      EXPECT_LT(total / toks.size(), 100.0);
      mdl_grammar_matcher_free(m);
    }
  }
}

// A grammar too ambiguous to follow at a bounded cost (issue 29: n 8 of such a schema made every step of its worker
// 640-760 ms): the mask stops at MDL_GRAMMAR_MASK_WORK steps and says so, and allows only the end; a plain schema's
// masks never come near the bound (this is a count of steps, not a timing).
TEST(GrammarMask, AnAmbiguousPatternIsCutAtTheWorkBound) {
  NEED_VOCAB(V);
  int n_vocab = mdl_tok_n_vocab(V.t);
  std::vector<uint32_t> bits((n_vocab + 31) / 32);
  Grammar bad(R"({"type":"array","items":{"type":"string","pattern":"^(ab|cd|[e-y]{1,999}){1,999}$"},)"
              R"("minItems":1024})");
  ASSERT_EQ(bad.rc, 0) << bad.err;
  char err[128];
  mdl_grammar_matcher *m = nullptr;
  ASSERT_EQ(mdl_grammar_matcher_new(bad.g, V.v, &m, err, sizeof err), 0) << err;
  ASSERT_EQ(mdl_grammar_matcher_accept_bytes(m, "[\"effe", 6), 0);
  mdl_grammar_matcher_mask(m, bits.data());
  EXPECT_TRUE(mdl_grammar_matcher_too_costly(m));
  for (int t = 0; t < n_vocab; t++) {
    if (bits[t >> 5] >> (t & 31) & 1) {
      EXPECT_TRUE(mdl_grammar_vocab_is_eog(V.v, t)) << "token " << t;
    }
  }
  mdl_grammar_matcher_free(m);
  std::vector<int32_t> toks = V.encode(kPersonText);
  Grammar ok(kPerson);
  ASSERT_EQ(ok.rc, 0) << ok.err;
  ASSERT_EQ(mdl_grammar_matcher_new(ok.g, V.v, &m, err, sizeof err), 0) << err;
  for (int32_t t : toks) {
    mdl_grammar_matcher_mask(m, bits.data());
    ASSERT_FALSE(mdl_grammar_matcher_too_costly(m));
    ASSERT_EQ(mdl_grammar_matcher_accept_token(m, t), 0);
  }
  mdl_grammar_matcher_free(m);
}

// ---- the sampler under a grammar ----

// A tiny vocabulary where the model prefers what the grammar refuses: the sampler picks among what it allows.
TEST(GrammarSampler, MasksBeforeFiltersAndAdvances) {
  const char *pieces[] = {"x", "{", "}", "\"a\"", ":", "1", "2", " ", "EOS"};
  const int V = 9;
  size_t lens[V];
  for (int i = 0; i < V; i++) lens[i] = strlen(pieces[i]);
  int32_t eog[] = {8};
  char err[256];
  mdl_grammar_vocab *v = nullptr;
  ASSERT_EQ(mdl_grammar_vocab_new(V, pieces, lens, eog, 1, &v, err, sizeof err), 0) << err;
  Grammar g(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})");
  ASSERT_EQ(g.rc, 0) << g.err;
  struct Cfg {
    float temp;
    int top_k;
    float top_p, min_p;
  } cfgs[] = {{0, 0, 1, 0}, {1, 0, 1, 0}, {0.8f, 2, 0.95f, 0}, {1, 0, 1, 0.5f}, {1.5f, 3, 0.5f, 0.05f}};
  for (const Cfg &c : cfgs)
    for (uint64_t seed = 1; seed <= 20; seed++) {
      mdl_sampling sp{};
      sp.temperature = c.temp, sp.top_k = c.top_k, sp.top_p = c.top_p, sp.min_p = c.min_p;
      sp.repetition_penalty = 1, sp.seed = seed, sp.grammar = g.g, sp.grammar_vocab = v;
      mdl_sampler *smp = nullptr;
      ASSERT_EQ(mdl_sampler_new(&sp, V, nullptr, 0, &smp, err, sizeof err), 0) << err;
      std::string out;
      int steps = 0;
      for (; steps < 300 && !mdl_sampler_grammar_done(smp); steps++) {
        float logits[V] = {9, 1, 2, 0.5f, 0.2f, 1, 1, 3, 8}; // "x" and the end are the favourites
        mdl_sampled sm;
        mdl_sampler_sample(smp, logits, &sm);
        ASSERT_NE(sm.token, 0) << "a token the grammar refuses";
        if (sm.token == 8) break;
        out += pieces[sm.token];
      }
      EXPECT_TRUE(g.ok(out)) << out << " (temperature " << c.temp << ", top_k " << c.top_k << ", seed " << seed << ")";
      mdl_sampler_free(smp);
    }
  // a sampler without the trie, or with another vocabulary's size, is refused
  mdl_sampling sp{};
  sp.temperature = 1, sp.top_p = 1, sp.repetition_penalty = 1, sp.grammar = g.g;
  mdl_sampler *smp = nullptr;
  EXPECT_LT(mdl_sampler_new(&sp, V, nullptr, 0, &smp, err, sizeof err), 0);
  sp.grammar_vocab = v;
  EXPECT_LT(mdl_sampler_new(&sp, V + 1, nullptr, 0, &smp, err, sizeof err), 0);
  mdl_grammar_vocab_free(v);
}

// A token sampled elsewhere (the prefill worker's first token) advances the grammar through mdl_sampler_accept.
TEST(GrammarSampler, AcceptReplaysIntoTheGrammar) {
  const char *pieces[] = {"[", "1", ",", "]", "EOS"};
  const int V = 5;
  size_t lens[V];
  for (int i = 0; i < V; i++) lens[i] = strlen(pieces[i]);
  int32_t eog[] = {4};
  char err[256];
  mdl_grammar_vocab *v = nullptr;
  ASSERT_EQ(mdl_grammar_vocab_new(V, pieces, lens, eog, 1, &v, err, sizeof err), 0) << err;
  Grammar g(R"({"type":"array","items":{"type":"integer"},"maxItems":1})");
  ASSERT_EQ(g.rc, 0) << g.err;
  mdl_sampling sp{};
  sp.temperature = 0, sp.top_p = 1, sp.repetition_penalty = 1, sp.grammar = g.g, sp.grammar_vocab = v;
  mdl_sampler *smp = nullptr;
  ASSERT_EQ(mdl_sampler_new(&sp, V, nullptr, 0, &smp, err, sizeof err), 0) << err;
  mdl_sampler_accept(smp, 0); // "["
  float first[V] = {5, 4, 6, 3, 9}, second[V] = {5, 1, 6, 3, 9};
  mdl_sampled sm;
  mdl_sampler_sample(smp, first, &sm);
  EXPECT_EQ(sm.token, 1); // "[" again, "," and the end are refused; "]" is below "1"
  mdl_sampler_sample(smp, second, &sm);
  EXPECT_EQ(sm.token, 3); // one item at most: "," is refused, so "]" (more digits are less likely)
  EXPECT_TRUE(mdl_sampler_grammar_done(smp));
  mdl_sampler_free(smp);
  mdl_grammar_vocab_free(v);
}

// ---- generation with the real model ----

// A tiny validator for the schema below (the test's own, to check the grammar rather than trust it).
std::string validate_person(const cJSON *o) {
  if (!cJSON_IsObject(o)) return "not an object";
  const char *allowed[] = {"name", "age", "city", "tags", "alive"};
  for (const cJSON *k = o->child; k; k = k->next) {
    bool ok = false;
    for (const char *a : allowed) ok |= !strcmp(a, k->string);
    if (!ok) return std::string("unexpected property ") + k->string;
  }
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name"), *age = cJSON_GetObjectItemCaseSensitive(o, "age");
  const cJSON *city = cJSON_GetObjectItemCaseSensitive(o, "city"), *tags = cJSON_GetObjectItemCaseSensitive(o, "tags");
  const cJSON *alive = cJSON_GetObjectItemCaseSensitive(o, "alive");
  if (!cJSON_IsString(name) || strlen(name->valuestring) < 1 || strlen(name->valuestring) > 60) return "bad name";
  if (!cJSON_IsNumber(age) || age->valuedouble != std::floor(age->valuedouble)) return "bad age";
  if (city && !(cJSON_IsString(city) || cJSON_IsNull(city))) return "bad city";
  if (!cJSON_IsArray(tags) || cJSON_GetArraySize(tags) > 3) return "bad tags";
  for (const cJSON *t = tags->child; t; t = t->next)
    if (!cJSON_IsString(t) || (strcmp(t->valuestring, "friend") && strcmp(t->valuestring, "colleague") &&
                               strcmp(t->valuestring, "family")))
      return "bad tag";
  if (alive && !cJSON_IsBool(alive)) return "bad alive";
  return "";
}

TEST(GrammarGenerate, RealModelOutputParsesAndValidates) {
  NEED_VOCAB(V);
  const char *schema = R"({"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":60},
    "age":{"type":"integer"},"city":{"anyOf":[{"type":"string"},{"type":"null"}]},
    "tags":{"type":"array","items":{"enum":["friend","colleague","family"]},"maxItems":3},
    "alive":{"type":"boolean"}},"required":["name","age","tags"],"additionalProperties":false})";
  Grammar g(schema);
  ASSERT_EQ(g.rc, 0) << g.err;
  char err[512];
  krn_pool *pool = krn_pool_new(2, err, sizeof err);
  ASSERT_NE(pool, nullptr) << err;
  krn_ctx kc{};
  kc.be = krn_cpu_best();
  kc.pool = pool;
  mdl_llama *m = nullptr;
  ASSERT_EQ(mdl_llama_load(V.g, &kc, &m, err, sizeof err), 0) << err;
  const mdl_llama_cfg *cfg = mdl_llama_config(m);
  mdl_kv kv{};
  kv.type = KRN_F16, kv.block_size = 16, kv.n_blocks = 32;
  kv.base = kc.be->alloc(&kc, mdl_kv_block_bytes(cfg, kv.type, kv.block_size) * (size_t)kv.n_blocks);
  ASSERT_NE(kv.base, nullptr);
  std::vector<int32_t> bt(kv.n_blocks);
  for (int i = 0; i < kv.n_blocks; i++) bt[i] = i;
  mdl_chat_msg msg = {"user", "Describe a person as a JSON object with name, age, city, tags and alive."};
  char *text = nullptr;
  ASSERT_EQ(mdl_chat_apply(V.g, &msg, 1, 1, &text, err, sizeof err), 0) << err;
  int32_t *ids = nullptr;
  size_t n_ids = 0;
  ASSERT_EQ(mdl_tok_encode(V.t, text, strlen(text), 1, &ids, &n_ids, err, sizeof err), 0) << err;
  free(text);
  int n_vocab = cfg->n_vocab;
  std::vector<float> logits(n_vocab);
  struct Cfg {
    float temp;
    int top_k;
    float top_p, min_p;
  } cfgs[] = {{0.8f, 40, 0.95f, 0.05f}, {0.8f, 40, 0.95f, 0.05f}, {1.0f, 0, 1.0f, 0}, {0, 0, 1, 0}};
  int valid = 0;
  for (int run = 0; run < 4; run++) {
    const Cfg &c = cfgs[run];
    mdl_sampling sp{};
    sp.temperature = c.temp, sp.top_k = c.top_k, sp.top_p = c.top_p, sp.min_p = c.min_p;
    sp.repetition_penalty = 1, sp.seed = 1000 + run, sp.grammar = g.g, sp.grammar_vocab = V.v;
    mdl_sampler *smp = nullptr;
    ASSERT_EQ(mdl_sampler_new(&sp, n_vocab, ids, (int)n_ids, &smp, err, sizeof err), 0) << err;
    mdl_seq sq = {ids, (int)n_ids, 0, bt.data(), kv.n_blocks, 1};
    ASSERT_EQ(mdl_llama_forward(m, &kv, &sq, 1, logits.data(), nullptr, nullptr, err, sizeof err), 0) << err;
    int pos = (int)n_ids, n_gen = 0;
    std::string out;
    bool ended = false;
    auto t0 = std::chrono::steady_clock::now();
    double sample_ms = 0;
    for (; n_gen < 160 && pos + 1 < kv.n_blocks * kv.block_size; n_gen++) {
      mdl_sampled sm;
      auto s0 = std::chrono::steady_clock::now();
      mdl_sampler_sample(smp, logits.data(), &sm);
      sample_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
      if (mdl_tok_is_eog(V.t, sm.token)) {
        ended = true;
        break;
      }
      out += V.piece(sm.token);
      if (mdl_sampler_grammar_done(smp)) {
        ended = true;
        break;
      }
      int32_t tk = sm.token;
      mdl_seq s1 = {&tk, 1, pos++, bt.data(), kv.n_blocks, 1};
      ASSERT_EQ(mdl_llama_forward(m, &kv, &s1, 1, logits.data(), nullptr, nullptr, err, sizeof err), 0) << err;
    }
    double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    printf("run %d (temperature %.1f, top_k %d, min_p %.2f): %d tokens, sampling %.2f ms/token of %.1f ms/token: %s\n",
           run, c.temp, c.top_k, c.min_p, n_gen + 1, sample_ms / (n_gen + 1), total_ms / (n_gen + 1), out.c_str());
    mdl_sampler_free(smp);
    if (!ended) continue; // ran out of tokens: the text may be cut (finish_reason "length"), not invalid
    cJSON *o = cJSON_ParseWithLength(out.data(), out.size());
    EXPECT_NE(o, nullptr) << "does not parse: " << out;
    std::string why = validate_person(o);
    EXPECT_EQ(why, "") << out;
    valid += o && why.empty();
    cJSON_Delete(o);
  }
  EXPECT_GE(valid, 3); // the model finishes within 160 tokens (the greedy run at least)
  free(ids);
  kc.be->free(&kc, kv.base);
  mdl_llama_free(m);
  krn_pool_free(pool);
}

} // namespace
