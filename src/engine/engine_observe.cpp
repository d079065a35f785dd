// Engine::observe: true pairs that no round committed enter the history
// (engine.hpp; DESIGN.md section 2).
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "optex/backend/engine_backend.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/magnitude_bound.hpp"

namespace optex {

std::string detail::observed_pairs_refusal(std::span<const float> points,
                                           std::span<const float> gradients, std::size_t d) {
  if (d == 0 || points.size() % d != 0 || gradients.size() != points.size()) {
    return "observe: points has " + std::to_string(points.size()) + " values and gradients " +
           std::to_string(gradients.size()) +
           "; each must hold m x d values (m pairs, row-major) " + "with d = " + std::to_string(d);
  }
  const float bound = magnitude_bound(d);
  for (const auto& [name, values] :
       {std::pair{"points", points}, std::pair{"gradients", gradients}}) {
    if (all_within_bound(values, bound)) continue;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (within_bound(values[i], bound)) continue;
      std::ostringstream msg;
      msg << "observe: " << name << " row " << i / d << ", element " << i % d << " is " << values[i]
          << " (must be finite and at most " << bound << " in magnitude, the bound for dimension "
          << d << "); nothing was observed";
      return msg.str();
    }
  }
  return {};
}

void Engine::observe(std::span<const float> points, std::span<const float> gradients) {
  detail::EngineBackend& b = backend();
  if (pending_) {
    throw std::runtime_error(
        "observe: between ask() and tell() (iteration " + std::to_string(iteration_) +
        "): the pending batch's proxy steps used the current history; call it after tell()");
  }
  if (!shard_.is_whole()) {
    throw std::logic_error(
        "observe: not supported on a slice of a sharded engine (a slice holds part of each "
        "pair, and its ranks would have to push together)");
  }
  const std::string refusal = detail::observed_pairs_refusal(points, gradients, dim());
  if (!refusal.empty()) throw std::invalid_argument(refusal);
  if (points.empty()) return;
  b.observe(points, gradients);
  fitted_ = false;  // the next ask() refits with the new pairs
  // The new pairs advanced the ring past the gradients a verified window would
  // redo its steps with: the next window starts afresh (the trajectory is the same).
  window_carried_ = 0;
}

}  // namespace optex
