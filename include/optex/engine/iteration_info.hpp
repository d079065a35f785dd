// What the engine reports after each committed iteration (to callbacks, and
// as the return value of Engine::tell).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace optex {

// The new iterate as IterationInfo reports it: the host's own vector on a CPU
// engine; on a device engine a copy made on first use (one download, never
// during the round itself). Reads as a std::span<const float>, valid until
// the engine's next tell.
class IterateView {
 public:
  IterateView() = default;
  explicit IterateView(std::span<const float> host) : values_(host), known_(true) {}
  IterateView(std::function<std::span<const float>()> copy, std::size_t size)
      : copy_(std::move(copy)), size_(size) {}

  std::span<const float> span() const {
    if (!known_) {
      values_ = copy_();
      known_ = true;
    }
    return values_;
  }
  operator std::span<const float>() const { return span(); }  // NOLINT: reads as a span
  std::size_t size() const { return known_ ? values_.size() : size_; }
  bool empty() const { return size() == 0; }
  const float* data() const { return span().data(); }
  const float* begin() const { return span().data(); }
  const float* end() const { return span().data() + span().size(); }
  float operator[](std::size_t i) const { return span()[i]; }

 private:
  std::function<std::span<const float>()> copy_;
  std::size_t size_ = 0;
  mutable std::span<const float> values_;
  mutable bool known_ = false;
};

struct IterationInfo {
  std::int64_t iteration = 0;    // iterations committed so far (1 after the first tell)
  std::int64_t evaluations = 0;  // true gradient evaluations so far
  double loss = 0.0;             // loss at the point the commit stepped from (the last finite one)
  double best_loss = 0.0;        // lowest finite loss of the batch
  double grad_norm = 0.0;        // ||g|| at that point
  // Mean cosine between predicted and true gradient over the proxy points
  // that had a real prediction; NaN when none had (N = 1, warm-up).
  double cosine = 0.0;
  double lengthscale = 0.0;  // lengthscale used by this iteration's proxy steps
  // Index among the round's distinct points (the first evaluation of point p
  // is batch row point_evaluations[0] + ... + point_evaluations[p-1]).
  int committed_point = 0;
  int dropped = 0;  // evaluations with a non-finite gradient or loss (kept out of the history)

  // Per distinct point p of the round (P entries):
  std::vector<int> point_evaluations;  // how many of the N evaluations point p had
  // GP posterior variance at point p, in units of the prior variance, where a
  // GP prediction was made there (the proxy step from p, or the prediction a
  // safeguard refused); NaN elsewhere.
  std::vector<double> posterior_variance;
  // ||g_p - mu_p|| / ||g_p|| between point p's measured gradient (the mean of
  // its admissible evaluations) and the prediction its proxy step used; NaN
  // where nothing was predicted or the pair was dropped.
  std::vector<double> prediction_error;
  // Gradient noise against signal, per evaluation (rho, DESIGN.md section 2):
  // the mean over points with two or more admissible evaluations of
  // tr(C) / (||mean||^2 - tr(C) / m), C the sample covariance of one
  // evaluation and m the evaluations; 1e30 where the denominator is not
  // positive (noise only); NaN when no point had two.
  double gradient_noise = 0.0;
  // Verified mode: the base optimizer's steps this round committed, 1 to N
  // (the first is always exact; each further one's guess agreed), and the
  // largest relative disagreement ||guess - replayed|| / ||replayed|| among the
  // guesses it accepted (0 at tolerance 0). The approximate mode: 1 and NaN.
  int committed_steps = 1;
  double disagreement = 0.0;
  // Why the proxy chain ended before its planned length: "" (it did not),
  // "posterior_variance" or "trust_region".
  const char* chain_stop = "";
  // The new iterate, valid until the next tell; on a device engine its first
  // use copies it from the device (Engine::iterate()).
  IterateView iterate;
};

}  // namespace optex
