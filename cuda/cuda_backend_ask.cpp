// The CUDA backend's side of ask(): the Cholesky fit and the proxy steps
// (cuda_backend.hpp describes the whole backend).
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cuda_backend.hpp"
#include "cuda_check.hpp"
#include "optex/gp_estimator.hpp"

namespace optex::cuda {

using detail::BatchAccess;
using detail::HostGradient;
using detail::ProxySource;

template <class PointStore, class GradStore>
double CudaBackend<PointStore, GradStore>::fit(double lengthscale) {
  DeviceGuard guard(device_index_);
  fitted_size_ = 0;
  const std::size_t n = gram_.size();
  if (n == 0) return 0.0;
  const int n_int = static_cast<int>(n);
  const double scale = input_scale(gram_, options_.input_scaling);
  int lwork = 0;
  OPTEX_CUDA_CHECK(cusolverDnDpotrf_bufferSize(solver_.get(), CUBLAS_FILL_MODE_LOWER, n_int,
                                               cholesky_.data(), n_int, &lwork));
  if (lwork > potrf_lwork_) {  // not expected (sized for T0), but never under-allocate
    potrf_work_ = DeviceBuffer<double>(static_cast<std::size_t>(lwork));
    potrf_lwork_ = lwork;
  }
  for (double jitter = 0.0; jitter <= 1e-2; jitter = jitter == 0.0 ? 1e-10 : jitter * 10.0) {
    covariance_matrix(gram_, options_.kernel, scale * lengthscale, options_.noise + jitter,
                      covariance_);
    std::copy(covariance_.data(), covariance_.data() + n * n, covariance_host_.data());
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(cholesky_.data(), covariance_host_.data(),
                                     n * n * sizeof(double), cudaMemcpyHostToDevice, stream()));
    OPTEX_CUDA_CHECK(cusolverDnDpotrf(solver_.get(), CUBLAS_FILL_MODE_LOWER, n_int,
                                      cholesky_.data(), n_int, potrf_work_.data(), potrf_lwork_,
                                      potrf_info_.data()));
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(info_host_.data(), potrf_info_.data(), sizeof(int),
                                     cudaMemcpyDeviceToHost, stream()));
    synchronize();  // whether to escalate the jitter is decided on the host
    const int info = *info_host_.data();
    if (info < 0) {
      throw std::logic_error("cuda backend: cusolverDnDpotrf rejected argument " +
                             std::to_string(-info));
    }
    if (info == 0) {
      fitted_size_ = n;
      fitted_version_ = gram_.version();
      inv_scaled_lengthscale_ = 1.0 / (scale * lengthscale);
      return jitter;
    }
  }
  std::ostringstream msg;
  msg << "gp estimator: Cholesky failed even with jitter 1e-2 (lengthscale " << lengthscale
      << ", noise " << options_.noise << ", history " << n << ")";
  throw std::runtime_error(msg.str());
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::begin_batch(Batch& batch) {
  DeviceGuard guard(device_index_);
  if (batch.size() != n_points_ || batch.dim() != d_) {
    throw std::invalid_argument(
        "batch: " + std::to_string(batch.size()) + " x " + std::to_string(batch.dim()) +
        " does not match N x d = " + std::to_string(n_points_) + " x " + std::to_string(d_));
  }
  // Re-attached every time: cheap, and right after the engine (and with it
  // the batch) has moved.
  BatchAccess::attach_device(batch, this, points_.data(), grads_.data(), predicted_.data());
  attached_ = &batch;
  BatchAccess::invalidate_host_copies(batch);
  OPTEX_CUDA_CHECK(
      cudaMemcpyAsync(point_row(0), x_.data(), row_bytes(), cudaMemcpyDeviceToDevice, stream()));
  reset_work_state();
  work_state_is_last_ = true;
  std::fill(gp_rows_.begin(), gp_rows_.end(), 0);
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::proxy_step(Batch& batch, int i, ProxySource source,
                                                    const HostGradient& oracle) {
  DeviceGuard guard(device_index_);
  require_attached(batch);
  if (i < 1 || i >= n_points_) {
    throw std::out_of_range("i: proxy step " + std::to_string(i) + " is outside [1, " +
                            std::to_string(n_points_) + ")");
  }
  const int p = i - 1;
  const float* x_in = point_row(p);
  float* x_out = point_row(i);
  float* pred = predicted_row(p);
  // Each step kernel copies x_in into x_out while it updates: no separate copy.
  switch (source) {
    case ProxySource::hold:
      OPTEX_CUDA_CHECK(
          cudaMemcpyAsync(x_out, x_in, row_bytes(), cudaMemcpyDeviceToDevice, stream()));
      OPTEX_CUDA_CHECK(cudaMemsetAsync(pred, 0, row_bytes(), stream()));
      return;
    case ProxySource::zero:
      OPTEX_CUDA_CHECK(cudaMemsetAsync(pred, 0, row_bytes(), stream()));
      enqueue_step(nullptr, nullptr, 0, pred, nullptr, x_in, x_out);
      return;
    case ProxySource::newest:
      if (gram_.empty()) throw std::logic_error("cuda backend: no history gradient to step with");
      load_values<GradStore>(history_g_.data() + offset(gram_.newest_slot()), pred, d_, stream());
      enqueue_step(nullptr, nullptr, 0, pred, nullptr, x_in, x_out);
      return;
    case ProxySource::gp: {
      if (fitted_size_ == 0 || fitted_size_ != gram_.size() || fitted_version_ != gram_.version()) {
        throw std::logic_error("gp estimator: predict() needs fit() on the current history");
      }
      // weights = (K + sigma^2 I)^-1 k(X, x_p), all on the device; then one
      // pass that forms the GP mean and steps with it.
      const int n = static_cast<int>(fitted_size_);
      double* w = weights_row(p);
      squared_distances<PointStore, float>(history_x_.data(), n, d_, x_in, 1, partials_.data(),
                                           query_distances_.data(), stream());
      complete_query_distances(n);
      covariance_vector(query_distances_.data(), n, options_.kernel, inv_scaled_lengthscale_, w,
                        stream());
      OPTEX_CUDA_CHECK(cusolverDnDpotrs(solver_.get(), CUBLAS_FILL_MODE_LOWER, n, 1,
                                        cholesky_.data(), n, w, n, potrs_info_.data()));
      enqueue_step(history_g_.data(), w, n, nullptr, pred, x_in, x_out);
      gp_rows_[static_cast<std::size_t>(p)] = 1;
      return;
    }
    case ProxySource::oracle: {
      if (!oracle) throw std::logic_error("cuda backend: ProxySource::oracle without an oracle");
      if (oracle_x_.data() == nullptr) {
        oracle_x_ = PinnedBuffer<float>(d_);
        oracle_g_ = PinnedBuffer<float>(d_);
      }
      OPTEX_CUDA_CHECK(
          cudaMemcpyAsync(oracle_x_.data(), x_in, row_bytes(), cudaMemcpyDeviceToHost, stream()));
      // The oracle runs on the host and needs point p. This wait also orders
      // the previous oracle step's upload of oracle_g_ before it is rewritten.
      synchronize();
      oracle(std::span<const float>(oracle_x_.data(), d_), std::span<float>(oracle_g_.data(), d_));
      OPTEX_CUDA_CHECK(
          cudaMemcpyAsync(pred, oracle_g_.data(), row_bytes(), cudaMemcpyHostToDevice, stream()));
      enqueue_step(nullptr, nullptr, 0, pred, nullptr, x_in, x_out);
      return;
    }
  }
  throw std::invalid_argument("source: unknown proxy source");
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::complete_query_distances(int n) {
  if (sums_ == nullptr) return;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(double);
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(query_distances_host_.data(), query_distances_.data(), bytes,
                                   cudaMemcpyDeviceToHost, stream()));
  synchronize();  // the partials are completed across the slices on the host
  complete_sums(sums_, {query_distances_host_.data(), static_cast<std::size_t>(n)});
  // Ordered before the next step's download into the same buffer by the stream.
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(query_distances_.data(), query_distances_host_.data(), bytes,
                                   cudaMemcpyHostToDevice, stream()));
}

template <class PointStore, class GradStore>
bool CudaBackend<PointStore, GradStore>::gp_weights_finite() const {
  for (std::size_t p = 0; p < gp_rows_.size(); ++p) {
    if (!gp_rows_[p]) continue;
    const double* w = weights_host_.data() + p * capacity_;
    if (!std::all_of(w, w + fitted_size_, [](double v) { return std::isfinite(v); })) return false;
  }
  return true;
}

template <class PointStore, class GradStore>
bool CudaBackend<PointStore, GradStore>::finish_batch(Batch& batch) {
  DeviceGuard guard(device_index_);
  require_attached(batch);
  const bool any_gp = std::find(gp_rows_.begin(), gp_rows_.end(), 1) != gp_rows_.end();
  if (any_gp) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(weights_host_.data(), weights_.data(),
                                     weights_.size() * sizeof(double), cudaMemcpyDeviceToHost,
                                     stream()));
  }
  // ask() hands the rows to the caller, who may read them from any stream or
  // from the host: they must be complete. The weights copy and the bound
  // checks of the proxy points and the work state ride along in one wait.
  const bool within = rows_and_work_state_within(point_row(0), n_points_);
  // Every slice asks, whatever its own answer: the completion is a collective.
  return on_every_slice(sums_, within && gp_weights_finite());
}

#define OPTEX_INSTANTIATE(P, G)                                                               \
  template double CudaBackend<P, G>::fit(double);                                             \
  template void CudaBackend<P, G>::begin_batch(Batch&);                                       \
  template void CudaBackend<P, G>::proxy_step(Batch&, int, ProxySource, const HostGradient&); \
  template bool CudaBackend<P, G>::finish_batch(Batch&);
OPTEX_FOR_EACH_HISTORY_STORAGE(OPTEX_INSTANTIATE)
#undef OPTEX_INSTANTIATE

}  // namespace optex::cuda
