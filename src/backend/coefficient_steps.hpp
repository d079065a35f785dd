// Proxy steps in coefficient space (DESIGN.md section 7, "Proxy steps in
// coefficient space"): the GP weights of a proxy point depend on the point
// only through its squared distances to the history points, and for SGD
// (momentum, Nesterov, coupled weight decay) every proxy point is exactly
//
//   x_i = a + alpha_i a + beta_i m + G^T c_i
//
// with a the iterate (the anchor), m the momentum buffer and G the history's
// gradients. So the distances follow from a few products of a, m, X and G
// (DevicePrimitives::anchor_products) by O(T0^2) arithmetic on the host, and
// a proxy step needs no pass over the history's points. The products are
// anchored (each difference is formed per coordinate): their rounding scales
// with the distances among the points, never with ||x||.
// Private to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "optex/estimator/history_gram.hpp"
#include "optex/optimizers/sgd.hpp"

namespace optex::detail {

// One round's products, on the host, over the history's n slots in slot
// order (AnchorLayout's fields, plus the pairs' products and the gradients'
// Gram):
//   e[j] = ||a - X_j||^2   f[j] = <m, a - X_j>   q[j] = <a, a - X_j>
//   h[l] = <m, G_l>        s[l] = <G_l, a - X_l> r[l] = <a, G_l>
//   pair(l, j) = <G_l, X_l - X_j> (row-major, row stride `stride`) and
//   <G_l, G_k> = gram->gradient_inner(l, k).
// So <G_l, a - X_j> = s[l] + pair(l, j), anchored on both sides.
struct AnchorProducts {
  std::size_t n = 0;
  const double* e = nullptr;
  const double* f = nullptr;
  const double* q = nullptr;
  const double* h = nullptr;
  const double* s = nullptr;
  const double* r = nullptr;
  double mm = 0.0;  // ||m||^2
  double am = 0.0;  // <a, m>
  double aa = 0.0;  // ||a||^2
  const double* pair = nullptr;
  std::size_t stride = 0;
  const HistoryGram* gram = nullptr;
};

// The N - 1 proxy steps of one ask() for SGD, in coefficients: where each
// point lies, as a combination of a, m and the history gradients.
class SgdCoefficientSteps {
 public:
  // `sgd`: the one range's hyperparameters; `local_step`: the step count its
  // optimizer sees before the first proxy step; n history slots. The
  // coefficients are those the fp32 step uses (Sgd::coefficients), so the
  // points differ from the materialised ones by the latter's fp32 rounding.
  SgdCoefficientSteps(const Sgd& sgd, std::int64_t local_step, std::size_t n);

  // out[j] := ||x_i - X_j||^2 for the current point x_i (a before the first
  // step), j < n, from the products (never below 0). out.size() == n.
  void squared_distances(const AnchorProducts& p, std::span<double> out) const;
  // ||x_i - a||^2: how far the current point lies from the iterate.
  double squared_offset(const AnchorProducts& p) const;
  // One SGD step with the proxy gradient G^T w (w: n weights, the fp32
  // values the materialised step uses).
  void step(std::span<const double> w);

 private:
  // alpha a + beta m + G^T c.
  struct Combination {
    double alpha = 0.0;
    double beta = 0.0;
    std::vector<double> c;
  };
  // ||v||^2 of a combination, from the products.
  double squared_norm(const Combination& v, const AnchorProducts& p) const;

  Sgd sgd_;
  std::int64_t step_;
  std::size_t n_;
  Combination offset_;  // x_i - a
  Combination buffer_;  // the momentum buffer of x_i's state
};

}  // namespace optex::detail
