// Everything one optex-bench invocation runs: a preset fills it, explicit flags
// override it (main.cpp).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace optex_bench {

struct Settings {
  std::string preset = "default";
  std::vector<std::string> problems = {"sphere"};  // task names; "rotated_" prefix allowed
  std::size_t dim = 1000;
  std::vector<int> parallelism = {4};
  int iterations = 50;  // sequential rounds R per run
  std::string optimizer = "adam";
  double lr = 0.01;
  // Multiples of each method's centre learning rate tried on the tuning seeds;
  // empty: no tuning, every method runs at its centre learning rate.
  std::vector<double> lr_grid = {0.1, 0.3, 1.0, 3.0, 10.0};
  // Learning-rate transfer: only vanilla is tuned over the grid; every other method
  // runs at vanilla's tuned learning rate (its centre rule applied to it: N x for
  // vanilla_nlr), untuned. Does a method work at the rate the sequential run chose?
  bool lr_from_vanilla = false;
  int seeds = 5;         // reported seeds 0 .. seeds-1
  int tuning_seeds = 3;  // tuning seeds 1000 .. 1000+tuning_seeds-1, never reported
  double noise = 0.0;    // std of the Gaussian noise on every gradient coordinate
  bool rotated = false;  // rotate every problem that is not rotated already (rotated_name)
  double clip = 0.0;     // gradient-norm clip for every problem; 0 = off
  // Per shipped problem (base name), where `clip` is not set explicitly.
  std::map<std::string, double> clip_by_problem;
  std::optional<double> target_loss;  // unset: vanilla's median final loss
  std::vector<std::string> methods;   // empty: methods.hpp's standard list
};

// The first tuning seed: tuning seeds never overlap the reported ones.
inline constexpr int kFirstTuningSeed = 1000;

}  // namespace optex_bench
