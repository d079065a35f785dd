#include "optex/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "optex/lengthscale_selection.hpp"
#include "optex/streaming.hpp"

namespace optex {
namespace {

std::uint64_t next_engine_id() {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1);
}

bool all_finite(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float a) { return std::isfinite(a); });
}

std::vector<float> checked_start(std::span<const float> x0) {
  if (x0.empty()) throw std::invalid_argument("x0: dimension must be >= 1, got 0");
  for (std::size_t i = 0; i < x0.size(); ++i) {
    if (!std::isfinite(x0[i])) {
      std::ostringstream msg;
      msg << "x0: element " << i << " is " << x0[i] << " (must be finite)";
      throw std::invalid_argument(msg.str());
    }
  }
  return {x0.begin(), x0.end()};
}

const Options& checked(const Options& o) {
  o.validate();
  return o;
}

const Optimizer& checked(const Optimizer& opt) {
  validate(opt);
  return opt;
}

}  // namespace

Engine::Engine(std::span<const float> x0, Optimizer optimizer, Options options)
    : options_(checked(options)),
      optimizer_(checked(optimizer)),
      x_(checked_start(x0)),
      state_(init_state(optimizer_, x_.size())),
      history_(static_cast<std::size_t>(options_.history), x_.size()),
      estimator_(options_.kernel, options_.noise, options_.input_scaling,
                 static_cast<std::size_t>(options_.history)),
      lengthscale_(options_.lengthscale),
      rng_(options_.seed),
      work_state_(state_),
      next_x_(x_.size()),
      finite_(static_cast<std::size_t>(options_.parallelism)),
      id_(next_engine_id()) {
  batch_.allocate(options_.parallelism, x_.size());
  batch_.owner_ = id_;
}

void Engine::refit_if_needed() {
  if (fitted_) return;
  if (options_.proxy == Proxy::gp && options_.parallelism > 1 && history_.size() >= 2) {
    if (iteration_ % options_.selection_interval == 0) {
      lengthscale_ = select_lengthscale(history_, options_, lengthscale_).lengthscale;
    }
    estimator_.fit(history_, lengthscale_);
  }
  fitted_ = true;
}

bool Engine::proxy_gradient(int i) {
  const std::size_t d = dim();
  std::span<float> out(batch_.predicted_.data() + static_cast<std::size_t>(i) * d, d);
  std::span<const float> point = batch_.point(i);
  char& predicted = batch_.was_predicted_[static_cast<std::size_t>(i)];
  predicted = 1;

  if (options_.proxy == Proxy::target) {
    if (!oracle_) {
      throw std::runtime_error(
          "proxy: Proxy::target needs a gradient oracle (Engine::set_gradient_oracle, or use "
          "optex::minimize)");
    }
    const double loss = oracle_(point, out);
    if (!std::isfinite(loss) || !all_finite(out)) {
      throw std::runtime_error("proxy: the gradient oracle returned a non-finite value");
    }
    return true;
  }
  const std::size_t h = history_.size();
  const bool reference_warmup = options_.warmup == Warmup::zero_gradient;
  if (h == 0 || (h == 1 && reference_warmup && options_.proxy == Proxy::gp)) {
    predicted = 0;
    std::fill(out.begin(), out.end(), 0.0f);
    return reference_warmup;  // the reference still steps (with zero); otherwise hold
  }
  if (options_.proxy == Proxy::last_gradient || h == 1) {
    auto g = history_.gradient(history_.newest_slot());
    std::copy(g.begin(), g.end(), out.begin());
    return true;
  }
  estimator_.predict(history_, point, out);
  for (double w : estimator_.weights()) {
    if (!std::isfinite(w)) {
      throw std::runtime_error("proxy: the GP weights are not finite (lengthscale " +
                               std::to_string(lengthscale_) + ")");
    }
  }
  return true;
}

Batch& Engine::ask() {
  if (pending_) return batch_;
  const std::size_t d = dim();
  const int n = batch_.size();
  const auto saved_rng = rng_.state();
  const double saved_lengthscale = lengthscale_;
  try {
    refit_if_needed();
    batch_.iteration_ = iteration_;
    for (int i = 0; i < n; ++i) batch_.seeds_[static_cast<std::size_t>(i)] = rng_.next();
    std::copy(x_.begin(), x_.end(), batch_.points_.begin());
    work_state_ = state_;
    batch_.proxy_steps_applied_ = true;
    // Proxy steps: x_i = step(x_{i-1}, s_{i-1}, mu(x_{i-1})); the state really advances.
    for (int i = 1; i < n; ++i) {
      float* row = batch_.points_.data() + static_cast<std::size_t>(i) * d;
      std::copy(row - d, row, row);
      if (proxy_gradient(i - 1)) {
        apply_step(optimizer_, {row, d}, work_state_, batch_.predicted_gradient(i - 1));
      } else {
        batch_.proxy_steps_applied_ = false;
      }
    }
  } catch (...) {
    rng_.set_state(saved_rng);
    lengthscale_ = saved_lengthscale;
    fitted_ = false;
    throw;
  }
  pending_ = true;
  return batch_;
}

const IterationInfo& Engine::tell(Batch& batch) {
  if (batch.owner_ != id_) {
    throw std::invalid_argument("batch: it was returned by another engine's ask()");
  }
  if (!pending_) {
    throw std::runtime_error("tell: no pending batch (iteration " + std::to_string(iteration_) +
                             "): call ask() first; tell() commits each batch once");
  }
  if (batch.iteration_ != iteration_) {
    throw std::invalid_argument("batch: it belongs to iteration " +
                                std::to_string(batch.iteration_) + ", the pending iteration is " +
                                std::to_string(iteration_));
  }
  return commit(batch);
}

const IterationInfo& Engine::tell(std::span<const float> gradients,
                                  std::span<const double> losses) {
  if (!pending_) {
    throw std::runtime_error("tell: no pending batch (iteration " + std::to_string(iteration_) +
                             "): call ask() first; tell() commits each batch once");
  }
  const auto n = static_cast<std::size_t>(batch_.size());
  if (gradients.size() != n * dim()) {
    throw std::invalid_argument("gradients: size " + std::to_string(gradients.size()) +
                                " does not match N * d = " + std::to_string(n) + " * " +
                                std::to_string(dim()));
  }
  if (losses.size() != n) {
    throw std::invalid_argument("losses: size " + std::to_string(losses.size()) +
                                " does not match N = " + std::to_string(n));
  }
  // Bindings may hand the batch's own buffers back: copying onto itself is not allowed.
  if (gradients.data() != batch_.grads_.data()) {
    std::copy(gradients.begin(), gradients.end(), batch_.grads_.begin());
  }
  if (losses.data() != batch_.losses_.data()) {
    std::copy(losses.begin(), losses.end(), batch_.losses_.begin());
  }
  return commit(batch_);
}

const IterationInfo& Engine::commit(Batch& batch) {
  const int n = batch.size();
  const std::size_t d = dim();
  // Which pairs may enter the history, and which point the commit steps from.
  std::vector<char>& finite = finite_;
  int last_finite = -1;
  for (int i = 0; i < n; ++i) {
    finite[static_cast<std::size_t>(i)] =
        std::isfinite(batch.loss(i)) && all_finite(batch.grad(i)) ? 1 : 0;
    if (finite[static_cast<std::size_t>(i)]) last_finite = i;
  }
  if (last_finite < 0) {
    throw std::runtime_error("tell: every gradient or loss of iteration " +
                             std::to_string(iteration_) +
                             " is non-finite; nothing was committed and the batch is still "
                             "pending");
  }
  // From here on nothing throws: the state changes all at once.
  const int c = last_finite;
  if (c != n - 1) {
    // Replay the proxy steps up to point c to recover its optimizer state.
    work_state_ = state_;
    std::copy(x_.begin(), x_.end(), next_x_.begin());
    if (batch.proxy_steps_applied_) {
      for (int i = 0; i < c; ++i)
        apply_step(optimizer_, next_x_, work_state_, batch.predicted_gradient(i));
    }
  } else {
    auto p = batch.point(c);
    std::copy(p.begin(), p.end(), next_x_.begin());
  }
  apply_step(optimizer_, next_x_, work_state_, batch.grad(c));

  IterationInfo info;
  info.lengthscale = lengthscale_;
  double cosine_sum = 0.0;
  int cosine_count = 0;
  for (int i = 0; i + 1 < n; ++i) {
    if (!finite[static_cast<std::size_t>(i)] || !batch.was_predicted_[static_cast<std::size_t>(i)])
      continue;
    const float* p = batch.predicted_.data() + static_cast<std::size_t>(i) * d;
    const float* g = batch.grads_.data() + static_cast<std::size_t>(i) * d;
    const double denom = std::sqrt(streaming::dot(p, p, d) * streaming::dot(g, g, d));
    if (denom > 0.0) {
      cosine_sum += streaming::dot(p, g, d) / denom;
      ++cosine_count;
    }
  }
  info.cosine =
      cosine_count > 0 ? cosine_sum / cosine_count : std::numeric_limits<double>::quiet_NaN();
  info.best_loss = std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) {
    if (!finite[static_cast<std::size_t>(i)]) {
      ++info.dropped;
      continue;
    }
    info.best_loss = std::min(info.best_loss, batch.loss(i));
    history_.push(batch.point(i), batch.grad(i));
  }
  info.loss = batch.loss(c);
  auto gc = batch.grad(c);
  info.grad_norm = std::sqrt(streaming::dot(gc.data(), gc.data(), d));
  info.committed_point = c;

  std::swap(x_, next_x_);
  std::swap(state_, work_state_);
  ++iteration_;
  evaluations_ += n;
  if (options_.proxy == Proxy::target) evaluations_ += n - 1;  // the oracle's sequential calls
  pending_ = false;
  fitted_ = false;
  info.iteration = iteration_;
  info.evaluations = evaluations_;
  info.iterate = x_;
  info_ = info;
  return info_;
}

}  // namespace optex
