// tests/prefill/test_disagg.cc: a real prefill worker pushing KV into a real decode worker, driven as the router.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "server/hub.h"
#include "tests/model_tokens.h"

namespace {

const char *kModel = dserve_test::model_path();

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, (sockaddr *)&a, sizeof a);
  socklen_t l = sizeof a;
  getsockname(fd, (sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

pid_t spawn(const std::string &role, const std::string &cfg, const std::string &name, const std::string &log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    execl(DSERVE_BINARY, "dserve", role.c_str(), "--config", cfg.c_str(), "--name", name.c_str(), (char *)nullptr);
    _exit(127);
  }
  return pid;
}

// p0 (prefill), d0 (decode) and w0 (both) on fixed free ports; a hub connected to each as the router.
struct Cluster {
  std::string dir, backend;
  std::map<std::string, pid_t> pids;
  std::map<std::string, int> ports;
  srv_hub *hub = nullptr;
  std::map<std::string, srv_peer *> peers;

  explicit Cluster(const std::string &kvx_backend) : backend(kvx_backend) {
    char tmpl[] = "/tmp/dserve-disagg-XXXXXX";
    dir = mkdtemp(tmpl);
    for (auto n : {"p0", "d0", "w0"}) ports[n] = free_port();
    std::ofstream(dir + "/c.json")
        << "{\"model\": \"" << kModel << "\", \"workers\": ["
        << "{\"name\": \"p0\", \"role\": \"prefill\", \"port\": " << ports["p0"]
        << ", \"threads\": 1, \"kv_budget_mb\": 32, \"max_batch_tokens\": 32, \"kvxfer\": {\"backend\": \"" << backend
        << "\"}},"
        << "{\"name\": \"d0\", \"role\": \"decode\", \"port\": " << ports["d0"]
        << ", \"threads\": 1, \"kv_budget_mb\": 32, \"kvxfer\": {\"backend\": \"" << backend << "\"}},"
        << "{\"name\": \"w0\", \"role\": \"both\", \"port\": " << ports["w0"] << ", \"threads\": 1, \"kv_budget_mb\": 32}]}";
    std::string cfg = dir + "/c.json";
    pids["d0"] = spawn("decode", cfg, "d0", dir + "/d0.log");
    pids["p0"] = spawn("prefill", cfg, "p0", dir + "/p0.log");
    pids["w0"] = spawn("both", cfg, "w0", dir + "/w0.log");
    char err[256];
    srv_hub_opts o = {};
    o.name = "router";
    o.role = "router";
    EXPECT_EQ(srv_hub_new(&o, &hub, err, sizeof err), 0) << err;
    for (auto n : {"d0", "p0", "w0"}) {
      srv_peer *p = nullptr;
      for (int i = 0; i < 300 && !p; i++) { // model loading takes a moment
        if (waitpid(pids[n], nullptr, WNOHANG) == pids[n]) {
          pids[n] = -1; // it died: its log says why
          break;
        }
        p = srv_hub_connect(hub, "127.0.0.1", ports[n], 1000, err, sizeof err);
        if (!p) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      EXPECT_NE(p, nullptr) << n << ": " << err << "\n" << log(n);
      peers[n] = p;
    }
  }
  ~Cluster() {
    for (auto &p : peers)
      if (p.second) srv_peer_unref(p.second);
    srv_hub_free(hub);
    for (auto &p : pids) {
      if (p.second <= 0) continue;
      kill(p.second, SIGKILL);
      waitpid(p.second, nullptr, 0);
    }
    for (auto n : {"p0", "d0", "w0"}) unlink((dir + "/" + n + ".log").c_str());
    unlink((dir + "/c.json").c_str());
    rmdir(dir.c_str());
  }
  bool ok() const {
    for (auto &p : peers)
      if (!p.second) return false;
    return true;
  }
  std::string log(const std::string &n) {
    std::ifstream f(dir + "/" + n + ".log");
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  void send(const std::string &to, const std::string &json) {
    cJSON *m = cJSON_Parse(json.c_str());
    ASSERT_NE(m, nullptr) << json;
    ASSERT_EQ(srv_peer_send(peers[to], m), 0);
    cJSON_Delete(m);
  }
};

struct Result {
  std::vector<int> tokens;
  std::string text, finish, error, message;
  double kv_bytes = 0;
};

std::map<std::string, Result> collect(Cluster &c, int n, int timeout_ms = 60000) {
  std::map<std::string, Result> out;
  int finished = 0;
  while (finished < n) {
    srv_event ev;
    if (srv_hub_next(c.hub, &ev, timeout_ms) != 1) {
      ADD_FAILURE() << "silence\n" << c.log("p0") << c.log("d0");
      break;
    }
    if (!ev.msg) {
      srv_event_done(&ev);
      continue;
    }
    std::string op = cJSON_GetObjectItem(ev.msg, "op")->valuestring;
    const cJSON *id = cJSON_GetObjectItem(ev.msg, "id");
    Result &r = out[cJSON_IsString(id) ? id->valuestring : ""];
    if (op == "token") {
      r.text += cJSON_GetObjectItem(ev.msg, "text")->valuestring;
      const cJSON *t;
      cJSON_ArrayForEach(t, cJSON_GetObjectItem(ev.msg, "tokens")) r.tokens.push_back(t->valueint);
    } else if (op == "done") {
      r.finish = cJSON_GetObjectItem(ev.msg, "finish_reason")->valuestring;
      r.kv_bytes = cJSON_GetObjectItem(ev.msg, "kv_bytes")->valuedouble;
      finished++;
    } else if (op == "error") {
      r.error = cJSON_GetObjectItem(ev.msg, "code")->valuestring;
      r.message = cJSON_GetObjectItem(ev.msg, "message")->valuestring;
      finished++;
    }
    srv_event_done(&ev);
  }
  return out;
}

using dserve_test::encode;

std::string gen(const std::string &id, const std::vector<int> &prompt, int max_tokens, const std::string &mode) {
  std::string s = "{\"op\":\"generate\",\"id\":\"" + id + "\",\"max_tokens\":" + std::to_string(max_tokens) +
                  ",\"sampling\":{\"temperature\":0}," + mode + ",\"prompt\":[";
  for (size_t i = 0; i < prompt.size(); i++) s += (i ? "," : "") + std::to_string(prompt[i]);
  return s + "]}";
}

int free_blocks(Cluster &c, const std::string &who, int *total) {
  c.send(who, "{\"op\":\"stats\"}");
  for (;;) {
    srv_event ev;
    if (srv_hub_next(c.hub, &ev, 10000) != 1) return -1;
    if (ev.msg && !strcmp(cJSON_GetObjectItem(ev.msg, "op")->valuestring, "stats_ok")) {
      // Blocks the prefix cache keeps for later requests count as idle: nobody is using them.
      int f = cJSON_GetObjectItem(ev.msg, "free_blocks")->valueint +
              cJSON_GetObjectItem(ev.msg, "prefix_cached_blocks")->valueint;
      *total = cJSON_GetObjectItem(ev.msg, "total_blocks")->valueint;
      srv_event_done(&ev);
      return f;
    }
    srv_event_done(&ev);
  }
}

const char *kPrompts[] = {
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The history of the Roman Empire spans many centuries. It began when Augustus became the first emperor "
    "and continued through periods of expansion, crisis and reform. Historians often divide it into",
    "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n"};

void disagg_equals_colocated(const std::string &backend) {
  if (access(kModel, R_OK)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  Cluster c(backend);
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
