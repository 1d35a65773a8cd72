// tests/decode/test_worker.cc: a real `dserve both` process driven over the control protocol.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ctl/hub.h"
#include "tests/cluster_util.h"
#include "tests/model_tokens.h"
#include "tests/test_secret.h"

namespace {

const char *kModel = dserve_test::model_path();

// A `dserve both` worker w0 (2 threads, kv_mb MiB, max_seqs, max_batch_tokens 64, plus extra JSON members): the one
// C++ cluster helper (tests/cluster_util.h) with one worker, its hub playing the router.
dserve_test::WorkerSpec both_spec(double kv_mb, int max_seqs, const std::string &extra) {
  dserve_test::WorkerSpec w("w0", "both", "\"max_seqs\": " + std::to_string(max_seqs) + ", \"max_batch_tokens\": 64" + extra);
  w.threads = 2;
  w.kv_mb = kv_mb;
  return w;
}

struct Worker : dserve_test::Cluster {
  ctl_peer *peer; // (borrowed from peers) w0's control link

  explicit Worker(double kv_mb = 64, int max_seqs = 16, const std::string &extra = "")
      : Cluster("tcp", {both_spec(kv_mb, max_seqs, extra)}), peer(peers["w0"]) {}

  void send(const std::string &json) { Cluster::send("w0", json); }
  // The next message from the worker (skipping none), or nullptr after timeout.
  cJSON *next(int timeout_ms = 60000) {
    ctl_event ev;
    if (ctl_hub_next(hub, &ev, timeout_ms) != 1) return nullptr;
    cJSON *m = ev.msg;
    ev.msg = nullptr;
    ctl_event_done(&ev);
    return m;
  }
};

struct Result {
  std::vector<int> tokens;
  std::vector<std::string> pieces; // the text of each token message that carried a token, in order
  std::string text, finish, error_code;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// Collects every request's stream until each has its done or error.
std::map<std::string, Result> collect(Worker &w, int n_requests) {
  std::map<std::string, Result> out;
  int finished = 0;
  while (finished < n_requests) {
    cJSON *m = w.next();
    if (!m) {
      ADD_FAILURE() << "worker went silent";
      break;
    }
    std::string op = cJSON_GetObjectItem(m, "op")->valuestring;
    const cJSON *id = cJSON_GetObjectItem(m, "id");
    Result &r = out[id && cJSON_IsString(id) ? id->valuestring : ""];
    auto token = [&out](const cJSON *tm) { // a token message, or one item of a token_batch (protocol version 3)
      const cJSON *tid = cJSON_GetObjectItem(tm, "id");
      Result &tr = out[tid && cJSON_IsString(tid) ? tid->valuestring : ""];
      tr.text += cJSON_GetObjectItem(tm, "text")->valuestring;
      if (cJSON_GetArraySize(cJSON_GetObjectItem(tm, "tokens")) > 0)
        tr.pieces.push_back(cJSON_GetObjectItem(tm, "text")->valuestring);
      const cJSON *t;
      cJSON_ArrayForEach(t, cJSON_GetObjectItem(tm, "tokens")) tr.tokens.push_back(t->valueint);
    };
    if (op == "token") {
      token(m);
    } else if (op == "token_batch") {
      const cJSON *item;
      cJSON_ArrayForEach(item, cJSON_GetObjectItem(m, "items")) token(item);
    } else if (op == "done") {
      r.finish = cJSON_GetObjectItem(m, "finish_reason")->valuestring;
      r.prompt_tokens = cJSON_GetObjectItem(m, "prompt_tokens")->valueint;
      r.completion_tokens = cJSON_GetObjectItem(m, "completion_tokens")->valueint;
      r.cached_tokens = cJSON_GetObjectItem(m, "cached_tokens")->valueint;
      finished++;
    } else if (op == "error") {
      r.error_code = cJSON_GetObjectItem(m, "code")->valuestring;
      finished++;
    }
    cJSON_Delete(m);
  }
  return out;
}

using dserve_test::encode;

std::string generate_json(const std::string &id, const std::vector<int> &prompt, int max_tokens,
                          const std::string &extra = "") {
  std::string s = "{\"op\":\"generate\",\"id\":\"" + id + "\",\"max_tokens\":" + std::to_string(max_tokens) +
                  ",\"sampling\":{\"temperature\":0},\"prompt\":[";
  for (size_t i = 0; i < prompt.size(); i++) s += (i ? "," : "") + std::to_string(prompt[i]);
  return s + "]" + extra + "}";
}

int free_blocks(Worker &w, int *total) {
  w.send("{\"op\":\"stats\"}");
  for (;;) {
    cJSON *m = w.next(10000);
    if (!m) return -1;
    if (!strcmp(cJSON_GetObjectItem(m, "op")->valuestring, "stats_ok")) {
      // Blocks the prefix cache keeps for later requests count as idle: nobody is using them.
      int f = cJSON_GetObjectItem(m, "free_blocks")->valueint + cJSON_GetObjectItem(m, "prefix_cached_blocks")->valueint;
      *total = cJSON_GetObjectItem(m, "total_blocks")->valueint;
      cJSON_Delete(m);
      return f;
    }
    cJSON_Delete(m);
  }
}

} // namespace

TEST(Worker, ModelIsPresent) {
  ASSERT_EQ(access(kModel, R_OK), 0) << kModel << " is missing: run scripts/setup.sh";
}

TEST(Worker, ConcurrentGreedyEqualsSequentialAndFreesBlocks) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing (see ModelIsPresent)";
  Worker w;
  ASSERT_NE(w.peer, nullptr);
  const char *prompts[] = {"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
                           "The quick brown fox", "def fibonacci(n):", "1, 2, 3, 4,"};
  std::map<std::string, Result> alone;
  for (int i = 0; i < 4; i++) {
    w.send(generate_json("a" + std::to_string(i), encode(prompts[i]), 16));
    auto r = collect(w, 1);
    alone.insert(r.begin(), r.end());
  }
  for (int i = 0; i < 4; i++) w.send(generate_json("b" + std::to_string(i), encode(prompts[i]), 16));
  auto together = collect(w, 4);
  for (int i = 0; i < 4; i++) {
    const Result &a = alone["a" + std::to_string(i)], &b = together["b" + std::to_string(i)];
    EXPECT_EQ(a.error_code, "");
    EXPECT_FALSE(a.tokens.empty());
    EXPECT_EQ(a.tokens, b.tokens) << prompts[i];
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(a.completion_tokens, (int)a.tokens.size());
    EXPECT_EQ(a.prompt_tokens, (int)encode(prompts[i]).size());
    EXPECT_TRUE(a.finish == "length" || a.finish == "stop");
  }
  EXPECT_NE(alone["a0"].text.find("Paris"), std::string::npos) << alone["a0"].text;
  int total = 0;
  EXPECT_EQ(free_blocks(w, &total), total);
}

TEST(Worker, StopStringEndsTheChoiceWithoutItsText) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing (see ModelIsPresent)";
  Worker w;
  ASSERT_NE(w.peer, nullptr);
  auto p = encode("1, 2, 3, 4,");
  w.send(generate_json("free", p, 16));
  std::string full = collect(w, 1)["free"].text;
  ASSERT_GE(full.size(), 4u);
  std::string stop = full.substr(2, 2); // somewhere inside the greedy continuation
  w.send(generate_json("s", p, 16, ",\"stop\":[\"" + stop + "\"]"));
  Result r = collect(w, 1)["s"];
  EXPECT_EQ(r.finish, "stop");
  EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
}

// A stream moved here mid-way (generate `resume`: the prompt ends with the choice's own first k tokens) continues
// exactly as the worker that started it would have: same seeded draws, same penalties, the text not yet sent.
TEST(Worker, ResumedStreamContinuesTheSameSampledText) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing (see ModelIsPresent)";
  Worker w;
  ASSERT_NE(w.peer, nullptr);
  auto p = encode("<|im_start|>user\nWrite a poem about the sea.<|im_end|>\n<|im_start|>assistant\n");
  const std::string sampling = R"(,"sampling":{"temperature":0.9,"top_k":40,"top_p":0.95,"seed":7,)"
                               R"("presence_penalty":0.5,"repetition_penalty":1.1})";
  auto gen = [&](const std::string &id, const std::vector<int> &prompt, const std::string &extra) {
    std::string j = generate_json(id, prompt, 24, extra);
    size_t at = j.find(",\"sampling\":{\"temperature\":0}");
    j.replace(at, strlen(",\"sampling\":{\"temperature\":0}"), sampling);
    w.send(j);
    return collect(w, 1)[id];
  };
  Result full = gen("full", p, ",\"ignore_eos\":true");
  ASSERT_EQ(full.tokens.size(), 24u);
  for (int k : {1, 5, 17}) {
    std::vector<int> q = p;
    q.insert(q.end(), full.tokens.begin(), full.tokens.begin() + k);
    std::string sent;
    for (int i = 0; i < k; i++) sent += full.pieces[(size_t)i];
    Result r = gen("r" + std::to_string(k), q, ",\"ignore_eos\":true,\"resume\":" + std::to_string(k));
    EXPECT_EQ(r.error_code, "");
    EXPECT_EQ(r.tokens, std::vector<int>(full.tokens.begin() + k, full.tokens.end())) << "resumed after " << k;
    EXPECT_EQ(sent + r.text, full.text) << "resumed after " << k;
    EXPECT_EQ(r.completion_tokens, 24);
    EXPECT_EQ(r.finish, "length");
  }
  // A resumed text that already ends in a stop string: done at once, nothing more sent.
  int k = 8;
  while (k < 24 && full.pieces[(size_t)k - 1].find_first_not_of(" \n") == std::string::npos) k++;
  ASSERT_LT(k, 24);
  std::vector<int> q = p;
  q.insert(q.end(), full.tokens.begin(), full.tokens.begin() + k);
  cJSON *stop = cJSON_CreateString(full.pieces[(size_t)k - 1].c_str());
  char *sj = cJSON_PrintUnformatted(stop);
  Result r = gen("stopped", q, std::string(",\"stop\":[") + sj + "],\"resume\":" + std::to_string(k));
  free(sj);
  cJSON_Delete(stop);
  EXPECT_EQ(r.finish, "stop");
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(r.tokens.empty());
  // Bad resume values are refused.
  w.send(generate_json("e1", p, 8, ",\"resume\":" + std::to_string(p.size())));
  w.send(generate_json("e2", q, 4, ",\"resume\":" + std::to_string(k)));
  auto e = collect(w, 2);
  EXPECT_EQ(e["e1"].error_code, "invalid_request");
  EXPECT_EQ(e["e2"].error_code, "invalid_request");
  int total = 0;
  EXPECT_EQ(free_blocks(w, &total), total);
}

TEST(Worker, BadRequestsGetErrorsAndTheWorkerKeepsServing) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing (see ModelIsPresent)";
  Worker w;
  ASSERT_NE(w.peer, nullptr);
  w.send("{\"op\":\"generate\",\"id\":\"e1\",\"prompt\":[]}");
  w.send("{\"op\":\"generate\",\"id\":\"e2\",\"prompt\":[99999999]}");
  w.send("{\"op\":\"generate\",\"id\":\"e3\",\"prompt\":[1],\"max_tokens\":-4}");
  std::vector<int> huge(9000, 42);
  w.send(generate_json("e4", huge, 4));
  auto r = collect(w, 4);
  EXPECT_EQ(r["e1"].error_code, "invalid_request");
  EXPECT_EQ(r["e2"].error_code, "invalid_request");
  EXPECT_EQ(r["e3"].error_code, "invalid_request");
  EXPECT_EQ(r["e4"].error_code, "context_length_exceeded");
  w.send(generate_json("ok", encode("Hello"), 4));
  EXPECT_EQ(collect(w, 1)["ok"].completion_tokens, 4);
}

TEST(Worker, CancelAndDisconnectFreeBlocks) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing (see ModelIsPresent)";
  Worker w;
  ASSERT_NE(w.peer, nullptr);
  int total = 0;
  ASSERT_GT(free_blocks(w, &total), 0);
  w.send(generate_json("c", encode("Tell me a long story about a dragon."), 400, ",\"ignore_eos\":true"));
  cJSON *m = w.next(); // the first token shows the request is running
  ASSERT_NE(m, nullptr);
  EXPECT_STREQ(cJSON_GetObjectItem(m, "op")->valuestring, "token_batch"); // a step's tokens (protocol version 3)
  cJSON_Delete(m);
  w.send("{\"op\":\"cancel\",\"id\":\"c\"}");
  // Messages already in flight may still arrive; the free count returns to the total.
  int f = -1;
  for (int i = 0; i < 50 && f != total; i++) f = free_blocks(w, &total);
  EXPECT_EQ(f, total);
}

TEST(Worker, SmallPoolPreemptsAndStillFinishesEveryone) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing (see ModelIsPresent)";
  Worker w(1.5 /* MiB: a few blocks */, 8);
  ASSERT_NE(w.peer, nullptr);
  auto p = encode("Once upon a time");
  for (int i = 0; i < 4; i++) w.send(generate_json("p" + std::to_string(i), p, 30, ",\"ignore_eos\":true"));
  auto r = collect(w, 4);
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(r["p" + std::to_string(i)].error_code, "");
    EXPECT_EQ(r["p" + std::to_string(i)].tokens, r["p0"].tokens); // same prompt, greedy: same output
  }
  int total = 0;
  EXPECT_EQ(free_blocks(w, &total), total);
}

TEST(Worker, RepeatedPrefixIsReusedAndGivesTheSameTokens) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing (see ModelIsPresent)";
  Worker w;
  ASSERT_NE(w.peer, nullptr);
  std::string system = "<|im_start|>system\nYou are a careful assistant. Answer in one short sentence, and never "
                       "use more words than needed. Be friendly.<|im_end|>\n";
  auto a = encode(system + "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n");
  auto b = encode(system + "<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n");
  w.send(generate_json("first", a, 8));
  Result first = collect(w, 1)["first"];
  EXPECT_EQ(first.cached_tokens, 0);
  w.send(generate_json("again", a, 8));
  Result again = collect(w, 1)["again"];
  EXPECT_EQ(again.tokens, first.tokens); // reuse never changes a greedy answer
  EXPECT_GE(again.cached_tokens, (int)a.size() - 16);
  EXPECT_EQ(again.cached_tokens % 16, 0); // whole blocks
  w.send(generate_json("other", b, 8)); // shares only the system prompt's blocks
  Result other = collect(w, 1)["other"];
  EXPECT_GT(other.cached_tokens, 0);
  EXPECT_LT(other.cached_tokens, (int)b.size());
}

TEST(Worker, EvictedPrefixIsReadBackFromHostMemory) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing (see ModelIsPresent)";
  // 8 pool blocks, of which the cache may keep 2; a host-DRAM tier catches what the pool evicts.
  Worker w(3.0, 4, ", \"prefix_cache_mb\": 0.75, \"prefix_host_mb\": 4");
  ASSERT_NE(w.peer, nullptr);
  auto a = encode("The history of the Roman Empire spans many centuries. It began when Augustus became the first "
                  "emperor and continued through periods of expansion, crisis and reform. Historians often divide it "
                  "into the Principate and the Dominate.");
  ASSERT_GT(a.size(), 32u);
  w.send(generate_json("a1", a, 4));
  Result first = collect(w, 1)["a1"];
  for (const char *other : {"A completely different text about the ocean and its many creatures, deep and wide.",
                            "Yet another passage, this one on mountains, rivers, valleys and the weather there."}) {
    w.send(generate_json("o", encode(other), 4));
    collect(w, 1);
  }
  w.send(generate_json("a2", a, 4));
  Result again = collect(w, 1)["a2"];
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_GE(again.cached_tokens, 32); // whole blocks came back from host memory instead of being recomputed
}
