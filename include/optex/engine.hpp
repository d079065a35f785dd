// The OptEx engine: ask for the N points of an iteration, tell their true
// gradients, and it commits (DESIGN.md section 2).
//
//   optex::Engine engine(x0, optex::Adam{.lr = 1e-2}, options);
//   for (int t = 0; t < iters; ++t) {
//     optex::Batch& b = engine.ask();
//     for (int i = 0; i < b.size(); ++i) b.loss(i) = f(b.point(i), b.grad(i));
//     engine.tell(b);
//   }
//
// Non-finite values: a pair whose gradient or loss is not finite is dropped:
// it never enters the history, and the commit steps from the last point of
// the batch whose pair is finite (replaying the proxy steps up to it, so the
// optimizer state is exactly that point's). If no pair is finite, tell()
// throws std::runtime_error and nothing changes: the batch stays pending.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "optex/batch.hpp"
#include "optex/gp_estimator.hpp"
#include "optex/gradient_history.hpp"
#include "optex/iteration_info.hpp"
#include "optex/optimizer.hpp"
#include "optex/options.hpp"
#include "optex/random.hpp"

namespace optex {

// Writes the true gradient at x into g and returns the loss. Needed only by
// Proxy::target, whose proxy steps use true gradients.
using GradientOracle = std::function<double(std::span<const float> x, std::span<float> g)>;

class Engine {
 public:
  // Throws std::invalid_argument, naming the parameter and its value, for an
  // empty or non-finite x0, bad options or bad optimizer hyperparameters.
  Engine(std::span<const float> x0, Optimizer optimizer, Options options = {});

  // Movable, not copyable: a batch names the engine it came from.
  Engine(Engine&&) noexcept = default;
  Engine& operator=(Engine&&) noexcept = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The N points of this iteration. Asking again before tell() returns the
  // same batch unchanged.
  Batch& ask();

  // Commits the batch returned by the last ask(), whose gradients and losses
  // the caller has filled in. Throws std::invalid_argument for a batch of
  // another engine, std::runtime_error without a pending ask(); the engine is
  // unchanged after any throw.
  const IterationInfo& tell(Batch& batch);

  // The same, from flat arrays: gradients N x d row-major, losses N.
  const IterationInfo& tell(std::span<const float> gradients, std::span<const double> losses);

  void set_gradient_oracle(GradientOracle oracle) { oracle_ = std::move(oracle); }

  // Checkpoints: everything that determines the rest of the trajectory. Saving
  // between ask() and tell() throws std::runtime_error. load() throws
  // std::runtime_error for a missing, truncated, corrupted or foreign file.
  void save(const std::string& path) const;
  static Engine load(const std::string& path);

  std::size_t dim() const { return x_.size(); }
  std::span<const float> iterate() const { return x_; }
  const OptimizerState& optimizer_state() const { return state_; }
  const Optimizer& optimizer() const { return optimizer_; }
  const Options& options() const { return options_; }
  const GradientHistory& history() const { return history_; }
  std::int64_t iteration() const { return iteration_; }
  std::int64_t evaluations() const { return evaluations_; }
  double lengthscale() const { return lengthscale_; }
  bool pending() const { return pending_; }
  std::uint64_t rng_state() const { return rng_.state(); }
  const IterationInfo& last_info() const { return info_; }

 private:
  friend struct CheckpointAccess;
  // The proxy gradient at batch point i into predicted row i; false when the
  // warm-up holds the points at the iterate instead.
  bool proxy_gradient(int i);
  void refit_if_needed();
  const IterationInfo& commit(Batch& batch);

  Options options_;
  Optimizer optimizer_;
  std::vector<float> x_;
  OptimizerState state_;
  GradientHistory history_;
  GpGradientEstimator estimator_;
  double lengthscale_;
  SplitMix64 rng_;
  std::int64_t iteration_ = 0;
  std::int64_t evaluations_ = 0;

  // Per-iteration work space (allocated once).
  Batch batch_;
  OptimizerState work_state_;  // s_{N-1} after ask()
  std::vector<float> next_x_;
  std::vector<char> finite_;  // per point: may its pair enter the history?
  bool pending_ = false;
  bool fitted_ = false;  // estimator matches history_ and lengthscale_
  std::uint64_t id_;
  GradientOracle oracle_;
  IterationInfo info_;
};

}  // namespace optex
