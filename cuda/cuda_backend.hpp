// The CUDA backend: iterate, optimizer state, history and batch rows in the
// memory of one device; the T0 x T0 statistics (HistoryGram) on the host.
//
// Everything is enqueued on one non-blocking stream, which the cuBLAS and
// cuSOLVER handles share, so the stream order is the program order and no
// event is needed. The host waits for the device only where it must read a
// result (each synchronisation says why):
//   fit            one per jitter attempt: the escalation is decided on the host
//   proxy_step     none (oracle steps: one each, the oracle runs on the host;
//                  GP steps on a slice: one each, for the distances' sums)
//   finish_batch   one: ask() hands the rows to the caller; GP weights checked
//   check_gradients one: which pairs are finite decides the commit on the host
//   stage_step     one: whether the step stays within the bound, likewise
//   commit         one: the new Gram rows, cosines and ||g_c|| go to the host
//   host views     one each (iterate, optimizer_state, history, row copies)
//
// On a slice of the coordinates (CoordinateShard with sums), every sum over
// coordinates reaches the host as a partial and is completed there through
// ShardSums before anything uses it, and so is every "all finite" answer:
// the GP step's query distances, the bound checks of finish_batch,
// check_gradients and stage_step, and commit()'s dots and new Gram rows
// (one call each). Without sums nothing is copied or waited for extra.
//
// The member functions live in three files: cuda_backend.cpp (construction,
// state, host views, restore), cuda_backend_ask.cpp (the fit and the proxy
// steps of ask()) and cuda_backend_commit.cpp (tell()'s checks and commit).
// Compiled by the host compiler; the kernels are behind kernels.cuh.
// What runs where on the device, and why: docs/DESIGN.md section 8.
// Private to the library.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include <Eigen/Core>

#include "cuda_context.hpp"
#include "device_buffer.hpp"
#include "kernels.cuh"
#include "optex/coordinate_shard.hpp"
#include "optex/detail/engine_backend.hpp"

namespace optex::cuda {

// PointStore / GradStore: the storage of the history's points and gradients
// (float or bf16_bits; Options::history_precision picks the pair).
template <class PointStore, class GradStore>
class CudaBackend final : public detail::EngineBackend, public detail::DeviceRows {
 public:
  CudaBackend(std::span<const float> x0, const OptimizerRanges& optimizer, const Options& options,
              const CoordinateShard& shard);
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
  std::int64_t state_step() const override { return step_; }
  const GradientHistory& history() override;
  const HistoryGram& gram() const override { return gram_; }
  std::span<const float> iterate_if_host() const override { return {}; }
  const float* device_iterate() override;
  void set_optimizer(const OptimizerRanges& optimizer) override { optimizer_ = optimizer; }
  void restore(const OptimizerState& state, const GradientHistory& history) override;

  double fit(double lengthscale) override;
  void begin_batch(Batch& batch) override;
  void proxy_step(Batch& batch, int i, detail::ProxySource source,
                  const detail::HostGradient& oracle) override;
  bool finish_batch(Batch& batch) override;
  // The device does not compute the posterior variance yet; the safeguards
  // that need it, or distances, are refused for CUDA engines (Engine's constructor).
  double posterior_variance() const override { return std::numeric_limits<double>::quiet_NaN(); }
  double distance_from_iterate(Batch&, int) override {
    throw std::logic_error("cuda backend: distance_from_iterate is not implemented");
  }
  void discard_work_state() override { work_state_is_last_ = false; }
  void check_gradients(Batch& batch, std::span<char> finite) override;
  bool stage_step(Batch& batch, int c) override;
  // Device-to-device copies on the stream, one per range and buffer.
  void keep_coordinates(std::span<const CoordinateRange> ranges) override;
  detail::CommitStats commit(Batch& batch, int c, std::span<const char> keep,
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
  // Whether the weights of this batch's GP steps are finite; after the wait
  // that brought weights_host_ over.
  bool gp_weights_finite() const;
  // The GP step's distances to the history, partial on a slice: completed
  // on the host across the slices (a wait); nothing without sums_.
  void complete_query_distances(int n);

  // ---- the optimizer state --------------------------------------------------
  // The device rows of the committed state and of the work state the proxy
  // steps advance (nullptr for a slot the optimizer does not keep).
  StateRows state_rows();
  StateRows work_state_rows();
  // work state := committed state (every slot in use, and the step counter).
  void reset_work_state();
  // Whether `nrows` rows from `rows` are within bound_ and the work state is
  // finite; waits for the device.
  bool rows_and_work_state_within(const float* rows, int nrows);
  // Enqueues x_out := update(x_in, g) on the work state, with g the weighted
  // sum of `nrows` history gradients (weights != nullptr; also written to
  // `predicted`) or `gradient`; then advances the work step counter, as
  // apply_step advances OptimizerState::step.
  void enqueue_step(const GradStore* history, const double* weights, int nrows,
                    const float* gradient, float* predicted, const float* x_in, float* x_out);

  // ---- the history ------------------------------------------------------------
  // Host copies of `rows` history rows (slot order), converted to float.
  template <class Store>
  void download_history(const DeviceBuffer<Store>& src, std::size_t rows, std::vector<float>& dst);
  template <class Store>
  void upload_history(const float* src, std::size_t rows, DeviceBuffer<Store>& dst);
  // out (size x q, column-major) := G[0..size)^T [g_first .. g_first+q), fp32.
  void gradient_gemm(std::size_t size, int q, const GradStore* g_all, const GradStore* g_first,
                     float* out);

  // ---- the steps of commit(), in order ---------------------------------------
  // The committed step from point c into next_x_ and the work state,
  // replaying the proxy steps to recover its state when c < N-1 or when the
  // work state ask() left was spent.
  void enqueue_committed_step(const Batch& batch, int c);
  // The entries of dots_ a commit computes: [first, first + count).
  struct DotRange {
    std::size_t first = 0;
    std::size_t count = 0;
  };
  // p.p, p.g and g.g into dots_ (only ||g_c||^2 when no cosine is needed).
  DotRange enqueue_commit_dots(int c, std::span<const char> keep, std::span<const char> predicted);
  // Where the kept pairs go, without touching gram_: fills push_slots_,
  // final_rows_ and final_order_; returns the number of pushes and the
  // history's size after them.
  struct PushPlan {
    std::size_t pushes = 0;
    std::size_t size = 0;
  };
  PushPlan plan_history_push(std::span<const char> keep);
  // The last pair of each slot into the device history.
  void enqueue_history_store();
  // The new Gram rows over the final history (distances, norms, gradient
  // inner products), one run of adjacent slots at a time; returns how many.
  std::size_t enqueue_new_gram_rows(std::size_t size);
  // Everything the host needs, in one wait.
  void download_commit_results(std::size_t new_rows, std::size_t size);
  // On a slice: the new Gram rows and the dots completed across the slices
  // in one ShardSums call; nothing without sums_.
  void complete_commit_sums(std::size_t new_rows, std::size_t size, DotRange dots);
  // The push in the host's Gram, in the CPU history's order.
  void record_history_push(const PushPlan& plan);
  // New Gram row k's gradient inner products (`size` of them) as doubles: on
  // a slice the completed sums, else new_inner_host_'s floats converted.
  const double* new_inner_row(std::size_t k, std::size_t size);
  detail::CommitStats commit_stats(int c, std::span<const char> keep,
                                   std::span<const char> predicted) const;
  // The committed iterate and state become the current ones.
  void adopt_committed_state();

  DeviceGuard activation_;  // first member: active during construction and destruction only
  Options options_;
  OptimizerRanges optimizer_;  // sized for d_
  int device_index_;
  std::size_t d_;
  int n_points_;          // N
  std::size_t capacity_;  // T0
  StateSlots slots_;      // the state buffers the optimizer keeps
  int reduction_blocks_;
  float bound_;      // magnitude_bound of the whole vector's dimension
  ShardSums* sums_;  // completes sums over coordinates across slices; nullptr when whole

  Stream stream_;
  BlasHandle blas_;
  SolverHandle solver_;
  std::size_t device_bytes_;  // checked against the free memory before any allocation
  int potrf_lwork_ = 0;

  // Iterate and optimizer state; work_state_ is the state the proxy steps advance.
  DeviceBuffer<float> x_, next_x_;
  DeviceBuffer<float> state_[kMaxStateSlots], work_state_[kMaxStateSlots];
  std::int64_t step_ = 0;
  std::int64_t work_step_ = 0;
  bool work_state_is_last_ = false;     // the work state still is the s_{N-1} ask() left
  StepCoefficients step_coefficients_;  // reused by every step
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
  PinnedBuffer<float> oracle_x_, oracle_g_;    // allocated by the first oracle step
  PinnedBuffer<double> query_distances_host_;  // T0; allocated on a slice only

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
  std::vector<double> commit_sums_;  // a slice's commit sums, packed (reserved once)

  // Host views.
  std::vector<float> x_host_;
  OptimizerState state_host_;
  std::unique_ptr<GradientHistory> history_host_;
  bool history_host_current_ = false;
};

// The instantiations, one per Options::history_precision: f(point storage,
// gradient storage). cuda_backend.cpp instantiates the class, the other files
// the member functions they define.
#define OPTEX_FOR_EACH_HISTORY_STORAGE(f) \
  f(float, float) f(float, detail::bf16_bits) f(detail::bf16_bits, detail::bf16_bits)

}  // namespace optex::cuda
