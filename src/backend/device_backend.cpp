// The device backend's construction, its memory, host views, restore and the
// history's statistics (device_backend.hpp describes the whole backend).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <memory>

#include "backend/device_backend.hpp"
#include "sharded/completed_sums.hpp"

#include "optex/backend/bf16.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/estimator/gp_estimator.hpp"
#include "optex/util/allocation.hpp"

namespace optex::detail {

// The most values one fetch of sums brings: a commit's (per compared row
// four, then ||g_c||^2 and the step's, and the new Gram rows: distances,
// norms, inner products), a reduction's (two per point). observe() fetches
// the Gram rows of its pairs in pieces of what fits.
std::size_t sums_capacity(std::size_t n, std::size_t t0) {
  // With N = 1 the statistics of up to T0 pairs are brought up to date at once.
  const std::size_t pairs = n == 1 ? t0 : std::min(n, t0);
  return std::max({4 * n + 2, pairs * (2 * t0 + 1) + 4 * n + 2, 2 * n});
}

DeviceBackend::DeviceBackend(std::unique_ptr<DevicePrimitives> primitives,
                             std::span<const float> x0, const OptimizerRanges& optimizer,
                             const Options& options, const CoordinateShard& shard)
    : p_(std::move(primitives)),
      optimizer_(optimizer),
      kernel_(options.kernel),
      noise_(options.noise),
      scaling_(options.input_scaling),
      d_(x0.size()),
      n_(options.parallelism),
      capacity_(static_cast<std::size_t>(options.history)),
      slots_(optimizer.state_slots()),
      bound_(magnitude_bound(shard.dim)),
      sums_(shard.sums),
      sums_slack_(kUnderflowPerCoordinate * static_cast<double>(shard.dim)),
      keeps_backup_(!p_->copies_cannot_fail() || shard.sums != nullptr),
      lazy_gram_(options.parallelism == 1 && shard.sums == nullptr),
      gram_(capacity_),
      // Where the options ask for it and the engine could ever take it (the
      // optimizer's kind and ranges are checked again each round).
      coefficients_wanted_(options.proxy_distances == ProxyDistances::coefficients &&
                           shard.sums == nullptr && options.parallelism > 1),
      fresh_capacity_(std::min<std::size_t>(static_cast<std::size_t>(options.parallelism),
                                            static_cast<std::size_t>(options.history))) {
  if (!std::isfinite(noise_) || noise_ < 0.0) {
    throw std::invalid_argument("noise: must be finite and >= 0, got " + std::to_string(noise_));
  }
  const auto n = static_cast<std::size_t>(n_);
  const std::size_t t0 = capacity_;
  const std::size_t pairs = std::min(n, t0);
  const std::size_t sums = sums_capacity(n, t0);
  const std::size_t anchor = coefficients_wanted_ ? AnchorLayout(t0, fresh_capacity_).size() : 0;
  const std::size_t staging = sizeof(double) * ((n - 1) * t0 + (n - 1) + t0 + sums + 2 + anchor) +
                              sizeof(int) * (2 * n + 4);
  p_->check_memory(bytes_needed(options), staging,
                   "an engine of dimension " + std::to_string(d_) + ", history " +
                       std::to_string(t0) + " and parallelism " + std::to_string(n));
  x_ = p_->floats(d_);
  next_x_ = p_->floats(d_);
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (!slots_.uses(j)) continue;
    state_.slot[j] = p_->floats(d_);
    work_.slot[j] = p_->floats(d_);
  }
  history_x_ = p_->rows(t0 * d_, point_storage(options.history_precision));
  history_g_ = p_->rows(t0 * d_, gradient_storage(options.history_precision));
  if (keeps_backup_) {
    backup_x_ = p_->rows(pairs * d_, history_x_.storage);
    backup_g_ = p_->rows(pairs * d_, history_g_.storage);
  }
  query_distances_ = p_->doubles(t0);
  weights_ = p_->doubles(std::max<std::size_t>(n - 1, 1) * t0);
  variances_ = p_->doubles(std::max<std::size_t>(n - 1, 1));
  gp_infos_ = p_->ints(std::max<std::size_t>(n - 1, 1));
  flags_ = p_->ints(n + kMaxStateSlots + 1);
  sums_device_ = p_->doubles(sums);
  staged_norm_ = p_->doubles(2);
  if (coefficients_wanted_) {
    anchor_device_ = p_->doubles(AnchorLayout(t0, fresh_capacity_).size());
    anchor_host_.assign(AnchorLayout(t0, fresh_capacity_).size(), 0.0);
    pair_products_.assign(t0 * t0, 0.0);
    pair_known_.assign(t0, 0);
    fresh_.reserve(t0);
  }
  gp_rows_.assign(n, 0);
  variance_known_.assign(n, 0);
  weights_host_.assign(std::max<std::size_t>(n - 1, 1) * t0, 0.0);
  variances_host_.assign(n, kNaN);
  gp_infos_host_.assign(n, 0);
  query_host_.assign(t0, 0.0);
  flags_host_.assign(n + kMaxStateSlots + 1, 0);
  sums_host_.assign(sums, 0.0);
  pushes_.reserve(pairs);
  if (sums_ != nullptr) push_of_slot_.assign(t0, -1);
  stale_.reserve(t0);
  query_x_.reserve(t0);
  query_g_.reserve(t0);
  covariance_.resize(static_cast<Eigen::Index>(t0), static_cast<Eigen::Index>(t0));
  // The state starts at zero (the primitives' memory is zeroed on the host;
  // a device zeroes it here). x0 is the caller's memory: wait for the copy.
  p_->put(x0.data(), x_, d_ * sizeof(float));
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (slots_.uses(j)) p_->zero(state_.slot[j], d_);
  }
  p_->fetch({});
}

std::size_t DeviceBackend::bytes_needed(const Options& options) const {
  // Saturating: the check reports a size that cannot fit rather than a wrapped one.
  const auto mul = [](std::size_t a, std::size_t b) {
    return b != 0 && a > SIZE_MAX / b ? SIZE_MAX : a * b;
  };
  const auto add = [](std::size_t a, std::size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; };
  const auto n = static_cast<std::size_t>(n_);
  const std::size_t per_row = storage_bytes(point_storage(options.history_precision)) +
                              storage_bytes(gradient_storage(options.history_precision));
  std::size_t bytes = mul(mul(capacity_, d_), per_row);  // the history
  if (keeps_backup_) bytes = add(bytes, mul(mul(std::min(n, capacity_), d_), per_row));
  const std::size_t vectors = 2 + 2 * static_cast<std::size_t>(slots_.count());
  bytes = add(bytes, mul(mul(vectors, d_), sizeof(float)));  // iterate, state, their copies
  if (!p_->host_memory()) {  // batch rows: the batch's, and a chain's when it has one
    const std::size_t sets = options.separates_points_from_rows() ? 2 : 1;
    bytes = add(bytes, mul(mul(sets * (3 * n - 1), d_), sizeof(float)));
  }
  // The GP's weights, distances and variances, the sums, the staged gradient's
  // norm, and the anchor products of proxy steps in coefficient space.
  const std::size_t anchor =
      coefficients_wanted_ ? AnchorLayout(capacity_, fresh_capacity_).size() : 0;
  return add(bytes,
             sizeof(double) * (capacity_ * (n + 1) + sums_capacity(n, capacity_) + 2 + anchor));
}

BatchRows DeviceBackend::rows_of(Batch& batch) {
  if (batch.dim() != d_ || batch.size() > n_) {
    throw std::invalid_argument(
        "batch: " + std::to_string(batch.size()) + " x " + std::to_string(batch.dim()) +
        " does not fit N x d = " + std::to_string(n_) + " x " + std::to_string(d_));
  }
  if (p_->host_memory()) {
    return {BatchAccess::points(batch), BatchAccess::grads(batch), BatchAccess::predicted(batch)};
  }
  // A device batch keeps its rows (a moved engine carries its batches along).
  for (std::size_t k = 0; k < row_sets_.size(); ++k) {
    if (batch.device_points() == row_sets_[k].points) return row_sets_[k];
  }
  if (row_sets_.size() == 2) {
    throw std::logic_error("device backend: a third batch; the engine has a batch and a chain");
  }
  const auto n = static_cast<std::size_t>(n_);
  BatchRows rows{p_->floats(n * d_), p_->floats(n * d_), p_->floats((n - 1) * d_)};
  BatchAccess::attach_device(batch, p_.get(), rows.points, rows.grads, rows.predicted);
  row_sets_.push_back(rows);
  return rows;
}

// ---- the optimizer state -----------------------------------------------------------

void DeviceBackend::reset_work_state() {
  // No copy: the next step reads the committed state and writes the work state.
  work_is_committed_ = true;
  work_step_ = step_;
}

void DeviceBackend::enqueue_step(const StepGradient& gradient, const float* x_in, float* x_out,
                                 const StepChecks& checks) {
  p_->step(optimizer_, work_step_, work_is_committed_ ? state_ : work_, work_, x_in, x_out,
           gradient, d_, checks);
  work_is_committed_ = false;
  ++work_step_;
}

void DeviceBackend::materialize_work_state() {
  if (!work_is_committed_) return;
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (slots_.uses(j)) p_->copy(state_.slot[j], work_.slot[j], d_);
  }
  work_is_committed_ = false;
}

int DeviceBackend::enqueue_within(const float* rows, int nrows) {
  p_->within_bound(rows, static_cast<std::size_t>(nrows), d_, bound_, flags_);
  int count = nrows;
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (slots_.uses(j)) p_->within_bound(work().slot[j], 1, d_, FLT_MAX, flags_ + count++);
  }
  return count;
}

bool DeviceBackend::flags_all(int count) const {
  return std::all_of(flags_host_.begin(), flags_host_.begin() + count,
                     [](int ok) { return ok != 0; });
}

// ---- host views and restore -----------------------------------------------------------

const OptimizerState& DeviceBackend::optimizer_state() {
  if (state_host_.used() != slots_) state_host_ = init_state(optimizer_, d_);
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (slots_.uses(j)) {
      p_->download(state_.slot[j], state_host_.slots[static_cast<std::size_t>(j)].data(), d_);
    }
  }
  state_host_.step = step_;
  return state_host_;
}

const GradientHistory& DeviceBackend::history() {
  refresh_gram();
  if (!history_host_) history_host_ = std::make_unique<GradientHistory>(capacity_, d_);
  if (!history_host_current_) {
    p_->view_stored(history_x_, gram_.size() * d_, view_points_);
    p_->view_stored(history_g_, gram_.size() * d_, view_gradients_);
    history_host_->assign(gram_, view_points_, view_gradients_);
    history_host_current_ = true;
  }
  return *history_host_;
}

void DeviceBackend::restore(const OptimizerState& state, const GradientHistory& history) {
  bool matches = history.capacity() == capacity_ && history.dim() == d_;
  for (int j = 0; j < kMaxStateSlots; ++j) {
    matches = matches && state.slots[static_cast<std::size_t>(j)].size() ==
                             (slots_.uses(j) ? d_ : std::size_t{0});
  }
  if (!matches) {
    throw std::invalid_argument(
        "restore: the optimizer state or history does not match this engine (dim " +
        std::to_string(d_) + ", history " + std::to_string(capacity_) + ")");
  }
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (slots_.uses(j)) {
      p_->put(state.slots[static_cast<std::size_t>(j)].data(), state_.slot[j], d_ * sizeof(float));
    }
  }
  // Row by row (through next_x_ where the storage converts).
  const auto upload = [&](const float* rows, StoredRows to) {
    for (std::size_t r = 0; r < history.size(); ++r) put_row(rows + r * d_, to.row(r, d_));
  };
  upload(history.points_data(), history_x_);
  upload(history.gradients_data(), history_g_);
  p_->fetch({});  // the sources are the caller's
  gram_ = static_cast<const HistoryGram&>(history);
  stale_.clear();
  std::fill(pair_known_.begin(), pair_known_.end(), 0);
  backed_up_ = false;
  // Rows that the storage rounds have other distances and inner products than the
  // given ones. Rows it holds exactly (a checkpoint of this storage) keep the given
  // statistics: recomputed, they could differ in the last bits where the device's
  // reductions depend on how many rows they are given (cuBLAS picks its kernel by shape).
  const std::size_t values = history.size() * d_;
  if (!stored_exactly(std::span(history.points_data(), values), history_x_.storage) ||
      !stored_exactly(std::span(history.gradients_data(), values), history_g_.storage)) {
    recompute_gram();
  }
  step_ = state.step;
  work_step_ = state.step;
  work_is_committed_ = true;
  work_state_is_last_ = false;
  fitted_size_ = 0;
  history_host_current_ = false;
}

bool DeviceBackend::stored_exactly(std::span<const float> values, Storage storage) {
  if (storage == Storage::fp32) return true;
  return std::all_of(values.begin(), values.end(),
                     [](float v) { return detail::from_bf16(detail::to_bf16(v)) == v; });
}

void DeviceBackend::put_row(const float* host, StoredRows to) {
  if (to.storage == Storage::fp32) {
    p_->put(host, to.data, d_ * sizeof(float));
  } else {
    p_->put(host, next_x_, d_ * sizeof(float));
    p_->store(next_x_, to, d_);
  }
}

void DeviceBackend::recompute_gram() {
  const std::size_t size = gram_.size();
  std::vector<StoredRows> xs, gs;
  for (std::size_t s = 0; s < size; ++s) {
    xs.push_back(history_x_.row(s, d_));
    gs.push_back(history_g_.row(s, d_));
  }
  std::vector<double> sums(size * (2 * size + 1));
  double* distances = p_->doubles(sums.size());  // once per restore
  p_->squared_distances(history_x_, size, d_, xs, distances, distances + size * size);
  p_->inner_products(history_g_, size, d_, gs, distances + size * size + size);
  p_->fetch(std::vector<Fetch>{fetch_of<double>(distances, sums.data(), sums.size())});
  complete_sums(sums_, sums);
  if (sums_ != nullptr) {
    const GramRows rows{size, size, sums.data(), sums.data() + size * size,
                        sums.data() + size * size + size};
    check_gram_rows(
        rows, [](std::size_t k) { return k; },
        [](std::size_t j) { return static_cast<std::ptrdiff_t>(j); }, sums_slack_,
        !p_->device().is_cuda());
  }
  for (std::size_t s = 0; s < size; ++s) {
    gram_.set_row(s, sums.data() + s * size, sums[size * size + s],
                  sums.data() + size * size + size + s * size);
  }
}

void DeviceBackend::refresh_gram() {
  if (stale_.empty()) return;
  const std::size_t size = gram_.size();
  const std::size_t pairs = stale_.size();
  query_x_.clear();
  query_g_.clear();
  for (const std::size_t slot : stale_) {
    query_x_.push_back(history_x_.row(slot, d_));
    query_g_.push_back(history_g_.row(slot, d_));
  }
  const std::size_t values = pairs * (2 * size + 1);
  p_->squared_distances(history_x_, size, d_, query_x_, sums_device_, sums_device_ + pairs * size);
  p_->inner_products(history_g_, size, d_, query_g_, sums_device_ + pairs * size + pairs);
  p_->fetch(std::vector<Fetch>{fetch_of<double>(sums_device_, sums_host_.data(), values)});
  const double* host = sums_host_.data();
  for (std::size_t k = 0; k < pairs; ++k) {
    gram_.set_row(stale_[k], host + k * size, host[pairs * size + k],
                  host + pairs * size + pairs + k * size);
  }
  stale_.clear();
}

std::unique_ptr<EngineBackend> make_device_backend(std::unique_ptr<DevicePrimitives> primitives,
                                                   std::span<const float> x0,
                                                   const OptimizerRanges& optimizer,
                                                   const Options& options,
                                                   const CoordinateShard& shard) {
  const std::string what = "engine: dimension " + std::to_string(x0.size());
  return allocate_or_explain(what, "iterate, optimizer state, history and batch rows",
                             x0.size() * sizeof(float), [&] {
                               return std::make_unique<DeviceBackend>(std::move(primitives), x0,
                                                                      optimizer, options, shard);
                             });
}

namespace {

struct TestPrimitives {
  PrimitivesFactory factory = nullptr;
  void* context = nullptr;
};
thread_local TestPrimitives test_factory;

}  // namespace

ScopedPrimitives::ScopedPrimitives(PrimitivesFactory factory, void* context)
    : previous_(test_factory.factory), previous_context_(test_factory.context) {
  test_factory = {factory, context};
}
ScopedPrimitives::~ScopedPrimitives() { test_factory = {previous_, previous_context_}; }

PrimitivesFactory test_primitives(void** context) {
  *context = test_factory.context;
  return test_factory.factory;
}

std::unique_ptr<EngineBackend> make_cpu_backend(std::span<const float> x0,
                                                const OptimizerRanges& optimizer,
                                                const Options& options,
                                                const CoordinateShard& shard) {
  void* context = nullptr;
  const PrimitivesFactory factory = test_primitives(&context);
  return make_device_backend(
      factory ? factory(options.threads, context) : make_cpu_primitives(options.threads), x0,
      optimizer, options, shard);
}

std::unique_ptr<EngineBackend> make_cuda_backend(std::span<const float> x0,
                                                 const OptimizerRanges& optimizer,
                                                 const Options& options,
                                                 const CoordinateShard& shard) {
  return make_device_backend(make_cuda_primitives(options.device), x0, optimizer, options, shard);
}

}  // namespace optex::detail
