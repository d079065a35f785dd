// The CUDA backend's construction, its optimizer state, its host views and
// checkpoint restore (cuda_backend.hpp describes the whole backend).
#include "cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cfloat>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_check.hpp"
#include "device_memory.hpp"
#include "optex/detail/bf16.hpp"
#include "optex/magnitude_bound.hpp"

namespace optex::cuda {

using detail::BatchAccess;

template <class PointStore, class GradStore>
CudaBackend<PointStore, GradStore>::CudaBackend(std::span<const float> x0,
                                                const OptimizerRanges& optimizer,
                                                const Options& options,
                                                const CoordinateShard& shard)
    : activation_(checked_device(options.device)),
      options_(options),
      optimizer_(optimizer),
      device_index_(options.device.index),
      d_(x0.size()),
      n_points_(options.parallelism),
      capacity_(static_cast<std::size_t>(options.history)),
      slots_(optimizer.state_slots()),
      reduction_blocks_(reduction_blocks(x0.size())),
      bound_(magnitude_bound(shard.dim)),
      sums_(shard.sums),
      blas_(stream_.get()),
      solver_(stream_.get()),
      device_bytes_(check_device_memory(x0.size(), optimizer.state_slots().count(), options,
                                        sizeof(PointStore), sizeof(GradStore))),
      gram_(static_cast<std::size_t>(options.history)),
      covariance_(options.history, options.history) {
  const auto n = static_cast<std::size_t>(n_points_);
  const std::size_t t0 = capacity_;
  const int t0_int = options.history;

  // The factor and the potrf workspace are sized for T0 once.
  cholesky_ = DeviceBuffer<double>(t0 * t0);
  OPTEX_CUDA_CHECK(cusolverDnDpotrf_bufferSize(solver_.get(), CUBLAS_FILL_MODE_LOWER, t0_int,
                                               cholesky_.data(), t0_int, &potrf_lwork_));

  x_ = DeviceBuffer<float>(d_);
  next_x_ = DeviceBuffer<float>(d_);
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (!slots_.uses(j)) continue;
    state_[j] = DeviceBuffer<float>(d_);
    work_state_[j] = DeviceBuffer<float>(d_);
  }
  history_x_ = DeviceBuffer<PointStore>(t0 * d_);
  history_g_ = DeviceBuffer<GradStore>(t0 * d_);
  points_ = DeviceBuffer<float>(n * d_);
  grads_ = DeviceBuffer<float>(n * d_);
  predicted_ = DeviceBuffer<float>((n - 1) * d_);
  weights_ = DeviceBuffer<double>((n - 1) * t0);
  potrf_work_ = DeviceBuffer<double>(static_cast<std::size_t>(std::max(potrf_lwork_, 1)));
  query_distances_ = DeviceBuffer<double>(t0);
  partials_ = DeviceBuffer<double>(static_cast<std::size_t>(reduction_blocks_) * std::max(t0, n));
  new_distances_ = DeviceBuffer<double>(t0 * t0);
  new_norms_ = DeviceBuffer<double>(t0);
  dots_ = DeviceBuffer<double>(3 * n);
  new_inner_ = DeviceBuffer<float>(t0 * t0);
  potrf_info_ = DeviceBuffer<int>(1);
  potrs_info_ = DeviceBuffer<int>(1);
  finite_ = DeviceBuffer<int>(n + kMaxStateSlots);  // per row, then per state slot

  covariance_host_ = PinnedBuffer<double>(t0 * t0);
  weights_host_ = PinnedBuffer<double>((n - 1) * t0);
  new_distances_host_ = PinnedBuffer<double>(t0 * t0);
  new_norms_host_ = PinnedBuffer<double>(t0);
  dots_host_ = PinnedBuffer<double>(3 * n);
  new_inner_host_ = PinnedBuffer<float>(t0 * t0);
  info_host_ = PinnedBuffer<int>(1);
  finite_host_ = PinnedBuffer<int>(n + kMaxStateSlots);
  if (sums_ != nullptr) query_distances_host_ = PinnedBuffer<double>(t0);

  gp_rows_.assign(n - 1, 0);
  push_slots_.assign(n, 0);
  final_rows_.assign(t0, -1);
  final_order_.reserve(std::min(n, t0));
  new_slots_.reserve(std::min(n, t0));
  slot_index_.assign(t0, 0);
  inner_row_.assign(t0, 0.0);
  // On a slice commit() packs its partials here: the new Gram rows' inner
  // products and distances (at most min(N, T0) rows of T0), norms, dots.
  const std::size_t new_rows = std::min(n, t0);
  if (sums_ != nullptr) commit_sums_.reserve(2 * new_rows * t0 + new_rows + 3 * n);
  x_host_.assign(d_, 0.0f);
  state_host_ = init_state(optimizer_, d_);

  // x := x0 and zero state buffers (init_state), then wait: x0 is the
  // caller's pageable memory, and construction errors belong here.
  OPTEX_CUDA_CHECK(
      cudaMemcpyAsync(x_.data(), x0.data(), row_bytes(), cudaMemcpyHostToDevice, stream()));
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (slots_.uses(j))
      OPTEX_CUDA_CHECK(cudaMemsetAsync(state_[j].data(), 0, row_bytes(), stream()));
  }
  synchronize();
  activation_.leave();  // the caller's device again; public methods guard themselves
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::require_attached(const Batch& batch) const {
  // By its rows, not its address: a moved engine carries its batch along.
  if (attached_ == nullptr || batch.device_points() != points_.data()) {
    throw std::logic_error("cuda backend: the batch was not started by begin_batch()");
  }
}

// ---- the optimizer state ---------------------------------------------------------

template <class PointStore, class GradStore>
StateRows CudaBackend<PointStore, GradStore>::state_rows() {
  StateRows rows;
  for (int j = 0; j < kMaxStateSlots; ++j)
    rows.slot[j] = slots_.uses(j) ? state_[j].data() : nullptr;
  return rows;
}

template <class PointStore, class GradStore>
StateRows CudaBackend<PointStore, GradStore>::work_state_rows() {
  StateRows rows;
  for (int j = 0; j < kMaxStateSlots; ++j)
    rows.slot[j] = slots_.uses(j) ? work_state_[j].data() : nullptr;
  return rows;
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::reset_work_state() {
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (!slots_.uses(j)) continue;
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(work_state_[j].data(), state_[j].data(), row_bytes(),
                                     cudaMemcpyDeviceToDevice, stream()));
  }
  work_step_ = step_;
}

template <class PointStore, class GradStore>
bool CudaBackend<PointStore, GradStore>::rows_and_work_state_within(const float* rows, int nrows) {
  rows_finite(rows, nrows, d_, bound_, finite_.data(), stream());
  int checks = nrows;
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (!slots_.uses(j)) continue;
    rows_finite(work_state_[j].data(), 1, d_, FLT_MAX, finite_.data() + checks++, stream());
  }
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(finite_host_.data(), finite_.data(),
                                   static_cast<std::size_t>(checks) * sizeof(int),
                                   cudaMemcpyDeviceToHost, stream()));
  synchronize();  // the caller decides on the host
  return std::all_of(finite_host_.data(), finite_host_.data() + checks,
                     [](int ok) { return ok != 0; });
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::enqueue_step(const GradStore* history,
                                                      const double* weights, int nrows,
                                                      const float* gradient, float* predicted,
                                                      const float* x_in, float* x_out) {
  fill_step_coefficients(optimizer_, work_step_, step_coefficients_);
  optimizer_step<GradStore>(history, weights, nrows, gradient, predicted, x_in, x_out,
                            work_state_rows(), step_coefficients_, d_, stream());
  ++work_step_;
}

// ---- host views ----------------------------------------------------------------

template <class PointStore, class GradStore>
const float* CudaBackend<PointStore, GradStore>::device_iterate() {
  DeviceGuard guard(device_index_);
  synchronize();  // the caller may read it from any stream or copy engine
  return x_.data();
}

template <class PointStore, class GradStore>
std::span<const float> CudaBackend<PointStore, GradStore>::iterate() {
  DeviceGuard guard(device_index_);
  OPTEX_CUDA_CHECK(
      cudaMemcpyAsync(x_host_.data(), x_.data(), row_bytes(), cudaMemcpyDeviceToHost, stream()));
  synchronize();  // the caller reads the copy on return
  return x_host_;
}

template <class PointStore, class GradStore>
const OptimizerState& CudaBackend<PointStore, GradStore>::optimizer_state() {
  DeviceGuard guard(device_index_);
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (!slots_.uses(j)) continue;
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(state_host_.slots[static_cast<std::size_t>(j)].data(),
                                     state_[j].data(), row_bytes(), cudaMemcpyDeviceToHost,
                                     stream()));
  }
  state_host_.step = step_;
  synchronize();  // the caller reads the copy on return
  return state_host_;
}

template <class PointStore, class GradStore>
template <class Store>
void CudaBackend<PointStore, GradStore>::download_history(const DeviceBuffer<Store>& src,
                                                          std::size_t rows,
                                                          std::vector<float>& dst) {
  const std::size_t count = rows * d_;
  dst.resize(count);
  if (count == 0) return;
  if constexpr (std::is_same_v<Store, float>) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), count * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream()));
    synchronize();  // the caller reads the copy on return
  } else {
    std::vector<Store> raw(count);
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(raw.data(), src.data(), count * sizeof(Store),
                                     cudaMemcpyDeviceToHost, stream()));
    synchronize();  // converted on the host right below
    std::transform(raw.begin(), raw.end(), dst.begin(),
                   [](Store b) { return detail::from_bf16(b); });
  }
}

template <class PointStore, class GradStore>
const GradientHistory& CudaBackend<PointStore, GradStore>::history() {
  DeviceGuard guard(device_index_);
  if (!history_host_) history_host_ = std::make_unique<GradientHistory>(capacity_, d_);
  if (!history_host_current_) {
    std::vector<float> points;
    std::vector<float> gradients;
    download_history(history_x_, gram_.size(), points);
    download_history(history_g_, gram_.size(), gradients);
    history_host_->assign(gram_, points, gradients);
    history_host_current_ = true;
  }
  return *history_host_;
}

// ---- checkpoint restore ------------------------------------------------------------

template <class PointStore, class GradStore>
template <class Store>
void CudaBackend<PointStore, GradStore>::upload_history(const float* src, std::size_t rows,
                                                        DeviceBuffer<Store>& dst) {
  const std::size_t count = rows * d_;
  if (count == 0) return;
  if constexpr (std::is_same_v<Store, float>) {
    OPTEX_CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src, count * sizeof(float), cudaMemcpyHostToDevice, stream()));
  } else {
    std::vector<Store> raw(count);
    std::transform(src, src + count, raw.begin(), [](float f) { return detail::to_bf16(f); });
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(dst.data(), raw.data(), count * sizeof(Store),
                                     cudaMemcpyHostToDevice, stream()));
    synchronize();  // `raw` is freed on return
  }
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::restore(const OptimizerState& state,
                                                 const GradientHistory& history) {
  DeviceGuard guard(device_index_);
  bool matches = history.capacity() == capacity_ && history.dim() == d_;
  for (int j = 0; j < kMaxStateSlots; ++j) {
    const std::size_t want = slots_.uses(j) ? d_ : 0;
    matches = matches && state.slots[static_cast<std::size_t>(j)].size() == want;
  }
  if (!matches) {
    throw std::invalid_argument(
        "restore: the optimizer state or history does not match this engine (dim " +
        std::to_string(d_) + ", history " + std::to_string(capacity_) + ")");
  }
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (!slots_.uses(j)) continue;
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(state_[j].data(),
                                     state.slots[static_cast<std::size_t>(j)].data(), row_bytes(),
                                     cudaMemcpyHostToDevice, stream()));
  }
  upload_history(history.points_data(), history.size(), history_x_);
  upload_history(history.gradients_data(), history.size(), history_g_);
  synchronize();  // the sources are the caller's; copy errors surface here, not later
  step_ = state.step;
  work_step_ = state.step;
  work_state_is_last_ = false;
  gram_ = static_cast<const HistoryGram&>(history);
  fitted_size_ = 0;
  history_host_current_ = false;
}

// ---- DeviceRows ------------------------------------------------------------------

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::download(const float* device_src, float* host_dst,
                                                  std::size_t count) const {
  DeviceGuard guard(device_index_);
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, count * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream()));
  synchronize();  // the caller reads the row on return
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::upload(const float* host_src, float* device_dst,
                                                std::size_t count) const {
  DeviceGuard guard(device_index_);
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, count * sizeof(float),
                                   cudaMemcpyHostToDevice, stream()));
  // A pageable upload may return before its DMA lands; the caller may reuse
  // its buffer or launch on another stream next.
  synchronize();
}

#define OPTEX_INSTANTIATE(P, G) template class CudaBackend<P, G>;
OPTEX_FOR_EACH_HISTORY_STORAGE(OPTEX_INSTANTIATE)
#undef OPTEX_INSTANTIATE

}  // namespace optex::cuda

namespace optex::detail {

std::unique_ptr<EngineBackend> make_cuda_backend(std::span<const float> x0,
                                                 const OptimizerRanges& optimizer,
                                                 const Options& options,
                                                 const CoordinateShard& shard) {
  switch (options.history_precision) {
    case Precision::bf16:
      return std::make_unique<cuda::CudaBackend<bf16_bits, bf16_bits>>(x0, optimizer, options,
                                                                       shard);
    case Precision::bf16_gradients:
      return std::make_unique<cuda::CudaBackend<float, bf16_bits>>(x0, optimizer, options, shard);
    case Precision::fp32:
      break;
  }
  return std::make_unique<cuda::CudaBackend<float, float>>(x0, optimizer, options, shard);
}

}  // namespace optex::detail
