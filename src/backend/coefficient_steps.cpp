#include "backend/coefficient_steps.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace optex::detail {

SgdCoefficientSteps::SgdCoefficientSteps(const Sgd& sgd, std::int64_t local_step, std::size_t n)
    : sgd_(sgd), step_(local_step), n_(n) {
  offset_.c.assign(n, 0.0);
  buffer_.beta = 1.0;  // the state's buffer is m itself
  buffer_.c.assign(n, 0.0);
}

double SgdCoefficientSteps::squared_norm(const Combination& v, const AnchorProducts& p) const {
  // ||alpha a + beta m + G^T c||^2, term by term.
  double cgc = 0.0, cr = 0.0, ch = 0.0;
  for (std::size_t l = 0; l < n_; ++l) {
    if (v.c[l] == 0.0) continue;
    double row = 0.0;
    for (std::size_t k = 0; k < n_; ++k) row += p.gram->gradient_inner(l, k) * v.c[k];
    cgc += v.c[l] * row;
    cr += v.c[l] * p.r[l];
    ch += v.c[l] * p.h[l];
  }
  return v.alpha * v.alpha * p.aa + v.beta * v.beta * p.mm + cgc +
         2.0 * (v.alpha * v.beta * p.am + v.alpha * cr + v.beta * ch);
}

void SgdCoefficientSteps::squared_distances(const AnchorProducts& p, std::span<double> out) const {
  if (p.n != n_ || out.size() != n_) {
    throw std::invalid_argument("coefficient steps: products of " + std::to_string(p.n) +
                                " slots and " + std::to_string(out.size()) +
                                " outputs for a chain of " + std::to_string(n_));
  }
  // ||x_i - X_j||^2 = ||a - X_j||^2 + 2 <x_i - a, a - X_j> + ||x_i - a||^2,
  // with <G_l, a - X_j> = s[l] + pair(l, j).
  const double offset = squared_norm(offset_, p);
  double cs = 0.0;
  for (std::size_t l = 0; l < n_; ++l) cs += offset_.c[l] * p.s[l];
  for (std::size_t j = 0; j < n_; ++j) {
    double cross = offset_.alpha * p.q[j] + offset_.beta * p.f[j] + cs;
    for (std::size_t l = 0; l < n_; ++l) {
      if (offset_.c[l] != 0.0) cross += offset_.c[l] * p.pair[l * p.stride + j];
    }
    out[j] = std::max(0.0, p.e[j] + 2.0 * cross + offset);
  }
}

double SgdCoefficientSteps::squared_offset(const AnchorProducts& p) const {
  return std::max(0.0, squared_norm(offset_, p));
}

void SgdCoefficientSteps::step(std::span<const double> w) {
  if (w.size() != n_) {
    throw std::invalid_argument("coefficient steps: " + std::to_string(w.size()) +
                                " weights for a chain of " + std::to_string(n_));
  }
  // Sgd::update in coefficients: the same operations, on combinations.
  const Sgd::Coefficients k = sgd_.coefficients(step_);
  const double lr = k.lr;
  const double wd = k.weight_decay;
  const double mu = k.momentum;
  // gi = G^T w + wd * x_i, x_i = a + offset.
  Combination gi;
  gi.alpha = wd * (1.0 + offset_.alpha);
  gi.beta = wd * offset_.beta;
  gi.c.resize(n_);
  for (std::size_t l = 0; l < n_; ++l) gi.c[l] = w[l] + wd * offset_.c[l];
  const Combination* direction = &gi;
  if (k.use_momentum) {
    if (k.first) {
      buffer_ = gi;
    } else {
      buffer_.alpha = mu * buffer_.alpha + gi.alpha;
      buffer_.beta = mu * buffer_.beta + gi.beta;
      for (std::size_t l = 0; l < n_; ++l) buffer_.c[l] = mu * buffer_.c[l] + gi.c[l];
    }
    if (k.nesterov) {
      gi.alpha += mu * buffer_.alpha;
      gi.beta += mu * buffer_.beta;
      for (std::size_t l = 0; l < n_; ++l) gi.c[l] += mu * buffer_.c[l];
    } else {
      direction = &buffer_;
    }
  }
  offset_.alpha -= lr * direction->alpha;
  offset_.beta -= lr * direction->beta;
  for (std::size_t l = 0; l < n_; ++l) offset_.c[l] -= lr * direction->c[l];
  ++step_;
}

}  // namespace optex::detail
