// tests/clock/test_clock.cc: every timed wait keeps its length when the wall clock steps: the hub's next event, the
// span exporter's flush and the router's reconnect backoff, run with CLOCK_REALTIME shifted an hour (wallshift.c).
// A deadline computed on the wall clock would put the wait an hour out (or in the past); each case bounds its own run
// on the monotonic clock and releases a stalled wait itself, so a regression fails in seconds rather than hanging.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "tests/otlp_collector.h"
#include "tests/router/http_util.h"

extern "C" {
#include "ctl/hub.h"
#include "router/router.h"
#include "tests/clock/wallshift.h"
#include "util/trace.h"
}

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock; // CLOCK_MONOTONIC: the shim leaves it alone

constexpr int64_t HOUR_NS = 3600LL * 1000000000LL;
// How long a wait of a few hundred ms may take on a loaded (or sanitized) machine before it counts as stalled.
const auto BOUND = std::chrono::seconds(10 * DSERVE_TIMEOUT_SCALE);

// Shifts the wall clock for one test and puts it back after.
struct Shift {
  explicit Shift(int64_t ns) { wallshift_set(ns); }
  ~Shift() { wallshift_set(0); }
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The shim is in effect: without it every case below would pass on any code.
TEST(Clock, ShimShiftsTheWallClockOnly) {
  Shift s(HOUR_NS);
  timespec shifted{}, real{};
  ASSERT_EQ(clock_gettime(CLOCK_REALTIME, &shifted), 0);
  ASSERT_EQ(wallshift_real(&real), 0);
  EXPECT_NEAR((double)(shifted.tv_sec - real.tv_sec), 3600.0, 5.0);
  EXPECT_NEAR((double)(time(nullptr) - real.tv_sec), 3600.0, 5.0);
  timeval tv{};
  ASSERT_EQ(gettimeofday(&tv, nullptr), 0);
  EXPECT_NEAR((double)(tv.tv_sec - real.tv_sec), 3600.0, 5.0);
}

// ctl_hub_next(200 ms) with no event returns 0 after 200 ms, whichever way the wall clock was stepped.
void hub_next_waits_its_timeout(int64_t shift_ns) {
  ctl_hub_opts o{};
  o.name = "clock";
  o.role = "both";
  o.secret = DSERVE_TEST_SECRET;
  ctl_hub *h = nullptr;
  char err[256];
  ASSERT_EQ(ctl_hub_new(&o, &h, err, sizeof err), 0) << err;
  Shift s(shift_ns);
  auto t0 = Clock::now();
  auto got = std::async(std::launch::async, [h] {
    ctl_event ev;
    return ctl_hub_next(h, &ev, 200);
  });
  bool stalled = got.wait_for(BOUND) != std::future_status::ready;
  double waited = ms_since(t0);
  if (stalled) ctl_hub_wake(h); // release the stalled waiter so the case ends
  int rc = got.get();
  ctl_hub_free(h);
  ASSERT_FALSE(stalled) << "ctl_hub_next(200 ms) still waiting after " << waited << " ms with the wall clock shifted "
                        << shift_ns / 1000000000 << " s";
  EXPECT_EQ(rc, 0);
  EXPECT_GE(waited, 200.0) << "the wait was cut short by the wall clock's step";
}

TEST(Clock, HubNextWallClockBackAnHour) { hub_next_waits_its_timeout(HOUR_NS); }
TEST(Clock, HubNextWallClockForwardAnHour) { hub_next_waits_its_timeout(-HOUR_NS); }

// The span exporter posts a lone span after flush_ms (100 ms), not flush_ms plus the step.
TEST(Clock, TracerFlushesOnTime) {
  Collector c;
  utl_tracer_opts o{};
  std::string url = "http://127.0.0.1:" + std::to_string(c.port) + "/v1/traces";
  o.endpoint = url.c_str();
  o.service_name = "clock";
  o.flush_ms = 100;
  Shift s(HOUR_NS); // before the exporter starts: its first wait is already timed on the shifted clock
  utl_tracer *t = nullptr;
  char err[256];
  ASSERT_EQ(utl_tracer_new(&o, &t, err, sizeof err), 0) << err;
  utl_trace_ctx root{};
  utl_trace_new_id(root.trace_id, sizeof root.trace_id);
  utl_span sp;
  utl_span_init(&sp, &root, "step", UTL_SPAN_INTERNAL, 1, 2);
  ASSERT_EQ(utl_tracer_submit(t, &sp), 0);
  auto t0 = Clock::now();
  bool posted = false;
  while (!(posted = !c.all().empty()) && Clock::now() - t0 < BOUND) std::this_thread::sleep_for(10ms);
  double waited = ms_since(t0);
  utl_tracer_free(t); // wakes a stalled exporter too
  EXPECT_TRUE(posted) << "no span posted " << waited << " ms after submit with flush_ms 100";
}

// The router's link retries a worker that refused it after its backoff (100 ms, doubling to 2 s), so a worker that
// comes up later is reached in seconds.
TEST(Clock, RouterReconnectBackoff) {
  httptest::TinyModel m;
  // A listener that accepts the router's first attempt and resets it: the link then sleeps its backoff.
  int port = 0, lfd = bind_loopback(&port);
  ASSERT_EQ(listen(lfd, 4), 0);
  Shift s(HOUR_NS);
  httptest::Router r(m, port);
  ASSERT_NE(r.s, nullptr);
  int c = accept(lfd, nullptr, nullptr);
  ASSERT_GE(c, 0);
  linger reset{1, 0}; // close with a reset: the port keeps no socket that would stop the worker binding it below
  setsockopt(c, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  close(c);
  close(lfd); // the next attempts are refused until the worker below listens on the port
  ctl_hub_opts o{};
  o.name = "w0";
  o.role = "both";
  o.secret = DSERVE_TEST_SECRET;
  o.host = "127.0.0.1";
  o.port = port;
  o.hello_extra = [](void *, cJSON *ok) {
    cJSON_AddNumberToObject(ok, "n_ctx", 512);
    cJSON_AddNumberToObject(ok, "block_size", 16);
  };
  ctl_hub *w = nullptr;
  char err[256];
  ASSERT_EQ(ctl_hub_new(&o, &w, err, sizeof err), 0) << err;
  auto t0 = Clock::now();
  bool up = false;
  while (!(up = rtr_server_links_up(r.s) > 0) && Clock::now() - t0 < BOUND) std::this_thread::sleep_for(10ms);
  double waited = ms_since(t0);
  EXPECT_TRUE(up) << "the router had not reached the worker " << waited << " ms after it came up";
  rtr_server_free(r.s); // wakes a stalled link thread; before the worker's hub, which its link references
  r.s = nullptr;
  ctl_hub_free(w);
}

} // namespace
