// tests/proto/test_proto.cc: every control message survives encode → text → parse → decode; decoders refuse wrong
// types and missing fields; docs/protocol.md's message table names exactly proto's ops.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "proto/hello.h"
#include "proto/request.h"

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

TEST(Proto, Hello) {
  char err[128];
  prt_hello in = {"router", "r0", "proof", PRT_VERSION};
  cJSON *j = wire(prt_hello_encode(&in, err, sizeof err));
  EXPECT_TRUE(prt_is(j, PRT_OP_HELLO));
  prt_hello m;
  ASSERT_EQ(prt_hello_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(S(m.role), "router");
  EXPECT_EQ(S(m.name), "r0");
  EXPECT_EQ(S(m.auth), "proof");
  EXPECT_EQ(m.proto, PRT_VERSION);
  refuses<prt_hello>(j, "auth", false, prt_hello_decode, false);
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
  in.kv_layout = {30, 192, 1, 16, 640, 6, 0xfedcba9876543210ull};
  in.kvx_md = "bWQ=";
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
  EXPECT_EQ(memcmp(&m.kv_layout, &in.kv_layout, sizeof in.kv_layout), 0);
  EXPECT_EQ(S(m.kvx_md), "bWQ=");
  refuses<prt_hello_ok>(j, "n_ctx", false, prt_hello_ok_decode, true);
  refuses<prt_hello_ok>(j, "kv_layout", false, prt_hello_ok_decode, false);
  refuses<prt_hello_ok>(j, "kvx_md", false, prt_hello_ok_decode, false);
  cJSON *lay = cJSON_GetObjectItem(j, "kv_layout");
  for (const char *k : {"n_layer", "kv_dim", "type", "block_size", "n_blocks", "base"}) {
    cJSON *c = cJSON_Duplicate(j, 1);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(c, "kv_layout"), k);
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
