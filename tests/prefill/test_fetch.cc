// tests/prefill/test_fetch.cc: prefix fetch between real prefill workers: p0 pulls a prefix p1 computed, over kvxfer, instead of recomputing it.
#include <gtest/gtest.h>

#include "tests/cluster_util.h"

namespace {

using namespace dserve_test;

// Two prefill workers, a decode worker and a colocated worker without reuse (the reference output). The decode
// worker keeps no prefix cache, so every block of every prompt is pushed to it and decoding reads the fetched KV.
std::vector<WorkerSpec> fetch_workers() {
  return {{"d0", "decode", "\"prefix_cache_mb\": 0"},
          {"p0", "prefill", "\"max_batch_tokens\": 64"},
          {"p1", "prefill", "\"max_batch_tokens\": 64"},
          {"w0", "both", "\"prefix_cache_mb\": 0"}};
}

const char *kShared =
    "<|im_start|>system\nYou are a careful assistant. Answer in one short paragraph, cite no sources, and keep "
    "to the facts the user gives you. If something is unclear, say what is missing instead of guessing. The "
    "user is planning a trip through northern Italy by train and wants to know about cities, food and "
    "museums along the way.<|im_end|>\n<|im_start|>user\n";

std::vector<int> cat(std::vector<int> a, const std::vector<int> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Generates prompt on prefill worker p (with extra generate members, e.g. a prefix hint) and decode worker d0,
// and the same prompt on w0 (colocated, no reuse); both outputs must be equal and non-empty.
void expect_same_as_colocated(Cluster &c, const std::string &id, const std::string &p, const std::vector<int> &prompt,
                              const std::string &extra) {
  c.send("w0", gen("w" + id, prompt, 8, "\"mode\":\"local\""));
  c.send(p, gen(id, prompt, 8, "\"mode\":\"prefill\",\"decode\":\"d0\"" + extra));
  c.send("d0", gen(id, prompt, 8, "\"mode\":\"decode\",\"prefill\":\"" + p + "\""));
  auto r = collect(c, 2);
  EXPECT_EQ(r[id].error, "") << r[id].message << "\n" << c.logs();
  EXPECT_EQ(r["w" + id].error, "") << r["w" + id].message;
  EXPECT_FALSE(r[id].tokens.empty());
  EXPECT_EQ(r[id].tokens, r["w" + id].tokens) << id << "\n" << c.logs();
  EXPECT_EQ(r[id].text, r["w" + id].text);
}

std::string hint(const std::string &peer, int blocks) {
  return ",\"prefix_peer\":\"" + peer + "\",\"prefix_blocks\":" + std::to_string(blocks);
}

// p1 computes the shared prefix; p0, hinted, fetches it and computes only the suffix. Returns the prefix's
// full blocks.
int fetch_once(Cluster &c) {
  auto shared = encode(kShared);
  int k = (int)shared.size() / 16;
  EXPECT_GE(k, 4);
  c.send("p1", gen("a", shared, 2, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("a", shared, 2, "\"mode\":\"decode\",\"prefill\":\"p1\""));
  Result a = collect(c, 1)["a"];
  EXPECT_EQ(a.error, "") << a.message;
  auto q = cat(shared, encode("Which city should I visit first?<|im_end|>\n<|im_start|>assistant\n"));
  expect_same_as_colocated(c, "b", "p0", q, hint("p1", k));
  auto s0 = stats(c, "p0"), s1 = stats(c, "p1");
  EXPECT_EQ(s0["prefix_fetches"], 1);
  EXPECT_EQ(s0["prefix_fetched_blocks"], k) << c.logs();
  EXPECT_EQ(s0["prefix_fetch_misses"], 0);
  EXPECT_EQ(s1["prefix_served_blocks"], k);
  return k;
}

// Idle blocks return: nothing stays reserved for a fetch or pinned by one.
void expect_idle(Cluster &c, const std::string &who) {
  int total = 0, f = -1;
  for (int i = 0; i < 50 && (f = free_blocks(c, who, &total)) != total; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(f, total) << who;
}

TEST(Fetch, PrefillWorkerFetchesAPeersPrefixOverTcp) {
  if (access(model_path(), R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("tcp", fetch_workers());
  ASSERT_TRUE(c.ok());
  int k = fetch_once(c);

  // The fetched blocks joined p0's own store: a later prompt with that prefix reuses them without a hint, and a
  // hint for what p0 already holds asks nobody.
  double hits = stats(c, "p0")["prefix_hits"];
  auto q2 = cat(encode(kShared), encode("Is Milan worth a day?<|im_end|>\n<|im_start|>assistant\n"));
  expect_same_as_colocated(c, "c", "p0", q2, "");
  expect_same_as_colocated(c, "c2", "p0", q2, hint("p1", k));
  auto s0 = stats(c, "p0");
  EXPECT_GE(s0["prefix_hits"] - hits, 2.0 * k * 16);
  EXPECT_EQ(s0["prefix_fetches"], 1);

  // The peer no longer holds the prefix (evicted, or the router's index was stale): p0 computes it.
  auto cold = encode("<|im_start|>user\nThe Danube flows through ten countries before it reaches the Black Sea, "
                     "passing Vienna, Bratislava, Budapest and Belgrade. Name three bridges that cross it and say "
                     "when each one was built.<|im_end|>\n<|im_start|>assistant\n");
  expect_same_as_colocated(c, "d", "p0", cold, hint("p1", (int)cold.size() / 16));
  s0 = stats(c, "p0");
  EXPECT_EQ(s0["prefix_fetches"], 2);
  EXPECT_EQ(s0["prefix_fetch_misses"], 1);
  EXPECT_EQ(s0["prefix_fetched_blocks"], k);

  // A hint that names no other prefill worker is ignored, and a malformed one refused.
  auto other = encode("<|im_start|>user\nA short question about the trains from Verona to Venice: how long?<|im_end|>\n");
  expect_same_as_colocated(c, "e", "p0", other, hint("d0", 1));
  c.send("p0", gen("f", other, 2, "\"mode\":\"prefill\",\"decode\":\"d0\",\"prefix_peer\":7,\"prefix_blocks\":1"));
  Result f = collect(c, 1)["f"];
  EXPECT_NE(f.error, "");
  EXPECT_NE(f.message.find("prefix_peer"), std::string::npos) << f.message;

  // The peer is stalled (SIGSTOP): p0 stops waiting after its fetch timeout and computes; the blocks it reserved
  // for the peer stay reserved until the peer, resumed, answers (it may still write them).
  auto late = encode("<|im_start|>user\nList the stations between Bologna and Florence on the old mountain line, "
                     "and say which of them has a buffet open in the evening.<|im_end|>\n<|im_start|>assistant\n");
  int kl = ((int)late.size() - 1) / 16;
  c.send("p1", gen("l1", late, 2, "\"mode\":\"prefill\",\"decode\":\"d0\""));
  c.send("d0", gen("l1", late, 2, "\"mode\":\"decode\",\"prefill\":\"p1\""));
  ASSERT_EQ(collect(c, 1)["l1"].error, "");
  kill(c.pids["p1"], SIGSTOP);
  expect_same_as_colocated(c, "l2", "p0", late, hint("p1", kl));
  EXPECT_GE(kl, 2);
  int total = 0, idle = -1;
  for (int i = 0; i < 50 && (idle = free_blocks(c, "p0", &total)) != total - kl; i++) // l2's writes finishing
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(idle, total - kl); // reserved for the stalled peer
  kill(c.pids["p1"], SIGCONT);
  expect_idle(c, "p0");
  s0 = stats(c, "p0");
  EXPECT_EQ(s0["prefix_fetches"], 3);
  EXPECT_EQ(s0["prefix_fetch_misses"], 2);
  EXPECT_EQ(s0["prefix_fetched_blocks"], k);

  // The peer is dead: p0 computes at once (the connection is refused; nothing waits for the fetch timeout).
  kill(c.pids["p1"], SIGKILL);
  waitpid(c.pids["p1"], nullptr, 0);
  c.pids["p1"] = -1;
  auto later = cat(encode(kShared), encode("And the best museum in Turin?<|im_end|>\n<|im_start|>assistant\n"));
  auto t0 = std::chrono::steady_clock::now();
  auto fresh = encode("<|im_start|>user\nWrite four lines about the sea at night, the lighthouse on the cliff, the "
                      "fishing boats coming home and the gulls asleep on the harbour wall.<|im_end|>\n");
  expect_same_as_colocated(c, "g", "p0", fresh, hint("p1", (int)fresh.size() / 16));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  expect_same_as_colocated(c, "h", "p0", later, hint("p1", k)); // p0 holds this prefix itself now
  s0 = stats(c, "p0");
  EXPECT_EQ(s0["prefix_fetches"], 4);
  EXPECT_EQ(s0["prefix_fetch_misses"], 3);
  expect_idle(c, "p0");
  expect_idle(c, "d0");
}

TEST(Fetch, PrefillWorkerFetchesAPeersPrefixOverShm) {
  if (access(model_path(), R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c("shm", fetch_workers());
  ASSERT_TRUE(c.ok());
  fetch_once(c);
  expect_idle(c, "p0");
  expect_idle(c, "p1");
}

} // namespace

// Host staging (kv/stage.h) forced on for every pool: p1 copies the prefix into its mirror and writes it
// from there into p0's mirror, p0 copies it into its pool when it resumes; then p0 pushes to d0 the same way.
// No pool is registered with kvxfer, so equal output means the fetched KV came through both mirrors.
TEST(Fetch, FetchThroughHostStagingEqualsColocated) {
  if (access(model_path(), R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  auto w = fetch_workers();
  for (auto &s : w)
    if (s.role != "both") s.kvx = "\"staging\": \"on\"";
  Cluster c("tcp", w);
  ASSERT_TRUE(c.ok());
  fetch_once(c);
  expect_idle(c, "p0");
  expect_idle(c, "p1");
}
