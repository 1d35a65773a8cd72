// tests/prefill/test_disagg.cc: a real prefill worker pushing KV into a real decode worker, driven as the router.
#include <gtest/gtest.h>

#include "tests/cluster_util.h"

namespace {

using namespace dserve_test;

const char *kModel = model_path();

const char *kPrompts[] = {
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The history of the Roman Empire spans many centuries. It began when Augustus became the first emperor "
    "and continued through periods of expansion, crisis and reform. Historians often divide it into",
    "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n"};

void disagg_equals_colocated(const std::string &backend, std::vector<WorkerSpec> workers = default_workers()) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c(backend, workers);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 3; i++) {
    auto p = encode(kPrompts[i]);
    std::string id = "r" + std::to_string(i);
    c.send("w0", gen("w" + id, p, 12, "\"mode\":\"local\""));
    c.send("p0", gen(id, p, 12, "\"mode\":\"prefill\",\"decode\":\"d0\""));
    c.send("d0", gen(id, p, 12, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  }
  auto r = collect(c, 6);
  for (int i = 0; i < 3; i++) {
    std::string id = "r" + std::to_string(i);
    EXPECT_EQ(r[id].error, "") << r[id].message << "\n" << c.log("p0") << c.log("d0");
    EXPECT_FALSE(r[id].tokens.empty());
    EXPECT_EQ(r[id].tokens, r["w" + id].tokens) << kPrompts[i];
    EXPECT_EQ(r[id].text, r["w" + id].text);
    EXPECT_GT(r[id].kv_bytes, 0);
  }
  int total = 0;
  EXPECT_EQ(free_blocks(c, "d0", &total), total);
  for (int i = 0; i < 50; i++) { // the prefill worker frees once its writes complete
    if (free_blocks(c, "p0", &total) == total) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(free_blocks(c, "p0", &total), total);
}

} // namespace

TEST(Disagg, GreedyOverTcpEqualsColocated) { disagg_equals_colocated("tcp"); }
TEST(Disagg, GreedyOverShmEqualsColocated) { disagg_equals_colocated("shm"); }

// Host staging (kv/stage.h), forced on for CPU pools: the prefill worker copies each layer's blocks into
// its mirror and pushes them from there; the decode worker exports only its mirror and copies a prompt's blocks
// into its pool when the notification comes. Neither pool is registered, so equal output means the KV went
// through both mirrors (they start zeroed). This is the path a GPU worker takes with a CPU peer.
std::vector<WorkerSpec> staged(bool prefill, bool decode) {
  auto w = default_workers();
  for (auto &s : w)
    if ((s.role == "prefill" && prefill) || (s.role == "decode" && decode)) s.kvx = "\"staging\": \"on\"";
  return w;
}

TEST(Disagg, GreedyThroughHostStagingOnBothSidesEqualsColocated) { disagg_equals_colocated("tcp", staged(true, true)); }

TEST(Disagg, GreedyIntoAStagingDecodeWorkerOverShmEqualsColocated) {
  disagg_equals_colocated("shm", staged(false, true));
}

TEST(Disagg, StagingIsOnlyWhereAsked) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  {
    Cluster c("tcp", staged(true, true));
    ASSERT_TRUE(c.ok());
    EXPECT_NE(c.log("p0").find("host mirror"), std::string::npos) << c.log("p0");
    EXPECT_NE(c.log("d0").find("host mirror"), std::string::npos) << c.log("d0");
  }
  { // a CPU pool without "on" does not stage
    Cluster c("tcp");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c.log("d0").find("host mirror"), std::string::npos) << c.log("d0");
  }
}

TEST(Disagg, PrefillDeathFreesTheDecodeWorkersBlocks) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("tcp");
  ASSERT_TRUE(c.ok());
  int total = 0;
  ASSERT_GT(free_blocks(c, "d0", &total), 0);
  std::vector<int> p(1000, 0);
  auto words = encode(kPrompts[1]);
  for (size_t i = 0; i < p.size(); i++) p[i] = words[i % words.size()];
  c.send("d0", gen("k", p, 8, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  c.send("p0", gen("k", p, 8, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  std::this_thread::sleep_for(std::chrono::milliseconds(300)); // mid-prefill
  kill(c.pids["p0"], SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  auto r = collect(c, 1, 10000);
  EXPECT_EQ(r["k"].error, "worker_failure");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(free_blocks(c, "d0", &total), total);
}

TEST(Disagg, DecodeWorkerReceivesOnlyTheBlocksItLacks) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("tcp");
  ASSERT_TRUE(c.ok());
  auto p = encode(kPrompts[1]); // several blocks long
  c.send("p0", gen("t1", p, 6, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("t1", p, 6, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  Result first = collect(c, 1)["t1"];
  ASSERT_EQ(first.error, "") << first.message;
  c.send("p0", gen("t2", p, 6, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("t2", p, 6, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  Result again = collect(c, 1)["t2"];
  ASSERT_EQ(again.error, "") << again.message;
  EXPECT_EQ(again.tokens, first.tokens); // the same answer from the blocks d0 kept
  EXPECT_GT(first.kv_bytes, 0);
  EXPECT_LT(again.kv_bytes, first.kv_bytes); // only the blocks d0 did not hold crossed the wire
}

namespace {

// Waits for an error message about id from worker `from` (other messages are dropped); its code, "" on silence.
std::string error_from(Cluster &c, const std::string &from, const std::string &id, int timeout_ms,
                       std::string *message = nullptr) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < until) {
    ctl_event ev;
    if (ctl_hub_next(c.hub, &ev, 100) != 1) continue;
    std::string code;
    if (ev.msg && !strcmp(cJSON_GetObjectItem(ev.msg, "op")->valuestring, "error") && ev.peer == c.peers[from] &&
        id == cJSON_GetObjectItem(ev.msg, "id")->valuestring) {
      code = cJSON_GetObjectItem(ev.msg, "code")->valuestring;
      if (message) *message = cJSON_GetObjectItem(ev.msg, "message")->valuestring;
    }
    ctl_event_done(&ev);
    if (!code.empty()) return code;
  }
  return "";
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A generate the prefill worker refuses (here a malformed prefix hint) after the decode worker reserved blocks for
// it: the prefill worker's kv_fail frees them at once, not after the decode worker's handoff timeout (30 s here).
TEST(Disagg, RejectedGenerateAtPrefillFreesTheDecodeWorkersBlocksAtOnce) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("tcp");
  ASSERT_TRUE(c.ok());
  auto p = encode(kPrompts[1]);
  // Once first, so that p0 is linked to d0 (d0 sends a table only to a connected prefill worker).
  c.send("p0", gen("warm", p, 2, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("warm", p, 2, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  ASSERT_EQ(collect(c, 1)["warm"].error, "");
  int total = 0;
  for (int round = 0; round < 2; round++) {
    std::string id = "bad" + std::to_string(round);
    std::vector<int> q = p;
    q.push_back(100 + round); // not all cached at d0
    for (int i = 0; i < 40; i++) q.push_back(200 + i + round);
    c.send("d0", gen(id, q, 4, "\"mode\":\"decode\",\"prefill\":\"p0\""));
    for (int i = 0; i < 100; i++) { // d0 reserved the blocks (and sent its table)
      auto s = stats(c, "d0");
      if (s["waiting"] == 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    auto t0 = std::chrono::steady_clock::now();
    // round 0: a malformed prefix hint; round 1: a token id outside the vocabulary (the generate does not parse).
    std::vector<int> bad = q;
    if (round == 1) bad[3] = 1 << 30;
    c.send("p0", gen(id, bad, 4, round == 0 ? "\"mode\":\"prefill\",\"decode\":\"d0\",\"prefix_peer\":7,\"prefix_blocks\":1"
                                            : "\"mode\":\"prefill\",\"decode\":\"d0\""));
    std::string msg;
    EXPECT_EQ(error_from(c, "d0", id, 5000, &msg), "worker_failure") << c.logs();
    double dt = ms_since(t0);
    EXPECT_NE(msg.find("prefill failed"), std::string::npos) << msg;
    int f = free_blocks(c, "d0", &total);
    double dt_free = ms_since(t0);
    std::fprintf(stderr, "rejected generate %s: d0 failed it %.1f ms after p0 got it; blocks free by %.1f ms\n",
                 id.c_str(), dt, dt_free);
    EXPECT_EQ(f, total) << c.log("d0");
    EXPECT_LT(dt, 100.0 * DSERVE_TIMEOUT_SCALE) << "the kv_fail took too long";
  }
  int pt = 0;
  EXPECT_EQ(free_blocks(c, "p0", &pt), pt);
}

// p0 runs one sequence at a time: request b waits in its queue behind a long prompt for longer than d0's
// handoff_timeout_ms (+ 50 ms per prompt token). d0's KV timer starts at p0's kv_started, so b is served.
TEST(Disagg, RequestQueuedAtPrefillLongerThanTheHandoffTimeoutIsServed) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("tcp", {{"d0", "decode", "\"handoff_timeout_ms\": 100"},
                    {"p0", "prefill", "\"max_batch_tokens\": 32, \"max_seqs\": 1"}});
  ASSERT_TRUE(c.ok());
  // a: 1200 tokens (75 of the 87 blocks a 32 MiB pool holds); b: 4 tokens, so the old bound (100 ms + 50 ms a
  // token) is 300 ms, well below a's prefill on one thread however fast the kernels (1000 tokens and b's whole
  // prompt, a 900 ms bound, left a 5% margin once prefill got faster)
  std::vector<int> a(1200, 0);
  auto words = encode(kPrompts[1]);
  for (size_t i = 0; i < a.size(); i++) a[i] = words[i % words.size()];
  auto b = encode(kPrompts[0]);
  ASSERT_GE(b.size(), 4u);
  b.resize(4);
  const std::string dl = ",\"deadline_ms\":120000";
  auto t0 = std::chrono::steady_clock::now();
  c.send("d0", gen("a", a, 2, "\"mode\":\"decode\",\"prefill\":\"p0\"" + dl));
  c.send("p0", gen("a", a, 2, "\"mode\":\"prefill\",\"decode\":\"d0\"" + dl));
  c.send("d0", gen("b", b, 2, "\"mode\":\"decode\",\"prefill\":\"p0\"" + dl));
  c.send("p0", gen("b", b, 2, "\"mode\":\"prefill\",\"decode\":\"d0\"" + dl));
  auto r = collect(c, 2, 120000);
  double waited = ms_since(t0);
  EXPECT_EQ(r["a"].error, "") << r["a"].message;
  EXPECT_EQ(r["b"].error, "") << r["b"].message << "\n" << c.logs();
  EXPECT_FALSE(r["b"].tokens.empty());
  // The old bound (from d0's receipt of generate) would have failed b: check that b really waited past it.
  double old_bound = 100.0 * DSERVE_TIMEOUT_SCALE + 50.0 * (double)b.size();
  std::fprintf(stderr, "b finished after %.0f ms (the bound from d0's receipt would be %.0f ms)\n", waited, old_bound);
  EXPECT_GT(waited, old_bound) << "the long prompt was too quick to queue b past the old bound";
  int total = 0;
  EXPECT_EQ(free_blocks(c, "d0", &total), total);
  for (int i = 0; i < 50 && free_blocks(c, "p0", &total) != total; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(free_blocks(c, "p0", &total), total);
}

// d0 gives up on a handoff p0 holds (its deadline passes while p0 is stopped; the handoff timeout takes the same
// path, tests/timeouts checks its timing): d0 fails it to the router, sends kv_fail to p0 and keeps the blocks
// reserved, because p0 may hold the table and write, until p0 answers kv_freed (or min(handoff_timeout_ms, 5 s),
// 3 s here). p0, resumed, drops the request, answers, and d0 frees at once.
TEST(Disagg, GivingUpOnAHandoffSendsKvFailAndTheBlocksWaitForThePrefillWorkersAnswer) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("tcp", {{"d0", "decode", "\"handoff_timeout_ms\": 3000"}, {"p0", "prefill", "\"max_batch_tokens\": 32"}});
  ASSERT_TRUE(c.ok());
  auto p = encode(kPrompts[1]);
  c.send("p0", gen("warm", p, 2, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("warm", p, 2, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  ASSERT_EQ(collect(c, 1)["warm"].error, "");
  int total = 0;
  for (int i = 0; i < 50 && free_blocks(c, "p0", &total) != total; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto before = stats(c, "d0");
  kill(c.pids["p0"], SIGSTOP);
  std::vector<int> q = p;
  for (int i = 0; i < 40; i++) q.push_back(300 + i);
  auto t0 = std::chrono::steady_clock::now();
  c.send("d0", gen("t", q, 2, "\"mode\":\"decode\",\"prefill\":\"p0\",\"deadline_ms\":1000"));
  c.send("p0", gen("t", q, 2, "\"mode\":\"prefill\",\"decode\":\"d0\"")); // p0 waits for d0's word
  EXPECT_EQ(error_from(c, "d0", "t", 30000), "timeout") << c.logs();
  double dt = ms_since(t0);
  std::fprintf(stderr, "d0 gave up after %.0f ms (deadline 1000 ms)\n", dt);
  EXPECT_GE(dt, 950.0);
  auto s = stats(c, "d0");
  EXPECT_EQ(s["running"] + s["waiting"], 0);
  EXPECT_LT(s["free_blocks"], before["free_blocks"]) << "held until p0 answers\n" << c.logs();
  kill(c.pids["p0"], SIGCONT);
  auto t1 = std::chrono::steady_clock::now();
  int f = -1;
  for (int i = 0; i < 200 && (f = free_blocks(c, "d0", &total)) != total; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::fprintf(stderr, "d0 freed the held blocks %.0f ms after p0 resumed\n", ms_since(t1));
  EXPECT_EQ(f, total) << c.logs();
  EXPECT_LT(ms_since(t1), 1500.0); // p0's kv_freed, before the hold bound (3 s, scaled)
  auto ps = stats(c, "p0");
  EXPECT_EQ(ps["running"] + ps["waiting"], 0) << c.log("p0");
  EXPECT_EQ(free_blocks(c, "p0", &total), total) << c.log("p0");
  // The pair serves again.
  c.send("p0", gen("after", p, 2, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("after", p, 2, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  EXPECT_EQ(collect(c, 1)["after"].error, "");
}

} // namespace

// d0 dies and comes back on the same port. Generates for it meanwhile fail at p0 with code decode_failure (its
// reconnect is refused; the router sends those again once d0 is back), and each one after the first finds p0's link
// without a connection: p0 answered the first and then died of a NULL peer (a SIGSEGV in fault_test_kill's 1P1D
// run). Once d0 is back, p0 links to it again and serves.
TEST(Disagg, PrefillWorkerLinksAgainToARestartedDecodeWorker) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("shm", {{"d0", "decode", ""}, {"p0", "prefill", "\"max_batch_tokens\": 32"}});
  ASSERT_TRUE(c.ok());
  auto p = encode(kPrompts[0]);
  c.send("d0", gen("before", p, 6, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  c.send("p0", gen("before", p, 6, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  auto before = collect(c, 1)["before"];
  ASSERT_EQ(before.error, "") << before.message;
  kill(c.pids["d0"], SIGKILL);
  waitpid(c.pids["d0"], nullptr, 0);
  for (int i = 0; i < 3; i++) {
    std::string id = "down" + std::to_string(i);
    c.send("p0", gen(id, p, 6, "\"mode\":\"prefill\",\"decode\":\"d0\""));
    auto r = collect(c, 1, 10000);
    EXPECT_EQ(r[id].error, "decode_failure") << r[id].message << "\n" << c.log("p0");
    ASSERT_NE(waitpid(c.pids["p0"], nullptr, WNOHANG), c.pids["p0"]) << "p0 died\n" << c.log("p0");
  }
  c.restart("d0");
  ASSERT_NE(c.peers["d0"], nullptr);
  c.send("d0", gen("after", p, 6, "\"mode\":\"decode\",\"prefill\":\"p0\""));
  c.send("p0", gen("after", p, 6, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  auto after = collect(c, 1)["after"];
  EXPECT_EQ(after.error, "") << after.message << "\n" << c.log("p0");
  EXPECT_EQ(after.tokens, before.tokens);
}
