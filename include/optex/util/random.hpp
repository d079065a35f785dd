// Portable, seedable random numbers.
//
// The standard library's distributions (std::normal_distribution, ...) are
// implementation-defined, so the same seed gives different numbers with
// libstdc++ and libc++. Every random number that can influence a trajectory
// comes from here instead, so that "same seed, same trajectory" holds on every
// platform, backend and rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>

namespace optex {

// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit word of state, passes
// BigCrush, and is trivially serialisable for checkpoints.
class SplitMix64 {
 public:
  explicit constexpr SplitMix64(std::uint64_t seed = 0) noexcept : state_(seed) {}

  constexpr std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1) with 53 random bits.
  constexpr double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Uniform in [lo, hi).
  constexpr double uniform(double lo, double hi) noexcept { return lo + (hi - lo) * uniform(); }

  // Standard normal by Box-Muller. Uses two uniforms per call and keeps no
  // cached second value, so the state stays one word.
  double normal() noexcept {
    const double u1 = 1.0 - uniform();  // in (0, 1]: log is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

  constexpr std::uint64_t state() const noexcept { return state_; }
  constexpr void set_state(std::uint64_t s) noexcept { state_ = s; }

 private:
  std::uint64_t state_;
};

// Mixes two words into one seed (for deriving independent streams, e.g. one per
// point of a batch, from a run seed and a counter).
constexpr std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) noexcept {
  SplitMix64 g(a ^ (b * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
  return g.next();
}

// FNV-1a over raw bytes: a cheap, portable content hash (used to key noise to
// a point, and as a checkpoint checksum).
constexpr std::uint64_t fnv1a64(const unsigned char* data, std::size_t n,
                                std::uint64_t h = 0xCBF29CE484222325ull) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= data[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

}  // namespace optex
