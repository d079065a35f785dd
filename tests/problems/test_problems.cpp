// Tests of the shipped test problems (optex/problems/problems.hpp): formulas, gradients,
// minima, input validation, the Rotated and WithGradientNoise wrappers, and the
// Ellipsoid and NoisyQuadratic quadratics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "optex/problems/problems.hpp"

namespace {

using optex::problems::Ackley;
using optex::problems::Domain;
using optex::problems::Ellipsoid;
using optex::problems::Griewank;
using optex::problems::Levy;
using optex::problems::NoisyQuadratic;
using optex::problems::Rastrigin;
using optex::problems::Rosenbrock;
using optex::problems::Rotated;
using optex::problems::Schwefel;
using optex::problems::Sphere;
using optex::problems::StyblinskiTang;
using optex::problems::TestProblem;
using optex::problems::uniform_start;
using optex::problems::WithGradientNoise;

static_assert(TestProblem<Sphere> && TestProblem<Rosenbrock> && TestProblem<Ackley> &&
              TestProblem<Rastrigin> && TestProblem<Levy> && TestProblem<Griewank> &&
              TestProblem<StyblinskiTang> && TestProblem<Schwefel>);
static_assert(TestProblem<Rotated<Rastrigin>> && TestProblem<WithGradientNoise<Sphere>> &&
              TestProblem<Rotated<WithGradientNoise<Levy>>>);
static_assert(TestProblem<Ellipsoid> && TestProblem<Rotated<Ellipsoid>> &&
              TestProblem<NoisyQuadratic> && TestProblem<Rotated<NoisyQuadratic>>);

// ---- helpers ------------------------------------------------------------------

// Passes when f() throws std::invalid_argument whose what() contains every needle.
template <class F>
::testing::AssertionResult ThrowsInvalidArgument(F f, std::vector<std::string> needles) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    for (const std::string& n : needles) {
      if (what.find(n) == std::string::npos) {
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << n << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something other than std::invalid_argument";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

template <class P>
std::vector<float> GradientOf(const P& p, std::span<const float> x) {
  std::vector<float> g(x.size());
  p.Gradient(x, g);
  return g;
}

// Rounds every coordinate to a multiple of 2^-10: then x_i +- 2^-k (k >= 10) is
// exactly representable in float for |x_i| < 1024, so central differences taken
// with such steps are symmetric about x.
std::vector<float> Snap(std::vector<float> x) {
  for (float& v : x) v = std::ldexp(std::round(std::ldexp(v, 10)), -10);
  return x;
}

// Central differences (f(x + h e_i) - f(x - h e_i)) / 2h of the float-input
// function, which evaluates in double.
template <class P>
std::vector<double> CentralDifferences(const P& p, std::span<const float> x0, double h) {
  std::vector<float> x(x0.begin(), x0.end());
  std::vector<double> fd(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x0[i];
    const float xp = static_cast<float>(xi + h);
    const float xm = static_cast<float>(xi - h);
    EXPECT_EQ(xp - xi, xi - xm) << "asymmetric step: snap the point first";
    x[i] = xp;
    const double fp = p.Evaluate(x);
    x[i] = xm;
    const double fm = p.Evaluate(x);
    x[i] = x0[i];
    fd[i] = (fp - fm) / (2.0 * h);
  }
  return fd;
}

// |g_i - fd_i| <= rtol * max_j |fd_j| + atol for every coordinate.
template <class P>
void ExpectGradientMatchesDifferences(const P& p, std::span<const float> x, double h, double rtol) {
  const std::vector<float> g = GradientOf(p, x);
  const std::vector<double> fd = CentralDifferences(p, x, h);
  double scale = 0.0;
  for (const double v : fd) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(g[i], fd[i], rtol * scale + 1e-7) << "coordinate " << i << " of d = " << x.size();
  }
}

double MaxAbs(std::span<const float> v) {
  double m = 0.0;
  for (const float e : v) m = std::max(m, std::abs(static_cast<double>(e)));
  return m;
}

// The smallest dimension a problem accepts.
template <class P>
std::size_t MinDim() {
  return std::is_same_v<P, Rosenbrock> ? 2 : 1;
}

// ---- every problem: typed tests -------------------------------------------------

template <class P>
class ProblemTest : public ::testing::Test {};

struct ProblemName {
  template <class P>
  static std::string GetName(int) {
    return std::string(P{}.name());
  }
};

using AllProblems = ::testing::Types<Sphere, Rosenbrock, Ackley, Rastrigin, Levy, Griewank,
                                     StyblinskiTang, Schwefel>;
TYPED_TEST_SUITE(ProblemTest, AllProblems, ProblemName);

TYPED_TEST(ProblemTest, GradientMatchesFiniteDifferences) {
  const TypeParam p;
  const Domain box = p.domain();
  for (const std::size_t d : {2, 5, 17}) {
    const std::vector<float> xstar = p.minimizer(d);
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE("d = " + std::to_string(d) + ", seed = " + std::to_string(seed));
      // Anywhere in the box, and within 1 of the minimiser, where the ripples of
      // the multimodal problems dominate the gradient.
      constexpr double kStep = 0x1p-12;
      ExpectGradientMatchesDifferences(p, Snap(uniform_start(d, box.lower, box.upper, seed)), kStep,
                                       1e-5);
      const double c = xstar[0];
      ExpectGradientMatchesDifferences(p, Snap(uniform_start(d, c - 1.0, c + 1.0, 100 + seed)),
                                       kStep, 1e-5);
    }
  }
}

TYPED_TEST(ProblemTest, EvaluateWithGradientAgreesExactly) {
  const TypeParam p;
  for (const std::size_t d : {2, 5, 17}) {
    std::vector<std::vector<float>> points = {p.standard_start(d), p.minimizer(d)};
    points.push_back(uniform_start(d, p.domain(), 7));
    for (const std::vector<float>& x : points) {
      std::vector<float> g(d);
      const double f = p.EvaluateWithGradient(x, g);
      EXPECT_EQ(f, p.Evaluate(x));
      EXPECT_EQ(g, GradientOf(p, x));
    }
  }
}

TYPED_TEST(ProblemTest, MinimizerAttainsMinimum) {
  const TypeParam p;
  for (const std::size_t d :
       {MinDim<TypeParam>(), std::size_t{2}, std::size_t{5}, std::size_t{17}, std::size_t{100}}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    const std::vector<float> xstar = p.minimizer(d);
    ASSERT_EQ(xstar.size(), d);
    for (const float v : xstar) EXPECT_TRUE(p.domain().contains(v));
    const double fstar = p.minimum(d);
    const double tol = 1e-6 * static_cast<double>(d);
    EXPECT_NEAR(p.Evaluate(xstar), fstar, tol);
    const std::vector<float> g = GradientOf(p, xstar);
    for (const float gi : g) EXPECT_TRUE(std::isfinite(gi));
    EXPECT_LT(MaxAbs(g), 1e-4);
    // And it is a minimum: random points near it are no better.
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      std::vector<float> x = xstar;
      const std::vector<float> dx = uniform_start(d, -0.05, 0.05, seed);
      for (std::size_t i = 0; i < d; ++i) x[i] += dx[i];
      EXPECT_GE(p.Evaluate(x), fstar - tol);
    }
  }
}

TYPED_TEST(ProblemTest, StandardStartIsAnInformativeNonMinimiser) {
  const TypeParam p;
  for (const std::size_t d : {std::size_t{2}, std::size_t{5}, std::size_t{100}}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    const std::vector<float> x = p.standard_start(d);
    ASSERT_EQ(x.size(), d);
    for (const float v : x) EXPECT_TRUE(p.domain().contains(v));
    EXPECT_GT(p.Evaluate(x) - p.minimum(d), 1e-2);
    EXPECT_GT(MaxAbs(GradientOf(p, x)), 1e-2);
  }
}

TYPED_TEST(ProblemTest, RejectsBadInput) {
  const TypeParam p;
  const std::string need_d = "must be >= " + std::to_string(MinDim<TypeParam>());
  std::vector<float> g0;
  EXPECT_TRUE(
      ThrowsInvalidArgument([&] { (void)p.Evaluate({}); }, {"x: dimension", need_d, "got 0"}));
  EXPECT_TRUE(
      ThrowsInvalidArgument([&] { p.Gradient({}, g0); }, {"x: dimension", need_d, "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.standard_start(0); }, {"d: ", need_d, "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.minimizer(0); }, {"d: ", need_d, "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.minimum(0); }, {"d: ", need_d, "got 0"}));

  const std::vector<float> x = p.standard_start(5);
  std::vector<float> g(4);
  EXPECT_TRUE(ThrowsInvalidArgument([&] { p.Gradient(x, g); }, {"g: ", "5", "got 4"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.EvaluateWithGradient(x, g); }, {"g: ", "4"}));
  // g overlapping x would be read while written.
  std::vector<float> buf = x;
  EXPECT_TRUE(ThrowsInvalidArgument([&] { p.Gradient(buf, buf); }, {"g: ", "overlap"}));
}

TYPED_TEST(ProblemTest, ConcurrentCallsAgree) {
  const TypeParam p;
  const std::vector<float> x = uniform_start(33, p.domain(), 11);
  const double f = p.Evaluate(x);
  const std::vector<float> g = GradientOf(p, x);
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < ok.size(); ++t) {
    threads.emplace_back([&, t] {
      bool same = true;
      for (int rep = 0; rep < 200; ++rep) {
        same = same && p.Evaluate(x) == f && GradientOf(p, x) == g;
      }
      ok[t] = same ? 1 : 0;
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// ---- spot values ------------------------------------------------------------------

TEST(ProblemNames, AreTheDocumentedOnes) {
  EXPECT_EQ(Sphere{}.name(), "sphere");
  EXPECT_EQ(Rosenbrock{}.name(), "rosenbrock");
  EXPECT_EQ(Ackley{}.name(), "ackley");
  EXPECT_EQ(Rastrigin{}.name(), "rastrigin");
  EXPECT_EQ(Levy{}.name(), "levy");
  EXPECT_EQ(Griewank{}.name(), "griewank");
  EXPECT_EQ(StyblinskiTang{}.name(), "styblinski_tang");
  EXPECT_EQ(Schwefel{}.name(), "schwefel");
}

TEST(SpotValues, Sphere) {
  const std::vector<float> x = {1.0f, 2.0f, -3.0f};
  EXPECT_DOUBLE_EQ(Sphere{}.Evaluate(x), 14.0);
  EXPECT_EQ(GradientOf(Sphere{}, x), (std::vector<float>{2.0f, 4.0f, -6.0f}));
}

TEST(SpotValues, Rosenbrock) {
  const std::vector<float> x = Rosenbrock{}.standard_start(2);
  EXPECT_EQ(x, (std::vector<float>{-1.2f, 1.0f}));
  // (-1.2, 1): 100 (1 - 1.44)^2 + 2.2^2 = 24.2, gradient (-215.6, -88). Tolerances
  // allow for -1.2 not being a float.
  EXPECT_NEAR(Rosenbrock{}.Evaluate(x), 24.2, 1e-4);
  const std::vector<float> g = GradientOf(Rosenbrock{}, x);
  EXPECT_NEAR(g[0], -215.6, 1e-3);
  EXPECT_NEAR(g[1], -88.0, 1e-3);
  EXPECT_EQ(Rosenbrock{}.standard_start(5), (std::vector<float>{-1.2f, 1, -1.2f, 1, -1.2f}));
  // At 0 each of the d-1 terms contributes (0 - 1)^2.
  EXPECT_DOUBLE_EQ(Rosenbrock{}.Evaluate(std::vector<float>(4, 0.0f)), 3.0);
}

TEST(SpotValues, Rastrigin) {
  EXPECT_DOUBLE_EQ(Rastrigin{}.Evaluate(std::vector<float>{1.0f, 1.0f}), 2.0);
  // At x = 0.5 each coordinate contributes 10 + 0.25 + 10.
  EXPECT_NEAR(Rastrigin{}.Evaluate(std::vector<float>(3, 0.5f)), 3 * 20.25, 1e-12);
}

TEST(SpotValues, Ackley) {
  // At x = 1 in any d: r = 1 and every cosine is 1, so f = 20 - 20 exp(-0.2).
  for (const std::size_t d : {1, 2, 7, 1000}) {
    EXPECT_NEAR(Ackley{}.Evaluate(std::vector<float>(d, 1.0f)), 3.6253849384403622, 1e-12);
  }
  // A general point, recomputed here from the formula written out longhand.
  const std::vector<float> x = {0.5f, -1.5f, 2.25f};
  const double r = std::sqrt((0.25 + 2.25 + 5.0625) / 3.0);
  const double c = (std::cos(std::numbers::pi) + std::cos(-3.0 * std::numbers::pi) +
                    std::cos(4.5 * std::numbers::pi)) /
                   3.0;
  const double expected = -20.0 * std::exp(-0.2 * r) - std::exp(c) + 20.0 + std::exp(1.0);
  EXPECT_NEAR(Ackley{}.Evaluate(x), expected, 1e-12);
  // The gradient at the origin, where r = 0, is guarded to a finite 0.
  std::vector<float> g(4, 1.0f);
  EXPECT_NEAR(Ackley{}.EvaluateWithGradient(std::vector<float>(4, 0.0f), g), 0.0, 1e-12);
  EXPECT_EQ(g, std::vector<float>(4, 0.0f));
}

TEST(SpotValues, Levy) {
  // x = (5, 5): w = 2, so sin^2(2 pi) = 0, the middle term is 1 + 10 sin^2(1), the
  // last is 1 + sin^2(4 pi) = 1.
  EXPECT_NEAR(Levy{}.Evaluate(std::vector<float>{5.0f, 5.0f}), 9.08073418273571, 1e-12);
  EXPECT_NEAR(Levy{}.Evaluate(std::vector<float>{5.0f, 5.0f}),
              2.0 + 10.0 * std::pow(std::sin(1.0), 2), 1e-12);
  // d = 1 has only the first and the last term: 0 + 1 * (1 + 0).
  EXPECT_NEAR(Levy{}.Evaluate(std::vector<float>{5.0f}), 1.0, 1e-12);
  // A 4-D point, recomputed longhand.
  const std::vector<float> x = {-3.0f, 0.5f, 2.0f, 7.0f};
  double expected = std::pow(std::sin(std::numbers::pi * 0.0), 2);  // w_1 = 0
  for (const double w : {0.0, 0.875, 1.25}) {
    expected += (w - 1) * (w - 1) * (1 + 10 * std::pow(std::sin(std::numbers::pi * w + 1), 2));
  }
  expected += 1.5 * 1.5 * (1 + std::pow(std::sin(2 * std::numbers::pi * 2.5), 2));  // w_4 = 2.5
  EXPECT_NEAR(Levy{}.Evaluate(x), expected, 1e-12);
}

TEST(SpotValues, Griewank) {
  EXPECT_NEAR(Griewank{}.Evaluate(std::vector<float>{1.0f, 2.0f}), 0.9169932621326707, 1e-12);
  const std::vector<float> x = {10.0f, -20.0f, 30.0f};
  const double expected =
      (100.0 + 400.0 + 900.0) / 4000.0 -
      std::cos(10.0) * std::cos(-20.0 / std::sqrt(2.0)) * std::cos(30.0 / std::sqrt(3.0)) + 1.0;
  EXPECT_NEAR(Griewank{}.Evaluate(x), expected, 1e-12);
  // Its gradient by the product rule, written out.
  const double c1 = std::cos(10.0);
  const double c2 = std::cos(-20.0 / std::sqrt(2.0));
  const double c3 = std::cos(30.0 / std::sqrt(3.0));
  const std::vector<float> g = GradientOf(Griewank{}, x);
  EXPECT_NEAR(g[0], 10.0 / 2000 + std::sin(10.0) * c2 * c3, 1e-7);
  EXPECT_NEAR(g[1], -20.0 / 2000 + std::sin(-20.0 / std::sqrt(2.0)) / std::sqrt(2.0) * c1 * c3,
              1e-7);
  EXPECT_NEAR(g[2], 30.0 / 2000 + std::sin(30.0 / std::sqrt(3.0)) / std::sqrt(3.0) * c1 * c2, 1e-7);
}

TEST(SpotValues, StyblinskiTang) {
  // (1, -1): 0.5 [(1 - 16 + 5) + (1 - 16 - 5)] = -15.
  EXPECT_DOUBLE_EQ(StyblinskiTang{}.Evaluate(std::vector<float>{1.0f, -1.0f}), -15.0);
  EXPECT_DOUBLE_EQ(StyblinskiTang{}.minimum(3), -39.16616570 * 3);
  EXPECT_EQ(GradientOf(StyblinskiTang{}, std::vector<float>{0.0f, 1.0f}),
            (std::vector<float>{2.5f, -11.5f}));
}

TEST(SpotValues, Schwefel) {
  EXPECT_NEAR(Schwefel{}.Evaluate(std::vector<float>{1.0f, 4.0f}), 833.4871138527569, 1e-9);
  EXPECT_NEAR(Schwefel{}.Evaluate(std::vector<float>{1.0f, 4.0f}),
              2 * 418.9828872724338 - (std::sin(1.0) + 4.0 * std::sin(2.0)), 1e-9);
  // The sign convention: the minimum is 0 (not about -419 d) at x_i = 420.968746.
  const std::vector<float> xstar(3, 420.968746f);
  EXPECT_NEAR(Schwefel{}.Evaluate(xstar), 0.0, 1e-9);
  EXPECT_GT(Schwefel{}.Evaluate(std::vector<float>(3, -420.968746f)), 1000.0);
  // The gradient is finite and 0 at x = 0, where sqrt(|x|) has a kink.
  EXPECT_EQ(GradientOf(Schwefel{}, std::vector<float>{0.0f}), std::vector<float>{0.0f});
}

TEST(SpotValues, RosenbrockNeedsTwoCoordinates) {
  const std::vector<float> x = {1.0f};
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)Rosenbrock{}.Evaluate(x); },
                                    {"x: dimension must be >= 2", "got 1", "rosenbrock"}));
  EXPECT_TRUE(ThrowsInvalidArgument([] { (void)Rosenbrock{}.minimizer(1); }, {"d: ", "got 1"}));
  EXPECT_TRUE(ThrowsInvalidArgument([] { (void)Rosenbrock{}.standard_start(1); }, {"d: "}));
}

// ---- uniform_start ------------------------------------------------------------

TEST(UniformStart, IsSeededAndInsideTheBox) {
  const std::vector<float> a = uniform_start(1000, -5.12, 5.12, 3);
  EXPECT_EQ(a, uniform_start(1000, Domain{-5.12, 5.12}, 3));
  EXPECT_NE(a, uniform_start(1000, -5.12, 5.12, 4));
  double lo = 1e9;
  double hi = -1e9;
  for (const float v : a) {
    EXPECT_TRUE(Domain({-5.12, 5.12}).contains(v));
    lo = std::min(lo, static_cast<double>(v));
    hi = std::max(hi, static_cast<double>(v));
  }
  EXPECT_LT(lo, -5.0);  // it spreads over the box
  EXPECT_GT(hi, 5.0);
  EXPECT_TRUE(ThrowsInvalidArgument([] { (void)uniform_start(0, 0.0, 1.0, 1); }, {"d: "}));
  EXPECT_TRUE(ThrowsInvalidArgument([] { (void)uniform_start(3, 1.0, 1.0, 1); }, {"lo, hi"}));
  EXPECT_TRUE(ThrowsInvalidArgument([] { (void)uniform_start(3, 0.0, NAN, 1); }, {"lo, hi"}));
}

// ---- Rotated ------------------------------------------------------------------

TEST(Rotated, RotationIsOrthogonal) {
  const std::size_t d = 23;
  const Rotated<Sphere> rs(Sphere{}, d, 5);
  const std::span<const float> q = rs.rotation();
  ASSERT_EQ(q.size(), d * d);
  double worst = 0.0;
  for (std::size_t i = 0; i < d; ++i) {
    for (std::size_t j = 0; j < d; ++j) {
      double dot = 0.0;  // (Q^T Q)_ij
      for (std::size_t k = 0; k < d; ++k) {
        dot += static_cast<double>(q[k * d + i]) * static_cast<double>(q[k * d + j]);
      }
      worst = std::max(worst, std::abs(dot - (i == j ? 1.0 : 0.0)));
    }
  }
  EXPECT_LT(worst, 1e-6);
  // Sphere is rotation invariant: ||Q x||^2 == ||x||^2, and the gradient stays 2 x.
  const std::vector<float> x = uniform_start(d, -3.0, 3.0, 9);
  EXPECT_NEAR(rs.Evaluate(x), Sphere{}.Evaluate(x), 1e-5 * Sphere{}.Evaluate(x));
  const std::vector<float> g = GradientOf(rs, x);
  for (std::size_t i = 0; i < d; ++i) EXPECT_NEAR(g[i], 2.0 * x[i], 1e-5);
}

TEST(Rotated, MatchesAnExplicitRotation) {
  const std::size_t d = 7;
  const Rastrigin base;
  const Rotated<Rastrigin> rr(base, d, 17);
  const std::span<const float> q = rr.rotation();
  const std::vector<float> x = uniform_start(d, -2.0, 2.0, 4);
  std::vector<float> y(d);
  for (std::size_t i = 0; i < d; ++i) {
    double acc = 0.0;
    for (std::size_t j = 0; j < d; ++j) acc += static_cast<double>(q[i * d + j]) * x[j];
    y[i] = static_cast<float>(acc);
  }
  EXPECT_NEAR(rr.Evaluate(x), base.Evaluate(y), 1e-9);
  const std::vector<float> gy = GradientOf(base, y);
  const std::vector<float> g = GradientOf(rr, x);
  for (std::size_t j = 0; j < d; ++j) {
    double acc = 0.0;  // (Q^T gy)_j
    for (std::size_t i = 0; i < d; ++i) acc += static_cast<double>(q[i * d + j]) * gy[i];
    EXPECT_NEAR(g[j], acc, 1e-4);
  }
}

TEST(Rotated, SeedDeterminesTheFunction) {
  const Rotated<Rastrigin> a(Rastrigin{}, 6, 42);
  const Rotated<Rastrigin> b(Rastrigin{}, 6, 42);
  const Rotated<Rastrigin> c(Rastrigin{}, 6, 43);
  const std::vector<float> x = uniform_start(6, -2.0, 2.0, 1);
  EXPECT_TRUE(std::ranges::equal(a.rotation(), b.rotation()));
  EXPECT_EQ(a.Evaluate(x), b.Evaluate(x));
  EXPECT_EQ(GradientOf(a, x), GradientOf(b, x));
  EXPECT_FALSE(std::ranges::equal(a.rotation(), c.rotation()));
  EXPECT_NE(a.Evaluate(x), c.Evaluate(x));
}

// Q x is rounded to float before the base sees it, which adds noise of relative
// size ~1e-7 to f: a larger step (step, about the problem's feature scale) and
// tolerance absorb it.
template <class P>
void ExpectRotatedGradientMatchesDifferences(const P& base, double step = 0x1p-7) {
  for (const std::size_t d : {2, 5, 17}) {
    const Rotated<P> r(base, d, 1000 + d);
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(std::string(r.name()) + ", d = " + std::to_string(d));
      const std::vector<float> x = r.minimizer(d);
      std::vector<float> x0 = uniform_start(d, -1.5, 1.5, seed);
      for (std::size_t i = 0; i < d; ++i) x0[i] += x[i];
      ExpectGradientMatchesDifferences(r, Snap(x0), step, 2e-3);
    }
  }
}

TEST(Rotated, GradientMatchesFiniteDifferences) {
  ExpectRotatedGradientMatchesDifferences(Sphere{});
  ExpectRotatedGradientMatchesDifferences(Rosenbrock{});
  ExpectRotatedGradientMatchesDifferences(Ackley{});
  ExpectRotatedGradientMatchesDifferences(Rastrigin{});
  ExpectRotatedGradientMatchesDifferences(Levy{});
  ExpectRotatedGradientMatchesDifferences(Griewank{});
  ExpectRotatedGradientMatchesDifferences(StyblinskiTang{});
  ExpectRotatedGradientMatchesDifferences(Schwefel{}, 0x1p-2);  // Schwefel's ripples are wide
}

template <class P>
void ExpectRotatedMinimumAndStart(const P& base, std::size_t d) {
  SCOPED_TRACE(std::string(base.name()) + ", d = " + std::to_string(d));
  const Rotated<P> r(base, d, 77);
  EXPECT_EQ(r.name(), "rotated_" + std::string(base.name()));
  EXPECT_EQ(r.minimum(d), base.minimum(d));
  EXPECT_NEAR(r.Evaluate(r.minimizer(d)), base.minimum(d), 1e-6 * static_cast<double>(d));
  EXPECT_LT(MaxAbs(GradientOf(r, r.minimizer(d))), 1e-3);
  const double f0 = base.Evaluate(base.standard_start(d));
  EXPECT_NEAR(r.Evaluate(r.standard_start(d)), f0, 1e-5 * std::max(1.0, std::abs(f0)));
  EXPECT_EQ(r.domain().lower, base.domain().lower);
  EXPECT_EQ(r.domain().upper, base.domain().upper);
}

TEST(Rotated, MinimizerAndStartMapThrough) {
  for (const std::size_t d : {2, 9, 40}) {
    ExpectRotatedMinimumAndStart(Sphere{}, d);
    ExpectRotatedMinimumAndStart(Rosenbrock{}, d);
    ExpectRotatedMinimumAndStart(Ackley{}, d);
    ExpectRotatedMinimumAndStart(Rastrigin{}, d);
    ExpectRotatedMinimumAndStart(Levy{}, d);
    ExpectRotatedMinimumAndStart(Griewank{}, d);
    ExpectRotatedMinimumAndStart(StyblinskiTang{}, d);
    ExpectRotatedMinimumAndStart(Schwefel{}, d);
  }
}

TEST(Rotated, BreaksSeparability) {
  // For separable Rastrigin, dF/dx_0 ignores x_1; after rotation it does not.
  const std::size_t d = 6;
  const Rastrigin base;
  const Rotated<Rastrigin> r(base, d, 3);
  std::vector<float> x = uniform_start(d, -2.0, 2.0, 8);
  std::vector<float> x2 = x;
  x2[1] += 0.3f;
  EXPECT_EQ(GradientOf(base, x)[0], GradientOf(base, x2)[0]);
  EXPECT_GT(std::abs(GradientOf(r, x)[0] - GradientOf(r, x2)[0]), 1e-2);
}

TEST(Rotated, RejectsBadInput) {
  EXPECT_TRUE(
      ThrowsInvalidArgument([] { Rotated<Sphere>(Sphere{}, 4097, 1); }, {"d: ", "4096", "4097"}));
  EXPECT_TRUE(ThrowsInvalidArgument([] { Rotated<Sphere>(Sphere{}, 0, 1); }, {"d: ", "got 0"}));
  EXPECT_TRUE(
      ThrowsInvalidArgument([] { Rotated<Rosenbrock>(Rosenbrock{}, 1, 1); }, {"d: ", ">= 2"}));
  const Rotated<Levy> r(Levy{}, 5, 1);
  const std::vector<float> x3(3, 0.0f);
  const std::vector<float> x5(5, 0.0f);
  std::vector<float> g4(4);
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)r.Evaluate(x3); }, {"x: ", "5", "got 3"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)r.Evaluate({}); }, {"x: ", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { r.Gradient(x5, g4); }, {"g: ", "5", "got 4"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)r.minimizer(4); }, {"d: ", "5", "got 4"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)r.standard_start(0); }, {"d: "}));
}

TEST(Rotated, EvaluateWithGradientAgreesExactly) {
  const Rotated<Griewank> r(Griewank{}, 12, 2);
  const std::vector<float> x = uniform_start(12, -50.0, 50.0, 3);
  std::vector<float> g(12);
  EXPECT_EQ(r.EvaluateWithGradient(x, g), r.Evaluate(x));
  EXPECT_EQ(g, GradientOf(r, x));
}

// ---- WithGradientNoise ------------------------------------------------------------

TEST(WithGradientNoise, SamePointSameNoise) {
  const WithGradientNoise<Rastrigin> p(Rastrigin{}, 0.5, 9);
  const WithGradientNoise<Rastrigin> copy = p;
  const std::vector<float> x = uniform_start(50, -3.0, 3.0, 1);
  const std::vector<float> g = GradientOf(p, x);
  EXPECT_EQ(g, GradientOf(p, x));
  EXPECT_EQ(g, GradientOf(copy, x));
  std::vector<float> g_thread;
  std::thread([&] { g_thread = GradientOf(p, x); }).join();
  EXPECT_EQ(g, g_thread);
  // And it is noise: it differs from the exact gradient.
  EXPECT_NE(g, GradientOf(Rastrigin{}, x));
}

TEST(WithGradientNoise, DependsOnSeedAndPoint) {
  const WithGradientNoise<Sphere> a(Sphere{}, 1.0, 1);
  const WithGradientNoise<Sphere> b(Sphere{}, 1.0, 2);
  const std::vector<float> x = uniform_start(20, -1.0, 1.0, 5);
  const std::vector<float> ga = GradientOf(a, x);
  const std::vector<float> gb = GradientOf(b, x);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NE(ga[i], gb[i]);
  // A one-ulp change of x gives fresh noise (not the same noise shifted).
  std::vector<float> x2 = x;
  x2[0] = std::nextafter(x2[0], 2.0f);
  const std::vector<float> ga2 = GradientOf(a, x2);
  EXPECT_GT(std::abs(ga2[5] - ga[5]), 1e-6);
}

TEST(WithGradientNoise, HasMeanZeroAndStandardDeviationSigma) {
  // At x = 0 the Sphere gradient is 0, so g is pure noise.
  const std::size_t d = 200000;
  const double sigma = 0.5;
  const WithGradientNoise<Sphere> p(Sphere{}, sigma, 123);
  const std::vector<float> g = GradientOf(p, std::vector<float>(d, 0.0f));
  double sum = 0.0;
  double sum_sq = 0.0;
  std::size_t within_one_sigma = 0;
  for (const float v : g) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    if (std::abs(v) < sigma) ++within_one_sigma;
  }
  const double n = static_cast<double>(d);
  const double mean = sum / n;
  const double sd = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_LT(std::abs(mean), 5.0 * sigma / std::sqrt(n));              // ~0.0056
  EXPECT_LT(std::abs(sd - sigma), 5.0 * sigma / std::sqrt(2.0 * n));  // ~0.004
  // Gaussian, not merely the right variance: P(|z| < 1) = 0.6827 (uniform: 0.577).
  EXPECT_NEAR(static_cast<double>(within_one_sigma) / n, 0.6827, 0.005);
}

TEST(WithGradientNoise, LossIsExactAndOtherMembersForward) {
  const Levy base;
  const WithGradientNoise<Levy> p(base, 2.0, 4);
  const std::vector<float> x = uniform_start(8, base.domain(), 6);
  EXPECT_EQ(p.Evaluate(x), base.Evaluate(x));
  std::vector<float> g(8);
  EXPECT_EQ(p.EvaluateWithGradient(x, g), base.Evaluate(x));
  EXPECT_EQ(g, GradientOf(p, x));  // same noise as Gradient
  EXPECT_EQ(p.name(), base.name());
  EXPECT_EQ(p.minimum(8), base.minimum(8));
  EXPECT_EQ(p.minimizer(8), base.minimizer(8));
  EXPECT_EQ(p.standard_start(8), base.standard_start(8));
  EXPECT_EQ(p.domain().upper, base.domain().upper);
  EXPECT_EQ(p.sigma(), 2.0);
  // sigma = 0 is the exact gradient.
  const WithGradientNoise<Levy> exact(base, 0.0, 4);
  EXPECT_EQ(GradientOf(exact, x), GradientOf(base, x));
}

TEST(WithGradientNoise, RejectsBadInput) {
  EXPECT_TRUE(ThrowsInvalidArgument([] { WithGradientNoise<Sphere>(Sphere{}, -0.1, 1); },
                                    {"sigma", "-0.1"}));
  EXPECT_TRUE(
      ThrowsInvalidArgument([] { WithGradientNoise<Sphere>(Sphere{}, NAN, 1); }, {"sigma"}));
  EXPECT_TRUE(
      ThrowsInvalidArgument([] { WithGradientNoise<Sphere>(Sphere{}, INFINITY, 1); }, {"sigma"}));
  const WithGradientNoise<Sphere> p(Sphere{}, 1.0, 1);
  std::vector<float> g(2);
  EXPECT_TRUE(ThrowsInvalidArgument([&] { p.Gradient({}, g); }, {"x: dimension", "got 0"}));
  EXPECT_TRUE(
      ThrowsInvalidArgument([&] { p.Gradient(std::vector<float>(3), g); }, {"g: ", "3", "got 2"}));
}

// ---- Ellipsoid ------------------------------------------------------------------

TEST(Ellipsoid, CurvaturesAreLogSpacedFromOneOverKappaToOne) {
  for (const double kappa : {1.0, 1e2, 1e4, 1e6}) {
    const Ellipsoid e(kappa);
    EXPECT_EQ(e.condition_number(), kappa);
    for (const std::size_t d : {2, 7, 200}) {
      SCOPED_TRACE("kappa = " + std::to_string(kappa) + ", d = " + std::to_string(d));
      EXPECT_NEAR(e.curvature(d - 1, d), 1.0, 1e-15);
      EXPECT_NEAR(e.curvature(0, d), 1.0 / kappa, 1e-12 / kappa);
      const double ratio = std::pow(kappa, 1.0 / static_cast<double>(d - 1));
      for (std::size_t i = 0; i + 1 < d; ++i) {
        EXPECT_NEAR(e.curvature(i + 1, d) / e.curvature(i, d), ratio, 1e-12 * ratio);
      }
    }
    EXPECT_EQ(e.curvature(0, 1), 1.0);  // one coordinate: the largest curvature
  }
}

TEST(Ellipsoid, SpotValues) {
  // d = 3, kappa = 100: curvatures 0.01, 0.1, 1.
  const Ellipsoid e(100.0);
  const std::vector<float> x = {2.0f, -1.0f, 0.5f};
  EXPECT_NEAR(e.Evaluate(x), 0.5 * (0.01 * 4.0 + 0.1 * 1.0 + 1.0 * 0.25), 1e-15);
  const std::vector<float> g = GradientOf(e, x);
  EXPECT_NEAR(g[0], 0.02, 1e-8);
  EXPECT_NEAR(g[1], -0.1, 1e-8);
  EXPECT_EQ(g[2], 0.5f);
  EXPECT_EQ(e.name(), "ellipsoid");
}

TEST(Ellipsoid, GradientMatchesFiniteDifferences) {
  for (const double kappa : {1.0, 1e2, 1e4, 1e6}) {
    const Ellipsoid e(kappa);
    for (const std::size_t d : {1, 2, 5, 17}) {
      for (std::uint64_t seed = 1; seed <= 3; ++seed) {
        SCOPED_TRACE("kappa = " + std::to_string(kappa) + ", d = " + std::to_string(d));
        ExpectGradientMatchesDifferences(e, Snap(uniform_start(d, e.domain(), seed)), 0x1p-12,
                                         1e-5);
        ExpectGradientMatchesDifferences(e, Snap(uniform_start(d, -20.0, 20.0, 50 + seed)), 0x1p-12,
                                         1e-5);
      }
    }
  }
}

TEST(Ellipsoid, RotatedGradientMatchesFiniteDifferences) {
  ExpectRotatedGradientMatchesDifferences(Ellipsoid{1e2});
  ExpectRotatedGradientMatchesDifferences(Ellipsoid{1e4});
  ExpectRotatedGradientMatchesDifferences(Ellipsoid{1e6});
}

TEST(Ellipsoid, RotatedIsHalfTheCurvatureWeightedSquaresOfQx) {
  const std::size_t d = 9;
  const Ellipsoid base(1e4);
  const Rotated<Ellipsoid> r(base, d, 21);
  const std::span<const float> q = r.rotation();
  const std::vector<float> x = uniform_start(d, -1.0, 1.0, 2);
  double expected = 0.0;
  for (std::size_t i = 0; i < d; ++i) {
    double qx = 0.0;
    for (std::size_t j = 0; j < d; ++j) qx += static_cast<double>(q[i * d + j]) * x[j];
    expected += 0.5 * base.curvature(i, d) * qx * qx;
  }
  EXPECT_NEAR(r.Evaluate(x), expected, 1e-6 * expected);
  // Along row i of Q (a unit vector, Q x = e_i up to rounding) f is lambda_i / 2: the
  // curvatures run from 1/kappa to 1 in the rotated coordinates too.
  for (const std::size_t i : {std::size_t{0}, d - 1}) {
    const std::vector<float> row(q.begin() + static_cast<std::ptrdiff_t>(i * d),
                                 q.begin() + static_cast<std::ptrdiff_t>((i + 1) * d));
    EXPECT_NEAR(r.Evaluate(row), 0.5 * base.curvature(i, d), 1e-6);
  }
}

TEST(Ellipsoid, MinimizerAttainsMinimum) {
  for (const double kappa : {1e2, 1e6}) {
    const Ellipsoid e(kappa);
    for (const std::size_t d : {1, 2, 17, 100}) {
      SCOPED_TRACE("d = " + std::to_string(d));
      const std::vector<float> xstar = e.minimizer(d);
      EXPECT_EQ(xstar, std::vector<float>(d, 0.0f));
      EXPECT_EQ(e.minimum(d), 0.0);
      EXPECT_EQ(e.Evaluate(xstar), 0.0);
      EXPECT_EQ(MaxAbs(GradientOf(e, xstar)), 0.0);
      for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        EXPECT_GT(e.Evaluate(uniform_start(d, -0.05, 0.05, seed)), 0.0);
      }
      const Rotated<Ellipsoid> r(e, d, 5);
      EXPECT_EQ(r.minimum(d), 0.0);
      EXPECT_NEAR(r.Evaluate(r.minimizer(d)), 0.0, 1e-12);
      EXPECT_LT(MaxAbs(GradientOf(r, r.minimizer(d))), 1e-6);
    }
    // The standard start is informative: f = (1/2) sum lambda_i.
    const std::vector<float> x0 = e.standard_start(5);
    double half_sum = 0.0;
    for (std::size_t i = 0; i < 5; ++i) half_sum += 0.5 * e.curvature(i, 5);
    EXPECT_NEAR(e.Evaluate(x0), half_sum, 1e-12);
  }
}

// A U(-1, 1)^d start has expected loss (1/6) sum lambda_i: O(d), at most d / 6.
TEST(Ellipsoid, RotatedLossAtAUniformStartIsOrderD) {
  const std::size_t d = 200;
  for (const double kappa : {1e2, 1e4, 1e6}) {
    SCOPED_TRACE("kappa = " + std::to_string(kappa));
    const Ellipsoid base(kappa);
    const Rotated<Ellipsoid> r(base, d, 7);
    double expected = 0.0;
    for (std::size_t i = 0; i < d; ++i) expected += base.curvature(i, d) / 6.0;
    // A sum of log-spaced curvatures lies between their integral over the index,
    // (d - 1)(1 - 1/kappa) / ln kappa, and that plus the largest, 1.
    const double integral =
        static_cast<double>(d - 1) * (1.0 - 1.0 / kappa) / std::log(kappa) / 6.0;
    EXPECT_GE(expected, integral);
    EXPECT_LE(expected, integral + 1.0 / 6.0);
    double mean = 0.0;
    constexpr int kStarts = 20;
    for (int s = 0; s < kStarts; ++s) {
      mean += r.Evaluate(uniform_start(d, -1.0, 1.0, static_cast<std::uint64_t>(s))) / kStarts;
    }
    EXPECT_NEAR(mean, expected, 0.15 * expected);
  }
}

// The largest curvature is 1: gradient descent converges for lr < 2 and diverges above.
TEST(Ellipsoid, GradientDescentIsStableBelowLearningRateTwo) {
  const std::size_t d = 40;
  const Rotated<Ellipsoid> r(Ellipsoid{1e6}, d, 3);
  const auto descend = [&](double lr, int steps) {
    std::vector<float> x = uniform_start(d, -1.0, 1.0, 4);
    std::vector<float> g(d);
    for (int t = 0; t < steps; ++t) {
      r.Gradient(x, g);
      for (std::size_t i = 0; i < d; ++i) x[i] -= static_cast<float>(lr) * g[i];
    }
    return r.Evaluate(x);
  };
  const double f0 = r.Evaluate(uniform_start(d, -1.0, 1.0, 4));
  EXPECT_LT(descend(1.9, 200), f0);
  EXPECT_LT(descend(1.0, 200), f0);
  EXPECT_GT(descend(2.1, 200), 1e3 * f0);
}

TEST(Ellipsoid, EvaluateWithGradientAgreesExactly) {
  const Ellipsoid e(1e4);
  for (const std::size_t d : {1, 5, 17}) {
    const std::vector<float> x = uniform_start(d, -3.0, 3.0, 8);
    std::vector<float> g(d);
    EXPECT_EQ(e.EvaluateWithGradient(x, g), e.Evaluate(x));
    EXPECT_EQ(g, GradientOf(e, x));
  }
}

TEST(Ellipsoid, RejectsBadInput) {
  for (const double kappa : {0.5, 0.0, -1.0, double{NAN}, double{INFINITY}}) {
    EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)Ellipsoid(kappa); },
                                      {"condition_number", "finite and >= 1"}));
  }
  const Ellipsoid e(1e2);
  std::vector<float> g0;
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)e.Evaluate({}); }, {"x: dimension", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { e.Gradient({}, g0); }, {"x: dimension", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)e.standard_start(0); }, {"d: ", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)e.minimizer(0); }, {"d: ", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)e.minimum(0); }, {"d: ", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)e.curvature(0, 0); }, {"d: ", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)e.curvature(3, 3); }, {"i: ", "< d = 3", "got 3"}));
  const std::vector<float> x(5, 1.0f);
  std::vector<float> g4(4);
  EXPECT_TRUE(ThrowsInvalidArgument([&] { e.Gradient(x, g4); }, {"g: ", "5", "got 4"}));
  std::vector<float> buf = x;
  EXPECT_TRUE(ThrowsInvalidArgument([&] { e.Gradient(buf, buf); }, {"g: ", "overlap"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { Rotated<Ellipsoid>(e, 0, 1); }, {"d: ", "got 0"}));
}

// ---- NoisyQuadratic ---------------------------------------------------------------

// Sum and sum of squares of every coordinate over many evaluations.
struct CoordinateMoments {
  std::vector<double> sum, sum_sq;
  int count = 0;

  explicit CoordinateMoments(std::size_t d) : sum(d, 0.0), sum_sq(d, 0.0) {}
  void add(std::span<const float> g) {
    for (std::size_t i = 0; i < g.size(); ++i) {
      sum[i] += g[i];
      sum_sq[i] += static_cast<double>(g[i]) * g[i];
    }
    ++count;
  }
  double mean(std::size_t i) const { return sum[i] / count; }
  double variance(std::size_t i) const { return sum_sq[i] / count - mean(i) * mean(i); }
};

TEST(NoisyQuadratic, LossIsTheNoiseFreeQuadraticWithCurvaturesOneOverI) {
  const NoisyQuadratic p(1.0, 3);
  EXPECT_EQ(p.name(), "noisy_quadratic");
  EXPECT_EQ(NoisyQuadratic::curvature(0), 1.0);
  EXPECT_EQ(NoisyQuadratic::curvature(3), 0.25);
  const std::vector<float> x = {2.0f, -1.0f, 3.0f, 0.5f};
  const double expected = 0.5 * (4.0 + 1.0 / 2.0 + 9.0 / 3.0 + 0.25 / 4.0);
  EXPECT_DOUBLE_EQ(p.Evaluate(x), expected);
  std::vector<float> g(4);
  EXPECT_DOUBLE_EQ(p.EvaluateWithGradient(x, g), expected);
  EXPECT_DOUBLE_EQ(p.EvaluateWithGradient(x, g, 99), expected);
  // Without noise the gradient is h_i x_i.
  EXPECT_EQ(GradientOf(NoisyQuadratic(0.0), x), (std::vector<float>{2.0f, -0.5f, 1.0f, 0.125f}));
}

TEST(NoisyQuadratic, NoiseFreeGradientMatchesFiniteDifferences) {
  const NoisyQuadratic p(0.0);
  for (const std::size_t d : {1, 2, 5, 17}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE("d = " + std::to_string(d));
      ExpectGradientMatchesDifferences(p, Snap(uniform_start(d, p.domain(), seed)), 0x1p-12, 1e-5);
      ExpectGradientMatchesDifferences(p, Snap(uniform_start(d, -20.0, 20.0, 9 + seed)), 0x1p-12,
                                       1e-5);
    }
  }
}

TEST(NoisyQuadratic, MinimizerAttainsMinimum) {
  const NoisyQuadratic p(1.0, 5);
  for (const std::size_t d : {1, 2, 17, 200}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    EXPECT_EQ(p.minimizer(d), std::vector<float>(d, 0.0f));
    EXPECT_EQ(p.minimum(d), 0.0);
    EXPECT_EQ(p.Evaluate(p.minimizer(d)), 0.0);
    EXPECT_EQ(MaxAbs(GradientOf(NoisyQuadratic(0.0), p.minimizer(d))), 0.0);
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      EXPECT_GT(p.Evaluate(uniform_start(d, -0.05, 0.05, seed)), 0.0);
    }
    // The standard start x = 1: f = (1/2) sum 1/i.
    double half_harmonic = 0.0;
    for (std::size_t i = 1; i <= d; ++i) half_harmonic += 0.5 / static_cast<double>(i);
    EXPECT_NEAR(p.Evaluate(p.standard_start(d)), half_harmonic, 1e-12);
  }
}

// E[g_i] = h_i x_i and Var[g_i] = sigma^2 h_i; a mean of B evaluations has a B times
// smaller variance. 4000 evaluation seeds: the estimates are within a few percent.
TEST(NoisyQuadratic, NoiseHasMeanZeroAndVarianceSigmaSquaredTimesCurvature) {
  const std::size_t d = 64;
  const double sigma = 0.7;
  const NoisyQuadratic p(sigma, 11);
  const std::vector<float> x = uniform_start(d, -1.0, 1.0, 1);
  CoordinateMoments single(d), mean_of_four(d);
  std::vector<float> g(d), acc(d);
  constexpr int kEvaluations = 4000;
  for (int e = 0; e < kEvaluations; ++e) {
    p.EvaluateWithGradient(x, g, static_cast<std::uint64_t>(e));
    single.add(g);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int b = 0; b < 4; ++b) {
      p.EvaluateWithGradient(x, g, static_cast<std::uint64_t>(1'000'000 + 4 * e + b));
      for (std::size_t i = 0; i < d; ++i) acc[i] += g[i] / 4.0f;
    }
    mean_of_four.add(acc);
  }
  for (const std::size_t i : {std::size_t{0}, std::size_t{1}, std::size_t{9}, d - 1}) {
    SCOPED_TRACE("coordinate " + std::to_string(i));
    const double h = NoisyQuadratic::curvature(i);
    const double variance = sigma * sigma * h;
    EXPECT_NEAR(single.mean(i), h * x[i], 5.0 * std::sqrt(variance / kEvaluations));
    EXPECT_NEAR(single.variance(i), variance, 0.1 * variance);
    EXPECT_NEAR(mean_of_four.variance(i), variance / 4.0, 0.1 * variance / 4.0);
  }
  // Over all coordinates at once, the normalised noise is standard normal.
  const std::size_t big = 100000;
  const NoisyQuadratic q(2.0, 4);
  std::vector<float> g_big(big);
  q.Gradient(std::vector<float>(big, 0.0f), g_big);
  std::size_t within_one_sigma = 0;
  for (std::size_t i = 0; i < big; ++i) {
    const double z = g_big[i] / (2.0 * std::sqrt(NoisyQuadratic::curvature(i)));
    if (std::abs(z) < 1.0) ++within_one_sigma;
  }
  EXPECT_NEAR(static_cast<double>(within_one_sigma) / static_cast<double>(big), 0.6827, 0.006);
}

TEST(NoisyQuadratic, NoiseIsKeyedOnThePointOrOnTheEvaluationSeed) {
  const NoisyQuadratic p(1.0, 9);
  const std::vector<float> x = uniform_start(30, -1.0, 1.0, 5);
  // The TestProblem entry points: the same point and seed give the same noise, in any thread.
  const std::vector<float> g = GradientOf(p, x);
  EXPECT_EQ(g, GradientOf(p, x));
  std::vector<float> g_thread;
  std::thread([&] { g_thread = GradientOf(p, x); }).join();
  EXPECT_EQ(g, g_thread);
  EXPECT_NE(g, GradientOf(NoisyQuadratic(0.0), x));
  EXPECT_NE(g, GradientOf(NoisyQuadratic(1.0, 10), x));
  std::vector<float> x2 = x;
  x2[0] = std::nextafter(x2[0], 2.0f);
  const std::vector<float> g2 = GradientOf(p, x2);
  EXPECT_GT(std::abs(g2[7] - g[7]), 1e-6);  // fresh noise, not the same noise shifted
  // The seeded entry point: one draw per evaluation seed, the same at every point.
  std::vector<float> a(30), b(30), c(30);
  p.EvaluateWithGradient(x, a, 1);
  p.EvaluateWithGradient(x, b, 1);
  p.EvaluateWithGradient(x, c, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<float> a2(30);
  p.EvaluateWithGradient(x2, a2, 1);
  for (std::size_t i = 1; i < 30; ++i) EXPECT_EQ(a2[i], a[i]);
  // And the problem's own seed still separates two problems.
  NoisyQuadratic(1.0, 10).EvaluateWithGradient(x, c, 1);
  EXPECT_NE(a, c);
}

TEST(NoisyQuadratic, RejectsBadInput) {
  for (const double sigma : {-0.1, double{NAN}, double{INFINITY}}) {
    EXPECT_TRUE(
        ThrowsInvalidArgument([&] { (void)NoisyQuadratic(sigma); }, {"sigma", "finite and >= 0"}));
  }
  const NoisyQuadratic p;
  EXPECT_EQ(p.sigma(), 1.0);
  std::vector<float> g0;
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.Evaluate({}); }, {"x: dimension", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { p.Gradient({}, g0); }, {"x: dimension", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.EvaluateWithGradient({}, g0, 1); },
                                    {"x: dimension", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.standard_start(0); }, {"d: ", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.minimizer(0); }, {"d: ", "got 0"}));
  EXPECT_TRUE(ThrowsInvalidArgument([&] { (void)p.minimum(0); }, {"d: ", "got 0"}));
  const std::vector<float> x(5, 1.0f);
  std::vector<float> g4(4);
  EXPECT_TRUE(ThrowsInvalidArgument([&] { p.Gradient(x, g4); }, {"g: ", "5", "got 4"}));
  EXPECT_TRUE(
      ThrowsInvalidArgument([&] { (void)p.EvaluateWithGradient(x, g4, 3); }, {"g: ", "got 4"}));
  std::vector<float> buf = x;
  EXPECT_TRUE(ThrowsInvalidArgument([&] { p.Gradient(buf, buf); }, {"g: ", "overlap"}));
  EXPECT_TRUE(
      ThrowsInvalidArgument([&] { (void)p.EvaluateWithGradient(buf, buf, 3); }, {"overlap"}));
}

}  // namespace
