// tests/proto/test_proto_kvstore.cc: the shared KV tier's fields: cached_store_tokens on kv_first and done, the store
// tier and the kvstore_* counts of stats_ok.
#include <gtest/gtest.h>

#include <string>

#include "proto/handoff.h"
#include "proto/request.h"
#include "proto/stats.h"

namespace {

cJSON *round_trip(cJSON *m) { // encode's message as the peer parses it
  char *t = cJSON_PrintUnformatted(m);
  cJSON_Delete(m);
  cJSON *back = cJSON_Parse(t);
  free(t);
  return back;
}

TEST(ProtoKvstore, KvFirstCarriesStoreTokensWithinCached) {
  char err[160];
  prt_kv_first in = {};
  in.id = "r-1";
  in.cached_tokens = 64;
  in.cached_store_tokens = 48;
  in.prefill_ms = -1;
  cJSON *j = round_trip(prt_kv_first_encode(&in, err, sizeof err));
  prt_kv_first m;
  ASSERT_EQ(prt_kv_first_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.cached_store_tokens, 48);
  cJSON_ReplaceItemInObject(j, "cached_store_tokens", cJSON_CreateNumber(65)); // more than cached: refused
  EXPECT_NE(prt_kv_first_decode(j, &m, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("cached_store_tokens"), std::string::npos) << err;
  cJSON_DeleteItemFromObject(j, "cached_store_tokens"); // absent (an older prefill worker): 0
  ASSERT_EQ(prt_kv_first_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.cached_store_tokens, 0);
  cJSON_Delete(j);
  in.cached_store_tokens = 0; // not sent when 0
  j = prt_kv_first_encode(&in, err, sizeof err);
  EXPECT_EQ(cJSON_GetObjectItem(j, "cached_store_tokens"), nullptr);
  cJSON_Delete(j);
}

TEST(ProtoKvstore, DoneCarriesStoreTokens) {
  char err[160];
  prt_done in = {};
  in.id = "r-2";
  in.finish_reason = "stop";
  in.cached_tokens = 192;
  in.cached_store_tokens = 192;
  in.kv_bytes = in.kv_ms = in.prefill_ms = -1;
  cJSON *j = round_trip(prt_done_encode(&in, err, sizeof err));
  prt_done m;
  ASSERT_EQ(prt_done_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.cached_store_tokens, 192);
  cJSON_ReplaceItemInObject(j, "cached_store_tokens", cJSON_CreateNumber(-1));
  EXPECT_NE(prt_done_decode(j, &m, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("cached_store_tokens"), std::string::npos) << err;
  cJSON_Delete(j);
}

TEST(ProtoKvstore, StatsCarryTheStoreTierAndCounts) {
  char err[160];
  EXPECT_STREQ(prt_tier_names[PRT_TIER_STORE], "store");
  prt_stats_ok in;
  prt_stats_ok_init(&in);
  in.tiers[PRT_TIER_STORE] = {1, 160, 400, 0, 3};
  in.kvstore_read_blocks = 10;
  in.kvstore_read_bytes = 3686400;
  in.kvstore_write_blocks = 12;
  in.kvstore_mac_failures = 1;
  in.kvstore_queue_drops = 3;
  in.kvstore_up = 1;
  cJSON *j = round_trip(prt_stats_ok_encode(&in, err, sizeof err));
  prt_stats_ok m;
  ASSERT_EQ(prt_stats_ok_decode(j, &m, err, sizeof err), 0) << err;
  EXPECT_EQ(m.tiers[PRT_TIER_STORE].present, 1);
  EXPECT_EQ(m.tiers[PRT_TIER_STORE].hits, 160);
  EXPECT_EQ(m.tiers[PRT_TIER_STORE].queries, 400);
  EXPECT_EQ(m.tiers[PRT_TIER_STORE].refused, 3);
  EXPECT_EQ(m.tiers[PRT_TIER_POOL].present, 0);
  EXPECT_EQ(m.kvstore_read_blocks, 10);
  EXPECT_EQ(m.kvstore_read_bytes, 3686400);
  EXPECT_EQ(m.kvstore_write_blocks, 12);
  EXPECT_EQ(m.kvstore_mac_failures, 1);
  EXPECT_EQ(m.kvstore_queue_drops, 3);
  EXPECT_EQ(m.kvstore_up, 1);
  EXPECT_EQ(m.kvstore_errors, -1); // not sent: absent
  cJSON_AddItemToObject(j, "kvstore_mismatches", cJSON_CreateString("3")); // a count must be a number
  EXPECT_NE(prt_stats_ok_decode(j, &m, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("kvstore_mismatches"), std::string::npos) << err;
  cJSON_Delete(j);
}

} // namespace
