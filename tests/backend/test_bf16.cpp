// Tests of bf16 storage (optex/backend/bf16.hpp), shared by the CPU emulation and the CUDA
// kernels: round to nearest even, against exact encodings and an independent reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "optex/backend/bf16.hpp"

namespace {

using optex::detail::from_bf16;
using optex::detail::to_bf16;

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Float to bf16 to float.
float round_trip(float f) { return from_bf16(to_bf16(f)); }

// An independent reference for round-to-nearest-even to 8 significant bits, for a finite
// float, written in double arithmetic rather than with the carry trick: the two candidates
// are x truncated toward zero and the next bf16 value away from zero; the nearer wins, and a
// tie goes to the one with an even last bit. A result of magnitude 2^128 or more is infinite,
// as IEEE 754 overflow with round to nearest requires.
float reference_round(float x) {
  const std::uint32_t u = to_bits(x);
  const std::uint32_t sign = u & 0x80000000u;
  const std::uint32_t magnitude = u & 0x7fffffffu;
  const std::uint32_t exponent = magnitude >> 23;
  // bf16 keeps 7 of the 23 stored mantissa bits: one bf16 ulp is 2^16 float ulps, which is
  // 2^(e - 7) for a normal number of exponent e and 2^-133 for a denormal.
  const double ulp = std::ldexp(1.0, exponent == 0 ? -133 : static_cast<int>(exponent) - 127 - 7);
  const std::uint32_t truncated_bits = magnitude & 0xffff0000u;
  const double lo = static_cast<double>(from_bits(truncated_bits));
  const double hi = lo + ulp;  // may be 2^128, beyond float: kept in double
  const double a = static_cast<double>(from_bits(magnitude));
  double chosen;
  if (a - lo < hi - a) {
    chosen = lo;
  } else if (a - lo > hi - a) {
    chosen = hi;
  } else {
    const bool lo_even = ((truncated_bits >> 16) & 1u) == 0;
    chosen = lo_even ? lo : hi;
  }
  const float result = chosen >= std::ldexp(1.0, 128) ? std::numeric_limits<float>::infinity()
                                                      : static_cast<float>(chosen);
  return sign ? -result : result;
}

// ---- bf16: exact encodings -------------------------------------------------------

TEST(Bf16, KnownEncodings) {
  EXPECT_EQ(to_bf16(1.0f), 0x3F80u);
  EXPECT_EQ(to_bf16(-2.0f), 0xC000u);
  EXPECT_EQ(to_bf16(0.0f), 0x0000u);
  EXPECT_EQ(to_bf16(-0.0f), 0x8000u);
  EXPECT_EQ(to_bf16(0.5f), 0x3F00u);
  EXPECT_EQ(to_bf16(3.0f), 0x4040u);
  EXPECT_EQ(to_bf16(-1.5f), 0xBFC0u);

  EXPECT_EQ(from_bf16(0x3F80u), 1.0f);
  EXPECT_EQ(from_bf16(0xC000u), -2.0f);
  EXPECT_EQ(to_bits(from_bf16(0x0000u)), 0x00000000u);
  EXPECT_EQ(to_bits(from_bf16(0x8000u)), 0x80000000u);  // negative zero keeps its sign
  EXPECT_EQ(from_bf16(0x4049u), 3.140625f);             // pi to 8 significant bits
}

TEST(Bf16, PiAndOneThirdRoundToNearest) {
  // pi = 0x40490FDB: the dropped half 0x0FDB is below 0x8000, so it rounds down.
  EXPECT_EQ(to_bf16(3.14159265f), 0x4049u);
  // 1/3 = 0x3EAAAAAB: the dropped half 0xAAAB is above 0x8000, so it rounds up.
  EXPECT_EQ(to_bf16(1.0f / 3.0f), 0x3EABu);
  EXPECT_EQ(to_bf16(-1.0f / 3.0f), 0xBEABu);
}

// ---- bf16: ties and near-ties --------------------------------------------------------

TEST(Bf16, TiesRoundToEven) {
  // Exactly halfway between 0x3F80 (even) and 0x3F81 (odd): down to the even one.
  EXPECT_EQ(to_bf16(from_bits(0x3F808000u)), 0x3F80u);
  // Exactly halfway between 0x3F81 (odd) and 0x3F82 (even): up to the even one.
  EXPECT_EQ(to_bf16(from_bits(0x3F818000u)), 0x3F82u);
  // The same for negative numbers (ties to even is symmetric in the sign).
  EXPECT_EQ(to_bf16(from_bits(0xBF808000u)), 0xBF80u);
  EXPECT_EQ(to_bf16(from_bits(0xBF818000u)), 0xBF82u);
  // Halfway between 0x3FFF (odd, 1.9921875) and 0x4000 (2.0): the carry reaches the exponent.
  EXPECT_EQ(to_bf16(from_bits(0x3FFF8000u)), 0x4000u);
  // Halfway cases built arithmetically: 1 + 2^-8 lies between 1 and 1 + 2^-7.
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f), 0x3F80u);
  EXPECT_EQ(to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82u);  // between 1 + 2^-7 and 1 + 2^-6
  EXPECT_EQ(to_bf16(256.0f + 1.0f), 0x4380u);       // 256 + half an ulp (ulp 2 at 256)
  EXPECT_EQ(to_bf16(256.0f + 3.0f), 0x4382u);
}

TEST(Bf16, JustAboveAndBelowHalfwayRoundToNearest) {
  // One float ulp above halfway rounds away from zero, one below rounds toward it, for both
  // parities of the lower neighbour and both signs.
  for (const std::uint32_t base :
       {0x3F800000u, 0x3F810000u, 0xBF800000u, 0xBF810000u, 0x42C70000u, 0x00010000u}) {
    const auto lower = static_cast<std::uint16_t>(base >> 16);
    const auto upper = static_cast<std::uint16_t>(lower + 1);
    EXPECT_EQ(to_bf16(from_bits(base + 0x8001u)), upper) << std::hex << base;
    EXPECT_EQ(to_bf16(from_bits(base + 0x7FFFu)), lower) << std::hex << base;
    EXPECT_EQ(to_bf16(from_bits(base + 0xFFFFu)), upper) << std::hex << base;
    EXPECT_EQ(to_bf16(from_bits(base + 0x0001u)), lower) << std::hex << base;
  }
}

// ---- bf16: overflow, infinities, NaN, denormals --------------------------------------

TEST(Bf16, LargestFiniteFloatRoundsToInfinity) {
  const float max = std::numeric_limits<float>::max();  // 0x7F7FFFFF
  EXPECT_EQ(to_bf16(max), 0x7F80u);
  EXPECT_EQ(to_bf16(-max), 0xFF80u);
  EXPECT_TRUE(std::isinf(round_trip(max)));
  EXPECT_GT(round_trip(max), 0.0f);
  // The largest finite bf16 (0x7F7F, odd) survives, and a tie above it goes to even: infinity.
  EXPECT_EQ(to_bf16(from_bits(0x7F7F0000u)), 0x7F7Fu);
  EXPECT_EQ(to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7Fu);
  EXPECT_EQ(to_bf16(from_bits(0x7F7F8000u)), 0x7F80u);
  EXPECT_TRUE(std::isfinite(round_trip(from_bits(0x7F7F7FFFu))));
}

TEST(Bf16, InfinityStaysInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(to_bf16(inf), 0x7F80u);
  EXPECT_EQ(to_bf16(-inf), 0xFF80u);
  EXPECT_EQ(round_trip(inf), inf);
  EXPECT_EQ(round_trip(-inf), -inf);
}

TEST(Bf16, NanStaysNan) {
  // Quiet NaNs, and signalling NaNs whose payload lies only in the low 16 bits: truncating
  // those would give infinity.
  for (const std::uint32_t bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7F80FFFFu,
                                   0x7FFFFFFFu, 0x7F810000u}) {
    const float nan = from_bits(bits);
    ASSERT_TRUE(std::isnan(nan));
    EXPECT_TRUE(std::isnan(round_trip(nan))) << std::hex << bits;
    EXPECT_EQ(std::signbit(round_trip(nan)), std::signbit(nan)) << std::hex << bits;
  }
  EXPECT_TRUE(std::isnan(round_trip(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(round_trip(std::numeric_limits<float>::signaling_NaN())));
}

TEST(Bf16, Denormals) {
  // bf16 has the float exponent range, so float denormals with zero low bits are bf16
  // denormals and survive exactly; the smallest is 2^-133.
  EXPECT_EQ(to_bf16(from_bits(0x00010000u)), 0x0001u);
  EXPECT_EQ(round_trip(0x1p-133f), 0x1p-133f);
  EXPECT_EQ(round_trip(-0x1p-133f), -0x1p-133f);
  EXPECT_EQ(to_bf16(from_bits(0x007F0000u)), 0x007Fu);  // the largest bf16 denormal
  // The smallest float denormal (2^-149) is far below half of 2^-133: it becomes zero,
  // keeping its sign.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::denorm_min()), 0x8000u);
  // Ties between denormals go to even too: half of 2^-133 to zero, 1.5 * 2^-133 to 2^-132.
  EXPECT_EQ(to_bf16(from_bits(0x00008000u)), 0x0000u);
  EXPECT_EQ(to_bf16(from_bits(0x00008001u)), 0x0001u);
  EXPECT_EQ(to_bf16(from_bits(0x00018000u)), 0x0002u);
  // The largest float denormal rounds up across the boundary to the smallest bf16 normal.
  EXPECT_EQ(to_bf16(from_bits(0x007FFFFFu)), 0x0080u);
  EXPECT_EQ(round_trip(from_bits(0x007FFFFFu)), std::numeric_limits<float>::min());
}

// ---- bf16: every bf16 value, and many random floats --------------------------------

TEST(Bf16, EveryBf16ValueRoundTripsExactly) {
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = from_bf16(bits);
    ASSERT_EQ(to_bits(f) & 0xFFFFu, 0u) << std::hex << b;  // the low half is zero
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(from_bf16(to_bf16(f)))) << std::hex << b;
    } else {
      ASSERT_EQ(to_bf16(f), bits) << std::hex << b;
    }
  }
}

// Random finite floats of every magnitude: uniform sign, biased exponent and mantissa bits
// (so about as many tiny as huge values), with one in eight a denormal.
std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 engine(seed);
  auto rng = [&engine] { return static_cast<std::uint32_t>(engine()); };
  std::vector<float> out(n);
  for (float& f : out) {
    const std::uint32_t sign = (rng() & 1u) << 31;
    const std::uint32_t exponent = rng() % 8 == 0 ? 0u : 1u + rng() % 254u;  // 0 or 1..254
    const std::uint32_t mantissa = rng() & 0x7FFFFFu;
    f = from_bits(sign | (exponent << 23) | mantissa);
  }
  return out;
}

TEST(Bf16, RandomFloatsMatchReferenceWithinHalfAnUlp) {
  constexpr std::size_t kCount = 1'000'000;
  const std::vector<float> xs = random_floats(kCount, 20261122u);
  // With 8 significant bits the unit roundoff is 2^-8: |round(x) - x| <= 2^-8 |x| for every
  // x in the normal range, and (nearly) attained just above a power of two.
  const double bound = 0x1p-8;
  double worst_relative = 0.0;
  std::size_t checked_relative = 0;
  for (const float x : xs) {
    const float r = round_trip(x);
    ASSERT_EQ(to_bits(r), to_bits(reference_round(x))) << std::hexfloat << x;
    // Idempotent: an already-bf16 value converts exactly.
    ASSERT_EQ(to_bits(round_trip(r)), to_bits(r)) << std::hexfloat << x;
    if (std::isinf(r)) continue;  // overflowed near the top of the range (checked above)
    const double err = std::abs(static_cast<double>(r) - static_cast<double>(x));
    const double ax = std::abs(static_cast<double>(x));
    if (ax >= static_cast<double>(std::numeric_limits<float>::min())) {
      ASSERT_LE(err, bound * ax) << std::hexfloat << x;
      worst_relative = std::max(worst_relative, err / ax);
      ++checked_relative;
    } else {
      ASSERT_LE(err, 0x1p-134) << std::hexfloat << x;  // half the bf16 denormal spacing
    }
  }
  EXPECT_GT(checked_relative, kCount / 2);
  // The bound is not loose: random data comes within 1% of it, far above 2^-9.
  EXPECT_GT(worst_relative, 0.99 * bound);
}

TEST(Bf16, RoundingIsMonotone) {
  const std::vector<float> a = random_floats(200'000, 7u);
  const std::vector<float> b = random_floats(200'000, 8u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float lo = std::min(a[i], b[i]);
    const float hi = std::max(a[i], b[i]);
    ASSERT_LE(round_trip(lo), round_trip(hi)) << std::hexfloat << lo << " " << hi;
  }
}

TEST(Bf16, LoadAsFloatReadsEitherStorageType) {
  EXPECT_EQ(optex::detail::load_as_float(0.1f), 0.1f);
  const optex::detail::bf16_bits b = to_bf16(0.1f);
  EXPECT_EQ(optex::detail::load_as_float(b), from_bf16(b));
  EXPECT_NE(optex::detail::load_as_float(b), 0.1f);  // 0.1 is not a bf16 value
}

}  // namespace
