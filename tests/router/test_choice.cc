// tests/router/test_choice.cc: a choice's states in the router (router/choice.h): every legal transition of
// docs/protocol.md's "Handoff states" table is accepted, every other one refused.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "router/choice.h"

namespace {

// The router side's table in docs/protocol.md, "Handoff states".
const std::set<std::pair<rtr_ch_state, rtr_ch_state>> kLegal = {
    {RTR_CH_NEW, RTR_CH_ROUTED},
    {RTR_CH_NEW, RTR_CH_DONE},
    {RTR_CH_ROUTED, RTR_CH_ROUTED}, // moved before any token
    {RTR_CH_ROUTED, RTR_CH_STREAMING},
    {RTR_CH_ROUTED, RTR_CH_DECODE_LOST},
    {RTR_CH_ROUTED, RTR_CH_WAITING_WORKER},
    {RTR_CH_ROUTED, RTR_CH_DONE},
    {RTR_CH_STREAMING, RTR_CH_ROUTED},
    {RTR_CH_STREAMING, RTR_CH_WAITING_WORKER},
    {RTR_CH_STREAMING, RTR_CH_DONE},
    {RTR_CH_DECODE_LOST, RTR_CH_ROUTED},
    {RTR_CH_DECODE_LOST, RTR_CH_STREAMING},
    {RTR_CH_DECODE_LOST, RTR_CH_WAITING_WORKER},
    {RTR_CH_DECODE_LOST, RTR_CH_DONE},
    {RTR_CH_WAITING_WORKER, RTR_CH_ROUTED},
    {RTR_CH_WAITING_WORKER, RTR_CH_DONE},
};

TEST(RtrChoice, LegalTransitionsAccepted) {
  for (const auto &t : kLegal)
    EXPECT_TRUE(rtr_ch_state_legal(t.first, t.second))
        << rtr_ch_state_name(t.first) << " -> " << rtr_ch_state_name(t.second);
}

TEST(RtrChoice, EveryOtherTransitionRefused) {
  for (int a = 0; a < RTR_CH_N_STATES; a++) {
    for (int b = 0; b < RTR_CH_N_STATES; b++) {
      if (kLegal.count({(rtr_ch_state)a, (rtr_ch_state)b})) continue;
      EXPECT_FALSE(rtr_ch_state_legal((rtr_ch_state)a, (rtr_ch_state)b))
          << rtr_ch_state_name((rtr_ch_state)a) << " -> " << rtr_ch_state_name((rtr_ch_state)b);
    }
  }
  EXPECT_FALSE(rtr_ch_state_legal(RTR_CH_N_STATES, RTR_CH_DONE));
  EXPECT_FALSE(rtr_ch_state_legal(RTR_CH_NEW, RTR_CH_N_STATES));
  // a waiting choice has no worker to stream from; a decode worker's loss is news only before it streams
  EXPECT_FALSE(rtr_ch_state_legal(RTR_CH_WAITING_WORKER, RTR_CH_STREAMING));
  EXPECT_FALSE(rtr_ch_state_legal(RTR_CH_STREAMING, RTR_CH_DECODE_LOST));
  EXPECT_FALSE(rtr_ch_state_legal(RTR_CH_DONE, RTR_CH_ROUTED));
}

TEST(RtrChoice, Names) {
  std::set<std::string> names;
  for (int a = 0; a < RTR_CH_N_STATES; a++) names.insert(rtr_ch_state_name((rtr_ch_state)a));
  EXPECT_EQ(names.size(), (size_t)RTR_CH_N_STATES);
  EXPECT_STREQ(rtr_ch_state_name(RTR_CH_N_STATES), "?");
  EXPECT_STREQ(rtr_ch_state_name(RTR_CH_WAITING_WORKER), "waiting_worker");
}

} // namespace
