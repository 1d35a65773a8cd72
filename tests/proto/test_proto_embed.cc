// tests/proto/test_proto_embed.cc: an embedding on the wire: generate's "embed" names the pooling, done's "embedding"
// carries the vector exactly, every element a finite number (an absent one reads as none).
#include <gtest/gtest.h>

#include <string>

extern "C" {
#include "proto/request.h"
}

namespace {

// m printed and parsed back, as a peer receives it (m consumed).
cJSON *over_the_wire(cJSON *m) {
  char *t = m ? cJSON_PrintUnformatted(m) : nullptr;
  cJSON_Delete(m);
  cJSON *back = t ? cJSON_Parse(t) : nullptr;
  free(t);
  return back;
}

TEST(ProtoEmbed, GenerateNamesThePooling) {
  char err[128];
  int32_t prompt[2] = {5, 6};
  prt_generate g = {};
  g.id = "e-0";
  g.prompt = prompt;
  g.n_prompt = 2;
  g.max_tokens = 1;
  g.embed = "mean";
  cJSON *j = over_the_wire(prt_generate_encode(&g, err, sizeof err));
  ASSERT_NE(j, nullptr);
  prt_generate m;
  ASSERT_EQ(prt_generate_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_STREQ(m.embed, "mean");
  prt_generate_free(&m);
  cJSON_ReplaceItemInObject(j, "embed", cJSON_CreateNumber(1)); // a string or nothing
  EXPECT_EQ(prt_generate_decode(j, &m, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("embed"), std::string::npos) << err;
  cJSON_Delete(j);
  g.embed = nullptr; // a generation: no field
  j = over_the_wire(prt_generate_encode(&g, err, sizeof err));
  EXPECT_EQ(cJSON_GetObjectItem(j, "embed"), nullptr);
  cJSON_Delete(j);
}

TEST(ProtoEmbed, DoneCarriesTheVector) {
  char err[128];
  const float v[3] = {0.25f, -0.5f, 1e-7f};
  prt_done d = {};
  d.id = "e-0";
  d.prompt_tokens = 2;
  d.kv_bytes = d.kv_ms = d.prefill_ms = -1;
  d.embedding = v;
  d.n_embedding = 3;
  cJSON *j = over_the_wire(prt_done_encode(&d, err, sizeof err));
  ASSERT_NE(j, nullptr);
  prt_done m;
  ASSERT_EQ(prt_done_decode(j, &m, err, sizeof err), 0) << err;
  ASSERT_EQ(m.n_embedding, 3);
  const cJSON *x = m.embedding_json->child;
  for (int i = 0; i < 3; i++, x = x->next) EXPECT_EQ((float)x->valuedouble, v[i]); // exact through the text
  for (const char *bad : {"\"x\"", "[]", "[1, \"a\"]", "[1, null]", "[1e39]"}) { // 1e39: past float32
    cJSON *b = cJSON_Duplicate(j, 1);
    cJSON_ReplaceItemInObject(b, "embedding", cJSON_Parse(bad));
    EXPECT_EQ(prt_done_decode(b, &m, err, sizeof err), -1) << bad;
    EXPECT_NE(std::string(err).find("embedding"), std::string::npos) << err;
    cJSON_Delete(b);
  }
  cJSON_Delete(j);
  d.n_embedding = 0; // a generation's done: none
  j = over_the_wire(prt_done_encode(&d, err, sizeof err));
  ASSERT_EQ(prt_done_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.embedding_json, nullptr);
  EXPECT_EQ(m.n_embedding, 0);
  cJSON_Delete(j);
}

} // namespace
