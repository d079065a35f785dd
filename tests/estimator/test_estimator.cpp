// Tests of the GP gradient estimator and what it is built on: kernels
// (optex/estimator/covariance.hpp), the history ring buffer (optex/estimator/gradient_history.hpp),
// the streaming passes (optex/backend/streaming.hpp) and GpGradientEstimator
// (optex/estimator/gp_estimator.hpp), against brute-force double references.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <Eigen/LU>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "optex/backend/streaming.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/estimator/gp_estimator.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/estimator/kernel.hpp"
#include "support/test_support.hpp"

namespace {

using optex::Covariance;
using optex::GpGradientEstimator;
using optex::GradientHistory;
using optex::InputScaling;

constexpr Covariance kAllKernels[] = {Covariance::matern12, Covariance::matern32,
                                      Covariance::matern52, Covariance::rbf};

using optex::test::distance;
using optex::test::normal;
using optex::test::random_vector;

double norm(std::span<const float> v) {
  double s = 0.0;
  for (float x : v) s += static_cast<double>(x) * static_cast<double>(x);
  return std::sqrt(s);
}

double inner(std::span<const float> a, std::span<const float> b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// max_i |a_i - b_i| / max_i |b_i|
double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0;
  double ref = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

// ---- kernels ----------------------------------------------------------------------

TEST(Covariance, UnitAtZeroDistance) {
  for (Covariance k : kAllKernels)
    EXPECT_DOUBLE_EQ(optex::covariance_value(k, 0.0), 1.0) << optex::covariance_name(k);
}

TEST(Covariance, MatchesClosedForms) {
  const double s3 = std::sqrt(3.0);
  const double s5 = std::sqrt(5.0);
  for (double r : {0.05, 0.3, 1.0, 2.5, 7.0}) {
    EXPECT_NEAR(optex::covariance_value(Covariance::matern12, r), std::exp(-r), 1e-14);
    EXPECT_NEAR(optex::covariance_value(Covariance::matern32, r),
                (1.0 + s3 * r) * std::exp(-s3 * r), 1e-14);
    EXPECT_NEAR(optex::covariance_value(Covariance::matern52, r),
                (1.0 + s5 * r + 5.0 * r * r / 3.0) * std::exp(-s5 * r), 1e-14);
    EXPECT_NEAR(optex::covariance_value(Covariance::rbf, r), std::exp(-r * r / 2.0), 1e-14);
  }
  // Independent numbers (e.g. from scipy / GPy) pin the constants, not just the formula shape.
  EXPECT_NEAR(optex::covariance_value(Covariance::matern52, 1.0), 0.52399411, 1e-7);
  EXPECT_NEAR(optex::covariance_value(Covariance::matern32, 1.0), 0.48335772, 1e-7);
  EXPECT_NEAR(optex::covariance_value(Covariance::rbf, 2.0), 0.13533528, 1e-7);
}

TEST(Covariance, DecreasesWithDistance) {
  for (Covariance k : kAllKernels) {
    double previous = 1.0;
    for (double r = 0.25; r < 10.0; r += 0.25) {
      const double v = optex::covariance_value(k, r);
      EXPECT_LT(v, previous) << optex::covariance_name(k) << " at r = " << r;
      EXPECT_GT(v, 0.0);
      previous = v;
    }
  }
}

TEST(Covariance, NamesRoundTrip) {
  for (Covariance k : kAllKernels)
    EXPECT_EQ(optex::covariance_from_name(optex::covariance_name(k)), k);
  EXPECT_THROW(optex::covariance_from_name("matern72"), std::invalid_argument);
}

// The former spelling (optex/estimator/kernel.hpp) still compiles, deprecated, and means the same.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static_assert(std::is_same_v<optex::Kernel, Covariance>);
TEST(Covariance, TheFormerNamesAreDeprecatedAliases) {
  for (Covariance k : kAllKernels) {
    EXPECT_EQ(optex::kernel_name(k), optex::covariance_name(k));
    EXPECT_EQ(optex::kernel_from_name(optex::covariance_name(k)), k);
    EXPECT_EQ(optex::kernel_value(k, 0.7), optex::covariance_value(k, 0.7));
  }
}
#pragma GCC diagnostic pop

// ---- gradient history --------------------------------------------------------------

// Pair k of a sequence: every coordinate tells which pair it is.
std::vector<float> tagged(int k, float offset, std::size_t dim) {
  std::vector<float> v(dim);
  for (std::size_t i = 0; i < dim; ++i)
    v[i] = static_cast<float>(k) * 10.0f + offset + static_cast<float>(i);
  return v;
}

TEST(GradientHistory, RingOverwritesTheOldest) {
  constexpr std::size_t kDim = 4;
  GradientHistory h(3, kDim);
  EXPECT_TRUE(h.empty());
  EXPECT_EQ(h.capacity(), 3u);
  EXPECT_EQ(h.dim(), kDim);
  for (int k = 0; k < 5; ++k) {
    h.push(tagged(k, 0.0f, kDim), tagged(k, 0.5f, kDim));
    EXPECT_EQ(h.size(), std::min<std::size_t>(static_cast<std::size_t>(k) + 1, 3));
    EXPECT_EQ(h.newest_slot(), static_cast<std::size_t>(k) % 3);
    const auto newest = h.point(h.newest_slot());
    EXPECT_EQ(std::vector<float>(newest.begin(), newest.end()), tagged(k, 0.0f, kDim));
  }
  // Pairs 0 and 1 are gone; 3 and 4 took their slots; 2 stays in slot 2.
  const int expected_pair[3] = {3, 4, 2};
  for (std::size_t slot = 0; slot < 3; ++slot) {
    const auto p = h.point(slot);
    const auto g = h.gradient(slot);
    EXPECT_EQ(std::vector<float>(p.begin(), p.end()), tagged(expected_pair[slot], 0.0f, kDim));
    EXPECT_EQ(std::vector<float>(g.begin(), g.end()), tagged(expected_pair[slot], 0.5f, kDim));
    // The row-major blocks agree with the per-slot views.
    EXPECT_EQ(h.points_data()[slot * kDim], p[0]);
    EXPECT_EQ(h.gradients_data()[slot * kDim + kDim - 1], g[kDim - 1]);
  }
}

TEST(GradientHistory, CachedProductsMatchBruteForceAfterWrapAround) {
  for (std::size_t dim : {std::size_t{1}, std::size_t{3001}}) {
    std::mt19937 rng(7);
    GradientHistory h(3, dim);
    for (int k = 0; k < 5; ++k) {
      h.push(random_vector(rng, dim, 0.5, 2.0), random_vector(rng, dim, -0.3, 1.0));
    }
    ASSERT_EQ(h.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      const double n2 = norm(h.point(i)) * norm(h.point(i));
      EXPECT_NEAR(h.squared_norm(i), n2, 1e-5 * n2) << "dim " << dim;
      for (std::size_t j = 0; j < 3; ++j) {
        const double d = distance(h.point(i), h.point(j));
        const double d2 = d * d;
        EXPECT_NEAR(h.squared_distance(i, j), d2, 1e-5 * d2 + 1e-12)
            << "dim " << dim << " (" << i << ", " << j << ")";
        const double scale_g = norm(h.gradient(i)) * norm(h.gradient(j));
        EXPECT_NEAR(h.gradient_inner(i, j), inner(h.gradient(i), h.gradient(j)), 1e-5 * scale_g)
            << "dim " << dim << " (" << i << ", " << j << ")";
        EXPECT_EQ(h.squared_distance(i, j), h.squared_distance(j, i));
        EXPECT_EQ(h.gradient_inner(i, j), h.gradient_inner(j, i));
      }
      EXPECT_EQ(h.squared_distance(i, i), 0.0);
    }
  }
}

TEST(GradientHistory, RejectsBadShapes) {
  EXPECT_THROW(GradientHistory(0, 4), std::invalid_argument);
  EXPECT_THROW(GradientHistory(4, 0), std::invalid_argument);
  GradientHistory h(2, 3);
  const std::vector<float> three(3, 1.0f);
  const std::vector<float> two(2, 1.0f);
  EXPECT_THROW(h.push(two, three), std::invalid_argument);
  EXPECT_THROW(h.push(three, two), std::invalid_argument);
  EXPECT_TRUE(h.empty());
}

// ---- streaming passes ---------------------------------------------------------------

// Dimensions that are not multiples of the 1024-float block, and one that is.
class Streaming : public ::testing::TestWithParam<std::size_t> {};

TEST_P(Streaming, MatchesNaiveLoops) {
  const std::size_t dim = GetParam();
  constexpr std::size_t kRows = 5;
  std::mt19937 rng(static_cast<unsigned>(dim));
  const std::vector<float> rows = random_vector(rng, kRows * dim, 0.2, 1.5);
  const std::vector<float> x = random_vector(rng, dim, -0.1, 1.0);
  const std::vector<double> weights = {0.5, -1.25, 2.0, 0.0, 0.75};

  std::vector<double> dist(kRows, -1.0);
  std::vector<double> dots(kRows, -1.0);
  std::vector<float> sum(dim, -1.0f);
  optex::streaming::squared_distances(rows.data(), kRows, dim, x.data(), dist.data());
  optex::streaming::inner_products(rows.data(), kRows, dim, x.data(), dots.data());
  optex::streaming::weighted_sum(rows.data(), kRows, dim, weights.data(), sum.data());

  for (std::size_t j = 0; j < kRows; ++j) {
    double d2 = 0.0;
    double ip = 0.0;
    double abs_ip = 0.0;
    for (std::size_t i = 0; i < dim; ++i) {
      const double r = rows[j * dim + i];
      d2 += (r - x[i]) * (r - x[i]);
      ip += r * x[i];
      abs_ip += std::abs(r * x[i]);
    }
    EXPECT_NEAR(dist[j], d2, 1e-5 * d2 + 1e-12) << "row " << j;
    EXPECT_NEAR(dots[j], ip, 1e-5 * abs_ip + 1e-12) << "row " << j;
  }
  for (std::size_t i = 0; i < dim; ++i) {
    double s = 0.0;
    double abs_s = 0.0;
    for (std::size_t j = 0; j < kRows; ++j) {
      s += weights[j] * rows[j * dim + i];
      abs_s += std::abs(weights[j] * rows[j * dim + i]);
    }
    ASSERT_NEAR(sum[i], s, 1e-5 * abs_s + 1e-12) << "coordinate " << i;
  }
  const std::span<const float> row0(rows.data(), dim);
  const std::span<const float> row1(rows.data() + dim, dim);
  const double ip01 = inner(row0, row1);
  EXPECT_NEAR(optex::streaming::dot(row0.data(), row1.data(), dim), ip01,
              1e-5 * norm(row0) * norm(row1));
  EXPECT_NEAR(optex::streaming::dot(x.data(), x.data(), dim), inner(x, x), 1e-5 * inner(x, x));
}

INSTANTIATE_TEST_SUITE_P(Dims, Streaming, ::testing::Values(1, 3, 1023, 1024, 3001));

// ---- GP estimator -------------------------------------------------------------------

// A history of n random points (spread `spread` around `centre` per coordinate) with
// random gradients.
GradientHistory random_history(std::mt19937& rng, std::size_t n, std::size_t dim,
                               double centre = 0.0, double spread = 1.0) {
  GradientHistory h(n, dim);
  for (std::size_t k = 0; k < n; ++k) {
    h.push(random_vector(rng, dim, centre, spread), random_vector(rng, dim, 0.0, 1.0));
  }
  return h;
}

double median_distance(const GradientHistory& h) {
  std::vector<double> d;
  for (std::size_t i = 0; i < h.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) d.push_back(distance(h.point(i), h.point(j)));
  std::sort(d.begin(), d.end());
  return d[d.size() / 2];
}

// (a) With tiny noise the mean interpolates the history; with large noise it smooths.
TEST(GpGradientEstimator, ReproducesHistoryGradientsUpToNoise) {
  constexpr std::size_t kDim = 10;
  constexpr std::size_t kN = 6;
  for (Covariance kernel : kAllKernels) {
    std::mt19937 rng(11);
    const GradientHistory h = random_history(rng, kN, kDim);
    const double lengthscale = median_distance(h);
    std::vector<float> mu(kDim);

    GpGradientEstimator exact(kernel, 1e-6, InputScaling::none, kN);
    exact.fit(h, lengthscale);
    EXPECT_EQ(exact.jitter(), 0.0);  // noise alone makes it positive definite
    GpGradientEstimator smooth(kernel, 1e-1, InputScaling::none, kN);
    smooth.fit(h, lengthscale);

    double worst_exact = 0.0;
    double best_smooth = 1e300;
    for (std::size_t j = 0; j < kN; ++j) {
      exact.predict(h, h.point(j), mu);
      worst_exact = std::max(worst_exact, relative_error(mu, h.gradient(j)));
      smooth.predict(h, h.point(j), mu);
      best_smooth = std::min(best_smooth, relative_error(mu, h.gradient(j)));
    }
    EXPECT_LT(worst_exact, 1e-4) << optex::covariance_name(kernel);
    EXPECT_GT(best_smooth, 1e-2) << optex::covariance_name(kernel);
  }
}

// f(x) = 0.5 x^T A x with A = diag(a), a spread over two decades.
struct Quadratic {
  std::vector<double> a;
  explicit Quadratic(std::size_t dim) : a(dim) {
    for (std::size_t i = 0; i < dim; ++i)
      a[i] = 0.1 * std::pow(100.0, static_cast<double>(i) / static_cast<double>(dim - 1));
  }
  std::vector<float> gradient(std::span<const float> x) const {
    std::vector<float> g(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) g[i] = static_cast<float>(a[i] * x[i]);
    return g;
  }
};

// (b) More history, better predictions at fresh points near it.
TEST(GpGradientEstimator, ErrorFallsAsTheHistoryGrows) {
  constexpr std::size_t kDim = 50;
  const Quadratic f(kDim);
  std::mt19937 rng(5);
  const std::vector<float> centre = random_vector(rng, kDim, 0.0, 2.0);
  const double spread = 0.3;
  auto around_centre = [&] {
    std::vector<float> x = random_vector(rng, kDim, 0.0, spread);
    for (std::size_t i = 0; i < kDim; ++i) x[i] += centre[i];
    return x;
  };
  std::vector<std::vector<float>> fresh;
  for (int q = 0; q < 20; ++q) fresh.push_back(around_centre());

  const optex::Options defaults;
  std::vector<double> errors;
  for (std::size_t n : {2, 8, 32}) {
    GradientHistory h(n, kDim);
    for (std::size_t k = 0; k < n; ++k) {
      const std::vector<float> x = around_centre();
      h.push(x, f.gradient(x));
    }
    GpGradientEstimator est(defaults.kernel, defaults.noise, InputScaling::none, n);
    // A lengthscale of the order of the sampling radius, fixed across n.
    est.fit(h, 2.0 * spread * std::sqrt(static_cast<double>(kDim)));
    double err = 0.0;
    std::vector<float> mu(kDim);
    for (const std::vector<float>& x : fresh) {
      est.predict(h, x, mu);
      const std::vector<float> g = f.gradient(x);
      double diff2 = 0.0;
      for (std::size_t i = 0; i < kDim; ++i) diff2 += (mu[i] - g[i]) * (mu[i] - g[i]);
      err += std::sqrt(diff2) / norm(g);
    }
    errors.push_back(err / static_cast<double>(fresh.size()));
  }
  EXPECT_LT(errors[1], errors[0]);
  EXPECT_LT(errors[2], errors[1]);
  EXPECT_LT(errors[2], 0.5);  // and it is a useful estimate by then
}

// The GP mean computed directly: scale, Gram matrix, a full-pivot LU solve, all in double.
struct ReferenceGp {
  double scale = 1.0;
  std::vector<double> weights;
  std::vector<double> mu;
};

ReferenceGp reference_gp(const GradientHistory& h, Covariance kernel, double noise,
                         InputScaling scaling, double lengthscale, std::span<const float> x) {
  const std::size_t n = h.size();
  ReferenceGp out;
  if (scaling == InputScaling::reference_mean_sqrt_norm) {
    double sum = 0.0;
    for (std::size_t j = 0; j < n; ++j) sum += std::sqrt(norm(h.point(j)));
    out.scale = sum / static_cast<double>(n);
  }
  const auto ni = static_cast<Eigen::Index>(n);
  Eigen::MatrixXd a(ni, ni);
  Eigen::VectorXd k(ni);
  for (Eigen::Index i = 0; i < ni; ++i) {
    const auto si = static_cast<std::size_t>(i);
    for (Eigen::Index j = 0; j < ni; ++j) {
      const double r =
          distance(h.point(si), h.point(static_cast<std::size_t>(j))) / out.scale / lengthscale;
      a(i, j) = optex::covariance_value(kernel, r) + (i == j ? noise : 0.0);
    }
    k(i) = optex::covariance_value(kernel, distance(h.point(si), x) / out.scale / lengthscale);
  }
  const Eigen::VectorXd w = a.fullPivLu().solve(k);
  out.weights.assign(w.data(), w.data() + n);
  out.mu.assign(h.dim(), 0.0);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < h.dim(); ++i) out.mu[i] += out.weights[j] * h.gradient(j)[i];
  return out;
}

class MatchesReferenceGp : public ::testing::TestWithParam<std::tuple<Covariance, InputScaling>> {};

// (c) Every kernel and both input scalings against the direct computation.
TEST_P(MatchesReferenceGp, AtFreshAndHistoryPoints) {
  const auto [kernel, scaling] = GetParam();
  constexpr std::size_t kDim = 12;
  constexpr std::size_t kN = 7;
  std::mt19937 rng(3);
  // Points with very different norms, so that mean(sqrt(||x||)) differs from e.g.
  // sqrt(mean ||x||) or mean ||x||.
  GradientHistory h(kN, kDim);
  for (std::size_t k = 0; k < kN; ++k) {
    std::vector<float> x = random_vector(rng, kDim, 1.0, 0.5);
    const float stretch = std::pow(3.0f, static_cast<float>(k) - 2.0f);
    for (float& v : x) v *= stretch;
    h.push(x, random_vector(rng, kDim, 0.0, 1.0));
  }
  double ref_scale = 1.0;
  if (scaling == InputScaling::reference_mean_sqrt_norm) {
    double sum = 0.0;
    for (std::size_t j = 0; j < kN; ++j) sum += std::sqrt(norm(h.point(j)));
    ref_scale = sum / static_cast<double>(kN);
  }
  EXPECT_NEAR(optex::input_scale(h, scaling), ref_scale, 1e-6 * ref_scale);
  // A lengthscale that puts scaled distances near 1, so that every kernel weight matters.
  const double lengthscale = 0.5 * median_distance(h) / ref_scale;
  const double noise = 1e-3;

  GpGradientEstimator est(kernel, noise, scaling, kN);
  est.fit(h, lengthscale);
  EXPECT_NEAR(est.scale(), ref_scale, 1e-6 * ref_scale);
  EXPECT_EQ(est.fitted_size(), kN);

  std::vector<std::vector<float>> queries;
  for (int q = 0; q < 3; ++q) {
    std::vector<float> x(h.point(static_cast<std::size_t>(q) + 2).begin(),
                         h.point(static_cast<std::size_t>(q) + 2).end());
    const std::vector<float> nudge = random_vector(rng, kDim, 0.0, 0.3);
    for (std::size_t i = 0; i < kDim; ++i) x[i] += nudge[i] * std::abs(x[i]);
    queries.push_back(x);
  }
  queries.emplace_back(h.point(4).begin(), h.point(4).end());

  std::vector<float> mu(kDim);
  for (const std::vector<float>& x : queries) {
    const ReferenceGp ref = reference_gp(h, kernel, noise, scaling, lengthscale, x);
    est.predict(h, x, mu);
    double max_ref = 0.0;
    for (double v : ref.mu) max_ref = std::max(max_ref, std::abs(v));
    ASSERT_GT(max_ref, 1e-3);  // the query is not so far that mu vanishes
    for (std::size_t i = 0; i < kDim; ++i) EXPECT_NEAR(mu[i], ref.mu[i], 1e-4 * max_ref);
    // Distances are accumulated from float data and (K + noise I) has a condition number up to
    // about 1e3 here, so the weights agree to float precision times that.
    ASSERT_EQ(est.weights().size(), kN);
    double max_w = 0.0;
    for (double v : ref.weights) max_w = std::max(max_w, std::abs(v));
    for (std::size_t j = 0; j < kN; ++j)
      EXPECT_NEAR(est.weights()[j], ref.weights[j], 1e-3 * max_w);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllKernels, MatchesReferenceGp,
    ::testing::Combine(::testing::ValuesIn(kAllKernels),
                       ::testing::Values(InputScaling::none,
                                         InputScaling::reference_mean_sqrt_norm)),
    [](const ::testing::TestParamInfo<std::tuple<Covariance, InputScaling>>& p) {
      return std::string(optex::covariance_name(std::get<0>(p.param))) +
             (std::get<1>(p.param) == InputScaling::none ? "_none" : "_mean_sqrt_norm");
    });

// (d) Identical points make K singular: with zero noise only jitter makes it factorisable.
TEST(GpGradientEstimator, JitterRescuesDuplicatedPoints) {
  constexpr std::size_t kDim = 6;
  std::mt19937 rng(17);
  const std::vector<float> a = random_vector(rng, kDim);
  const std::vector<float> b = random_vector(rng, kDim);
  const std::vector<float> ga = random_vector(rng, kDim);
  const std::vector<float> gb = random_vector(rng, kDim);
  for (Covariance kernel : kAllKernels) {
    GradientHistory h(4, kDim);
    h.push(a, ga);
    h.push(b, gb);
    h.push(a, ga);
    h.push(a, ga);
    GpGradientEstimator est(kernel, 0.0, InputScaling::none, 4);
    ASSERT_NO_THROW(est.fit(h, 1.0));
    EXPECT_GT(est.jitter(), 0.0) << optex::covariance_name(kernel);
    EXPECT_LE(est.jitter(), 1e-2);
    std::vector<float> mu(kDim);
    for (const std::vector<float>& x : {a, b, random_vector(rng, kDim)}) {
      est.predict(h, x, mu);
      for (float v : mu) EXPECT_TRUE(std::isfinite(v)) << optex::covariance_name(kernel);
    }
    // Consistent duplicates: the mean at a still reproduces g_a.
    est.predict(h, a, mu);
    EXPECT_LT(relative_error(mu, ga), 1e-2) << optex::covariance_name(kernel);
  }
}

// (e) mu is the weighted sum of the history gradients, with the reported weights.
TEST(GpGradientEstimator, WeightsReconstructTheMean) {
  constexpr std::size_t kDim = 40;
  std::mt19937 rng(23);
  const GradientHistory h = random_history(rng, 9, kDim);
  GpGradientEstimator est(Covariance::matern52, 1e-3, InputScaling::none, 9);
  est.fit(h, median_distance(h));
  const std::vector<float> x = random_vector(rng, kDim, 0.0, 0.5);
  std::vector<float> mu(kDim);
  est.predict(h, x, mu);
  const std::span<const double> w = est.weights();
  ASSERT_EQ(w.size(), 9u);
  double max_abs = 0.0;
  for (float v : mu) max_abs = std::max(max_abs, std::abs(static_cast<double>(v)));
  ASSERT_GT(max_abs, 1e-3);
  for (std::size_t i = 0; i < kDim; ++i) {
    double s = 0.0;
    for (std::size_t j = 0; j < w.size(); ++j) s += w[j] * h.gradient(j)[i];
    EXPECT_NEAR(mu[i], s, 1e-5 * max_abs) << "coordinate " << i;
  }
}

TEST(GpGradientEstimator, PredictNeedsAFitOfTheCurrentHistory) {
  std::mt19937 rng(29);
  GradientHistory h(4, 3);
  h.push(random_vector(rng, 3), random_vector(rng, 3));
  h.push(random_vector(rng, 3), random_vector(rng, 3));
  GpGradientEstimator est(Covariance::matern52, 1e-3, InputScaling::none, 4);
  std::vector<float> mu(3);
  const std::vector<float> x(3, 0.0f);
  EXPECT_THROW(est.predict(h, x, mu), std::logic_error);  // never fitted
  est.fit(h, 1.0);
  EXPECT_NO_THROW(est.predict(h, x, mu));
  h.push(random_vector(rng, 3), random_vector(rng, 3));
  EXPECT_THROW(est.predict(h, x, mu), std::logic_error);  // the history grew since
}

// Negative noise would make the covariance indefinite: refused at construction.
TEST(GpGradientEstimator, RejectsNegativeNoise) {
  try {
    GpGradientEstimator est(Covariance::rbf, -1.0, InputScaling::none, 3);
    FAIL() << "negative noise accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("noise"));
    EXPECT_THAT(e.what(), testing::HasSubstr("-1"));
  }
}

// Once the ring is full a push keeps the size: the fit must still notice it is stale.
TEST(GpGradientEstimator, PredictAfterWrapAroundNeedsRefit) {
  std::mt19937 rng(37);
  GradientHistory h(2, 3);
  h.push(random_vector(rng, 3), random_vector(rng, 3));
  h.push(random_vector(rng, 3), random_vector(rng, 3));
  GpGradientEstimator est(Covariance::matern52, 1e-3, InputScaling::none, 2);
  est.fit(h, 1.0);
  std::vector<float> mu(3);
  const std::vector<float> x(3, 0.0f);
  EXPECT_NO_THROW(est.predict(h, x, mu));
  h.push(random_vector(rng, 3), random_vector(rng, 3));  // overwrites the oldest, size stays 2
  EXPECT_THROW(est.predict(h, x, mu), std::logic_error);
}

}  // namespace
