// tests/prefill/test_handoff.cc: the prefill worker's request states (prefill/handoff.h): every legal transition of
// docs/protocol.md's "Handoff states" table is accepted, every other one refused.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "prefill/handoff.h"

namespace {

// The prefill side's table in docs/protocol.md, "Handoff states".
const std::set<std::pair<pfl_state, pfl_state>> kLegal = {
    {PFL_NEW, PFL_WAIT_TABLE},      {PFL_NEW, PFL_DONE},
    {PFL_WAIT_TABLE, PFL_TABLE},    {PFL_WAIT_TABLE, PFL_COMPUTED},   {PFL_WAIT_TABLE, PFL_DONE},
    {PFL_COMPUTED, PFL_HANDED_OFF}, {PFL_COMPUTED, PFL_STOPPING},     {PFL_COMPUTED, PFL_DONE},
    {PFL_TABLE, PFL_PUSHING},       {PFL_TABLE, PFL_HANDED_OFF},      {PFL_TABLE, PFL_PUSH_FAILED},
    {PFL_TABLE, PFL_STOPPING},      {PFL_TABLE, PFL_DONE},            {PFL_PUSHING, PFL_HANDED_OFF},
    {PFL_PUSHING, PFL_PUSH_FAILED}, {PFL_PUSHING, PFL_STOPPING},      {PFL_PUSHING, PFL_DONE},
    {PFL_PUSH_FAILED, PFL_STOPPING}, {PFL_PUSH_FAILED, PFL_DONE},     {PFL_HANDED_OFF, PFL_STOPPING},
    {PFL_HANDED_OFF, PFL_DONE},     {PFL_STOPPING, PFL_STOPPING},     {PFL_STOPPING, PFL_DONE},
};

TEST(PflHandoff, LegalTransitionsAccepted) {
  for (const auto &t : kLegal)
    EXPECT_TRUE(pfl_state_legal(t.first, t.second)) << pfl_state_name(t.first) << " -> " << pfl_state_name(t.second);
}

TEST(PflHandoff, EveryOtherTransitionRefused) {
  for (int a = 0; a < PFL_N_STATES; a++) {
    for (int b = 0; b < PFL_N_STATES; b++) {
      if (kLegal.count({(pfl_state)a, (pfl_state)b})) continue;
      EXPECT_FALSE(pfl_state_legal((pfl_state)a, (pfl_state)b))
          << pfl_state_name((pfl_state)a) << " -> " << pfl_state_name((pfl_state)b);
    }
  }
  EXPECT_FALSE(pfl_state_legal(PFL_N_STATES, PFL_DONE));
  EXPECT_FALSE(pfl_state_legal(PFL_NEW, PFL_N_STATES));
  // kv_started only with the table; no write (so nothing to wait for) before it; nothing after the end
  EXPECT_FALSE(pfl_state_legal(PFL_WAIT_TABLE, PFL_PUSHING));
  EXPECT_FALSE(pfl_state_legal(PFL_WAIT_TABLE, PFL_STOPPING));
  EXPECT_FALSE(pfl_state_legal(PFL_HANDED_OFF, PFL_PUSHING));
  EXPECT_FALSE(pfl_state_legal(PFL_DONE, PFL_WAIT_TABLE));
}

TEST(PflHandoff, NamesAndGroups) {
  std::set<std::string> names;
  for (int a = 0; a < PFL_N_STATES; a++) names.insert(pfl_state_name((pfl_state)a));
  EXPECT_EQ(names.size(), (size_t)PFL_N_STATES);
  EXPECT_STREQ(pfl_state_name(PFL_N_STATES), "?");
  EXPECT_STREQ(pfl_state_name(PFL_HANDED_OFF), "handed_off");
  for (int a = 0; a < PFL_N_STATES; a++) {
    pfl_state s = (pfl_state)a;
    EXPECT_EQ(pfl_state_pushes(s), s == PFL_TABLE || s == PFL_PUSHING) << pfl_state_name(s);
    EXPECT_EQ(pfl_state_draining(s), s == PFL_HANDED_OFF || s == PFL_STOPPING) << pfl_state_name(s);
  }
}

} // namespace
