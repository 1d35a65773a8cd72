// tests/cluster_util.h: the C++ tests' one cluster helper: real worker processes on loopback (from one generated config),
// driven by a hub that plays the router (tests/prefill, tests/decode).
#ifndef DSERVE_TESTS_CLUSTER_UTIL_H
#define DSERVE_TESTS_CLUSTER_UTIL_H

#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ctl/hub.h"
#include "tests/model_tokens.h"
#include "tests/test_secret.h"

namespace dserve_test {

// A free TCP port on 127.0.0.1, drawn below the kernel's ephemeral range: a port bound to 0 comes from that range,
// where any outgoing connection (another test's client) may take it before the worker binds it.
inline int free_port() {
  static std::mutex mu;
  static std::vector<int> given; // never the same port twice in one process (a cluster's ports must differ)
  std::lock_guard<std::mutex> lock(mu);
  int lo = 10000, hi = 32768;
  if (FILE *f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &hi) != 1) hi = 32768;
    std::fclose(f);
  }
  if (hi - lo < 1000) lo = 1024, hi = 65536;
  std::mt19937 rng((unsigned)getpid() * 2654435761u ^ (unsigned)time(nullptr) ^ (unsigned)given.size() * 40503u);
  for (;;) {
    int port = lo + (int)(rng() % (unsigned)(hi - lo));
    if (std::find(given.begin(), given.end(), port) != given.end()) continue;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    int ok = bind(fd, (sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) {
      given.push_back(port);
      return port;
    }
  }
}

inline pid_t spawn(const std::string &role, const std::string &cfg, const std::string &name, const std::string &log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    execl(DSERVE_BINARY, "dserve", role.c_str(), "--config", cfg.c_str(), "--name", name.c_str(), (char *)nullptr);
    _exit(127);
  }
  return pid;
}

// One worker of the generated config: `threads` threads, a pool of `kv_mb` MiB, plus extra (more JSON members, e.g.
// "\"max_batch_tokens\": 32") and kvx (more members of its kvxfer object, e.g. "\"staging\": \"on\"").
struct WorkerSpec {
  std::string name, role, extra, kvx;
  int threads = 1;
  double kv_mb = 32;
  WorkerSpec(std::string n, std::string r, std::string e = "", std::string k = "")
      : name(std::move(n)), role(std::move(r)), extra(std::move(e)), kvx(std::move(k)) {}
};

inline std::vector<WorkerSpec> default_workers() {
  return {{"d0", "decode", ""}, {"p0", "prefill", "\"max_batch_tokens\": 32"}, {"w0", "both", ""}};
}

// The workers on fixed free ports (kvxfer over backend for prefill and decode workers); a hub connected to
// each as the router.
struct Cluster {
  std::string dir, backend;
  std::vector<WorkerSpec> specs;
  std::map<std::string, pid_t> pids;
  std::map<std::string, int> ports;
  ctl_hub *hub = nullptr;
  std::map<std::string, ctl_peer *> peers;

  explicit Cluster(const std::string &kvx_backend, std::vector<WorkerSpec> workers = default_workers())
      : backend(kvx_backend), specs(std::move(workers)) {
    char tmpl[] = "/tmp/dserve-disagg-XXXXXX";
    dir = mkdtemp(tmpl);
    std::string js = "{\"model\": \"" + std::string(model_path()) + "\", \"secret\": \"" DSERVE_TEST_SECRET "\", \"workers\": [";
    for (size_t i = 0; i < specs.size(); i++) {
      const WorkerSpec &s = specs[i];
      ports[s.name] = free_port();
      js += std::string(i ? "," : "") + "{\"name\": \"" + s.name + "\", \"role\": \"" + s.role +
            "\", \"port\": " + std::to_string(ports[s.name]) + ", \"threads\": " + std::to_string(s.threads) +
            ", \"kv_budget_mb\": " + std::to_string(s.kv_mb);
      if (s.role != "both") js += ", \"kvxfer\": {\"backend\": \"" + backend + "\"" + (s.kvx.empty() ? "" : ", " + s.kvx) + "}";
      if (!s.extra.empty()) js += ", " + s.extra;
      js += "}";
    }
    std::ofstream(dir + "/c.json") << js << "]}";
    std::string cfg = dir + "/c.json";
    for (auto &s : specs) pids[s.name] = spawn(s.role, cfg, s.name, dir + "/" + s.name + ".log");
    char err[256];
    ctl_hub_opts o = {};
    o.name = "router";
    o.role = "router";
    o.secret = DSERVE_TEST_SECRET;
    EXPECT_EQ(ctl_hub_new(&o, &hub, err, sizeof err), 0) << err;
    for (auto &s : specs) connect(s.name);
  }
  // Connects the router's hub to worker n (waiting while its model loads), replacing any earlier connection.
  void connect(const std::string &n) {
    char err[256] = "";
    if (peers[n]) ctl_peer_unref(peers[n]);
    ctl_peer *p = nullptr;
    for (int i = 0; i < 300 && !p; i++) { // model loading takes a moment
      if (waitpid(pids[n], nullptr, WNOHANG) == pids[n]) {
        pids[n] = -1; // it died: its log says why
        break;
      }
      p = ctl_hub_connect(hub, n.c_str(), "127.0.0.1", ports[n], 1000, err, sizeof err);
      if (!p) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_NE(p, nullptr) << n << ": " << err << "\n" << log(n);
    peers[n] = p;
  }
  // Starts worker n again (after it died or was killed and reaped) on its port, and connects to it.
  void restart(const std::string &n) {
    for (auto &s : specs)
      if (s.name == n) pids[n] = spawn(s.role, dir + "/c.json", n, dir + "/" + n + ".log");
    connect(n);
  }
  ~Cluster() {
    for (auto &p : peers)
      if (p.second) ctl_peer_unref(p.second);
    ctl_hub_free(hub);
    for (auto &p : pids) {
      if (p.second <= 0) continue;
      kill(p.second, SIGKILL);
      waitpid(p.second, nullptr, 0);
    }
    for (auto &s : specs) unlink((dir + "/" + s.name + ".log").c_str());
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
  std::string logs() {
    std::string s;
    for (auto &w : specs) s += "--- " + w.name + "\n" + log(w.name);
    return s;
  }
  void send(const std::string &to, const std::string &json) {
    cJSON *m = cJSON_Parse(json.c_str());
    ASSERT_NE(m, nullptr) << json;
    ASSERT_EQ(ctl_peer_send(peers[to], m), 0);
    cJSON_Delete(m);
  }
};

struct Result {
  std::vector<int> tokens;
  std::string text, finish, error, message;
  double kv_bytes = 0;
};

// Reads token / done / error messages until n requests finished (other messages are dropped).
inline std::map<std::string, Result> collect(Cluster &c, int n, int timeout_ms = 60000) {
  std::map<std::string, Result> out;
  int finished = 0;
  while (finished < n) {
    ctl_event ev;
    if (ctl_hub_next(c.hub, &ev, timeout_ms) != 1) {
      ADD_FAILURE() << "silence\n" << c.logs();
      break;
    }
    if (!ev.msg) {
      ctl_event_done(&ev);
      continue;
    }
    std::string op = cJSON_GetObjectItem(ev.msg, "op")->valuestring;
    const cJSON *id = cJSON_GetObjectItem(ev.msg, "id");
    Result &r = out[cJSON_IsString(id) ? id->valuestring : ""];
    auto token = [&out](const cJSON *m) { // a token message, or one item of a token_batch (protocol version 3)
      const cJSON *tid = cJSON_GetObjectItem(m, "id");
      Result &tr = out[cJSON_IsString(tid) ? tid->valuestring : ""];
      tr.text += cJSON_GetObjectItem(m, "text")->valuestring;
      const cJSON *t;
      cJSON_ArrayForEach(t, cJSON_GetObjectItem(m, "tokens")) tr.tokens.push_back(t->valueint);
    };
    if (op == "token") {
      token(ev.msg);
    } else if (op == "token_batch") {
      const cJSON *item;
      cJSON_ArrayForEach(item, cJSON_GetObjectItem(ev.msg, "items")) token(item);
    } else if (op == "done") {
      r.finish = cJSON_GetObjectItem(ev.msg, "finish_reason")->valuestring;
      r.kv_bytes = cJSON_GetObjectItem(ev.msg, "kv_bytes")->valuedouble;
      finished++;
    } else if (op == "error") {
      r.error = cJSON_GetObjectItem(ev.msg, "code")->valuestring;
      r.message = cJSON_GetObjectItem(ev.msg, "message")->valuestring;
      finished++;
    }
    ctl_event_done(&ev);
  }
  return out;
}

// A greedy generate message; mode: more members, e.g. "\"mode\":\"local\"".
inline std::string gen(const std::string &id, const std::vector<int> &prompt, int max_tokens, const std::string &mode) {
  std::string s = "{\"op\":\"generate\",\"id\":\"" + id + "\",\"max_tokens\":" + std::to_string(max_tokens) +
                  ",\"sampling\":{\"temperature\":0}," + mode + ",\"prompt\":[";
  for (size_t i = 0; i < prompt.size(); i++) s += (i ? "," : "") + std::to_string(prompt[i]);
  return s + "]}";
}

// The numeric fields of who's stats_ok (empty when it does not answer in 10 s).
inline std::map<std::string, double> stats(Cluster &c, const std::string &who) {
  std::map<std::string, double> out;
  c.send(who, "{\"op\":\"stats\"}");
  for (;;) {
    ctl_event ev;
    if (ctl_hub_next(c.hub, &ev, 10000) != 1) return out;
    if (ev.msg && !strcmp(cJSON_GetObjectItem(ev.msg, "op")->valuestring, "stats_ok")) {
      for (const cJSON *f = ev.msg->child; f; f = f->next)
        if (cJSON_IsNumber(f)) out[f->string] = f->valuedouble;
      ctl_event_done(&ev);
      return out;
    }
    ctl_event_done(&ev);
  }
}

// Blocks nobody is using (free, or kept only by the prefix cache for later requests); -1 on silence.
inline int free_blocks(Cluster &c, const std::string &who, int *total) {
  auto s = stats(c, who);
  if (s.empty()) return -1;
  *total = (int)s["total_blocks"];
  return (int)(s["free_blocks"] + s["prefix_cached_blocks"]);
}

} // namespace dserve_test

#endif
