#include "optex/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "optex/detail/engine_backend.hpp"
#include "optex/lengthscale_selection.hpp"

namespace optex {
namespace {

using detail::ProxySource;

std::uint64_t next_engine_id() {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1);
}

std::span<const float> checked_start(std::span<const float> x0) {
  if (x0.empty()) throw std::invalid_argument("x0: dimension must be >= 1, got 0");
  for (std::size_t i = 0; i < x0.size(); ++i) {
    if (!std::isfinite(x0[i])) {
      std::ostringstream msg;
      msg << "x0: element " << i << " is " << x0[i] << " (must be finite)";
      throw std::invalid_argument(msg.str());
    }
  }
  return x0;
}

const Options& checked(const Options& o) {
  o.validate();
  return o;
}

std::unique_ptr<detail::EngineBackend> make_backend(std::span<const float> x0,
                                                    const OptimizerRanges& optimizer,
                                                    const Options& options) {
  if (options.device.is_cuda()) return detail::make_cuda_backend(x0, optimizer, options);
  return detail::make_cpu_backend(x0, optimizer, options);
}

}  // namespace

Engine::Engine(std::span<const float> x0, OptimizerRanges optimizer, Options options)
    : options_(checked(options)),
      optimizer_(optimizer.for_dimension(checked_start(x0).size())),
      backend_(make_backend(x0, optimizer_, options_)),
      lengthscale_(options_.lengthscale),
      rng_(options_.seed),
      finite_(static_cast<std::size_t>(options_.parallelism)),
      id_(next_engine_id()) {
  batch_.allocate(options_.parallelism, x0.size(), options_.device);
  batch_.owner_ = id_;
}

Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

std::size_t Engine::dim() const { return backend_->dim(); }
std::span<const float> Engine::iterate() const { return backend_->iterate(); }
const float* Engine::device_iterate() const { return backend_->device_iterate(); }

void Engine::set_optimizer(const OptimizerRanges& optimizer) {
  if (pending_) {
    throw std::runtime_error("set_optimizer: between ask() and tell() (iteration " +
                             std::to_string(iteration_) +
                             "): the pending batch's proxy steps used the current hyperparameters; "
                             "call it after tell()");
  }
  OptimizerRanges sized = optimizer.for_dimension(dim());  // validates the hyperparameters
  const std::string why = cannot_replace(optimizer_, sized);
  if (!why.empty()) throw std::invalid_argument(why);
  backend_->set_optimizer(sized);
  optimizer_ = std::move(sized);
}
const OptimizerState& Engine::optimizer_state() const { return backend_->optimizer_state(); }
const GradientHistory& Engine::history() const { return backend_->history(); }

void Engine::refit_if_needed() {
  if (fitted_) return;
  const HistoryGram& gram = backend_->gram();
  if (options_.proxy == Proxy::gp && options_.parallelism > 1 && gram.size() >= 2) {
    if (iteration_ % options_.selection_interval == 0) {
      lengthscale_ = select_lengthscale(gram, options_, lengthscale_).lengthscale;
    }
    backend_->fit(lengthscale_);
  }
  fitted_ = true;
}

Batch& Engine::ask() {
  if (pending_) return batch_;
  const int n = batch_.size();
  const auto saved_rng = rng_.state();
  const double saved_lengthscale = lengthscale_;
  try {
    refit_if_needed();
    batch_.iteration_ = iteration_;
    for (int i = 0; i < n; ++i) batch_.seeds_[static_cast<std::size_t>(i)] = rng_.next();
    backend_->begin_batch(batch_);

    // Where the proxy gradients come from this iteration (the history does
    // not change within one).
    const std::size_t h = backend_->gram().size();
    const bool reference_warmup = options_.warmup == Warmup::zero_gradient;
    ProxySource source = ProxySource::gp;
    if (options_.proxy == Proxy::target) {
      if (!oracle_ && n > 1) {
        throw std::runtime_error(
            "proxy: Proxy::target needs a gradient oracle (Engine::set_gradient_oracle, or use "
            "optex::minimize)");
      }
      source = ProxySource::oracle;
    } else if (h == 0 || (h == 1 && reference_warmup && options_.proxy == Proxy::gp)) {
      // The reference still steps (with zero); otherwise the points hold at the iterate.
      source = reference_warmup ? ProxySource::zero : ProxySource::hold;
    } else if (options_.proxy == Proxy::last_gradient || h == 1) {
      source = ProxySource::newest;
    }
    // Wrapped only when used: most iterations have no oracle to call.
    detail::HostGradient oracle;
    if (source == ProxySource::oracle) {
      oracle = [this](std::span<const float> x, std::span<float> g) {
        const double loss = oracle_(x, g);
        if (!std::isfinite(loss) ||
            !std::all_of(g.begin(), g.end(), [](float a) { return std::isfinite(a); })) {
          throw std::runtime_error("proxy: the gradient oracle returned a non-finite value");
        }
      };
    }
    batch_.proxy_steps_applied_ = source != ProxySource::hold;
    const bool predicts = source != ProxySource::hold && source != ProxySource::zero;
    std::fill(batch_.was_predicted_.begin(), batch_.was_predicted_.end(), 0);
    // Proxy steps: x_i = step(x_{i-1}, s_{i-1}, mu(x_{i-1})); the state really advances.
    for (int i = 1; i < n; ++i) {
      batch_.was_predicted_[static_cast<std::size_t>(i - 1)] = predicts ? 1 : 0;
      backend_->proxy_step(batch_, i, source, oracle);
    }
    if (!backend_->finish_batch(batch_)) {
      throw std::runtime_error("proxy: the GP weights are not finite (lengthscale " +
                               std::to_string(lengthscale_) + ")");
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

std::vector<int> Engine::nonfinite_points(Batch& batch) {
  check_pending_batch(batch);
  backend_->check_gradients(batch, finite_);
  std::vector<int> points;
  for (int i = 0; i < batch.size(); ++i) {
    if (!finite_[static_cast<std::size_t>(i)] || !std::isfinite(batch.loss(i))) points.push_back(i);
  }
  return points;
}

const IterationInfo& Engine::tell(Batch& batch) {
  check_pending_batch(batch);
  return commit(batch);
}

void Engine::check_pending_batch(const Batch& batch) const {
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
  std::span<float> grads = batch_.grads();  // host rows (staged for upload on a device)
  if (gradients.data() != grads.data())
    std::copy(gradients.begin(), gradients.end(), grads.begin());
  if (losses.data() != batch_.losses_.data()) {
    std::copy(losses.begin(), losses.end(), batch_.losses_.begin());
  }
  return commit(batch_);
}

const IterationInfo& Engine::commit(Batch& batch) {
  const int n = batch.size();
  // Which pairs may enter the history, and which point the commit steps from.
  backend_->check_gradients(batch, finite_);
  int last_finite = -1;
  for (int i = 0; i < n; ++i) {
    char& ok = finite_[static_cast<std::size_t>(i)];
    ok = ok && std::isfinite(batch.loss(i)) ? 1 : 0;
    if (ok) last_finite = i;
  }
  if (last_finite < 0) {
    throw std::runtime_error("tell: every gradient or loss of iteration " +
                             std::to_string(iteration_) +
                             " is non-finite; nothing was committed and the batch is still "
                             "pending");
  }
  // From here on nothing throws: the state changes all at once.
  const int c = last_finite;
  const detail::CommitStats stats = backend_->commit(batch, c, finite_, batch.was_predicted_);

  IterationInfo info;
  info.lengthscale = lengthscale_;
  info.cosine = stats.cosine_count > 0 ? stats.cosine_sum / stats.cosine_count
                                       : std::numeric_limits<double>::quiet_NaN();
  info.best_loss = std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) {
    if (!finite_[static_cast<std::size_t>(i)]) {
      ++info.dropped;
      continue;
    }
    info.best_loss = std::min(info.best_loss, batch.loss(i));
  }
  info.loss = batch.loss(c);
  info.grad_norm = stats.grad_norm;
  info.committed_point = c;

  ++iteration_;
  evaluations_ += n;
  if (options_.proxy == Proxy::target) evaluations_ += n - 1;  // the oracle's sequential calls
  pending_ = false;
  fitted_ = false;
  info.iteration = iteration_;
  info.evaluations = evaluations_;
  info.iterate = backend_->iterate_if_host();
  info_ = info;
  return info_;
}

}  // namespace optex
