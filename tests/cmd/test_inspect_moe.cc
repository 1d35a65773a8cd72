// tests/cmd/test_inspect_moe.cc: `dserve inspect` and the --bench roofline on a mixture-of-experts GGUF (a small
// synthetic qwen3moe and Mixtral-style llama written to a temporary file).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "tests/models/moe_model.h"
#include "tests/run_dserve.h"

namespace {

using cmdtest::run_dserve;

using dserve_test::TempGguf;

TEST(InspectMoe, PrintsExpertsUsedAndWidth) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  dserve_test::MoeShape s;
  TempGguf q(dserve_test::make_moe(s, 1).bytes);
  std::string out, err;
  ASSERT_EQ(run_dserve("inspect '" + q.path + "'", &out, &err), 0) << err;
  const std::string want = "experts                8\nexperts used           2\nexpert FFN length      ";
  EXPECT_NE(out.find(want + "64\n"), std::string::npos) << out;
  s.arch = "llama";
  TempGguf l(dserve_test::make_moe(s, 1).bytes);
  ASSERT_EQ(run_dserve("inspect '" + l.path + "'", &out, &err), 0) << err;
  EXPECT_NE(out.find(want + "(the feed-forward length)\n"), std::string::npos) << out;
}

// The batch-1 roofline counts the experts a token reads (2 of 8 slices of each *_exps tensor), not all of them.
TEST(InspectMoe, RooflineCountsTheUsedExpertsOnly) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  dserve_test::MoeShape s;
  s.wtype = KRN_Q8_0;
  dserve_test::MoeModel mm = dserve_test::make_moe(s, 1);
  double want = 0;
  for (auto &t : mm.w.tensors) {
    if (t.name == "token_embd.weight") continue; // untied: a step reads one row of it
    bool exps = t.name.size() > 12 && t.name.compare(t.name.size() - 12, 12, "_exps.weight") == 0;
    want += exps ? (double)t.data.size() / 8 * 2 : (double)t.data.size();
  }
  TempGguf f(mm.bytes);
  std::string out, err;
  ASSERT_EQ(run_dserve("generate --model '" + f.path + "' --bench --bench-prompt 16 --bench-gen 2 --bench-batch 2 "
                       "--threads 2", &out, &err), 0) << err;
  const char *w = strstr(out.c_str(), "decode weight MiB per step: ");
  double mib = 0;
  ASSERT_TRUE(w) << out;
  ASSERT_EQ(sscanf(w, "decode weight MiB per step: %lf", &mib), 1) << out;
  EXPECT_NEAR(mib, want / 1048576.0, 0.006) << out;
}

} // namespace
