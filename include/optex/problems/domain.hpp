// What every shipped test problem shares: its search box, a seeded start point
// inside a box, the input checks, and the interface the wrappers rely on.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "optex/util/random.hpp"

namespace optex::problems {

// The usual per-coordinate search box of a problem: every x_i in [lower, upper].
struct Domain {
  double lower;
  double upper;

  constexpr bool contains(double v) const noexcept { return lower <= v && v <= upper; }
};

// The interface of a test problem. All members are const and must be safe to call
// from several threads at once.
template <class P>
concept TestProblem = requires(const P& p, std::span<const float> x, std::span<float> g,
                               std::size_t d) {
  { p.name() } -> std::convertible_to<std::string_view>;
  { p.Evaluate(x) } -> std::same_as<double>;
  { p.Gradient(x, g) } -> std::same_as<void>;
  { p.EvaluateWithGradient(x, g) } -> std::same_as<double>;
  { p.domain() } -> std::same_as<Domain>;
  { p.standard_start(d) } -> std::same_as<std::vector<float>>;
  { p.minimizer(d) } -> std::same_as<std::vector<float>>;
  { p.minimum(d) } -> std::same_as<double>;
};

namespace detail {

// Throws unless d >= min_d; `param` names the offending argument in the message.
inline void check_dimension(std::string_view param, std::size_t d, std::size_t min_d = 1,
                            std::string_view why = {}) {
  if (d >= min_d) return;
  std::string msg = std::string(param) + ": dimension must be >= " + std::to_string(min_d);
  if (!why.empty()) msg += " (" + std::string(why) + ")";
  throw std::invalid_argument(msg + ", got " + std::to_string(d));
}

// Checks a gradient output buffer: same size as x, and not overlapping x (the
// problems read x while they write g, so aliasing would corrupt the result).
inline void check_gradient(std::span<const float> x, std::span<float> g) {
  if (g.size() != x.size()) {
    throw std::invalid_argument("g: size must equal x.size() = " + std::to_string(x.size()) +
                                ", got " + std::to_string(g.size()));
  }
  const std::less<const float*> lt;
  const float* gb = g.data();
  if (lt(gb, x.data() + x.size()) && lt(x.data(), gb + g.size())) {
    throw std::invalid_argument("g: must not overlap x");
  }
}

}  // namespace detail

// A point drawn uniformly from [lo, hi]^d with SplitMix64 (portable: the same
// seed gives the same point on every platform). Each coordinate is rounded to
// float32 and then kept inside [lo, hi].
inline std::vector<float> uniform_start(std::size_t d, double lo, double hi, std::uint64_t seed) {
  detail::check_dimension("d", d);
  if (!(std::isfinite(lo) && std::isfinite(hi) && lo < hi)) {
    throw std::invalid_argument("lo, hi: need finite lo < hi, got lo = " + std::to_string(lo) +
                                ", hi = " + std::to_string(hi));
  }
  SplitMix64 rng(seed);
  std::vector<float> x(d);
  for (float& v : x) {
    v = static_cast<float>(rng.uniform(lo, hi));
    if (v > hi) v = std::nextafter(v, -std::numeric_limits<float>::infinity());
    if (v < lo) v = std::nextafter(v, std::numeric_limits<float>::infinity());
  }
  return x;
}

inline std::vector<float> uniform_start(std::size_t d, Domain box, std::uint64_t seed) {
  return uniform_start(d, box.lower, box.upper, seed);
}

}  // namespace optex::problems
