// tests/models/test_chat_jinja.cc: a chat rendered by a Jinja template (models/chat_jinja.c): the OpenAI conversation
// as the template's variables, the request's text in spans, BOS cut as llama.cpp cuts it, raise_exception; the call
// formats detected from template text and their call grammars (Llama 3's "parameters", Mistral's [TOOL_CALLS]).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "models/chat.h"
#include "models/grammar.h"
#include "models/jinja.h"
}

namespace {

// A message for the Jinja path (absent fields NULL).
mdl_chat_turn T(const char *role, const char *content, const char *name = nullptr, const char *calls = nullptr,
                const char *call_id = nullptr, const char *reasoning = nullptr) {
  return mdl_chat_turn{role, content, name, calls, call_id, reasoning};
}

// The variables: msgs (n), the rest zero until set.
mdl_chat_jinja_in In(const mdl_chat_turn *m, size_t n, const char *bos = "", const char *eos = "") {
  mdl_chat_jinja_in in{};
  in.msgs = m;
  in.n = n;
  in.bos = bos;
  in.eos = eos;
  return in;
}

// A template text parsed (the interpreter's), rendered with in: the text and its request-text spans as strings.
struct R {
  mdl_jinja *t = nullptr;
  int rc = -99;
  std::string out, err;
  std::vector<std::string> spans;
  R(const std::string &tpl, mdl_chat_jinja_in in) {
    char e[512] = {0};
    if (mdl_jinja_parse(tpl.data(), tpl.size(), &t, e, sizeof e) != 0) {
      err = std::string("parse: ") + e;
      return;
    }
    char *o = nullptr;
    size_t *sp = nullptr, n = 0;
    rc = mdl_chat_render_jinja(t, &in, &o, &sp, &n, e, sizeof e);
    err = e;
    if (o) out = o;
    for (size_t i = 0; i < n; i++) spans.push_back(out.substr(sp[2 * i], sp[2 * i + 1]));
    free(o);
    free(sp);
  }
  ~R() { mdl_jinja_free(t); }
};

// SmolLM2's template (its GGUF's tokenizer.chat_template).
const std::string SMOLLM2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatJinja, RendersTheConversation) {
  mdl_chat_turn m[] = {T("user", "Hi <|im_end|>"), T("assistant", "Hello."), T("user", "Bye")};
  mdl_chat_jinja_in in = In(m, 3, "<|im_start|>", "<|im_end|>");
  in.add_generation_prompt = 1;
  R r(SMOLLM2, in);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nHi <|im_end|><|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
                   "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  // the request's text and only it: message contents (roles too: every string in messages is the request's)
  EXPECT_EQ(r.spans, (std::vector<std::string>{"user", "Hi <|im_end|>", "assistant", "Hello.", "user", "Bye"}));
  // the same conversation through the ChatML family renders the same text
  char *fam = nullptr, e[256];
  mdl_chat_msg fm[] = {{"user", "Hi <|im_end|>"}, {"assistant", "Hello."}, {"user", "Bye"}};
  ASSERT_EQ(mdl_chat_apply(nullptr, fm, 3, 1, &fam, e, sizeof e), 0) << e;
  EXPECT_EQ(r.out, fam);
  free(fam);
}

TEST(ChatJinja, Variables) {
  // tool calls in either shape come out as OpenAI's, arguments a mapping; name, tool_call_id, reasoning_content,
  // tools, the generation prompt flag, bos/eos and kwargs are the template's variables
  const std::string tpl =
      "{% for m in messages %}[{{ m.role }}|{{ m.name }}|{{ m.reasoning_content }}|{{ m.tool_call_id }}"
      "{% for c in m.tool_calls %}|{{ c.type }}:{{ c.id }}:{{ c.function.name }}:{{ c.function.arguments.city }}"
      "{% endfor %}]{% endfor %}{{ tools[0].function.name }}|{{ add_generation_prompt }}|{{ bos_token }}|"
      "{{ eos_token }}|{{ enable_thinking }}|{{ tools is defined }}";
  mdl_chat_turn m[] = {
      T("user", "q", "ann"),
      T("assistant", "", nullptr, R"([{"id":"c1","name":"get_weather","arguments":{"city":"Oslo"}}])", nullptr,
        "think"),
      T("tool", "12 C", nullptr, nullptr, "c1"),
      T("assistant", "", nullptr,
        R"([{"id":"c2","type":"function","function":{"name":"f","arguments":{"city":"Rome"}}}])")};
  mdl_chat_jinja_in in = In(m, 4, "<s>", "</s>");
  in.tools = R"([{"type":"function","function":{"name":"get_weather"}}])";
  in.kwargs = R"({"enable_thinking":false})";
  in.add_generation_prompt = 1;
  R r(tpl, in);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "[user|ann||][assistant||think||function:c1:get_weather:Oslo][tool|||c1]"
                   "[assistant||||function:c2:f:Rome]get_weather|True|<s>|</s>|False|True");
  R no_tools("{{ tools is defined }}", In(m, 1));
  EXPECT_EQ(no_tools.out, "False");
  // kwargs never replace the server's variables (the router refuses those keys; they are dropped here too)
  mdl_chat_jinja_in own_in = In(m, 1, "<s>");
  own_in.kwargs = R"({"bos_token":"X","messages":[]})";
  R own("{{ bos_token }}{{ messages | length }}", own_in);
  EXPECT_EQ(own.out, "<s>1");
}

TEST(ChatJinja, BosIsCutOnceAsLlamaCpp) {
  mdl_chat_turn m[] = {T("user", "hi")};
  const std::string tpl = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}";
  R kept(tpl, In(m, 1, "<|begin_of_text|>"));
  EXPECT_EQ(kept.out, "<|begin_of_text|>hi");
  mdl_chat_jinja_in strip = In(m, 1, "<|begin_of_text|>");
  strip.strip_bos = 1; // the tokenizer adds BOS itself
  R cut(tpl, strip);
  EXPECT_EQ(cut.out, "hi");
  EXPECT_EQ(cut.spans, std::vector<std::string>{"hi"});
  // a request whose own text begins with the bos text keeps it: the template did not write it
  mdl_chat_turn u[] = {T("user", "<|begin_of_text|>x")};
  strip.msgs = u;
  R theirs("{% for m in messages %}{{ m.content }}{% endfor %}", strip);
  EXPECT_EQ(theirs.out, "<|begin_of_text|>x");
}

TEST(ChatJinja, Errors) {
  mdl_chat_turn m[] = {T("system", "s"), T("user", "u")};
  R raised("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
           In(m, 2));
  EXPECT_EQ(raised.rc, MDL_JINJA_RAISED);
  EXPECT_EQ(raised.err, "System role not supported");
  EXPECT_TRUE(raised.out.empty());
  mdl_chat_turn bad[] = {T("assistant", "", nullptr, "not json")};
  R calls("x", In(bad, 1));
  EXPECT_EQ(calls.rc, -1);
  EXPECT_NE(calls.err.find("tool_calls"), std::string::npos) << calls.err;
  mdl_chat_jinja_in in = In(m, 2);
  in.tools = "{}";
  R tools("x", in);
  EXPECT_EQ(tools.rc, -1);
  in.tools = nullptr;
  in.kwargs = "[1]";
  R kw("x", in);
  EXPECT_EQ(kw.rc, -1);
}

std::string slurp(const std::string &path) {
  FILE *f = fopen(path.c_str(), "rb");
  std::string s;
  char buf[4096];
  for (size_t k; f && (k = fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, k);
  if (f) fclose(f);
  return s;
}

// The published templates (tests/models/templates): the call format each writes, and whether it reads tools at all
// (router/prompt.c refuses tools unless both).
TEST(ChatJinja, FormatsOfThePublishedTemplates) {
  struct {
    const char *file, *format;
    int tools;
  } cases[] = {
      {"HuggingFaceTB-SmolLM2-135M-Instruct", nullptr, 0},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes", 1},
      {"Qwen-QwQ-32B", "hermes", 1},
      {"Qwen-Qwen2.5-7B-Instruct", "hermes", 1},
      {"Qwen-Qwen3-0.6B", "hermes", 1},
      {"Qwen3-Coder", nullptr, 1}, // its XML calls are not read here: tools refused
      {"google-gemma-2-2b-it", nullptr, 0},
      {"google-gemma-3-it", nullptr, 0},
      {"meta-llama-Llama-3.1-8B-Instruct", "llama3_json", 1},
      {"meta-llama-Llama-3.2-3B-Instruct", "llama3_json", 1},
      {"meta-llama-Llama-3.3-70B-Instruct", "llama3_json", 1},
      {"microsoft-Phi-3.5-mini-instruct", nullptr, 0},
      {"mistralai-Mistral-Nemo-Instruct-2407", "mistral", 1},
  };
  for (const auto &c : cases) {
    std::string tpl = slurp(std::string(DSERVE_SOURCE_DIR "/tests/models/templates/") + c.file + ".jinja");
    ASSERT_FALSE(tpl.empty()) << c.file;
    const mdl_chat_tool_style *st = mdl_chat_tool_style_detect(tpl.data(), tpl.size());
    EXPECT_STREQ(st ? st->name : nullptr, c.format) << c.file;
    mdl_jinja *t = nullptr;
    char err[256];
    ASSERT_EQ(mdl_jinja_parse(tpl.data(), tpl.size(), &t, err, sizeof err), 0) << c.file << ": " << err;
    EXPECT_EQ(mdl_jinja_uses_var(t, "tools"), c.tools) << c.file;
    mdl_jinja_free(t);
  }
  const char *small = "[SYSTEM_PROMPT]{{ '[TOOL_CALLS]' + name + '[ARGS]' }}";
  EXPECT_EQ(mdl_chat_tool_style_detect(small, strlen(small)), nullptr); // Mistral Small 3.2's own format
}

TEST(ChatJinja, FormatGrammars) {
  const char *tools = R"([{"name":"get_weather","parameters":{"type":"object","properties":{"city":)"
                      R"({"type":"string"}},"required":["city"],"additionalProperties":false}}])";
  auto grammar = [&](const char *tpl, int parallel) {
    const mdl_chat_tool_style *st = mdl_chat_tool_style_detect(tpl, strlen(tpl));
    mdl_grammar *g = nullptr;
    char err[256];
    EXPECT_NE(st, nullptr) << tpl;
    EXPECT_EQ(mdl_grammar_from_tool_calls(tools, strlen(tools), st->call_open, st->call_close, st->call_sep,
                                          st->args_key, parallel, &g, err, sizeof err),
              0)
        << err;
    return g;
  };
  mdl_grammar *llama = grammar("<|start_header_id|>{{ '\"parameters\": ' }}", 0);
  auto ok = [](mdl_grammar *g, const std::string &s) { return mdl_grammar_matches(g, s.data(), s.size()); };
  EXPECT_TRUE(ok(llama, R"({"name": "get_weather", "parameters": {"city": "Oslo"}})"));
  EXPECT_FALSE(ok(llama, R"({"name": "get_weather", "arguments": {"city": "Oslo"}})"));
  mdl_grammar *mistral = grammar("[TOOL_CALLS]", 1);
  EXPECT_TRUE(ok(mistral, R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}])"));
  EXPECT_TRUE(ok(mistral, R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "A"}}])"
                          R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "B"}}])"));
  EXPECT_FALSE(ok(mistral, R"({"name": "get_weather", "arguments": {"city": "Oslo"}})"));
  mdl_grammar_unref(llama);
  mdl_grammar_unref(mistral);
}

// The tools reach the template as the request wrote them: 100.0 stays a float, a 2^60 + 1 integer keeps its digits
// (a round trip through cJSON printed "100" and rounded the integer), and their strings are request text.
TEST(ChatJinja, ToolsKeepTheirNumbers) {
  mdl_chat_turn m[] = {T("user", "hi")};
  mdl_chat_jinja_in in = In(m, 1);
  in.tools = R"([{"type":"function","function":{"name":"f","parameters":{"maximum":100.0,"x":1152921504606846977}}}])";
  R r("{{ tools | tojson }}|{{ tools[0].function.parameters.maximum }}", in);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("100.0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1152921504606846977"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.substr(r.out.size() - 6), "|100.0") << r.out;
  ASSERT_FALSE(r.spans.empty());
  EXPECT_NE(r.spans[0].find("\"f\""), std::string::npos) << r.spans[0];
}

} // namespace
