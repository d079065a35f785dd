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

// How the shipped problems are presented: optionally rotated by a seeded
// orthogonal matrix (so separability cannot help) and with seeded Gaussian
// gradient noise (as a stochastic gradient would have).
struct Variant {
  bool rotated = false;
  double noise = 0.0;
  std::size_t dim = 0;
};

template <class P>
Problem erase(P p, std::string name) {
  return {std::move(name), [p = std::move(p)](std::span<const float> x, std::span<float> g) {
            return p.EvaluateWithGradient(x, g);
          }};
}

template <class P>
Problem make(P p, const Variant& v) {
  namespace pr = optex::problems;
  if (v.rotated) {
    pr::Rotated<P> r(p, v.dim, 7);
    std::string name(r.name());
    if (v.noise > 0.0) return erase(pr::WithGradientNoise(r, v.noise, 11), name);
    return erase(r, name);
  }
  if (v.noise > 0.0) return erase(pr::WithGradientNoise(p, v.noise, 11), std::string(p.name()));
  return erase(p, std::string(p.name()));
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
  Variant variant;
  app.add_option("--dim", dim, "problem dimension d")->check(CLI::PositiveNumber);
  app.add_option("--parallelism", parallelism, "N: points per OptEx round")
      ->check(CLI::Range(2, 64));
  app.add_option("--rounds", rounds, "R: Adam gets N * R iterations, and sets the target")
      ->check(CLI::PositiveNumber);
  app.add_option("--seeds", seeds, "start points U(-1, 1)^d per problem")
      ->check(CLI::Range(1, 100));
  app.add_option("--lr", lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_flag("--rotated", variant.rotated,
               "rotate every problem by a seeded orthogonal matrix (d <= 4096; O(d^3) set-up)");
  app.add_option("--noise", variant.noise, "std of Gaussian noise added to every gradient")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  namespace pr = optex::problems;
  variant.dim = dim;
  const Variant& v = variant;
  const std::vector<Problem> problems = {make(pr::Sphere{}, v),         make(pr::Rosenbrock{}, v),
                                         make(pr::Ackley{}, v),         make(pr::Rastrigin{}, v),
                                         make(pr::Levy{}, v),           make(pr::Griewank{}, v),
                                         make(pr::StyblinskiTang{}, v), make(pr::Schwefel{}, v)};
  optex::Options plain;
  plain.parallelism = 1;
  optex::Options reference = optex::Options::reference(parallelism);
  optex::Options defaults;
  defaults.parallelism = parallelism;
  const long budget = parallelism * rounds;

  std::printf("optex %s demo: d = %zu, N = %d, Adam lr %g, start U(-1, 1), %d seeds (medians)%s",
              OPTEX_VERSION_STRING, dim, parallelism, lr, seeds,
              variant.rotated ? ", rotated" : "");
  if (variant.noise > 0.0) std::printf(", gradient noise std %g", variant.noise);
  std::printf("\n");
  std::printf("target: 99.9%% of the loss decrease plain Adam reaches in %ld iterations\n\n",
              budget);
  std::printf("%-24s %12s %8s %18s %18s\n", "problem", "target", "Adam", "OptEx reference",
              "OptEx default");
  std::printf("%-24s %12s %8s %9s %8s %9s %8s\n", "", "", "rounds", "rounds", "speedup", "rounds",
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
    // Rounds and speedup as text; "-" where the method never reached the target.
    auto rounds_text = [](double value) {
      return value >= 1e9 ? std::string("-") : std::to_string(static_cast<long>(value));
    };
    auto speedup_text = [](double adam_rounds, double value) {
      if (value >= 1e9 || adam_rounds >= 1e9) return std::string("-");
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2fx", adam_rounds / value);
      return std::string(buf);
    };
    std::printf("%-24s %12.4g %8s %9s %8s %9s %8s\n", p.name.c_str(), median(targets),
                rounds_text(a).c_str(), rounds_text(r).c_str(), speedup_text(a, r).c_str(),
                rounds_text(d).c_str(), speedup_text(a, d).c_str());
    std::fflush(stdout);
  }
  return 0;
}
