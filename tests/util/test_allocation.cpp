// Buffers sized by d, T0 or N: a size that no buffer can have is refused before
// anything is allocated (std::length_error), and one that the allocator refuses
// is a std::runtime_error naming what was asked for and the byte count, never a
// bare std::bad_alloc. The "too large" sizes need >= 2^48 bytes per buffer, more
// than a 64-bit process can address, so the allocator refuses them at once
// whatever the overcommit policy: nothing here touches real memory.
#include <gtest/gtest.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/engine_backend.hpp"
#include "optex/engine/batch.hpp"
#include "optex/estimator/gp_estimator.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/estimator/history_gram.hpp"
#include "optex/optex.hpp"
#include "optex/util/allocation.hpp"
#include "support/throws_with.hpp"

namespace {

using optex::test::ThrowsWith;

constexpr std::size_t kPow(int k) { return std::size_t{1} << k; }

// AddressSanitizer's operator new ends the process on an allocation it cannot
// serve instead of throwing std::bad_alloc: the "allocation failed" cases run
// only without it (the overflow cases run everywhere).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAllocatorThrows = false;
#else
constexpr bool kAllocatorThrows = true;
#endif
#define SKIP_UNLESS_THE_ALLOCATOR_THROWS()                                               \
  if (!kAllocatorThrows)                                                                 \
  GTEST_SKIP() << "AddressSanitizer aborts on an allocation it cannot serve instead of " \
                  "throwing std::bad_alloc"

TEST(Allocation, CheckedBytesRefusesAProductThatWouldWrap) {
  using optex::detail::checked_bytes;
  EXPECT_EQ(checked_bytes("x", "y", {3, 5}, 4), 60u);
  EXPECT_EQ(checked_bytes("x", "y", {kPow(62), 0}, 4), 0u);  // nothing to allocate
  // 2^62 * 4 is 2^64: zero after wrapping, and no buffer may exceed PTRDIFF_MAX.
  EXPECT_TRUE(ThrowsWith<std::length_error>(
      [] {
        (void)checked_bytes("history: 4 points", "fp32 points", {4, kPow(62)}, 4);
      },
      {"history: 4 points", "fp32 points", std::to_string(PTRDIFF_MAX)}));
}

TEST(Allocation, HistoryWhosePointsWouldWrapIsRefused) {
  // 4096 * 2^62 floats wraps to zero: it used to make an empty buffer silently.
  EXPECT_TRUE(ThrowsWith<std::length_error>([] { optex::GradientHistory h(4096, kPow(62)); },
                                            {"history", "4096", std::to_string(kPow(62))}));
}

TEST(Allocation, HistoryTooLargeToAllocateNamesItsBytes) {
  SKIP_UNLESS_THE_ALLOCATOR_THROWS();
  const std::size_t d = kPow(46);  // 2^48 bytes per buffer
  EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { optex::GradientHistory h(1, d); },
                                             {"history: 1 points of dimension " + std::to_string(d),
                                              std::to_string(2 * d * 4), "allocation failed"}));
}

TEST(Allocation, HistoryStatisticsTooLarge) {
  EXPECT_TRUE(ThrowsWith<std::length_error>([] { optex::HistoryGram g(kPow(31)); },
                                            {"history: capacity " + std::to_string(kPow(31))}));
  SKIP_UNLESS_THE_ALLOCATOR_THROWS();
  const std::size_t t0 = kPow(23);  // 2^49 bytes per matrix
  EXPECT_TRUE(ThrowsWith<std::runtime_error>(
      [&] { optex::HistoryGram g(t0); },
      {"capacity " + std::to_string(t0), std::to_string(2 * t0 * t0 * 8), "allocation failed"}));
}

TEST(Allocation, EstimatorTooLarge) {
  using optex::Covariance;
  using optex::InputScaling;
  EXPECT_TRUE(ThrowsWith<std::length_error>(
      [] {
        optex::GpGradientEstimator e(Covariance::matern52, 1e-3, InputScaling::none, kPow(31));
      },
      {"estimator: history capacity " + std::to_string(kPow(31))}));
  SKIP_UNLESS_THE_ALLOCATOR_THROWS();
  const std::size_t t0 = kPow(23);
  EXPECT_TRUE(ThrowsWith<std::runtime_error>(
      [&] { optex::GpGradientEstimator e(Covariance::matern52, 1e-3, InputScaling::none, t0); },
      {"estimator: history capacity " + std::to_string(t0), std::to_string(2 * t0 * t0 * 8),
       "allocation failed"}));
}

TEST(Allocation, BatchRowsTooLargeNameParallelismAndDimension) {
  optex::Batch batch;
  const int n = 1 << 20;
  EXPECT_TRUE(ThrowsWith<std::length_error>(
      [&] { optex::detail::BatchAccess::allocate(batch, n, kPow(62), optex::Device::cpu()); },
      {"batch: parallelism 1048576", std::to_string(kPow(62))}));
  EXPECT_EQ(batch.size(), 0);  // a refused allocation leaves the batch as it was
  SKIP_UNLESS_THE_ALLOCATOR_THROWS();
  const std::size_t d = kPow(28);  // 2^50 bytes per row block
  EXPECT_TRUE(ThrowsWith<std::runtime_error>(
      [&] { optex::detail::BatchAccess::allocate(batch, n, d, optex::Device::cpu()); },
      {"batch: parallelism 1048576 at dimension " + std::to_string(d),
       std::to_string((3 * kPow(20) - 1) * d * 4), "allocation failed"}));
  // Still as it was, and a sane size still works.
  EXPECT_EQ(batch.size(), 0);
  optex::detail::BatchAccess::allocate(batch, 3, 5, optex::Device::cpu());
  EXPECT_EQ(batch.size(), 3);
  EXPECT_EQ(batch.point(2).size(), 5u);
}

TEST(Allocation, OptimizerStateTooLarge) {
  EXPECT_TRUE(
      ThrowsWith<std::length_error>([] { (void)optex::init_state(optex::Adam{}, kPow(62)); },
                                    {"optimizer state: dimension " + std::to_string(kPow(62))}));
  SKIP_UNLESS_THE_ALLOCATOR_THROWS();
  const std::size_t d = kPow(46);
  EXPECT_TRUE(ThrowsWith<std::runtime_error>(
      [&] { (void)optex::init_state(optex::Adam{}, d); },
      {"optimizer state: dimension " + std::to_string(d), "2 fp32 slots", std::to_string(2 * d * 4),
       "allocation failed"}));
}

}  // namespace
