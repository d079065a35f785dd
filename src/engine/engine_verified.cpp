// The Engine's side of the verified mode (Options::mode == Mode::verified;
// DESIGN.md section 2, "The verified mode"): which guesses a round redoes, and
// how many of the base optimizer's steps its commit keeps. The arithmetic is
// the backend's (device_backend_window.cpp), the decisions are made here once
// for every device.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "optex/backend/engine_backend.hpp"
#include "optex/engine/engine.hpp"

namespace optex {

int Engine::redo_window(Batch& chain) {
  const int carried = std::min(window_carried_, chain.size() - 1);
  if (options_.mode != Mode::verified || carried <= 0) return 1;
  const auto capacity = static_cast<std::size_t>(options_.history);
  // At tolerance 0 a guess must reach the replay's bits: the measured gradients as
  // they are converge to them (the sweep's fixed point is the sequential run's). Above
  // it the GP's correction to each guess's new point gets closer in fewer rounds.
  const bool gp_correction = options_.tolerance > 0.0 && options_.proxy == Proxy::gp;
  for (int i = 1; i <= carried; ++i) {
    chain.was_predicted_[static_cast<std::size_t>(i - 1)] = 1;  // a measured gradient
    const std::size_t slot = (window_first_slot_ + static_cast<std::size_t>(i - 1)) % capacity;
    backend().redo_step(chain, i, slot, gp_correction);
  }
  return carried + 1;
}

int Engine::verified_steps(Batch& chain, std::span<const char> admissible, double& disagreement,
                           int& usable) {
  // Steps may use the gradients of the points before the first inadmissible one.
  const int n = chain.size();
  usable = 0;
  while (usable < n && admissible[static_cast<std::size_t>(usable)]) ++usable;
  if (usable == 0) return 0;
  // The first step is exact (point 0 is the iterate); step j + 1 is too where
  // point j + 1 is the iterate the first j + 1 steps reach, within the tolerance.
  const std::vector<double> sums = backend().window_disagreements(chain, usable);
  int steps = 1;
  disagreement = 0.0;
  for (; steps < usable; ++steps) {
    const double distance = sums[2 * static_cast<std::size_t>(steps - 1)];
    const double norm = sums[2 * static_cast<std::size_t>(steps - 1) + 1];
    const double relative = distance == 0.0 ? 0.0 : std::sqrt(distance / std::max(norm, DBL_MIN));
    if (!(relative <= options_.tolerance)) break;
    disagreement = std::max(disagreement, relative);
  }
  // A step that leaves the magnitude bound ends the commit before it.
  while (steps > 0 && !backend().stage_steps(chain, steps)) --steps;
  return steps;
}

}  // namespace optex
