// tests/router/test_validate.cc: OpenAI request validation: defaults, accepted shapes, and hostile/malformed bodies.
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
  l.n_ctx = 2048;
  l.max_tokens_limit = 0;
  l.max_n = 8;
  l.max_stop = 4;
  l.n_vocab = 1000;
  return l;
}

struct Parsed {
  rtr_request r{};
  rtr_error e{};
  int rc;
  Parsed(rtr_kind k, const std::string &body) {
    rtr_limits l = limits();
    rc = rtr_request_parse(k, body.data(), body.size(), &l, &r, &e);
  }
  ~Parsed() { rtr_request_free(&r); }
};

TEST(Validate, ChatDefaults) {
  Parsed p(RTR_CHAT, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  ASSERT_EQ(p.rc, 0) << p.e.message;
  EXPECT_EQ(p.r.n_msgs, 1);
  EXPECT_STREQ(p.r.msgs[0].role, "user");
  EXPECT_STREQ(p.r.msgs[0].content, "hi");
  EXPECT_EQ(p.r.max_tokens, -1);
  EXPECT_EQ(p.r.temperature, 1.0);
  EXPECT_EQ(p.r.top_p, 1.0);
  EXPECT_EQ(p.r.top_k, -1);
  EXPECT_EQ(p.r.min_p, 0.0);
  EXPECT_EQ(p.r.repetition_penalty, 1.0);
  EXPECT_EQ(p.r.n, 1);
  EXPECT_EQ(p.r.logprobs, -1);
  EXPECT_EQ(p.r.has_seed, 0);
  EXPECT_EQ(p.r.stream, 0);
}

TEST(Validate, ChatEverything) {
  Parsed p(RTR_CHAT, R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}],
    "max_tokens":5,"max_completion_tokens":7,"temperature":0,"top_p":0.5,"top_k":0,"min_p":0.1,"presence_penalty":-2,
    "frequency_penalty":2,"repetition_penalty":1.2,"seed":-42,"stop":["x","yy"],"n":3,"logprobs":true,"top_logprobs":20,
    "logit_bias":{"5":-100,"999":100},"stream":true,"stream_options":{"include_usage":true},"user":"u"})");
  ASSERT_EQ(p.rc, 0) << p.e.message;
  ASSERT_EQ(p.r.n_msgs, 3);
  EXPECT_STREQ(p.r.msgs[1].content, "ab");
  EXPECT_STREQ(p.r.msgs[2].content, "");
  EXPECT_EQ(p.r.max_tokens, 7); // max_completion_tokens wins
  EXPECT_EQ(p.r.temperature, 0.0);
  EXPECT_EQ(p.r.top_k, -1);
  EXPECT_EQ(p.r.seed, -42);
  EXPECT_EQ(p.r.has_seed, 1);
  ASSERT_EQ(p.r.n_stop, 2);
  EXPECT_STREQ(p.r.stop[1], "yy");
  EXPECT_EQ(p.r.n, 3);
  EXPECT_EQ(p.r.logprobs, 20);
  ASSERT_EQ(p.r.n_bias, 2);
  EXPECT_EQ(p.r.bias[1].id, 999);
  EXPECT_EQ(p.r.bias[1].bias, 100.0f);
  EXPECT_EQ(p.r.stream, 1);
  EXPECT_EQ(p.r.include_usage, 1);
}

TEST(Validate, CompletionPromptShapes) {
  {
    Parsed p(RTR_COMPLETION, R"({"prompt":"hello","logprobs":3,"stop":"\n"})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 1);
    EXPECT_STREQ(p.r.prompts[0].text, "hello");
    EXPECT_EQ(p.r.logprobs, 3);
    EXPECT_EQ(p.r.n_stop, 1);
  }
  {
    Parsed p(RTR_COMPLETION, R"({"prompt":[1,2,999]})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 1);
    ASSERT_EQ(p.r.prompts[0].n_ids, 3);
    EXPECT_EQ(p.r.prompts[0].ids[2], 999);
  }
  {
    Parsed p(RTR_COMPLETION, R"({"prompt":["one string"]})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 1);
    EXPECT_STREQ(p.r.prompts[0].text, "one string");
  }
  {
    Parsed p(RTR_COMPLETION, R"({"prompt":[[4,5]], "echo": false, "suffix": null, "seed": 9007199254740992})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 1);
    EXPECT_EQ(p.r.prompts[0].n_ids, 2);
    EXPECT_EQ(p.r.seed, 9007199254740992LL);
  }
  { // a list of prompts: strings and token-id lists mixed, one choice group each
    Parsed p(RTR_COMPLETION, R"({"prompt":["a", [7, 8, 9], "bc"], "n": 2})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 3);
    EXPECT_STREQ(p.r.prompts[0].text, "a");
    EXPECT_EQ(p.r.prompts[1].n_ids, 3);
    EXPECT_EQ(p.r.prompts[1].text, nullptr);
    EXPECT_STREQ(p.r.prompts[2].text, "bc");
    EXPECT_EQ(p.r.n, 2);
  }
  struct {
    const char *body, *param, *needle;
  } bad[] = {
      {R"({"prompt":["a", 5]})", "prompt[1]", "list of strings"},
      {R"({"prompt":["a", []]})", "prompt[1]", "must not be empty"},
      {R"({"prompt":[[1], [99999]]})", "prompt[1]", "outside the vocabulary"},
      {R"({"prompt":["a", {"x": 1}]})", "prompt[1]", "list of strings"},
      {R"({"prompt":[]})", "prompt", "must not be empty"},
      {R"({"prompt":[[1, "a"]]})", "prompt[0]", "list of strings"},
  };
  for (const auto &b : bad) {
    Parsed p(RTR_COMPLETION, b.body);
    ASSERT_NE(p.rc, 0) << b.body;
    EXPECT_STREQ(p.e.param, b.param) << b.body;
    EXPECT_NE(strstr(p.e.message, b.needle), nullptr) << b.body << ": " << p.e.message;
  }
  std::string many = R"({"prompt":[)";
  for (int i = 0; i <= RTR_MAX_PROMPTS; i++) many += i ? ",\"x\"" : "\"x\"";
  Parsed p(RTR_COMPLETION, many + "]}");
  ASSERT_NE(p.rc, 0);
  EXPECT_NE(strstr(p.e.message, "at most 64"), nullptr) << p.e.message;
}

TEST(Validate, TokenizeAndDetokenize) {
  {
    Parsed p(RTR_TOKENIZE, R"({"prompt":"abc","add_special_tokens":false})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_STREQ(p.r.prompt, "abc");
    EXPECT_EQ(p.r.add_special, 0);
  }
  {
    Parsed p(RTR_TOKENIZE, R"({"messages":[{"role":"user","content":"x"}]})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_EQ(p.r.n_msgs, 1);
    EXPECT_EQ(p.r.add_special, 1);
  }
  {
    Parsed p(RTR_DETOKENIZE, R"({"tokens":[0,1,2]})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_EQ(p.r.n_prompt_ids, 3);
  }
}

struct Bad {
  rtr_kind kind;
  std::string body;
  int status;
  const char *param; // "" = null
  const char *code;  // "" = null
};

std::string deep(int levels) {
  std::string s = "{\"messages\":";
  for (int i = 0; i < levels; i++) s += "[";
  for (int i = 0; i < levels; i++) s += "]";
  return s + "}";
}

const std::string M = R"("messages":[{"role":"user","content":"hi"}])";

std::vector<Bad> bad_bodies() {
  std::vector<Bad> v = {
      {RTR_CHAT, "", 400, "", ""},
      {RTR_CHAT, "{", 400, "", ""},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":"hi"})", 400, "", ""}, // truncated
      {RTR_CHAT, "[1,2]", 400, "", ""},
      {RTR_CHAT, "\"just a string\"", 400, "", ""},
      {RTR_CHAT, "{} trailing", 400, "", ""},
      {RTR_CHAT, "{\"messages\":\"\xff\xfe\"}", 400, "", ""},                  // not UTF-8
      {RTR_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}", 400, "", ""}, // overlong
      {RTR_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", 400, "", ""}, // surrogate
      {RTR_CHAT, deep(10000), 400, "", ""},
      {RTR_CHAT, deep(1500), 400, "", ""},
      {RTR_CHAT, "{}", 400, "messages", ""},
      {RTR_CHAT, R"({"messages":[]})", 400, "messages", ""},
      {RTR_CHAT, R"({"messages":{"role":"user"}})", 400, "messages", ""},
      {RTR_CHAT, R"({"messages":[5]})", 400, "messages[0]", ""},
      {RTR_CHAT, R"({"messages":[{"role":"wizard","content":"x"}]})", 400, "messages[0].role", ""},
      {RTR_CHAT, R"({"messages":[{"role":7,"content":"x"}]})", 400, "messages[0].role", ""},
      {RTR_CHAT, R"({"messages":[{"role":"user"}]})", 400, "messages[0].content", ""},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":null}]})", 400, "messages[0].content", ""},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":12}]})", 400, "messages[0].content", ""},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400,
       "messages[0].content", ""},
      {RTR_CHAT, "{" + M + R"(,"model":"other"})", 404, "model", "model_not_found"},
      {RTR_CHAT, "{" + M + R"(,"model":5})", 400, "model", ""},
      {RTR_CHAT, "{" + M + R"(,"max_tokens":-1})", 400, "max_tokens", ""},
      {RTR_CHAT, "{" + M + R"(,"max_tokens":0})", 400, "max_tokens", ""},
      {RTR_CHAT, "{" + M + R"(,"max_tokens":1e309})", 400, "max_tokens", ""},
      {RTR_CHAT, "{" + M + R"(,"max_tokens":2.5})", 400, "max_tokens", ""},
      {RTR_CHAT, "{" + M + R"(,"max_tokens":"10"})", 400, "max_tokens", ""},
      {RTR_CHAT, "{" + M + R"(,"max_tokens":4096})", 400, "max_tokens", ""}, // over the context
      {RTR_CHAT, "{" + M + R"(,"max_completion_tokens":-5})", 400, "max_completion_tokens", ""},
      {RTR_CHAT, "{" + M + R"(,"temperature":2.01})", 400, "temperature", ""},
      {RTR_CHAT, "{" + M + R"(,"temperature":-1e309})", 400, "temperature", ""},
      {RTR_CHAT, "{" + M + R"(,"temperature":"hot"})", 400, "temperature", ""},
      {RTR_CHAT, "{" + M + R"(,"top_p":0})", 400, "top_p", ""},
      {RTR_CHAT, "{" + M + R"(,"top_p":1.5})", 400, "top_p", ""},
      {RTR_CHAT, "{" + M + R"(,"top_k":-2})", 400, "top_k", ""},
      {RTR_CHAT, "{" + M + R"(,"top_k":true})", 400, "top_k", ""},
      {RTR_CHAT, "{" + M + R"(,"min_p":1.1})", 400, "min_p", ""},
      {RTR_CHAT, "{" + M + R"(,"presence_penalty":3})", 400, "presence_penalty", ""},
      {RTR_CHAT, "{" + M + R"(,"frequency_penalty":-2.5})", 400, "frequency_penalty", ""},
      {RTR_CHAT, "{" + M + R"(,"repetition_penalty":0})", 400, "repetition_penalty", ""},
      {RTR_CHAT, "{" + M + R"(,"repetition_penalty":2.5})", 400, "repetition_penalty", ""},
      {RTR_CHAT, "{" + M + R"(,"seed":1.5})", 400, "seed", ""},
      {RTR_CHAT, "{" + M + R"(,"seed":1e300})", 400, "seed", ""},
      {RTR_CHAT, "{" + M + R"(,"seed":"7"})", 400, "seed", ""},
      {RTR_CHAT, "{" + M + R"(,"n":0})", 400, "n", ""},
      {RTR_CHAT, "{" + M + R"(,"n":9})", 400, "n", ""},
      {RTR_CHAT, "{" + M + R"(,"n":[1]})", 400, "n", ""},
      {RTR_CHAT, "{" + M + R"(,"stop":["a","b","c","d","e"]})", 400, "stop", ""},
      {RTR_CHAT, "{" + M + R"(,"stop":[""]})", 400, "stop", ""},
      {RTR_CHAT, "{" + M + R"(,"stop":""})", 400, "stop", ""},
      {RTR_CHAT, "{" + M + R"(,"stop":[1]})", 400, "stop", ""},
      {RTR_CHAT, "{" + M + R"(,"stop":{"a":1}})", 400, "stop", ""},
      {RTR_CHAT, "{" + M + R"(,"logprobs":1})", 400, "logprobs", ""},
      {RTR_CHAT, "{" + M + R"(,"logprobs":true,"top_logprobs":21})", 400, "top_logprobs", ""},
      {RTR_CHAT, "{" + M + R"(,"top_logprobs":2})", 400, "top_logprobs", ""},
      {RTR_CHAT, "{" + M + R"(,"logit_bias":{"abc":1}})", 400, "logit_bias", ""},
      {RTR_CHAT, "{" + M + R"(,"logit_bias":{"-1":1}})", 400, "logit_bias", ""},
      {RTR_CHAT, "{" + M + R"(,"logit_bias":{"1000":1}})", 400, "logit_bias", ""},
      {RTR_CHAT, "{" + M + R"(,"logit_bias":{"12x":1}})", 400, "logit_bias", ""},
      {RTR_CHAT, "{" + M + R"(,"logit_bias":{"5":101}})", 400, "logit_bias", ""},
      {RTR_CHAT, "{" + M + R"(,"logit_bias":{"5":"1"}})", 400, "logit_bias", ""},
      {RTR_CHAT, "{" + M + R"(,"logit_bias":[1]})", 400, "logit_bias", ""},
      {RTR_CHAT, "{" + M + R"(,"stream":"yes"})", 400, "stream", ""},
      {RTR_CHAT, "{" + M + R"(,"stream_options":{"include_usage":true}})", 400, "stream_options", ""},
      {RTR_CHAT, "{" + M + R"(,"stream":true,"stream_options":{"include_usage":1}})", 400,
       "stream_options.include_usage", ""},
      {RTR_CHAT, "{" + M + R"(,"user":5})", 400, "user", ""},
      {RTR_COMPLETION, "{}", 400, "prompt", ""},
      {RTR_COMPLETION, R"({"prompt":5})", 400, "prompt", ""},
      {RTR_COMPLETION, R"({"prompt":[]})", 400, "prompt", ""},
      {RTR_COMPLETION, R"({"prompt":["a",7]})", 400, "prompt[1]", ""},
      {RTR_COMPLETION, R"({"prompt":[1,"a"]})", 400, "prompt[0]", ""},
      {RTR_COMPLETION, R"({"prompt":[1,1000]})", 400, "prompt", ""},
      {RTR_COMPLETION, R"({"prompt":[1,-1]})", 400, "prompt", ""},
      {RTR_COMPLETION, R"({"prompt":[1.5]})", 400, "prompt", ""},
      {RTR_COMPLETION, R"({"prompt":"x","echo":true})", 400, "echo", "unsupported_parameter"},
      {RTR_COMPLETION, R"({"prompt":"x","suffix":"s"})", 400, "suffix", "unsupported_parameter"},
      {RTR_COMPLETION, R"({"prompt":"x","logprobs":6})", 400, "logprobs", ""},
      {RTR_COMPLETION, R"({"prompt":"x","logprobs":true})", 400, "logprobs", ""},
      {RTR_COMPLETION, R"({"prompt":"x","best_of":3})", 400, "best_of", "unsupported_parameter"},
      {RTR_TOKENIZE, R"({})", 400, "prompt", ""},
      {RTR_TOKENIZE, R"({"prompt":[1]})", 400, "prompt", ""},
      {RTR_TOKENIZE, R"({"prompt":"x","add_special_tokens":"no"})", 400, "add_special_tokens", ""},
      {RTR_DETOKENIZE, R"({})", 400, "tokens", ""},
      {RTR_DETOKENIZE, R"({"tokens":"abc"})", 400, "tokens", ""},
      {RTR_DETOKENIZE, R"({"tokens":[1,5000]})", 400, "tokens", ""},
  };
  // No field is silently ignored (docs/openai.md): unknown fields, and what this server cannot do yet.
  const char *U = "unsupported_parameter", *I = "invalid_value";
  std::vector<Bad> refused = {
      {RTR_CHAT, "{" + M + R"(,"whatever":[1,{"a":2}]})", 400, "whatever", U},
      {RTR_CHAT, "{" + M + R"(,"whatever":null})", 400, "whatever", U},
      {RTR_CHAT, "{" + M + R"(,"Temperature":0.5})", 400, "Temperature", U}, // names are case-sensitive
      {RTR_CHAT, "{" + M + R"(,"audio":{"voice":"x"}})", 400, "audio", U},
      {RTR_CHAT, "{" + M + R"(,"prediction":{"type":"content","content":"x"}})", 400, "prediction", U},
      {RTR_CHAT, "{" + M + R"(,"reasoning_effort":"low"})", 400, "reasoning_effort", U},
      {RTR_CHAT, "{" + M + R"(,"web_search_options":{}})", 400, "web_search_options", U},
      {RTR_CHAT, "{" + M + R"(,"echo":false})", 400, "echo", U},   // a completions field
      {RTR_COMPLETION, R"({"prompt":"x","messages":[]})", 400, "messages", U},
      {RTR_COMPLETION, R"({"prompt":"x","response_format":{"type":"text"}})", 400, "response_format", U},
      {RTR_COMPLETION, R"({"prompt":"x","tools":[]})", 400, "tools", U},
      {RTR_COMPLETION, R"({"prompt":"x","store":false})", 400, "store", U},
      {RTR_TOKENIZE, R"({"prompt":"x","return_token_strs":true})", 400, "return_token_strs", U},
      {RTR_DETOKENIZE, R"({"tokens":[1],"prompt":"x"})", 400, "prompt", U},
      // response_format: text, json_object and json_schema are honoured; a schema outside the supported subset, or
      // a field of response_format this server does not know, is refused naming response_format
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
                           R"({"type":"object","properties":{"n":{"type":"number","multipleOf":0.5}}}}}})", 400,
       "response_format", U},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
                           R"({"type":"string","pattern":"(a)\\1"}}}})", 400, "response_format", U},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
                           R"({"type":"strnig"}}}})", 400, "response_format", I},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
                           R"({"$ref":"#/$defs/none"}}}})", 400, "response_format", I},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{}}}})", 400,
       "response_format", ""},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}})",
       400, "response_format", ""},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":1}}})", 400,
       "response_format", ""},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":5}}})", 400,
       "response_format", ""},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema"}})", 400, "response_format", ""},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","x":1}}})", 400,
       "response_format", U},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_object","schema":{}}})", 400, "response_format", U},
      {RTR_CHAT, "{" + M + R"(,"response_format":{"type":"bogus"}})", 400, "response_format", I},
      {RTR_CHAT, "{" + M + R"(,"response_format":{}})", 400, "response_format", I},
      {RTR_CHAT, "{" + M + R"(,"response_format":"json"})", 400, "response_format", ""},
      // tools (tests/router/test_tools.cc has the accepted shapes): each bad one is a 400 naming the field
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"sometimes"})",
       400, "tool_choice", I},
      {RTR_CHAT, "{" + M + R"(,"tool_choice":"required"})", 400, "tool_choice", ""}, // needs tools
      {RTR_CHAT, "{" + M + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})", 400, "tool_choice", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f"}}],)"
                           R"("tool_choice":{"type":"function","function":{"name":"g"}}})", 400, "tool_choice", I},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f"}}],)"
                           R"("tool_choice":{"type":"function"}})", 400, "tool_choice", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f"}}],)"
                           R"("tool_choice":{"type":"function","function":{"name":"f","x":1}}})", 400, "tool_choice", U},
      {RTR_CHAT, "{" + M + R"(,"tool_choice":"sometimes"})", 400, "tool_choice", I},
      {RTR_CHAT, "{" + M + R"(,"tool_choice":5})", 400, "tool_choice", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":{"a":1}})", 400, "tools", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[5]})", 400, "tools[0]", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"function":{"name":"f"}}]})", 400, "tools[0].type", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"retrieval","function":{"name":"f"}}]})", 400, "tools[0].type", I},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function"}]})", 400, "tools[0].function", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f"},"x":1}]})", 400, "tools[0].x", U},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"a b"}}]})", 400,
       "tools[0].function.name", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{}}]})", 400, "tools[0].function.name", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f"}},)"
                           R"({"type":"function","function":{"name":"f"}}]})", 400, "tools[1].function.name", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f","description":3}}]})", 400,
       "tools[0].function.description", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f","strict":"yes"}}]})", 400,
       "tools[0].function.strict", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f","examples":[]}}]})", 400,
       "tools[0].function.examples", U},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]})", 400,
       "tools[0].function.parameters", ""},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)"
                           R"({"type":"object","properties":{"n":{"type":"number","multipleOf":0.5}}}}}]})", 400,
       "tools[0].function.parameters", U},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"strnig"}}}]})",
       400, "tools[0].function.parameters", I},
      {RTR_CHAT, "{" + M + R"(,"tools":[{"type":"function","function":{"name":"f"}}],)"
                           R"("response_format":{"type":"json_object"}})", 400, "response_format", U},
      {RTR_CHAT, "{" + M + R"(,"functions":[{"name":"f","parameters":{}}]})", 400, "functions", U},
      {RTR_CHAT, "{" + M + R"(,"function_call":{"name":"f"}})", 400, "function_call", U},
      {RTR_CHAT, R"({"messages":[{"role":"tool","content":"42"}]})", 400, "messages[0].tool_call_id", ""},
      {RTR_CHAT, R"({"messages":[{"role":"tool","tool_call_id":7,"content":"42"}]})", 400, "messages[0].tool_call_id",
       ""},
      {RTR_CHAT, R"({"messages":[{"role":"function","name":"f","content":"42"}]})", 400, "messages[0].role", U},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":"q","tool_calls":[]}]})", 400, "messages[0].tool_calls",
       ""},
      {RTR_CHAT, R"({"messages":[{"role":"assistant","tool_calls":{}}]})", 400, "messages[0].tool_calls", ""},
      {RTR_CHAT, R"({"messages":[{"role":"assistant","tool_calls":[{"type":"function",)"
                 R"("function":{"name":"f","arguments":"{}"}}]}]})", 400, "messages[0].tool_calls[0]", ""},
      {RTR_CHAT, R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"x",)"
                 R"("function":{"name":"f","arguments":"{}"}}]}]})", 400, "messages[0].tool_calls[0]", I},
      {RTR_CHAT, R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function",)"
                 R"("function":{"name":"f","arguments":{}}}]}]})", 400, "messages[0].tool_calls[0]", ""},
      {RTR_CHAT, R"({"messages":[{"role":"assistant","content":"a","function_call":{"name":"f","arguments":"{}"}}]})",
       400, "messages[0].function_call", U},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":"a","tool_call_id":"c1"}]})", 400,
       "messages[0].tool_call_id", ""},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":"a","audio":{"id":"x"}}]})", 400, "messages[0].audio", U},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":"a","name":5}]})", 400, "messages[0].name", ""},
      // no-op fields: only their neutral values, of the right type
      {RTR_CHAT, "{" + M + R"(,"store":true})", 400, "store", U},
      {RTR_CHAT, "{" + M + R"(,"store":"no"})", 400, "store", ""},
      {RTR_CHAT, "{" + M + R"(,"metadata":{"k":1}})", 400, "metadata", ""},
      {RTR_CHAT, "{" + M + R"(,"metadata":"k"})", 400, "metadata", ""},
      {RTR_CHAT, "{" + M + R"(,"service_tier":"priority"})", 400, "service_tier", I},
      {RTR_CHAT, "{" + M + R"(,"service_tier":1})", 400, "service_tier", ""},
      {RTR_CHAT, "{" + M + R"(,"parallel_tool_calls":"yes"})", 400, "parallel_tool_calls", ""},
      {RTR_CHAT, "{" + M + R"(,"modalities":["text","audio"]})", 400, "modalities", U},
      {RTR_CHAT, "{" + M + R"(,"prompt_cache_key":7})", 400, "prompt_cache_key", ""},
      {RTR_CHAT, "{" + M + R"(,"safety_identifier":[]})", 400, "safety_identifier", ""},
      {RTR_CHAT, "{" + M + R"(,"stream":true,"stream_options":{"include_usage":true,"chunk_size":3}})", 400,
       "stream_options.chunk_size", U},
      {RTR_CHAT, "{" + M + R"(,"stream":true,"stream_options":{"include_obfuscation":"x"}})", 400,
       "stream_options.include_obfuscation", ""},
  };
  v.insert(v.end(), refused.begin(), refused.end());
  return v;
}

TEST(Validate, HostileBodies) {
  auto v = bad_bodies();
  ASSERT_GE(v.size(), 30u);
  for (size_t i = 0; i < v.size(); i++) {
    const Bad &b = v[i];
    Parsed p(b.kind, b.body);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + b.body.substr(0, 120));
    ASSERT_EQ(p.rc, -1);
    EXPECT_EQ(p.e.status, b.status);
    EXPECT_STREQ(p.e.param, b.param);
    EXPECT_STREQ(p.e.code, b.code);
    EXPECT_STREQ(p.e.type, b.status == 404 ? "not_found_error" : "invalid_request_error");
    EXPECT_GT(strlen(p.e.message), 5u);
    // nothing is left allocated on error
    EXPECT_EQ(p.r.msgs, nullptr);
    EXPECT_EQ(p.r.prompt, nullptr);
    EXPECT_EQ(p.r.stop, nullptr);
    EXPECT_EQ(p.r.bias, nullptr);
    char *j = rtr_error_json(&p.e);
    ASSERT_NE(j, nullptr);
    cJSON *o = cJSON_Parse(j);
    ASSERT_NE(o, nullptr) << j;
    cJSON *err = cJSON_GetObjectItem(o, "error");
    ASSERT_TRUE(cJSON_IsObject(err)) << j;
    EXPECT_TRUE(cJSON_IsString(cJSON_GetObjectItem(err, "message")));
    EXPECT_TRUE(cJSON_IsString(cJSON_GetObjectItem(err, "type")));
    EXPECT_EQ(cJSON_IsNull(cJSON_GetObjectItem(err, "param")), b.param[0] == 0) << j;
    EXPECT_EQ(cJSON_IsNull(cJSON_GetObjectItem(err, "code")), b.code[0] == 0) << j;
    cJSON_Delete(o);
    free(j);
  }
}

// response_format json_object / json_schema: structured outputs (the schema compiled to check it, kept as text).
TEST(Validate, ResponseFormatStructured) {
  Parsed text(RTR_CHAT, "{" + M + R"(,"response_format":{"type":"text"}})");
  ASSERT_EQ(text.rc, 0) << text.e.message;
  EXPECT_EQ(text.r.response_format, RTR_FORMAT_TEXT);
  Parsed obj(RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_object"}})");
  ASSERT_EQ(obj.rc, 0) << obj.e.message;
  EXPECT_EQ(obj.r.response_format, RTR_FORMAT_JSON_OBJECT);
  EXPECT_EQ(obj.r.json_schema, nullptr);
  Parsed js(RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"person_1",
    "description":"d","strict":true,"schema":{"type":"object","properties":{"a":{"type":"string","format":"date"}},
    "required":["a"],"additionalProperties":false}}}})");
  ASSERT_EQ(js.rc, 0) << js.e.message;
  EXPECT_EQ(js.r.response_format, RTR_FORMAT_JSON_SCHEMA);
  ASSERT_NE(js.r.json_schema, nullptr);
  EXPECT_STREQ(js.r.json_schema, R"({"type":"object","properties":{"a":{"type":"string","format":"date"}},)"
                                 R"("required":["a"],"additionalProperties":false})");
  Parsed noschema(RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})");
  ASSERT_EQ(noschema.rc, 0) << noschema.e.message;
  EXPECT_EQ(noschema.r.response_format, RTR_FORMAT_JSON_OBJECT); // no schema: any JSON object
  Parsed bad(RTR_CHAT, "{" + M + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
                                 R"({"type":"object","properties":{"n":{"type":"number","multipleOf":0.5}}}}}})");
  ASSERT_NE(bad.rc, 0);
  EXPECT_STREQ(bad.e.param, "response_format");
  EXPECT_NE(strstr(bad.e.message, "'multipleOf'"), nullptr) << bad.e.message;
  EXPECT_NE(strstr(bad.e.message, "#/properties/n"), nullptr) << bad.e.message;
}

// The documented no-ops (docs/openai.md) are accepted with their neutral values and change nothing.
// "speculative": false opts a request out of speculative decoding (passed to the worker, never ignored); absent or
// true, it may draft; another value is refused naming the field. /v1/responses passes it through the same way.
TEST(Validate, SpeculativeOptOut) {
  Parsed dflt(RTR_CHAT, "{" + M + "}");
  ASSERT_EQ(dflt.rc, 0) << dflt.e.message;
  EXPECT_EQ(dflt.r.no_spec, 0);
  Parsed off(RTR_COMPLETION, R"({"prompt":"x","speculative":false})");
  ASSERT_EQ(off.rc, 0) << off.e.message;
  EXPECT_EQ(off.r.no_spec, 1);
  Parsed on(RTR_CHAT, "{" + M + R"(,"speculative":true})");
  ASSERT_EQ(on.rc, 0) << on.e.message;
  EXPECT_EQ(on.r.no_spec, 0);
  Parsed bad(RTR_CHAT, "{" + M + R"(,"speculative":"off"})");
  ASSERT_NE(bad.rc, 0);
  EXPECT_STREQ(bad.e.param, "speculative");
  rtr_request r{};
  rtr_error e{};
  rtr_limits l = limits();
  const std::string body = R"({"input":"hi","speculative":false})";
  ASSERT_EQ(rtr_request_parse_responses(body.data(), body.size(), &l, &r, &e), 0) << e.message;
  EXPECT_EQ(r.no_spec, 1);
  rtr_request_free(&r);
}

TEST(Validate, NoOpFieldsAccepted) {
  Parsed base(RTR_CHAT, "{" + M + "}");
  ASSERT_EQ(base.rc, 0) << base.e.message;
  const std::vector<std::string> ok = {
      R"("user":"u-1")",
      R"("store":false)",
      R"("metadata":{"team":"a","run":"7"})",
      R"("service_tier":"auto")",
      R"("service_tier":"default")",
      R"("parallel_tool_calls":true)",
      R"("prompt_cache_key":"k")",
      R"("safety_identifier":"s")",
      R"("modalities":["text"])",
      R"("response_format":{"type":"text"})",
      R"("response_format":null)",
      R"("tool_choice":"none")",
      R"("tool_choice":"auto")",
      R"("tools":[],"tool_choice":"auto")",
      R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none")",
      R"("functions":[{"name":"f"}],"function_call":"none")",
      R"("function_call":"auto")",
      R"("stream":true,"stream_options":{"include_usage":false,"include_obfuscation":true})",
  };
  for (const auto &f : ok) {
    Parsed p(RTR_CHAT, "{" + M + "," + f + "}");
    SCOPED_TRACE(f);
    ASSERT_EQ(p.rc, 0) << p.e.message;
    EXPECT_EQ(p.r.n_msgs, 1);
    EXPECT_EQ(p.r.temperature, base.r.temperature);
    EXPECT_EQ(p.r.n, 1);
  }
  // message-level: name is a no-op; tool fields that are null or empty are "not given"
  Parsed m(RTR_CHAT, R"({"messages":[{"role":"user","content":"q","name":"bob"},
    {"role":"assistant","content":"a","tool_calls":[],"function_call":null,"refusal":null}]})");
  ASSERT_EQ(m.rc, 0) << m.e.message;
  EXPECT_EQ(m.r.n_msgs, 2);
  EXPECT_STREQ(m.r.msgs[0].content, "q");
  Parsed c(RTR_COMPLETION, R"({"prompt":"x","user":"u","echo":false,"suffix":""})");
  ASSERT_EQ(c.rc, 0) << c.e.message;
}

// Server-side sampling defaults: the request's own value wins, then rtr_limits.defaults; NULL is neutral.
TEST(Validate, SamplingDefaultsApplied) {
  rtr_sampling d{0.7, 33, 0.9, 0.02, 1.1};
  rtr_limits l = limits();
  l.defaults = &d;
  auto parse = [&](const std::string &body, rtr_request *r) {
    rtr_error e{};
    return rtr_request_parse(RTR_CHAT, body.data(), body.size(), &l, r, &e);
  };
  rtr_request r{};
  ASSERT_EQ(parse("{" + M + "}", &r), 0);
  EXPECT_EQ(r.temperature, 0.7);
  EXPECT_EQ(r.top_k, 33);
  EXPECT_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.min_p, 0.02);
  EXPECT_EQ(r.repetition_penalty, 1.1);
  EXPECT_EQ(r.presence_penalty, 0.0);
  rtr_request_free(&r);
  // explicit values win, temperature 0 (greedy) and top_k 0 (off) included
  ASSERT_EQ(parse("{" + M + R"(,"temperature":0,"top_k":0,"top_p":1,"min_p":0,"repetition_penalty":1})", &r), 0);
  EXPECT_EQ(r.temperature, 0.0);
  EXPECT_EQ(r.top_k, -1);
  EXPECT_EQ(r.top_p, 1.0);
  EXPECT_EQ(r.min_p, 0.0);
  EXPECT_EQ(r.repetition_penalty, 1.0);
  rtr_request_free(&r);
  // one explicit field leaves the others at their defaults; null means "not given"
  ASSERT_EQ(parse("{" + M + R"(,"temperature":1.5,"top_p":null})", &r), 0);
  EXPECT_EQ(r.temperature, 1.5);
  EXPECT_EQ(r.top_k, 33);
  EXPECT_EQ(r.top_p, 0.9);
  rtr_request_free(&r);
  // a top_k of 0 in the defaults is off
  d.top_k = 0;
  ASSERT_EQ(parse("{" + M + "}", &r), 0);
  EXPECT_EQ(r.top_k, -1);
  rtr_request_free(&r);
}

// A GGUF in memory holding only the given metadata (no tensors).
struct MemGguf {
  std::string bytes;
  mdl_gguf *g = nullptr;
  int n = 0;
  std::string kvs;
  void str(const std::string &s) {
    uint64_t n8 = s.size();
    kvs.append((const char *)&n8, 8);
    kvs += s;
  }
  void f32(const std::string &k, float v) {
    str(k);
    uint32_t t = 6;
    kvs.append((const char *)&t, 4);
    kvs.append((const char *)&v, 4);
    n++;
  }
  void u32(const std::string &k, uint32_t v) {
    str(k);
    uint32_t t = 4;
    kvs.append((const char *)&t, 4);
    kvs.append((const char *)&v, 4);
    n++;
  }
  void s(const std::string &k, const std::string &v) {
    str(k);
    uint32_t t = 8;
    kvs.append((const char *)&t, 4);
    str(v);
    n++;
  }
  const mdl_gguf *open() {
    uint32_t ver = 3;
    uint64_t nt = 0, nkv = (uint64_t)n;
    bytes = "GGUF";
    bytes.append((const char *)&ver, 4);
    bytes.append((const char *)&nt, 8);
    bytes.append((const char *)&nkv, 8);
    bytes += kvs;
    char err[256];
    EXPECT_EQ(mdl_gguf_from_memory(bytes.data(), bytes.size(), &g, err, sizeof err), 0) << err;
    return g;
  }
  ~MemGguf() { mdl_gguf_close(g); }
};

TEST(Validate, SamplingDefaultsResolve) {
  char desc[256];
  rtr_sampling d{};
  // nothing configured, no GGUF: llama-server's defaults
  rtr_sampling_resolve(nullptr, nullptr, &d, desc, sizeof desc);
  EXPECT_EQ(d.temperature, 0.8);
  EXPECT_EQ(d.top_k, 40);
  EXPECT_EQ(d.top_p, 0.95);
  EXPECT_EQ(d.min_p, 0.05);
  EXPECT_EQ(d.repetition_penalty, 1.0);
  EXPECT_NE(std::string(desc).find("temperature 0.8 (shipped)"), std::string::npos) << desc;
  // the GGUF's general.sampling.* fill what the config leaves out; out-of-range or mistyped keys are skipped
  MemGguf mg;
  mg.f32("general.sampling.temp", 0.6f);
  mg.u32("general.sampling.top_k", 20);
  mg.f32("general.sampling.top_p", 0.95f);
  mg.f32("general.sampling.min_p", 7.0f);            // out of range: skipped
  mg.s("general.sampling.penalty_repeat", "1.1");    // not a number: skipped
  const mdl_gguf *g = mg.open();
  ASSERT_NE(g, nullptr);
  rtr_sampling_resolve(nullptr, g, &d, desc, sizeof desc);
  EXPECT_EQ(d.temperature, 0.6); // the float's 7 digits, not 0.60000002384
  EXPECT_EQ(d.top_k, 20);
  EXPECT_EQ(d.top_p, 0.95);
  EXPECT_EQ(d.min_p, 0.05);
  EXPECT_EQ(d.repetition_penalty, 1.0);
  EXPECT_NE(std::string(desc).find("top_k 20 (gguf)"), std::string::npos) << desc;
  EXPECT_NE(std::string(desc).find("min_p 0.05 (shipped)"), std::string::npos) << desc;
  // the config wins over the GGUF, field by field; top_k 0 or -1 in the config is off
  cfg_sampling cfg{};
  cfg.has_temperature = 1;
  cfg.temperature = 0;
  cfg.has_top_k = 1;
  cfg.top_k = 0;
  cfg.has_repetition_penalty = 1;
  cfg.repetition_penalty = 1.3;
  rtr_sampling_resolve(&cfg, g, &d, desc, sizeof desc);
  EXPECT_EQ(d.temperature, 0.0);
  EXPECT_EQ(d.top_k, -1);
  EXPECT_EQ(d.top_p, 0.95);
  EXPECT_EQ(d.min_p, 0.05);
  EXPECT_EQ(d.repetition_penalty, 1.3);
  EXPECT_NE(std::string(desc).find("temperature 0 (config)"), std::string::npos) << desc;
  EXPECT_NE(std::string(desc).find("top_p 0.95 (gguf)"), std::string::npos) << desc;
  rtr_sampling_resolve(&cfg, nullptr, &d, nullptr, 0); // desc is optional
  EXPECT_EQ(d.top_p, 0.95);
}

TEST(Validate, ContextLength) {
  rtr_error e{};
  EXPECT_EQ(rtr_check_context(RTR_CHAT, 100, 10, 2048, &e), 0);
  EXPECT_EQ(rtr_check_context(RTR_CHAT, 100, -1, 2048, &e), 0);
  EXPECT_EQ(rtr_check_context(RTR_CHAT, 2038, 10, 2048, &e), 0);
  ASSERT_EQ(rtr_check_context(RTR_CHAT, 2048, -1, 2048, &e), -1);
  EXPECT_EQ(e.status, 400);
  EXPECT_STREQ(e.param, "messages");
  ASSERT_EQ(rtr_check_context(RTR_COMPLETION, 2048, -1, 2048, &e), -1); // the field a completion's prompt is in
  EXPECT_STREQ(e.param, "prompt");
  EXPECT_STREQ(e.code, "context_length_exceeded");
  EXPECT_NE(std::string(e.message).find("2048"), std::string::npos);
  ASSERT_EQ(rtr_check_context(RTR_CHAT, 2040, 10, 2048, &e), -1);
  EXPECT_STREQ(e.code, "context_length_exceeded");
  EXPECT_NE(std::string(e.message).find("2050"), std::string::npos) << e.message;
  EXPECT_NE(std::string(e.message).find("2040"), std::string::npos) << e.message;
  ASSERT_EQ(rtr_check_context(RTR_CHAT, 0, -1, 2048, &e), -1);
  EXPECT_EQ(e.status, 400);
}

TEST(Validate, Utf8) {
  EXPECT_TRUE(rtr_utf8_valid("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10));
  EXPECT_FALSE(rtr_utf8_valid("\xc3", 1));
  EXPECT_FALSE(rtr_utf8_valid("\xf4\x90\x80\x80", 4)); // past U+10FFFF
  EXPECT_FALSE(rtr_utf8_valid("\xe0\x80\x80", 3));     // overlong
  EXPECT_FALSE(rtr_utf8_valid("\x80", 1));
}

} // namespace

namespace {

// A NUL inside any string, escaped (\u0000) or raw, is refused naming the field (it would cut the text short).
TEST(Validate, NulInStrings) {
  struct Case {
    rtr_kind kind;
    std::string body, param;
  };
  const std::string raw_nul("a\0b", 3);
  const std::vector<Case> cases = {
      {RTR_COMPLETION, R"({"prompt":"abc\u0000def"})", "prompt"},
      {RTR_COMPLETION, R"({"prompt":["abc\u0000"]})", "prompt[0]"},
      {RTR_COMPLETION, "{\"prompt\":\"" + raw_nul + "\"}", "prompt"},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":"hi"},{"role":"user","content":"x\u0000"}]})",
       "messages[1].content"},
      {RTR_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"" + raw_nul + "\"}]}", "messages[0].content"},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":[{"type":"text","text":"a\u0000"}]}]})",
       "messages[0].content[0].text"},
      {RTR_CHAT, R"({"messages":[{"role":"user\u0000x","content":"hi"}]})", "messages[0].role"},
      {RTR_CHAT, R"({"messages":[{"role":"user","content":"hi"}],"stop":["ok","s\u0000"]})", "stop[1]"},
      {RTR_COMPLETION, R"({"prompt":"hi","stop":"\u0000"})", "stop"},
      {RTR_COMPLETION, R"({"model":"m\u0000x","prompt":"hi"})", "model"},
      {RTR_COMPLETION, R"({"prompt":"hi","user":"u\u0000"})", "user"},
      {RTR_TOKENIZE, R"({"prompt":"a\u0000"})", "prompt"},
      {RTR_TOKENIZE, R"({"messages":[{"role":"user","content":"\u0000"}]})", "messages[0].content"},
      {RTR_DETOKENIZE, R"({"tokens":[1],"x\u0000":1})", "x\\u0000"},
  };
  for (const auto &c : cases) {
    Parsed p(c.kind, c.body);
    EXPECT_EQ(p.rc, -1) << c.body;
    EXPECT_EQ(p.e.status, 400) << c.body;
    EXPECT_EQ(std::string(p.e.param), c.param) << c.body;
    EXPECT_NE(std::string(p.e.message).find("NUL"), std::string::npos) << p.e.message;
  }
  // an escaped backslash before "u0000" is text, and other escapes stay accepted
  Parsed ok(RTR_COMPLETION, R"({"prompt":"a\\u0000 \u0001 \n \"\u0000\" no"})");
  EXPECT_EQ(ok.rc, -1); // the last one is a real \u0000 inside the same string
  EXPECT_EQ(std::string(ok.e.param), "prompt");
  Parsed ok2(RTR_COMPLETION, R"({"prompt":"a\\u0000 \u0001 \u00e9 \"q\" end","stop":["\\u0000"]})");
  ASSERT_EQ(ok2.rc, 0) << ok2.e.message;
  ASSERT_EQ(ok2.r.n_prompts, 1);
  EXPECT_STREQ(ok2.r.prompts[0].text, "a\\u0000 \x01 \xc3\xa9 \"q\" end");
  EXPECT_STREQ(ok2.r.stop[0], "\\u0000");
}

} // namespace
