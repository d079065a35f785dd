// The demo: OptEx against plain Adam on every shipped test problem.
//
// For each problem, plain Adam runs N * R iterations (the gradient budget of
// R OptEx rounds). The common target is 99.9% of the decrease plain Adam
// achieves in that budget. Each method's "rounds" is the first sequential
// iteration whose loss (at the last point it evaluated) is at or below the
// target, median over seeds; speedup = Adam's rounds / the method's rounds.
// OptEx may use up to N * R rounds as well, so a method that never gets there
// is shown as "-".
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <optex/optex.hpp>
#include <string>
#include <vector>

namespace {

using LossFn = std::function<double(std::span<const float>, std::span<float>)>;

struct Problem {
  std::string name;
  LossFn f;
};

template <class P>
Problem make(P p) {
  return {std::string(p.name()), [p](std::span<const float> x, std::span<float> g) {
            return p.EvaluateWithGradient(x, g);
          }};
}

// Loss of every round (at the last point evaluated), for `rounds` rounds.
std::vector<double> trajectory(const LossFn& f, const std::vector<float>& x0, optex::Options o,
                               double lr, long rounds) {
  optex::Engine engine(x0, optex::Adam{.lr = lr}, o);
  std::vector<double> losses;
  for (long t = 0; t < rounds; ++t) {
    optex::Batch& b = engine.ask();
    for (int i = 0; i < b.size(); ++i) b.loss(i) = f(b.point(i), b.grad(i));
    losses.push_back(engine.tell(b).loss);
  }
  return losses;
}

// First round (1-based) at or below target; 0 when never.
long rounds_to(const std::vector<double>& losses, double target) {
  auto it = std::find_if(losses.begin(), losses.end(), [&](double l) { return l <= target; });
  return it == losses.end() ? 0 : static_cast<long>(it - losses.begin()) + 1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"OptEx against plain Adam on the shipped test problems"};
  std::size_t dim = 10000;
  int parallelism = 5;
  long rounds = 40;
  int seeds = 3;
  double lr = 0.01;
  app.add_option("--dim", dim, "problem dimension d")->check(CLI::PositiveNumber);
  app.add_option("--parallelism", parallelism, "N: points per OptEx round")
      ->check(CLI::Range(2, 64));
  app.add_option("--rounds", rounds, "R: Adam gets N * R iterations, and sets the target")
      ->check(CLI::PositiveNumber);
  app.add_option("--seeds", seeds, "start points U(-1, 1)^d per problem")
      ->check(CLI::Range(1, 100));
  app.add_option("--lr", lr, "Adam learning rate")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  namespace pr = optex::problems;
  const std::vector<Problem> problems = {
      make(pr::Sphere{}), make(pr::Rosenbrock{}), make(pr::Ackley{}),         make(pr::Rastrigin{}),
      make(pr::Levy{}),   make(pr::Griewank{}),   make(pr::StyblinskiTang{}), make(pr::Schwefel{})};
  optex::Options plain;
  plain.parallelism = 1;
  optex::Options reference = optex::Options::reference(parallelism);
  optex::Options defaults;
  defaults.parallelism = parallelism;
  const long budget = parallelism * rounds;

  std::printf("optex %s demo: d = %zu, N = %d, Adam lr %g, start U(-1, 1), %d seeds (medians)\n",
              OPTEX_VERSION_STRING, dim, parallelism, lr, seeds);
  std::printf("target: 99.9%% of the loss decrease plain Adam reaches in %ld iterations\n\n",
              budget);
  std::printf("%-16s %12s %8s %18s %18s\n", "problem", "target", "Adam", "OptEx reference",
              "OptEx default");
  std::printf("%-16s %12s %8s %9s %8s %9s %8s\n", "", "", "rounds", "rounds", "speedup", "rounds",
              "speedup");
  for (const Problem& p : problems) {
    std::vector<double> targets, adam, ref, def;
    for (int s = 0; s < seeds; ++s) {
      const auto x0 = pr::uniform_start(dim, -1.0, 1.0, static_cast<std::uint64_t>(s));
      std::vector<float> g(dim);
      const double f0 = p.f(x0, g);
      const auto adam_losses = trajectory(p.f, x0, plain, lr, budget);
      const double best = *std::min_element(adam_losses.begin(), adam_losses.end());
      const double target = best + 1e-3 * (f0 - best);
      const auto never = [&](long r) { return r == 0 ? 1e9 : static_cast<double>(r); };
      targets.push_back(target);
      adam.push_back(never(rounds_to(adam_losses, target)));
      ref.push_back(never(rounds_to(trajectory(p.f, x0, reference, lr, budget), target)));
      def.push_back(never(rounds_to(trajectory(p.f, x0, defaults, lr, budget), target)));
    }
    const double a = median(adam), r = median(ref), d = median(def);
    auto cell = [](double v, char* buf) {
      if (v >= 1e9)
        std::snprintf(buf, 16, "-");
      else
        std::snprintf(buf, 16, "%.0f", v);
    };
    char ar[16], rr[16], dr[16];
    cell(a, ar);
    cell(r, rr);
    cell(d, dr);
    std::printf("%-16s %12.4g %8s %9s %7.2fx %9s %7.2fx\n", p.name.c_str(), median(targets), ar, rr,
                r < 1e9 ? a / r : 0.0, dr, d < 1e9 ? a / d : 0.0);
    std::fflush(stdout);
  }
  return 0;
}
