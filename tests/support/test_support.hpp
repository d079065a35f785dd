// Test data and option helpers shared by the test suites.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <random>
#include <span>
#include <vector>

#include "optex/engine/options.hpp"
#include "optex/util/random.hpp"

namespace optex::test {

// Normal samples by Box-Muller on the raw mt19937 stream: unlike std::normal_distribution, the
// same numbers with every standard library, so the data of each test is fixed.
inline double normal(std::mt19937& rng) {
  const double u1 = (static_cast<double>(rng()) + 1.0) / 4294967296.0;  // (0, 1]
  const double u2 = static_cast<double>(rng()) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

inline std::vector<float> random_vector(std::mt19937& rng, std::size_t n, double mean = 0.0,
                                        double stddev = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(mean + stddev * normal(rng));
  return v;
}

// Euclidean distance in double.
inline double distance(std::span<const float> a, std::span<const float> b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    s += d * d;
  }
  return std::sqrt(s);
}

// Library defaults with parallelism N and a seed, committing from the last
// point: the OptEx rule the invariant suites pin down (continue_from =
// best_loss, the default, has its own tests in test_point_evaluations.cpp).
inline Options WithN(int n, std::uint64_t seed = 0) {
  Options o;
  o.parallelism = n;
  o.seed = seed;
  o.continue_from = ContinueFrom::last;
  return o;
}

// x ~ U(lo, hi)^d from the library's own seeded generator.
inline std::vector<float> UniformStart(std::size_t d, std::uint64_t seed, double lo = -1.0,
                                       double hi = 1.0) {
  SplitMix64 rng(seed);
  std::vector<float> x(d);
  for (float& v : x) v = static_cast<float>(rng.uniform(lo, hi));
  return x;
}

// A stochastic least-squares-like objective: the exact gradient of
// 0.5 sum_i w_i (x_i - 1)^2 plus noise that is a pure function of the
// minibatch seed, so any rank evaluating (x, seed) gets the same bits.
struct NoisyQuadratic {
  double sigma = 0.05;
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g,
                              std::uint64_t seed) const {
    SplitMix64 rng(seed);
    double f = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double w = 1.0 + static_cast<double>(i % 5);
      const double r = static_cast<double>(x[i]) - 1.0;
      f += 0.5 * w * r * r;
      g[i] = static_cast<float>(w * r + sigma * rng.normal());
    }
    return f + sigma * rng.normal();
  }
};

// A non-separable, non-quadratic objective: ill-conditioned quadratic + quartic +
// a coupling chain, so gradients change direction along the trajectory.
struct Quartic {
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    const std::size_t d = x.size();
    double f = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double xi = x[i];
      const double c = 1.0 + static_cast<double>(i % 5);
      const double prev = i > 0 ? static_cast<double>(x[i - 1]) : 0.0;
      const double next = i + 1 < d ? static_cast<double>(x[i + 1]) : 0.0;
      f += c * (xi - 0.3) * (xi - 0.3) + 0.1 * xi * xi * xi * xi;
      if (i + 1 < d) f += 0.5 * xi * next;
      g[i] = static_cast<float>(2.0 * c * (xi - 0.3) + 0.4 * xi * xi * xi + 0.5 * (prev + next));
    }
    return f;
  }
};

}  // namespace optex::test
