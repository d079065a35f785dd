#include "optex/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "optex/detail/engine_backend.hpp"
#include "optex/lengthscale_selection.hpp"
#include "optex/magnitude_bound.hpp"

namespace optex {
namespace {

using detail::ProxySource;

std::uint64_t next_engine_id() {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1);
}

std::span<const float> checked_start(std::span<const float> x0) {
  if (x0.empty()) throw std::invalid_argument("x0: dimension must be >= 1, got 0");
  const float bound = magnitude_bound(x0.size());
  for (std::size_t i = 0; i < x0.size(); ++i) {
    if (!within_bound(x0[i], bound)) {
      std::ostringstream msg;
      msg << "x0: element " << i << " is " << x0[i] << " (must be finite and at most " << bound
          << " in magnitude, the bound for dimension " << x0.size() << ")";
      throw std::invalid_argument(msg.str());
    }
  }
  return x0;
}

std::runtime_error nothing_to_commit(std::int64_t iteration) {
  return std::runtime_error(
      "tell: no pair of iteration " + std::to_string(iteration) +
      " can be committed (each gradient or loss is non-finite or above the magnitude bound, or "
      "steps to a non-finite iterate or state); nothing was committed and the batch is still "
      "pending");
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

detail::EngineBackend& Engine::backend() const {
  if (!backend_) {
    throw std::logic_error("engine: this Engine was moved from; use the engine it was moved to");
  }
  return *backend_;
}

std::size_t Engine::dim() const { return backend().dim(); }
std::span<const float> Engine::iterate() const { return backend().iterate(); }
const float* Engine::device_iterate() const { return backend().device_iterate(); }

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
  backend().set_optimizer(sized);
  optimizer_ = std::move(sized);
}
const OptimizerState& Engine::optimizer_state() const { return backend().optimizer_state(); }
const GradientHistory& Engine::history() const { return backend().history(); }

void Engine::refit_if_needed() {
  if (fitted_) return;
  const HistoryGram& gram = backend().gram();
  if (options_.proxy == Proxy::gp && options_.parallelism > 1 && gram.size() >= 2) {
    if (iteration_ % options_.selection_interval == 0) {
      lengthscale_ = select_lengthscale(gram, options_, lengthscale_).lengthscale;
    }
    backend().fit(lengthscale_);
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
    backend().begin_batch(batch_);

    // Where the proxy gradients come from this iteration (the history does
    // not change within one).
    const std::size_t h = backend().gram().size();
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
      backend().proxy_step(batch_, i, source, oracle);
    }
    if (!backend().finish_batch(batch_)) hold_batch();
  } catch (...) {
    rng_.set_state(saved_rng);
    lengthscale_ = saved_lengthscale;
    fitted_ = false;
    throw;
  }
  pending_ = true;
  return batch_;
}

void Engine::hold_batch() {
  // A GP weight, a proxy point or the proxy state left the finite range: every
  // point holds at the iterate instead, as in the warm-up, so that no history
  // can make ask() fail for good (DESIGN.md section 6).
  backend().begin_batch(batch_);
  batch_.proxy_steps_applied_ = false;
  std::fill(batch_.was_predicted_.begin(), batch_.was_predicted_.end(), 0);
  for (int i = 1; i < batch_.size(); ++i) backend().proxy_step(batch_, i, ProxySource::hold, {});
  if (!backend().finish_batch(batch_)) {
    throw std::logic_error("engine: a held batch is not usable (the iterate is out of bounds)");
  }
}

std::vector<int> Engine::nonfinite_points(Batch& batch) {
  check_pending_batch(batch);
  backend().check_gradients(batch, finite_);
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
  const std::size_t d = dim();
  if (gradients.size() != n * d) {
    throw std::invalid_argument("gradients: size " + std::to_string(gradients.size()) +
                                " does not match N * d = " + std::to_string(n) + " * " +
                                std::to_string(d));
  }
  if (losses.size() != n) {
    throw std::invalid_argument("losses: size " + std::to_string(losses.size()) +
                                " does not match N = " + std::to_string(n));
  }
  // Validate before writing: without a single admissible pair nothing is written.
  const float bound = magnitude_bound(d);
  bool any_admissible = false;
  for (std::size_t i = 0; i < n && !any_admissible; ++i) {
    any_admissible =
        std::isfinite(losses[i]) && all_within_bound(gradients.subspan(i * d, d), bound);
  }
  if (!any_admissible) throw nothing_to_commit(iteration_);

  // The commit may still refuse (every step overflows): the rows this call
  // replaces are kept until it succeeds. Bindings may hand the batch's own
  // buffers back: copying onto itself is not allowed.
  const std::vector<char> staged_before = batch_.gradient_staged_;
  std::span<float> rows = batch_.grads();  // host rows (staged for upload on a device)
  const bool own_rows = gradients.data() == rows.data();
  const bool own_losses = losses.data() == batch_.losses_.data();
  if (!own_rows) {
    replaced_rows_.assign(rows.begin(), rows.end());
    std::copy(gradients.begin(), gradients.end(), rows.begin());
  }
  const std::vector<double> losses_before = batch_.losses_;
  if (!own_losses) std::copy(losses.begin(), losses.end(), batch_.losses_.begin());
  try {
    return commit(batch_);
  } catch (...) {
    if (!own_rows) std::copy(replaced_rows_.begin(), replaced_rows_.end(), rows.begin());
    batch_.losses_ = losses_before;
    batch_.gradient_staged_ = staged_before;
    throw;
  }
}

const IterationInfo& Engine::commit(Batch& batch) {
  const int n = batch.size();
  // Which pairs may enter the history, and which point the commit steps from:
  // the last admissible pair whose step stays finite and within the bound.
  backend().check_gradients(batch, finite_);
  for (int i = 0; i < n; ++i) {
    char& ok = finite_[static_cast<std::size_t>(i)];
    ok = ok && std::isfinite(batch.loss(i)) ? 1 : 0;
  }
  int c = -1;
  for (int i = n - 1; i >= 0 && c < 0; --i) {
    char& ok = finite_[static_cast<std::size_t>(i)];
    if (!ok) continue;
    if (backend().stage_step(batch, i)) {
      c = i;
    } else {
      ok = 0;  // its step overflows: dropped like a non-finite pair
    }
  }
  if (c < 0) throw nothing_to_commit(iteration_);
  // From here on nothing throws: the state changes all at once.
  const detail::CommitStats stats = backend().commit(batch, c, finite_, batch.was_predicted_);

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
  info.iterate = backend().iterate_if_host();
  info_ = info;
  return info_;
}

}  // namespace optex
