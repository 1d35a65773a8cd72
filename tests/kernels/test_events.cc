// tests/kernels/test_events.cc: the backend-neutral event, download_ready and host_register wrappers on every table shape.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/krn.h"

namespace {

struct Calls {
  int made = 0, freed = 0, recorded = 0, waited = 0, ready = 0, download = 0, reg = 0, unreg = 0;
} g;
int g_ev; // the fake event's identity
void *f_new(krn_ctx *) { return g.made++, &g_ev; }
void f_free(krn_ctx *, void *e) { EXPECT_EQ(e, &g_ev); g.freed++; }
void f_record(krn_ctx *, void *e) { EXPECT_EQ(e, &g_ev); g.recorded++; }
void f_wait(krn_ctx *, void *e) { EXPECT_EQ(e, &g_ev); g.waited++; }
void f_ready(krn_ctx *, void *d, const void *s, size_t n) { g.ready++, std::memcpy(d, s, n); }
void f_download(krn_ctx *, void *d, const void *s, size_t n) { g.download++, std::memcpy(d, s, n); }
int f_reg(krn_ctx *, void *, size_t) { return g.reg++, -1; }
void f_unreg(krn_ctx *, void *) { g.unreg++; }
void *f_new_fails(krn_ctx *) { return nullptr; }

TEST(KrnEvents, TableWithEventsIsCalled) {
  g = Calls{};
  krn_backend be{};
  be.name = "fake";
  be.download = f_download;
  be.event_new = f_new;
  be.event_free = f_free;
  be.event_record = f_record;
  be.event_wait = f_wait;
  be.download_ready = f_ready;
  be.host_register = f_reg;
  be.host_unregister = f_unreg;
  krn_ctx c{};
  c.be = &be;
  char err[128];
  krn_event *e = nullptr;
  ASSERT_EQ(krn_event_new(&c, &e, err, sizeof err), 0) << err;
  EXPECT_EQ((void *)e, (void *)&g_ev);
  krn_event_record(&c, e);
  krn_event_wait(&c, e);
  krn_event_free(&c, e);
  int src[4] = {1, 2, 3, 4}, dst[4] = {0};
  krn_download_ready(&c, dst, src, sizeof src);
  EXPECT_EQ(std::memcmp(dst, src, sizeof src), 0);
  EXPECT_EQ(krn_host_register(&c, dst, sizeof dst), -1); // its answer is passed on
  krn_host_unregister(&c, dst);
  krn_host_unregister(&c, nullptr); // no-op
  EXPECT_EQ(g.made, 1);
  EXPECT_EQ(g.recorded, 1);
  EXPECT_EQ(g.waited, 1);
  EXPECT_EQ(g.freed, 1);
  EXPECT_EQ(g.ready, 1);
  EXPECT_EQ(g.download, 0);
  EXPECT_EQ(g.reg, 1);
  EXPECT_EQ(g.unreg, 1);
  be.event_new = f_new_fails;
  EXPECT_EQ(krn_event_new(&c, &e, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("fake"), std::string::npos) << err;
  EXPECT_EQ(e, nullptr);
}

TEST(KrnEvents, TableWithoutThemFallsBack) {
  g = Calls{};
  krn_backend be{};
  be.name = "bare";
  be.download = f_download;
  krn_ctx c{};
  c.be = &be;
  char err[128];
  krn_event *e = nullptr;
  ASSERT_EQ(krn_event_new(&c, &e, err, sizeof err), 0);
  EXPECT_EQ(e, nullptr); // "already done"
  krn_event_record(&c, e);
  krn_event_wait(&c, e);
  krn_event_free(&c, e);
  int src[2] = {5, 6}, dst[2] = {0};
  krn_download_ready(&c, dst, src, sizeof src);
  EXPECT_EQ(g.download, 1); // plain download stands in
  EXPECT_EQ(dst[1], 6);
  EXPECT_EQ(krn_host_register(&c, dst, sizeof dst), 0);
  krn_ctx none{};
  EXPECT_EQ(krn_event_new(&none, &e, err, sizeof err), -1); // no backend: an error, not a crash
}

TEST(KrnEvents, CpuTablesHaveTrivialEvents) {
  krn_ctx c{};
  for (const krn_backend *be : {krn_cpu_scalar(), krn_cpu_best()}) {
    c.be = be;
    char err[128];
    krn_event *e = nullptr;
    ASSERT_EQ(krn_event_new(&c, &e, err, sizeof err), 0) << err;
    EXPECT_NE(e, nullptr) << be->name; // the prefill worker's per-layer path runs on cpu too
    krn_event_record(&c, e);
    krn_event_wait(&c, e); // returns at once: nothing is pending
    krn_event_free(&c, e);
    std::vector<float> a(8, 2.5f), b(8, 0.0f);
    krn_download_ready(&c, b.data(), a.data(), 8 * sizeof(float));
    EXPECT_EQ(a, b);
  }
}

} // namespace
