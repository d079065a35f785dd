// The methods optex-bench compares, one function each (methods.cpp), at the same
// budget: N true gradient evaluations per sequential round unless stated.
//
// Evaluations per round (N = parallelism); the budget counts true gradients only,
// never the noise-free loss the benchmark measures after each round:
//   vanilla                 1   the base optimizer, one gradient per round
//   vanilla_nlr             1   the same with N x the learning rate
//   data_parallel           N   the mean of N independently-noised gradients at the
//                               iterate (N x minibatch); without noise it is vanilla
//   line_search             N, plus 1 once in round 1 (the gradient at x0): one
//                               optimizer update direction, N step sizes along it
//                               (2^k x the lr, k = -floor((N-1)/2) .. N-1-floor((N-1)/2)),
//                               the loss and gradient at each; the best loss wins and
//                               its gradient drives the next round (the losses are
//                               exact: gradient noise touches gradients only)
//   target                  N   N true sequential base-optimizer steps (Proxy::target);
//                               sequential, so not achievable with N workers: the bound
//   optex_reference         N   Options::reference(N)
//   optex_default           N   Options{} with parallelism N
//   optex_adaptive          N   Options::adaptive(N): the adaptive split of the N
//                               evaluations into points, commits from the round's
//                               best loss, the lengthscale guard
//   ablation_last_gradient  N   Options{}, proxy steps use the newest true gradient
//   ablation_last_point     1   Options{}, only the last of the N points is evaluated
//                               (the others get a non-finite gradient, which the engine
//                               keeps out of the history)
// The engine-based methods (optex_*, ablation_*) take option overrides in brackets,
// several separated by ';', each key at most once:
//   history=T0               Options::history, an integer in [1, 4096]
//   lengthscale=L|loo|ml     a fixed lengthscale L > 0, or leave-one-out / marginal
//                            likelihood selection
//   kernel=NAME              matern12, matern32, matern52 or rbf
//   evaluations=D            Options::evaluations_per_point, an integer >= 1 that
//                            divides every N of the run (N / D points, D evaluations each)
//   strategy=fixed|adaptive  Options::strategy
//   continue=last|best       Options::continue_from (best: ContinueFrom::best_loss)
//   variance=V|off           Options::max_posterior_variance, V > 0
//   trust=T|off              Options::trust_region, T > 0
//   lengthscale_change=F|off Options::max_lengthscale_change, F >= 1
// ("off" is +infinity, the safeguard off), e.g. "optex_default[history=8;kernel=rbf]",
// "optex_adaptive[strategy=fixed]", "optex_default[continue=best;trust=2]".
// The budget stays N evaluations per round whatever the overrides.
#pragma once

#include <cstdint>
#include <optex/engine/options.hpp>
#include <optex/optimizers/optimizer.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "problem_factory.hpp"

namespace optex_bench {

enum class MethodKind {
  vanilla,
  vanilla_nlr,
  data_parallel,
  line_search,
  target,
  optex_reference,
  optex_default,
  optex_adaptive,
  ablation_last_gradient,
  ablation_last_point,
};

// Changes to an engine-based method's Options, from the bracket suffix of its name.
struct OptionOverrides {
  std::optional<int> history;
  std::optional<double> fixed_lengthscale;
  std::optional<optex::LengthscaleSelection> selection;
  std::optional<optex::Covariance> kernel;
  std::optional<int> evaluations_per_point;
  std::optional<optex::Strategy> strategy;
  std::optional<optex::ContinueFrom> continue_from;
  std::optional<double> max_posterior_variance;  // +infinity: off
  std::optional<double> trust_region;            // +infinity: off
  std::optional<double> max_lengthscale_change;  // +infinity: off
};

struct MethodSpec {
  std::string name;  // as printed and recorded, e.g. "optex_default[history=8]"
  MethodKind kind = MethodKind::vanilla;
  OptionOverrides overrides;
};

// The methods every preset but `ablation` compares, in output order.
const std::vector<std::string>& standard_method_names();

// Throws std::invalid_argument for an unknown method or a bad override.
MethodSpec parse_method(std::string_view name);

// Throws std::invalid_argument, naming the method, where its options do not suit
// parallelism N (evaluations=D where D does not divide N); other methods always suit.
void check_method_for_parallelism(const MethodSpec& method, int parallelism);

// The same-budget baselines "speedup_vs_best_baseline" compares against.
bool is_same_budget_baseline(MethodKind kind);

// The learning rate a method's grid is centred on: N x lr for vanilla_nlr.
double centre_learning_rate(MethodKind kind, double lr, int parallelism);

// The evaluations per round, as documented above (for the JSON config).
std::string evaluations_per_round(MethodKind kind);

// Everything one run of one method needs.
struct RunInputs {
  const Task* task = nullptr;
  int parallelism = 1;
  optex::Optimizer optimizer;  // learning rate already chosen
  std::uint64_t seed = 0;      // start point, gradient noise and Options::seed
  int rounds = 1;
  double clip = 0.0;  // gradient-norm clip on every gradient an optimizer sees; 0 = off
};

// Per round r = 0..R (0 = the start): the noise-free loss at the committed iterate,
// the cumulative true gradient evaluations and the cumulative wall seconds spent in
// the method (the loss measurement excluded).
struct Trajectory {
  std::vector<double> loss;
  std::vector<std::int64_t> evaluations;
  std::vector<double> seconds;
  // Why the run stopped early (an exception's message); its later rounds hold NaN.
  std::string failure;
};

Trajectory run_method(const MethodSpec& method, const RunInputs& inputs);

}  // namespace optex_bench
