// tests/router/test_http_conn.cc: the router's HTTP front end against hostile clients: pipelining, caps on open
// connections, the request-head and body deadlines, many idle connections, request smuggling (RFC 9112 framing);
// /v1/models/{id}, the bearer scheme, NUL, seeds.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/router/http_util.h"

namespace {

using namespace std::chrono_literals;
using namespace httptest;
using Clock = std::chrono::steady_clock;

// A router with the connection caps and the request-head and body deadlines set (the shared harness leaves their
// defaults), and with api_key the key "sekrit".
struct ConnRouter : Router {
  ConnRouter(const TinyModel &m, int worker_port, int max_conns, int per_client, int header_s, int conn_timeout_s = 30,
             bool api_key = false, int body_s = 30, size_t max_body = 4096)
      : Router(m, worker_port, 64, 64, api_key ? std::vector<std::string>{"sekrit"} : std::vector<std::string>{},
               conn_timeout_s, [&](cfg_cluster &c) {
                 c.router.max_connections = max_conns;
                 c.router.max_connections_per_client = per_client;
                 c.router.header_timeout_s = header_s;
                 c.router.body_timeout_s = body_s;
                 c.router.max_body_bytes = max_body;
               }) {}
};

std::string post_req(const std::string &path, const std::string &body, const std::string &extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

const std::string GET_MODELS = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";

// Opens n keep-alive connections, each answered once: the router has accepted and counted every one of them (an
// observable, where a fixed sleep only hoped the accept thread had run). -1 in place of a connection not answered.
std::vector<int> open_served(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; i++) {
    int fd = connect_to(port);
    std::string pend;
    Resp r;
    if (fd >= 0) send_all(fd, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    if (fd >= 0 && (!read_resp(fd, r, pend) || r.status != 200)) {
      close(fd);
      fd = -1;
    }
    fds.push_back(fd);
  }
  return fds;
}

// Sends everything in one write, then reads n responses in order.
std::vector<Resp> pipelined(int port, const std::string &all, int n) {
  std::vector<Resp> out;
  int fd = connect_to(port);
  if (fd < 0) return out;
  send_all(fd, all);
  std::string pend;
  for (int i = 0; i < n; i++) {
    Resp r;
    if (!read_resp(fd, r, pend)) break;
    out.push_back(r);
  }
  close(fd);
  return out;
}

// Reads what the server sends until it closes or within ms; returns the bytes (closed: set when it closed).
std::string read_until_close(int fd, int ms, bool *closed) {
  std::string got;
  *closed = false;
  auto end = Clock::now() + std::chrono::milliseconds(ms);
  char b[4096];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t k = recv(fd, b, sizeof b, 0);
    if (k <= 0) {
      *closed = true;
      break;
    }
    got.append(b, (size_t)k);
  }
  return got;
}

// A response read whole as raw bytes (one the server wrote before closing): its head, status and body.
Resp raw_resp(const std::string &got) {
  Resp x;
  x.head = got.substr(0, got.find("\r\n\r\n") + 2);
  x.status = atoi(got.c_str() + 9);
  x.body = got.substr(got.find("\r\n\r\n") + 4);
  return x;
}

struct Conn : ::testing::Test {
  TinyModel m;
  FakeWorker fw;
};

TEST_F(Conn, PipelinedRequestsAnsweredInOrder) {
  ConnRouter r(m, fw.port(), 64, 64, 10);
  ASSERT_TRUE(r.wait_up());
  std::string chat2 = CHAT + R"(,"max_tokens":2})";
  auto out = pipelined(r.port(),
                       post_req("/v1/chat/completions", chat2) + GET_MODELS +
                           post_req("/v1/completions", R"({"prompt":"ab","max_tokens":1})") +
                           post_req("/tokenize", R"({"prompt":"abc"})"),
                       4);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].status, 200);
  EXPECT_NE(out[0].body.find("\"chat.completion\""), std::string::npos) << out[0].body;
  EXPECT_EQ(out[1].status, 200);
  EXPECT_NE(out[1].body.find("\"object\":\"list\""), std::string::npos) << out[1].body;
  EXPECT_EQ(out[2].status, 200);
  EXPECT_NE(out[2].body.find("\"text_completion\""), std::string::npos) << out[2].body;
  EXPECT_EQ(out[3].body, R"({"tokens":[97,98,99],"count":3,"max_model_len":512})");
  // a stream, then a request refused at its head (no body: the connection stays open), then another
  out = pipelined(r.port(),
                  post_req("/v1/chat/completions", CHAT + R"(,"max_tokens":2,"stream":true})") +
                      "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n" + "POST /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" +
                      GET_MODELS,
                  4);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].status, 200);
  EXPECT_NE(out[0].body.find("data: [DONE]"), std::string::npos) << out[0].body;
  expect_error(out[1], 404, "not_found");
  expect_error(out[2], 405, "method_not_allowed");
  EXPECT_EQ(out[3].status, 200);
  // two streams and a non-stream answer back to back
  std::string cs = post_req("/v1/chat/completions", CHAT + R"(,"max_tokens":3,"stream":true})");
  out = pipelined(r.port(), cs + GET_MODELS + cs + post_req("/v1/chat/completions", chat2), 4);
  ASSERT_EQ(out.size(), 4u);
  for (int i : {0, 2}) {
    EXPECT_EQ(out[i].header("content-type"), "text/event-stream");
    EXPECT_NE(out[i].body.find("data: [DONE]"), std::string::npos) << out[i].body;
  }
  EXPECT_NE(out[1].body.find("\"object\":\"list\""), std::string::npos);
  EXPECT_NE(out[3].body.find("\"chat.completion\""), std::string::npos);
}

TEST_F(Conn, PerClientCapAnswers503) {
  const int cap = 8;
  ConnRouter r(m, fw.port(), 1000, cap, 10);
  ASSERT_TRUE(r.wait_up());
  std::vector<int> fds = open_served(r.port(), cap);
  ASSERT_EQ(std::count(fds.begin(), fds.end(), -1), 0);
  auto t0 = Clock::now();
  int extra = connect_to(r.port());
  ASSERT_GE(extra, 0);
  bool closed;
  std::string got = read_until_close(extra, 3000, &closed);
  EXPECT_LT(Clock::now() - t0, 1000ms);
  EXPECT_TRUE(closed);
  close(extra);
  ASSERT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  Resp x = raw_resp(got);
  expect_error(x, 503, "too_many_connections");
  EXPECT_EQ(x.header("connection"), "close");
  // the capped connections still work, and closing one makes room
  std::string pend;
  send_all(fds[0], GET_MODELS);
  Resp ok;
  ASSERT_TRUE(read_resp(fds[0], ok, pend));
  EXPECT_EQ(ok.status, 200);
  close(fds[0]);
  fds.erase(fds.begin());
  Resp again;
  for (int i = 0; i < 100; i++) {
    again = request(r.port(), "GET", "/v1/models", "");
    if (again.status == 200) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(again.status, 200);
  for (int fd : fds) close(fd);
}

TEST_F(Conn, TotalCapAnswers503) {
  ConnRouter r(m, fw.port(), 3, 100, 10);
  std::vector<int> fds = open_served(r.port(), 3);
  ASSERT_EQ(std::count(fds.begin(), fds.end(), -1), 0);
  int extra = connect_to(r.port());
  bool closed;
  std::string got = read_until_close(extra, 3000, &closed);
  close(extra);
  EXPECT_TRUE(closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_NE(got.find("too_many_connections"), std::string::npos) << got;
  for (int fd : fds) close(fd);
}

TEST_F(Conn, PartialHeadClosedAfterHeaderTimeout) {
  ConnRouter r(m, fw.port(), 64, 64, /*header_s=*/1, /*conn_timeout_s=*/30);
  int fd = connect_to(r.port());
  auto t0 = Clock::now();
  send_all(fd, "GET /v1/models HTTP/1.1\r\nHost: x\r\n");
  // trickling bytes keeps MHD's idle timer alive, but not the head deadline
  bool closed = false;
  for (int i = 0; i < 40 && !closed; i++) {
    send_all(fd, "X-A: b\r\n");
    read_until_close(fd, 100, &closed);
  }
  EXPECT_TRUE(closed);
  auto took = Clock::now() - t0;
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 2500ms);
  close(fd);
  // a connection that delivered its head in time is served
  fd = connect_to(r.port());
  std::this_thread::sleep_for(500ms);
  send_all(fd, GET_MODELS);
  Resp ok;
  std::string pend;
  ASSERT_TRUE(read_resp(fd, ok, pend));
  EXPECT_EQ(ok.status, 200);
  close(fd);
}

// A complete head, then the body a byte at a time: answered 408 request_timeout once body_timeout_s has passed, and
// closed (each byte restarts MHD's idle timer, so without the body deadline it stays open as long as it trickles).
TEST_F(Conn, TrickledBodyAnswered408AndClosed) {
  ConnRouter r(m, fw.port(), 64, 64, /*header_s=*/10, /*conn_timeout_s=*/30, false, /*body_s=*/1);
  ASSERT_TRUE(r.wait_up());
  int fd = connect_to(r.port());
  auto t0 = Clock::now();
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: 200\r\n\r\n{");
  bool closed = false;
  std::string got;
  for (int i = 0; i < 50 && !closed; i++) {
    send_all(fd, " ");
    got += read_until_close(fd, 200, &closed);
  }
  auto took = Clock::now() - t0;
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 6000ms);
  ASSERT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  Resp x = raw_resp(got);
  expect_error(x, 408, "request_timeout");
  EXPECT_NE(x.body.find("body_timeout_s"), std::string::npos) << x.body;
  EXPECT_EQ(x.header("connection"), "close");
  // a chunked body the same
  fd = connect_to(r.port());
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n");
  got.clear();
  closed = false;
  for (int i = 0; i < 50 && !closed; i++) {
    send_all(fd, "1\r\n \r\n");
    got += read_until_close(fd, 200, &closed);
  }
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  // a request whose body comes in time is served as before
  EXPECT_EQ(request(r.port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":2})").status, 200);
}

// The deadline grows by 1 s per 4 KiB received: a body larger than body_timeout_s allows at once, sent steadily at
// about 10 KiB/s, is read whole and answered (here 400: its prompt is longer than the tiny model's context).
TEST_F(Conn, SteadyLargeBodyOutlastsTheBodyTimeout) {
  ConnRouter r(m, fw.port(), 64, 64, 10, 30, false, /*body_s=*/1, /*max_body=*/1 << 16);
  ASSERT_TRUE(r.wait_up());
  std::string body = R"({"prompt":")" + std::string(16000, 'a') + R"(","max_tokens":1})";
  int fd = connect_to(r.port());
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n");
  auto t0 = Clock::now();
  for (size_t off = 0; off < body.size(); off += 1024) {
    send_all(fd, body.substr(off, 1024));
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_GT(Clock::now() - t0, 1000ms); // it did take longer than body_timeout_s
  Resp x;
  std::string pend;
  ASSERT_TRUE(read_resp(fd, x, pend));
  close(fd);
  EXPECT_NE(x.status, 408) << x.body;
  expect_error(x, 400, "context_length_exceeded");
}

// The issue's lockout: slow bodies fill max_connections, and every other client gets 503 for as long as they trickle.
// With the body deadline they are answered 408 and closed after body_timeout_s, and the router serves again.
TEST_F(Conn, SlowBodiesReleaseTheConnectionCap) {
  const int n_slow = 100;
  ConnRouter r(m, fw.port(), /*max_conns=*/n_slow, /*per_client=*/1000, 10, 30, false, /*body_s=*/1);
  ASSERT_TRUE(r.wait_up());
  std::vector<int> fds;
  for (int i = 0; i < n_slow; i++) {
    int fd = connect_to(r.port());
    ASSERT_GE(fd, 0);
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: 100\r\n\r\n{");
    fds.push_back(fd);
  }
  // every one trickles (a byte each 200 ms) until the router has answered and closed it
  std::vector<std::string> got(n_slow);
  std::vector<bool> done(n_slow, false);
  int n_done = 0;
  auto end = Clock::now() + 15s;
  while (n_done < n_slow && Clock::now() < end) {
    for (int i = 0; i < n_slow; i++)
      if (!done[i]) send_all(fds[i], " ");
    auto tick = Clock::now() + 200ms;
    while (Clock::now() < tick) {
      std::vector<pollfd> p;
      for (int i = 0; i < n_slow; i++) p.push_back(pollfd{fds[i], POLLIN, 0});
      if (poll(p.data(), p.size(), 50) <= 0) continue;
      for (int i = 0; i < n_slow; i++) {
        if (done[i] || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char b[4096];
        ssize_t k = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
        if (k > 0) got[i].append(b, (size_t)k);
        else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
          done[i] = true;
          n_done++;
        }
      }
    }
  }
  EXPECT_EQ(n_done, n_slow) << "slow bodies still open after 15 s";
  int n408 = 0;
  for (auto &g : got) n408 += g.rfind("HTTP/1.1 408", 0) == 0;
  EXPECT_EQ(n408, n_slow);
  for (int fd : fds) close(fd);
  Resp ok;
  for (int i = 0; i < 100; i++) { // the gate counts a connection out once MHD has closed it
    ok = request(r.port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":2})");
    if (ok.status == 200) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(ok.status, 200) << ok.body;
}

// Idle connections cost a sleeping thread each; a normal request is still answered while 2,000 are open.
TEST_F(Conn, ManyIdleConnectionsDoNotStarveOthers) {
  const int n_idle = 2000;
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < (rlim_t)(2 * n_idle + 256)) { // both ends of every connection live in this process
    rlim_t want = (rlim_t)(2 * n_idle + 256);
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(rl.rlim_max, want);
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < (rlim_t)(2 * n_idle + 256)) GTEST_SKIP() << "open-file limit " << rl.rlim_cur << " too low";
  ConnRouter r(m, fw.port(), 4096, 4096, 30);
  ASSERT_TRUE(r.wait_up());
  std::vector<int> fds;
  for (int i = 0; i < n_idle; i++) {
    int fd = connect_to(r.port());
    ASSERT_GE(fd, 0) << i;
    fds.push_back(fd);
  }
  // the accept thread takes connections in order: the request below comes after every idle one
  auto t0 = Clock::now();
  Resp x = request(r.port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":2})");
  EXPECT_EQ(x.status, 200) << x.body;
  EXPECT_LT(Clock::now() - t0, 2000ms);
  EXPECT_EQ(request(r.port(), "GET", "/v1/models", "").status, 200);
  // none of the idle ones was refused
  int refused = 0;
  for (int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) > 0) refused++;
  }
  EXPECT_EQ(refused, 0);
  for (int fd : fds) close(fd);
}

TEST_F(Conn, ModelById) {
  ConnRouter r(m, fw.port(), 64, 64, 10);
  Resp x = request(r.port(), "GET", "/v1/models/tiny", "");
  ASSERT_EQ(x.status, 200) << x.body;
  cJSON *o = js(x.body);
  ASSERT_NE(o, nullptr);
  EXPECT_STREQ(cJSON_GetObjectItem(o, "id")->valuestring, "tiny");
  EXPECT_STREQ(cJSON_GetObjectItem(o, "object")->valuestring, "model");
  EXPECT_STREQ(cJSON_GetObjectItem(o, "owned_by")->valuestring, "dserve");
  cJSON_Delete(o);
  expect_error(request(r.port(), "GET", "/v1/models/other", ""), 404, "model_not_found");
  expect_error(request(r.port(), "GET", "/v1/models/org/tiny", ""), 404, "model_not_found");
  expect_error(request(r.port(), "POST", "/v1/models/tiny", "{}"), 405, "method_not_allowed");
  EXPECT_EQ(request(r.port(), "HEAD", "/v1/models/tiny", "").status, 200);
}

TEST_F(Conn, BearerSchemeAnyCase) {
  ConnRouter r(m, fw.port(), 64, 64, 10, 30, /*api_key=*/true);
  for (const char *h : {"Bearer sekrit", "bearer sekrit", "BEARER sekrit", "bEaReR  sekrit"})
    EXPECT_EQ(request(r.port(), "GET", "/v1/models", "", std::string("Authorization: ") + h + "\r\n").status, 200) << h;
  for (const char *h : {"bearer Sekrit", "bearersekrit", "Basic sekrit", "bearer sekrit2", "bearer"})
    expect_error(request(r.port(), "GET", "/v1/models", "", std::string("Authorization: ") + h + "\r\n"), 401);
  expect_error(request(r.port(), "GET", "/v1/models/tiny", ""), 401, "invalid_api_key");
}

TEST_F(Conn, NulRefusedOverHttp) {
  ConnRouter r(m, fw.port(), 64, 64, 10);
  ASSERT_TRUE(r.wait_up());
  Resp x = request(r.port(), "POST", "/v1/chat/completions",
                   R"({"model":"tiny","messages":[{"role":"user","content":"a\u0000b"}]})");
  expect_error(x, 400);
  EXPECT_NE(x.body.find("\"param\":\"messages[0].content\""), std::string::npos) << x.body;
  x = request(r.port(), "POST", "/v1/completions", std::string("{\"prompt\":\"a\0b\"}", 16));
  expect_error(x, 400);
  EXPECT_NE(x.body.find("\"param\":\"prompt\""), std::string::npos) << x.body;
  x = request(r.port(), "POST", "/tokenize", R"({"prompt":"a\u0000"})");
  expect_error(x, 400);
  EXPECT_EQ(fw.n_generates(), 0u);
}

// The seeds the router put in each generate message, in order.
std::vector<double> seeds_of(FakeWorker &fw, size_t from) {
  std::vector<double> out;
  std::lock_guard<std::mutex> l(fw.mu);
  for (size_t i = from; i < fw.gen_json.size(); i++) {
    cJSON *o = cJSON_Parse(fw.gen_json[i].c_str());
    cJSON *sd = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "sampling"), "seed");
    out.push_back(cJSON_IsNumber(sd) ? sd->valuedouble : -1);
    cJSON_Delete(o);
  }
  return out;
}

TEST_F(Conn, SeedDrawnWhenAbsent) {
  ConnRouter r(m, fw.port(), 64, 64, 10);
  ASSERT_TRUE(r.wait_up());
  std::string body = CHAT + R"(,"n":2,"temperature":1,"max_tokens":1})";
  ASSERT_EQ(request(r.port(), "POST", "/v1/chat/completions", body).status, 200);
  ASSERT_EQ(request(r.port(), "POST", "/v1/chat/completions", body).status, 200);
  auto s = seeds_of(fw, 0);
  ASSERT_EQ(s.size(), 4u);
  for (double v : s) EXPECT_GE(v, 0);
  EXPECT_NE(s[0], s[1]); // the two choices of one call
  EXPECT_NE(s[0], s[2]); // two calls
  EXPECT_NE(s[1], s[3]);
  // an explicit seed: seed + choice index, every time
  body = CHAT + R"(,"n":2,"seed":1234,"max_tokens":1})";
  ASSERT_EQ(request(r.port(), "POST", "/v1/chat/completions", body).status, 200);
  ASSERT_EQ(request(r.port(), "POST", "/v1/chat/completions", body).status, 200);
  s = seeds_of(fw, 4);
  ASSERT_EQ(s.size(), 4u);
  std::sort(s.begin(), s.begin() + 2);
  std::sort(s.begin() + 2, s.end());
  EXPECT_EQ(s, (std::vector<double>{1234, 1235, 1234, 1235}));
}


// Request smuggling (issue 29's replays): a head whose framing two parsers could read differently is answered 400
// (code bad_framing) at once and the connection closed, so nothing sent after it on that connection is served.
// (A Content-Length that is no number, e.g. "+5", libmicrohttpd refuses itself, 400 and close, before the router
// sees the head.)
TEST_F(Conn, AmbiguousFramingIsRefusedAndTheConnectionClosed) {
  ConnRouter r(m, fw.port(), 64, 64, 10);
  ASSERT_TRUE(r.wait_up());
  const std::string hidden = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string body = R"({"prompt":"ab","max_tokens":1})";
  struct Case {
    const char *what;
    std::string req;
  } cases[] = {
      {"Content-Length and Transfer-Encoding",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n"
       "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden},
      {"differing Content-Lengths",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3\r\n"
       "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body + hidden},
      {"whitespace before a header's colon",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding : chunked"
       "\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + hidden},
      {"a transfer coding other than chunked",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, "
       "chunked\r\n\r\n0\r\n\r\n" + hidden},
  };
  for (const Case &c : cases) {
    int fd = connect_to(r.port());
    ASSERT_GE(fd, 0);
    send_all(fd, c.req);
    bool closed = false;
    std::string got = read_until_close(fd, 3000, &closed);
    close(fd);
    EXPECT_TRUE(closed) << c.what;
    EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << c.what << ": " << got;
    EXPECT_NE(got.find("\"bad_framing\""), std::string::npos) << c.what << ": " << got;
    size_t second = got.find("HTTP/1.1", 1);
    EXPECT_EQ(second, std::string::npos) << c.what << ": the request after it was served: " << got;
  }
  // Legal framing still works: chunked alone, and the same Content-Length twice (RFC 9110 allows the repeat).
  auto out = pipelined(r.port(),
                       "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: "
                       "chunked\r\n\r\n11\r\n{\"prompt\":\"abc\"}\r\n0\r\n\r\n" +
                           post_req("/tokenize", R"({"prompt":"abc"})", "Content-Length: 16\r\n"),
                       2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].status, 200) << out[0].body;
  EXPECT_EQ(out[1].status, 200) << out[1].body;
}

} // namespace
