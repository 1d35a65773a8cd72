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
  EXPECT_STREQ(krn_type_name(12), "Q4_K");
  EXPECT_FALSE(krn_type_known(12));
  EXPECT_TRUE(krn_type_known(KRN_Q8_0));
}
