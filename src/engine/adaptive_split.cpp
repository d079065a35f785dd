#include "optex/engine/adaptive_split.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace optex {
namespace {

// Before any measurement the probe is due as soon as predictions look suspect.
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max() / 2;

}  // namespace

AdaptiveSplit::AdaptiveSplit(int parallelism, int evaluations)
    : parallelism_(parallelism),
      start_(evaluations),
      evaluations_(evaluations),
      noise_(std::numeric_limits<double>::quiet_NaN()),
      rounds_since_measured_(kNever) {}

int AdaptiveSplit::evaluations_for(int parallelism, double noise) {
  for (int d = 1; d <= parallelism; ++d) {
    if (parallelism % d == 0 && noise / d <= kNoiseTarget) return d;
  }
  return parallelism;
}

int AdaptiveSplit::smallest_divisor_above_one() const {
  for (int d = 2; d <= parallelism_; ++d) {
    if (parallelism_ % d == 0) return d;
  }
  return 1;  // N = 1: nothing to split
}

void AdaptiveSplit::update(double gradient_noise, double cosine) {
  if (rounds_since_measured_ < kNever) ++rounds_since_measured_;
  if (!std::isnan(gradient_noise)) {
    noise_ = std::min(gradient_noise, kMaxNoise);
    rounds_since_measured_ = 0;
  }
  evaluations_ = std::isnan(noise_) ? start_ : evaluations_for(parallelism_, noise_);
  const bool suspect = cosine < kSuspectCosine;  // false for NaN: nothing was predicted
  if (evaluations_ == 1 && suspect && rounds_since_measured_ >= kProbeInterval) {
    evaluations_ = smallest_divisor_above_one();
  }
}

void AdaptiveSplit::restore(int evaluations, double noise, std::int64_t rounds_since_measured) {
  if (evaluations < 1 || evaluations > parallelism_ || parallelism_ % evaluations != 0) {
    throw std::invalid_argument("adaptive split: evaluations per point " +
                                std::to_string(evaluations) + " does not divide parallelism " +
                                std::to_string(parallelism_));
  }
  if (!std::isnan(noise) && !(noise >= 0.0 && noise <= kMaxNoise)) {
    throw std::invalid_argument("adaptive split: gradient noise " + std::to_string(noise) +
                                " is outside [0, 1e30]");
  }
  if (rounds_since_measured < 0 || rounds_since_measured > kNever) {
    throw std::invalid_argument("adaptive split: rounds since the last measurement " +
                                std::to_string(rounds_since_measured) + " is out of range");
  }
  evaluations_ = evaluations;
  noise_ = noise;
  rounds_since_measured_ = rounds_since_measured;
}

}  // namespace optex
