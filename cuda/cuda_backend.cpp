// The CUDA backend: iterate, optimizer state, history and batch rows in the
// memory of one device; the T0 x T0 statistics (HistoryGram) on the host.
//
// Everything is enqueued on one non-blocking stream, which the cuBLAS and
// cuSOLVER handles share, so the stream order is the program order and no
// event is needed. The host waits for the device only where it must read a
// result (each synchronisation below says why):
//   fit            one per jitter attempt: the escalation is decided on the host
//   proxy_step     none (oracle steps: one each, the oracle runs on the host)
//   finish_batch   one: ask() hands the rows to the caller; GP weights checked
//   check_gradients one: which pairs are finite decides the commit on the host
//   commit         one: the new Gram rows, cosines and ||g_c|| go to the host
//   host views     one each (iterate, optimizer_state, history, row copies)
//
// Compiled by the host compiler; the kernels are behind cuda/kernels.cuh.
// What runs where on the device, and why: DESIGN.md section 8.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_context.hpp"
#include "device_buffer.hpp"
#include "kernels.cuh"
#include "optex/detail/elementwise.hpp"
#include "optex/detail/engine_backend.hpp"
#include "optex/gp_estimator.hpp"

namespace optex::cuda {
namespace {

using detail::BatchAccess;
using detail::CommitStats;
using detail::HostGradient;
using detail::ProxySource;

// Byte counts for the memory check, saturating instead of wrapping.
std::size_t mul_bytes(std::size_t a, std::size_t b) {
  if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a)
    return std::numeric_limits<std::size_t>::max();
  return a * b;
}
std::size_t add_bytes(std::size_t a, std::size_t b) {
  return b > std::numeric_limits<std::size_t>::max() - a ? std::numeric_limits<std::size_t>::max()
                                                         : a + b;
}

// The device ordinal of options.device, or std::invalid_argument.
int checked_device(const Device& device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the error so later CUDA calls do not report it
    throw std::invalid_argument("device: " + device.name() +
                                " requested but no CUDA device is available (" +
                                cudaGetErrorString(status) + ")");
  }
  if (device.index < 0 || device.index >= count) {
    throw std::invalid_argument("device: " + device.name() + " does not exist (this process sees " +
                                std::to_string(count) + " CUDA device(s))");
  }
  return device.index;
}

template <class Store>
constexpr cudaDataType_t blas_type() {
  return std::is_same_v<Store, bf16_bits> ? CUDA_R_16BF : CUDA_R_32F;
}

// Device bytes the backend needs (everything but the potrf workspace and
// the libraries' own), and std::runtime_error when the device has less free.
// Runs before anything of size T0 x T0 or d is allocated, host or device.
template <class PointStore, class GradStore>
std::size_t check_device_memory(std::size_t d, const Optimizer& optimizer, const Options& options) {
  const auto n = static_cast<std::size_t>(options.parallelism);
  const auto t0 = static_cast<std::size_t>(options.history);
  // Moments per optimizer state (the work state doubles them).
  const std::size_t moments = std::holds_alternative<Adam>(optimizer)    ? 2
                              : std::get<Sgd>(optimizer).momentum != 0.0 ? 1
                                                                         : 0;
  std::size_t need = mul_bytes(mul_bytes(t0, d), sizeof(PointStore) + sizeof(GradStore));  // X, G
  need = add_bytes(need, mul_bytes(mul_bytes(3 * n - 1, d), sizeof(float)));        // batch rows
  need = add_bytes(need, mul_bytes(mul_bytes(2 + 2 * moments, d), sizeof(float)));  // x, state
  const std::size_t reduction_rows = std::max(t0, n);
  need = add_bytes(
      need, mul_bytes(mul_bytes(static_cast<std::size_t>(reduction_blocks(d)), reduction_rows),
                      sizeof(double)));  // reduction partials
  // Weights, Cholesky factor, new Gram rows (distances, inner products), small outputs.
  const std::size_t small =
      add_bytes(add_bytes(mul_bytes(n - 1, t0), mul_bytes(3 * t0, t0)), 3 * n + 3 * t0 + 4);
  need = add_bytes(need, mul_bytes(small, sizeof(double)));
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  OPTEX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (need > free_bytes) {
    std::ostringstream msg;
    msg << "device: " << options.device.name() << " has " << free_bytes
        << " bytes free but the CUDA backend needs " << need << " bytes (history T0 = " << t0
        << ", d = " << d << ", N = " << n << ", precision "
        << precision_name(options.history_precision)
        << "); lower the history or the parallelism, or store the history in bf16";
    throw std::runtime_error(msg.str());
  }
  return need;
}

// PointStore / GradStore: the storage of the history's points and gradients
// (float or bf16_bits; Options::history_precision picks the pair).
template <class PointStore, class GradStore>
class CudaBackend final : public detail::EngineBackend, public detail::DeviceRows {
 public:
  CudaBackend(std::span<const float> x0, const Optimizer& optimizer, const Options& options);
  ~CudaBackend() override {
    // The buffers and handles are released by the member destructors that
    // run after this body: make the device current for them; activation_
    // (the first member, destroyed last) restores the caller's device.
    activation_.enter_noexcept();
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return options_.device; }
  std::size_t dim() const override { return d_; }

  std::span<const float> iterate() override;
  const OptimizerState& optimizer_state() override;
  const GradientHistory& history() override;
  const HistoryGram& gram() const override { return gram_; }
  std::span<const float> iterate_if_host() const override { return {}; }
  const float* device_iterate() override {
    DeviceGuard guard(device_index_);
    synchronize();  // the caller may read it from any stream or copy engine
    return x_.data();
  }
  void set_optimizer(const Optimizer& optimizer) override { optimizer_ = optimizer; }
  void restore(const OptimizerState& state, const GradientHistory& history) override;

  double fit(double lengthscale) override;
  void begin_batch(Batch& batch) override;
  void proxy_step(Batch& batch, int i, ProxySource source, const HostGradient& oracle) override;
  bool finish_batch(Batch& batch) override;
  void check_gradients(Batch& batch, std::span<char> finite) override;
  CommitStats commit(Batch& batch, int c, std::span<const char> keep,
                     std::span<const char> predicted) override;

  // DeviceRows: the batch's host views. Ordered on the backend's stream (so
  // they see every enqueued update) and synchronous; safe from several host
  // threads at once (the stream serialises the copies).
  void download(const float* device_src, float* host_dst, std::size_t count) const override;
  void upload(const float* host_src, float* device_dst, std::size_t count) const override;

 private:
  cudaStream_t stream() const { return stream_.get(); }
  // Waits for everything enqueued; every call site says why it must.
  void synchronize() const { OPTEX_CUDA_CHECK(cudaStreamSynchronize(stream())); }
  std::size_t row_bytes() const { return d_ * sizeof(float); }
  std::size_t offset(std::size_t row) const { return row * d_; }
  float* point_row(int i) { return points_.data() + offset(static_cast<std::size_t>(i)); }
  float* grad_row(int i) { return grads_.data() + offset(static_cast<std::size_t>(i)); }
  float* predicted_row(int i) { return predicted_.data() + offset(static_cast<std::size_t>(i)); }
  double* weights_row(int p) { return weights_.data() + static_cast<std::size_t>(p) * capacity_; }
  void require_attached(const Batch& batch) const;

  // Enqueues x_out := update(x_in, g) on the work state, with g the weighted
  // sum of `nrows` history gradients (weights != nullptr; also written to
  // `predicted`) or `gradient`; then advances the work step counter, as
  // Sgd::step / Adam::step advance OptimizerState::step.
  void enqueue_step(const GradStore* history, const double* weights, int nrows,
                    const float* gradient, float* predicted, const float* x_in, float* x_out);
  // dst := src, moments of the optimizer state (d floats each, where used).
  void copy_moments(float* dst_m, float* dst_v, const float* src_m, const float* src_v);
  // Host copies of `rows` history rows (slot order), converted to float.
  template <class Store>
  void download_history(const DeviceBuffer<Store>& src, std::size_t rows, std::vector<float>& dst);
  template <class Store>
  void upload_history(const float* src, std::size_t rows, DeviceBuffer<Store>& dst);
  // out (size x q, column-major) := G[0..size)^T [g_first .. g_first+q), fp32.
  void gradient_gemm(std::size_t size, int q, const GradStore* g_all, const GradStore* g_first,
                     float* out);

  DeviceGuard activation_;  // first member: active during construction and destruction only
  Options options_;
  Optimizer optimizer_;
  int device_index_;
  std::size_t d_;
  int n_points_;          // N
  std::size_t capacity_;  // T0
  bool has_m_;            // Adam, or SGD with momentum
  bool has_v_;            // Adam
  int reduction_blocks_;

  Stream stream_;
  BlasHandle blas_;
  SolverHandle solver_;
  std::size_t device_bytes_;  // checked against the free memory before any allocation
  int potrf_lwork_ = 0;

  // Iterate and optimizer state; work_* is the state the proxy steps advance.
  DeviceBuffer<float> x_, next_x_;
  DeviceBuffer<float> m_, v_, work_m_, work_v_;
  std::int64_t step_ = 0;
  std::int64_t work_step_ = 0;
  // History rows, T0 x d row-major in slot order (column-major d x T0 for cuBLAS).
  DeviceBuffer<PointStore> history_x_;
  DeviceBuffer<GradStore> history_g_;
  // Batch rows: N x d points and gradients, (N-1) x d predictions.
  DeviceBuffer<float> points_, grads_, predicted_;
  // Small scratch: GP weights ((N-1) x T0), Cholesky factor, reductions.
  DeviceBuffer<double> weights_, cholesky_, potrf_work_, query_distances_, partials_;
  DeviceBuffer<double> new_distances_, new_norms_, dots_;
  DeviceBuffer<float> new_inner_;
  DeviceBuffer<int> potrf_info_, potrs_info_, finite_;

  // Pinned host ends of the small copies.
  PinnedBuffer<double> covariance_host_, weights_host_, new_distances_host_, new_norms_host_,
      dots_host_;
  PinnedBuffer<float> new_inner_host_;
  PinnedBuffer<int> info_host_, finite_host_;
  PinnedBuffer<float> oracle_x_, oracle_g_;  // allocated by the first oracle step

  HistoryGram gram_;
  std::size_t fitted_size_ = 0;       // rows the Cholesky factor covers; 0: not fitted
  std::uint64_t fitted_version_ = 0;  // gram_.version() at the fit
  double inv_scaled_lengthscale_ = 1.0;
  Eigen::MatrixXd covariance_;

  const Batch* attached_ = nullptr;
  std::vector<char> gp_rows_;  // per proxy row of this batch: written by a GP step

  // Commit scratch, allocated once so that commit() does not allocate.
  std::vector<std::size_t> push_slots_;   // slot of each kept pair, in push order
  std::vector<int> final_rows_;           // per slot: batch row stored there, or -1
  std::vector<std::size_t> final_order_;  // distinct new slots in order of their last push
  std::vector<std::size_t> new_slots_;    // the same slots, ascending
  std::vector<std::size_t> slot_index_;   // slot -> its index in new_slots_
  std::vector<double> inner_row_;

  // Host views.
  std::vector<float> x_host_;
  OptimizerState state_host_;
  std::unique_ptr<GradientHistory> history_host_;
  bool history_host_current_ = false;
};

template <class PointStore, class GradStore>
CudaBackend<PointStore, GradStore>::CudaBackend(std::span<const float> x0,
                                                const Optimizer& optimizer, const Options& options)
    : activation_(checked_device(options.device)),
      options_(options),
      optimizer_(optimizer),
      device_index_(options.device.index),
      d_(x0.size()),
      n_points_(options.parallelism),
      capacity_(static_cast<std::size_t>(options.history)),
      has_m_(std::holds_alternative<Adam>(optimizer) || std::get<Sgd>(optimizer).momentum != 0.0),
      has_v_(std::holds_alternative<Adam>(optimizer)),
      reduction_blocks_(reduction_blocks(x0.size())),
      blas_(stream_.get()),
      solver_(stream_.get()),
      device_bytes_(check_device_memory<PointStore, GradStore>(x0.size(), optimizer, options)),
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
  if (has_m_) {
    m_ = DeviceBuffer<float>(d_);
    work_m_ = DeviceBuffer<float>(d_);
  }
  if (has_v_) {
    v_ = DeviceBuffer<float>(d_);
    work_v_ = DeviceBuffer<float>(d_);
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
  finite_ = DeviceBuffer<int>(n);

  covariance_host_ = PinnedBuffer<double>(t0 * t0);
  weights_host_ = PinnedBuffer<double>((n - 1) * t0);
  new_distances_host_ = PinnedBuffer<double>(t0 * t0);
  new_norms_host_ = PinnedBuffer<double>(t0);
  dots_host_ = PinnedBuffer<double>(3 * n);
  new_inner_host_ = PinnedBuffer<float>(t0 * t0);
  info_host_ = PinnedBuffer<int>(1);
  finite_host_ = PinnedBuffer<int>(n);

  gp_rows_.assign(n - 1, 0);
  push_slots_.assign(n, 0);
  final_rows_.assign(t0, -1);
  final_order_.reserve(std::min(n, t0));
  new_slots_.reserve(std::min(n, t0));
  slot_index_.assign(t0, 0);
  inner_row_.assign(t0, 0.0);
  x_host_.assign(d_, 0.0f);
  state_host_ = init_state(optimizer_, d_);

  // x := x0 and zero moments (init_state of both optimizers), then wait: x0
  // is the caller's pageable memory, and construction errors belong here.
  OPTEX_CUDA_CHECK(
      cudaMemcpyAsync(x_.data(), x0.data(), row_bytes(), cudaMemcpyHostToDevice, stream()));
  if (has_m_) OPTEX_CUDA_CHECK(cudaMemsetAsync(m_.data(), 0, row_bytes(), stream()));
  if (has_v_) OPTEX_CUDA_CHECK(cudaMemsetAsync(v_.data(), 0, row_bytes(), stream()));
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

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::enqueue_step(const GradStore* history,
                                                      const double* weights, int nrows,
                                                      const float* gradient, float* predicted,
                                                      const float* x_in, float* x_out) {
  std::visit(
      [&](const auto& opt) {
        using O = std::decay_t<decltype(opt)>;
        if constexpr (std::is_same_v<O, Sgd>) {
          const detail::SgdCoefficients c = detail::sgd_coefficients(opt, work_step_);
          sgd_step<GradStore>(history, weights, nrows, gradient, predicted, x_in, x_out,
                              work_m_.data(), c, d_, stream());
        } else {
          const detail::AdamCoefficients c = detail::adam_coefficients(opt, work_step_);
          adam_step<GradStore>(history, weights, nrows, gradient, predicted, x_in, x_out,
                               work_m_.data(), work_v_.data(), c, d_, stream());
        }
      },
      optimizer_);
  ++work_step_;
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::copy_moments(float* dst_m, float* dst_v,
                                                      const float* src_m, const float* src_v) {
  if (has_m_) {
    OPTEX_CUDA_CHECK(
        cudaMemcpyAsync(dst_m, src_m, row_bytes(), cudaMemcpyDeviceToDevice, stream()));
  }
  if (has_v_) {
    OPTEX_CUDA_CHECK(
        cudaMemcpyAsync(dst_v, src_v, row_bytes(), cudaMemcpyDeviceToDevice, stream()));
  }
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

// ---- host views ----------------------------------------------------------------

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
  if (has_m_) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(state_host_.first_moment.data(), m_.data(), row_bytes(),
                                     cudaMemcpyDeviceToHost, stream()));
  }
  if (has_v_) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(state_host_.second_moment.data(), v_.data(), row_bytes(),
                                     cudaMemcpyDeviceToHost, stream()));
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
  const auto moment_size = [this](bool used) { return used ? d_ : std::size_t{0}; };
  if (state.first_moment.size() != moment_size(has_m_) ||
      state.second_moment.size() != moment_size(has_v_) || history.capacity() != capacity_ ||
      history.dim() != d_) {
    throw std::invalid_argument(
        "restore: the optimizer state or history does not match this engine (dim " +
        std::to_string(d_) + ", history " + std::to_string(capacity_) + ")");
  }
  if (has_m_) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(m_.data(), state.first_moment.data(), row_bytes(),
                                     cudaMemcpyHostToDevice, stream()));
  }
  if (has_v_) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(v_.data(), state.second_moment.data(), row_bytes(),
                                     cudaMemcpyHostToDevice, stream()));
  }
  upload_history(history.points_data(), history.size(), history_x_);
  upload_history(history.gradients_data(), history.size(), history_g_);
  synchronize();  // the sources are the caller's; copy errors surface here, not later
  step_ = state.step;
  work_step_ = state.step;
  gram_ = static_cast<const HistoryGram&>(history);
  fitted_size_ = 0;
  history_host_current_ = false;
}

// ---- one iteration -------------------------------------------------------------

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
  copy_moments(work_m_.data(), work_v_.data(), m_.data(), v_.data());
  work_step_ = step_;
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
      kernel_vector(query_distances_.data(), n, options_.kernel, inv_scaled_lengthscale_, w,
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
  // from the host: they must be complete. The weights copy rides along.
  synchronize();
  for (std::size_t p = 0; p < gp_rows_.size(); ++p) {
    if (!gp_rows_[p]) continue;
    const double* w = weights_host_.data() + p * capacity_;
    if (!std::all_of(w, w + fitted_size_, [](double v) { return std::isfinite(v); })) return false;
  }
  return true;
}

template <class PointStore, class GradStore>
void CudaBackend<PointStore, GradStore>::check_gradients(Batch& batch, std::span<char> finite) {
  DeviceGuard guard(device_index_);
  require_attached(batch);
  const auto n = static_cast<std::size_t>(n_points_);
  if (finite.size() < n) {
    throw std::invalid_argument("finite: " + std::to_string(finite.size()) +
                                " flags for a batch of " + std::to_string(n));
  }
  // Rows written through host views: upload them, in runs of adjacent rows.
  const std::span<const char> staged = BatchAccess::staged_gradients(batch);
  const float* host = BatchAccess::host_grads(batch);
  for (std::size_t r = 0; r < staged.size() && r < n;) {
    if (!staged[r]) {
      ++r;
      continue;
    }
    std::size_t end = r + 1;
    while (end < staged.size() && end < n && staged[end]) ++end;
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(grads_.data() + offset(r), host + offset(r),
                                     (end - r) * row_bytes(), cudaMemcpyHostToDevice, stream()));
    r = end;
  }
  rows_finite(grads_.data(), n_points_, d_, finite_.data(), stream());
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(finite_host_.data(), finite_.data(), n * sizeof(int),
                                   cudaMemcpyDeviceToHost, stream()));
  synchronize();  // which pairs are finite decides, on the host, where the commit steps from
  for (std::size_t r = 0; r < n; ++r) finite[r] = finite_host_.data()[r] != 0 ? 1 : 0;
}

template <class PointStore, class GradStore>
CommitStats CudaBackend<PointStore, GradStore>::commit(Batch& batch, int c,
                                                       std::span<const char> keep,
                                                       std::span<const char> predicted) {
  DeviceGuard guard(device_index_);
  const int n = n_points_;
  const auto nz = static_cast<std::size_t>(n);

  // The committed step. From point N-1 the work state already is s_{N-1}
  // (ask() left it there); from an earlier point, replay the proxy steps from
  // the iterate to recover s_c. The first step reads x_, later ones update
  // next_x_ in place.
  float* out = next_x_.data();
  const float* from = point_row(c);
  if (c != n - 1) {
    copy_moments(work_m_.data(), work_v_.data(), m_.data(), v_.data());
    work_step_ = step_;
    from = x_.data();
    if (BatchAccess::proxy_steps_applied(batch)) {
      for (int r = 0; r < c; ++r) {
        enqueue_step(nullptr, nullptr, 0, predicted_row(r), nullptr, from, out);
        from = out;
      }
    }
  }
  enqueue_step(nullptr, nullptr, 0, grad_row(c), nullptr, from, out);

  // Cosines between predicted and true rows, and ||g_c||^2. dots_ holds
  // p.p (N-1 rows), p.g (N-1 rows), g.g (N rows).
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
  } else {
    row_dots<float>(grad_row(c), grad_row(c), 1, d_, partials_.data(),
                    gg + static_cast<std::size_t>(c), stream());
  }

  // The history push, planned without touching gram_ (it changes only once
  // the device work has succeeded): kept pairs take slots next, next+1, ...
  // in order; with more than T0 of them later pairs overwrite earlier slots,
  // so only the last pair of each slot is stored and measured.
  std::size_t size = gram_.size();
  std::size_t next = gram_.next_slot();
  std::size_t pushes = 0;
  for (std::size_t r = 0; r < nz; ++r) {
    if (!keep[r]) continue;
    push_slots_[pushes++] = next;
    final_rows_[next] = static_cast<int>(r);
    next = (next + 1) % capacity_;
    size = std::min(size + 1, capacity_);
  }
  final_order_.clear();
  for (std::size_t k = pushes; k-- > 0;) {  // last pushes first, then reversed
    const std::size_t slot = push_slots_[k];
    if (std::find(final_order_.begin(), final_order_.end(), slot) == final_order_.end())
      final_order_.push_back(slot);
  }
  std::reverse(final_order_.begin(), final_order_.end());
  for (const std::size_t slot : final_order_) {
    const int r = final_rows_[slot];
    store_values<PointStore>(point_row(r), history_x_.data() + offset(slot), d_, stream());
    store_values<GradStore>(grad_row(r), history_g_.data() + offset(slot), d_, stream());
  }

  // The new Gram rows, over the final history (rows 0..size-1), one run of
  // adjacent slots at a time: distances and norms by the kernels, gradient
  // inner products by one GEMM, G^T [g_s0 .. g_s1] (fp32 accumulation).
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

  // Everything the host needs, in one wait.
  const std::size_t gram_values = k_new * size;
  if (gram_values > 0) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(new_distances_host_.data(), new_distances_.data(),
                                     gram_values * sizeof(double), cudaMemcpyDeviceToHost,
                                     stream()));
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(new_inner_host_.data(), new_inner_.data(),
                                     gram_values * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream()));
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(new_norms_host_.data(), new_norms_.data(),
                                     k_new * sizeof(double), cudaMemcpyDeviceToHost, stream()));
  }
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(dots_host_.data(), dots_.data(), (3 * nz - 2) * sizeof(double),
                                   cudaMemcpyDeviceToHost, stream()));
  synchronize();  // the host Gram (fit, lengthscale selection), cosines and ||g_c|| need these

  // From here on only host bookkeeping: the push in the CPU history's order.
  for (std::size_t k = 0; k < pushes; ++k) gram_.advance();
  for (const std::size_t slot : final_order_) {
    const std::size_t k = slot_index_[slot];
    const float* inner = new_inner_host_.data() + k * size;
    std::transform(inner, inner + size, inner_row_.begin(),
                   [](float v) { return static_cast<double>(v); });
    gram_.set_row(slot, new_distances_host_.data() + k * size, new_norms_host_.data()[k],
                  inner_row_.data());
    final_rows_[slot] = -1;
  }

  CommitStats stats;
  const double* pp_host = dots_host_.data();
  const double* pg_host = pp_host + (nz - 1);
  const double* gg_host = pg_host + (nz - 1);
  for (std::size_t r = 0; r + 1 < nz; ++r) {
    if (!keep[r] || !predicted[r]) continue;
    const double denom = std::sqrt(pp_host[r] * gg_host[r]);
    if (denom > 0.0) {
      stats.cosine_sum += pg_host[r] / denom;
      ++stats.cosine_count;
    }
  }
  stats.grad_norm = std::sqrt(gg_host[c]);

  std::swap(x_, next_x_);
  std::swap(m_, work_m_);
  std::swap(v_, work_v_);
  step_ = work_step_;
  fitted_size_ = 0;  // the history changed
  history_host_current_ = false;
  return stats;
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

}  // namespace
}  // namespace optex::cuda

namespace optex::detail {

std::unique_ptr<EngineBackend> make_cuda_backend(std::span<const float> x0,
                                                 const Optimizer& optimizer,
                                                 const Options& options) {
  switch (options.history_precision) {
    case Precision::bf16:
      return std::make_unique<cuda::CudaBackend<bf16_bits, bf16_bits>>(x0, optimizer, options);
    case Precision::bf16_gradients:
      return std::make_unique<cuda::CudaBackend<float, bf16_bits>>(x0, optimizer, options);
    case Precision::fp32:
      break;
  }
  return std::make_unique<cuda::CudaBackend<float, float>>(x0, optimizer, options);
}

}  // namespace optex::detail
