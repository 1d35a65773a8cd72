// tests/router/test_fair.cc: one request's many choices against the others (issue 39, item 5): the caps on a
// request's choices and tokens, and fair admission (a request's choices take their turn with other requests').
// The router runs in process against the fake worker over loopback; the worker is paused (FakeWorker::hold) so
// that what the router sends, and in which order, is seen while nothing finishes.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/router/http_util.h"

namespace {

using namespace std::chrono_literals;
using namespace httptest;

const size_t PAUSED = 1000000; // FakeWorker::hold: no tokens until this many generations (never)

// A completion request of n_prompts prompts x n choices, 2 tokens each, streamed.
std::string big_request(int n_prompts, int n) {
  std::string p;
  for (int i = 0; i < n_prompts; i++) p += std::string(i ? "," : "") + "\"p" + std::to_string(i) + "\"";
  return R"({"prompt":[)" + p + R"(],"n":)" + std::to_string(n) + R"(,"max_tokens":2,"stream":true})";
}

// Waits up to 5 s for the fake worker to have been sent at least k generations.
bool wait_generates(FakeWorker &fw, size_t k) {
  for (int i = 0; i < 500; i++) {
    if (fw.n_generates() >= k) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// POST body to path in a thread of its own; the answer lands in *out.
std::thread post_async(int port, const char *path, const std::string &body, Resp *out) {
  return std::thread([=] { *out = request(port, "POST", path, body); });
}

std::vector<std::string> generates(FakeWorker &fw) {
  std::lock_guard<std::mutex> l(fw.mu);
  return fw.generates;
}

// A router whose admission capacity is max_seqs (one worker) and whose requests may have up to 8 x 4 choices.
struct FairRouter : Router {
  FairRouter(const TinyModel &m, int worker_port, int max_seqs, int max_choices = 64, int max_request_tokens = 0)
      : Router(m, worker_port, 16, max_seqs, {}, 10, [&](cfg_cluster &c) {
          c.router.max_choices = max_choices;
          c.router.max_request_tokens = max_request_tokens;
        }) {}
};

// A paused fake worker and a router of max_seqs slots; start() sends the big request of prompts x n choices, waits
// until `held` of them went to the worker, then sends the small chat; both answers land in big and small.
struct Fair : ::testing::Test {
  TinyModel m;
  FakeWorker fw;
  std::unique_ptr<FairRouter> r;
  Resp big, small;
  std::thread tb, ts;
  void start(int max_seqs, int prompts, int n, size_t held) {
    fw.hold = PAUSED;
    r = std::make_unique<FairRouter>(m, fw.port(), max_seqs);
    ASSERT_TRUE(r->wait_up());
    tb = post_async(r->port(), "/v1/completions", big_request(prompts, n), &big);
    ASSERT_TRUE(wait_generates(fw, held));
    ts = post_async(r->port(), "/v1/chat/completions", CHAT + R"(,"max_tokens":2})", &small);
  }
  void TearDown() override {
    fw.hold = 0;
    if (tb.joinable()) tb.join();
    if (ts.joinable()) ts.join();
  }
};

// 16 choices against 4 slots: the router sends 4 (not all 16), and a chat that comes while they hold every slot
// takes one of the first slots that free up, before the big request's last choices start (issue: an 8-token chat
// behind 64 x 8 choices waited for all 512).
TEST_F(Fair, SmallRequestTakesItsTurnBesideManyChoices) {
  start(/*max_seqs=*/4, 4, 4, /*held=*/4);
  bool queued = false; // the chat waits for a slot: every one is held
  for (int i = 0; i < 500 && !queued; i++) {
    queued = request(r->port(), "GET", "/metrics", "").body.find("dserve:num_requests_waiting{model_name=\"tiny\"} 1") !=
             std::string::npos;
    if (!queued) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(queued);
  EXPECT_EQ(generates(fw).size(), 4u) << "the 16 choices went out beyond the 4 slots";
  fw.hold = 0; // the worker plays its generations: slots free up four at a time
  TearDown();
  EXPECT_EQ(big.status, 200) << big.body;
  EXPECT_EQ(small.status, 200) << small.body;
  EXPECT_NE(big.body.find("data: [DONE]"), std::string::npos);
  for (int i = 0; i < 16; i++) // every choice streamed to its end
    EXPECT_NE(big.body.find("\"index\":" + std::to_string(i) + ",\"text\":\"c" + std::to_string(i) + "t1 \""),
              std::string::npos)
        << i << "\n" << big.body;
  auto g = generates(fw);
  ASSERT_EQ(g.size(), 17u);
  size_t chat_at = g.size();
  for (size_t i = 0; i < g.size(); i++)
    if (g[i].rfind("chatcmpl-", 0) == 0) chat_at = i;
  // a slot is kept for the queued chat: at most 3 of the big request's choices go before it in the second round
  EXPECT_GE(chat_at, 4u);
  EXPECT_LT(chat_at, 8u) << "the chat was sent after " << chat_at << " of the big request's choices";
}

// With 16 slots one request holds at most 15 (capacity - capacity / 16): a request that comes while it holds them
// is sent at once, before any of its choices has finished (its TTFT is its own, not the big request's).
TEST_F(Fair, NewRequestStartsAtOnceBesideOneHoldingItsShare) {
  start(/*max_seqs=*/16, 8, 4, /*held=*/15);
  bool sent = false;
  for (int i = 0; i < 500 && !sent; i++) {
    for (auto &id : generates(fw)) sent |= id.rfind("chatcmpl-", 0) == 0;
    if (!sent) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(sent) << "the chat was not sent while the big request held its share";
  auto g = generates(fw);
  EXPECT_EQ(g.size(), 16u); // 15 of the big request's, then the chat; nothing has finished yet
  EXPECT_EQ(g.back().rfind("chatcmpl-", 0), 0u) << g.back();
  TearDown();
  EXPECT_EQ(big.status, 200) << big.body;
  EXPECT_EQ(small.status, 200) << small.body;
  EXPECT_EQ(generates(fw).size(), 33u);
}

// router.max_choices caps prompts x n, router.max_request_tokens the sum over the choices of prompt + max_tokens
// (the rest of the context for a choice without max_tokens); beyond either: 400 naming the cap. Within both: served.
TEST_F(Fair, ChoiceAndTokenCapsRefused400) {
  FairRouter r(m, fw.port(), 64, /*max_choices=*/8, /*max_request_tokens=*/100);
  ASSERT_TRUE(r.wait_up());
  Resp x = request(r.port(), "POST", "/v1/completions", R"({"prompt":["a","b","c"],"n":3,"max_tokens":2})");
  expect_error(x, 400, "too_many_choices");
  EXPECT_NE(x.body.find("router.max_choices allows at most 8"), std::string::npos) << x.body;
  EXPECT_NE(x.body.find("\"param\":\"n\""), std::string::npos) << x.body;
  x = request(r.port(), "POST", "/v1/completions", R"({"prompt":"ab","n":4,"max_tokens":30})"); // 4 x (2 + 30)
  expect_error(x, 400, "too_many_tokens");
  EXPECT_NE(x.body.find("router.max_request_tokens allows at most 100"), std::string::npos) << x.body;
  EXPECT_NE(x.body.find("up to 128 tokens"), std::string::npos) << x.body;
  x = request(r.port(), "POST", "/v1/completions", R"({"prompt":"ab"})"); // no max_tokens: the context (512)
  expect_error(x, 400, "too_many_tokens");
  x = request(r.port(), "POST", "/v1/completions", R"({"prompt":["ab","cd"],"n":4,"max_tokens":10})"); // 8 x 12
  EXPECT_EQ(x.status, 200) << x.body;
}

// The defaults (max_choices 64, max_request_tokens 0: 64 x the context) refuse no request that fits the per-choice
// limits and 64 choices, with or without max_tokens; 65 choices are refused.
TEST_F(Fair, DefaultCapsRefuseNoLegalRequest) {
  Router r(m, fw.port(), 16, 64, {}, 10, [](cfg_cluster &c) { c.router.max_n = 4; });
  ASSERT_TRUE(r.wait_up());
  std::string p;
  for (int i = 0; i < 16; i++) p += std::string(i ? "," : "") + "\"p" + std::to_string(i) + "\"";
  Resp x = request(r.port(), "POST", "/v1/completions", R"({"prompt":[)" + p + R"(],"n":4})"); // 64, no max_tokens
  EXPECT_EQ(x.status, 200) << x.body;
  x = request(r.port(), "POST", "/v1/completions", R"({"prompt":[)" + p + R"(,"q"],"n":4,"max_tokens":1})");
  expect_error(x, 400, "too_many_choices");
}

} // namespace
