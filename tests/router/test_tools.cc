// tests/router/test_tools.cc: tool calling in the OpenAI layer: accepted tools/tool_choice shapes, tool and assistant
// tool_calls messages, and reading calls from a choice's output text.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

extern "C" {
#include "router/openai.h"
}

namespace {

const char *OPEN = "<tool_call>\n";
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
  // template text is Jinja, parsed at once (run at render); its call format is read from it
  Parsed jinja("{" + M + R"(,"chat_template":"{% for m in messages %}<tool_call>{{ m.content }}{% endfor %}",)"
               R"("chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(jinja.rc, 0) << jinja.e.message;
  EXPECT_EQ(jinja.r.chat_family, nullptr);
  ASSERT_NE(jinja.r.chat_jinja, nullptr);
  ASSERT_NE(jinja.r.chat_jinja_tools, nullptr);
  EXPECT_STREQ(jinja.r.chat_jinja_tools->name, "hermes");
  EXPECT_STREQ(jinja.r.chat_kwargs, R"({"enable_thinking":false})");
  Parsed none("{" + M + "}");
  EXPECT_EQ(none.r.chat_family, nullptr);
  EXPECT_EQ(none.r.chat_jinja, nullptr);
  EXPECT_EQ(none.r.chat_kwargs, nullptr);
  struct {
    std::string body;
    const char *param, *code, *needle;
  } bad[] = {
      {R"(,"chat_template":"hi\n{% if %}"})", "chat_template", "invalid_value", "line 2"},
      {R"(,"chat_template":"{{ messages"})", "chat_template", "invalid_value", "nor a Jinja template that parses"},
      {R"(,"chat_template":")" + std::string(RTR_MAX_CHAT_TEMPLATE + 1, 'x') + "\"}", "chat_template", "",
       "at most"},
      {R"(,"chat_template":""})", "chat_template", "", "non-empty string"},
      {R"(,"chat_template":5})", "chat_template", "", "non-empty string"},
      {R"(,"chat_template_kwargs":{"x":1,"bos_token":"<s>"}})", "chat_template_kwargs.bos_token", "invalid_value",
       "cannot be set"},
      {R"(,"chat_template_kwargs":{"messages":[]}})", "chat_template_kwargs.messages", "invalid_value",
       "cannot be set"},
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
               R"([{"id":"call_1","name":"get_weather","arguments":{"city":"Paris"}},)"
               R"({"id":"call_2","name":"ping","arguments":"not json"}])");
  EXPECT_STREQ(p.r.msgs[2].tool_call_id, "call_1"); // read by a Jinja template
  EXPECT_EQ(p.r.msgs[0].name, nullptr);
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
  Calls(const rtr_request *q, const std::string &text, const mdl_chat_tool_style *st = style("<tool_call>")) {
    n = rtr_parse_tool_calls(q, st, text.data(), text.size(), a, &content_len);
  }
  // a format by the markers of a template that writes it (models/chat.h mdl_chat_tool_style_detect)
  static const mdl_chat_tool_style *style(const char *tpl) { return mdl_chat_tool_style_detect(tpl, strlen(tpl)); }
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

const char *LLAMA3_TPL = "<|start_header_id|>{{ '\"parameters\": ' }}", *MISTRAL_TPL = "[TOOL_CALLS]";

TEST(Tools, DetectFormat) {
  const char *none = "{% for m in messages %}{{ m.content }}{% endfor %}";
  EXPECT_EQ(Calls::style(none), nullptr);
  EXPECT_EQ(Calls::style("<|start_header_id|>no tools<|eot_id|>"), nullptr);
  EXPECT_STREQ(Calls::style("{{ '<tool_call>\\n' }}")->name, "hermes");
  EXPECT_STREQ(Calls::style(LLAMA3_TPL)->name, "llama3_json");
  EXPECT_STREQ(Calls::style("<|start_header_id|>{{ '<|python_tag|>' }}")->name, "llama3_json");
  EXPECT_STREQ(Calls::style(MISTRAL_TPL)->name, "mistral");
  EXPECT_STREQ(Calls::style(LLAMA3_TPL)->args_key, "parameters");
}

TEST(Tools, ParseCallsLlama3) {
  Parsed p("{" + M + "," + TOOLS + "}");
  ASSERT_EQ(p.rc, 0);
  const mdl_chat_tool_style *st = Calls::style(LLAMA3_TPL);
  { // the whole reply is the call
    Calls c(&p.r, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n", st);
    ASSERT_EQ(c.n, 1);
    EXPECT_EQ(c.name(0), "get_weather");
    EXPECT_EQ(c.args(0), R"({"city":"Paris"})");
    EXPECT_EQ(c.id(0).rfind("call_", 0), 0u);
    EXPECT_EQ(c.content_len, 0u);
  }
  { // after <|python_tag|>, with "arguments" as some Llama 3 fine-tunes write
    std::string t = "Checking.<|python_tag|>{\"name\": \"ping\", \"arguments\": {}}";
    Calls c(&p.r, t, st);
    ASSERT_EQ(c.n, 1);
    EXPECT_EQ(c.name(0), "ping");
    EXPECT_EQ(c.content_len, strlen("Checking."));
  }
  // not calls: the whole text is the content
  for (const char *t : {"The answer is {\"name\": \"ping\", \"parameters\": {}}", // not the whole reply
                        "{\"name\": \"ping\", \"parameters\": {}} and more", "{\"name\": \"rm\", \"parameters\": {}}",
                        "{\"name\": \"ping\", \"parameters\": {", "{\"city\": \"Paris\"}",
                        "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"}) {
    Calls c(&p.r, t, st);
    SCOPED_TRACE(t);
    EXPECT_EQ(c.n, 0);
    EXPECT_EQ(c.content_len, strlen(t));
  }
}

TEST(Tools, ParseCallsMistral) {
  Parsed p("{" + M + "," + TOOLS + "}");
  ASSERT_EQ(p.rc, 0);
  const mdl_chat_tool_style *st = Calls::style(MISTRAL_TPL);
  { // one array of two calls, the model's own ids kept
    Calls c(&p.r, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, "
                  "\"id\": \"a1b2c3d4e\"}, {\"name\": \"ping\", \"arguments\": {}, \"id\": \"zzzzzzzz9\"}]", st);
    ASSERT_EQ(c.n, 2);
    EXPECT_EQ(c.name(0), "get_weather");
    EXPECT_EQ(c.args(0), R"({"city":"Oslo"})");
    EXPECT_EQ(c.id(0), "a1b2c3d4e");
    EXPECT_EQ(c.id(1), "zzzzzzzz9");
  }
  { // text first; an array per call (a forced parallel turn); no id: 9 letters and digits, as its template wants
    std::string t = "Sure. [TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}][TOOL_CALLS][{\"name\": \"ping\", "
                    "\"arguments\": {}}]";
    Calls c(&p.r, t, st);
    ASSERT_EQ(c.n, 2);
    EXPECT_EQ(c.content_len, strlen("Sure."));
    EXPECT_EQ(c.id(0).size(), 9u);
    EXPECT_NE(c.id(0), c.id(1));
  }
  { // cut by max_tokens in a second array: the first stands
    Calls c(&p.r, "[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}][TOOL_CALLS][{\"name\": \"pi", st);
    EXPECT_EQ(c.n, 1);
  }
  for (const char *t : {"[TOOL_CALLS]", "[TOOL_CALLS][{\"name\": \"pi", "[TOOL_CALLS]{\"name\": \"ping\"}",
                        "[TOOL_CALLS][{\"name\": \"rm\", \"arguments\": {}}]",
                        "[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}] then text", "[TOOL_CALLS][]"}) {
    Calls c(&p.r, t, st);
    SCOPED_TRACE(t);
    EXPECT_EQ(c.n, 0);
    EXPECT_EQ(c.content_len, strlen(t));
  }
}

// What a stream may send now: rtr_tool_hold over the text held so far.
TEST(Tools, StreamHold) {
  const mdl_chat_tool_style *hermes = Calls::style("<tool_call>"), *llama = Calls::style(LLAMA3_TPL),
                            *mistral = Calls::style(MISTRAL_TPL);
  struct {
    const mdl_chat_tool_style *st;
    const char *held;
    int began;
    size_t send;
    int in_call;
  } cases[] = {
      {hermes, "Hello <tool", 0, 5, 0},           // a tail that may begin the tag waits (and the space before it)
      {hermes, "Hello <tool_call>{", 0, 5, 1},
      {hermes, "{\"a\": 1}", 0, 8, 0},              // JSON is content in Hermes's format
      {mistral, "Sure [TOOL_", 0, 4, 0},
      {mistral, "[TOOL_CALLS][{", 0, 0, 1},
      {llama, "  ", 0, 0, 0},                      // nothing but spaces yet: the reply may still be a call
      {llama, " {\"name\"", 0, 0, 1},              // a reply that opens with '{' waits whole
      {llama, "{\"name\"", 1, 7, 0},               // ... not once content went out
      {llama, "Hi <|python", 0, 2, 0},
      {llama, "Hi <|python_tag|>{", 0, 2, 1},
  };
  for (const auto &c : cases) {
    int in_call = 0;
    SCOPED_TRACE(std::string(c.st->name) + ": " + c.held);
    EXPECT_EQ(rtr_tool_hold(c.st, c.held, strlen(c.held), c.began, &in_call), c.send);
    EXPECT_EQ(in_call, c.in_call);
  }
  int in_call = 1; // a call began: everything waits
  EXPECT_EQ(rtr_tool_hold(hermes, "more", 4, 1, &in_call), 0u);
}

} // namespace
