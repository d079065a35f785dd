#include "problem_factory.hpp"

#include <algorithm>
#include <optex/problems/problems.hpp>
#include <optex/util/random.hpp>
#include <stdexcept>
#include <utility>

namespace optex_bench {
namespace {

namespace pr = optex::problems;

constexpr std::string_view kRotatedPrefix = "rotated_";
// One rotation per problem and dimension, shared by every run seed.
constexpr std::uint64_t kRotationSeed = 7;
// noisy_quadratic's own noise and --noise on top of it must be independent.
constexpr std::uint64_t kOwnNoiseStream = 0x6f776e;  // "own"
// sigma 1: noisy_quadratic's noise covariance is its Hessian (the model's usual scale).
constexpr double kNoisyQuadraticSigma = 1.0;

struct Ellipsoid {
  std::string_view name;
  double condition_number;
};
constexpr Ellipsoid kEllipsoids[] = {
    {"ellipsoid_1e2", 1e2}, {"ellipsoid_1e4", 1e4}, {"ellipsoid_1e6", 1e6}};

// Wraps a problem into a Task; P may itself be Rotated<...>. `with_seed(seed)` is
// the problem whose own gradient noise comes from `seed` (the problem itself when
// it has none), so every gradient source draws its own.
template <class P, class WithSeed>
Task erase(P problem, WithSeed with_seed, std::string name, std::string base_name, std::size_t dim,
           double noise) {
  (void)problem.minimum(dim);  // lets the problem refuse a dimension it does not support
  Task task;
  task.name = std::move(name);
  task.base_name = std::move(base_name);
  task.dim = dim;
  task.noise = noise;
  task.loss = [problem](std::span<const float> x) { return problem.Evaluate(x); };
  task.gradient_source = [with_seed, noise](std::uint64_t noise_seed) -> GradientSource {
    const auto seeded = with_seed(noise_seed);
    if (noise == 0.0) {
      return [seeded](std::span<const float> x, std::span<float> g) {
        return seeded.EvaluateWithGradient(x, g);
      };
    }
    pr::WithGradientNoise noisy(seeded, noise, noise_seed);
    return [noisy](std::span<const float> x, std::span<float> g) {
      return noisy.EvaluateWithGradient(x, g);
    };
  };
  return task;
}

template <class P>
Task make(P problem, bool rotated, std::size_t dim, double noise) {
  std::string base_name(problem.name());
  if (rotated) {
    pr::Rotated<P> r(problem, dim, kRotationSeed);
    std::string name(r.name());
    return erase(
        r, [r](std::uint64_t) { return r; }, std::move(name), base_name, dim, noise);
  }
  return erase(
      problem, [problem](std::uint64_t) { return problem; }, base_name, base_name, dim, noise);
}

Task make_ellipsoid(const Ellipsoid& e, std::size_t dim, double noise) {
  const pr::Rotated<pr::Ellipsoid> r(pr::Ellipsoid(e.condition_number), dim, kRotationSeed);
  return erase(
      r, [r](std::uint64_t) { return r; }, std::string(e.name), std::string(e.name), dim, noise);
}

Task make_noisy_quadratic(std::size_t dim, double noise) {
  const pr::NoisyQuadratic problem(kNoisyQuadraticSigma);
  const auto with_seed = [](std::uint64_t noise_seed) {
    return pr::NoisyQuadratic(kNoisyQuadraticSigma, optex::mix_seed(noise_seed, kOwnNoiseStream));
  };
  std::string name(problem.name());
  Task task = erase(problem, with_seed, name, name, dim, noise);
  task.own_noise = "N(0, h_i) on gradient coordinate i (h_i = 1/i, sigma 1), drawn like --noise";
  return task;
}

std::string known_problems() {
  std::string known;
  for (const std::string& n : shipped_problem_names()) known += (known.empty() ? "" : ", ") + n;
  return known + "; rotated_<name> for the first eight";
}

[[noreturn]] void refuse(std::string_view name, const std::string& why) {
  throw std::invalid_argument("unknown problem '" + std::string(name) + "'" + why +
                              " (known: " + known_problems() + ")");
}

}  // namespace

const std::vector<std::string>& sfu_problem_names() {
  static const std::vector<std::string> names = {"sphere",          "rosenbrock", "ackley",
                                                 "rastrigin",       "levy",       "griewank",
                                                 "styblinski_tang", "schwefel"};
  return names;
}

const std::vector<std::string>& shipped_problem_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out = sfu_problem_names();
    for (const Ellipsoid& e : kEllipsoids) out.emplace_back(e.name);
    out.emplace_back("noisy_quadratic");
    return out;
  }();
  return names;
}

std::string rotated_name(std::string_view name) {
  if (name.starts_with(kRotatedPrefix) || name.starts_with("ellipsoid_")) return std::string(name);
  return std::string(kRotatedPrefix) + std::string(name);
}

Task make_task(std::string_view name, std::size_t dim, double noise) {
  const bool rotated = name.starts_with(kRotatedPrefix);
  const std::string_view base = rotated ? name.substr(kRotatedPrefix.size()) : name;
  if (base == "sphere") return make(pr::Sphere{}, rotated, dim, noise);
  if (base == "rosenbrock") return make(pr::Rosenbrock{}, rotated, dim, noise);
  if (base == "ackley") return make(pr::Ackley{}, rotated, dim, noise);
  if (base == "rastrigin") return make(pr::Rastrigin{}, rotated, dim, noise);
  if (base == "levy") return make(pr::Levy{}, rotated, dim, noise);
  if (base == "griewank") return make(pr::Griewank{}, rotated, dim, noise);
  if (base == "styblinski_tang") return make(pr::StyblinskiTang{}, rotated, dim, noise);
  if (base == "schwefel") return make(pr::Schwefel{}, rotated, dim, noise);
  const auto ellipsoid = std::find_if(std::begin(kEllipsoids), std::end(kEllipsoids),
                                      [&](const Ellipsoid& e) { return e.name == base; });
  if (ellipsoid != std::end(kEllipsoids)) {
    if (rotated) refuse(name, ": " + std::string(base) + " is rotated already");
    return make_ellipsoid(*ellipsoid, dim, noise);
  }
  if (base == "noisy_quadratic") {
    // Its noise is keyed to its own axes, and a rotation per noise seed would cost O(d^3).
    if (rotated) refuse(name, ": noisy_quadratic is offered unrotated only");
    return make_noisy_quadratic(dim, noise);
  }
  refuse(name, "");
}

std::vector<float> start_point(std::size_t dim, std::uint64_t seed) {
  return pr::uniform_start(dim, -1.0, 1.0, seed);
}

}  // namespace optex_bench
