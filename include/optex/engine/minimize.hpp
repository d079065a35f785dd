// optex::minimize: the ask/tell loop with the N evaluations on a thread pool.
#pragma once

#include <cmath>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "optex/engine/engine.hpp"
#include "optex/engine/objective.hpp"
#include "optex/engine/options.hpp"
#include "optex/util/thread_pool.hpp"

namespace optex {

enum class StopReason { max_iters, target_loss, grad_tol, callback };

inline std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::max_iters:
      return "max_iters";
    case StopReason::target_loss:
      return "target_loss";
    case StopReason::grad_tol:
      return "grad_tol";
    case StopReason::callback:
      return "callback";
  }
  return "unknown";
}

struct Result {
  std::vector<float> x;              // the final iterate
  double fun = 0.0;                  // the loss at x (one extra evaluation, counted in evaluations)
  std::int64_t iterations = 0;       // sequential rounds
  std::int64_t evaluations = 0;      // true gradient evaluations
  std::vector<double> loss_history;  // IterationInfo::loss of each round
  StopReason stop_reason = StopReason::max_iters;
};

namespace detail {
// A callback may return bool (true: stop) or nothing.
template <class Callback>
bool invoke_callback(Callback& cb, const IterationInfo& info) {
  if constexpr (std::is_same_v<std::invoke_result_t<Callback&, const IterationInfo&>, bool>) {
    return cb(info);
  } else {
    cb(info);
    return false;
  }
}
// Why a run stops after a round, if it does: a callback asked to, then the
// target loss, then the gradient tolerance.
inline std::optional<StopReason> stop_reason_after(const IterationInfo& info, const Stop& stop,
                                                   bool callback_asked) {
  if (callback_asked) return StopReason::callback;
  if (info.loss <= stop.target_loss) return StopReason::target_loss;
  if (info.grad_norm <= stop.grad_tol) return StopReason::grad_tol;
  return std::nullopt;
}
}  // namespace detail

// Runs OptEx until `stop` says so. The objective is called from
// options.parallelism threads at once (see objective.hpp); with Proxy::target
// it is also called sequentially for the proxy steps. Each callback receives
// the IterationInfo of every round; one that returns true stops the run.
template <class Objective, class... Callbacks>
Result minimize(Objective&& objective, std::span<const float> x0, OptimizerRanges optimizer,
                Options options = {}, Stop stop = {}, Callbacks&&... callbacks) {
  using F = std::remove_reference_t<Objective>;
  static_assert(optex::Objective<F>,
                "optex::minimize: the objective needs `double EvaluateWithGradient("
                "std::span<const float> x, std::span<float> g)`, or `double Evaluate(x)` together "
                "with `void Gradient(x, g)`, or must be callable as `double f(x, g)`");
  stop.validate();
  Engine engine(x0, std::move(optimizer), options);
  if (options.proxy == Proxy::target) {
    engine.set_gradient_oracle([&objective](std::span<const float> x, std::span<float> g) {
      return evaluate_with_gradient(objective, x, g);
    });
  }
  ThreadPool pool(options.parallelism);
  Result result;
  result.stop_reason = StopReason::max_iters;
  for (std::int64_t t = 0; t < stop.max_iters; ++t) {
    Batch& batch = engine.ask();
    pool.parallel_for(batch.size(), [&](int i) {
      batch.loss(i) = evaluate_with_gradient(objective, batch.point(i), batch.grad(i));
    });
    const IterationInfo& info = engine.tell(batch);
    result.loss_history.push_back(info.loss);
    bool stop_now = false;
    ((stop_now = detail::invoke_callback(callbacks, info) || stop_now), ...);
    if (const auto reason = detail::stop_reason_after(info, stop, stop_now)) {
      result.stop_reason = *reason;
      break;
    }
  }
  result.x.assign(engine.iterate().begin(), engine.iterate().end());
  std::vector<float> g(result.x.size());
  result.fun = evaluate_with_gradient(objective, result.x, g);
  result.iterations = engine.iteration();
  result.evaluations = engine.evaluations() + 1;
  return result;
}

}  // namespace optex
