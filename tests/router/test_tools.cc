// tests/router/test_tools.cc: tool calling in the OpenAI layer: accepted tools/tool_choice shapes, tool and assistant
// tool_calls messages, and reading calls from a choice's output text.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

extern "C" {
#include "router/openai.h"
}

namespace {

const char *OPEN = "<tool_call>\n", *CLOSE = "\n</tool_call>";
const std::string M = R"("messages":[{"role":"user","content":"q"}])";
const std::string TOOLS = R"("tools":[{"type":"function","function":{"name":"get_weather","description":"d",)"
                          R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},)"
                          R"("required":["city"]},"strict":true}},{"type":"function","function":{"name":"ping"}}])";

struct Parsed {
  rtr_request r{};
  rtr_error e{};
  int rc;
  explicit Parsed(const std::string &body) {
    rtr_limits l{};
    l.model_name = "m";
    l.n_ctx = 2048;
    l.max_n = 8;
    l.max_stop = 4;
    l.n_vocab = 1000;
    rc = rtr_request_parse(RTR_CHAT, body.data(), body.size(), &l, &r, &e);
  }
  ~Parsed() { rtr_request_free(&r); }
};

TEST(ChatTemplate, RequestTemplateAndKwargs) {
  Parsed name("{" + M + R"(,"chat_template":"llama3","chat_template_kwargs":{}})");
  ASSERT_EQ(name.rc, 0) << name.e.message;
  ASSERT_NE(name.r.chat_family, nullptr);
  EXPECT_STREQ(name.r.chat_family->name, "llama3");
  EXPECT_STREQ(name.r.chat_template, "llama3");
  Parsed jinja("{" + M + R"(,"chat_template":"{{ '<start_of_turn>' + role }}{{ '<end_of_turn>' }}"})");
  ASSERT_EQ(jinja.rc, 0) << jinja.e.message;
  EXPECT_STREQ(jinja.r.chat_family->name, "gemma");
  Parsed none("{" + M + "}");
  EXPECT_EQ(none.r.chat_family, nullptr);
  struct {
    std::string body;
    const char *param, *code, *needle;
  } bad[] = {
      {R"(,"chat_template":"{{ messages }}"})", "chat_template", "invalid_value", "does not interpret Jinja"},
      {R"(,"chat_template":""})", "chat_template", "", "non-empty string"},
      {R"(,"chat_template":5})", "chat_template", "", "non-empty string"},
      {R"(,"chat_template_kwargs":{"enable_thinking":false}})", "chat_template_kwargs.enable_thinking",
       "unsupported_parameter", "take no template variables"},
      {R"(,"chat_template_kwargs":[1]})", "chat_template_kwargs", "", "an object"},
  };
  for (const auto &b : bad) {
    Parsed p("{" + M + b.body);
    ASSERT_NE(p.rc, 0) << b.body;
    EXPECT_STREQ(p.e.param, b.param) << b.body;
    EXPECT_STREQ(p.e.code, b.code) << b.body;
    EXPECT_NE(strstr(p.e.message, b.needle), nullptr) << b.body << ": " << p.e.message;
  }
}

TEST(Tools, ChoiceModes) {
  {
    Parsed p("{" + M + "," + TOOLS + "}"); // tools alone: auto, parallel
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_EQ(p.r.tool_choice, RTR_TOOLS_AUTO);
    EXPECT_EQ(p.r.parallel_tool_calls, 1);
    ASSERT_NE(p.r.tools, nullptr);
    EXPECT_NE(std::string(p.r.tools).find("\"description\":\"d\""), std::string::npos);
    EXPECT_EQ(std::string(p.r.call_tools),
              R"([{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},)"
              R"("required":["city"]}},{"name":"ping"}])");
  }
  {
    Parsed p("{" + M + "," + TOOLS + R"(,"tool_choice":"none"})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_EQ(p.r.tool_choice, RTR_TOOLS_OFF);
    EXPECT_EQ(p.r.tools, nullptr); // left out of the prompt
  }
  {
    Parsed p("{" + M + "," + TOOLS + R"(,"tool_choice":"required","parallel_tool_calls":false})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_EQ(p.r.tool_choice, RTR_TOOLS_REQUIRED);
    EXPECT_EQ(p.r.parallel_tool_calls, 0);
  }
  {
    Parsed p("{" + M + "," + TOOLS + R"(,"tool_choice":{"type":"function","function":{"name":"ping"}}})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_EQ(p.r.tool_choice, RTR_TOOLS_NAMED);
    EXPECT_EQ(std::string(p.r.call_tools), R"([{"name":"ping"}])"); // only the named one can be called
    EXPECT_NE(std::string(p.r.tools).find("get_weather"), std::string::npos); // the prompt still lists all
  }
  { // a forced call is one call by default; parallel calls only when asked for
    Parsed req("{" + M + "," + TOOLS + R"(,"tool_choice":"required"})");
    Parsed named("{" + M + "," + TOOLS + R"(,"tool_choice":{"type":"function","function":{"name":"ping"}}})");
    Parsed asked("{" + M + "," + TOOLS + R"(,"tool_choice":"required","parallel_tool_calls":true})");
    Parsed nulled("{" + M + "," + TOOLS + R"(,"tool_choice":"required","parallel_tool_calls":null})");
    for (Parsed *p : {&req, &named, &asked, &nulled}) ASSERT_EQ(p->rc, 0) << p->e.message;
    EXPECT_EQ(req.r.parallel_tool_calls, 0);
    EXPECT_EQ(named.r.parallel_tool_calls, 0);
    EXPECT_EQ(nulled.r.parallel_tool_calls, 0);
    EXPECT_EQ(asked.r.parallel_tool_calls, 1);
  }
  {
    Parsed p("{" + M + R"(,"tools":[],"tool_choice":"auto"})"); // no tools: nothing to call
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_EQ(p.r.tool_choice, RTR_TOOLS_OFF);
  }
}

TEST(Tools, ToolMessages) {
  Parsed p(R"({"messages":[{"role":"user","content":"q"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
      "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
      {"id":"call_2","type":"function","function":{"name":"ping","arguments":"not json"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"18C"},
    {"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"pong"}]},
    {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"ping","arguments":"{}"}}]}]})");
  ASSERT_EQ(p.rc, 0) << p.e.message;
  ASSERT_EQ(p.r.n_msgs, 5);
  EXPECT_EQ(p.r.has_tool_msgs, 1);
  EXPECT_STREQ(p.r.msgs[1].content, "");
  ASSERT_NE(p.r.msgs[1].tool_calls, nullptr);
  EXPECT_STREQ(p.r.msgs[1].tool_calls,
               R"([{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"ping","arguments":"not json"}])");
  EXPECT_STREQ(p.r.msgs[2].role, "tool");
  EXPECT_STREQ(p.r.msgs[3].content, "pong");
  EXPECT_STREQ(p.r.msgs[4].content, "");
  EXPECT_EQ(p.r.tool_choice, RTR_TOOLS_OFF);
  Parsed plain("{" + M + "}");
  EXPECT_EQ(plain.r.has_tool_msgs, 0);
}

struct Calls {
  cJSON *a = cJSON_CreateArray();
  int n;
  size_t content_len = 0;
  Calls(const rtr_request *q, const std::string &text) {
    n = rtr_parse_tool_calls(q, text.data(), text.size(), OPEN, CLOSE, a, &content_len);
  }
  ~Calls() { cJSON_Delete(a); }
  std::string name(int i) const {
    return cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(a, i), "function"), "name")->valuestring;
  }
  std::string args(int i) const {
    return cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(a, i), "function"), "arguments")->valuestring;
  }
  std::string id(int i) const { return cJSON_GetObjectItem(cJSON_GetArrayItem(a, i), "id")->valuestring; }
};

TEST(Tools, ParseCalls) {
  Parsed p("{" + M + "," + TOOLS + "}");
  ASSERT_EQ(p.rc, 0);
  {
    Calls c(&p.r, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    ASSERT_EQ(c.n, 1);
    EXPECT_EQ(c.name(0), "get_weather");
    EXPECT_EQ(c.args(0), R"({"city":"Paris"})");
    EXPECT_EQ(c.id(0).rfind("call_", 0), 0u);
    EXPECT_EQ(c.id(0).size(), 29u);
    EXPECT_EQ(c.content_len, 0u);
  }
  { // text first, two calls, loose whitespace, arguments as a string
    std::string t = "Let me check.\n\n<tool_call>{\"name\":\"ping\",\"arguments\":\"{}\"}</tool_call>\n"
                    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n";
    Calls c(&p.r, t);
    ASSERT_EQ(c.n, 2);
    EXPECT_EQ(c.content_len, strlen("Let me check."));
    EXPECT_EQ(c.name(0), "ping");
    EXPECT_EQ(c.args(0), "{}");
    EXPECT_EQ(c.name(1), "get_weather");
    EXPECT_NE(c.id(0), c.id(1));
  }
  { // an argument string may hold the close tag's text: the call is the JSON value, then the tag
    Calls c(&p.r, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo}}</tool_call> \"}}"
                  "\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>");
    ASSERT_EQ(c.n, 2);
    EXPECT_EQ(c.args(0), R"({"city":"Oslo}}</tool_call> "})");
    EXPECT_EQ(c.name(1), "ping");
  }
  { // cut by max_tokens after one call: the complete call stands
    Calls c(&p.r, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"pi");
    EXPECT_EQ(c.n, 1);
  }
  // not calls: the whole text is the content
  for (const char *t : {"no call here", "<tool_call>\n{\"name\": \"ping\", \"argu", "<tool_call>\nnot json\n</tool_call>",
                        "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
                        "<tool_call>\n{\"name\": \"ping\"}\n</tool_call>",
                        "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call> and then more text"}) {
    Calls c(&p.r, t);
    SCOPED_TRACE(t);
    EXPECT_EQ(c.n, 0);
    EXPECT_EQ(cJSON_GetArraySize(c.a), 0);
    EXPECT_EQ(c.content_len, strlen(t));
  }
  Parsed none("{" + M + "," + TOOLS + R"(,"tool_choice":"none"})"); // tools off: never read
  Calls c(&none.r, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(c.n, 0);
  Parsed named("{" + M + "," + TOOLS + R"(,"tool_choice":{"type":"function","function":{"name":"ping"}}})");
  Calls other(&named.r, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(other.n, 0); // only the named function is a call
}

TEST(Tools, OpenPrefix) {
  EXPECT_EQ(rtr_tool_open_prefix("hello <tool", 11, OPEN), 5u);
  EXPECT_EQ(rtr_tool_open_prefix("hello <", 7, OPEN), 1u);
  EXPECT_EQ(rtr_tool_open_prefix("hello", 5, OPEN), 0u);
  EXPECT_EQ(rtr_tool_open_prefix("a <tool_call", 12, OPEN), 10u);
  EXPECT_EQ(rtr_tool_open_prefix("<tool_call>", 11, OPEN), 0u); // the whole tag is found, not held as a prefix
  EXPECT_EQ(rtr_tool_open_prefix("", 0, OPEN), 0u);
}

} // namespace
