// The whole comparison: for every task and parallelism N, each method's learning
// rate chosen on the tuning seeds, then its runs on the reported seeds.
//
// Learning-rate tuning (skipped when the grid is empty or has one entry): each
// method tries its centre learning rate (methods.hpp) times every grid entry on
// the tuning seeds (1000, 1001, ...; never reported) and keeps the one with the
// fewest median rounds to the tuning target, then the lowest median final loss.
// The tuning target is --target-loss when given; otherwise vanilla, tuned first
// on median final loss alone, sets it: its median final loss on the tuning seeds.
//
// With Settings::lr_from_vanilla only vanilla is tuned, as above; every other method
// then runs at its centre learning rate taken from vanilla's tuned one (N x it for
// vanilla_nlr) with no tuning of its own.
//
// The reported target is --target-loss when given; otherwise the median over the
// reported seeds of the loss vanilla reaches at its last round, so "rounds to
// target" asks how fast each method reaches what vanilla reaches in the budget.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "methods.hpp"
#include "problem_factory.hpp"
#include "settings.hpp"

namespace optex_bench {

struct MethodOutcome {
  int parallelism = 1;
  MethodSpec method;
  double lr = 0.0;  // the learning rate the reported runs used
  std::vector<int> seeds;
  std::vector<Trajectory> runs;  // one per seed, in the order of `seeds`
};

struct TaskOutcome {
  std::string task;
  std::string own_noise;    // the problem's own gradient noise in words (Task::own_noise)
  bool stochastic = false;  // Task::stochastic(): gradients at one point can differ
  double clip = 0.0;
  double target = 0.0;                 // the reported target loss; NaN when vanilla diverged
  std::vector<MethodOutcome> methods;  // every parallelism, in the order run
};

// The gradient-norm clip a task runs with: --clip when given, else the preset's
// per-problem value, else none (0).
double effective_clip(const Settings& settings, const Task& task);

// How many runs run_experiment makes (tuning included), for a progress bar.
std::int64_t count_runs(const Settings& settings, std::size_t tasks,
                        const std::vector<MethodSpec>& methods);

// Called after every run with its final loss.
using RunObserver = std::function<void(double final_loss)>;

// `methods` must start with vanilla (the target and the speedups need it).
std::vector<TaskOutcome> run_experiment(const Settings& settings, const std::vector<Task>& tasks,
                                        const std::vector<MethodSpec>& methods,
                                        const RunObserver& observer);

}  // namespace optex_bench
