// optex::minimize_distributed: minimize() across the ranks of a communicator.
//
// Call it on every rank with the same arguments (rank 0's x0 is the one
// used); ranks given different Stop criteria throw std::invalid_argument
// naming the first one that differs, before the first iteration. Each rank evaluates its share of
// the N points on a local thread pool (one thread per point it owns), the gradients are
// all-gathered, and every rank returns the same Result. An objective that throws is reported as a
// failure of that rank (DistributedOptions::on_failure decides what follows).
//
//   mpirun -np 4 ./my_program        // W = 4 ranks, e.g. N = 4: one point each
#pragma once

#include <exception>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "optex/distributed/data_parallel.hpp"
#include "optex/distributed/distributed_engine.hpp"
#include "optex/distributed/startup_agreement.hpp"
#include "optex/engine/minimize.hpp"
#include "optex/engine/objective.hpp"
#include "optex/util/thread_pool.hpp"

namespace optex {

// The objective may take a minibatch seed (objective.hpp); with
// data_parallel > 1 it should, or every rank of a group computes the same
// gradient. The callbacks run on every rank; the run stops when any rank's
// callback returns true.
template <class Objective, class... Callbacks>
Result minimize_distributed(Objective&& objective, std::span<const float> x0,
                            OptimizerRanges optimizer, Options options, Communicator& communicator,
                            DistributedOptions distributed = {}, Stop stop = {},
                            Callbacks&&... callbacks) {
  using F = std::remove_reference_t<Objective>;
  static_assert(optex::Objective<F> || SeededObjective<F>,
                "optex::minimize_distributed: the objective needs `double "
                "EvaluateWithGradient(x, g)` (optionally with a std::uint64_t seed), `double "
                "Evaluate(x)` with `void Gradient(x, g)`, or must be callable as f(x, g) or "
                "f(x, g, seed)");
  stop.validate();
  DistributedEngine engine(x0, std::move(optimizer), options, communicator, distributed);
  // Ranks that would stop at different iterations would call collectives of
  // different sizes: agree on the criteria first.
  StartupStatus criteria;
  criteria.add("stop.max_iters", stop.max_iters);
  criteria.add("stop.target_loss", stop.target_loss);
  criteria.add("stop.grad_tol", stop.grad_tol);
  if (const std::string differ = first_disagreement(communicator, criteria.settings);
      !differ.empty()) {
    throw std::invalid_argument("minimize_distributed: " + differ);
  }
  if (options.proxy == Proxy::target) {
    // Every rank walks the same sequential target trajectory.
    engine.engine().set_gradient_oracle(
        [&objective, seed = options.seed](std::span<const float> x, std::span<float> g) {
          return evaluate_with_gradient(objective, x, g, seed);
        });
  }
  ThreadPool pool(std::max(1, engine.my_points().count));
  Result result;
  for (std::int64_t t = 0; t < stop.max_iters; ++t) {
    Batch& batch = engine.ask();
    const DistributedEngine::PointRange mine = engine.my_points();
    std::vector<std::optional<std::string>> failures(static_cast<std::size_t>(mine.count));
    pool.parallel_for(mine.count, [&](int k) {
      const int i = mine.first + k;
      try {
        batch.loss(i) =
            evaluate_with_gradient(objective, batch.point(i), batch.grad(i), engine.seed(i));
      } catch (const std::exception& e) {  // each k writes only its own slot
        failures[static_cast<std::size_t>(k)] = e.what();
      } catch (...) {
        failures[static_cast<std::size_t>(k)] = "unknown exception";
      }
    });
    for (int k = 0; k < mine.count; ++k) {
      if (failures[static_cast<std::size_t>(k)]) {
        engine.fail(mine.first + k, *failures[static_cast<std::size_t>(k)]);
      }
    }
    const IterationInfo& info = engine.tell(batch);
    result.loss_history.push_back(info.loss);
    bool stop_now = false;
    ((stop_now = detail::invoke_callback(callbacks, info) || stop_now), ...);
    if constexpr (sizeof...(Callbacks) > 0) {
      // Any rank's callback stops every rank.
      double flag = stop_now ? 1.0 : 0.0;
      communicator.all_reduce(std::span<double>(&flag, 1), ReduceOp::max);
      stop_now = flag > 0.0;
    }
    if (const auto reason = detail::stop_reason_after(info, stop, stop_now)) {
      result.stop_reason = *reason;
      break;
    }
  }
  result.x.assign(engine.engine().iterate().begin(), engine.engine().iterate().end());
  // The final loss. A stochastic objective gives each rank its own minibatch
  // and the ranks agree on the mean; a deterministic one is the same everywhere.
  std::vector<float> g(result.x.size());
  if constexpr (SeededObjective<F>) {
    const std::uint64_t final_seed = minibatch_seed(
        mix_seed(options.seed, static_cast<std::uint64_t>(engine.engine().iteration())),
        communicator.rank(), communicator.size());
    double fun = evaluate_with_gradient(objective, result.x, g, final_seed);
    communicator.all_reduce(std::span<double>(&fun, 1), ReduceOp::sum);
    result.fun = fun / communicator.size();
  } else {
    result.fun = evaluate_with_gradient(objective, result.x, g);
  }
  result.iterations = engine.engine().iteration();
  result.evaluations = engine.engine().evaluations() + 1;
  return result;
}

}  // namespace optex
