// tests/router/test_metrics.cc: the Prometheus registry: kinds, labels, histogram buckets, text format, threads.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "router/metrics.h"
}

namespace {

std::string render(rtr_metrics *m) {
  char *out = nullptr;
  size_t len = 0;
  char err[128];
  EXPECT_EQ(rtr_metrics_render(m, &out, &len, err, sizeof err), 0);
  std::string s(out, len);
  EXPECT_EQ(strlen(out), len);
  free(out);
  return s;
}

// A labelled registry puts its label first on every series, escaped as the text format asks; lookups see it too.
TEST(Metrics, RegistryLabelComesFirst) {
  rtr_metrics *m = rtr_metrics_new_labeled("model_name", "org/a\"b\\c");
  ASSERT_TRUE(m);
  rtr_metric *c = rtr_metrics_counter(m, "dserve:x_total", "X.", nullptr);
  const double one[] = {1};
  rtr_metric *h = rtr_metrics_histogram(m, "dserve:h_seconds", "H.", "worker=\"w0\"", one, 1);
  ASSERT_TRUE(c && h);
  EXPECT_EQ(rtr_metrics_counter(m, "dserve:x_total", "", ""), c);
  rtr_metric_add(c, 2);
  rtr_metric_observe(h, 0.5);
  EXPECT_EQ(render(m), "# HELP dserve:x_total X.\n# TYPE dserve:x_total counter\n"
                       "dserve:x_total{model_name=\"org/a\\\"b\\\\c\"} 2\n"
                       "# HELP dserve:h_seconds H.\n# TYPE dserve:h_seconds histogram\n"
                       "dserve:h_seconds_bucket{model_name=\"org/a\\\"b\\\\c\",worker=\"w0\",le=\"1\"} 1\n"
                       "dserve:h_seconds_bucket{model_name=\"org/a\\\"b\\\\c\",worker=\"w0\",le=\"+Inf\"} 1\n"
                       "dserve:h_seconds_sum{model_name=\"org/a\\\"b\\\\c\",worker=\"w0\"} 0.5\n"
                       "dserve:h_seconds_count{model_name=\"org/a\\\"b\\\\c\",worker=\"w0\"} 1\n");
  rtr_metrics_free(m);
}

TEST(Metrics, CounterGaugeText) {
  rtr_metrics *m = rtr_metrics_new();
  rtr_metric *c = rtr_metrics_counter(m, "dserve:prompt_tokens_total", "Prompt tokens.", nullptr);
  rtr_metric *g = rtr_metrics_gauge(m, "dserve:num_requests_running", "Running.", "");
  ASSERT_TRUE(c && g);
  rtr_metric_add(c, 5);
  rtr_metric_add(c, -3); // ignored: counters only go up
  rtr_metric_add(c, 2.5);
  rtr_metric_set(g, 7);
  rtr_metric_add(g, -2);
  EXPECT_DOUBLE_EQ(rtr_metric_value(c), 7.5);
  EXPECT_DOUBLE_EQ(rtr_metric_value(g), 5);
  EXPECT_EQ(rtr_metrics_counter(m, "dserve:prompt_tokens_total", "x", nullptr), c); // same series back
  EXPECT_EQ(render(m), "# HELP dserve:prompt_tokens_total Prompt tokens.\n# TYPE dserve:prompt_tokens_total counter\n"
                       "dserve:prompt_tokens_total 7.5\n"
                       "# HELP dserve:num_requests_running Running.\n# TYPE dserve:num_requests_running gauge\n"
                       "dserve:num_requests_running 5\n");
  rtr_metrics_free(m);
}

TEST(Metrics, LabelsGroupUnderOneFamily) {
  rtr_metrics *m = rtr_metrics_new();
  rtr_metric *a = rtr_metrics_counter(m, "req_total", "Requests.", "finished_reason=\"stop\"");
  rtr_metric *x = rtr_metrics_gauge(m, "other", "Other.", nullptr);
  rtr_metric *b = rtr_metrics_counter(m, "req_total", "ignored", "finished_reason=\"length\"");
  ASSERT_TRUE(a && b && x && a != b);
  rtr_metric_add(a, 1);
  rtr_metric_add(b, 2);
  std::string t = render(m);
  EXPECT_NE(t.find("# TYPE req_total counter\nreq_total{finished_reason=\"stop\"} 1\n"
                   "req_total{finished_reason=\"length\"} 2\n# HELP other"),
            std::string::npos)
      << t;
  EXPECT_EQ(t.find("ignored"), std::string::npos);
  rtr_metrics_free(m);
}

TEST(Metrics, HistogramBucketsCumulative) {
  rtr_metrics *m = rtr_metrics_new();
  const double bounds[] = {0.01, 0.1, 1};
  rtr_metric *h = rtr_metrics_histogram(m, "lat_seconds", "Latency.", nullptr, bounds, 3);
  ASSERT_TRUE(h);
  for (double v : {0.005, 0.01, 0.05, 0.5, 3.0}) rtr_metric_observe(h, v);
  EXPECT_DOUBLE_EQ(rtr_metric_value(h), 5);
  EXPECT_NEAR(rtr_metric_sum(h), 3.565, 1e-12);
  std::string t = render(m);
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"0.01\"} 2\nlat_seconds_bucket{le=\"0.1\"} 3\n"
                   "lat_seconds_bucket{le=\"1\"} 4\nlat_seconds_bucket{le=\"+Inf\"} 5\n"
                   "lat_seconds_sum 3.565"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("lat_seconds_count 5\n"), std::string::npos);
  rtr_metrics_free(m);
}

TEST(Metrics, RefusesBadNamesKindsAndBuckets) {
  rtr_metrics *m = rtr_metrics_new();
  EXPECT_EQ(rtr_metrics_counter(m, "", "h", nullptr), nullptr);
  EXPECT_EQ(rtr_metrics_counter(m, "9abc", "h", nullptr), nullptr);
  EXPECT_EQ(rtr_metrics_counter(m, "a b", "h", nullptr), nullptr);
  ASSERT_NE(rtr_metrics_counter(m, "c", "h", nullptr), nullptr);
  EXPECT_EQ(rtr_metrics_gauge(m, "c", "h", nullptr), nullptr); // kind clash
  const double bad[] = {1, 1};
  EXPECT_EQ(rtr_metrics_histogram(m, "h1", "h", nullptr, bad, 2), nullptr);
  const double inf[] = {1, INFINITY};
  EXPECT_EQ(rtr_metrics_histogram(m, "h2", "h", nullptr, inf, 2), nullptr);
  std::vector<double> many(RTR_METRICS_MAX_BUCKETS + 1);
  for (size_t i = 0; i < many.size(); i++) many[i] = (double)i;
  EXPECT_EQ(rtr_metrics_histogram(m, "h3", "h", nullptr, many.data(), (int)many.size()), nullptr);
  rtr_metric_add(nullptr, 1); // no-ops
  rtr_metric_observe(nullptr, 1);
  rtr_metrics_free(nullptr);
  rtr_metrics_free(m);
}

TEST(Metrics, ThreadSafe) {
  rtr_metrics *m = rtr_metrics_new();
  const double bounds[] = {0.5};
  std::vector<std::thread> th;
  for (int t = 0; t < 8; t++)
    th.emplace_back([m, &bounds] {
      for (int i = 0; i < 10000; i++) {
        rtr_metric_add(rtr_metrics_counter(m, "n_total", "n", nullptr), 1);
        rtr_metric_observe(rtr_metrics_histogram(m, "h", "h", nullptr, bounds, 1), i % 2 ? 1.0 : 0.0);
      }
    });
  for (auto &t : th) t.join();
  EXPECT_DOUBLE_EQ(rtr_metric_value(rtr_metrics_counter(m, "n_total", "n", nullptr)), 80000);
  EXPECT_NE(render(m).find("h_bucket{le=\"0.5\"} 40000\nh_bucket{le=\"+Inf\"} 80000\n"), std::string::npos);
  rtr_metrics_free(m);
}

} // namespace
