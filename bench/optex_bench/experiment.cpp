#include "experiment.hpp"

#include <cmath>
#include <limits>
#include <optex/optimizers/optimizer.hpp>
#include <optional>
#include <stdexcept>
#include <utility>

#include "statistics.hpp"

namespace optex_bench {
namespace {

// The named optimizer with its defaults but the learning rate.
optex::Optimizer make_optimizer(const std::string& name, double lr) {
  return optex::with_learning_rate(optex::optimizer_from_name(name), lr);
}

std::vector<int> reported_seeds(const Settings& s) {
  std::vector<int> seeds;
  for (int k = 0; k < s.seeds; ++k) seeds.push_back(k);
  return seeds;
}

std::vector<int> tuning_seeds(const Settings& s) {
  std::vector<int> seeds;
  for (int k = 0; k < s.tuning_seeds; ++k) seeds.push_back(kFirstTuningSeed + k);
  return seeds;
}

bool tunes(const Settings& s) { return s.lr_grid.size() > 1 && s.tuning_seeds > 0; }

// Runs one method at one learning rate on the given seeds.
struct Runner {
  const Settings& settings;
  const Task& task;
  double clip;
  const RunObserver& observer;

  std::vector<Trajectory> run(const MethodSpec& method, int parallelism, double lr,
                              const std::vector<int>& seeds) const {
    std::vector<Trajectory> runs;
    for (int seed : seeds) {
      RunInputs in;
      in.task = &task;
      in.parallelism = parallelism;
      in.optimizer = make_optimizer(settings.optimizer, lr);
      in.seed = static_cast<std::uint64_t>(seed);
      in.rounds = settings.iterations;
      in.clip = clip;
      runs.push_back(run_method(method, in));
      if (observer) observer(final_loss(runs.back()));
    }
    return runs;
  }
};

// What tuning compares: median rounds to the target, then median final loss.
struct TuningScore {
  double rounds;
  double final;
  bool operator<(const TuningScore& o) const {
    return rounds != o.rounds ? rounds < o.rounds : final < o.final;
  }
};

TuningScore score(const std::vector<Trajectory>& runs, double target) {
  std::vector<double> rounds, finals;
  for (const Trajectory& t : runs) {
    rounds.push_back(rounds_to_target(t, target));
    finals.push_back(final_loss(t));
  }
  return {quartiles(rounds).median, quartiles(finals).median};
}

struct TuningChoice {
  double lr;
  TuningScore score;  // on the tuning seeds; infinite when nothing was tuned
};

// The learning rate with the best score on the tuning seeds. Without a target
// (vanilla setting it), only the final loss counts.
TuningChoice tune_learning_rate(const Runner& runner, const MethodSpec& method, int parallelism,
                                double centre, const std::optional<double>& target) {
  const Settings& s = runner.settings;
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  if (!tunes(s)) {
    return {s.lr_grid.size() == 1 ? centre * s.lr_grid.front() : centre, {kInfinity, kInfinity}};
  }
  double best_lr = centre;
  TuningScore best{std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::infinity()};
  bool first = true;
  for (double factor : s.lr_grid) {
    const double lr = centre * factor;
    const auto runs = runner.run(method, parallelism, lr, tuning_seeds(s));
    TuningScore candidate = score(runs, target.value_or(-std::numeric_limits<double>::infinity()));
    if (!target) candidate.rounds = 0.0;  // final loss alone decides
    if (first || candidate < best) {
      best = candidate;
      best_lr = lr;
      first = false;
    }
  }
  return {best_lr, best};
}

// Vanilla's median final loss as a target; NaN, which no loss reaches, when
// vanilla's median run diverged (an infinite target would count every run).
double target_from_vanilla(double median_final_loss) {
  return std::isfinite(median_final_loss) ? median_final_loss
                                          : std::numeric_limits<double>::quiet_NaN();
}

MethodOutcome run_outcome(const Runner& runner, const MethodSpec& method, int parallelism,
                          double lr) {
  MethodOutcome out;
  out.parallelism = parallelism;
  out.method = method;
  out.lr = lr;
  out.seeds = reported_seeds(runner.settings);
  out.runs = runner.run(method, parallelism, lr, out.seeds);
  return out;
}

}  // namespace

double effective_clip(const Settings& settings, const Task& task) {
  if (settings.clip > 0.0) return settings.clip;
  const auto it = settings.clip_by_problem.find(task.base_name);
  return it == settings.clip_by_problem.end() ? 0.0 : it->second;
}

std::int64_t count_runs(const Settings& settings, std::size_t tasks,
                        const std::vector<MethodSpec>& methods) {
  const std::int64_t tuning =
      tunes(settings) ? static_cast<std::int64_t>(settings.lr_grid.size()) * settings.tuning_seeds
                      : 0;
  const std::int64_t per_vanilla = settings.seeds + tuning;
  const std::int64_t per_other = settings.seeds + (settings.lr_from_vanilla ? 0 : tuning);
  const auto others = static_cast<std::int64_t>(methods.size()) - 1;  // vanilla runs once per task
  const auto n_values = static_cast<std::int64_t>(settings.parallelism.size());
  return static_cast<std::int64_t>(tasks) * (per_vanilla + others * n_values * per_other);
}

std::vector<TaskOutcome> run_experiment(const Settings& settings, const std::vector<Task>& tasks,
                                        const std::vector<MethodSpec>& methods,
                                        const RunObserver& observer) {
  if (methods.empty() || methods.front().kind != MethodKind::vanilla) {
    throw std::invalid_argument("methods: the list must start with vanilla");
  }
  std::vector<TaskOutcome> outcomes;
  for (const Task& task : tasks) {
    TaskOutcome out;
    out.task = task.name;
    out.own_noise = task.own_noise;
    out.stochastic = task.stochastic();
    out.clip = effective_clip(settings, task);
    const Runner runner{settings, task, out.clip, observer};

    // Vanilla does not depend on N: run once, reported under every N.
    const MethodSpec& vanilla = methods.front();
    const TuningChoice vanilla_choice =
        tune_learning_rate(runner, vanilla, 1, settings.lr, settings.target_loss);
    std::optional<double> tuning_target = settings.target_loss;
    if (!tuning_target && tunes(settings)) {
      tuning_target = target_from_vanilla(vanilla_choice.score.final);
    }
    const MethodOutcome vanilla_outcome = run_outcome(runner, vanilla, 1, vanilla_choice.lr);
    if (settings.target_loss) {
      out.target = *settings.target_loss;
    } else {
      std::vector<double> finals;
      for (const Trajectory& t : vanilla_outcome.runs) finals.push_back(final_loss(t));
      out.target = target_from_vanilla(quartiles(finals).median);
    }

    for (int n : settings.parallelism) {
      MethodOutcome v = vanilla_outcome;
      v.parallelism = n;
      out.methods.push_back(std::move(v));
      for (std::size_t m = 1; m < methods.size(); ++m) {
        const MethodSpec& method = methods[m];
        if (settings.lr_from_vanilla) {
          const double lr = centre_learning_rate(method.kind, vanilla_choice.lr, n);
          out.methods.push_back(run_outcome(runner, method, n, lr));
          continue;
        }
        const double centre = centre_learning_rate(method.kind, settings.lr, n);
        const double lr = tune_learning_rate(runner, method, n, centre, tuning_target).lr;
        out.methods.push_back(run_outcome(runner, method, n, lr));
      }
    }
    outcomes.push_back(std::move(out));
  }
  return outcomes;
}

}  // namespace optex_bench
