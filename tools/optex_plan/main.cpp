// optex-plan: will OptEx pay off on this machine? It measures a round's
// overhead for a few N and T0, each --repetitions times, and prints
// optex::format_plan (plan.hpp): medians, spreads and a recommendation that
// says when it is uncertain.
//
//   optex-plan --dim 1000000 --parallelism 8 --history 32 --gradient-seconds 0.05
//   optex-plan --dim 100000 --parallelism 4 --problem rastrigin
//
// Exit status: 0 with a plan, 2 for a bad flag (before anything is measured),
// 1 when a measurement fails (out of memory, say).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <optex/planning/plan.hpp>
#include <optex/planning/spread.hpp>
#include <optex/problems/problems.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "command_line.hpp"

namespace {

namespace pr = optex::problems;

using Gradient = std::function<double(std::span<const float>, std::span<float>)>;

// The problem's gradient and its standard start at d (the problem may refuse d).
template <class P>
std::pair<Gradient, std::vector<float>> bind(const P& problem, std::size_t d) {
  return {[problem](std::span<const float> x, std::span<float> g) {
            return problem.EvaluateWithGradient(x, g);
          },
          problem.standard_start(d)};
}

std::pair<Gradient, std::vector<float>> make_problem(const std::string& name, std::size_t d) {
  if (name == "sphere") return bind(pr::Sphere(), d);
  if (name == "rosenbrock") return bind(pr::Rosenbrock(), d);
  if (name == "ackley") return bind(pr::Ackley(), d);
  if (name == "rastrigin") return bind(pr::Rastrigin(), d);
  if (name == "levy") return bind(pr::Levy(), d);
  if (name == "griewank") return bind(pr::Griewank(), d);
  if (name == "styblinski_tang") return bind(pr::StyblinskiTang(), d);
  if (name == "schwefel") return bind(pr::Schwefel(), d);
  throw std::invalid_argument("--problem: unknown problem '" + name + "'");
}

// `calls` gradient evaluations at the standard start, after one untimed.
optex::Spread time_gradient(const Gradient& gradient, std::span<const float> x, int calls) {
  std::vector<float> g(x.size());
  volatile double sink = gradient(x, g);
  std::vector<double> times;
  for (int i = 0; i < calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    sink = gradient(x, g);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  (void)sink;
  return optex::spread_of(std::move(times));
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = optex_plan::parse_command_line(argc, argv);
  if (const int* status = std::get_if<int>(&parsed)) return *status;
  optex_plan::CommandLine cl = std::get<optex_plan::CommandLine>(parsed);

  std::pair<Gradient, std::vector<float>> problem;
  if (!cl.problem.empty()) {
    try {
      problem = make_problem(cl.problem, cl.request.dim);
    } catch (const std::invalid_argument& e) {
      std::cerr << "optex-plan: error: --dim: " << cl.request.dim << " does not suit --problem "
                << cl.problem << " (" << e.what() << ")\n";
      return 2;
    }
  }
  try {
    if (!cl.problem.empty()) {
      const optex::Spread gradient =
          time_gradient(problem.first, problem.second, cl.request.repetitions);
      problem = {};
      // A clock that did not advance still leaves a time the planner accepts.
      cl.request.gradient_seconds = std::max(gradient.median, 1e-9);
      std::printf("gradient of %s at d = %zu: %.6g s, IQR [%.6g, %.6g] s (%d calls)\n",
                  cl.problem.c_str(), cl.request.dim, cl.request.gradient_seconds,
                  gradient.low_quartile, gradient.high_quartile, gradient.count);
    }
    const optex::Plan plan = optex::plan(cl.request);
    std::cout << optex::format_plan(plan);
  } catch (const std::exception& e) {
    std::cerr << "optex-plan: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
