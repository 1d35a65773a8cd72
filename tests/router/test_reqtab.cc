// tests/router/test_reqtab.cc: the router's requests by id (router/reqtab.h): lookups, deletion inside probe runs,
// growth, and reading a choice id back to its request id.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "router/reqtab.h"

namespace {

TEST(ReqTab, PutGetDelAgainstAMap) {
  rtr_reqtab t = {};
  std::vector<std::string> keys;
  for (int i = 0; i < 5000; i++) keys.push_back("chatcmpl-" + std::to_string(i * 7919));
  std::map<std::string, long> live;
  for (size_t i = 0; i < keys.size(); i++) {
    ASSERT_EQ(rtr_reqtab_put(&t, keys[i].c_str(), (void *)(i + 1)), 0);
    live[keys[i]] = (long)(i + 1);
  }
  EXPECT_EQ(t.n, keys.size());
  EXPECT_LE(t.n * 4, t.cap * 3); // grown: at most 3/4 full
  // every other key leaves: those left must still be found (deletion shifts runs back, never breaks them)
  for (size_t i = 0; i < keys.size(); i += 2) {
    rtr_reqtab_del(&t, keys[i].c_str());
    live.erase(keys[i]);
  }
  rtr_reqtab_del(&t, "not-there"); // a no-op
  EXPECT_EQ(t.n, live.size());
  for (size_t i = 0; i < keys.size(); i++) {
    void *v = rtr_reqtab_get(&t, keys[i].c_str(), keys[i].size());
    if (live.count(keys[i])) EXPECT_EQ(v, (void *)live[keys[i]]) << keys[i];
    else EXPECT_EQ(v, nullptr) << keys[i];
  }
  // a key's prefix or extension is another key
  EXPECT_EQ(rtr_reqtab_get(&t, keys[1].c_str(), keys[1].size() - 1), nullptr);
  std::string longer = keys[1] + "7";
  EXPECT_EQ(rtr_reqtab_get(&t, longer.c_str(), longer.size()), nullptr);
  // the slots freed take new keys
  for (size_t i = 0; i < keys.size(); i += 2) ASSERT_EQ(rtr_reqtab_put(&t, keys[i].c_str(), (void *)7), 0);
  for (size_t i = 0; i < keys.size(); i += 2) EXPECT_EQ(rtr_reqtab_get(&t, keys[i].c_str(), keys[i].size()), (void *)7);
  rtr_reqtab_free(&t);
  EXPECT_EQ(rtr_reqtab_get(&t, "chatcmpl-0", 10), nullptr);
}

// 40 keys in a table of 64 slots (long probe runs): deleting every third keeps the others reachable.
TEST(ReqTab, DeleteInsideARun) {
  rtr_reqtab t = {};
  std::vector<std::string> keys;
  for (int i = 0; i < 40; i++) keys.push_back("k" + std::to_string(i));
  for (auto &k : keys) ASSERT_EQ(rtr_reqtab_put(&t, k.c_str(), (void *)&k), 0);
  for (size_t i = 0; i < keys.size(); i += 3) rtr_reqtab_del(&t, keys[i].c_str());
  for (size_t i = 0; i < keys.size(); i++)
    EXPECT_EQ(rtr_reqtab_get(&t, keys[i].c_str(), keys[i].size()), i % 3 ? (void *)&keys[i] : nullptr) << keys[i];
  rtr_reqtab_free(&t);
}

TEST(ReqTab, ChoiceIdSplit) {
  int ci = -1;
  std::string rid = "chatcmpl-1a2b3c000042";
  EXPECT_EQ(rtr_choice_id_split((rid + "-0").c_str(), &ci), rid.size());
  EXPECT_EQ(ci, 0);
  EXPECT_EQ(rtr_choice_id_split((rid + "-17-r2").c_str(), &ci), rid.size()); // moved twice
  EXPECT_EQ(ci, 17);
  EXPECT_EQ(rtr_choice_id_split("cmpl-123000001-3", &ci), std::string("cmpl-123000001").size()); // an all-digit tail
  EXPECT_EQ(ci, 3);
  for (const char *bad : {"", "nodash", "-3", "x-", "x-r2", "x-1-r", "x-abc"}) EXPECT_EQ(rtr_choice_id_split(bad, &ci), 0u) << bad;
}

} // namespace
