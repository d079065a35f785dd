// The CUDA backend's side of tell(): which gradient rows are finite, and the
// commit, step by step (cuda_backend.hpp describes the whole backend).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_backend.hpp"
#include "cuda_check.hpp"

namespace optex::cuda {
namespace {

template <class Store>
constexpr cudaDataType_t blas_type() {
  return std::is_same_v<Store, bf16_bits> ? CUDA_R_16BF : CUDA_R_32F;
}

}  // namespace

using detail::BatchAccess;
using detail::CommitStats;

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::check_gradients(Batch& batch, std::span<char> finite) {
  DeviceGuard guard(device_index_);
  require_attached(batch);
  const auto n = static_cast<std::size_t>(n_points_);
  if (finite.size() < n) {
    throw std::invalid_argument("finite: " + std::to_string(finite.size()) +
                                " flags for a batch of " + std::to_string(n));
  }
  // Rows written through host views: upload them (one copy per run of adjacent rows) and
  // unstage them, so that a retry after a refused tell() reads what the caller writes
  // into the device rows next rather than these host rows again.
  batch.upload_staged_gradients();
  rows_finite(grads_.data(), n_points_, d_, bound_, finite_.data(), stream());
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(finite_host_.data(), finite_.data(), n * sizeof(int),
                                   cudaMemcpyDeviceToHost, stream()));
  synchronize();  // which pairs are finite decides, on the host, where the commit steps from
  for (std::size_t r = 0; r < n; ++r) finite[r] = finite_host_.data()[r] != 0 ? 1 : 0;
  complete_flags(sums_, finite.first(n));  // a pair is finite where it is on every slice
}

template <class PointStore, class GradStore>
bool CudaBackend<PointStore, GradStore>::stage_step(Batch& batch, int c) {
  DeviceGuard guard(device_index_);
  require_attached(batch);
  enqueue_committed_step(batch, c);
  work_state_is_last_ = false;
  return on_every_slice(sums_, rows_and_work_state_within(next_x_.data(), 1));
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::keep_coordinates(std::span<const CoordinateRange> ranges) {
  DeviceGuard guard(device_index_);
  // Enqueued after the staged step on the same stream, so they overwrite it.
  const auto keep = [this](const float* current, float* staged, const CoordinateRange& r) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(staged + r.offset, current + r.offset, r.size * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream()));
  };
  for (const CoordinateRange& r : ranges) {
    keep(x_.data(), next_x_.data(), r);
    for (int j = 0; j < kMaxStateSlots; ++j) {
      if (slots_.uses(j)) keep(state_[j].data(), work_state_[j].data(), r);
    }
  }
}

template <class PointStore, class GradStore>
CommitStats CudaBackend<PointStore, GradStore>::commit(Batch& batch, int c,
                                                       std::span<const char> keep,
                                                       std::span<const char> predicted) {
  DeviceGuard guard(device_index_);
  require_attached(batch);  // stage_step(batch, c) left the step in next_x_ and the work state
  const DotRange dots = enqueue_commit_dots(c, keep, predicted);
  const PushPlan plan = plan_history_push(keep);
  enqueue_history_store();
  const std::size_t new_rows = enqueue_new_gram_rows(plan.size);
  download_commit_results(new_rows, plan.size);
  complete_commit_sums(new_rows, plan.size, dots);
  // From here on only host bookkeeping.
  record_history_push(plan);
  const CommitStats stats = commit_stats(c, keep, predicted);
  adopt_committed_state();
  return stats;
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::enqueue_committed_step(const Batch& batch, int c) {
  // From point N-1 the work state already is s_{N-1} (ask() left it there);
  // from an earlier point, replay the proxy steps from the iterate to recover
  // s_c. The first step reads x_, later ones update next_x_ in place.
  float* out = next_x_.data();
  const float* from = point_row(c);
  if (c != n_points_ - 1 || !work_state_is_last_) {
    reset_work_state();
    from = x_.data();
    if (BatchAccess::proxy_steps_applied(batch)) {
      for (int r = 0; r < c; ++r) {
        enqueue_step(nullptr, nullptr, 0, predicted_row(r), nullptr, from, out);
        from = out;
      }
    }
  }
  enqueue_step(nullptr, nullptr, 0, grad_row(c), nullptr, from, out);
}

template <class PointStore, class GradStore>
typename CudaBackend<PointStore, GradStore>::DotRange
CudaBackend<PointStore, GradStore>::enqueue_commit_dots(int c, std::span<const char> keep,
                                                        std::span<const char> predicted) {
  // dots_ holds p.p (N-1 rows), p.g (N-1 rows), g.g (N rows).
  const int n = n_points_;
  const auto nz = static_cast<std::size_t>(n);
  double* pp = dots_.data();
  double* pg = pp + (nz - 1);
  double* gg = pg + (nz - 1);
  bool any_cosine = false;
  for (std::size_t r = 0; r + 1 < nz; ++r) any_cosine = any_cosine || (keep[r] && predicted[r]);
  if (any_cosine) {
    row_dots<float>(predicted_.data(), predicted_.data(), n - 1, d_, partials_.data(), pp,
                    stream());
    row_dots<float>(predicted_.data(), grads_.data(), n - 1, d_, partials_.data(), pg, stream());
    row_dots<float>(grads_.data(), grads_.data(), n, d_, partials_.data(), gg, stream());
    return {0, 3 * nz - 2};
  }
  row_dots<float>(grad_row(c), grad_row(c), 1, d_, partials_.data(),
                  gg + static_cast<std::size_t>(c), stream());
  return {2 * (nz - 1) + static_cast<std::size_t>(c), 1};
}

template <class PointStore, class GradStore>
typename CudaBackend<PointStore, GradStore>::PushPlan
CudaBackend<PointStore, GradStore>::plan_history_push(std::span<const char> keep) {
  // Kept pairs take slots next, next+1, ... in order; with more than T0 of
  // them later pairs overwrite earlier slots, so only the last pair of each
  // slot is stored and measured. gram_ changes only once the device work
  // has succeeded.
  const auto nz = static_cast<std::size_t>(n_points_);
  PushPlan plan;
  plan.size = gram_.size();
  std::size_t next = gram_.next_slot();
  for (std::size_t r = 0; r < nz; ++r) {
    if (!keep[r]) continue;
    push_slots_[plan.pushes++] = next;
    final_rows_[next] = static_cast<int>(r);
    next = (next + 1) % capacity_;
    plan.size = std::min(plan.size + 1, capacity_);
  }
  final_order_.clear();
  for (std::size_t k = plan.pushes; k-- > 0;) {  // last pushes first, then reversed
    const std::size_t slot = push_slots_[k];
    if (std::find(final_order_.begin(), final_order_.end(), slot) == final_order_.end())
      final_order_.push_back(slot);
  }
  std::reverse(final_order_.begin(), final_order_.end());
  return plan;
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::enqueue_history_store() {
  for (const std::size_t slot : final_order_) {
    const int r = final_rows_[slot];
    store_values<PointStore>(point_row(r), history_x_.data() + offset(slot), d_, stream());
    store_values<GradStore>(grad_row(r), history_g_.data() + offset(slot), d_, stream());
  }
}

template <class PointStore, class GradStore>
std::size_t CudaBackend<PointStore, GradStore>::enqueue_new_gram_rows(std::size_t size) {
  // Rows 0..size-1 of the final history; distances and norms by the kernels,
  // gradient inner products by one GEMM per run, G^T [g_s0 .. g_s1] (fp32
  // accumulation).
  new_slots_.assign(final_order_.begin(), final_order_.end());
  std::sort(new_slots_.begin(), new_slots_.end());
  const std::size_t k_new = new_slots_.size();
  for (std::size_t k = 0; k < k_new; ++k) slot_index_[new_slots_[k]] = k;
  const int size_int = static_cast<int>(size);
  for (std::size_t k0 = 0; k0 < k_new;) {
    std::size_t k1 = k0 + 1;
    while (k1 < k_new && new_slots_[k1] == new_slots_[k1 - 1] + 1) ++k1;
    const int q = static_cast<int>(k1 - k0);
    const PointStore* xq = history_x_.data() + offset(new_slots_[k0]);
    const GradStore* gq = history_g_.data() + offset(new_slots_[k0]);
    squared_distances<PointStore, PointStore>(history_x_.data(), size_int, d_, xq, q,
                                              partials_.data(), new_distances_.data() + k0 * size,
                                              stream());
    row_dots<PointStore>(xq, xq, q, d_, partials_.data(), new_norms_.data() + k0, stream());
    gradient_gemm(size, q, history_g_.data(), gq, new_inner_.data() + k0 * size);
    k0 = k1;
  }
  return k_new;
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::gradient_gemm(std::size_t size, int q,
                                                       const GradStore* g_all,
                                                       const GradStore* g_first, float* out) {
  // Row-major T0 x d history = column-major d x T0 with ld = d: C = A^T B.
  const float one = 1.0f;
  const float zero = 0.0f;
#if CUBLAS_VER_MAJOR >= 12
  // The 64-bit interface: d may exceed INT_MAX.
  OPTEX_CUDA_CHECK(
      cublasGemmEx_64(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<std::int64_t>(size),
                      static_cast<std::int64_t>(q), static_cast<std::int64_t>(d_), &one, g_all,
                      blas_type<GradStore>(), static_cast<std::int64_t>(d_), g_first,
                      blas_type<GradStore>(), static_cast<std::int64_t>(d_), &zero, out, CUDA_R_32F,
                      static_cast<std::int64_t>(size), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
#else
  OPTEX_CUDA_CHECK(cublasGemmEx(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(size), q,
                                static_cast<int>(d_), &one, g_all, blas_type<GradStore>(),
                                static_cast<int>(d_), g_first, blas_type<GradStore>(),
                                static_cast<int>(d_), &zero, out, CUDA_R_32F,
                                static_cast<int>(size), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
#endif
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::download_commit_results(std::size_t new_rows,
                                                                 std::size_t size) {
  const auto nz = static_cast<std::size_t>(n_points_);
  const std::size_t gram_values = new_rows * size;
  if (gram_values > 0) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(new_distances_host_.data(), new_distances_.data(),
                                     gram_values * sizeof(double), cudaMemcpyDeviceToHost,
                                     stream()));
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(new_inner_host_.data(), new_inner_.data(),
                                     gram_values * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream()));
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(new_norms_host_.data(), new_norms_.data(),
                                     new_rows * sizeof(double), cudaMemcpyDeviceToHost, stream()));
  }
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(dots_host_.data(), dots_.data(), (3 * nz - 2) * sizeof(double),
                                   cudaMemcpyDeviceToHost, stream()));
  synchronize();  // the host Gram (fit, lengthscale selection), cosines and ||g_c|| need these
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::complete_commit_sums(std::size_t new_rows,
                                                              std::size_t size, DotRange dots) {
  if (sums_ == nullptr) return;
  // One collective for the whole commit: [inner products | distances | norms
  // | dots], the inner products as doubles so that their sum is not rounded
  // to float again. new_inner_row() reads them from the front.
  const std::size_t gram_values = new_rows * size;
  const std::span<double> in_place[] = {{new_distances_host_.data(), gram_values},
                                        {new_norms_host_.data(), new_rows},
                                        {dots_host_.data() + dots.first, dots.count}};
  commit_sums_.assign(new_inner_host_.data(), new_inner_host_.data() + gram_values);
  for (const std::span<double> part : in_place)
    commit_sums_.insert(commit_sums_.end(), part.begin(), part.end());
  complete_sums(sums_, commit_sums_);
  auto from = commit_sums_.cbegin() + static_cast<std::ptrdiff_t>(gram_values);
  for (const std::span<double> part : in_place) {
    std::copy_n(from, part.size(), part.begin());
    from += static_cast<std::ptrdiff_t>(part.size());
  }
}

template <class PointStore, class GradStore>
const double* CudaBackend<PointStore, GradStore>::new_inner_row(std::size_t k, std::size_t size) {
  if (sums_ != nullptr) return commit_sums_.data() + k * size;  // completed as doubles
  const float* inner = new_inner_host_.data() + k * size;
  std::transform(inner, inner + size, inner_row_.begin(),
                 [](float v) { return static_cast<double>(v); });
  return inner_row_.data();
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::record_history_push(const PushPlan& plan) {
  for (std::size_t k = 0; k < plan.pushes; ++k) gram_.advance();
  for (const std::size_t slot : final_order_) {
    const std::size_t k = slot_index_[slot];
    gram_.set_row(slot, new_distances_host_.data() + k * plan.size, new_norms_host_.data()[k],
                  new_inner_row(k, plan.size));
    final_rows_[slot] = -1;
  }
}

template <class PointStore, class GradStore>
CommitStats CudaBackend<PointStore, GradStore>::commit_stats(
    int c, std::span<const char> keep, std::span<const char> predicted) const {
  const auto nz = static_cast<std::size_t>(n_points_);
  const double* pp = dots_host_.data();
  const double* pg = pp + (nz - 1);
  const double* gg = pg + (nz - 1);
  CommitStats stats;
  stats.prediction_error.assign(nz > 1 ? nz - 1 : 0, std::numeric_limits<double>::quiet_NaN());
  for (std::size_t r = 0; r + 1 < nz; ++r) {
    if (!keep[r] || !predicted[r]) continue;
    const double denom = std::sqrt(pp[r] * gg[r]);
    if (denom > 0.0) {
      stats.cosine_sum += pg[r] / denom;
      ++stats.cosine_count;
      // From the dots already on the host; loses digits when the prediction is very close.
      stats.prediction_error[r] = std::sqrt(std::max(0.0, pp[r] - 2.0 * pg[r] + gg[r]) / gg[r]);
    }
  }
  stats.grad_norm = std::sqrt(gg[c]);
  stats.step_norm = std::numeric_limits<double>::quiet_NaN();  // not measured on the device
  return stats;
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::adopt_committed_state() {
  std::swap(x_, next_x_);
  for (int j = 0; j < kMaxStateSlots; ++j) std::swap(state_[j], work_state_[j]);
  step_ = work_step_;
  fitted_size_ = 0;  // the history changed
  history_host_current_ = false;
}

#define OPTEX_INSTANTIATE(P, G)                                                        \
  template void CudaBackend<P, G>::check_gradients(Batch&, std::span<char>);           \
  template bool CudaBackend<P, G>::stage_step(Batch&, int);                            \
  template void CudaBackend<P, G>::keep_coordinates(std::span<const CoordinateRange>); \
  template CommitStats CudaBackend<P, G>::commit(Batch&, int, std::span<const char>,   \
                                                 std::span<const char>);
OPTEX_FOR_EACH_HISTORY_STORAGE(OPTEX_INSTANTIATE)
#undef OPTEX_INSTANTIATE

}  // namespace optex::cuda
