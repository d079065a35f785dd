// Proxy steps in coefficient space (src/backend/coefficient_steps.hpp): the
// distances a chain of SGD proxy steps computes from the anchor products
// against the points the same steps reach in long double, for every SGD
// configuration, on hostile geometry (iterates far from the origin with tiny
// steps, near-duplicate history points, one history slot and many).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/coefficient_steps.hpp"
#include "optex/estimator/history_gram.hpp"
#include "optex/optimizers/sgd.hpp"

namespace {

using optex::HistoryGram;
using optex::Sgd;
using optex::detail::AnchorProducts;
using optex::detail::SgdCoefficientSteps;
using Real = long double;

// A history of n pairs in dimension d around an anchor, the momentum buffer,
// and every product of the AnchorProducts, computed in long double.
struct Geometry {
  std::size_t n = 0, d = 0;
  std::vector<float> a, m, x, g;  // x, g: n x d
  std::vector<double> e, f, q, h, s, r, pair;
  double mm = 0, am = 0, aa = 0;
  HistoryGram gram{1};

  Geometry(std::size_t slots, std::size_t dim, double origin, double spread, double gradient_scale,
           std::uint32_t seed)
      : n(slots), d(dim), gram(slots) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    a.resize(d);
    m.resize(d);
    x.resize(n * d);
    g.resize(n * d);
    for (std::size_t k = 0; k < d; ++k) {
      a[k] = static_cast<float>(origin + u(rng));
      m[k] = static_cast<float>(gradient_scale * u(rng));
    }
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t k = 0; k < d; ++k) {
        x[j * d + k] = static_cast<float>(a[k] + spread * u(rng));
        g[j * d + k] = static_cast<float>(gradient_scale * u(rng));
      }
    }
    products();
  }

  Real X(std::size_t j, std::size_t k) const { return x[j * d + k]; }
  Real G(std::size_t j, std::size_t k) const { return g[j * d + k]; }

  void products() {
    e.assign(n, 0);
    f.assign(n, 0);
    q.assign(n, 0);
    h.assign(n, 0);
    s.assign(n, 0);
    r.assign(n, 0);
    pair.assign(n * n, 0);
    Real rmm = 0, ram = 0, raa = 0;
    for (std::size_t k = 0; k < d; ++k) {
      rmm += Real(m[k]) * m[k];
      ram += Real(a[k]) * m[k];
      raa += Real(a[k]) * a[k];
    }
    mm = static_cast<double>(rmm);
    am = static_cast<double>(ram);
    aa = static_cast<double>(raa);
    for (std::size_t j = 0; j < n; ++j) {
      Real ej = 0, fj = 0, qj = 0, hj = 0, sj = 0, rj = 0;
      for (std::size_t k = 0; k < d; ++k) {
        const Real diff = Real(a[k]) - X(j, k);
        ej += diff * diff;
        fj += Real(m[k]) * diff;
        qj += Real(a[k]) * diff;
        hj += Real(m[k]) * G(j, k);
        sj += G(j, k) * diff;
        rj += Real(a[k]) * G(j, k);
      }
      e[j] = static_cast<double>(ej);
      f[j] = static_cast<double>(fj);
      q[j] = static_cast<double>(qj);
      h[j] = static_cast<double>(hj);
      s[j] = static_cast<double>(sj);
      r[j] = static_cast<double>(rj);
      for (std::size_t i = 0; i < n; ++i) {
        Real p = 0;
        for (std::size_t k = 0; k < d; ++k) p += G(j, k) * (X(j, k) - X(i, k));
        pair[j * n + i] = static_cast<double>(p);
      }
    }
    // The gradients' Gram, as a history records it (distances unused here).
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t slot = gram.advance();
      std::vector<double> distances(n, 0.0), inner(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        Real p = 0;
        for (std::size_t k = 0; k < d; ++k) p += G(slot, k) * G(i, k);
        inner[i] = static_cast<double>(p);
      }
      gram.set_row(slot, distances.data(), 0.0, inner.data());
    }
  }

  AnchorProducts view() const {
    AnchorProducts p;
    p.n = n;
    p.e = e.data();
    p.f = f.data();
    p.q = q.data();
    p.h = h.data();
    p.s = s.data();
    p.r = r.data();
    p.mm = mm;
    p.am = am;
    p.aa = aa;
    p.pair = pair.data();
    p.stride = n;
    p.gram = &gram;
    return p;
  }
};

// The same SGD steps on the points themselves, in long double, with the
// fp32-rounded coefficients Sgd::update uses (its order of operations).
struct DirectChain {
  const Geometry& geo;
  Sgd sgd;
  std::int64_t step;
  std::vector<Real> x, buf;

  DirectChain(const Geometry& g, const Sgd& o, std::int64_t local_step)
      : geo(g), sgd(o), step(local_step), x(g.a.begin(), g.a.end()), buf(g.m.begin(), g.m.end()) {}

  void advance(const std::vector<double>& w) {
    const Sgd::Coefficients c = sgd.coefficients(step);
    for (std::size_t k = 0; k < geo.d; ++k) {
      Real p = 0;
      for (std::size_t l = 0; l < geo.n; ++l) p += Real(w[l]) * geo.G(l, k);
      const Real gi = p + Real(c.weight_decay) * x[k];
      if (!c.use_momentum) {
        x[k] -= Real(c.lr) * gi;
        continue;
      }
      buf[k] = c.first ? gi : Real(c.momentum) * buf[k] + gi;
      x[k] -= Real(c.lr) * (c.nesterov ? gi + Real(c.momentum) * buf[k] : buf[k]);
    }
    ++step;
  }
  Real squared_distance(std::size_t j) const {
    Real sum = 0;
    for (std::size_t k = 0; k < geo.d; ++k) sum += (x[k] - geo.X(j, k)) * (x[k] - geo.X(j, k));
    return sum;
  }
  Real squared_offset() const {
    Real sum = 0;
    for (std::size_t k = 0; k < geo.d; ++k) sum += (x[k] - geo.a[k]) * (x[k] - geo.a[k]);
    return sum;
  }
};

std::vector<Sgd> every_sgd(double lr) {
  return {Sgd{.lr = lr},
          Sgd{.lr = lr, .weight_decay = 0.01},
          Sgd{.lr = lr, .momentum = 0.9},
          Sgd{.lr = lr, .momentum = 0.9, .weight_decay = 0.05},
          Sgd{.lr = lr, .momentum = 0.9, .nesterov = true},
          Sgd{.lr = lr, .momentum = 0.5, .nesterov = true, .weight_decay = 0.01}};
}

std::string describe(const Sgd& o, std::int64_t step) {
  return "lr " + std::to_string(o.lr) + " momentum " + std::to_string(o.momentum) +
         (o.nesterov ? " nesterov" : "") + " weight_decay " + std::to_string(o.weight_decay) +
         " from step " + std::to_string(step);
}

// Runs `steps` proxy steps with random weights and checks every distance
// against the direct chain: |error| <= tol * (exact distance + the largest
// distance in play), the bound of DESIGN.md's "Proxy steps in coefficient
// space" with fp64 sums (tol a few thousand units of fp64 rounding).
void expect_chain_matches(const Geometry& geo, const Sgd& sgd, std::int64_t local_step, int steps,
                          double tol) {
  SCOPED_TRACE(describe(sgd, local_step));
  const AnchorProducts p = geo.view();
  SgdCoefficientSteps chain(sgd, local_step, geo.n);
  DirectChain direct(geo, sgd, local_step);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> distances(geo.n);
  for (int i = 0; i <= steps; ++i) {
    chain.squared_distances(p, distances);
    Real largest = direct.squared_offset();
    for (std::size_t j = 0; j < geo.n; ++j) largest = std::max(largest, Real(geo.e[j]));
    for (std::size_t j = 0; j < geo.n; ++j) {
      const Real exact = direct.squared_distance(j);
      const Real error = std::fabs(Real(distances[j]) - exact);
      EXPECT_LE(error, Real(tol) * (exact + largest) + 1e-300L)
          << "step " << i << ", slot " << j << ": " << distances[j] << " vs " << double(exact);
    }
    const Real offset_error = std::fabs(Real(chain.squared_offset(p)) - direct.squared_offset());
    EXPECT_LE(offset_error, Real(tol) * (direct.squared_offset() + largest) + 1e-300L)
        << "step " << i;
    if (i == steps) break;
    std::vector<double> w(geo.n);
    for (double& v : w) v = static_cast<double>(static_cast<float>(u(rng) / double(geo.n)));
    chain.step(w);
    direct.advance(w);
  }
}

TEST(SgdCoefficientSteps, DistancesOfEveryConfigurationMatchTheStepsTakenOnThePoints) {
  const Geometry geo(8, 300, 0.0, 1.0, 1.0, 1);
  for (const Sgd& sgd : every_sgd(0.1)) {
    for (const std::int64_t step : {std::int64_t{0}, std::int64_t{5}}) {
      expect_chain_matches(geo, sgd, step, 7, 1e-12);
    }
  }
}

// Far from the origin (|x| ~ 1e4) with tiny steps and history points 1e-3
// apart: a distance is ~1e-5 of ||x||^2 / d, and the anchored products keep
// it to fp64 rounding of the distances, not of ||x||^2 (where a norm formula
// would lose every digit).
TEST(SgdCoefficientSteps, FarFromTheOriginWithTinyStepsKeepsTheDistancesDigits) {
  const Geometry geo(6, 200, 1e4, 1e-3, 1e-2, 2);
  for (const Sgd& sgd : every_sgd(1e-4)) {
    expect_chain_matches(geo, sgd, 3, 7, 1e-10);
  }
}

// Two history points that differ in the last bits of one coordinate.
TEST(SgdCoefficientSteps, NearDuplicateHistoryPoints) {
  Geometry geo(5, 64, 3.0, 0.5, 1.0, 3);
  for (std::size_t k = 0; k < geo.d; ++k) geo.x[1 * geo.d + k] = geo.x[0 * geo.d + k];
  geo.x[1 * geo.d + 17] = std::nextafter(geo.x[17], 10.0f);
  geo.products();
  for (const Sgd& sgd : every_sgd(0.05)) expect_chain_matches(geo, sgd, 1, 4, 1e-12);
}

TEST(SgdCoefficientSteps, OneHistorySlotAndMany) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{64}}) {
    SCOPED_TRACE("T0 " + std::to_string(n));
    const Geometry geo(n, 96, -2.0, 1.0, 0.3, 4);
    for (const Sgd& sgd : every_sgd(0.2)) expect_chain_matches(geo, sgd, 2, 15, 1e-11);
  }
}

TEST(SgdCoefficientSteps, RefusesWeightsOrProductsOfAnotherSize) {
  const Geometry geo(3, 10, 0.0, 1.0, 1.0, 5);
  SgdCoefficientSteps chain(Sgd{.lr = 0.1, .momentum = 0.9}, 0, 3);
  EXPECT_THROW(chain.step(std::vector<double>(2, 0.0)), std::invalid_argument);
  std::vector<double> out(2);
  EXPECT_THROW(chain.squared_distances(geo.view(), out), std::invalid_argument);
  // Nothing moved: the distances are still the anchor's.
  std::vector<double> distances(3);
  chain.squared_distances(geo.view(), distances);
  for (std::size_t j = 0; j < 3; ++j) EXPECT_DOUBLE_EQ(distances[j], geo.e[j]);
}

}  // namespace
