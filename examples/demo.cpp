// The demo: OptEx against plain Adam, and against the best other use of the same N
// workers, on every shipped SFU test problem.
//
// For each problem, plain Adam runs N * R iterations (the gradient budget of
// R OptEx rounds). The common target is 99.9% of the decrease plain Adam
// achieves in that budget. Each method's "rounds" is the first sequential
// round whose loss (at the last point it evaluated, or the best for the line
// search and a commit from the best loss) is at or below the target, median over
// seeds. Every method may use up to N * R rounds, so one that never gets there is
// shown as "-".
//
// Each OptEx column gets two ratios (speedup.hpp): "vs Adam" = Adam's rounds / its
// rounds, and "vs best" = the best baseline's rounds / its rounds, the honest one:
// below 1 it is printed as a loss ("0.62x loss").
//
// The same-budget baselines spend at most N gradient evaluations per round, as
// optex-bench's methods of the same names (bench/optex_bench/methods.hpp):
//   N x lr      Adam with N times the learning rate (vanilla_nlr), one evaluation
//   N x batch   one Adam step with the mean of N gradients at the iterate
//               (data_parallel); without noise it is plain Adam
//   line search N step sizes 2^k x Adam's update, the best loss kept (line_search)
// The best baseline is the one with the fewest median rounds, per problem.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optex/optex.hpp>
#include <string>
#include <vector>

#include "speedup.hpp"

namespace {

using optex_demo::kNever;
using optex_demo::speedup_text;
using optex_demo::Verdict;

using LossFn = std::function<double(std::span<const float>, std::span<float>)>;

// The gradient noise of the Adam and OptEx columns; minibatch k of L draws from
// minibatch_seed(kNoiseSeed, k, L).
constexpr std::uint64_t kNoiseSeed = 11;

struct Problem {
  std::string name;
  // The objective whose gradient noise (if any) is drawn from a seed.
  std::function<LossFn(std::uint64_t noise_seed)> with_noise_seed;

  // Minibatch k of L at one point: independent noise for each k.
  LossFn minibatch(int k, int count) const {
    return with_noise_seed(optex::minibatch_seed(kNoiseSeed, k, count));
  }
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
LossFn erase(P p) {
  return [p = std::move(p)](std::span<const float> x, std::span<float> g) {
    return p.EvaluateWithGradient(x, g);
  };
}

template <class P>
Problem with_noise(P p, std::string name, double noise) {
  namespace pr = optex::problems;
  return {std::move(name), [p, noise](std::uint64_t seed) {
            return noise > 0.0 ? erase(pr::WithGradientNoise(p, noise, seed)) : erase(p);
          }};
}

template <class P>
Problem make(P p, const Variant& v) {
  namespace pr = optex::problems;
  if (v.rotated) {
    pr::Rotated<P> r(p, v.dim, 7);
    std::string name(r.name());
    return with_noise(r, name, v.noise);
  }
  return with_noise(p, std::string(p.name()), v.noise);
}

// Evaluates a batch: the k-th of L consecutive rows at one point (a point's several
// evaluations, or proxy points that coincide) draws minibatch k of L, so they are
// independent; a row at a point of its own draws the columns' usual noise.
void evaluate(const Problem& p, optex::Batch& b) {
  const int n = b.size();
  int start = 0;
  while (start < n) {
    int end = start + 1;
    while (end < n && std::memcmp(b.point(end).data(), b.point(start).data(),
                                  b.point(start).size_bytes()) == 0) {
      ++end;
    }
    const int count = end - start;
    for (int i = start; i < end; ++i) {
      b.loss(i) = p.minibatch(i - start, count)(b.point(i), b.grad(i));
    }
    start = end;
  }
}

// Loss of every round (at the point the commit stepped from), for `rounds` rounds.
std::vector<double> trajectory(const Problem& p, const std::vector<float>& x0, optex::Options o,
                               double lr, long rounds) {
  optex::Engine engine(x0, optex::Adam{.lr = lr}, o);
  std::vector<double> losses;
  for (long t = 0; t < rounds; ++t) {
    optex::Batch& b = engine.ask();
    evaluate(p, b);
    losses.push_back(engine.tell(b).loss);
  }
  return losses;
}

// N x minibatch: one Adam step per round with the mean of N gradients at the
// iterate (summed in double, so N equal gradients give that gradient exactly).
std::vector<double> data_parallel(const Problem& p, std::vector<float> x, double lr, int n,
                                  long rounds) {
  const optex::Adam adam{.lr = lr};
  optex::OptimizerState state = optex::init_state(adam, x.size());
  std::vector<LossFn> minibatches;
  for (int k = 0; k < n; ++k) minibatches.push_back(p.minibatch(k, n));
  std::vector<float> g(x.size()), mean(x.size());
  std::vector<double> sum(x.size());
  std::vector<double> losses;
  for (long t = 0; t < rounds; ++t) {
    std::fill(sum.begin(), sum.end(), 0.0);
    double loss = 0.0;
    for (const LossFn& f : minibatches) {
      loss = f(x, g);  // the loss is exact: the same for every minibatch
      for (std::size_t j = 0; j < x.size(); ++j) sum[j] += g[j];
    }
    for (std::size_t j = 0; j < x.size(); ++j) mean[j] = static_cast<float>(sum[j] / n);
    losses.push_back(loss);
    optex::apply_step(adam, x, state, mean);
  }
  return losses;
}

// Parallel line search: N step sizes 2^k x one Adam update (k centred on 0); the
// best loss wins, its gradient drives the next round, the state advances once a
// round. Round 1 also evaluates the gradient at the start (one evaluation more).
std::vector<double> line_search(const Problem& p, std::vector<float> x, double lr, int n,
                                long rounds) {
  const optex::Adam adam{.lr = lr};
  const LossFn f = p.minibatch(0, 1);
  const std::size_t d = x.size();
  optex::OptimizerState state = optex::init_state(adam, d);
  std::vector<float> g(d), stepped(d), candidate(d), candidate_g(d), best(d), best_g(d);
  f(x, g);
  std::vector<double> losses;
  const int lowest_power = -(n - 1) / 2;
  for (long t = 0; t < rounds; ++t) {
    stepped = x;
    optex::OptimizerState next_state = state;
    optex::apply_step(adam, stepped, next_state, g);
    double best_loss = std::numeric_limits<double>::infinity();
    for (int k = 0; k < n; ++k) {
      const float factor = std::ldexp(1.0f, lowest_power + k);
      for (std::size_t j = 0; j < d; ++j) candidate[j] = x[j] + factor * (stepped[j] - x[j]);
      const double loss = f(candidate, candidate_g);
      if (loss < best_loss) {
        best_loss = loss;
        std::swap(best, candidate);
        std::swap(best_g, candidate_g);
      }
    }
    if (!std::isfinite(best_loss)) break;  // every candidate diverged: never reaches
    std::swap(x, best);
    std::swap(g, best_g);
    state = std::move(next_state);
    losses.push_back(best_loss);
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

// Rounds as text; "-" where the method never reached the target.
std::string rounds_text(double value) {
  return value >= kNever ? std::string("-") : std::to_string(static_cast<long>(value));
}

// One OptEx variant's record against the best baseline, over the problems.
struct Tally {
  const char* name;
  std::array<int, 4> counts{};  // indexed by Verdict
  void add(Verdict v) { ++counts[static_cast<std::size_t>(v)]; }
  int of(Verdict v) const { return counts[static_cast<std::size_t>(v)]; }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "optex_demo: OptEx against plain Adam and the best same-budget baseline on the eight "
      "SFU test problems.\n\n"
      "For each problem and seed, plain Adam runs N * R iterations; the target is 99.9% of the "
      "loss decrease it reaches. OptEx (reference, default and adaptive settings, N points per "
      "round) and three baselines that also spend N gradients per round (Adam with N x lr, "
      "Adam on the mean of N minibatch gradients, a parallel line search over N step sizes) "
      "race to that target. The table gives each method's median sequential rounds, and each "
      "OptEx column's ratio against Adam and against the best baseline (below 1: a loss).\n",
      "optex_demo"};
  app.footer("\n--flag TYPE=VALUE: VALUE is the default; --rotated is off by default.");
  // Every option shows its default in the help ("--dim UINT:POSITIVE=10000").
  app.option_defaults()->always_capture_default();
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help: the help and 0; anything else: CLI11's message and 2, as optex-plan.
    return app.exit(e) == 0 ? 0 : 2;
  }

  namespace pr = optex::problems;
  variant.dim = dim;
  const Variant& v = variant;
  const std::vector<Problem> problems = {make(pr::Sphere{}, v),         make(pr::Rosenbrock{}, v),
                                         make(pr::Ackley{}, v),         make(pr::Rastrigin{}, v),
                                         make(pr::Levy{}, v),           make(pr::Griewank{}, v),
                                         make(pr::StyblinskiTang{}, v), make(pr::Schwefel{}, v)};
  optex::Options plain;
  plain.parallelism = 1;
  const optex::Options reference = optex::Options::reference(parallelism);
  optex::Options defaults;
  defaults.parallelism = parallelism;
  const optex::Options adaptive = optex::Options::adaptive(parallelism);
  const long budget = parallelism * rounds;

  std::printf("optex %s demo: d = %zu, N = %d, Adam lr %g, start U(-1, 1), %d seeds (medians)%s",
              OPTEX_VERSION_STRING, dim, parallelism, lr, seeds,
              variant.rotated ? ", rotated" : "");
  if (variant.noise > 0.0) std::printf(", gradient noise std %g", variant.noise);
  std::printf("\n");
  std::printf("target: 99.9%% of the loss decrease plain Adam reaches in %ld iterations\n", budget);
  std::printf(
      "best baseline: the fewest rounds among Adam with N x lr, N x minibatch (N x batch) and "
      "a parallel line search\n\n");
  std::printf("%-24s %12s %8s %20s %28s %28s %28s\n", "problem", "target", "Adam", "best baseline",
              "OptEx reference", "OptEx default", "OptEx adaptive");
  std::printf("%-24s %12s %8s %-12s %7s", "", "", "rounds", " method", "rounds");
  for (int k = 0; k < 3; ++k) std::printf(" %7s %8s %11s", "rounds", "vs Adam", "vs best");
  std::printf("\n");
  std::array<Tally, 3> tallies = {Tally{"reference"}, Tally{"default"}, Tally{"adaptive"}};
  for (const Problem& p : problems) {
    constexpr std::array<const char*, 3> kBaselines = {"N x lr", "N x batch", "line search"};
    std::vector<double> targets, adam;
    std::array<std::vector<double>, 3> optex_rounds;  // reference, default, adaptive
    std::array<std::vector<double>, 3> baselines;
    const LossFn f = p.minibatch(0, 1);
    for (int s = 0; s < seeds; ++s) {
      const auto x0 = pr::uniform_start(dim, -1.0, 1.0, static_cast<std::uint64_t>(s));
      std::vector<float> g(dim);
      const double f0 = f(x0, g);
      const auto adam_losses = trajectory(p, x0, plain, lr, budget);
      const double best = *std::min_element(adam_losses.begin(), adam_losses.end());
      const double target = best + 1e-3 * (f0 - best);
      const auto rounds_of = [&](const std::vector<double>& losses) {
        const long r = rounds_to(losses, target);
        return r == 0 ? kNever : static_cast<double>(r);
      };
      targets.push_back(target);
      adam.push_back(rounds_of(adam_losses));
      optex_rounds[0].push_back(rounds_of(trajectory(p, x0, reference, lr, budget)));
      optex_rounds[1].push_back(rounds_of(trajectory(p, x0, defaults, lr, budget)));
      optex_rounds[2].push_back(rounds_of(trajectory(p, x0, adaptive, lr, budget)));
      baselines[0].push_back(rounds_of(trajectory(p, x0, plain, parallelism * lr, budget)));
      baselines[1].push_back(rounds_of(data_parallel(p, x0, lr, parallelism, budget)));
      baselines[2].push_back(rounds_of(line_search(p, x0, lr, parallelism, budget)));
    }
    const double a = median(adam);
    std::size_t best_baseline = 0;
    for (std::size_t k = 1; k < baselines.size(); ++k) {
      if (median(baselines[k]) < median(baselines[best_baseline])) best_baseline = k;
    }
    const double b = median(baselines[best_baseline]);
    const std::string baseline = std::string(" ") + (b >= kNever ? "-" : kBaselines[best_baseline]);
    std::printf("%-24s %12.4g %8s %-12s %7s", p.name.c_str(), median(targets),
                rounds_text(a).c_str(), baseline.c_str(), rounds_text(b).c_str());
    for (std::size_t k = 0; k < optex_rounds.size(); ++k) {
      const double o = median(optex_rounds[k]);
      std::printf(" %7s %8s %11s", rounds_text(o).c_str(), speedup_text(a, o).c_str(),
                  speedup_text(b, o).c_str());
      tallies[k].add(optex_demo::verdict(b, o));
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf(
      "\nvs best: the best baseline's rounds / OptEx's; \"loss\" where OptEx needs more "
      "rounds than it (or never reaches the target)\n");
  for (const Tally& t : tallies) {
    std::printf(
        "OptEx %-9s vs the best baseline: faster on %d, tied on %d, slower on %d of %zu "
        "problems",
        t.name, t.of(Verdict::win), t.of(Verdict::tie), t.of(Verdict::loss), problems.size());
    if (t.of(Verdict::neither) > 0) {
      std::printf(" (%d where neither reached the target)", t.of(Verdict::neither));
    }
    std::printf("\n");
  }
  return 0;
}
