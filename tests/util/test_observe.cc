// tests/util/test_observe.cc: the log's text and JSON-lines formats and structured lines, W3C trace context, and the
// OTLP/HTTP JSON span exporter against a collector the test runs (batches, counts, drops on a full queue).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/otlp_collector.h"

#include "util/clock.h"
#include "util/log.h"
#include "util/trace.h"

namespace {

// What fn writes to stderr.
template <class F> std::string captured(F fn) {
  int p[2];
  EXPECT_EQ(pipe(p), 0);
  int saved = dup(STDERR_FILENO);
  dup2(p[1], STDERR_FILENO);
  close(p[1]);
  fn();
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string out;
  char b[4096];
  for (ssize_t k; (k = read(p[0], b, sizeof b)) > 0;) out.append(b, (size_t)k);
  close(p[0]);
  return out;
}

void access_line() {
  utl_log_field f[] = {UTL_LF_S("id", "cmpl-1"),   UTL_LF_N("status", 200),        UTL_LF_N("ttft_ms", 12.5),
                       UTL_LF_S("workers", "p0>d0"), UTL_LF_S("note", "a \"b\" c"), UTL_LF_N("none", NAN),
                       UTL_LF_S("empty", nullptr)};
  utl_log_fields("router", "access", f, (int)(sizeof f / sizeof f[0]));
}

TEST(Log, StructuredLineAsText) {
  unsetenv("DSERVE_LOG_FORMAT");
  std::string s = captured(access_line);
  EXPECT_NE(s.find(" INFO  router: access id=cmpl-1 status=200 ttft_ms=12.5 workers=p0>d0 note=\"a \\\"b\\\" c\" "
                   "none=- empty=\"\"\n"),
            std::string::npos)
      << s;
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1);
}

TEST(Log, StructuredLineAndMessagesAsJsonLines) {
  setenv("DSERVE_LOG_FORMAT", "json", 1);
  EXPECT_STREQ(utl_log_format(), "json");
  std::string s = captured(access_line);
  EXPECT_EQ(s.rfind("{\"ts\":\"", 0), 0u) << s;
  EXPECT_NE(s.find("\",\"level\":\"INFO\",\"component\":\"router\",\"event\":\"access\",\"id\":\"cmpl-1\",\"status\":200,"
                   "\"ttft_ms\":12.5,\"workers\":\"p0>d0\",\"note\":\"a \\\"b\\\" c\",\"none\":null,\"empty\":\"\"}\n"),
            std::string::npos)
      << s;
  std::string m = captured([] { utl_warn("w0", "line one\ttab \"q\"\n"); });
  EXPECT_NE(m.find("\"level\":\"WARN\",\"component\":\"w0\",\"msg\":\"line one\\ttab \\\"q\\\"\"}\n"), std::string::npos)
      << m;
  std::string big(10000, 'x'); // cut to the line's bound, still one closed object
  std::string b = captured([&] { utl_log("w0", "%s", big.c_str()); });
  EXPECT_EQ(b.substr(b.size() - 2), "}\n");
  EXPECT_LE(b.size(), 4096u);
  unsetenv("DSERVE_LOG_FORMAT");
}

TEST(Log, FormatDefaultYieldsToTheEnvironment) {
  unsetenv("DSERVE_LOG_FORMAT");
  EXPECT_STREQ(utl_log_format(), "text");
  EXPECT_EQ(utl_log_format_default("yaml"), -1);
  EXPECT_EQ(utl_log_format_default("json"), 0);
  EXPECT_STREQ(utl_log_format(), "json");
  EXPECT_EQ(utl_log_format_default("text"), 0); // a flag or the launcher set it first: it stays
  EXPECT_STREQ(utl_log_format(), "json");
  unsetenv("DSERVE_LOG_FORMAT");
}

TEST(Trace, TraceparentReadsAndWritesW3C) {
  const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  utl_trace_ctx c;
  ASSERT_EQ(utl_traceparent_parse(tp, &c), 0);
  EXPECT_EQ(c.trace_id[0], 0x4b);
  EXPECT_EQ(c.span_id[7], 0xb7);
  EXPECT_EQ(c.sampled, 1);
  char out[UTL_TRACEPARENT_LEN + 1];
  utl_traceparent_format(&c, out);
  EXPECT_STREQ(out, tp);
  ASSERT_EQ(utl_traceparent_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", &c), 0);
  EXPECT_EQ(c.sampled, 0);
  // a later version may add fields after a dash: its first 55 characters are read
  EXPECT_EQ(utl_traceparent_parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes", &c), 0);
  for (const char *bad : {"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                          "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // upper case
                          "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
                          "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero parent id
                          "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff
                          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", // version 00 is exact
                          "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g"})
    EXPECT_EQ(utl_traceparent_parse(bad, &c), -1) << bad;
  EXPECT_EQ(utl_traceparent_parse(nullptr, &c), -1);
}

TEST(Trace, EndpointUrls) {
  char host[64], path[64], why[128];
  int port;
  ASSERT_EQ(utl_http_url_parse("http://otel:4318/v1/traces", host, sizeof host, &port, path, sizeof path, why,
                               sizeof why), 0);
  EXPECT_STREQ(host, "otel");
  EXPECT_EQ(port, 4318);
  EXPECT_STREQ(path, "/v1/traces");
  ASSERT_EQ(utl_http_url_parse("http://10.0.0.1", host, sizeof host, &port, path, sizeof path, why, sizeof why), 0);
  EXPECT_EQ(port, 80);
  EXPECT_STREQ(path, "/");
  for (const char *bad : {"https://otel:4318/v1/traces", "otel:4318", "http://:4318/x", "http://otel:0/x",
                          "http://otel:99999/x", "http://otel:12a/x", "http://otel:4318/a b"})
    EXPECT_EQ(utl_http_url_parse(bad, host, sizeof host, &port, path, sizeof path, why, sizeof why), -1) << bad;
}

TEST(Trace, ExporterPostsOtlpJsonBatches) {
  Collector col;
  std::string url = "http://127.0.0.1:" + std::to_string(col.port) + "/v1/traces";
  utl_tracer_opts o = {url.c_str(), "dserve-test", 64, 20};
  utl_tracer *t = nullptr;
  char err[256];
  ASSERT_EQ(utl_tracer_new(&o, &t, err, sizeof err), 0) << err;
  utl_trace_ctx parent;
  ASSERT_EQ(utl_traceparent_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &parent), 0);
  utl_span root;
  utl_span_init(&root, &parent, "request", UTL_SPAN_SERVER, 1000, 5000);
  utl_span_str(&root, "http.route", "/v1/completions");
  utl_span_num(&root, "gen_ai.usage.input_tokens", 37);
  utl_span_num(&root, "ratio", 0.25);
  utl_trace_ctx child_ctx;
  utl_span_ctx(&root, &child_ctx);
  utl_span child;
  utl_span_init(&child, &child_ctx, "prefill", UTL_SPAN_INTERNAL, 2000, 1500); // an end before its start: clamped
  EXPECT_EQ(child.end_ns, 2000);
  EXPECT_EQ(utl_tracer_submit(t, &root), 0);
  EXPECT_EQ(utl_tracer_submit(t, &child), 0);
  utl_tracer_free(t); // posts what waits
  std::string got = col.all();
  EXPECT_NE(got.find("POST /v1/traces HTTP/1.1\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Content-Type: application/json\r\n"), std::string::npos);
  EXPECT_NE(got.find("\"service.name\",\"value\":{\"stringValue\":\"dserve-test\"}"), std::string::npos) << got;
  EXPECT_NE(got.find("\"traceId\":\"4bf92f3577b34da6a3ce929d0e0e4736\""), std::string::npos);
  EXPECT_NE(got.find("\"parentSpanId\":\"00f067aa0ba902b7\",\"name\":\"request\",\"kind\":2,"
                     "\"startTimeUnixNano\":\"1000\",\"endTimeUnixNano\":\"5000\""),
            std::string::npos)
      << got;
  char sid[17];
  for (int i = 0; i < 8; i++) snprintf(sid + 2 * i, 3, "%02x", root.span_id[i]);
  EXPECT_NE(got.find(std::string("\"parentSpanId\":\"") + sid + "\",\"name\":\"prefill\""), std::string::npos) << got;
  EXPECT_NE(got.find("{\"key\":\"gen_ai.usage.input_tokens\",\"value\":{\"intValue\":\"37\"}}"), std::string::npos);
  EXPECT_NE(got.find("{\"key\":\"ratio\",\"value\":{\"doubleValue\":0.25}}"), std::string::npos);
  EXPECT_NE(got.find("{\"key\":\"http.route\",\"value\":{\"stringValue\":\"/v1/completions\"}}"), std::string::npos);
}

TEST(Trace, AFullQueueDropsAndCountsInsteadOfWaiting) {
  int port;
  close(bind_loopback(&port)); // a port nothing listens on: every post fails
  std::string url = "http://127.0.0.1:" + std::to_string(port) + "/v1/traces";
  utl_tracer_opts o = {url.c_str(), "dserve-test", 16, 60000}; // nothing is taken before 60 s
  utl_tracer *t = nullptr;
  char err[256];
  ASSERT_EQ(utl_tracer_new(&o, &t, err, sizeof err), 0) << err;
  utl_trace_ctx parent = {};
  utl_trace_new_id(parent.trace_id, sizeof parent.trace_id);
  utl_trace_new_id(parent.span_id, sizeof parent.span_id);
  utl_span sp;
  utl_span_init(&sp, &parent, "decode", UTL_SPAN_INTERNAL, 1, 2);
  int ok = 0;
  for (int i = 0; i < 20; i++) ok += utl_tracer_submit(t, &sp) == 0;
  EXPECT_EQ(ok, 16);
  unsigned long long done, dropped, failed;
  utl_tracer_counts(t, &done, &dropped, &failed);
  EXPECT_EQ(dropped, 4u);
  EXPECT_EQ(done, 0u);
  utl_tracer_free(t); // the post fails (refused): the 16 count as failed, nothing hangs
  EXPECT_EQ(utl_tracer_submit(nullptr, &sp), -1);
  utl_tracer_opts bad = {"https://x/v1/traces", "s", 16, 100};
  EXPECT_EQ(utl_tracer_new(&bad, &t, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("https is not supported"), std::string::npos) << err;
}

} // namespace
