#include "command_line.hpp"

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../flag_values.hpp"
#include "optex/backend/block_pool.hpp"
#include "optex/backend/device.hpp"
#include "optex/engine/options.hpp"

namespace optex_plan {
namespace {

constexpr const char* kProblems[] = {"sphere", "rosenbrock", "ackley",          "rastrigin",
                                     "levy",   "griewank",   "styblinski_tang", "schwefel"};

using optex::flags::parse_integer;
using optex::flags::reject;

// All of the text as a number ("1e5" and "100000" alike), or a refusal.
double parse_real(std::string_view flag, const std::string& text) {
  const std::optional<double> v = optex::flags::whole_number(text);
  if (!v) reject(flag, text, "must be a number");
  return *v;
}

optex::Device parse_device(const std::string& text) {
  optex::Device device;
  if (text == "cpu") {
    return device;
  } else if (text == "cuda") {
    device = optex::Device::cuda(0);
  } else if (text.starts_with("cuda:")) {
    const std::string_view digits = std::string_view(text).substr(5);
    int index = -1;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (error != std::errc() || end != digits.data() + digits.size() || digits.empty() ||
        index < 0) {
      reject("--device", text, "must be cpu, cuda or cuda:<index>");
    }
    device = optex::Device::cuda(index);
  } else {
    reject("--device", text, "must be cpu, cuda or cuda:<index>");
  }
  if (!optex::built_with_cuda()) reject("--device", text, "needs a build with the CUDA backend");
  const int count = optex::cuda_device_count();
  if (device.index >= count) {
    reject("--device", text, "is not on this machine (" + std::to_string(count) + " CUDA devices)");
  }
  return device;
}

// The library's memory check (optex::check_plan_memory), its refusal worded
// for the flag.
void check_memory(const optex::PlanRequest& r) {
  try {
    optex::check_plan_memory(r);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--") + e.what());
  }
}

struct RawFlags {
  std::string dim, parallelism = "4", history = "32", device = "cpu", threads = "0",
                   efficiency = "0.5", gradient_noise, gradient_seconds, problem, repetitions = "5";
};

CommandLine resolve(const CLI::App& app, const RawFlags& raw) {
  const auto given = [&app](const char* flag) { return app.count(flag) > 0; };
  CommandLine cl;
  optex::PlanRequest& r = cl.request;
  if (given("--gradient-seconds") == given("--problem")) {
    throw std::invalid_argument(
        "give exactly one of --gradient-seconds (one gradient evaluation, measured by you) and "
        "--problem (a shipped problem to time)");
  }
  r.dim = static_cast<std::size_t>(parse_integer("--dim", raw.dim, 1, 1LL << 50));
  r.max_parallelism =
      static_cast<int>(parse_integer("--parallelism", raw.parallelism, 1, optex::kMaxParallelism));
  r.history = static_cast<int>(parse_integer("--history", raw.history, 1, optex::kMaxHistory));
  r.threads = static_cast<int>(parse_integer("--threads", raw.threads, 0, optex::kMaxThreads));
  r.repetitions = static_cast<int>(parse_integer("--repetitions", raw.repetitions,
                                                 optex::kMinRepetitions, optex::kMaxRepetitions));
  r.efficiency = parse_real("--efficiency", raw.efficiency);
  if (!(r.efficiency > 0.0 && r.efficiency <= 1.0)) {
    reject("--efficiency", raw.efficiency, "must be in (0, 1]");
  }
  if (given("--gradient-noise")) {
    r.gradient_noise = parse_real("--gradient-noise", raw.gradient_noise);
    if (!(r.gradient_noise >= 0.0) || !std::isfinite(r.gradient_noise)) {
      reject("--gradient-noise", raw.gradient_noise, "must be a finite number >= 0");
    }
  }
  if (given("--gradient-seconds")) {
    const double g = parse_real("--gradient-seconds", raw.gradient_seconds);
    if (!(g > 0.0) || !std::isfinite(g)) {
      reject("--gradient-seconds", raw.gradient_seconds, "must be a finite number > 0");
    }
    cl.gradient_seconds = g;
    r.gradient_seconds = g;
  } else {
    bool known = false;
    for (const char* name : kProblems) known = known || raw.problem == name;
    if (!known) reject("--problem", raw.problem, "must be one of " + problem_names());
    cl.problem = raw.problem;
    r.gradient_seconds = 1.0;  // replaced by the problem's measured time
  }
  r.device = parse_device(raw.device);
  check_memory(r);
  r.validate();
  return cl;
}

}  // namespace

std::string problem_names() {
  std::string names;
  for (const char* name : kProblems) names += (names.empty() ? "" : ", ") + std::string(name);
  return names;
}

std::variant<CommandLine, int> parse_command_line(int argc, char** argv) {
  CLI::App app{
      "optex-plan: will OptEx pay off on this machine? For a problem of dimension --dim and "
      "a gradient evaluation of the given cost (--gradient-seconds, or --problem to time a "
      "shipped one), it measures a round's overhead (ask() + tell()) for a few N up to "
      "--parallelism and T0 up to --history, and one plain optimizer step, each "
      "--repetitions times round-robin, and prints every candidate's median and interquartile "
      "range, its break-even gradient time and a recommendation: the plain optimizer, "
      "averaging (N x minibatch) or OptEx with N, D and T0. Where the gradient time lies "
      "within the measured spread it says \"uncertain\" and keeps the simpler choice. It "
      "measures only the overhead: it assumes how many steps a round advances (--efficiency) "
      "and cannot rank OptEx against the other uses of N workers (N x lr, N x minibatch, "
      "parallel line search; see docs/RESULTS.md). Nothing is measured for --help or a bad "
      "flag (exit status 2). DESIGN.md section 4, \"The planner\".",
      "optex-plan"};
  app.footer(
      "\nThe model: a round of P = N / D points advances 1 + e (P - 1) sequential steps and "
      "takes gradient + overhead; the plain optimizer takes gradient + one plain step per "
      "step. e (--efficiency) is an assumption: measure it on your problem (sequential "
      "iterations to a loss against OptEx rounds to it); on the committed benchmarks it was "
      "0.5 on median.\n");
  RawFlags raw;
  app.add_option("--dim", raw.dim, "dimension d")->type_name("INT")->required();
  app.add_option("--parallelism", raw.parallelism, "the most evaluations per round, N")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--history", raw.history, "T0, the history you would run with")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--device", raw.device, "cpu, cuda or cuda:<index>")
      ->type_name("DEVICE")
      ->capture_default_str();
  app.add_option("--threads", raw.threads, "Options::threads; 0: every core")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--efficiency", raw.efficiency,
                 "e in (0, 1]: a round of P points advances 1 + e (P - 1) steps (assumed)")
      ->type_name("FLOAT")
      ->capture_default_str();
  app.add_option("--gradient-noise", raw.gradient_noise,
                 "rho = noise variance / squared gradient norm of one evaluation")
      ->type_name("FLOAT")
      ->default_str("unknown");
  app.add_option("--repetitions", raw.repetitions,
                 "R in [" + std::to_string(optex::kMinRepetitions) + ", " +
                     std::to_string(optex::kMaxRepetitions) +
                     "]: times every quantity is measured; the median and quartiles are "
                     "reported")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--gradient-seconds", raw.gradient_seconds,
                 "seconds of one gradient evaluation, measured by you")
      ->type_name("FLOAT")
      ->default_str("none");
  app.add_option("--problem", raw.problem,
                 "or time one of the shipped problems at --dim: " + problem_names())
      ->type_name("NAME")
      ->default_str("none");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  try {
    return resolve(app, raw);
  } catch (const std::invalid_argument& e) {
    std::cerr << "optex-plan: error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace optex_plan
