// tests/decode/test_handoff.cc: the decode worker's sequence states (decode/handoff.h): every legal transition of
// docs/protocol.md's "Handoff states" table is accepted, every other one refused.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "decode/handoff.h"

namespace {

// The decode side's table in docs/protocol.md, "Handoff states".
const std::set<std::pair<dec_state, dec_state>> kLegal = {
    {DEC_NEW, DEC_WAIT_TABLE},         {DEC_NEW, DEC_RUNNING},           {DEC_NEW, DEC_DONE},
    {DEC_WAIT_TABLE, DEC_TABLE_SENT},  {DEC_WAIT_TABLE, DEC_FAILED},     {DEC_WAIT_TABLE, DEC_DONE},
    {DEC_TABLE_SENT, DEC_KV_ARRIVING}, {DEC_TABLE_SENT, DEC_GOT_NOTIF},  {DEC_TABLE_SENT, DEC_GOT_FIRST},
    {DEC_TABLE_SENT, DEC_HELD},        {DEC_TABLE_SENT, DEC_FAILED},     {DEC_TABLE_SENT, DEC_DONE},
    {DEC_KV_ARRIVING, DEC_GOT_NOTIF},  {DEC_KV_ARRIVING, DEC_GOT_FIRST}, {DEC_KV_ARRIVING, DEC_HELD},
    {DEC_KV_ARRIVING, DEC_FAILED},     {DEC_KV_ARRIVING, DEC_DONE},      {DEC_GOT_NOTIF, DEC_GOT_NOTIF},
    {DEC_GOT_NOTIF, DEC_RUNNING},      {DEC_GOT_NOTIF, DEC_FAILED},      {DEC_GOT_NOTIF, DEC_DONE},
    {DEC_GOT_FIRST, DEC_GOT_FIRST},    {DEC_GOT_FIRST, DEC_RUNNING},     {DEC_GOT_FIRST, DEC_HELD},
    {DEC_GOT_FIRST, DEC_FAILED},       {DEC_GOT_FIRST, DEC_DONE},        {DEC_RUNNING, DEC_DONE},
    {DEC_HELD, DEC_DONE},              {DEC_FAILED, DEC_DONE},
};

TEST(DecHandoff, LegalTransitionsAccepted) {
  for (const auto &t : kLegal)
    EXPECT_TRUE(dec_state_legal(t.first, t.second)) << dec_state_name(t.first) << " -> " << dec_state_name(t.second);
}

TEST(DecHandoff, EveryOtherTransitionRefused) {
  for (int a = 0; a < DEC_N_STATES; a++) {
    for (int b = 0; b < DEC_N_STATES; b++) {
      if (kLegal.count({(dec_state)a, (dec_state)b})) continue;
      EXPECT_FALSE(dec_state_legal((dec_state)a, (dec_state)b))
          << dec_state_name((dec_state)a) << " -> " << dec_state_name((dec_state)b);
    }
  }
  // out of range
  EXPECT_FALSE(dec_state_legal(DEC_N_STATES, DEC_DONE));
  EXPECT_FALSE(dec_state_legal(DEC_NEW, DEC_N_STATES));
  // the ones a misbehaving prefill worker could ask for: KV before our table went out, anything after the end
  EXPECT_FALSE(dec_state_legal(DEC_WAIT_TABLE, DEC_GOT_NOTIF));
  EXPECT_FALSE(dec_state_legal(DEC_WAIT_TABLE, DEC_KV_ARRIVING));
  EXPECT_FALSE(dec_state_legal(DEC_DONE, DEC_RUNNING));
  EXPECT_FALSE(dec_state_legal(DEC_GOT_NOTIF, DEC_HELD)); // every write landed: nothing to hold
}

TEST(DecHandoff, NamesAndGroups) {
  std::set<std::string> names;
  for (int a = 0; a < DEC_N_STATES; a++) names.insert(dec_state_name((dec_state)a));
  EXPECT_EQ(names.size(), (size_t)DEC_N_STATES); // each its own name
  EXPECT_STREQ(dec_state_name(DEC_N_STATES), "?");
  EXPECT_STREQ(dec_state_name(DEC_KV_ARRIVING), "kv_arriving");
  for (int a = 0; a < DEC_N_STATES; a++) {
    dec_state s = (dec_state)a;
    EXPECT_EQ(dec_state_in_handoff(s), s >= DEC_WAIT_TABLE && s <= DEC_GOT_FIRST) << dec_state_name(s);
    // holding is possible exactly where HELD is a legal next state
    EXPECT_EQ(dec_state_may_write(s), dec_state_legal(s, DEC_HELD)) << dec_state_name(s);
  }
}

} // namespace
