// The adaptive strategy (Strategy::adaptive): how many of the N evaluations of
// the next round each point gets, decided from what the last rounds measured
// (DESIGN.md section 2, "The adaptive strategy").
//
// The rule. rho, the gradient noise against the signal of one evaluation, is
// measured in every round that evaluates a point two or more times
// (IterationInfo::gradient_noise). The mean of D evaluations has rho / D. A
// proxy chain compounds the error of every gradient it steps with, so the
// engine gives each point the fewest evaluations D (a divisor of N) with
// rho / D <= kNoiseTarget, or all N when none suffices: noise-free gradients
// get D = 1 (OptEx), noise-dominated ones D = N (N x minibatch). The engine
// spends the warm-up round (no history: every point would hold at the
// iterate) on one point with N evaluations, which gives the first
// measurement. Without a measurement the rule keeps its starting D; when a round's predictions
// point away from the measured gradients (mean cosine < kSuspectCosine) and rho was last measured
// kProbeInterval or more rounds ago, the next round probes with the smallest D > 1, whose
// replicated evaluations measure rho.
#pragma once

#include <cstdint>

namespace optex {

class AdaptiveSplit {
 public:
  // rho / D allowed in a point's mean gradient: the mean's direction is then
  // within about 27 degrees of the noise-free gradient's (cos >= 1 / sqrt(1.25)).
  static constexpr double kNoiseTarget = 0.25;
  // Below this mean cosine the predictions are suspect: noise or a bad model.
  static constexpr double kSuspectCosine = 0.5;
  // Rounds between probes while the predictions stay suspect.
  static constexpr std::int64_t kProbeInterval = 8;
  // A measured rho is capped here (a noise-only gradient measures +infinity).
  static constexpr double kMaxNoise = 1e30;

  // Starts at `evaluations` per point (a divisor of parallelism, checked by
  // Options::validate), with no measurement.
  AdaptiveSplit(int parallelism, int evaluations);

  // Evaluations per point for the next round.
  int evaluations_per_point() const { return evaluations_; }

  // The rule: the fewest evaluations per point D (a divisor of `parallelism`)
  // with noise / D <= kNoiseTarget, `parallelism` when none does. The planner
  // (plan.hpp) asks the same question before a run.
  static int evaluations_for(int parallelism, double noise);

  // After a committed round: `gradient_noise` is its rho (NaN: not measured),
  // `cosine` the mean cosine of its predictions (NaN: none).
  void update(double gradient_noise, double cosine);

  // The state a checkpoint carries. restore() throws std::invalid_argument for
  // a value no run can reach (naming it), and then changes nothing.
  double noise() const { return noise_; }  // NaN before the first measurement
  std::int64_t rounds_since_measured() const { return rounds_since_measured_; }
  void restore(int evaluations, double noise, std::int64_t rounds_since_measured);

 private:
  int smallest_divisor_above_one() const;

  int parallelism_;
  int start_;
  int evaluations_;
  double noise_;
  std::int64_t rounds_since_measured_;
};

}  // namespace optex
