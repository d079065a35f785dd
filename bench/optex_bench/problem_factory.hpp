// The problems optex-bench runs, by name: any shipped test problem, optionally
// rotated ("rotated_" prefix) and with Gaussian gradient noise. The ellipsoids
// (ellipsoid_1e2, ellipsoid_1e4, ellipsoid_1e6: condition number 1e2, 1e4, 1e6) are
// Rotated<Ellipsoid> already; noisy_quadratic is NoisyQuadratic with sigma 1, whose
// own gradient noise is drawn like --noise's, from the gradient source's seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace optex_bench {

// Writes the (possibly noisy) gradient at x into g and returns the exact loss.
using GradientSource = std::function<double(std::span<const float> x, std::span<float> g)>;

// One benchmark task: a problem at a dimension, with its gradient noise.
struct Task {
  std::string name;       // "sphere", "rotated_rosenbrock", ...
  std::string base_name;  // the shipped problem underneath: "sphere", "rosenbrock", ...
  std::size_t dim = 0;
  double noise = 0.0;  // std of the Gaussian noise on every gradient coordinate
  // The problem's own gradient noise in words (noisy_quadratic); empty when it has none.
  std::string own_noise;

  // The noise-free loss: what the benchmark measures, outside the gradient budget.
  std::function<double(std::span<const float> x)> loss;
  // A gradient source whose noise is drawn from `noise_seed`. The noise is a pure
  // function of (noise_seed, x) (problems/gradient_noise.hpp), so two sources with
  // different seeds are independent minibatches at the same point.
  std::function<GradientSource(std::uint64_t noise_seed)> gradient_source;

  // Whether two gradients at one point can differ (then N x minibatch is not vanilla).
  bool stochastic() const { return noise > 0.0 || !own_noise.empty(); }
};

// Every problem name optex-bench knows without a "rotated_" prefix, for --help and
// the error messages.
const std::vector<std::string>& shipped_problem_names();

// The eight SFU test functions, in the order the suite preset lists them.
const std::vector<std::string>& sfu_problem_names();

// `name` as --rotated runs it: "rotated_" + name, or name itself where the problem
// is rotated already (rotated_*, ellipsoid_*).
std::string rotated_name(std::string_view name);

// "sphere" or "rotated_sphere" etc. Throws std::invalid_argument for an unknown
// name (an ellipsoid with a "rotated_" prefix included), or a dimension the problem
// does not support (Rosenbrock needs d >= 2; a dense rotation, the ellipsoids' too,
// needs d <= 4096). Rotations use a fixed seed, so a rotated task is one function
// for every run seed.
Task make_task(std::string_view name, std::size_t dim, double noise);

// The start of run `seed`: U(-1, 1)^d, the OptEx authors' start.
std::vector<float> start_point(std::size_t dim, std::uint64_t seed);

}  // namespace optex_bench
