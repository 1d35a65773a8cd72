// tests/router/test_observe.cc: what the router tells of a request that moved between workers: its access-log line
// (text format), the traceparent its generate messages carry, and its spans (request, queue, migration) at a
// collector the test runs.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "tests/otlp_collector.h"
#include "tests/router/http_util.h"

namespace {
using namespace httptest;

// stderr goes to a file while it lives; text() reads what was written so far.
struct StderrFile {
  std::string path;
  int saved = -1;
  StderrFile() {
    char t[] = "/tmp/dserve_observe_XXXXXX";
    int fd = mkstemp(t);
    path = t;
    saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  ~StderrFile() {
    dup2(saved, STDERR_FILENO);
    close(saved);
    unlink(path.c_str());
  }
  std::string text() {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

std::string field(const std::string &line, const std::string &key) { // key=value of a text line
  size_t at = line.find(" " + key + "=");
  if (at == std::string::npos) return "(none)";
  at += key.size() + 2;
  return line.substr(at, line.find(' ', at) - at);
}

TEST(Observe, AMovedStreamIsLoggedAndTraced) {
  unsetenv("DSERVE_LOG_FORMAT");
  Collector col;
  std::string url = "http://127.0.0.1:" + std::to_string(col.port) + "/v1/traces";
  const std::string trace = "4bf92f3577b34da6a3ce929d0e0e4736", caller = "00f067aa0ba902b7";
  TinyModel m;
  FakeWorker fw;
  std::string got, access;
  {
    StderrFile err;
    auto r = std::make_unique<Router>(m, fw.port(), 16, 64, std::vector<std::string>{}, 10, [&](cfg_cluster &c) {
      c.router.migration_limit = 2;
      c.router.migration_wait_ms = 5000;
      snprintf(c.tracing.endpoint, sizeof c.tracing.endpoint, "%s", url.c_str());
      snprintf(c.tracing.service_name, sizeof c.tracing.service_name, "dserve");
      c.tracing.sample_ratio = 0; // a request with a sampled traceparent is traced all the same
      c.tracing.queue_spans = 64;
      c.tracing.flush_ms = 20;
    });
    ASSERT_TRUE(r->wait_up());
    fw.mode = FakeWorker::DIE_ONCE; // one token, the link closes, the worker comes back: the stream moves once
    std::string body = CHAT + R"(,"stream":true,"max_tokens":5})";
    int fd = connect_to(r->port());
    send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\ntraceparent: 00-" +
                     trace + "-" + caller + "-01\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    char tmp[4096];
    while (got.find("data: [DONE]\n\n") == std::string::npos) {
      ssize_t k = recv(fd, tmp, sizeof tmp, 0);
      if (k <= 0) break;
      got.append(tmp, (size_t)k);
    }
    close(fd);
    for (int i = 0; i < 500 && access.empty(); i++) { // written once the answer is out
      std::string t = err.text();
      size_t at = t.find("router: access ");
      if (at != std::string::npos && t.find('\n', at) != std::string::npos)
        access = t.substr(at, t.find('\n', at) - at);
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    r.reset(); // posts the spans that wait
  }
  EXPECT_EQ(got.find("\"error\""), std::string::npos) << got;
  ASSERT_FALSE(access.empty());
  EXPECT_EQ(field(access, "route"), "/v1/chat/completions") << access;
  EXPECT_EQ(field(access, "status"), "200") << access;
  EXPECT_EQ(field(access, "stream"), "1") << access;
  EXPECT_EQ(field(access, "migrations"), "1") << access;
  EXPECT_EQ(field(access, "workers"), "w0,w0") << access; // the same worker, back after its restart
  EXPECT_EQ(field(access, "trace_id"), trace) << access;
  EXPECT_EQ(field(access, "id").rfind("chatcmpl-", 0), 0u) << access;

  // both generate messages carry the trace, with the router's request span as the parent
  std::string tp0, tp1;
  {
    std::lock_guard<std::mutex> l(fw.mu);
    ASSERT_EQ(fw.gen_json.size(), 2u);
    cJSON *a = cJSON_Parse(fw.gen_json[0].c_str()), *b = cJSON_Parse(fw.gen_json[1].c_str());
    tp0 = cJSON_GetStringValue(cJSON_GetObjectItem(a, "traceparent"));
    tp1 = cJSON_GetStringValue(cJSON_GetObjectItem(b, "traceparent"));
    cJSON_Delete(a);
    cJSON_Delete(b);
  }
  ASSERT_EQ(tp0.size(), 55u) << tp0;
  EXPECT_EQ(tp0, tp1);
  EXPECT_EQ(tp0.substr(0, 36), "00-" + trace + "-");
  std::string req_span = tp0.substr(36, 16);
  EXPECT_NE(req_span, caller);

  std::string spans = col.all();
  EXPECT_NE(spans.find("\"spanId\":\"" + req_span + "\",\"parentSpanId\":\"" + caller + "\",\"name\":\"request\""),
            std::string::npos)
      << spans;
  for (const char *name : {"queue", "migration"})
    EXPECT_NE(spans.find("\"parentSpanId\":\"" + req_span + "\",\"name\":\"" + name + "\""), std::string::npos)
        << name << "\n" << spans;
  EXPECT_NE(spans.find("{\"key\":\"http.response.status_code\",\"value\":{\"intValue\":\"200\"}}"), std::string::npos);
  EXPECT_NE(spans.find("\"stringValue\":\"dserve-router\""), std::string::npos);
}

// Without a tracing section nothing is traced: the generate carries no traceparent and the access line no trace id.
TEST(Observe, UntracedByDefault) {
  unsetenv("DSERVE_LOG_FORMAT");
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port());
  ASSERT_TRUE(r.wait_up());
  EXPECT_EQ(request(r.port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":2})",
                    "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n")
                .status,
            200);
  std::lock_guard<std::mutex> l(fw.mu);
  ASSERT_EQ(fw.gen_json.size(), 1u);
  EXPECT_EQ(fw.gen_json[0].find("traceparent"), std::string::npos) << fw.gen_json[0];
}

} // namespace
