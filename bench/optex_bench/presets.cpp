#include "presets.hpp"

#include <stdexcept>

#include "problem_factory.hpp"

namespace optex_bench {

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"default",         "paper",       "scaling",
                                                 "ablation",        "suite",       "illcond",
                                                 "noisy_quadratic", "lr_transfer", "ci"};
  return names;
}

std::string preset_help() {
  return "presets (explicit flags override them):\n"
         "  default   sphere, d 1000, N 4, 50 rounds, Adam lr 0.01, 5 seeds, lr grid\n"
         "  paper     the OptEx paper: sphere, rosenbrock, ackley at d 1e5, Adam lr 0.01,\n"
         "            start U(-1, 1), 40 rounds, N 5, 5 seeds, clip 100 on rosenbrock,\n"
         "            no lr tuning\n"
         "  scaling   N in 1, 2, 4, 8, 16, SGD with gradient noise 1, d 1000: is the\n"
         "            speedup near sqrt(N)?\n"
         "  ablation  optex_default varied over history T0, lengthscale, kernel, continue,\n"
         "            evaluations and the safeguards; optex_adaptive with a fixed split\n"
         "  suite     the eight SFU problems, plain and rotated, d 500\n"
         "  illcond   the rotated ellipsoids with condition number 1e2, 1e4, 1e6, d 200,\n"
         "            N 4, Adam lr 0.01, 60 rounds, 5 seeds, lr grid\n"
         "  noisy_quadratic\n"
         "            the noisy quadratic model, d 200, N 4 and 16, SGD lr 0.5, 60 rounds,\n"
         "            5 seeds, lr grid: where do N evaluations buy more than N x minibatch?\n"
         "  lr_transfer\n"
         "            sphere, rosenbrock, the three ellipsoids, noisy_quadratic, d 200, N 4,\n"
         "            Adam lr 0.01, 60 rounds, 5 seeds: only vanilla is tuned, every other\n"
         "            method runs at vanilla's lr (vanilla_nlr at N x it)\n"
         "  ci        a few seconds: d 50, 12 rounds, 3 seeds, N 4, sphere and rosenbrock\n";
}

Settings preset_settings(std::string_view name) {
  Settings s;
  s.preset = std::string(name);
  if (name == "default") return s;
  if (name == "paper") {
    // The OptEx paper's synthetic experiments (Shu et al. 2024, section 6.1).
    s.problems = {"sphere", "rosenbrock", "ackley"};
    s.dim = 100000;
    s.parallelism = {5};
    s.iterations = 40;
    s.optimizer = "adam";
    s.lr = 0.01;
    s.lr_grid = {};
    s.seeds = 5;
    s.clip_by_problem = {{"rosenbrock", 100.0}};
    return s;
  }
  if (name == "scaling") {
    // Noisy gradients are where N x minibatch helps, and where OptEx claims sqrt(N).
    // Noise std 1 per coordinate against gradients of order 1: SGD is noise-limited.
    s.problems = {"sphere", "styblinski_tang", "rosenbrock"};
    s.dim = 1000;
    s.parallelism = {1, 2, 4, 8, 16};
    s.iterations = 60;
    s.optimizer = "sgd";
    s.lr = 0.01;
    s.seeds = 5;
    s.noise = 1.0;
    // Plain SGD on Rosenbrock from U(-1, 1) diverges at these learning rates.
    s.clip_by_problem = {{"rosenbrock", 100.0}};
    return s;
  }
  if (name == "ablation") {
    // Fixed lengthscales are raw distances (no input scaling): one Adam step at
    // lr 0.01 moves about lr sqrt(d) = 1 at d = 1e4.
    s.problems = {"sphere", "rosenbrock", "ackley"};
    s.dim = 10000;
    s.parallelism = {4};
    s.iterations = 40;
    s.lr_grid = {0.3, 1.0, 3.0};
    s.seeds = 5;
    s.methods = {
        "vanilla",
        "vanilla_nlr",
        "line_search",
        "target",
        "optex_reference",
        "optex_default",
        "optex_default[history=8]",
        "optex_default[history=16]",
        "optex_default[history=64]",
        "optex_default[lengthscale=0.3]",
        "optex_default[lengthscale=1]",
        "optex_default[lengthscale=3]",
        "optex_default[lengthscale=10]",
        "optex_default[lengthscale=30]",
        "optex_default[lengthscale=ml]",
        "optex_default[kernel=matern12]",
        "optex_default[kernel=matern32]",
        "optex_default[kernel=rbf]",
        // The parts of the adaptive configuration, one at a time, and the
        // adaptive split's own share of it.
        "optex_adaptive",
        "optex_default[continue=best]",
        "optex_default[evaluations=2]",
        "optex_default[variance=0.5]",
        "optex_default[trust=2]",
        "optex_default[lengthscale_change=10]",
        "optex_adaptive[strategy=fixed]",
    };
    return s;
  }
  if (name == "suite") {
    // Rotation costs O(d^2) per evaluation: d 500 keeps the whole suite in minutes.
    s.problems.clear();
    for (const std::string& p : sfu_problem_names()) s.problems.push_back(p);
    for (const std::string& p : sfu_problem_names()) s.problems.push_back("rotated_" + p);
    s.dim = 500;
    s.parallelism = {4};
    s.iterations = 50;
    s.seeds = 5;
    return s;
  }
  if (name == "illcond") {
    // Rotated, so Adam's per-coordinate scaling cannot undo the conditioning; d 200
    // keeps the O(d^2) rotation cheap.
    s.problems = {"ellipsoid_1e2", "ellipsoid_1e4", "ellipsoid_1e6"};
    s.dim = 200;
    s.parallelism = {4};
    s.iterations = 60;
    s.seeds = 5;
    return s;
  }
  if (name == "noisy_quadratic") {
    // The batch-size model: plain SGD, where N x minibatch is the natural use of N
    // workers. lr 0.5 is a quarter of the stability limit 2 / max h_i.
    s.problems = {"noisy_quadratic"};
    s.dim = 200;
    s.parallelism = {4, 16};
    s.iterations = 60;
    s.optimizer = "sgd";
    s.lr = 0.5;
    s.seeds = 5;
    return s;
  }
  if (name == "lr_transfer") {
    // The learning rate a practitioner has is the one tuned for the sequential run.
    s.problems = {"sphere",        "rosenbrock",    "ellipsoid_1e2",
                  "ellipsoid_1e4", "ellipsoid_1e6", "noisy_quadratic"};
    s.dim = 200;
    s.parallelism = {4};
    s.iterations = 60;
    s.seeds = 5;
    s.lr_from_vanilla = true;
    return s;
  }
  if (name == "ci") {
    s.problems = {"sphere", "rosenbrock"};
    s.dim = 50;
    s.parallelism = {4};
    s.iterations = 12;
    s.lr_grid = {0.3, 1.0, 3.0};
    s.seeds = 3;
    s.tuning_seeds = 1;
    return s;
  }
  std::string known;
  for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace optex_bench
