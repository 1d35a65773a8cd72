// tests/router/test_http.cc: the router over real HTTP against a fake worker speaking the control protocol.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/models/gguf_writer.h"

extern "C" {
#include "models/tokenizer.h"
#include "router/router.h"
#include "server/hub.h"
}

namespace {

using namespace std::chrono_literals;

std::string byte_char(int b) {
  auto keep = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  int cp = b;
  if (!keep(b)) {
    int k = 0;
    for (int x = 0; x < b; x++)
      if (!keep(x)) k++;
    cp = 256 + k;
  }
  std::string s;
  if (cp < 0x80) s += (char)cp;
  else {
    s += (char)(0xC0 | (cp >> 6));
    s += (char)(0x80 | (cp & 0x3F));
  }
  return s;
}

// A tiny model file: byte-level vocabulary (256 byte tokens + 3 control tokens) and a context of 512.
struct TinyModel {
  std::vector<uint8_t> buf;
  mdl_gguf *g = nullptr;
  mdl_tok *t = nullptr;
  TinyModel() {
    dserve_test::GgufWriter w;
    std::vector<std::string> toks;
    std::vector<int32_t> types;
    for (int b = 0; b < 256; b++) toks.push_back(byte_char(b)), types.push_back(MDL_TOK_NORMAL);
    for (const char *c : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) toks.push_back(c), types.push_back(MDL_TOK_CONTROL);
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
// is larger) it sends done. Modes: normal, hang (never answers generate), die (one token, then closes the link).
struct FakeWorker {
  enum Mode { NORMAL, HANG, DIE, FAIL };
  srv_hub *hub = nullptr;
  std::thread th;
  std::atomic<bool> stop{false};
  std::atomic<int> mode{NORMAL};
  std::atomic<size_t> hold{0}; // no tokens until this many generations are active (deterministic interleaving)
  std::mutex mu;
  std::vector<std::string> generates, cancels;
  std::vector<std::string> gen_json;
  struct Active {
    srv_peer *peer;
    std::string id;
    int choice, k = 0, n;
    bool length;
  };
  std::vector<Active> active;

  FakeWorker() {
    srv_hub_opts o{};
    o.name = "fake";
    o.role = "both";
    o.secret = "";
    o.host = "127.0.0.1";
    o.port = 0;
    o.hello_extra = [](void *, cJSON *ok) {
      cJSON_AddNumberToObject(ok, "n_ctx", 512);
      cJSON_AddNumberToObject(ok, "block_size", 16);
    };
    char err[256];
    EXPECT_EQ(srv_hub_new(&o, &hub, err, sizeof err), 0) << err;
    th = std::thread([this] { loop(); });
  }
  ~FakeWorker() {
    stop = true;
    th.join();
    srv_hub_free(hub);
  }
  int port() const { return srv_hub_port(hub); }
  static void send(srv_peer *p, cJSON *m) {
    srv_peer_send(p, m);
    cJSON_Delete(m);
  }
  void loop() {
    while (!stop) {
      srv_event ev;
      while (srv_hub_next(hub, &ev, 5) == 1) {
        if (ev.msg) handle(ev.peer, ev.msg);
        else {
          std::lock_guard<std::mutex> l(mu);
          for (size_t i = 0; i < active.size();)
            if (active[i].peer == ev.peer) active.erase(active.begin() + (long)i);
            else i++;
        }
        srv_event_done(&ev);
      }
      tick();
    }
  }
  void handle(srv_peer *p, cJSON *m) {
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
                                                           R"("host":{"hits":0,"queries":4,"blocks":2},"disk":7})"));
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
        if (mode == DIE) {
          srv_peer_close(a.peer);
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

int connect_to(int port) {
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

void send_all(int fd, const std::string &s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t k = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (k <= 0) return;
    off += (size_t)k;
  }
}

std::string dechunk(const std::string &b) {
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

// Reads one response from fd (Content-Length, chunked, or until close).
bool read_resp(int fd, Resp &r, std::string &pending) {
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
    while (rest.find("\r\n0\r\n\r\n") == std::string::npos && rest.rfind("0\r\n\r\n", 0) != 0) {
      ssize_t k = recv(fd, tmp, sizeof tmp, 0);
      if (k <= 0) break;
      rest.append(tmp, (size_t)k);
    }
    r.body = dechunk(rest);
    pending.clear();
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

Resp request(int port, const std::string &method, const std::string &path, const std::string &body,
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

cJSON *js(const std::string &s) { return cJSON_ParseWithLength(s.data(), s.size()); }

std::vector<std::string> sse_events(const std::string &body) {
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
  srv_config cfg{};
  srv_worker_cfg w{};
  std::vector<std::string> keys;
  std::vector<char *> key_ptrs;
  rtr_server *s = nullptr;
  Router(const TinyModel &m, int worker_port, int queue_limit = 16, int max_seqs = 64,
         std::vector<std::string> api_keys = {}, int conn_timeout_s = 10) {
    snprintf(cfg.model_name, sizeof cfg.model_name, "tiny");
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
    w.role = SRV_ROLE_BOTH;
    snprintf(w.host, sizeof w.host, "127.0.0.1");
    w.port = worker_port;
    w.max_seqs = max_seqs;
    cfg.workers = &w;
    cfg.n_workers = 1;
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

void expect_error(const Resp &r, int status, const char *code = nullptr) {
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

TEST(Http, NoWorker503) {
  TinyModel m;
  int dead_port;
  { // a port nobody listens on
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(fd, (sockaddr *)&a, &l);
    dead_port = ntohs(a.sin_port);
    close(fd);
  }
  Router r(m, dead_port);
  Resp h = request(r.port(), "GET", "/health", "");
  EXPECT_EQ(h.status, 503);
  expect_error(request(r.port(), "POST", "/v1/chat/completions", CHAT + "}"), 503);
  // /v1/models and tokenize do not need a worker
  EXPECT_EQ(request(r.port(), "GET", "/v1/models", "").status, 200);
  EXPECT_EQ(request(r.port(), "POST", "/tokenize", R"({"prompt":"abc"})").status, 200);
}

struct Live : ::testing::Test {
  TinyModel m;
  FakeWorker fw;
  std::unique_ptr<Router> r;
  void SetUp() override {
    r.reset(new Router(m, fw.port()));
    ASSERT_TRUE(r->wait_up());
  }
  int port() { return r->port(); }
  void healthy() { EXPECT_EQ(request(port(), "GET", "/health", "").status, 200); }
};

TEST_F(Live, HealthModelsTokenize) {
  healthy();
  Resp mr = request(port(), "GET", "/v1/models", "");
  ASSERT_EQ(mr.status, 200);
  cJSON *o = js(mr.body);
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "data"), 0), "id")->valuestring, "tiny");
  cJSON_Delete(o);
  Resp t = request(port(), "POST", "/tokenize", R"({"prompt":"abc"})");
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.body, R"({"tokens":[97,98,99],"count":3,"max_model_len":512})");
  Resp d = request(port(), "POST", "/detokenize", R"({"tokens":[104,105,257]})");
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.body, R"({"prompt":"hi<|im_start|>"})");
}

TEST_F(Live, ChatNonStream) {
  Resp x = request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":2,"logprobs":true,"top_logprobs":1})");
  ASSERT_EQ(x.status, 200) << x.body;
  cJSON *o = js(x.body);
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(std::string(cJSON_GetObjectItem(o, "id")->valuestring).rfind("chatcmpl-", 0), 0u);
  EXPECT_STREQ(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
  EXPECT_STREQ(cJSON_GetObjectItem(o, "model")->valuestring, "tiny");
  cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring, "c0t0 c0t1 ");
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "role")->valuestring, "assistant");
  EXPECT_STREQ(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
  cJSON *lp = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content");
  ASSERT_EQ(cJSON_GetArraySize(lp), 2) << x.body;
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetArrayItem(lp, 1), "token")->valuestring, "b");
  EXPECT_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(lp, 0), "top_logprobs")), 1);
  cJSON *u = cJSON_GetObjectItem(o, "usage");
  // the prompt the router sent is the ChatML rendering: compare with /tokenize of the same messages
  Resp t = request(port(), "POST", "/tokenize", R"({"messages":[{"role":"user","content":"hi"}]})");
  cJSON *to = js(t.body);
  EXPECT_EQ(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, cJSON_GetObjectItem(to, "count")->valueint);
  EXPECT_EQ(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 2);
  EXPECT_EQ(cJSON_GetObjectItem(u, "total_tokens")->valueint, cJSON_GetObjectItem(to, "count")->valueint + 2);
  EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")->valueint, 2);
  cJSON_Delete(to);
  cJSON_Delete(o);
  // what the worker got
  std::lock_guard<std::mutex> l(fw.mu);
  cJSON *g = js(fw.gen_json.back());
  EXPECT_STREQ(cJSON_GetObjectItem(g, "mode")->valuestring, "local");
  EXPECT_EQ(cJSON_GetObjectItem(g, "max_tokens")->valueint, 2);
  EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "sampling"), "logprobs")->valueint, 1);
  cJSON_Delete(g);
}

TEST_F(Live, CompletionDefaultsToContext) {
  Resp x = request(port(), "POST", "/v1/completions", R"({"prompt":"abcd","seed":7,"stop":["zz"]})");
  ASSERT_EQ(x.status, 200) << x.body;
  cJSON *o = js(x.body);
  cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  EXPECT_STREQ(cJSON_GetObjectItem(c0, "text")->valuestring, "c0t0 c0t1 c0t2 ");
  EXPECT_STREQ(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
  EXPECT_EQ(std::string(cJSON_GetObjectItem(o, "id")->valuestring).rfind("cmpl-", 0), 0u);
  cJSON_Delete(o);
  std::lock_guard<std::mutex> l(fw.mu);
  cJSON *g = js(fw.gen_json.back());
  EXPECT_EQ(cJSON_GetObjectItem(g, "max_tokens")->valueint, 508); // 512 - 4 prompt tokens
  EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "sampling"), "seed")->valueint, 7);
  EXPECT_STREQ(cJSON_GetArrayItem(cJSON_GetObjectItem(g, "stop"), 0)->valuestring, "zz");
  cJSON_Delete(g);
}

TEST_F(Live, ChatStreamFraming) {
  Resp x = request(port(), "POST", "/v1/chat/completions",
                   CHAT + R"(,"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(x.status, 200);
  EXPECT_EQ(x.header("content-type"), "text/event-stream");
  auto ev = sse_events(x.body);
  ASSERT_EQ(ev.size(), 6u) << x.body; // role, 2 deltas, finish, usage, [DONE]
  for (size_t i = 0; i + 1 < ev.size(); i++) ASSERT_EQ(ev[i].rfind("data: {", 0), 0u) << ev[i];
  EXPECT_EQ(ev.back(), "data: [DONE]");
  EXPECT_EQ(x.body.substr(x.body.size() - 14), "data: [DONE]\n\n");
  std::string id;
  std::string text;
  for (size_t i = 0; i + 1 < ev.size(); i++) {
    cJSON *o = js(ev[i].substr(6));
    ASSERT_NE(o, nullptr) << ev[i];
    EXPECT_STREQ(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion.chunk");
    if (id.empty()) id = cJSON_GetObjectItem(o, "id")->valuestring;
    EXPECT_EQ(id, cJSON_GetObjectItem(o, "id")->valuestring); // one id for the whole stream
    cJSON *ch = cJSON_GetObjectItem(o, "choices");
    if (i == 4) {
      EXPECT_EQ(cJSON_GetArraySize(ch), 0);
      cJSON *u = cJSON_GetObjectItem(o, "usage");
      EXPECT_EQ(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 2);
    } else {
      ASSERT_EQ(cJSON_GetArraySize(ch), 1);
      cJSON *c0 = cJSON_GetArrayItem(ch, 0), *d = cJSON_GetObjectItem(c0, "delta");
      if (i == 0) {
        EXPECT_STREQ(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
        EXPECT_STREQ(cJSON_GetObjectItem(d, "content")->valuestring, "");
      }
      if (i == 1 || i == 2) text += cJSON_GetObjectItem(d, "content")->valuestring;
      if (i == 3) EXPECT_STREQ(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
      else EXPECT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    }
    cJSON_Delete(o);
  }
  EXPECT_EQ(text, "c0t0 c0t1 ");
}

TEST_F(Live, TwoChoicesInterleaved) {
  fw.hold = 2;
  Resp x = request(port(), "POST", "/v1/completions", R"({"prompt":"ab","n":2,"max_tokens":3,"stream":true,"seed":10})");
  ASSERT_EQ(x.status, 200);
  auto ev = sse_events(x.body);
  std::string text[2];
  int finishes[2] = {0, 0};
  std::vector<int> order;
  for (auto &e : ev) {
    if (e == "data: [DONE]") continue;
    cJSON *o = js(e.substr(6));
    ASSERT_NE(o, nullptr) << e;
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    int idx = cJSON_GetObjectItem(c0, "index")->valueint;
    ASSERT_TRUE(idx == 0 || idx == 1);
    std::string t = cJSON_GetObjectItem(c0, "text")->valuestring;
    if (!t.empty()) order.push_back(idx);
    text[idx] += t;
    if (cJSON_IsString(cJSON_GetObjectItem(c0, "finish_reason"))) finishes[idx]++;
    cJSON_Delete(o);
  }
  EXPECT_EQ(text[0], "c0t0 c0t1 c0t2 ");
  EXPECT_EQ(text[1], "c1t0 c1t1 c1t2 ");
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
  ASSERT_EQ(order.size(), 6u);
  bool interleaved = false; // the fake worker ticks both choices together: index 1 appears before index 0 ends
  for (size_t i = 0; i < 3; i++) interleaved |= order[i] == 1;
  EXPECT_TRUE(interleaved);
  std::lock_guard<std::mutex> l(fw.mu);
  ASSERT_GE(fw.gen_json.size(), 2u);
  std::vector<int> seeds;
  for (size_t i = fw.gen_json.size() - 2; i < fw.gen_json.size(); i++) {
    cJSON *g = js(fw.gen_json[i]);
    seeds.push_back(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "sampling"), "seed")->valueint);
    cJSON_Delete(g);
  }
  std::sort(seeds.begin(), seeds.end());
  EXPECT_EQ(seeds, (std::vector<int>{10, 11}));
}

TEST_F(Live, ErrorsAndKeepServing) {
  const std::string J = "Content-Type: application/json\r\n";
  expect_error(request(port(), "GET", "/nope", ""), 404);
  healthy();
  expect_error(request(port(), "POST", "/v1/chat/completions", R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})"),
               404, "model_not_found");
  healthy();
  Resp m = request(port(), "GET", "/v1/chat/completions", "");
  expect_error(m, 405);
  EXPECT_EQ(m.header("allow"), "POST");
  healthy();
  expect_error(request(port(), "POST", "/v1/models", "{}"), 405);
  healthy();
  expect_error(request(port(), "POST", "/v1/chat/completions", CHAT + "}", "Content-Type: text/plain\r\n"), 415);
  healthy();
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})",
                    "Content-Type: application/json; charset=utf-8\r\n").status, 200);
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})", "").status, 200);
  expect_error(request(port(), "POST", "/v1/chat/completions", std::string(5000, ' ')), 413);
  healthy();
  { // a 10 MB body announced: refused before it is sent
    int fd = connect_to(port());
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10485760\r\n\r\n");
    Resp r;
    std::string pend;
    ASSERT_TRUE(read_resp(fd, r, pend));
    expect_error(r, 413);
    close(fd);
  }
  { // chunked upload over the limit
    int fd = connect_to(port());
    std::string chunk(3000, ' ');
    char hex[16];
    snprintf(hex, sizeof hex, "%zx", chunk.size());
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     std::string(hex) + "\r\n" + chunk + "\r\n" + hex + "\r\n" + chunk + "\r\n0\r\n\r\n");
    Resp r;
    std::string pend;
    ASSERT_TRUE(read_resp(fd, r, pend));
    expect_error(r, 413);
    close(fd);
  }
  healthy();
  expect_error(request(port(), "POST", "/v1/chat/completions", "{\"messages\":"), 400);
  expect_error(request(port(), "POST", "/v1/completions", "{\"prompt\":\"\xff\"}"), 400);
  expect_error(request(port(), "POST", "/v1/completions", R"({"prompt":"x","max_tokens":1e309})"), 400);
  expect_error(request(port(), "POST", "/v1/completions", std::string(2000, '[') + std::string(2000, ']')), 400);
  expect_error(request(port(), "POST", "/v1/completions", R"({"prompt":")" + std::string(600, 'a') + "\"}"), 400,
               "context_length_exceeded");
  Resp ce = request(port(), "POST", "/v1/completions", R"({"prompt":"abcdefghij","max_tokens":510})");
  expect_error(ce, 400, "context_length_exceeded");
  EXPECT_NE(ce.body.find("520"), std::string::npos) << ce.body; // the token counts are in the message
  healthy();
  { // keep-alive: two requests on one connection
    int fd = connect_to(port());
    std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    std::string pend;
    Resp a, b;
    send_all(fd, req);
    ASSERT_TRUE(read_resp(fd, a, pend));
    send_all(fd, req);
    ASSERT_TRUE(read_resp(fd, b, pend));
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(b.status, 200);
    close(fd);
  }
  // every bad request left the server serving real ones
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})").status, 200);
  Resp mt = request(port(), "GET", "/metrics", "");
  ASSERT_EQ(mt.status, 200);
  EXPECT_NE(mt.body.find("# TYPE dserve:time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(mt.body.find("dserve:request_success_total{finished_reason=\"length\"} 3"), std::string::npos) << mt.body;
  EXPECT_NE(mt.body.find("dserve:kv_cache_usage_perc 0.25"), std::string::npos) << mt.body;
  EXPECT_NE(mt.body.find("dserve:prefix_cache_queries_total 9"), std::string::npos) << mt.body;
  EXPECT_NE(mt.body.find("dserve:prefix_cache_tier_hits_total{worker=\"w0\",tier=\"pool\"} 5"), std::string::npos);
  EXPECT_NE(mt.body.find("dserve:prefix_cache_tier_queries_total{worker=\"w0\",tier=\"host\"} 4"), std::string::npos);
  EXPECT_NE(mt.body.find("dserve:prefix_cache_blocks{worker=\"w0\",tier=\"pool\"} 3"), std::string::npos);
  EXPECT_EQ(mt.body.find("tier=\"disk\""), std::string::npos) << mt.body;
}

TEST(Http, ApiKeys) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), 16, 64, {"sekrit", "other"});
  ASSERT_TRUE(r.wait_up());
  EXPECT_EQ(request(r.port(), "GET", "/health", "").status, 200); // open
  expect_error(request(r.port(), "GET", "/v1/models", ""), 401);
  expect_error(request(r.port(), "GET", "/v1/models", "", "Authorization: Bearer wrong\r\n"), 401);
  expect_error(request(r.port(), "GET", "/v1/models", "", "Authorization: sekrit\r\n"), 401);
  EXPECT_EQ(request(r.port(), "GET", "/v1/models", "", "Authorization: Bearer sekrit\r\n").status, 200);
  EXPECT_EQ(request(r.port(), "GET", "/v1/models", "", "Authorization: Bearer other\r\n").status, 200);
}

// Starts a stream and returns the socket once the first bytes of the body arrived.
int start_stream(int port, const std::string &body, std::string *got) {
  int fd = connect_to(port);
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  char tmp[4096];
  for (int i = 0; i < 100 && got->find("data: ") == std::string::npos; i++) {
    ssize_t k = recv(fd, tmp, sizeof tmp, 0);
    if (k <= 0) break;
    got->append(tmp, (size_t)k);
  }
  return fd;
}

TEST_F(Live, DisconnectCancels) {
  fw.mode = FakeWorker::HANG;
  std::string got;
  int fd = start_stream(port(), CHAT + R"(,"stream":true})", &got);
  ASSERT_NE(got.find("data: "), std::string::npos) << got;
  for (int i = 0; i < 100 && fw.n_generates() == 0; i++) std::this_thread::sleep_for(10ms);
  std::string id;
  {
    std::lock_guard<std::mutex> l(fw.mu);
    ASSERT_FALSE(fw.generates.empty());
    id = fw.generates.back();
  }
  close(fd);
  EXPECT_TRUE(fw.saw_cancel(id, 2000ms));
  // non-stream too
  fd = connect_to(port());
  std::string body = CHAT + "}";
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                   "\r\n\r\n" + body);
  for (int i = 0; i < 200 && fw.n_generates() < 2; i++) std::this_thread::sleep_for(10ms);
  {
    std::lock_guard<std::mutex> l(fw.mu);
    ASSERT_EQ(fw.generates.size(), 2u);
    id = fw.generates.back();
  }
  close(fd);
  EXPECT_TRUE(fw.saw_cancel(id, 2000ms));
  fw.mode = FakeWorker::NORMAL;
  healthy();
}

TEST_F(Live, WorkerDiesMidStream) {
  fw.mode = FakeWorker::DIE;
  std::string got;
  auto t0 = std::chrono::steady_clock::now();
  int fd = start_stream(port(), CHAT + R"(,"stream":true,"max_tokens":5})", &got);
  char tmp[4096];
  while (got.find("data: [DONE]\n\n") == std::string::npos) {
    ssize_t k = recv(fd, tmp, sizeof tmp, 0);
    if (k <= 0) break;
    got.append(tmp, (size_t)k);
  }
  close(fd);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
  EXPECT_NE(got.find("data: {\"error\":{"), std::string::npos) << got;
  EXPECT_NE(got.find("worker_failure"), std::string::npos) << got;
  EXPECT_NE(got.find("data: [DONE]\n\n"), std::string::npos) << got;
  fw.mode = FakeWorker::NORMAL;
  ASSERT_TRUE(r->wait_up()); // reconnects
  for (int i = 0; i < 300 && request(port(), "GET", "/health", "").status != 200; i++) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})").status, 200);
}

TEST_F(Live, WorkerErrorMessage) {
  fw.mode = FakeWorker::FAIL;
  expect_error(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":3})"), 504, "timeout");
  Resp x = request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":3,"stream":true})");
  EXPECT_EQ(x.status, 200);
  auto ev = sse_events(x.body);
  ASSERT_GE(ev.size(), 3u) << x.body; // role, the token, the error, [DONE]
  EXPECT_EQ(ev.back(), "data: [DONE]");
  cJSON *e = js(ev[ev.size() - 2].substr(6));
  ASSERT_NE(e, nullptr) << x.body;
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "code")->valuestring, "timeout");
  cJSON_Delete(e);
  fw.mode = FakeWorker::NORMAL;
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})").status, 200);
  // the worker already dropped the request: no cancel is sent for it
  std::lock_guard<std::mutex> l(fw.mu);
  EXPECT_TRUE(fw.cancels.empty());
}

TEST(Http, IdleConnectionTimesOut) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), 16, 64, {}, /*conn_timeout_s=*/1);
  int fd = connect_to(r.port());
  ASSERT_GE(fd, 0);
  auto t0 = std::chrono::steady_clock::now();
  char b[16];
  ssize_t k = recv(fd, b, sizeof b, 0); // nothing sent: the server closes the connection
  EXPECT_EQ(k, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  close(fd);
}

TEST(Http, QueueFull429) {
  TinyModel m;
  FakeWorker fw;
  fw.mode = FakeWorker::HANG;
  Router r(m, fw.port(), /*queue_limit=*/0, /*max_seqs=*/1);
  ASSERT_TRUE(r.wait_up());
  std::string got;
  int fd = start_stream(r.port(), CHAT + R"(,"stream":true})", &got); // takes the only slot
  ASSERT_NE(got.find("data: "), std::string::npos);
  Resp x = request(r.port(), "POST", "/v1/chat/completions", CHAT + "}");
  expect_error(x, 429, "queue_full");
  EXPECT_EQ(x.header("retry-after"), "1");
  close(fd);
  ASSERT_TRUE(fw.saw_cancel("chatcmpl-", 2000ms));
  fw.mode = FakeWorker::NORMAL;
  Resp ok;
  for (int i = 0; i < 100; i++) { // the slot frees once the router saw the disconnect
    ok = request(r.port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})");
    if (ok.status == 200) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(Http, WaitingRequestsRunInTurn) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), /*queue_limit=*/8, /*max_seqs=*/1);
  ASSERT_TRUE(r.wait_up());
  std::vector<std::thread> th;
  std::vector<Resp> out(6);
  for (int i = 0; i < 6; i++)
    th.emplace_back([&, i] { out[i] = request(r.port(), "POST", "/v1/completions", R"({"prompt":"ab","max_tokens":2})"); });
  for (auto &t : th) t.join();
  for (auto &x : out) EXPECT_EQ(x.status, 200) << x.body;
  Resp mt = request(r.port(), "GET", "/metrics", "");
  EXPECT_NE(mt.body.find("dserve:request_queue_time_seconds_count 6"), std::string::npos) << mt.body;
  EXPECT_NE(mt.body.find("dserve:num_requests_running 0"), std::string::npos) << mt.body;
}

} // namespace
