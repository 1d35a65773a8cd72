// tests/proto/test_proto.cc: every control message survives encode → text → parse → decode; decoders refuse wrong
// types and missing fields; docs/protocol.md's message table names exactly proto's ops.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "proto/events.h"
#include "proto/handoff.h"
#include "proto/hello.h"
#include "proto/prefix.h"
#include "proto/request.h"
#include "proto/stats.h"

namespace {

// encode's message as text, parsed again (what the peer reads).
cJSON *wire(cJSON *m) {
  EXPECT_NE(m, nullptr);
  if (!m) return nullptr;
  char *t = cJSON_PrintUnformatted(m);
  cJSON_Delete(m);
  cJSON *back = cJSON_Parse(t);
  free(t);
  EXPECT_NE(back, nullptr);
  return back;
}

// j with field k replaced by v (owned by the caller: cJSON_Delete).
cJSON *with(const cJSON *j, const char *k, cJSON *v) {
  cJSON *c = cJSON_Duplicate(j, 1);
  cJSON_DeleteItemFromObjectCaseSensitive(c, k);
  if (v) cJSON_AddItemToObject(c, k, v);
  return c;
}

std::string S(const char *s) { return s ? s : "(null)"; }

// Field by field: the struct's tail padding is whatever its last copy left there, so memcmp may differ.
bool same_layout(const prt_kv_layout &a, const prt_kv_layout &b) {
  return a.n_layer == b.n_layer && a.parts == b.parts && a.width == b.width && a.type == b.type &&
         a.block_size == b.block_size && a.n_blocks == b.n_blocks && a.n_groups == b.n_groups && a.base == b.base;
}

// Checks that decode refuses j with field k given a wrong type (a string where a number goes, a number elsewhere),
// and, when required, without it; err must name the field.
template <class T, class D>
void refuses(const cJSON *j, const char *k, bool required, D decode, bool number_field) {
  T m;
  char err[256] = "";
  cJSON *bad = with(j, k, number_field ? cJSON_CreateString("x") : cJSON_CreateNumber(7));
  EXPECT_EQ(decode(bad, &m, err, sizeof err), -1) << k;
  EXPECT_NE(std::string(err).find(k), std::string::npos) << err;
  cJSON_Delete(bad);
  if (required) {
    err[0] = 0;
    cJSON *none = with(j, k, nullptr);
    EXPECT_EQ(decode(none, &m, err, sizeof err), -1) << k;
    EXPECT_NE(std::string(err).find(k), std::string::npos) << err;
    cJSON_Delete(none);
  }
}

TEST(Proto, Challenge) {
  char err[128];
  cJSON *j = wire(prt_challenge_encode(&(const prt_challenge &)prt_challenge{"abcd", "w0"}, err, sizeof err));
  EXPECT_TRUE(prt_is(j, PRT_OP_CHALLENGE));
  prt_challenge m;
  ASSERT_EQ(prt_challenge_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.nonce), "abcd");
  EXPECT_EQ(S(m.name), "w0");
  refuses<prt_challenge>(j, "nonce", true, prt_challenge_decode, false);
  refuses<prt_challenge>(j, "name", false, prt_challenge_decode, false);
  cJSON_Delete(j);
}

TEST(Proto, LinkRefused) {
  char err[128];
  cJSON *j = wire(prt_refused_encode(&(const prt_refused &)prt_refused{"it serves model x", "another_model"}, err,
                                     sizeof err));
  EXPECT_TRUE(prt_is(j, PRT_OP_REFUSED));
  prt_refused m;
  ASSERT_EQ(prt_refused_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.reason), "it serves model x");
  EXPECT_EQ(S(m.code), "another_model");
  refuses<prt_refused>(j, "reason", true, prt_refused_decode, false); // a refusal without its why says nothing
  refuses<prt_refused>(j, "code", false, prt_refused_decode, false);
  cJSON_Delete(j);
}

TEST(Proto, Hello) {
  char err[128];
  prt_hello in = {"router", "r0", "proof", PRT_VERSION, "n0nce", "w0", "127.0.0.1:7001"};
  cJSON *j = wire(prt_hello_encode(&in, err, sizeof err));
  EXPECT_TRUE(prt_is(j, PRT_OP_HELLO));
  prt_hello m;
  ASSERT_EQ(prt_hello_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.role), "router");
  EXPECT_EQ(S(m.name), "r0");
  EXPECT_EQ(S(m.auth), "proof");
  EXPECT_EQ(m.proto, PRT_VERSION);
  EXPECT_EQ(S(m.nonce), "n0nce");
  EXPECT_EQ(S(m.member), "w0");
  EXPECT_EQ(S(m.addr), "127.0.0.1:7001");
  refuses<prt_hello>(j, "member", false, prt_hello_decode, false);
  refuses<prt_hello>(j, "addr", false, prt_hello_decode, false);
  refuses<prt_hello>(j, "auth", false, prt_hello_decode, false);
  refuses<prt_hello>(j, "nonce", false, prt_hello_decode, false);
  refuses<prt_hello>(j, "proto", false, prt_hello_decode, true);
  cJSON *old = with(j, "proto", nullptr); // absent: the hub refuses it, naming its own version
  ASSERT_EQ(prt_hello_decode(old, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.proto, -1);
  EXPECT_EQ(m.auth != nullptr, true);
  cJSON_Delete(old);
  cJSON_Delete(j);
}

TEST(Proto, HelloOk) {
  char err[128];
  prt_hello_ok in = {};
  in.role = "decode";
  in.name = "d0";
  in.has_worker = 1;
  in.n_ctx = 2048;
  in.n_vocab = 49152;
  in.total_blocks = 640;
  in.has_layout = 1;
  in.kv_layout = {30, 1, 576, 1, 16, 640, 6, 0xfedcba9876543210ull}; // a latent cache: one part of 576 values
  in.kvx_md = "bWQ=";
  in.auth = "back";
  cJSON *j = wire(prt_hello_ok_encode(&in, err, sizeof err));
  prt_hello_ok m;
  ASSERT_EQ(prt_hello_ok_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.role), "decode");
  EXPECT_EQ(S(m.name), "d0");
  EXPECT_EQ(m.has_worker, 1);
  EXPECT_EQ(m.n_ctx, 2048);
  EXPECT_EQ(m.n_vocab, 49152);
  EXPECT_EQ(m.total_blocks, 640);
  EXPECT_EQ(m.has_layout, 1);
  EXPECT_TRUE(same_layout(m.kv_layout, in.kv_layout));
  EXPECT_EQ(S(m.kvx_md), "bWQ=");
  EXPECT_EQ(S(m.auth), "back");
  refuses<prt_hello_ok>(j, "auth", false, prt_hello_ok_decode, false);
  refuses<prt_hello_ok>(j, "n_ctx", false, prt_hello_ok_decode, true);
  refuses<prt_hello_ok>(j, "kv_layout", false, prt_hello_ok_decode, false);
  refuses<prt_hello_ok>(j, "kvx_md", false, prt_hello_ok_decode, false);
  cJSON *lay = cJSON_GetObjectItem(j, "kv_layout");
  for (const char *k : {"n_layer", "parts", "width", "type", "block_size", "n_blocks", "base"}) {
    cJSON *c = cJSON_Duplicate(j, 1);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(c, "kv_layout"), k);
    EXPECT_EQ(prt_hello_ok_decode(c, &m, err, sizeof err), -1) << k;
    EXPECT_NE(std::string(err).find(k), std::string::npos) << err;
    cJSON_Delete(c);
  }
  for (const char *k : {"parts", "width"}) { // a layout of no values per position is no layout
    cJSON *c = cJSON_Duplicate(j, 1);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(c, "kv_layout"), k, cJSON_CreateNumber(0));
    EXPECT_EQ(prt_hello_ok_decode(c, &m, err, sizeof err), -1) << k;
    EXPECT_NE(std::string(err).find(k), std::string::npos) << err;
    cJSON_Delete(c);
  }
  (void)lay;
  cJSON *old = cJSON_Duplicate(j, 1); // n_groups absent: one group
  cJSON_DeleteItemFromObject(cJSON_GetObjectItem(old, "kv_layout"), "n_groups");
  ASSERT_EQ(prt_hello_ok_decode(old, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.kv_layout.n_groups, 1);
  cJSON_Delete(old);
  prt_hello_ok r0 = {};
  r0.role = "router";
  r0.name = "r0";
  cJSON *router = wire(prt_hello_ok_encode(&r0, err, sizeof err));
  ASSERT_EQ(prt_hello_ok_decode(router, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.has_worker, 0);
  EXPECT_EQ(m.has_layout, 0);
  cJSON_Delete(router);
  cJSON_Delete(j);
}

TEST(Proto, Error) {
  char err[128];
  prt_error in = {"r-0", "it broke", "worker_failure"};
  cJSON *j = wire(prt_error_encode(&in, err, sizeof err));
  prt_error m;
  ASSERT_EQ(prt_error_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.id), "r-0");
  EXPECT_EQ(S(m.message), "it broke");
  EXPECT_EQ(S(m.code), "worker_failure");
  refuses<prt_error>(j, "id", false, prt_error_decode, false);
  refuses<prt_error>(j, "message", true, prt_error_decode, false);
  refuses<prt_error>(j, "code", false, prt_error_decode, false);
  cJSON_Delete(j);
}

TEST(Proto, Cancel) {
  char err[128];
  cJSON *j = wire(prt_cancel_encode(&(const prt_cancel &)prt_cancel{"r-1"}, err, sizeof err));
  prt_cancel m;
  ASSERT_EQ(prt_cancel_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.id), "r-1");
  refuses<prt_cancel>(j, "id", true, prt_cancel_decode, false);
  cJSON_Delete(j);
}

prt_sampled sampled(int32_t tok) {
  prt_sampled s = {};
  s.token = tok;
  s.logprob = -0.25f;
  s.n_top = 2;
  s.top[0] = {tok, -0.25f};
  s.top[1] = {tok + 1, -3.5f};
  return s;
}

void expect_sampled(const prt_sampled &a, const prt_sampled &b) {
  EXPECT_EQ(a.token, b.token);
  EXPECT_FLOAT_EQ(a.logprob, b.logprob);
  ASSERT_EQ(a.n_top, b.n_top);
  for (int i = 0; i < a.n_top; i++) {
    EXPECT_EQ(a.top[i].token, b.top[i].token);
    EXPECT_FLOAT_EQ(a.top[i].logprob, b.top[i].logprob);
  }
}

TEST(Proto, Token) {
  char err[128];
  int32_t ids[2] = {17, 4};
  prt_sampled lp = sampled(17);
  prt_token in = {"r-0", "h\xc3\xa9", ids, 2, &lp, 1};
  cJSON *j = wire(prt_token_encode(&in, err, sizeof err));
  prt_token m;
  ASSERT_EQ(prt_token_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.id), "r-0");
  EXPECT_EQ(S(m.text), "h\xc3\xa9");
  ASSERT_EQ(m.n_tokens, 2);
  EXPECT_EQ(m.tokens[0], 17);
  EXPECT_EQ(m.tokens[1], 4);
  ASSERT_EQ(m.n_logprobs, 1);
  expect_sampled(m.logprobs[0], lp);
  prt_token_free(&m);
  refuses<prt_token>(j, "id", true, [](const cJSON *x, prt_token *t, char *e, size_t n) {
    int rc = prt_token_decode(x, t, e, n);
    if (!rc) prt_token_free(t);
    return rc;
  }, false);
  for (const char *k : {"text", "tokens", "logprobs"}) {
    cJSON *bad = with(j, k, cJSON_CreateNumber(3));
    EXPECT_EQ(prt_token_decode(bad, &m, err, sizeof err), -1) << k;
    EXPECT_NE(std::string(err).find(k), std::string::npos) << err;
    cJSON_Delete(bad);
  }
  cJSON *bare = with(j, "logprobs", nullptr); // not asked for: absent
  ASSERT_EQ(prt_token_decode(bare, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.n_logprobs, -1);
  prt_token_free(&m);
  cJSON_Delete(bare);
  cJSON_Delete(j);
}

// Speculative decoding's counts ride on done, sent only when the choice drafted; accepted never exceeds drafted.
TEST(Proto, DoneWithDrafts) {
  char err[128];
  prt_done in = {"r-0", "stop", 12, 30, 0, -1, -1, -1, 7, 25, 19, 0, nullptr, nullptr, 0};
  cJSON *j = wire(prt_done_encode(&in, err, sizeof err));
  prt_done m;
  ASSERT_EQ(prt_done_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.spec_drafts, 7);
  EXPECT_EQ(m.spec_drafted, 25);
  EXPECT_EQ(m.spec_accepted, 19);
  cJSON_ReplaceItemInObject(j, "spec_accepted", cJSON_CreateNumber(26));
  EXPECT_NE(prt_done_decode(j, &m, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("spec_accepted"), std::string::npos) << err;
  cJSON_Delete(j);
}

TEST(Proto, Done) {
  char err[128];
  prt_done in = {"r-0", "length", 12, 5, 16, 4096, 3.5, -1, 0, 0, 0, 0, nullptr, nullptr, 0};
  cJSON *j = wire(prt_done_encode(&in, err, sizeof err));
  prt_done m;
  ASSERT_EQ(prt_done_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.id), "r-0");
  EXPECT_EQ(S(m.finish_reason), "length");
  EXPECT_EQ(m.prompt_tokens, 12);
  EXPECT_EQ(m.completion_tokens, 5);
  EXPECT_EQ(m.cached_tokens, 16);
  EXPECT_EQ(m.kv_bytes, 4096);
  EXPECT_EQ(m.kv_ms, 3.5);
  EXPECT_EQ(m.spec_drafts, 0); // absent: no drafts
  EXPECT_EQ(cJSON_GetObjectItem(j, "spec_drafts"), nullptr);
  refuses<prt_done>(j, "id", true, prt_done_decode, false);
  refuses<prt_done>(j, "finish_reason", false, prt_done_decode, false);
  for (const char *k : {"prompt_tokens", "completion_tokens", "cached_tokens", "kv_bytes", "kv_ms", "prefill_ms"})
    refuses<prt_done>(j, k, false, prt_done_decode, true);
  cJSON_Delete(j);
}

// prefill_ms (the prefill phase) travels when >= 0, reads -1 when absent, and refuses a negative value.
TEST(Proto, DonePrefillMs) {
  char err[128];
  prt_done in = {"r-0", "stop", 12, 5, 0, 4096, 30.5, 21.25, 0, 0, 0, 0, nullptr, nullptr, 0};
  cJSON *j = wire(prt_done_encode(&in, err, sizeof err));
  prt_done m;
  ASSERT_EQ(prt_done_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.prefill_ms, 21.25);
  cJSON *none = with(j, "prefill_ms", nullptr);
  ASSERT_EQ(prt_done_decode(none, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.prefill_ms, -1);
  cJSON *neg = with(j, "prefill_ms", cJSON_CreateNumber(-2));
  EXPECT_EQ(prt_done_decode(neg, &m, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("prefill_ms"), std::string::npos) << err;
  in.prefill_ms = -1;
  cJSON *absent = wire(prt_done_encode(&in, err, sizeof err));
  EXPECT_EQ(cJSON_GetObjectItem(absent, "prefill_ms"), nullptr);
  for (cJSON *x : {j, none, neg, absent}) cJSON_Delete(x);
}

int table_decode(const cJSON *x, prt_kv_table *t, char *e, size_t n) {
  int rc = prt_kv_table_decode(x, t, e, n);
  if (!rc) prt_kv_table_free(t);
  return rc;
}

TEST(Proto, KvTable) {
  char err[128];
  int32_t blocks[2] = {3, 4}, pages[4] = {3, -1, 4, 9};
  prt_kv_table in = {"r-0", blocks, 2, 1, pages, 4};
  cJSON *j = wire(prt_kv_table_encode(&in, err, sizeof err));
  prt_kv_table m;
  ASSERT_EQ(prt_kv_table_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.id), "r-0");
  ASSERT_EQ(m.n_blocks, 2);
  EXPECT_EQ(m.blocks[1], 4);
  ASSERT_EQ(m.n_pages, 4);
  EXPECT_EQ(m.pages[1], -1);
  EXPECT_EQ(m.skip_blocks, 1);
  prt_kv_table_free(&m);
  refuses<prt_kv_table>(j, "id", true, table_decode, false);
  refuses<prt_kv_table>(j, "blocks", true, table_decode, false);
  refuses<prt_kv_table>(j, "pages", false, table_decode, false);
  refuses<prt_kv_table>(j, "skip_blocks", false, table_decode, true);
  cJSON_Delete(j);
}

TEST(Proto, KvFirst) {
  char err[128];
  prt_kv_first in = {"r-0", sampled(42), 32, 17.5, 0};
  cJSON *j = wire(prt_kv_first_encode(&in, err, sizeof err));
  prt_kv_first m;
  ASSERT_EQ(prt_kv_first_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.id), "r-0");
  expect_sampled(m.first, in.first);
  EXPECT_EQ(m.cached_tokens, 32);
  EXPECT_EQ(m.prefill_ms, 17.5);
  refuses<prt_kv_first>(j, "prefill_ms", false, prt_kv_first_decode, true);
  cJSON *none = with(j, "prefill_ms", nullptr);
  ASSERT_EQ(prt_kv_first_decode(none, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.prefill_ms, -1); // absent: unknown
  cJSON_Delete(none);
  refuses<prt_kv_first>(j, "id", true, prt_kv_first_decode, false);
  refuses<prt_kv_first>(j, "token", true, prt_kv_first_decode, true);
  refuses<prt_kv_first>(j, "top", false, prt_kv_first_decode, false);
  refuses<prt_kv_first>(j, "cached_tokens", false, prt_kv_first_decode, true);
  cJSON *inf = with(j, "logprob", cJSON_CreateNull()); // -inf travels as null
  ASSERT_EQ(prt_kv_first_decode(inf, &m, err, sizeof err), 0) << err;
  cJSON_Delete(inf);
  cJSON_Delete(j);
}

TEST(Proto, KvStartedFailFreed) {
  char err[128];
  cJSON *j = wire(prt_kv_started_encode(&(const prt_kv_started &)prt_kv_started{"r-1"}, err, sizeof err));
  prt_kv_started st;
  ASSERT_EQ(prt_kv_started_decode(j, &st, err, sizeof err), 0) << err;
  EXPECT_EQ(S(st.id), "r-1");
  refuses<prt_kv_started>(j, "id", true, prt_kv_started_decode, false);
  cJSON_Delete(j);
  j = wire(prt_kv_freed_encode(&(const prt_kv_freed &)prt_kv_freed{"r-2"}, err, sizeof err));
  prt_kv_freed fr;
  ASSERT_EQ(prt_kv_freed_decode(j, &fr, err, sizeof err), 0) << err;
  EXPECT_EQ(S(fr.id), "r-2");
  refuses<prt_kv_freed>(j, "id", true, prt_kv_freed_decode, false);
  cJSON_Delete(j);
  j = wire(prt_kv_fail_encode(&(const prt_kv_fail &)prt_kv_fail{"r-3", "gave up", nullptr}, err, sizeof err));
  prt_kv_fail fa;
  ASSERT_EQ(prt_kv_fail_decode(j, &fa, err, sizeof err), 0) << err;
  EXPECT_EQ(S(fa.id), "r-3");
  EXPECT_EQ(S(fa.message), "gave up");
  EXPECT_EQ(fa.code, nullptr); // absent when not given
  refuses<prt_kv_fail>(j, "id", true, prt_kv_fail_decode, false);
  refuses<prt_kv_fail>(j, "message", false, prt_kv_fail_decode, false);
  cJSON_Delete(j);
  // a prefill worker's refusal of the prompt carries the request's error code
  j = wire(prt_kv_fail_encode(&(const prt_kv_fail &)prt_kv_fail{"r-4", "too long", "context_length_exceeded"}, err,
                              sizeof err));
  ASSERT_EQ(prt_kv_fail_decode(j, &fa, err, sizeof err), 0) << err;
  EXPECT_EQ(S(fa.code), "context_length_exceeded");
  refuses<prt_kv_fail>(j, "code", false, prt_kv_fail_decode, false);
  cJSON_Delete(j);
}

int gen_decode(const cJSON *x, prt_generate *t, char *e, size_t n) {
  int rc = prt_generate_decode(x, t, e, n);
  if (!rc) prt_generate_free(t);
  return rc;
}

// A one-token generate the grammar tests fill in.
prt_generate grammar_generate(int32_t prompt[1]) {
  prt_generate in = {};
  in.id = "g";
  in.prompt = prompt;
  in.n_prompt = 1;
  in.max_tokens = 8;
  in.sampling = {1, 0, 1, 0, 0, 0, 1, 0, 0, -1, nullptr, 0};
  return in;
}

// A schema's and the tools' numbers cross the wire as the client wrote them (issue 39 item 7): a nested object would
// hold them as doubles (9007199254740993 -> 9007199254740992). An older router's nested object still decodes.
TEST(Proto, GenerateGrammarKeepsNumbersExact) {
  char err[160], schema[] = R"({"minimum":9007199254740993,"const":0.30000000000000004,"enum":[123456789012345678]})";
  char tools[] = R"([{"name":"f","parameters":{"const":9007199254740993}}])";
  int32_t prompt[1] = {5};
  prt_generate in = grammar_generate(prompt);
  in.grammar = {PRT_GRAMMAR_JSON_SCHEMA, schema, nullptr, nullptr, nullptr, nullptr, 0, nullptr};
  cJSON *j = wire(prt_generate_encode(&in, err, sizeof err));
  prt_generate m;
  ASSERT_EQ(prt_generate_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.grammar.schema), schema);
  prt_generate_free(&m);
  cJSON_Delete(j);
  in.grammar = {PRT_GRAMMAR_TOOL_CALLS, nullptr, tools, "<a>", "</a>", nullptr, 0, nullptr};
  j = wire(prt_generate_encode(&in, err, sizeof err));
  ASSERT_EQ(prt_generate_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.grammar.tools), tools);
  prt_generate_free(&m);
  cJSON_Delete(j);
  cJSON *old = cJSON_Parse(R"({"op":"generate","id":"g","prompt":[5],"grammar":{"type":"json_schema","schema":{"type":"object"}}})");
  ASSERT_EQ(prt_generate_decode(old, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.grammar.schema), R"({"type":"object"})");
  prt_generate_free(&m);
  cJSON_Delete(old);
}

// generate's grammar: each type round-trips, and a grammar a worker could not follow is refused at decode.
TEST(Proto, GenerateGrammar) {
  char err[160], tools[] = R"([{"name":"f","parameters":{"type":"object"}}])";
  int32_t prompt[1] = {5};
  prt_generate in = grammar_generate(prompt);
  in.grammar = {PRT_GRAMMAR_TOOL_CALLS, nullptr, tools, "<tool_call>\n", "\n</tool_call>", "\n", 1, nullptr};
  cJSON *j = wire(prt_generate_encode(&in, err, sizeof err));
  prt_generate m;
  ASSERT_EQ(prt_generate_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.grammar.type, PRT_GRAMMAR_TOOL_CALLS);
  EXPECT_EQ(S(m.grammar.tools), tools);
  EXPECT_EQ(S(m.grammar.open), "<tool_call>\n");
  EXPECT_EQ(S(m.grammar.close), "\n</tool_call>");
  EXPECT_EQ(S(m.grammar.sep), "\n");
  EXPECT_EQ(m.grammar.parallel, 1);
  EXPECT_EQ(m.grammar.args_key, nullptr); // "arguments": not on the wire
  EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "grammar"), "args_key"), nullptr);
  prt_generate_free(&m);
  cJSON_Delete(j);
  // Llama 3's format: no markup around the call, its arguments under "parameters"
  in.grammar = {PRT_GRAMMAR_TOOL_CALLS, nullptr, tools, "", "", "", 0, "parameters"};
  j = wire(prt_generate_encode(&in, err, sizeof err));
  ASSERT_EQ(prt_generate_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.grammar.open), "");
  EXPECT_EQ(S(m.grammar.args_key), "parameters");
  prt_generate_free(&m);
  cJSON_Delete(j);
  in.grammar = {PRT_GRAMMAR_JSON, nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr};
  j = wire(prt_generate_encode(&in, err, sizeof err));
  ASSERT_EQ(prt_generate_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.grammar.type, PRT_GRAMMAR_JSON);
  EXPECT_EQ(m.grammar.schema, nullptr);
  prt_generate_free(&m);
  cJSON_Delete(j);
  const char *bad[] = {R"({"type":"regex"})", R"({"type":"json_schema"})", R"({"type":"json_schema","schema":3})",
                       R"({"type":"tool_calls","open":"a","close":"b"})",
                       R"({"type":"tool_calls","tools":[],"open":"a","close":"b","parallel":true})", R"([1])",
                       R"({"type":"json_schema","schema":"3"})", R"({"type":"json_schema","schema":"{\"a\":1} x"})",
                       R"({"type":"tool_calls","tools":"{}","open":"a","close":"b"})",
                       R"({"type":"tool_calls","tools":[],"open":"a","close":"b","args_key":5})",
                       R"({"type":"tool_calls","tools":[],"open":"a","close":"b","args_key":"a\"b"})",
                       R"({"type":"tool_calls","tools":[],"open":"a","close":"b","args_key":""})"};
  for (const char *g : bad) {
    std::string text = std::string(R"({"op":"generate","id":"g","prompt":[5],"grammar":)") + g + "}";
    cJSON *x = cJSON_Parse(text.c_str());
    EXPECT_EQ(prt_generate_decode(x, &m, err, sizeof err), -1) << g;
    EXPECT_NE(strstr(err, "grammar"), nullptr) << g << ": " << err;
    cJSON_Delete(x);
  }
}

TEST(Proto, Generate) {
  char err[128];
  int32_t prompt[3] = {5, 6, 7}, stop_ids[2] = {2, 9};
  prt_bias bias[2] = {{11, -100}, {12, 2.5}};
  const char *stop[2] = {"\n\n", "END"};
  char schema[] = R"({"type":"object"})";
  prt_generate in = {};
  in.id = "r-0-0";
  in.prompt = prompt;
  in.n_prompt = 3;
  in.max_tokens = 16;
  in.sampling = {0.7, 40, 0.9, 0.05, 0.5, -0.25, 1.1, 1, 4503599627370495.0, 3, bias, 2};
  in.stop = stop;
  in.n_stop = 2;
  in.stop_ids = stop_ids;
  in.n_stop_ids = 2;
  in.ignore_eos = 1;
  in.no_spec = 1;
  in.deadline_ms = 600000;
  in.mode = "prefill";
  in.decode = "d0";
  in.prefix_peer = "p1";
  in.prefix_blocks = 4;
  in.resume = 1;
  in.grammar.type = PRT_GRAMMAR_JSON_SCHEMA;
  in.grammar.schema = schema;
  in.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  cJSON *j = wire(prt_generate_encode(&in, err, sizeof err));
  prt_generate m;
  ASSERT_EQ(prt_generate_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.id), "r-0-0");
  ASSERT_EQ(m.n_prompt, 3);
  EXPECT_EQ(m.prompt[2], 7);
  EXPECT_EQ(m.max_tokens, 16);
  EXPECT_DOUBLE_EQ(m.sampling.temperature, 0.7);
  EXPECT_EQ(m.sampling.top_k, 40);
  EXPECT_DOUBLE_EQ(m.sampling.top_p, 0.9);
  EXPECT_DOUBLE_EQ(m.sampling.min_p, 0.05);
  EXPECT_DOUBLE_EQ(m.sampling.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(m.sampling.frequency_penalty, -0.25);
  EXPECT_DOUBLE_EQ(m.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(m.sampling.has_seed, 1);
  EXPECT_EQ(m.sampling.seed, 4503599627370495.0);
  EXPECT_EQ(m.sampling.logprobs, 3);
  ASSERT_EQ(m.sampling.n_logit_bias, 2);
  EXPECT_EQ(m.sampling.logit_bias[1].token, 12);
  EXPECT_DOUBLE_EQ(m.sampling.logit_bias[1].bias, 2.5);
  ASSERT_EQ(m.n_stop, 2);
  EXPECT_EQ(S(m.stop[1]), "END");
  ASSERT_EQ(m.n_stop_ids, 2);
  EXPECT_EQ(m.stop_ids[1], 9);
  EXPECT_EQ(m.ignore_eos, 1);
  EXPECT_EQ(m.no_spec, 1); // "speculative": false
  EXPECT_EQ(m.deadline_ms, 600000);
  EXPECT_EQ(S(m.mode), "prefill");
  EXPECT_EQ(S(m.decode), "d0");
  EXPECT_EQ(m.prefill, nullptr);
  EXPECT_EQ(S(m.prefix_peer), "p1");
  EXPECT_EQ(m.prefix_blocks, 4);
  EXPECT_EQ(m.resume, 1);
  EXPECT_EQ(S(m.traceparent), in.traceparent);
  { // "speculative" is a bool: another value is refused naming it; absent, speculation is allowed
    prt_generate t;
    char e2[256] = "";
    cJSON *bad = with(j, "speculative", cJSON_CreateString("no"));
    EXPECT_EQ(prt_generate_decode(bad, &t, e2, sizeof e2), -1);
    EXPECT_NE(std::string(e2).find("speculative"), std::string::npos) << e2;
    cJSON *none = with(j, "speculative", nullptr);
    ASSERT_EQ(prt_generate_decode(none, &t, e2, sizeof e2), 0) << e2;
    EXPECT_EQ(t.no_spec, 0);
    prt_generate_free(&t);
    cJSON_Delete(bad);
    cJSON_Delete(none);
  }
  { // a traceparent that is not W3C's is refused, naming the field; absent reads NULL (not traced)
    prt_generate t;
    char e2[256] = "";
    cJSON *bad = with(j, "traceparent", cJSON_CreateString("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"));
    EXPECT_EQ(prt_generate_decode(bad, &t, e2, sizeof e2), -1);
    EXPECT_NE(std::string(e2).find("traceparent"), std::string::npos) << e2;
    cJSON *none = with(j, "traceparent", nullptr);
    ASSERT_EQ(prt_generate_decode(none, &t, e2, sizeof e2), 0) << e2;
    EXPECT_EQ(t.traceparent, nullptr);
    prt_generate_free(&t);
    cJSON_Delete(bad);
    cJSON_Delete(none);
  }
  EXPECT_EQ(m.grammar.type, PRT_GRAMMAR_JSON_SCHEMA);
  EXPECT_EQ(S(m.grammar.schema), schema);
  prt_generate_free(&m);
  for (const char *k : {"id", "prompt"}) refuses<prt_generate>(j, k, true, gen_decode, false);
  for (const char *k : {"mode", "decode", "prefill", "stop_ids", "sampling", "stop", "ignore_eos", "grammar",
                        "prefix_peer"})
    refuses<prt_generate>(j, k, false, gen_decode, false);
  for (const char *k : {"max_tokens", "deadline_ms", "resume", "prefix_blocks"})
    refuses<prt_generate>(j, k, false, gen_decode, true);
  // Out of range, a half hint, wrong sampling types: refused, and the error names the field.
  const char *bad[][2] = {{"max_tokens", "0"},           {"resume", "-1"},         {"prompt", "[1, 2.5]"},
                          {"prefix_blocks", "0"},        {"stop", "[\"a\", 3]"},   {"stop_ids", "[\"a\"]"},
                          {"sampling", "{\"top_p\":2}"}, {"sampling", "{\"logprobs\":21}"},
                          {"sampling", "{\"logit_bias\":[[1]]}"}, {"sampling", "{\"seed\":\"7\"}"}};
  for (auto &b : bad) {
    cJSON *x = with(j, b[0], cJSON_Parse(b[1]));
    EXPECT_EQ(gen_decode(x, &m, err, sizeof err), -1) << b[0] << " " << b[1];
    cJSON_Delete(x);
  }
  cJSON *half = with(j, "prefix_peer", nullptr);
  EXPECT_EQ(gen_decode(half, &m, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("prefix_peer"), std::string::npos) << err;
  cJSON_Delete(half);
  // A refusal keeps the id and the routing names read before the bad field (the worker's kv_fail needs them).
  cJSON *late = with(j, "stop", cJSON_CreateNumber(1));
  EXPECT_EQ(prt_generate_decode(late, &m, err, sizeof err), -1);
  EXPECT_EQ(S(m.id), "r-0-0");
  EXPECT_EQ(S(m.mode), "prefill");
  EXPECT_EQ(S(m.decode), "d0");
  EXPECT_EQ(m.prompt, nullptr);
  cJSON_Delete(late);
  cJSON_Delete(j);
  // The least a generate is: id and prompt; everything else takes its default, and encodes back the same.
  cJSON *min = cJSON_Parse(R"({"op":"generate","id":"x","prompt":[1]})");
  ASSERT_EQ(prt_generate_decode(min, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.max_tokens, -1);
  EXPECT_EQ(m.sampling.temperature, 1);
  EXPECT_EQ(m.sampling.top_p, 1);
  EXPECT_EQ(m.sampling.repetition_penalty, 1);
  EXPECT_EQ(m.sampling.logprobs, -1);
  EXPECT_EQ(m.sampling.has_seed, 0);
  EXPECT_EQ(m.mode, nullptr);
  EXPECT_EQ(m.prefix_peer, nullptr);
  EXPECT_EQ(m.grammar.type, PRT_GRAMMAR_NONE);
  cJSON *again = wire(prt_generate_encode(&m, err, sizeof err));
  prt_generate m2;
  ASSERT_EQ(prt_generate_decode(again, &m2, err, sizeof err), 0) << err;
  EXPECT_EQ(m2.max_tokens, -1);
  EXPECT_EQ(m2.sampling.logprobs, -1);
  EXPECT_EQ(m2.n_prompt, 1);
  prt_generate_free(&m2);
  prt_generate_free(&m);
  cJSON_Delete(again);
  cJSON_Delete(min);
}

int pull_decode(const cJSON *x, prt_prefix_pull *t, char *e, size_t n) {
  int rc = prt_prefix_pull_decode(x, t, e, n);
  if (!rc) prt_prefix_pull_free(t);
  return rc;
}

TEST(Proto, PrefixPull) {
  char err[128];
  int32_t toks[4] = {1, 2, 3, 4}, blocks[1] = {7};
  prt_prefix_pull in = {};
  in.id = "r-0";
  in.tokens = toks;
  in.n_tokens = 4;
  in.first = 0;
  in.blocks = blocks;
  in.n_blocks = 1;
  in.has_layout = 1;
  in.kv_layout = {2, 2, 8, 0, 4, 9, 1, 4096};
  in.kvx_md = "eA==";
  cJSON *j = wire(prt_prefix_pull_encode(&in, err, sizeof err));
  prt_prefix_pull m;
  ASSERT_EQ(prt_prefix_pull_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.id), "r-0");
  ASSERT_EQ(m.n_tokens, 4);
  EXPECT_EQ(m.tokens[3], 4);
  EXPECT_EQ(m.first, 0);
  ASSERT_EQ(m.n_blocks, 1);
  EXPECT_EQ(m.blocks[0], 7);
  EXPECT_EQ(m.has_layout, 1);
  EXPECT_TRUE(same_layout(m.kv_layout, in.kv_layout));
  EXPECT_EQ(S(m.kvx_md), "eA==");
  prt_prefix_pull_free(&m);
  refuses<prt_prefix_pull>(j, "id", true, pull_decode, false);
  refuses<prt_prefix_pull>(j, "tokens", true, pull_decode, false);
  refuses<prt_prefix_pull>(j, "first", true, pull_decode, true);
  refuses<prt_prefix_pull>(j, "blocks", true, pull_decode, false);
  refuses<prt_prefix_pull>(j, "kv_layout", false, pull_decode, false);
  refuses<prt_prefix_pull>(j, "kvx_md", false, pull_decode, false);
  cJSON_Delete(j);
}

TEST(Proto, PrefixAnswers) {
  char err[128];
  cJSON *j = wire(prt_prefix_pulled_encode(&(const prt_prefix_pulled &)prt_prefix_pulled{"r-0", 3}, err, sizeof err));
  prt_prefix_pulled p;
  ASSERT_EQ(prt_prefix_pulled_decode(j, &p, err, sizeof err), 0) << err;
  EXPECT_EQ(S(p.id), "r-0");
  EXPECT_EQ(p.n_blocks, 3);
  refuses<prt_prefix_pulled>(j, "id", true, prt_prefix_pulled_decode, false);
  refuses<prt_prefix_pulled>(j, "n_blocks", true, prt_prefix_pulled_decode, true);
  cJSON_Delete(j);
  j = wire(prt_prefix_fail_encode(&(const prt_prefix_fail &)prt_prefix_fail{"r-1", "no"}, err, sizeof err));
  prt_prefix_fail f;
  ASSERT_EQ(prt_prefix_fail_decode(j, &f, err, sizeof err), 0) << err;
  EXPECT_EQ(S(f.id), "r-1");
  EXPECT_EQ(S(f.message), "no");
  refuses<prt_prefix_fail>(j, "id", true, prt_prefix_fail_decode, false);
  refuses<prt_prefix_fail>(j, "message", false, prt_prefix_fail_decode, false);
  cJSON_Delete(j);
}

TEST(Proto, StatsOk) {
  char err[128];
  prt_stats_ok in;
  prt_stats_ok_init(&in);
  in.running = 2;
  in.waiting = 1;
  in.free_blocks = 30;
  in.total_blocks = 64;
  in.prefix_hits = 160;
  in.auth_failures = 0;
  in.trace_spans_dropped = 3;
  in.evictable_blocks = 12;
  // field by field: a struct assigned whole may leave garbage in its padding, which the memcmp below reads
  in.tiers[PRT_TIER_HOST].present = 1;
  in.tiers[PRT_TIER_HOST].hits = 16;
  in.tiers[PRT_TIER_HOST].queries = 48;
  in.tiers[PRT_TIER_HOST].blocks = 5;
  in.tiers[PRT_TIER_HOST].refused = 2;
  cJSON *j = wire(prt_stats_ok_encode(&in, err, sizeof err));
  EXPECT_FALSE(cJSON_HasObjectItem(j, "finished")); // absent counts are not sent
  prt_stats_ok m;
  ASSERT_EQ(prt_stats_ok_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(memcmp(&m, &in, sizeof m), 0);
  for (const char *k :
       {"running", "free_blocks", "prefix_hits", "auth_failures", "trace_spans_dropped", "evictable_blocks"})
    refuses<prt_stats_ok>(j, k, false, prt_stats_ok_decode, true);
  refuses<prt_stats_ok>(j, "prefix_tiers", false, prt_stats_ok_decode, false);
  cJSON *old = cJSON_Duplicate(j, 1); // a worker from before `refused`: it reads as 0
  cJSON_DeleteItemFromObject(cJSON_GetObjectItem(cJSON_GetObjectItem(old, "prefix_tiers"), "host"), "refused");
  ASSERT_EQ(prt_stats_ok_decode(old, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.tiers[PRT_TIER_HOST].refused, 0);
  EXPECT_EQ(m.tiers[PRT_TIER_HOST].blocks, 5);
  cJSON_Delete(old);
  cJSON *bad = cJSON_Duplicate(j, 1);
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(cJSON_GetObjectItem(bad, "prefix_tiers"), "host"), "hits",
                            cJSON_CreateString("x"));
  EXPECT_EQ(prt_stats_ok_decode(bad, &m, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("hits"), std::string::npos) << err;
  cJSON_Delete(bad);
  cJSON_Delete(j);
}

TEST(Proto, KvEvents) {
  char err[128];
  prt_kv_event ev[3] = {{0, PRT_KV_CLEARED}, {18446744073709551615ull, PRT_KV_ADDED}, {42, PRT_KV_REMOVED}};
  prt_kv_events in = {ev, 3, 0};
  cJSON *j = wire(prt_kv_events_encode(&in, err, sizeof err));
  prt_kv_events m;
  ASSERT_EQ(prt_kv_events_decode(j, &m, err, sizeof err), 0) << err;
  ASSERT_EQ(m.n, 3);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(m.ev[i].key, ev[i].key);
    EXPECT_EQ(m.ev[i].kind, ev[i].kind);
  }
  prt_kv_events_free(&m);
  cJSON *bad = with(j, "events", cJSON_CreateString("x"));
  EXPECT_EQ(prt_kv_events_decode(bad, &m, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("events"), std::string::npos) << err;
  cJSON_Delete(bad);
  cJSON *odd = cJSON_Parse(R"({"op":"kv_events","events":[[1,"12"],[2,"x"],[1],"y",[3]]})"); // malformed: skipped
  ASSERT_EQ(prt_kv_events_decode(odd, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.n, 2);
  EXPECT_EQ(m.skipped, 3);
  prt_kv_events_free(&m);
  cJSON_Delete(odd);
  cJSON_Delete(j);
}

TEST(Proto, BareMessages) {
  for (const char *op : {PRT_OP_DRAINING, PRT_OP_PING, PRT_OP_PONG, PRT_OP_STATS}) {
    cJSON *j = wire(prt_bare_encode(op));
    EXPECT_TRUE(prt_is(j, op));
    EXPECT_EQ(cJSON_GetArraySize(j), 1);
    cJSON_Delete(j);
  }
  EXPECT_STREQ(prt_op(nullptr), "");
}

// docs/protocol.md's message table (rows "| `op` | ...", a first cell may name two: "`ping` / `pong`") lists
// exactly prt_ops.
// token_batch (protocol version 3): one step's token messages as one, each item a token message without its op.
TEST(Proto, TokensBatch) {
  char err[128];
  int32_t a[1] = {5}, b[2] = {6, 7};
  prt_sampled lp = sampled(6);
  cJSON *batch = prt_tokens_new();
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(prt_tokens_count(batch), 0);
  prt_token t0 = {"r-0", "he", a, 1, nullptr, -1}, t1 = {"r-1-r1", "llo", b, 2, &lp, 1};
  ASSERT_EQ(prt_tokens_add(batch, &t0), 0);
  ASSERT_EQ(prt_tokens_add(batch, &t1), 0);
  EXPECT_EQ(prt_tokens_count(batch), 2);
  cJSON *j = wire(batch);
  EXPECT_STREQ(prt_op(j), PRT_OP_TOKENS);
  EXPECT_EQ(prt_id(j), nullptr); // a batch is about many choices: a receiver reads each item's id
  const cJSON *items = prt_tokens_items(j, err, sizeof err), *it;
  ASSERT_NE(items, nullptr) << err;
  std::vector<std::string> ids, texts;
  int n_ids = 0, n_lp = 0;
  cJSON_ArrayForEach(it, items) {
    EXPECT_EQ(cJSON_GetObjectItem(it, "op"), nullptr); // the batch's op says what they are
    prt_token m;
    ASSERT_EQ(prt_token_decode(it, &m, err, sizeof err), 0) << err;
    ids.push_back(m.id);
    texts.push_back(m.text);
    n_ids += m.n_tokens;
    if (m.n_logprobs == 1) {
      expect_sampled(m.logprobs[0], lp);
      n_lp++;
    }
    prt_token_free(&m);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"r-0", "r-1-r1"}));
  EXPECT_EQ(texts, (std::vector<std::string>{"he", "llo"}));
  EXPECT_EQ(n_ids, 3);
  EXPECT_EQ(n_lp, 1);
  for (cJSON *bad : {with(j, "items", nullptr), with(j, "items", cJSON_CreateString("x"))}) {
    EXPECT_EQ(prt_tokens_items(bad, err, sizeof err), nullptr);
    EXPECT_NE(std::string(err).find("items"), std::string::npos) << err;
    cJSON_Delete(bad);
  }
  cJSON_Delete(j);
}

TEST(Proto, DocTableMatchesOps) {
  std::ifstream f(std::string(DSERVE_SOURCE_DIR) + "/docs/protocol.md");
  ASSERT_TRUE(f.good());
  std::string line;
  std::set<std::string> doc;
  bool in_table = false;
  while (std::getline(f, line)) {
    if (line.rfind("| op |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.rfind("|", 0) != 0) break;
    std::string cell = line.substr(1, line.find('|', 1) - 1);
    for (size_t a = cell.find('`'); a != std::string::npos; a = cell.find('`', a)) {
      size_t b = cell.find('`', a + 1);
      if (b == std::string::npos) break;
      doc.insert(cell.substr(a + 1, b - a - 1));
      a = b + 1;
    }
  }
  std::set<std::string> ops;
  for (int i = 0; i < prt_n_ops; i++) ops.insert(prt_ops[i]);
  EXPECT_FALSE(doc.empty());
  EXPECT_EQ(doc, ops);
}

} // namespace
