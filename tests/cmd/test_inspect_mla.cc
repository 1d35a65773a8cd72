// tests/cmd/test_inspect_mla.cc: `dserve inspect` on a deepseek2 GGUF (tests/models/mla_model.h written to a temporary
// file): the latent attention's ranks and dims, the expert routing, the skipped nextn layers and the KV bytes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "tests/models/mla_model.h"
#include "tests/run_dserve.h"

namespace {

using cmdtest::run_dserve;

using dserve_test::TempGguf;

TEST(InspectMla, PrintsLatentRoutingAndKvBytes) {
  ASSERT_EQ(access(DSERVE_BINARY, X_OK), 0) << "dserve binary not built: " << DSERVE_BINARY;
  dserve_test::MlaShape s; // kv_lora_rank 32, rope 16, q_lora_rank 32, 2 heads of 16 + 16, value 16
  s.nextn = 1;
  TempGguf f(dserve_test::make_mla(s, 1).bytes);
  std::string out, err;
  ASSERT_EQ(run_dserve("inspect '" + f.path + "'", &out, &err), 0) << err;
  for (const char *want : {
           "engine loads it        yes: 2 layers, head dim 32,",
           "latent attention       kv_lora_rank 32, q_lora_rank 32, rope dim 16; 2 heads of key 32 (16 roped), "
           "value 16\n",
           "expert FFN length      32\n",
           "expert routing         1 shared, sigmoid gating (exp_probs_b: selection bias where present), weights "
           "normalised, scale 2, groups 2 (1 used), first 1 layers dense\n",
           "multi-token prediction 1 layers after the 2 used, not loaded",
           "KV cache               96 bytes per token per layer in f16 (1 part of 48 values: the latent and the roped "
           "key)\n"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n---\n" << out;
}

} // namespace
