#include "optex/engine/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "optex/backend/block_pool.hpp"
#include "optex/backend/engine_backend.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/engine/point_evaluations.hpp"
#include "optex/estimator/lengthscale_selection.hpp"

namespace optex {
namespace {

using detail::ProxySource;

std::uint64_t next_engine_id() {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1);
}

// x0 is the shard's slice (the whole vector unless the engine is sharded):
// the bound is the whole vector's, elements are numbered in it.
std::span<const float> checked_start(std::span<const float> x0, const CoordinateShard& shard) {
  if (x0.empty()) throw std::invalid_argument("x0: dimension must be >= 1, got 0");
  if (x0.size() != shard.size || shard.offset > shard.dim ||
      shard.size > shard.dim - shard.offset) {
    throw std::invalid_argument("shard: a slice of " + std::to_string(shard.size) +
                                " coordinates at offset " + std::to_string(shard.offset) +
                                " of dimension " + std::to_string(shard.dim) +
                                " does not match x0's " + std::to_string(x0.size()));
  }
  // A slice cuts the whole vector's blocks (shard_of): its passes then add the
  // block sums the whole engine adds, and its blocks are the slices' own.
  if (!shard.is_whole() &&
      (shard.offset % kCoordinateBlock != 0 ||
       (shard.size % kCoordinateBlock != 0 && shard.offset + shard.size != shard.dim))) {
    throw std::invalid_argument(
        "shard: a slice of " + std::to_string(shard.size) + " coordinates at offset " +
        std::to_string(shard.offset) + " of dimension " + std::to_string(shard.dim) +
        " is off the block grid: a slice is a run of whole blocks of " +
        std::to_string(kCoordinateBlock) + " coordinates (its offset a multiple of " +
        std::to_string(kCoordinateBlock) +
        ", its size too unless it ends at the dimension), as shard_of cuts them");
  }
  const float bound = magnitude_bound(shard.dim);
  for (std::size_t i = 0; i < x0.size(); ++i) {
    if (!within_bound(x0[i], bound)) {
      std::ostringstream msg;
      msg << "x0: element " << shard.offset + i << " is " << x0[i]
          << " (must be finite and at most " << bound << " in magnitude, the bound for dimension "
          << shard.dim << ")";
      throw std::invalid_argument(msg.str());
    }
  }
  return x0;
}

// The ranges sized for x0. A new engine's state is at step 0, so every range
// joins there (an engine resumes later steps from a snapshot).
OptimizerRanges starting_ranges(const OptimizerRanges& optimizer, std::span<const float> x0,
                                const CoordinateShard& shard) {
  OptimizerRanges sized = optimizer.for_dimension(checked_start(x0, shard).size());
  check_step_offsets(sized, 0);
  return sized;
}

std::runtime_error nothing_to_commit(std::int64_t iteration) {
  return std::runtime_error(
      "tell: no pair of iteration " + std::to_string(iteration) +
      " can be committed (each gradient or loss is non-finite or above the magnitude bound, or "
      "steps to a non-finite iterate or state); nothing was committed and the batch is still "
      "pending");
}

std::string refused_rows_message(const std::vector<int>& rows, std::int64_t iteration,
                                 float bound) {
  std::ostringstream msg;
  msg << "tell: row" << (rows.size() == 1 ? " " : "s ");
  for (std::size_t i = 0; i < rows.size(); ++i) msg << (i > 0 ? ", " : "") << rows[i];
  msg << " of iteration " << iteration
      << " have a gradient that is not finite or exceeds the magnitude bound " << bound
      << ", or a loss that is not finite; nothing was committed and the batch is still pending "
         "(NonfiniteRows::drop keeps such rows out of the history instead)";
  return msg.str();
}

// The rows whose flag is 0, ascending.
std::vector<int> inadmissible_rows(std::span<const char> admissible) {
  std::vector<int> rows;
  for (std::size_t r = 0; r < admissible.size(); ++r) {
    if (!admissible[r]) rows.push_back(static_cast<int>(r));
  }
  return rows;
}

const Options& checked_options(const Options& o, const CoordinateShard& shard) {
  o.validate();
  if (!shard.is_whole() && o.proxy == Proxy::target) {
    throw std::invalid_argument(
        "proxy: Proxy::target needs the whole point for its oracle; a sharded engine holds a "
        "slice (use Proxy::gp or Proxy::last_gradient)");
  }
  return o;
}

std::unique_ptr<detail::EngineBackend> make_backend(std::span<const float> x0,
                                                    const OptimizerRanges& optimizer,
                                                    const Options& options,
                                                    const CoordinateShard& shard) {
  if (options.device.is_cuda()) return detail::make_cuda_backend(x0, optimizer, options, shard);
  return detail::make_cpu_backend(x0, optimizer, options, shard);
}

}  // namespace

RefusedRowsError::RefusedRowsError(std::vector<int> rows, std::int64_t iteration, float bound)
    : std::invalid_argument(refused_rows_message(rows, iteration, bound)), rows_(std::move(rows)) {}

void detail::group_mean(Engine& engine, const float* blocks, std::size_t count, std::size_t n,
                        float* out) {
  engine.backend().mean_in_rank_order(blocks, count, n, out);
}

Engine::Engine(std::span<const float> x0, OptimizerRanges optimizer, Options options)
    : Engine(x0, std::move(optimizer), std::move(options), CoordinateShard::whole(x0.size())) {}

Engine::Engine(std::span<const float> x0, OptimizerRanges optimizer, Options options,
               const CoordinateShard& shard)
    : options_(checked_options(options, shard)),
      shard_(shard),
      optimizer_(starting_ranges(optimizer, x0, shard)),
      backend_(make_backend(x0, optimizer_, options_, shard_)),
      lengthscale_(options_.lengthscale),
      rng_(options_.seed),
      split_rule_(options_.parallelism, options_.evaluations_per_point),
      admissible_rows_(static_cast<std::size_t>(options_.parallelism)),
      finite_(static_cast<std::size_t>(options_.parallelism)),
      id_(next_engine_id()) {
  batch_.allocate(options_.parallelism, x0.size(), options_.device);
  batch_.owner_ = id_;
  if (uses_chain()) chain_.allocate(options_.parallelism, x0.size(), options_.device);
}

bool Engine::uses_chain() const { return options_.separates_points_from_rows(); }

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

void Engine::set_threads(int threads) {
  Options changed = options_;
  changed.threads = threads;
  changed.validate();
  backend().set_threads(threads);
  options_.threads = threads;
}

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
  check_step_offsets(sized, backend().state_step());
  backend().set_optimizer(sized);
  optimizer_ = std::move(sized);
}
const OptimizerState& Engine::optimizer_state() const { return backend().optimizer_state(); }
std::int64_t Engine::optimizer_step() const { return backend().state_step(); }
const GradientHistory& Engine::history() const { return backend().history(); }
const HistoryGram& Engine::history_statistics() const { return backend().gram(); }

void Engine::refit_if_needed() {
  if (fitted_) return;
  if (options_.proxy == Proxy::gp && options_.parallelism > 1 && backend().history_size() >= 2) {
    const HistoryGram& gram = backend().gram();
    if (iteration_ % options_.selection_interval == 0) {
      const double chosen = select_lengthscale(gram, options_, lengthscale_).lengthscale;
      // The guard against a selection that runs away (a diverging history
      // drags the median distance, and the grid with it).
      const double limit = options_.max_lengthscale_change;
      lengthscale_ = std::isfinite(limit)
                         ? std::clamp(chosen, lengthscale_ / limit, lengthscale_ * limit)
                         : chosen;
    }
    backend().fit(lengthscale_);
  }
  fitted_ = true;
}

void Engine::plan_round(bool one_point) {
  const int n = batch_.size();
  const int d = one_point                                 ? n
                : options_.strategy == Strategy::adaptive ? split_rule_.evaluations_per_point()
                                                          : options_.evaluations_per_point;
  plan_.assign(static_cast<std::size_t>(n / d), d);
  if (uses_chain()) chain_.size_ = static_cast<int>(plan_.size());
}

const char* Engine::safeguard_stop(Batch& chain, int i) {
  // Read during the chain only where a safeguard needs it (a wait on a device).
  if (std::isfinite(options_.max_posterior_variance) &&
      backend().posterior_variance(i - 1) > options_.max_posterior_variance) {
    return "posterior_variance";
  }
  if (std::isfinite(options_.trust_region) && last_step_norm_ > 0.0 &&
      backend().distance_from_iterate(chain, i) > options_.trust_region * i * last_step_norm_) {
    return "trust_region";
  }
  return "";
}

void Engine::cut_chain(Batch& chain, int i) {
  int rest = 0;
  for (std::size_t p = static_cast<std::size_t>(i); p < plan_.size(); ++p) rest += plan_[p];
  plan_.resize(static_cast<std::size_t>(i));
  plan_.back() += rest;
  variance_.resize(static_cast<std::size_t>(i));
  chain.size_ = i;
  backend().discard_work_state();
}

Batch& Engine::ask() {
  if (pending_) return batch_;
  const auto saved_rng = rng_.state();
  const double saved_lengthscale = lengthscale_;
  try {
    refit_if_needed();
    batch_.iteration_ = iteration_;
    for (std::uint64_t& seed : batch_.seeds_) seed = rng_.next();
    Batch& chain = uses_chain() ? chain_ : batch_;
    backend().begin_batch(chain);

    // Where the proxy gradients come from this iteration (the history does
    // not change within one).
    const std::size_t h = backend().history_size();
    const bool reference_warmup = options_.warmup == Warmup::zero_gradient;
    ProxySource source = ProxySource::gp;
    if (options_.proxy == Proxy::target) {
      if (!oracle_ && batch_.size() > 1) {
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
    // The adaptive strategy spends a warm-up round, whose points would all
    // hold at the iterate, on one point: its N evaluations average, and
    // measure the gradient noise the next round's split needs.
    plan_round(options_.strategy == Strategy::adaptive && source == ProxySource::hold);
    const int points = static_cast<int>(plan_.size());
    chain.proxy_steps_applied_ = source != ProxySource::hold;
    const bool predicts = source != ProxySource::hold && source != ProxySource::zero;
    std::fill(chain.was_predicted_.begin(), chain.was_predicted_.end(), 0);
    variance_.assign(static_cast<std::size_t>(points), std::numeric_limits<double>::quiet_NaN());
    chain_stop_ = "";
    // The verified mode first redoes the last round's unverified steps.
    const int first = redo_window(chain);
    if (first > 1) chain.proxy_steps_applied_ = true;
    // Proxy steps: x_i = step(x_{i-1}, s_{i-1}, mu(x_{i-1})); the state really advances.
    for (int i = first; i < points; ++i) {
      chain.was_predicted_[static_cast<std::size_t>(i - 1)] = predicts ? 1 : 0;
      backend().proxy_step(chain, i, source, oracle);
      if (const char* stop = safeguard_stop(chain, i); *stop) {
        cut_chain(chain, i);
        chain_stop_ = stop;
        break;
      }
    }
    if (backend().finish_batch(chain)) {
      // The variances are on the host now; a safeguard may have read some before.
      for (std::size_t p = 0; p < variance_.size(); ++p) {
        variance_[p] = backend().posterior_variance(static_cast<int>(p));
      }
    } else {
      hold_batch(chain);
    }
    if (&chain != &batch_) backend().expand_points(chain, plan_, batch_);
  } catch (...) {
    rng_.set_state(saved_rng);
    lengthscale_ = saved_lengthscale;
    fitted_ = false;
    throw;
  }
  pending_ = true;
  return batch_;
}

void Engine::hold_batch(Batch& chain) {
  // A GP weight, a proxy point or the proxy state left the finite range: every
  // point holds at the iterate instead, as in the warm-up, so that no history
  // can make ask() fail for good (DESIGN.md section 6).
  backend().begin_batch(chain);
  chain.proxy_steps_applied_ = false;
  std::fill(chain.was_predicted_.begin(), chain.was_predicted_.end(), 0);
  std::fill(variance_.begin(), variance_.end(), std::numeric_limits<double>::quiet_NaN());
  for (int i = 1; i < chain.size(); ++i) backend().proxy_step(chain, i, ProxySource::hold, {});
  if (!backend().finish_batch(chain)) {
    throw std::logic_error("engine: a held batch is not usable (the iterate is out of bounds)");
  }
}

void Engine::admit_rows(Batch& rows, std::span<char> admissible) {
  backend().check_gradients(rows, admissible);
  for (std::size_t r = 0; r < admissible.size(); ++r) {
    char& ok = admissible[r];
    ok = ok && std::isfinite(rows.loss(static_cast<int>(r))) ? 1 : 0;
  }
}

std::vector<int> Engine::nonfinite_points(Batch& batch) {
  check_pending_batch(batch);
  const std::span<char> admissible(finite_.data(), static_cast<std::size_t>(batch.size()));
  admit_rows(batch, admissible);
  return inadmissible_rows(admissible);
}

const IterationInfo& Engine::tell(Batch& batch, std::span<const CoordinateRange> unchanged,
                                  NonfiniteRows nonfinite) {
  check_pending_batch(batch);
  check_coordinate_ranges(unchanged, dim(), "unchanged");
  return commit(batch, unchanged, nonfinite);
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

const IterationInfo& Engine::tell(std::span<const float> gradients, std::span<const double> losses,
                                  std::span<const CoordinateRange> unchanged,
                                  NonfiniteRows nonfinite) {
  if (!pending_) {
    throw std::runtime_error("tell: no pending batch (iteration " + std::to_string(iteration_) +
                             "): call ask() first; tell() commits each batch once");
  }
  if (!shard_.is_whole()) {
    throw std::logic_error(
        "tell: the flat-array overload on one slice of a sharded engine; its ranks commit "
        "through ShardedEngine::tell");
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
  check_coordinate_ranges(unchanged, d, "unchanged");
  // Dropping: validate before writing, without a single admissible pair
  // nothing is written. Refusing: the commit's check decides (no pass of its
  // own here), and a refusal restores what was written below.
  if (nonfinite == NonfiniteRows::drop) {
    const float bound = magnitude_bound(d);
    bool any_admissible = false;
    for (std::size_t i = 0; i < n && !any_admissible; ++i) {
      any_admissible =
          std::isfinite(losses[i]) && all_within_bound(gradients.subspan(i * d, d), bound);
    }
    if (!any_admissible) throw nothing_to_commit(iteration_);
  }

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
  // On a device the commit uploads the staged rows over the device rows: those
  // are kept too, so that a refused call leaves them as they were.
  const detail::DeviceRows* device_rows = detail::BatchAccess::device_rows(batch_);
  if (device_rows != nullptr) {
    replaced_device_rows_.resize(n * d);
    device_rows->download(batch_.device_grads(), replaced_device_rows_.data(), n * d);
  }
  try {
    return commit(batch_, unchanged, nonfinite);
  } catch (...) {
    if (device_rows != nullptr) {
      device_rows->upload(replaced_device_rows_.data(), batch_.device_grads(), n * d);
    }
    if (!own_rows) std::copy(replaced_rows_.begin(), replaced_rows_.end(), rows.begin());
    batch_.losses_ = losses_before;
    batch_.gradient_staged_ = staged_before;
    throw;
  }
}

int Engine::commit_point(Batch& chain, std::span<char> admissible) {
  // Candidates in the order they are tried: the last point first, or the
  // lowest loss first (the later point on a tie); a candidate whose step
  // overflows is dropped like a non-finite pair.
  const int n = chain.size();
  std::vector<int> order;  // admissible points only: their losses are finite
  for (int i = n - 1; i >= 0; --i) {
    if (admissible[static_cast<std::size_t>(i)]) order.push_back(i);
  }
  if (options_.continue_from == ContinueFrom::best_loss) {
    // A total order (ties to the later point) without std::stable_sort's temporary buffer.
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      return chain.loss(a) != chain.loss(b) ? chain.loss(a) < chain.loss(b) : a > b;
    });
  }
  for (int i : order) {
    char& ok = admissible[static_cast<std::size_t>(i)];
    if (!ok) continue;
    if (backend().stage_step(chain, i)) return i;
    ok = 0;
  }
  return -1;
}

const IterationInfo& Engine::commit(Batch& batch, std::span<const CoordinateRange> unchanged,
                                    NonfiniteRows nonfinite) {
  // With a chain, the caller's rows are evaluations: each point's gradient and
  // loss become the means of its admissible ones, written to the chain only.
  const bool with_chain = uses_chain();
  Batch& chain = with_chain ? chain_ : batch;
  const int n = chain.size();
  const std::span<char> admissible(finite_.data(), static_cast<std::size_t>(n));
  // The caller's rows are checked once, here; refusing, before anything changes.
  const std::span<char> rows_admissible =
      with_chain ? std::span<char>(admissible_rows_.data(), static_cast<std::size_t>(batch.size()))
                 : admissible;
  admit_rows(batch, rows_admissible);
  if (nonfinite == NonfiniteRows::refuse) {
    std::vector<int> refused = inadmissible_rows(rows_admissible);
    if (!refused.empty()) {
      throw RefusedRowsError(std::move(refused), iteration_, magnitude_bound(shard_.dim));
    }
  }
  double gradient_noise = std::numeric_limits<double>::quiet_NaN();
  if (with_chain) {
    gradient_noise = backend().reduce_evaluations(batch, admissible_rows_, plan_, chain_);
    // A point's mean is of admissible rows only, so within the bound: its loss
    // (non-finite when none of its rows was admissible) decides.
    for (int i = 0; i < n; ++i) {
      admissible[static_cast<std::size_t>(i)] = std::isfinite(chain.loss(i)) ? 1 : 0;
    }
  }
  const bool verified = options_.mode == Mode::verified;
  double disagreement = std::numeric_limits<double>::quiet_NaN();
  int usable = 0;
  // The slots this round's pairs take (all of them when every pair is admissible).
  const std::size_t first_slot = verified ? backend().gram().next_slot() : 0;
  const int c = verified ? verified_steps(chain, admissible, disagreement, usable) - 1
                         : commit_point(chain, admissible);
  if (c < 0) throw nothing_to_commit(iteration_);
  // After the choice of c, so that it is the one made without `unchanged`.
  if (!unchanged.empty()) backend().keep_coordinates(unchanged);
  // From here on nothing throws: the state changes all at once.
  const detail::CommitStats stats = backend().commit(
      chain, c, admissible,
      std::span<const char>(chain.was_predicted_.data(), static_cast<std::size_t>(n)));

  IterationInfo info;
  info.lengthscale = lengthscale_;
  info.cosine = stats.cosine_count > 0 ? stats.cosine_sum / stats.cosine_count
                                       : std::numeric_limits<double>::quiet_NaN();
  info.best_loss = std::numeric_limits<double>::infinity();
  std::size_t row = 0;
  for (int i = 0; i < n; ++i) {
    const auto p = static_cast<std::size_t>(i);
    const int evaluations = with_chain ? plan_[p] : 1;
    int kept = 0;  // evaluations of point i that entered its mean
    for (int k = 0; k < evaluations; ++k, ++row) kept += with_chain ? admissible_rows_[row] : 1;
    if (!admissible[p]) {
      info.dropped += evaluations;
      continue;
    }
    info.dropped += evaluations - kept;
    info.best_loss = std::min(info.best_loss, chain.loss(i));
  }
  info.loss = chain.loss(c);
  info.grad_norm = stats.grad_norm;
  info.committed_point = c;
  info.point_evaluations = with_chain ? plan_ : std::vector<int>(static_cast<std::size_t>(n), 1);
  info.posterior_variance = variance_;
  info.prediction_error = stats.prediction_error;
  info.prediction_error.resize(static_cast<std::size_t>(n),
                               std::numeric_limits<double>::quiet_NaN());
  info.gradient_noise = gradient_noise;
  info.chain_stop = chain_stop_;
  info.committed_steps = verified ? c + 1 : 1;
  info.disagreement = disagreement;
  if (verified) {
    // The next round redoes the steps after the committed ones with the gradients
    // measured at their guesses, which this commit stored in order from first_slot.
    const bool carried = usable == n && c + 1 < n;
    window_carried_ = carried ? n - (c + 1) : 0;
    window_first_slot_ = carried ? (first_slot + static_cast<std::size_t>(c + 1)) %
                                       static_cast<std::size_t>(options_.history)
                                 : 0;
  }

  ++iteration_;
  evaluations_ += batch.size();
  if (options_.proxy == Proxy::target) evaluations_ += n - 1;  // the oracle's sequential calls
  last_step_norm_ = stats.step_norm;
  if (options_.strategy == Strategy::adaptive) split_rule_.update(info.gradient_noise, info.cosine);
  pending_ = false;
  fitted_ = false;
  info.iteration = iteration_;
  info.evaluations = evaluations_;
  const std::span<const float> host = backend().iterate_if_host();
  if (!host.empty()) {
    info.iterate = IterateView(host);
  } else {
    detail::EngineBackend* b = backend_.get();
    info.iterate = IterateView([b] { return b->iterate(); }, backend().dim());
  }
  info_ = std::move(info);
  return info_;
}

}  // namespace optex
