#include "problem_factory.hpp"

#include <optex/problems.hpp>
#include <stdexcept>
#include <utility>

namespace optex_bench {
namespace {

namespace pr = optex::problems;

constexpr std::string_view kRotatedPrefix = "rotated_";
// One rotation per problem and dimension, shared by every run seed.
constexpr std::uint64_t kRotationSeed = 7;

// Wraps a concrete problem type into a Task; P may itself be Rotated<...>.
template <class P>
Task erase(P problem, std::string base_name, std::size_t dim, double noise) {
  (void)problem.minimum(dim);  // lets the problem refuse a dimension it does not support
  Task task;
  task.name = std::string(problem.name());
  task.base_name = std::move(base_name);
  task.dim = dim;
  task.noise = noise;
  task.loss = [problem](std::span<const float> x) { return problem.Evaluate(x); };
  task.gradient_source = [problem, noise](std::uint64_t noise_seed) -> GradientSource {
    if (noise == 0.0) {
      return [problem](std::span<const float> x, std::span<float> g) {
        return problem.EvaluateWithGradient(x, g);
      };
    }
    pr::WithGradientNoise<P> noisy(problem, noise, noise_seed);
    return [noisy](std::span<const float> x, std::span<float> g) {
      return noisy.EvaluateWithGradient(x, g);
    };
  };
  return task;
}

template <class P>
Task make(P problem, bool rotated, std::size_t dim, double noise) {
  std::string base_name(problem.name());
  if (rotated) return erase(pr::Rotated<P>(problem, dim, kRotationSeed), base_name, dim, noise);
  return erase(problem, base_name, dim, noise);
}

}  // namespace

const std::vector<std::string>& shipped_problem_names() {
  static const std::vector<std::string> names = {"sphere",          "rosenbrock", "ackley",
                                                 "rastrigin",       "levy",       "griewank",
                                                 "styblinski_tang", "schwefel"};
  return names;
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
  std::string known;
  for (const std::string& n : shipped_problem_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown problem '" + std::string(name) + "' (known: " + known +
                              ", each also as rotated_<name>)");
}

std::vector<float> start_point(std::size_t dim, std::uint64_t seed) {
  return pr::uniform_start(dim, -1.0, 1.0, seed);
}

}  // namespace optex_bench
