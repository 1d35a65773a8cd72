// tests/router/test_validate_embed.cc: /v1/embeddings request validation: input's four shapes, encoding_format,
// dimensions only as the model's width (576 here), and a 400 naming the field for everything else.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

extern "C" {
#include "router/openai.h"
}

namespace {

// An embeddings body parsed under a 576-wide model's limits; r freed with this.
struct Embed {
  rtr_request r{};
  rtr_error e{};
  int rc = 0;
  explicit Embed(const std::string &body) {
    rtr_limits lim{};
    lim.model_name = "m", lim.n_ctx = 2048, lim.max_n = 8, lim.max_stop = 4, lim.n_vocab = 1000, lim.n_embd = 576;
    rc = rtr_request_parse(RTR_EMBEDDING, body.data(), body.size(), &lim, &r, &e);
  }
  ~Embed() { rtr_request_free(&r); }
};

TEST(EmbedParse, InputShapesAndFields) {
  {
    Embed p(R"({"input":"hello","model":"m","user":"u1"})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 1);
    EXPECT_STREQ(p.r.prompts[0].text, "hello");
    EXPECT_EQ(p.r.embd_base64, 0);
    EXPECT_EQ(p.r.stream, 0);
  }
  {
    Embed p(R"({"input":["a","bc"],"encoding_format":"base64","dimensions":576})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 2);
    EXPECT_STREQ(p.r.prompts[1].text, "bc");
    EXPECT_EQ(p.r.embd_base64, 1);
  }
  {
    Embed p(R"({"input":[1,2,3],"encoding_format":"float"})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 1);
    EXPECT_EQ(p.r.prompts[0].n_ids, 3);
  }
  {
    Embed p(R"({"input":[[1,2],[3]]})");
    ASSERT_EQ(p.rc, 0) << p.e.message;
    ASSERT_EQ(p.r.n_prompts, 2);
    EXPECT_EQ(p.r.prompts[1].ids[0], 3);
  }
}

TEST(EmbedParse, RefusalsNameTheField) {
  struct {
    const char *body, *param, *code, *needle;
  } bad[] = {
      {R"({})", "input", "", "'input' is required"},
      {R"({"input":5})", "input", "", "must be a string"},
      {R"({"input":[]})", "input", "", "must not be empty"},
      {R"({"input":""})", "input", "", "empty string"},
      {R"({"input":["a",""]})", "input[1]", "", "empty string"},
      {R"({"input":[[]]})", "input[0]", "", "must not be empty"},
      {R"({"input":[1.5]})", "input", "", "integer"},
      {R"({"input":[[1],[5000]]})", "input[1]", "", "outside the vocabulary"},
      {R"({"input":["a",{"x":1}]})", "input[1]", "", "must be a string"},
      {R"({"input":"a","encoding_format":"int8"})", "encoding_format", "invalid_value", "base64"},
      {R"({"input":"a","encoding_format":1})", "encoding_format", "", "base64"},
      {R"({"input":"a","dimensions":256})", "dimensions", "unsupported_parameter", "576 dimensions"},
      {R"({"input":"a","dimensions":0})", "dimensions", "", ""},
      {R"({"input":"a","dimensions":"576"})", "dimensions", "", ""},
      {R"({"input":"a","user":5})", "user", "", ""},
      {R"({"input":"a","stream":true})", "stream", "unsupported_parameter", "Unrecognized"},
      {R"({"input":"a","prompt":"b"})", "prompt", "unsupported_parameter", "Unrecognized"},
  };
  for (const auto &b : bad) {
    Embed p(b.body);
    ASSERT_NE(p.rc, 0) << b.body;
    EXPECT_EQ(p.e.status, 400) << b.body;
    EXPECT_STREQ(p.e.param, b.param) << b.body << ": " << p.e.message;
    if (b.code[0]) {
      EXPECT_STREQ(p.e.code, b.code) << b.body;
    }
    EXPECT_NE(strstr(p.e.message, b.needle), nullptr) << b.body << ": " << p.e.message;
  }
  Embed other(R"({"input":"a","model":"other"})");
  EXPECT_EQ(other.e.status, 404);
  std::string many = R"({"input":[)";
  for (int i = 0; i <= RTR_MAX_INPUTS; i++) many += i ? ",\"x\"" : "\"x\"";
  Embed p(many + "]}");
  ASSERT_NE(p.rc, 0);
  EXPECT_NE(strstr(p.e.message, "at most 2048"), nullptr) << p.e.message;
  // the context check names input (the router runs it once tokenized)
  rtr_error e{};
  EXPECT_NE(rtr_check_context(RTR_EMBEDDING, 2048, -1, 2048, &e), 0);
  EXPECT_STREQ(e.param, "input");
  EXPECT_STREQ(e.code, "context_length_exceeded");
}

} // namespace
