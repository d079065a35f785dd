#include "command_line.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "../../tools/flag_values.hpp"
#include "../list_flag.hpp"
#include "methods.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace optex_bench {
namespace {

using optex::flags::parse_integer;
using optex::flags::reject;

// Accepts "100000" and "1e5" alike.
double parse_real(std::string_view flag, const std::string& text) {
  const std::optional<double> v = optex::flags::whole_number(text);
  if (!v) reject(flag, text, "must be a number");
  if (!std::isfinite(*v)) reject(flag, text, "must be a finite number");
  return *v;
}

// The raw text of every flag; applied on top of the preset only when given.
struct RawFlags {
  std::string preset = "default";
  std::string problems, parallelism, methods;  // comma-separated lists
  std::string dim, iterations, optimizer, lr, seeds, tuning_seeds, noise, clip, target_loss,
      lr_grid;
  bool rotated = false;
  bool lr_from_vanilla = false;
};

Settings resolve(const CLI::App& app, const RawFlags& raw) {
  Settings s;
  try {
    s = preset_settings(raw.preset);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--preset: ") + e.what());
  }
  const auto given = [&app](const char* flag) { return app.count(flag) > 0; };
  if (given("--problem")) {
    s.problems = split_list("--problem", raw.problems);
    refuse_repeats("--problem", raw.problems, s.problems);
  }
  if (given("--dim"))
    s.dim = static_cast<std::size_t>(parse_integer("--dim", raw.dim, 1, 1'000'000'000));
  if (given("--parallelism")) {
    s.parallelism.clear();
    for (const std::string& n : split_list("--parallelism", raw.parallelism)) {
      s.parallelism.push_back(static_cast<int>(parse_integer("--parallelism", n, 1, 1024)));
    }
    refuse_repeats("--parallelism", raw.parallelism, s.parallelism);
  }
  if (given("--iterations")) {
    s.iterations = static_cast<int>(parse_integer("--iterations", raw.iterations, 1, 10'000'000));
  }
  if (given("--optimizer")) {
    try {
      (void)optex::optimizer_from_name(raw.optimizer);
    } catch (const std::invalid_argument&) {
      reject("--optimizer", raw.optimizer, "must be one of " + optex::optimizer_names());
    }
    s.optimizer = raw.optimizer;
  }
  if (given("--lr")) {
    s.lr = parse_real("--lr", raw.lr);
    if (!(s.lr > 0.0)) reject("--lr", raw.lr, "must be > 0");
  }
  if (given("--seeds")) {
    s.seeds = static_cast<int>(parse_integer("--seeds", raw.seeds, 1, kFirstTuningSeed));
  }
  if (given("--tuning-seeds")) {
    s.tuning_seeds = static_cast<int>(parse_integer("--tuning-seeds", raw.tuning_seeds, 0, 1000));
  }
  if (given("--noise")) {
    s.noise = parse_real("--noise", raw.noise);
    if (s.noise < 0.0) reject("--noise", raw.noise, "must be >= 0");
  }
  if (given("--rotated")) s.rotated = raw.rotated;
  if (given("--lr-from-vanilla")) s.lr_from_vanilla = raw.lr_from_vanilla;
  if (given("--clip")) {
    s.clip = parse_real("--clip", raw.clip);
    if (s.clip < 0.0) reject("--clip", raw.clip, "must be >= 0 (0 = no clip)");
    s.clip_by_problem.clear();  // an explicit clip applies to every problem
  }
  if (given("--target-loss")) s.target_loss = parse_real("--target-loss", raw.target_loss);
  if (given("--lr-grid")) {
    s.lr_grid.clear();
    if (raw.lr_grid != "none") {
      for (const std::string& item : split_list("--lr-grid", raw.lr_grid)) {
        double factor = 0.0;
        try {
          factor = parse_real("--lr-grid", item);
        } catch (const std::invalid_argument&) {
          factor = 0.0;
        }
        if (!(factor > 0.0)) {
          reject("--lr-grid", raw.lr_grid,
                 "needs numbers > 0, comma-separated, or none ('" + item + "' is not)");
        }
        s.lr_grid.push_back(factor);
      }
      refuse_repeats("--lr-grid", raw.lr_grid, s.lr_grid);
    }
  }
  // Repeated methods are refused by name once parsed (main.cpp): "optex[history=8]"
  // and "optex" are different methods.
  if (given("--methods")) s.methods = split_list("--methods", raw.methods);
  return s;
}

std::string footer() {
  std::string methods;
  for (const std::string& m : standard_method_names()) methods += (methods.empty() ? "" : ", ") + m;
  return "\n" + preset_help() + "\nmethods: " + methods +
         "; engine methods take [key=value;...] overrides: history, lengthscale (a number: "
         "fixed; loo; ml), kernel (matern12, matern32, matern52, rbf), evaluations (D, "
         "dividing every N), strategy (fixed, adaptive), continue (last, best), variance (> 0 "
         "or off), trust (> 0 or off), lengthscale_change (>= 1 or off); see methods.hpp\n"
         "\ntarget loss, when --target-loss is not given: the median over the reported seeds "
         "of the loss vanilla reaches at its last round, so rounds to target asks how fast "
         "each method reaches what vanilla reaches in the budget.\n"
         "learning rates: unless --lr-grid none, each method tries lr x each grid entry (N x "
         "lr for vanilla_nlr) on tuning seeds 1000, 1001, ... (never reported) and keeps the "
         "fewest median rounds to target, then the lowest median final loss. With "
         "--lr-from-vanilla (preset lr_transfer) only vanilla is tuned, and every other "
         "method runs at vanilla's chosen lr (N x it for vanilla_nlr).\n"
         "loss: the noise-free loss at the committed iterate after each round, evaluated "
         "outside the gradient budget.\n";
}

}  // namespace

std::variant<CommandLine, int> parse_command_line(int argc, char** argv) {
  CLI::App app{
      "optex-bench: OptEx against what else N workers could do (vanilla with tuned or N x "
      "learning rate, N x minibatch, parallel line search, the sequential target), on the "
      "shipped test problems, over seeds",
      "optex-bench"};
  app.footer(footer());
  // Every flag shows its default in the help; the preset supplies the rest (see below).
  app.option_defaults()->always_capture_default();
  RawFlags raw;
  CommandLine cl;
  app.add_option("--preset", raw.preset,
                 "the default of every flag not given: default, paper, scaling, ablation, "
                 "suite, illcond, noisy_quadratic, lr_transfer or ci")
      ->type_name("NAME");
  app.add_option("--problem", raw.problems,
                 "problems, comma-separated: sphere, rosenbrock, ackley, rastrigin, levy, "
                 "griewank, styblinski_tang, schwefel, each also as rotated_<name>; the rotated "
                 "ellipsoids ellipsoid_1e2, ellipsoid_1e4, ellipsoid_1e6 (condition number); "
                 "noisy_quadratic (h_i = 1/i, gradient noise N(0, h_i) of its own)")
      ->type_name("LIST");
  app.add_option("--dim", raw.dim, "dimension d (rotated problems and ellipsoids: d <= 4096)")
      ->type_name("INT");
  app.add_option("--parallelism", raw.parallelism, "N, comma-separated list")->type_name("LIST");
  app.add_option("--iterations", raw.iterations, "sequential rounds per run")->type_name("INT");
  app.add_option("--optimizer", raw.optimizer,
                 "base optimizer, with its defaults but --lr: " + optex::optimizer_names())
      ->type_name("NAME");
  app.add_option("--lr", raw.lr, "base learning rate (the centre of the lr grid)")
      ->type_name("FLOAT");
  app.add_option("--seeds", raw.seeds, "reported seeds 0, 1, ..., this - 1")->type_name("INT");
  app.add_option("--tuning-seeds", raw.tuning_seeds,
                 "lr tuning seeds 1000, 1001, ... (never reported)")
      ->type_name("INT");
  app.add_option("--noise", raw.noise, "std of Gaussian noise on every gradient coordinate")
      ->type_name("FLOAT");
  app.add_flag("--rotated", raw.rotated,
               "rotate every problem by a seeded orthogonal matrix (O(d^2) per evaluation)");
  app.add_option("--clip", raw.clip, "gradient-norm clip on every problem (0 = none)")
      ->type_name("FLOAT");
  app.add_option("--target-loss", raw.target_loss,
                 "target loss (default: vanilla's median final loss, see below)")
      ->type_name("FLOAT");
  app.add_option("--methods", raw.methods,
                 "methods to compare, comma-separated (vanilla always runs)")
      ->type_name("LIST");
  app.add_option("--lr-grid", raw.lr_grid,
                 "lr multiples tried on the tuning seeds, comma-separated, or none")
      ->type_name("LIST");
  app.add_flag(
      "--lr-from-vanilla", raw.lr_from_vanilla,
      "tune vanilla only; every other method runs at vanilla's lr (N x it for vanilla_nlr)");
  app.add_option("--json", cl.json_path, "write records and summary as JSON (optex-bench/1)")
      ->type_name("FILE");
  app.add_option("--markdown", cl.markdown_path, "write the summary as a Markdown table")
      ->type_name("FILE");
  app.add_flag("--quiet", cl.quiet, "no progress bar on stderr, no summary table on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a flag refused by CLI11: 2, as below
  }
  try {
    cl.settings = resolve(app, raw);
  } catch (const std::invalid_argument& e) {
    std::cerr << "optex-bench: error: " << e.what() << "\n";
    return 2;
  }
  return cl;
}

}  // namespace optex_bench
