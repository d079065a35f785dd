// Bit-for-bit comparisons of vectors, optimizer states and whole engines, with
// a message that says where two runs first differ. Shared by the engine,
// checkpoint and CUDA suites.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <span>

#include "optex/engine/engine.hpp"
#include "optex/optimizers/optimizer_state.hpp"

namespace optex::test {

inline bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

inline ::testing::AssertionResult BitEqual(std::span<const float> a, std::span<const float> b) {
  if (SameBits(a, b)) return ::testing::AssertionSuccess();
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  std::size_t i = 0;
  while (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) ++i;
  return ::testing::AssertionFailure()
         << "first difference at " << i << ": " << a[i] << " vs " << b[i];
}

inline ::testing::AssertionResult StateBitEqual(const OptimizerState& a, const OptimizerState& b) {
  if (a.step != b.step) {
    return ::testing::AssertionFailure() << "step " << a.step << " vs " << b.step;
  }
  for (std::size_t j = 0; j < a.slots.size(); ++j) {
    auto r = BitEqual(a.slots[j], b.slots[j]);
    if (!r) return r << " (state slot " << j << ")";
  }
  return ::testing::AssertionSuccess();
}

// Every observable part of two engines agrees bit for bit: iterate, optimizer
// (every range) and its state, lengthscale, random state, counters, pending
// batch, and the history with its Gram statistics (host views: a device
// engine copies them).
inline ::testing::AssertionResult SameEngine(const Engine& a, const Engine& b) {
  if (!(a.optimizer_ranges() == b.optimizer_ranges())) {
    return ::testing::AssertionFailure() << "optimizer or its ranges";
  }
  auto r = BitEqual(a.iterate(), b.iterate());
  if (!r) return r << " (iterate)";
  r = StateBitEqual(a.optimizer_state(), b.optimizer_state());
  if (!r) return r << " (optimizer state)";
  if (!SameBits(a.lengthscale(), b.lengthscale())) {
    return ::testing::AssertionFailure()
           << "lengthscale " << a.lengthscale() << " vs " << b.lengthscale();
  }
  if (a.rng_state() != b.rng_state()) return ::testing::AssertionFailure() << "rng state";
  if (a.iteration() != b.iteration()) return ::testing::AssertionFailure() << "iteration";
  if (a.evaluations() != b.evaluations()) return ::testing::AssertionFailure() << "evaluations";
  if (a.pending() != b.pending()) return ::testing::AssertionFailure() << "pending";
  const auto& ha = a.history();
  const auto& hb = b.history();
  if (ha.size() != hb.size() || ha.newest_slot() != hb.newest_slot()) {
    return ::testing::AssertionFailure() << "history size or ring position";
  }
  for (std::size_t j = 0; j < ha.size(); ++j) {
    r = BitEqual(ha.point(j), hb.point(j));
    if (!r) return r << " (history point " << j << ")";
    r = BitEqual(ha.gradient(j), hb.gradient(j));
    if (!r) return r << " (history gradient " << j << ")";
    for (std::size_t k = 0; k < ha.size(); ++k) {
      if (!SameBits(ha.squared_distance(j, k), hb.squared_distance(j, k)) ||
          !SameBits(ha.gradient_inner(j, k), hb.gradient_inner(j, k))) {
        return ::testing::AssertionFailure() << "history Gram entry " << j << ", " << k;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace optex::test
