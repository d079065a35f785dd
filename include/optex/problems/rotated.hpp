// Rotated<P>: f(x) = base(Q x) with Q a seeded, Haar-random orthogonal d x d matrix.
// Separable problems (Sphere aside) flatter any per-coordinate model of the
// landscape; rotating the coordinates removes that without changing the minimum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <Eigen/Dense>

#include "optex/problems/domain.hpp"
#include "optex/util/random.hpp"

namespace optex::problems {

template <TestProblem P>
class Rotated {
 public:
  // Q is stored densely (d^2 floats: 64 MiB at this limit), building it costs
  // O(d^3) (tens of seconds on one core at this limit) and every evaluation O(d^2),
  // so larger d is refused rather than silently made slow.
  static constexpr std::size_t kMaxDimension = 4096;

  Rotated(P base, std::size_t d, std::uint64_t seed)
      : base_(std::move(base)),
        d_(CheckedDimension(base_, d)),
        seed_(seed),
        name_("rotated_" + std::string(base_.name())),
        q_(std::make_shared<const std::vector<float>>(MakeRotation(d_, seed))) {}

  std::string_view name() const { return name_; }
  std::size_t dimension() const { return d_; }
  std::uint64_t seed() const { return seed_; }
  const P& base() const { return base_; }
  // Q, row-major: Q(i, j) = rotation()[i * dimension() + j].
  std::span<const float> rotation() const { return *q_; }

  double Evaluate(std::span<const float> x) const {
    CheckPoint(x);
    return base_.Evaluate(Apply(x));
  }
  void Gradient(std::span<const float> x, std::span<float> g) const { EvaluateWithGradient(x, g); }
  // grad f(x) = Q^T grad base(Q x).
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    CheckPoint(x);
    detail::check_gradient(x, g);
    const std::vector<float> y = Apply(x);
    std::vector<float> gy(d_);
    const double f = base_.EvaluateWithGradient(y, gy);
    ApplyTransposed(gy, g);
    return f;
  }

  // The base's box. In the rotated coordinates this is only approximate: Q^T maps
  // the box to a rotated box, so a point of this box can map outside the base's.
  Domain domain() const { return base_.domain(); }

  // Q^T s for the base's start s: the same loss as the base at its start.
  std::vector<float> standard_start(std::size_t d) const {
    CheckRequestedDimension(d);
    return ApplyTransposed(base_.standard_start(d));
  }
  // Q^T x* for the base's minimiser x* (Q x = x* there).
  std::vector<float> minimizer(std::size_t d) const {
    CheckRequestedDimension(d);
    return ApplyTransposed(base_.minimizer(d));
  }
  double minimum(std::size_t d) const {
    CheckRequestedDimension(d);
    return base_.minimum(d);
  }

 private:
  static std::size_t CheckedDimension(const P& base, std::size_t d) {
    detail::check_dimension("d", d);
    if (d > kMaxDimension) {
      throw std::invalid_argument("d: a dense rotation supports d <= " +
                                  std::to_string(kMaxDimension) + ", got " + std::to_string(d));
    }
    (void)base.minimum(d);  // lets the base refuse a dimension it does not support
    return d;
  }

  // Haar measure: QR of a matrix of independent standard normals (drawn row by
  // row from SplitMix64, so portable), with the columns of Q flipped so that R
  // has a positive diagonal; without the flip Q would not be uniformly distributed.
  static std::vector<float> MakeRotation(std::size_t d, std::uint64_t seed) {
    const auto n = static_cast<Eigen::Index>(d);
    SplitMix64 rng(seed);
    Eigen::MatrixXd a(n, n);
    for (Eigen::Index i = 0; i < n; ++i) {
      for (Eigen::Index j = 0; j < n; ++j) a(i, j) = rng.normal();
    }
    const Eigen::HouseholderQR<Eigen::MatrixXd> qr(a);
    Eigen::MatrixXd q = qr.householderQ();
    for (Eigen::Index j = 0; j < n; ++j) {
      if (qr.matrixQR()(j, j) < 0.0) q.col(j) *= -1.0;
    }
    std::vector<float> out(d * d);
    for (Eigen::Index i = 0; i < n; ++i) {
      for (Eigen::Index j = 0; j < n; ++j) out[i * n + j] = static_cast<float>(q(i, j));
    }
    return out;
  }

  void CheckPoint(std::span<const float> x) const {
    detail::check_dimension("x", x.size());
    if (x.size() != d_) {
      throw std::invalid_argument("x: size must equal the rotation's dimension " +
                                  std::to_string(d_) + ", got " + std::to_string(x.size()));
    }
  }
  void CheckRequestedDimension(std::size_t d) const {
    detail::check_dimension("d", d);
    if (d != d_) {
      throw std::invalid_argument("d: must equal the rotation's dimension " + std::to_string(d_) +
                                  ", got " + std::to_string(d));
    }
  }

  // Q x, accumulated in double, rounded to float for the base.
  std::vector<float> Apply(std::span<const float> x) const {
    const std::vector<float>& q = *q_;
    std::vector<float> y(d_);
    for (std::size_t i = 0; i < d_; ++i) {
      double acc = 0.0;
      for (std::size_t j = 0; j < d_; ++j) acc += static_cast<double>(q[i * d_ + j]) * x[j];
      y[i] = static_cast<float>(acc);
    }
    return y;
  }

  // out = Q^T v, as a sum of rows of Q (row-major access), in double.
  void ApplyTransposed(std::span<const float> v, std::span<float> out) const {
    const std::vector<float>& q = *q_;
    std::vector<double> acc(d_, 0.0);
    for (std::size_t i = 0; i < d_; ++i) {
      const double vi = v[i];
      for (std::size_t j = 0; j < d_; ++j) acc[j] += static_cast<double>(q[i * d_ + j]) * vi;
    }
    for (std::size_t j = 0; j < d_; ++j) out[j] = static_cast<float>(acc[j]);
  }
  std::vector<float> ApplyTransposed(std::span<const float> v) const {
    std::vector<float> out(d_);
    ApplyTransposed(v, out);
    return out;
  }

  P base_;
  std::size_t d_;
  std::uint64_t seed_;
  std::string name_;
  // Immutable once built, so copies of the wrapper share it safely across threads.
  std::shared_ptr<const std::vector<float>> q_;
};

}  // namespace optex::problems
