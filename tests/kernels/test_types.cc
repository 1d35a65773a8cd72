// tests/kernels/test_types.cc: element types, half-float conversion and row sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/krn.h"

TEST(KrnTypes, HalfRoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    if (((h >> 10) & 0x1f) == 0x1f) continue; // inf / nan
    float f = krn_f16_to_f32((krn_f16)h);
    krn_f16 back = krn_f32_to_f16(f);
    if ((h & 0x7fff) == 0) { EXPECT_EQ(back & 0x7fff, 0); continue; }
    ASSERT_EQ(back, h) << "half 0x" << std::hex << h;
  }
}

TEST(KrnTypes, HalfRoundsToNearest) {
  EXPECT_EQ(krn_f16_to_f32(krn_f32_to_f16(1.0f)), 1.0f);
  EXPECT_EQ(krn_f16_to_f32(krn_f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(krn_f16_to_f32(krn_f32_to_f16(1e6f))));
  EXPECT_NEAR(krn_f16_to_f32(krn_f32_to_f16(0.1f)), 0.1f, 1e-4);
  EXPECT_NEAR(krn_f16_to_f32(krn_f32_to_f16(1e-6f)), 1e-6f, 1e-7);
}

TEST(KrnTypes, RowSizesAndNames) {
  EXPECT_EQ(krn_row_size(KRN_F32, 64), 256u);
  EXPECT_EQ(krn_row_size(KRN_F16, 64), 128u);
  EXPECT_EQ(krn_row_size(KRN_Q4_0, 64), 36u);
  EXPECT_EQ(krn_row_size(KRN_Q4_1, 64), 40u);
  EXPECT_EQ(krn_row_size(KRN_Q8_0, 64), 68u);
  EXPECT_STREQ(krn_type_name(KRN_Q4_1), "Q4_1");
  EXPECT_STREQ(krn_type_name(10), "Q2_K");
  EXPECT_FALSE(krn_type_known(10));
  EXPECT_FALSE(krn_type_known(-1));
  EXPECT_FALSE(krn_type_known(31));
  EXPECT_TRUE(krn_type_known(KRN_Q8_0));
}

// ggml's numbering and block sizes (ggml-common.h / gguf constants GGML_QUANT_SIZES): a GGUF's bytes are read in place.
TEST(KrnTypes, NewWeightTypesFollowGgml) {
  struct { int id; const char *name; int block; size_t bytes; } want[] = {
      {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {12, "Q4_K", 256, 144},
      {13, "Q5_K", 256, 176}, {14, "Q6_K", 256, 210}, {30, "BF16", 1, 2},
  };
  for (auto &w : want) {
    SCOPED_TRACE(w.name);
    EXPECT_TRUE(krn_type_known(w.id));
    EXPECT_STREQ(krn_type_name(w.id), w.name);
    EXPECT_EQ(krn_type_block(w.id), w.block);
    EXPECT_EQ(krn_type_block_bytes(w.id), w.bytes);
    EXPECT_EQ(krn_row_size((krn_type)w.id, 2 * w.block), 2 * w.bytes);
  }
  EXPECT_EQ((int)KRN_Q5_0, 6);
  EXPECT_EQ((int)KRN_Q5_1, 7);
  EXPECT_EQ((int)KRN_Q4_K, 12);
  EXPECT_EQ((int)KRN_Q5_K, 13);
  EXPECT_EQ((int)KRN_Q6_K, 14);
  EXPECT_EQ((int)KRN_BF16, 30);
  EXPECT_EQ(krn_row_size(KRN_Q4_K, 1024), 4u * 144);
  EXPECT_EQ(krn_type_block(10), 0);
  EXPECT_EQ(krn_type_block_bytes(10), 0u);
  EXPECT_EQ(krn_row_size((krn_type)10, 256), 0u);
}

TEST(KrnTypes, Bf16RoundsToNearestEven) {
  EXPECT_EQ(krn_f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(krn_bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(krn_bf16_to_f32(0xc040), -3.0f);
  uint32_t halfway = 0x3f808000u, above = 0x3f818000u; // ties: to the even neighbour
  float f;
  memcpy(&f, &halfway, 4);
  EXPECT_EQ(krn_f32_to_bf16(f), 0x3f80);
  memcpy(&f, &above, 4);
  EXPECT_EQ(krn_f32_to_bf16(f), 0x3f82);
  EXPECT_TRUE(std::isinf(krn_bf16_to_f32(krn_f32_to_bf16(INFINITY))));
  EXPECT_TRUE(std::isnan(krn_bf16_to_f32(krn_f32_to_bf16(NAN))));
  for (uint32_t h = 0; h < 0x10000; h++) { // every finite bf16 survives the round trip
    if (((h >> 7) & 0xff) == 0xff) continue;
    ASSERT_EQ(krn_f32_to_bf16(krn_bf16_to_f32((krn_bf16)h)), h);
  }
}
