// Tests of the bf16/f16 <-> f32 conversions: exact values, rounding, NaN/inf,
// subnormals, exhaustive round trips.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/safetensors.h"

namespace fusionrl {
namespace {

// ---------------------------------------------------------------------------
// Conversions.

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint16_t ToBf16(uint32_t f32_bits) {
  const float f = FromBits(f32_bits);
  uint8_t out[2];
  F32ToBf16(&f, out, 1);
  return static_cast<uint16_t>(out[0] | (out[1] << 8));
}
float FromF16(uint16_t h) {
  const uint8_t in[2] = {static_cast<uint8_t>(h & 0xFF),
                         static_cast<uint8_t>(h >> 8)};
  float f;
  F16ToF32(in, &f, 1);
  return f;
}
float FromBf16(uint16_t h) {
  const uint8_t in[2] = {static_cast<uint8_t>(h & 0xFF),
                         static_cast<uint8_t>(h >> 8)};
  float f;
  Bf16ToF32(in, &f, 1);
  return f;
}

TEST(ConversionTest, F32ToBf16RoundsToNearestEven) {
  EXPECT_EQ(ToBf16(0x3F800000), 0x3F80);  // 1.0 exact
  EXPECT_EQ(ToBf16(0x3F807FFF), 0x3F80);  // below half: down
  EXPECT_EQ(ToBf16(0x3F808000), 0x3F80);  // tie, 0x3F80 even: down
  EXPECT_EQ(ToBf16(0x3F808001), 0x3F81);  // above half: up
  EXPECT_EQ(ToBf16(0x3F818000), 0x3F82);  // tie, 0x3F81 odd: up to even
  EXPECT_EQ(ToBf16(0xBF818000), 0xBF82);  // same, negative
  EXPECT_EQ(ToBf16(0x3F7FFFFF), 0x3F80);  // carries into the exponent
  EXPECT_EQ(ToBf16(0x7F7FFFFF), 0x7F80);  // FLT_MAX -> +inf
  EXPECT_EQ(ToBf16(0xFF7FFFFF), 0xFF80);  // -FLT_MAX -> -inf
  EXPECT_EQ(ToBf16(0x7F7F7FFF), 0x7F7F);  // largest that stays finite
  EXPECT_EQ(ToBf16(0x7F800000), 0x7F80);  // +inf
  EXPECT_EQ(ToBf16(0xFF800000), 0xFF80);  // -inf
  EXPECT_EQ(ToBf16(0x80000000), 0x8000);  // -0
  EXPECT_EQ(ToBf16(0x00008000), 0x0000);  // subnormal tie to even
  EXPECT_EQ(ToBf16(0x00018000), 0x0002);
  // NaNs stay NaN, even with payload only in the low bits, and keep sign.
  EXPECT_EQ(ToBf16(0x7F800001), 0x7FC0);
  EXPECT_EQ(ToBf16(0xFF800001), 0xFFC0);
  EXPECT_EQ(ToBf16(0x7FFFFFFF), 0x7FFF);
  EXPECT_EQ(ToBf16(0x7FC00000), 0x7FC0);
}

TEST(ConversionTest, Bf16ToF32IsExactAndRoundTripsEveryValue) {
  EXPECT_EQ(FromBf16(0x3F80), 1.0f);
  EXPECT_EQ(FromBf16(0xC000), -2.0f);
  EXPECT_EQ(FromBf16(0x0001), std::ldexp(1.0f, -133));
  EXPECT_TRUE(std::isinf(FromBf16(0x7F80)));
  EXPECT_TRUE(std::isnan(FromBf16(0xFFC0)));
  std::vector<uint8_t> all(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    all[2 * h] = h & 0xFF;
    all[2 * h + 1] = h >> 8;
  }
  std::vector<float> f(65536);
  Bf16ToF32(all.data(), f.data(), f.size());
  std::vector<uint8_t> back(2 * 65536);
  F32ToBf16(f.data(), back.data(), f.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(Bits(f[h]), h << 16);
    const uint16_t b =
        static_cast<uint16_t>(back[2 * h] | (back[2 * h + 1] << 8));
    if (std::isnan(f[h])) {
      ASSERT_EQ(b, h | 0x40) << h;  // quieted, sign and payload kept
    } else {
      ASSERT_EQ(b, h) << h;
    }
  }
}

TEST(ConversionTest, F16ToF32HandlesSubnormalsInfAndNan) {
  EXPECT_EQ(FromF16(0x3C00), 1.0f);
  EXPECT_EQ(FromF16(0xC000), -2.0f);
  EXPECT_EQ(FromF16(0x7BFF), 65504.0f);
  EXPECT_EQ(FromF16(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(FromF16(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FromF16(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(FromF16(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(Bits(FromF16(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(FromF16(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(FromF16(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(FromF16(0x7E00)));
  EXPECT_TRUE(std::isnan(FromF16(0x7C01)));  // signalling, low payload
  EXPECT_EQ(Bits(FromF16(0x7C01)), 0x7F802000u);
  EXPECT_TRUE(std::signbit(FromF16(0xFE00)));
  // Every finite half against the definition.
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    if (exp == 0x1F) continue;
    const double magnitude =
        exp == 0 ? std::ldexp(static_cast<double>(mant), -24)
                 : std::ldexp(1.0 + mant / 1024.0, static_cast<int>(exp) - 15);
    const double want = (h & 0x8000) ? -magnitude : magnitude;
    ASSERT_EQ(static_cast<double>(FromF16(static_cast<uint16_t>(h))), want)
        << h;
  }
}

TEST(ConversionTest, WorksOnUnalignedInput) {
  const uint8_t bytes[5] = {0xFF, 0x80, 0x3F, 0x00, 0x3C};
  float out[2];
  Bf16ToF32(bytes + 1, out, 1);
  EXPECT_EQ(out[0], 1.0f);
  F16ToF32(bytes + 3, out + 1, 1);
  EXPECT_EQ(out[1], 1.0f);
}

}  // namespace
}  // namespace fusionrl
