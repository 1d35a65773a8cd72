// tests/models/test_chat.cc: tool calling's prompt (models/chat.c, the Hermes style for ChatML) and its call grammar
// (models/json_schema.c mdl_grammar_from_tool_calls).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {
#include "models/chat.h"
#include "models/grammar.h"
}

namespace {

const char *TOOLS = R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
                    R"("properties":{"city":{"type":"string"}},"required":["city"]}}}])";
const std::string SYS = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

std::string render(const mdl_chat_msg *m, const char *const *calls, size_t n, const char *tools) {
  char *out = nullptr, err[256];
  if (mdl_chat_apply_tools(nullptr, m, calls, n, tools, 1, &out, err, sizeof err) != 0) return std::string("ERR ") + err;
  std::string s(out);
  free(out);
  return s;
}

TEST(ChatTools, ToolsInTheSystemBlock) {
  const mdl_chat_tool_style *st = mdl_chat_tool_style_of(nullptr, nullptr, 0);
  ASSERT_NE(st, nullptr);
  EXPECT_STREQ(st->name, "hermes");
  mdl_chat_msg m[] = {{"user", "Weather in Paris?"}};
  std::string want = "<|im_start|>system\n" + SYS + "\n\n" + st->sys_head +
                     "\n{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                     "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}" +
                     st->sys_tail + "<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                     "<|im_start|>assistant\n";
  EXPECT_EQ(render(m, nullptr, 1, TOOLS), want);
  // the conversation's own system message takes the default's place
  mdl_chat_msg s[] = {{"system", "Be brief."}, {"user", "hi"}};
  std::string got = render(s, nullptr, 2, TOOLS);
  EXPECT_EQ(got.rfind("<|im_start|>system\nBe brief.\n\n# Tools", 0), 0u) << got;
  EXPECT_EQ(got.find(SYS), std::string::npos);
  EXPECT_NE(got.find("<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"), std::string::npos);
  // no tools: the plain rendering
  char *plain = nullptr, err[128];
  ASSERT_EQ(mdl_chat_apply(nullptr, s, 2, 1, &plain, err, sizeof err), 0);
  EXPECT_EQ(render(s, nullptr, 2, nullptr), std::string(plain));
  free(plain);
}

TEST(ChatTools, CallsAndResults) {
  mdl_chat_msg m[] = {{"user", "q"}, {"assistant", ""}, {"tool", "18C"}, {"tool", "{\"ok\":true}"},
                      {"assistant", "Sunny."}, {"assistant", "Checking."}};
  const char *calls[] = {nullptr,
                         R"([{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"ping","arguments":"x"}])",
                         nullptr, nullptr, nullptr, R"([{"name":"ping","arguments":{}}])"};
  std::string want = "<|im_start|>system\n" + SYS + "<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
                     "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                     "{\"city\":\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": \"x\"}\n"
                     "</tool_call><|im_end|>\n"
                     "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n{\"ok\":true}\n"
                     "</tool_response><|im_end|>\n<|im_start|>assistant\nSunny.<|im_end|>\n"
                     "<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n"
                     "</tool_call><|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(render(m, calls, 6, nullptr), want);
}

TEST(ChatTools, Refusals) {
  mdl_chat_msg m[] = {{"user", "q"}, {"tool", "x"}};
  char *out = nullptr, err[256];
  EXPECT_LT(mdl_chat_apply(nullptr, m, 2, 1, &out, err, sizeof err), 0); // no tool role without the tool convention
  EXPECT_EQ(render(m, nullptr, 2, "{\"not\":\"a list\"}").rfind("ERR tools must be a JSON array", 0), 0u);
  mdl_chat_msg a[] = {{"assistant", ""}};
  const char *bad1[] = {"{}"}, *bad2[] = {R"([{"arguments":{}}])"};
  EXPECT_NE(render(a, bad1, 1, nullptr).find("tool_calls must be a JSON array"), std::string::npos);
  EXPECT_NE(render(a, bad2, 1, nullptr).find("a string name and arguments"), std::string::npos);
  mdl_chat_msg r[] = {{"robot", "x"}};
  EXPECT_NE(render(r, nullptr, 1, nullptr).find("system, user and assistant, tool are accepted"), std::string::npos);
}

struct G {
  mdl_grammar *g = nullptr;
  int rc;
  char err[400] = {0};
  G(const char *tools, int parallel) {
    rc = mdl_grammar_from_tool_calls(tools, strlen(tools), "<tool_call>\n", "\n</tool_call>", "\n", parallel, &g, err,
                                     sizeof err);
  }
  ~G() { mdl_grammar_unref(g); }
  bool ok(const std::string &s) const { return mdl_grammar_matches(g, s.data(), s.size()); }
};

const char *CALL_TOOLS = R"([{"name":"get_weather","parameters":{"type":"object","properties":{"city":)"
                         R"({"type":"string","maxLength":10},"unit":{"enum":["c","f"]}},"required":["city","unit"],)"
                         R"("additionalProperties":false}},{"name":"ping"}])";

TEST(ChatTools, CallGrammar) {
  G one(CALL_TOOLS, 0);
  ASSERT_EQ(one.rc, 0) << one.err;
  const std::string w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
                        "\"c\"}}\n</tool_call>";
  const std::string p = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"any\": [1, true]}}\n</tool_call>";
  EXPECT_TRUE(one.ok(w));
  EXPECT_TRUE(one.ok(p)); // no parameters: any object
  EXPECT_FALSE(one.ok(w + "\n" + p)); // one call only
  EXPECT_FALSE(one.ok("<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(one.ok("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
  EXPECT_FALSE(one.ok("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris, France\", "
                      "\"unit\": \"c\"}}\n</tool_call>")); // maxLength
  EXPECT_FALSE(one.ok("Sure! " + w));
  EXPECT_FALSE(one.ok(w.substr(0, w.size() - 1)));
  EXPECT_FALSE(one.ok("<tool_call>\n{\"name\": \"ping\", \"arguments\": 5}\n</tool_call>"));
  G many(CALL_TOOLS, 1);
  ASSERT_EQ(many.rc, 0) << many.err;
  EXPECT_TRUE(many.ok(w));
  EXPECT_TRUE(many.ok(w + "\n" + p + "\n" + w));
  EXPECT_FALSE(many.ok(w + p));
  EXPECT_FALSE(many.ok(""));
  // what the chat template writes for an assistant's call is a sentence of the grammar (the model sees its own form)
  mdl_chat_msg a[] = {{"assistant", ""}};
  const char *calls[] = {R"([{"name":"get_weather","arguments":{"city":"Oslo","unit":"f"}},{"name":"ping","arguments":{}}])"};
  std::string r = render(a, calls, 1, nullptr);
  size_t b = r.find("<|im_start|>assistant\n") + strlen("<|im_start|>assistant\n"), e = r.find("<|im_end|>", b);
  EXPECT_TRUE(many.ok(r.substr(b, e - b))) << r.substr(b, e - b);
}

TEST(ChatTools, CallGrammarErrors) {
  G unsup(R"([{"name":"ok"},{"name":"f","parameters":{"type":"integer","minimum":1}}])", 0);
  EXPECT_EQ(unsup.rc, MDL_GRAMMAR_UNSUPPORTED);
  EXPECT_NE(std::string(unsup.err).find("tool 'f' parameters"), std::string::npos) << unsup.err;
  EXPECT_NE(std::string(unsup.err).find("'minimum'"), std::string::npos) << unsup.err;
  G bad(R"([{"name":"f","parameters":{"type":"strnig"}}])", 0);
  EXPECT_EQ(bad.rc, -1);
  for (const char *t : {"[]", "{}", "not json", R"([{"parameters":{}}])", R"([{"name":""}])", R"([5])"}) {
    G g(t, 1);
    SCOPED_TRACE(t);
    EXPECT_EQ(g.rc, -1);
    EXPECT_EQ(g.g, nullptr);
    EXPECT_NE(g.err[0], 0);
  }
  mdl_grammar *g = nullptr;
  char err[128];
  EXPECT_EQ(mdl_grammar_from_tool_calls(CALL_TOOLS, strlen(CALL_TOOLS), "<a>", "</a>", nullptr, 1, &g, err, sizeof err),
            -1); // parallel needs a separator
  // a $ref resolves in its own tool's parameters
  G ref(R"([{"name":"a","parameters":{"type":"object","properties":{"x":{"$ref":"#/$defs/n"}},"required":["x"],)"
        R"("$defs":{"n":{"type":"integer"}}}},{"name":"b","parameters":{"$ref":"#/$defs/s","$defs":{"s":)"
        R"({"type":"object","properties":{"y":{"type":"boolean"}},"required":["y"]}}}}])", 0);
  ASSERT_EQ(ref.rc, 0) << ref.err;
  EXPECT_TRUE(ref.ok("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 3}}\n</tool_call>"));
  EXPECT_TRUE(ref.ok("<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": true}}\n</tool_call>"));
  EXPECT_FALSE(ref.ok("<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": 3}}\n</tool_call>"));
}

} // namespace
