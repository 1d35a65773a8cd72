// tests/router/http_util.h: what the router HTTP tests drive it with: a tiny model, a fake worker speaking the
// control protocol, a raw HTTP/1.1 client (chunked bodies, SSE events) and a router on an ephemeral port.
#ifndef DSERVE_TESTS_ROUTER_HTTP_UTIL_H
#define DSERVE_TESTS_ROUTER_HTTP_UTIL_H

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_secret.h"

#include "tests/models/gguf_writer.h"

extern "C" {
#include "ctl/hub.h"
#include "models/tokenizer.h"
#include "router/router.h"
}

namespace httptest {

using namespace std::chrono_literals;
using dserve_test::byte_char;


// A tiny model file: byte-level vocabulary (256 byte tokens + 3 control tokens) and a context of 512. chatml false:
// the control tokens are not ChatML's (a base model with no chat template). template_text (may be null): its
// tokenizer.chat_template; extra: more control tokens (ids from 259 on); bos: its BOS id with add_bos_token on (-1:
// none).
struct TinyModel {
  std::vector<uint8_t> buf;
  mdl_gguf *g = nullptr;
  mdl_tok *t = nullptr;
  explicit TinyModel(bool chatml = true, const char *template_text = nullptr, std::vector<std::string> extra = {},
                     int bos = -1) {
    dserve_test::GgufWriter w;
    std::vector<std::string> toks;
    std::vector<int32_t> types;
    for (int b = 0; b < 256; b++) toks.push_back(byte_char(b)), types.push_back(MDL_TOK_NORMAL);
    for (const char *c : {"<|endoftext|>", chatml ? "<|im_start|>" : "<start>", chatml ? "<|im_end|>" : "<end>"})
      toks.push_back(c), types.push_back(MDL_TOK_CONTROL);
    for (auto &c : extra) toks.push_back(c), types.push_back(MDL_TOK_CONTROL);
    if (template_text) w.str("tokenizer.chat_template", template_text);
    if (bos >= 0) {
      w.scalar<uint32_t>("tokenizer.ggml.bos_token_id", MDL_GGUF_U32, (uint32_t)bos);
      w.scalar<uint8_t>("tokenizer.ggml.add_bos_token", MDL_GGUF_BOOL, 1);
    }
    w.str("general.architecture", "llama");
    w.scalar<uint32_t>("llama.context_length", MDL_GGUF_U32, 512);
    w.str("tokenizer.ggml.model", "gpt2");
    w.str("tokenizer.ggml.pre", "smollm");
    w.arr_str("tokenizer.ggml.tokens", toks);
    w.arr<int32_t>("tokenizer.ggml.token_type", MDL_GGUF_I32, types);
    w.arr_str("tokenizer.ggml.merges", {});
    w.scalar<uint32_t>("tokenizer.ggml.eos_token_id", MDL_GGUF_U32, 256);
    buf = w.bytes();
    char err[256];
    EXPECT_EQ(mdl_gguf_from_memory(buf.data(), buf.size(), &g, err, sizeof err), 0) << err;
    EXPECT_EQ(mdl_tok_load(g, &t, err, sizeof err), 0) << err;
  }
  ~TinyModel() {
    mdl_tok_free(t);
    mdl_gguf_close(g);
  }
};

// The fake worker: a listening hub that answers stats and plays generate requests back as scripted tokens.
// Each tick (5 ms) every active generation gets one token "c<choice>t<k> "; after max_tokens (or 3 when max_tokens
// is larger) it sends done. Modes: normal, hang (never answers generate), die (one token, then closes the link),
// die once (as die, then normal), fail (one token, then an error).
struct FakeWorker {
  enum Mode { NORMAL, HANG, DIE, FAIL, DIE_ONCE };
  ctl_hub *hub = nullptr;
  std::thread th;
  std::atomic<bool> stop{false};
  std::atomic<int> mode{NORMAL};
  std::atomic<size_t> hold{0}; // no tokens until this many generations are active (deterministic interleaving)
  std::mutex mu;
  std::vector<std::string> generates, cancels;
  std::vector<std::string> gen_json;
  struct Active {
    ctl_peer *peer;
    std::string id;
    int choice, k = 0, n;
    bool length;
  };
  std::vector<Active> active;

  explicit FakeWorker(const char *role = "both") {
    ctl_hub_opts o{};
    o.name = "w0"; // the member the test router dials (Router: its one worker, w0)
    o.role = role;
    o.secret = DSERVE_TEST_SECRET; // the hub checks the router's proof of it before any hello_ok
    o.host = "127.0.0.1";
    o.port = 0;
    o.hello_extra = [](void *, cJSON *ok) {
      cJSON_AddNumberToObject(ok, "n_ctx", 512);
      cJSON_AddNumberToObject(ok, "block_size", 16);
    };
    char err[256];
    EXPECT_EQ(ctl_hub_new(&o, &hub, err, sizeof err), 0) << err;
    th = std::thread([this] { loop(); });
  }
  ~FakeWorker() {
    stop = true;
    th.join();
    ctl_hub_free(hub);
  }
  int port() const { return ctl_hub_port(hub); }
  static void send(ctl_peer *p, cJSON *m) {
    ctl_peer_send(p, m);
    cJSON_Delete(m);
  }
  void loop() {
    while (!stop) {
      ctl_event ev;
      while (ctl_hub_next(hub, &ev, 5) == 1) {
        if (ev.msg) handle(ev.peer, ev.msg);
        else {
          std::lock_guard<std::mutex> l(mu);
          for (size_t i = 0; i < active.size();)
            if (active[i].peer == ev.peer) active.erase(active.begin() + (long)i);
            else i++;
        }
        ctl_event_done(&ev);
      }
      tick();
    }
  }
  void handle(ctl_peer *p, cJSON *m) {
    std::string op = cJSON_GetObjectItem(m, "op")->valuestring;
    if (op == "stats") {
      cJSON *r = cJSON_CreateObject();
      cJSON_AddStringToObject(r, "op", "stats_ok");
      cJSON_AddNumberToObject(r, "running", 0);
      cJSON_AddNumberToObject(r, "waiting", 0);
      cJSON_AddNumberToObject(r, "free_blocks", 30);
      cJSON_AddNumberToObject(r, "total_blocks", 40);
      cJSON_AddNumberToObject(r, "prefix_hits", 5);
      cJSON_AddNumberToObject(r, "prefix_queries", 9);
      // per tier (a tier that is not an object is ignored)
      cJSON_AddItemToObject(r, "prefix_tiers", cJSON_Parse(R"({"pool":{"hits":5,"queries":9,"blocks":3},)"
                                                           R"("host":{"hits":0,"queries":4,"blocks":2,"refused":6},"disk":7})"));
      send(p, r);
    } else if (op == "generate") {
      std::string id = cJSON_GetObjectItem(m, "id")->valuestring;
      char *j = cJSON_PrintUnformatted(m);
      std::lock_guard<std::mutex> l(mu);
      generates.push_back(id);
      gen_json.push_back(j);
      free(j);
      if (mode == HANG) return;
      int mt = (int)cJSON_GetObjectItem(m, "max_tokens")->valuedouble;
      int choice = atoi(id.substr(id.rfind('-') + 1).c_str());
      active.push_back(Active{p, id, choice, 0, mt < 3 ? mt : 3, mt <= 3});
    } else if (op == "cancel") {
      std::lock_guard<std::mutex> l(mu);
      cancels.push_back(cJSON_GetObjectItem(m, "id")->valuestring);
      for (size_t i = 0; i < active.size(); i++)
        if (active[i].id == cancels.back()) active.erase(active.begin() + (long)i);
    }
  }
  void tick() {
    std::lock_guard<std::mutex> l(mu);
    if (active.size() < hold) return;
    hold = 0;
    for (size_t i = 0; i < active.size();) {
      Active &a = active[i];
      if (a.k < a.n) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "op", "token");
        cJSON_AddStringToObject(t, "id", a.id.c_str());
        std::string text = "c" + std::to_string(a.choice) + "t" + std::to_string(a.k) + " ";
        cJSON_AddStringToObject(t, "text", text.c_str());
        cJSON *ids = cJSON_AddArrayToObject(t, "tokens");
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(99));
        cJSON *lps = cJSON_AddArrayToObject(t, "logprobs");
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "token", 'a' + a.k);
        cJSON_AddNumberToObject(e, "logprob", -0.5);
        cJSON *top = cJSON_AddArrayToObject(e, "top");
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber('a' + a.k));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(-0.5));
        cJSON_AddItemToArray(top, pair);
        cJSON_AddItemToArray(lps, e);
        send(a.peer, t);
        a.k++;
        if (mode == FAIL) { // the worker gives up on the request
          cJSON *e = cJSON_CreateObject();
          cJSON_AddStringToObject(e, "op", "error");
          cJSON_AddStringToObject(e, "id", a.id.c_str());
          cJSON_AddStringToObject(e, "message", "deadline passed");
          cJSON_AddStringToObject(e, "code", "timeout");
          send(a.peer, e);
          active.erase(active.begin() + (long)i);
          continue;
        }
        if (mode == DIE || mode == DIE_ONCE) {
          if (mode == DIE_ONCE) mode = NORMAL;
          ctl_peer_close(a.peer);
          active.erase(active.begin() + (long)i);
          continue;
        }
        i++;
        continue;
      }
      cJSON *d = cJSON_CreateObject();
      cJSON_AddStringToObject(d, "op", "done");
      cJSON_AddStringToObject(d, "id", a.id.c_str());
      cJSON_AddStringToObject(d, "finish_reason", a.length ? "length" : "stop");
      cJSON_AddNumberToObject(d, "prompt_tokens", 0);
      cJSON_AddNumberToObject(d, "completion_tokens", a.n);
      cJSON_AddNumberToObject(d, "cached_tokens", 2);
      cJSON_AddNumberToObject(d, "kv_bytes", 0);
      cJSON_AddNumberToObject(d, "kv_ms", 0);
      send(a.peer, d);
      active.erase(active.begin() + (long)i);
    }
  }
  bool saw_cancel(const std::string &prefix, std::chrono::milliseconds within) {
    auto end = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < end) {
      {
        std::lock_guard<std::mutex> l(mu);
        for (auto &c : cancels)
          if (c.rfind(prefix, 0) == 0) return true;
      }
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  size_t n_generates() {
    std::lock_guard<std::mutex> l(mu);
    return generates.size();
  }
};

struct Resp {
  int status = 0;
  std::string head, body;
  std::string header(const std::string &name) const {
    std::string lh = head;
    for (auto &ch : lh) ch = (char)tolower(ch);
    std::string ln = "\r\n" + name + ":";
    for (auto &ch : ln) ch = (char)tolower(ch);
    size_t p = lh.find(ln);
    if (p == std::string::npos) return "";
    size_t s = p + ln.size(), e = head.find("\r\n", s);
    std::string v = head.substr(s, e - s);
    while (!v.empty() && v[0] == ' ') v.erase(0, 1);
    return v;
  }
};

inline int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

inline void send_all(int fd, const std::string &s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t k = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (k <= 0) return;
    off += (size_t)k;
  }
}

inline std::string dechunk(const std::string &b) {
  std::string out;
  size_t p = 0;
  while (p < b.size()) {
    size_t e = b.find("\r\n", p);
    if (e == std::string::npos) break;
    size_t n = strtoul(b.substr(p, e - p).c_str(), nullptr, 16);
    if (n == 0) break;
    out += b.substr(e + 2, n);
    p = e + 2 + n + 2;
  }
  return out;
}

// Where a chunked body that starts at b[0] ends (just past its last chunk, without trailers), or npos while
// incomplete.
inline size_t chunked_end(const std::string &b) {
  size_t p = 0;
  for (;;) {
    size_t e = b.find("\r\n", p);
    if (e == std::string::npos) return std::string::npos;
    size_t n = strtoul(b.substr(p, e - p).c_str(), nullptr, 16);
    if (n == 0) return b.size() >= e + 4 && b.compare(e + 2, 2, "\r\n") == 0 ? e + 4 : std::string::npos;
    p = e + 2 + n + 2;
    if (p > b.size()) return std::string::npos;
  }
}

// Reads one response from fd (Content-Length, chunked, or until close).
inline bool read_resp(int fd, Resp &r, std::string &pending) {
  std::string buf = pending;
  char tmp[65536];
  auto fill = [&]() {
    ssize_t k = recv(fd, tmp, sizeof tmp, 0);
    if (k <= 0) return false;
    buf.append(tmp, (size_t)k);
    return true;
  };
  size_t he;
  while ((he = buf.find("\r\n\r\n")) == std::string::npos)
    if (!fill()) return false;
  r.head = buf.substr(0, he + 2);
  r.status = atoi(r.head.c_str() + 9);
  std::string rest = buf.substr(he + 4);
  std::string cl = r.header("content-length");
  if (!cl.empty()) {
    size_t n = strtoul(cl.c_str(), nullptr, 10);
    while (rest.size() < n) {
      ssize_t k = recv(fd, tmp, sizeof tmp, 0);
      if (k <= 0) return false;
      rest.append(tmp, (size_t)k);
    }
    r.body = rest.substr(0, n);
    pending = rest.substr(n);
    return true;
  }
  if (r.header("transfer-encoding") == "chunked") {
    size_t end;
    while ((end = chunked_end(rest)) == std::string::npos) {
      ssize_t k = recv(fd, tmp, sizeof tmp, 0);
      if (k <= 0) break;
      rest.append(tmp, (size_t)k);
    }
    r.body = dechunk(rest);
    pending = end == std::string::npos ? "" : rest.substr(end); // a pipelined answer may follow
    return true;
  }
  for (;;) {
    ssize_t k = recv(fd, tmp, sizeof tmp, 0);
    if (k <= 0) break;
    rest.append(tmp, (size_t)k);
  }
  r.body = rest;
  return true;
}

inline Resp request(int port, const std::string &method, const std::string &path, const std::string &body,
                    const std::string &extra = "Content-Type: application/json\r\n") {
  Resp r;
  int fd = connect_to(port);
  if (fd < 0) return r;
  send_all(fd, method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra +
                   "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string pend;
  read_resp(fd, r, pend);
  close(fd);
  return r;
}

inline cJSON *js(const std::string &s) { return cJSON_ParseWithLength(s.data(), s.size()); }

inline std::vector<std::string> sse_events(const std::string &body) {
  std::vector<std::string> ev;
  size_t p = 0;
  while (p < body.size()) {
    size_t e = body.find("\n\n", p);
    if (e == std::string::npos) {
      ev.push_back("UNTERMINATED:" + body.substr(p));
      break;
    }
    ev.push_back(body.substr(p, e - p));
    p = e + 2;
  }
  return ev;
}

struct Router {
  cfg_cluster cfg{};
  cfg_worker w{};
  std::vector<std::string> keys;
  std::vector<char *> key_ptrs;
  rtr_server *s = nullptr;
  // tweak, when given, changes the config last (e.g. the connection caps) before the router starts.
  Router(const TinyModel &m, int worker_port, int queue_limit = 16, int max_seqs = 64,
         std::vector<std::string> api_keys = {}, int conn_timeout_s = 10,
         const std::function<void(cfg_cluster &)> &tweak = nullptr) {
    snprintf(cfg.model_name, sizeof cfg.model_name, "tiny");
    snprintf(cfg.secret, sizeof cfg.secret, "%s", DSERVE_TEST_SECRET);
    cfg.has_router = 1;
    snprintf(cfg.router.host, sizeof cfg.router.host, "127.0.0.1");
    cfg.router.port = 0;
    cfg.router.max_body_bytes = 4096;
    cfg.router.conn_timeout_s = conn_timeout_s;
    cfg.router.queue_limit = queue_limit;
    cfg.router.max_n = 4;
    cfg.router.max_stop = 4;
    cfg.router.request_timeout_ms = 60000;
    cfg.router.disagg_threshold = 1000;
    keys = api_keys;
    for (auto &k : keys) key_ptrs.push_back(&k[0]);
    cfg.router.api_keys = key_ptrs.empty() ? nullptr : key_ptrs.data();
    cfg.router.n_api_keys = (int)key_ptrs.size();
    snprintf(w.name, sizeof w.name, "w0");
    w.role = CFG_ROLE_BOTH;
    snprintf(w.host, sizeof w.host, "127.0.0.1");
    w.port = worker_port;
    w.max_seqs = max_seqs;
    cfg.workers = &w;
    cfg.n_workers = 1;
    if (tweak) tweak(cfg);
    rtr_server_opts o{};
    o.cfg = &cfg;
    o.gguf = m.g;
    o.tok = m.t;
    o.n_ctx = 512;
    char err[256];
    EXPECT_EQ(rtr_server_new(&o, &s, err, sizeof err), 0) << err;
  }
  ~Router() { rtr_server_free(s); }
  int port() { return rtr_server_port(s); }
  bool wait_up() {
    for (int i = 0; i < 500; i++) {
      if (rtr_server_links_up(s) > 0) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

const std::string CHAT = R"({"model":"tiny","messages":[{"role":"user","content":"hi"}])";

inline void expect_error(const Resp &r, int status, const char *code = nullptr) {
  EXPECT_EQ(r.status, status) << r.head << r.body;
  cJSON *o = js(r.body);
  ASSERT_NE(o, nullptr) << r.body;
  cJSON *e = cJSON_GetObjectItem(o, "error");
  ASSERT_TRUE(cJSON_IsObject(e)) << r.body;
  EXPECT_TRUE(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
  EXPECT_TRUE(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
  EXPECT_NE(cJSON_GetObjectItem(e, "param"), nullptr);
  if (code) {
    ASSERT_TRUE(cJSON_IsString(cJSON_GetObjectItem(e, "code"))) << r.body;
    EXPECT_STREQ(cJSON_GetObjectItem(e, "code")->valuestring, code);
  }
  cJSON_Delete(o);
}

} // namespace httptest
#endif
