#include "optex/estimator/lengthscale_selection.hpp"

#include <Eigen/Cholesky>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "optex/estimator/gp_estimator.hpp"

namespace optex {
namespace {

constexpr std::array<double, 9> kDefaultGrid = {0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0};

double median_distance(const HistoryGram& h) {
  std::vector<double> d;
  d.reserve(h.size() * (h.size() - 1) / 2);
  for (std::size_t i = 0; i < h.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) d.push_back(std::sqrt(h.squared_distance(i, j)));
  auto mid = d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2);
  std::nth_element(d.begin(), mid, d.end());
  return *mid;
}

// Criterion for one candidate; +inf when the covariance is not positive definite.
double score(const HistoryGram& h, const Options& o, double scaled_lengthscale,
             const Eigen::MatrixXd& q, Eigen::MatrixXd& a) {
  covariance_matrix(h, o.kernel, scaled_lengthscale, o.noise, a);
  Eigen::LLT<Eigen::MatrixXd> llt(a);
  if (llt.info() != Eigen::Success) return std::numeric_limits<double>::infinity();
  const auto n = a.rows();
  if (o.lengthscale_selection == LengthscaleSelection::marginal_likelihood) {
    const double trace = llt.solve(q).trace();
    const double log_det = 2.0 * llt.matrixLLT().diagonal().array().log().sum();
    if (!(trace > 0.0)) return std::numeric_limits<double>::infinity();
    return static_cast<double>(n) * std::log(trace) + log_det;
  }
  // Leave-one-out. A^-1 from the factor is fine here: T0 x T0, model selection only.
  const Eigen::MatrixXd inv = llt.solve(Eigen::MatrixXd::Identity(n, n));
  const Eigen::MatrixXd iqi = inv * q * inv;
  double err = 0.0;
  for (Eigen::Index i = 0; i < n; ++i) err += iqi(i, i) / (inv(i, i) * inv(i, i));
  return err;
}

}  // namespace

std::span<const double> default_lengthscale_grid() { return kDefaultGrid; }

LengthscaleChoice select_lengthscale(const HistoryGram& h, const Options& o, double current) {
  if (o.lengthscale_selection == LengthscaleSelection::fixed || h.size() < 3) {
    return {current, 0.0, false};
  }
  const double scale = input_scale(h, o.input_scaling);
  const double median = median_distance(h) / scale;
  if (!(median > 0.0) || !std::isfinite(median)) return {current, 0.0, false};

  const auto n = static_cast<Eigen::Index>(h.size());
  Eigen::MatrixXd q(n, n);
  for (Eigen::Index i = 0; i < n; ++i)
    for (Eigen::Index j = 0; j < n; ++j)
      q(i, j) = h.gradient_inner(static_cast<std::size_t>(i), static_cast<std::size_t>(j));

  std::span<const double> grid = o.lengthscale_grid.empty()
                                     ? default_lengthscale_grid()
                                     : std::span<const double>(o.lengthscale_grid);
  LengthscaleChoice best{current, std::numeric_limits<double>::infinity(), false};
  Eigen::MatrixXd a;
  for (double multiple : grid) {
    const double candidate = multiple * median;
    const double s = score(h, o, candidate * scale, q, a);
    if (s < best.score) best = {candidate, s, true};  // ties keep the smaller lengthscale
  }
  return best;
}

}  // namespace optex
