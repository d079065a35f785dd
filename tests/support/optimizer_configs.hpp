// Base optimizers to hold every backend to: every kind and variant, and
// per-range hyperparameters. Shared by the engine invariants and the CUDA
// kernel tests.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex::test {

struct OptimizerConfig {
  std::string name;
  OptimizerRanges optimizer;
};

// Every optimizer kind and variant, one optimizer for every coordinate.
inline std::vector<OptimizerConfig> EveryKind() {
  return {
      {"sgd", Sgd{.lr = 1e-2}},
      {"sgd_momentum", Sgd{.lr = 1e-2, .momentum = 0.9}},
      {"sgd_nesterov", Sgd{.lr = 1e-2, .momentum = 0.9, .nesterov = true}},
      {"sgd_weight_decay", Sgd{.lr = 1e-2, .momentum = 0.5, .weight_decay = 0.1}},
      {"sgd_weight_decay_no_momentum", Sgd{.lr = 1e-2, .weight_decay = 0.1}},
      {"adam", Adam{.lr = 1e-2}},
      {"adam_l2", Adam{.lr = 1e-2, .weight_decay = 0.1}},
      {"adamw", adamw(1e-2, 0.1)},
      {"rmsprop", RmsProp{.lr = 1e-3}},
      {"rmsprop_momentum", RmsProp{.lr = 1e-3, .momentum = 0.9}},
      {"rmsprop_centered", RmsProp{.lr = 1e-3, .centered = true}},
      {"rmsprop_centered_momentum",
       RmsProp{.lr = 1e-3, .weight_decay = 0.05, .momentum = 0.9, .centered = true}},
      {"lion", Lion{.lr = 1e-3, .weight_decay = 0.1}},
  };
}

// Per-range hyperparameters over d >= 20 coordinates: three ranges of each kind
// with different values (SGD with one range without momentum, RmsProp with
// ranges of different slot layouts), and 20 ranges (more than the 16 that one
// CUDA launch takes).
inline std::vector<OptimizerConfig> EveryKindInRanges(std::size_t d) {
  const std::size_t a = d / 3;
  const std::size_t b = d / 2;
  const std::size_t c = d - a - b;
  std::vector<OptimizerRange> twenty;
  const std::size_t each = d / 20;
  for (std::size_t r = 0; r < 20; ++r) {
    const double k = static_cast<double>(r % 4);
    twenty.push_back(
        {r + 1 < 20 ? each : d - 19 * each, Adam{.lr = 1e-2 * (1.0 + 0.5 * k),
                                                 .beta1 = 0.9 - 0.02 * k,
                                                 .weight_decay = r % 2 == 0 ? 0.0 : 0.1,
                                                 .decoupled_weight_decay = true}});
  }
  return {
      {"sgd_ranges_with_and_without_momentum",
       OptimizerRanges{{a, Sgd{.lr = 1e-2}},
                       {b, Sgd{.lr = 5e-3, .momentum = 0.9, .nesterov = true}},
                       {c, Sgd{.lr = 2e-2, .momentum = 0.5, .weight_decay = 0.1}}}},
      {"adamw_ranges",
       OptimizerRanges{
           {a, adamw(1e-2, 0.1)},
           {b, adamw(3e-3, 0.0)},
           {c,
            Adam{.lr = 2e-2, .beta1 = 0.8, .weight_decay = 0.05, .decoupled_weight_decay = true}}}},
      {"adam_l2_ranges", OptimizerRanges{{a, Adam{.lr = 1e-2, .weight_decay = 0.1}},
                                         {b, Adam{.lr = 5e-3, .beta2 = 0.99}},
                                         {c, Adam{.lr = 2e-2, .eps = 1e-6}}}},
      {"rmsprop_ranges",
       OptimizerRanges{{a, RmsProp{.lr = 1e-3, .centered = true}},
                       {b, RmsProp{.lr = 2e-3, .momentum = 0.9}},
                       {c, RmsProp{.lr = 5e-4, .alpha = 0.9, .weight_decay = 0.1}}}},
      {"lion_ranges", OptimizerRanges{{a, Lion{.lr = 1e-3}},
                                      {b, Lion{.lr = 3e-4, .beta1 = 0.95, .weight_decay = 0.2}},
                                      {c, Lion{.lr = 2e-3, .beta2 = 0.9, .weight_decay = 0.01}}}},
      {"adamw_20_ranges", OptimizerRanges(twenty)},
  };
}

// Both of the above.
inline std::vector<OptimizerConfig> EveryConfig(std::size_t d) {
  std::vector<OptimizerConfig> all = EveryKind();
  for (OptimizerConfig& c : EveryKindInRanges(d)) all.push_back(std::move(c));
  return all;
}

}  // namespace optex::test
