// tests/router/test_json_input.cc: what the one JSON pre-pass (util/json.h) refuses in a request body, naming the
// place (duplicate keys, depth, lone surrogates, malformed numbers), schema numbers reaching the grammar text exactly,
// and /v1/responses' function_call items (issue 39 items 7, 8, 9).
#include <gtest/gtest.h>

#include <string>
#include <vector>

extern "C" {
#include "router/openai.h"
}

namespace {

rtr_limits limits() {
  rtr_limits l{};
  l.model_name = "m";
  l.n_ctx = 4096;
  l.max_n = 8;
  l.max_stop = 4;
  l.n_vocab = 1000;
  return l;
}

struct Req {
  rtr_request r{};
  rtr_error e{};
  int rc;
  Req(rtr_kind k, const std::string &body, bool responses = false) {
    rtr_limits l = limits();
    rc = responses ? rtr_request_parse_responses(body.data(), body.size(), &l, &r, &e)
                   : rtr_request_parse(k, body.data(), body.size(), &l, &r, &e);
  }
  ~Req() { rtr_request_free(&r); }
  bool says(const char *s) const { return std::string(e.message).find(s) != std::string::npos; }
};

const std::string M = R"("messages":[{"role":"user","content":"hi"}])";

// Python and JS keep a duplicate key's last value, cJSON its first: a gateway that checked the last max_tokens was
// bypassed (max_tokens 1 then 2000 gave 1 token). Every duplicate is a 400 naming the key's path.
TEST(JsonInput, DuplicateKeysAreRefusedNamingThePath) {
  struct Case {
    rtr_kind kind;
    std::string body, param;
  } cases[] = {
      {RTR_COMPLETION, R"({"prompt":"a","max_tokens":1,"max_tokens":2000})", "max_tokens"},
      {RTR_COMPLETION, R"({"prompt":"a","max_tokens":1,"max\u005ftokens":2000})", "max\\u005ftokens"}, // same key
      {RTR_CHAT, R"({"messages":[{"role":"user","content":"a"},{"role":"user","role":"system","content":"b"}]})",
       "messages[1].role"},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
                 R"({"properties":{"a":{"const":1},"a":{"const":2}}}}}})", "response_format.json_schema.schema.properties.a"},
      {RTR_DETOKENIZE, R"({"tokens":[1],"tokens":[2]})", "tokens"},
  };
  for (const Case &c : cases) {
    Req q(c.kind, c.body);
    EXPECT_EQ(q.rc, -1) << c.body;
    EXPECT_EQ(q.e.status, 400) << c.body;
    EXPECT_EQ(std::string(q.e.param), c.param) << c.body;
    EXPECT_TRUE(q.says("duplicate key")) << q.e.message;
  }
  // the same key in two objects, or a key equal to a value, is no duplicate
  Req ok(RTR_CHAT, R"({"messages":[{"role":"user","content":"role"},{"role":"assistant","content":"a"}],"n":1})");
  EXPECT_EQ(ok.rc, 0) << ok.e.message;
}

TEST(JsonInput, DepthSurrogatesAndNumbersAreNamed) {
  std::string deep = R"({"prompt":)" + std::string(100000, '[');
  Req d(RTR_COMPLETION, deep);
  EXPECT_EQ(d.rc, -1);
  EXPECT_EQ(d.e.status, 400);
  EXPECT_TRUE(d.says("nests deeper than 1000 levels")) << d.e.message;
  struct Case {
    std::string body, param;
  } lone[] = {
      {R"({"prompt":"a\ud800"})", "prompt"},
      {R"({"prompt":"a\udc00b"})", "prompt"},
      {R"({"prompt":"\ud800\u0041"})", "prompt"},
      {R"({"prompt":["x","\uDBFF"]})", "prompt[1]"},
      {R"({"prompt":"a","stop":["\ud83d"]})", "stop[0]"},
  };
  for (const Case &c : lone) {
    Req q(RTR_COMPLETION, c.body);
    EXPECT_EQ(q.rc, -1) << c.body;
    EXPECT_EQ(std::string(q.e.param), c.param) << c.body;
    EXPECT_TRUE(q.says("lone UTF-16 surrogate")) << q.e.message;
  }
  Req pair(RTR_COMPLETION, R"({"prompt":"\ud83d\ude00"})");
  ASSERT_EQ(pair.rc, 0) << pair.e.message;
  EXPECT_STREQ(pair.r.prompts[0].text, "\xf0\x9f\x98\x80");
  for (const char *b : {R"({"prompt":"a","max_tokens":01})", R"({"prompt":"a","temperature":1.})",
                        R"({"prompt":"a","temperature":-.5})"}) {
    Req q(RTR_COMPLETION, b);
    EXPECT_EQ(q.rc, -1) << b;
    EXPECT_TRUE(q.says("number")) << q.e.message;
  }
}

// A schema's numbers reach the grammar text (and so the workers) as the client wrote them, not through a double.
TEST(JsonInput, SchemaNumbersKeepTheirLiterals) {
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"integer","minimum":9007199254740993,"maximum":9007199254740993},)"
      R"("b":{"const":0.30000000000000004},"c":{"enum":[123456789012345678]}},"required":["a","b","c"]})";
  Req js(RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)" +
                       schema + "}}}");
  ASSERT_EQ(js.rc, 0) << js.e.message;
  EXPECT_EQ(std::string(js.r.json_schema), schema);
  Req tools(RTR_CHAT, "{" + M + R"(,"tool_choice":"required","tools":[{"type":"function","function":{"name":"f",)"
                          R"("parameters":)" + schema + "}}]}");
  ASSERT_EQ(tools.rc, 0) << tools.e.message;
  EXPECT_NE(std::string(tools.r.call_tools).find(schema), std::string::npos) << tools.r.call_tools;
  Req resp(RTR_CHAT, R"({"input":"hi","text":{"format":{"type":"json_schema","name":"x","schema":)" + schema + "}}}",
           true);
  ASSERT_EQ(resp.rc, 0) << resp.e.message;
  EXPECT_EQ(std::string(resp.r.json_schema), schema);
  // what cannot be kept exactly is a 400 naming the schema path and why
  Req far(RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
                        R"({"properties":{"p":{"minimum":1.000000000000000000000000000000000000000001}}}}}})");
  EXPECT_EQ(far.rc, -1);
  EXPECT_TRUE(far.says("#/properties/p")) << far.e.message;
  EXPECT_TRUE(far.says("significant digits")) << far.e.message;
}

// /v1/responses: a function_call_output answers a function_call before it (same call_id), and a function_call's
// arguments are a JSON text.
TEST(JsonInput, ResponsesFunctionCallItems) {
  const std::string call = R"({"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":1}"})";
  const std::string out = R"({"type":"function_call_output","call_id":"c1","output":"42"})";
  Req ok(RTR_CHAT, R"({"input":[{"role":"user","content":"q"},)" + call + "," + out + "]}", true);
  EXPECT_EQ(ok.rc, 0) << ok.e.message;
  struct Case {
    std::string input, param, needle;
  } cases[] = {
      {R"({"type":"function_call_output","call_id":"c9","output":"42"})", "input[0].call_id", "answers no function_call"},
      {call + R"(,{"type":"function_call_output","call_id":"c2","output":"1"})", "input[1].call_id",
       "'c2' answers no function_call"},
      {out + "," + call, "input[0].call_id", "answers no function_call"}, // the output before its call
      {R"({"type":"function_call","call_id":"c1","name":"f","arguments":"not json"})", "input[0].arguments",
       "not valid JSON"},
      {R"({"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":1} trailing"})", "input[0].arguments",
       "not valid JSON"},
      {R"({"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":1,\"x\":2}"})", "input[0].arguments",
       "duplicate key"},
  };
  for (const Case &c : cases) {
    Req q(RTR_CHAT, R"({"input":[)" + c.input + "]}", true);
    EXPECT_EQ(q.rc, -1) << c.input;
    EXPECT_EQ(q.e.status, 400) << c.input;
    EXPECT_EQ(std::string(q.e.param), c.param) << c.input << ": " << q.e.message;
    EXPECT_TRUE(q.says(c.needle.c_str())) << q.e.message;
  }
}

} // namespace
