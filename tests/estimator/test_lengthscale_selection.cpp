// Tests of the lengthscale selection (optex/estimator/lengthscale_selection.hpp): when it declines
// to choose, that it chooses on the grid of median-distance multiples, and that both criteria equal
// brute-force recomputations written here with Eigen (the LOO one by actually leaving each point
// out and refitting).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <Eigen/LU>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/estimator/gp_estimator.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/estimator/lengthscale_selection.hpp"
#include "support/test_support.hpp"

namespace {

using optex::Covariance;
using optex::GradientHistory;
using optex::InputScaling;
using optex::LengthscaleSelection;
using optex::Options;

using optex::test::distance;
using optex::test::normal;
using optex::test::random_vector;

// Points along a smooth function's gradient field, so that the lengthscale matters: the
// gradient of f(x) = sum_i sin(x_i) + 0.1 x_i^2 at points spread around a centre.
GradientHistory smooth_history(std::size_t n, std::size_t dim, unsigned seed, double centre = 1.0) {
  std::mt19937 rng(seed);
  GradientHistory h(n, dim);
  for (std::size_t k = 0; k < n; ++k) {
    const std::vector<float> x = random_vector(rng, dim, centre, 0.7);
    std::vector<float> g(dim);
    for (std::size_t i = 0; i < dim; ++i) {
      g[i] = static_cast<float>(std::cos(static_cast<double>(x[i])) + 0.2 * x[i]);
    }
    h.push(x, g);
  }
  return h;
}

// The median of the pairwise distances, for an odd number of pairs (unambiguous).
double median_distance(const GradientHistory& h) {
  std::vector<double> d;
  for (std::size_t i = 0; i < h.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) d.push_back(distance(h.point(i), h.point(j)));
  EXPECT_EQ(d.size() % 2, 1u) << "pick a history size with an odd number of pairs";
  std::sort(d.begin(), d.end());
  return d[d.size() / 2];
}

double mean_sqrt_norm(const GradientHistory& h) {
  double sum = 0.0;
  for (std::size_t j = 0; j < h.size(); ++j) {
    double n2 = 0.0;
    for (float v : h.point(j)) n2 += static_cast<double>(v) * v;
    sum += std::sqrt(std::sqrt(n2));
  }
  return sum / static_cast<double>(h.size());
}

double scale_of(const GradientHistory& h, InputScaling s) {
  return s == InputScaling::none ? 1.0 : mean_sqrt_norm(h);
}

// A = K + noise I in double from the raw points; `scaled_lengthscale` = lengthscale * scale.
Eigen::MatrixXd covariance(const GradientHistory& h, Covariance kernel, double scaled_lengthscale,
                           double noise) {
  const auto n = static_cast<Eigen::Index>(h.size());
  Eigen::MatrixXd a(n, n);
  for (Eigen::Index i = 0; i < n; ++i)
    for (Eigen::Index j = 0; j < n; ++j)
      a(i, j) = optex::covariance_value(kernel, distance(h.point(static_cast<std::size_t>(i)),
                                                         h.point(static_cast<std::size_t>(j))) /
                                                    scaled_lengthscale) +
                (i == j ? noise : 0.0);
  return a;
}

// History gradients as an n x d double matrix.
Eigen::MatrixXd gradients(const GradientHistory& h) {
  const auto n = static_cast<Eigen::Index>(h.size());
  const auto d = static_cast<Eigen::Index>(h.dim());
  Eigen::MatrixXd g(n, d);
  for (Eigen::Index i = 0; i < n; ++i)
    for (Eigen::Index c = 0; c < d; ++c)
      g(i, c) = h.gradient(static_cast<std::size_t>(i))[static_cast<std::size_t>(c)];
  return g;
}

// sum_i ||mu_{-i}(x_i) - g_i||^2, refitting the GP on the other n-1 points for each i.
double brute_force_loo(const GradientHistory& h, Covariance kernel, double scaled_lengthscale,
                       double noise) {
  const Eigen::MatrixXd a = covariance(h, kernel, scaled_lengthscale, noise);
  const Eigen::MatrixXd g = gradients(h);
  const Eigen::Index n = a.rows();
  double total = 0.0;
  for (Eigen::Index out = 0; out < n; ++out) {
    std::vector<Eigen::Index> keep;
    for (Eigen::Index j = 0; j < n; ++j)
      if (j != out) keep.push_back(j);
    const auto m = static_cast<Eigen::Index>(keep.size());
    Eigen::MatrixXd sub(m, m);
    Eigen::VectorXd k(m);
    Eigen::MatrixXd gsub(m, g.cols());
    for (Eigen::Index p = 0; p < m; ++p) {
      for (Eigen::Index q = 0; q < m; ++q) sub(p, q) = a(keep[p], keep[q]);
      k(p) = a(keep[p], out);  // off-diagonal: the kernel alone, no noise
      gsub.row(p) = g.row(keep[p]);
    }
    const Eigen::VectorXd w = sub.fullPivLu().solve(k);
    const Eigen::VectorXd mu = gsub.transpose() * w;
    total += (mu - g.row(out).transpose()).squaredNorm();
  }
  return total;
}

// n log tr(A^-1 Q) + log det A, with Q = G G^T: minus the profiled log marginal likelihood,
// up to constants and a factor d / 2.
double brute_force_marginal(const GradientHistory& h, Covariance kernel, double scaled_lengthscale,
                            double noise) {
  const Eigen::MatrixXd a = covariance(h, kernel, scaled_lengthscale, noise);
  const Eigen::MatrixXd g = gradients(h);
  const Eigen::MatrixXd q = g * g.transpose();
  const Eigen::FullPivLU<Eigen::MatrixXd> lu(a);
  const double trace = lu.solve(q).trace();
  return static_cast<double>(a.rows()) * std::log(trace) + std::log(lu.determinant());
}

struct BruteChoice {
  double multiple;
  double score;
};

// The grid value with the lowest brute-force criterion (first of equals).
BruteChoice brute_force_choice(const GradientHistory& h, const Options& o,
                               std::span<const double> grid) {
  const double scale = scale_of(h, o.input_scaling);
  const double median = median_distance(h) / scale;
  BruteChoice best{0.0, std::numeric_limits<double>::infinity()};
  for (double multiple : grid) {
    const double scaled = multiple * median * scale;
    const double s = o.lengthscale_selection == LengthscaleSelection::marginal_likelihood
                         ? brute_force_marginal(h, o.kernel, scaled, o.noise)
                         : brute_force_loo(h, o.kernel, scaled, o.noise);
    if (s < best.score) best = {multiple, s};
  }
  return best;
}

// ---- when there is nothing to choose -------------------------------------------------

TEST(SelectLengthscale, UnchangedWithFewerThanThreePoints) {
  const GradientHistory h = smooth_history(2, 5, 1);
  for (LengthscaleSelection sel :
       {LengthscaleSelection::leave_one_out, LengthscaleSelection::marginal_likelihood}) {
    Options o;
    o.lengthscale_selection = sel;
    const optex::LengthscaleChoice c = optex::select_lengthscale(h, o, 0.37);
    EXPECT_DOUBLE_EQ(c.lengthscale, 0.37);
    EXPECT_FALSE(c.changed);
  }
  GradientHistory empty(4, 5);
  Options o;
  EXPECT_FALSE(optex::select_lengthscale(empty, o, 0.37).changed);
}

TEST(SelectLengthscale, UnchangedWhenAllPointsCoincide) {
  std::mt19937 rng(2);
  const std::vector<float> x = random_vector(rng, 6);
  GradientHistory h(5, 6);
  for (int k = 0; k < 5; ++k) h.push(x, random_vector(rng, 6));
  for (LengthscaleSelection sel :
       {LengthscaleSelection::leave_one_out, LengthscaleSelection::marginal_likelihood}) {
    Options o;
    o.lengthscale_selection = sel;
    const optex::LengthscaleChoice c = optex::select_lengthscale(h, o, 0.42);
    EXPECT_DOUBLE_EQ(c.lengthscale, 0.42);
    EXPECT_FALSE(c.changed);
  }
}

TEST(SelectLengthscale, UnchangedWhenFixed) {
  const GradientHistory h = smooth_history(7, 5, 3);
  Options o;
  o.lengthscale_selection = LengthscaleSelection::fixed;
  const optex::LengthscaleChoice c = optex::select_lengthscale(h, o, 123.0);
  EXPECT_DOUBLE_EQ(c.lengthscale, 123.0);
  EXPECT_FALSE(c.changed);
}

// ---- the choice -----------------------------------------------------------------------

using Combo = std::tuple<LengthscaleSelection, InputScaling, Covariance>;

class SelectionCriterion : public ::testing::TestWithParam<Combo> {
 protected:
  Options options() const {
    Options o;
    o.lengthscale_selection = std::get<0>(GetParam());
    o.input_scaling = std::get<1>(GetParam());
    o.kernel = std::get<2>(GetParam());
    o.noise = 1e-2;  // keeps A well conditioned, so brute force and closed form agree closely
    return o;
  }
};

// The choice is a multiple of the median pairwise distance (in scaled units) from the grid.
TEST_P(SelectionCriterion, ChoosesAGridMultipleOfTheMedianDistance) {
  const Options o = options();
  const GradientHistory h = smooth_history(7, 8, 4);  // 21 pairs
  const double median = median_distance(h) / scale_of(h, o.input_scaling);
  const optex::LengthscaleChoice c = optex::select_lengthscale(h, o, 0.1);
  ASSERT_TRUE(c.changed);
  EXPECT_TRUE(std::isfinite(c.score));
  const double ratio = c.lengthscale / median;
  const std::span<const double> grid = optex::default_lengthscale_grid();
  ASSERT_FALSE(grid.empty());
  const bool on_grid = std::any_of(grid.begin(), grid.end(),
                                   [&](double m) { return std::abs(ratio - m) <= 1e-6 * m; });
  EXPECT_TRUE(on_grid) << "lengthscale " << c.lengthscale << " = " << ratio << " x median";
}

// The library's closed forms (LOO via R&W eq. 5.12; profiled marginal likelihood) against
// brute force at every grid value: the same argmin and the same score.
TEST_P(SelectionCriterion, EqualsBruteForceOverTheGrid) {
  const Options o = options();
  const GradientHistory h = smooth_history(6, 5, 5);  // 15 pairs
  const double median = median_distance(h) / scale_of(h, o.input_scaling);
  const optex::LengthscaleChoice c = optex::select_lengthscale(h, o, 0.1);
  ASSERT_TRUE(c.changed);
  const BruteChoice brute = brute_force_choice(h, o, optex::default_lengthscale_grid());
  EXPECT_NEAR(c.lengthscale, brute.multiple * median, 1e-6 * brute.multiple * median);
  EXPECT_NEAR(c.score, brute.score, 1e-5 * (1.0 + std::abs(brute.score)));
}

INSTANTIATE_TEST_SUITE_P(
    All, SelectionCriterion,
    ::testing::Combine(
        ::testing::Values(LengthscaleSelection::leave_one_out,
                          LengthscaleSelection::marginal_likelihood),
        ::testing::Values(InputScaling::none, InputScaling::reference_mean_sqrt_norm),
        ::testing::Values(Covariance::matern52, Covariance::rbf, Covariance::matern12)),
    [](const ::testing::TestParamInfo<Combo>& p) {
      return std::string(std::get<0>(p.param) == LengthscaleSelection::leave_one_out ? "loo"
                                                                                     : "marginal") +
             (std::get<1>(p.param) == InputScaling::none ? "_none_" : "_mean_sqrt_norm_") +
             std::string(optex::covariance_name(std::get<2>(p.param)));
    });

// The LOO score is what the estimator itself would get wrong at each left-out point: refit
// GpGradientEstimator on the other points at the chosen lengthscale and predict there.
TEST(SelectLengthscale, LooScoreEqualsEstimatorLeaveOneOut) {
  const GradientHistory h = smooth_history(6, 5, 6);
  Options o;
  o.lengthscale_selection = LengthscaleSelection::leave_one_out;
  o.input_scaling = InputScaling::none;  // a sub-history has another mean norm: keep scale 1
  o.noise = 1e-2;
  const optex::LengthscaleChoice c = optex::select_lengthscale(h, o, 0.1);
  ASSERT_TRUE(c.changed);

  double total = 0.0;
  for (std::size_t out = 0; out < h.size(); ++out) {
    GradientHistory rest(h.size() - 1, h.dim());
    for (std::size_t j = 0; j < h.size(); ++j)
      if (j != out) rest.push(h.point(j), h.gradient(j));
    optex::GpGradientEstimator est(o.kernel, o.noise, o.input_scaling, rest.capacity());
    est.fit(rest, c.lengthscale);
    ASSERT_EQ(est.jitter(), 0.0);
    std::vector<float> mu(h.dim());
    est.predict(rest, h.point(out), mu);
    for (std::size_t i = 0; i < h.dim(); ++i) {
      const double e = static_cast<double>(mu[i]) - h.gradient(out)[i];
      total += e * e;
    }
  }
  EXPECT_NEAR(c.score, total, 1e-4 * total);
}

// A custom grid replaces the built-in one, and the choice is the best value on it.
TEST(SelectLengthscale, HonoursACustomGrid) {
  const GradientHistory h = smooth_history(7, 6, 7);
  const double median = median_distance(h);
  for (LengthscaleSelection sel :
       {LengthscaleSelection::leave_one_out, LengthscaleSelection::marginal_likelihood}) {
    Options o;
    o.lengthscale_selection = sel;
    o.noise = 1e-2;

    // One candidate, off the built-in grid: it must be taken.
    o.lengthscale_grid = {0.8};
    const optex::LengthscaleChoice single = optex::select_lengthscale(h, o, 0.1);
    EXPECT_TRUE(single.changed);
    EXPECT_NEAR(single.lengthscale, 0.8 * median, 1e-6 * median);

    // Several candidates, none on the built-in grid: the brute-force best of them.
    o.lengthscale_grid = {0.3, 0.7, 1.3, 2.9, 6.1};
    const optex::LengthscaleChoice c = optex::select_lengthscale(h, o, 0.1);
    const BruteChoice brute = brute_force_choice(h, o, o.lengthscale_grid);
    EXPECT_TRUE(c.changed);
    EXPECT_NEAR(c.lengthscale, brute.multiple * median, 1e-6 * median);
    EXPECT_NEAR(c.score, brute.score, 1e-5 * (1.0 + std::abs(brute.score)));
  }
}

// The criteria are not flat on these histories, so the agreement above is not vacuous.
TEST(SelectLengthscale, CriteriaDistinguishCandidates) {
  const GradientHistory h = smooth_history(6, 5, 5);
  const double median = median_distance(h);
  for (Covariance k : {Covariance::matern52, Covariance::rbf}) {
    const double loo_small = brute_force_loo(h, k, 0.125 * median, 1e-2);
    const double loo_large = brute_force_loo(h, k, 4.0 * median, 1e-2);
    EXPECT_GT(std::abs(loo_small - loo_large), 1e-3 * std::max(loo_small, loo_large));
    const double ml_small = brute_force_marginal(h, k, 0.125 * median, 1e-2);
    const double ml_large = brute_force_marginal(h, k, 4.0 * median, 1e-2);
    EXPECT_GT(std::abs(ml_small - ml_large), 1e-2);
  }
}

}  // namespace
