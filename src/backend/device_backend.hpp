// The one implementation of EngineBackend: the per-round logic over a
// device's primitives (device_primitives.hpp). What it computes, in which
// order, what it stages, restores and validates is written here once; the
// CPU, CUDA and the tests' deferred and fault-injecting devices differ only
// in their primitives. DESIGN.md section 7 describes the cut. Defined in
// device_backend.cpp (construction, host views, restore, the history's
// statistics), device_backend_ask.cpp (the fit and ask()'s steps),
// device_backend_coefficients.cpp (the GP steps' distances in coefficient
// space), device_backend_tell.cpp (tell()'s checks, reduction and commit,
// and observe(), which pushes pairs as a commit does) and
// device_backend_window.cpp (the verified mode's redone steps).
// Private to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <Eigen/Core>

#include "backend/coefficient_steps.hpp"
#include "optex/backend/device_primitives.hpp"
#include "optex/backend/engine_backend.hpp"

namespace optex::detail {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline Storage point_storage(Precision p) {
  return p == Precision::bf16 ? Storage::bf16 : Storage::fp32;
}
inline Storage gradient_storage(Precision p) {
  return p == Precision::fp32 ? Storage::fp32 : Storage::bf16;
}

// A batch's rows in the device's memory (the batch's own host rows on the host).
struct BatchRows {
  float* points = nullptr;
  float* grads = nullptr;
  float* predicted = nullptr;
  float* point(int i, std::size_t d) const { return points + static_cast<std::size_t>(i) * d; }
  float* grad(int i, std::size_t d) const { return grads + static_cast<std::size_t>(i) * d; }
  float* prediction(int i, std::size_t d) const {
    return predicted + static_cast<std::size_t>(i) * d;
  }
};

class DeviceBackend final : public EngineBackend {
 public:
  DeviceBackend(std::unique_ptr<DevicePrimitives> primitives, std::span<const float> x0,
                const OptimizerRanges& optimizer, const Options& options,
                const CoordinateShard& shard);

  Device device() const override { return p_->device(); }
  std::size_t dim() const override { return d_; }

  std::span<const float> iterate() override { return {p_->view(x_, d_, x_host_), d_}; }
  const OptimizerState& optimizer_state() override;
  std::int64_t state_step() const override { return step_; }
  const GradientHistory& history() override;
  const HistoryGram& gram() override {
    refresh_gram();
    return gram_;
  }
  std::size_t history_size() const override { return gram_.size(); }
  std::span<const float> iterate_if_host() const override {
    return p_->host_memory() ? std::span<const float>(x_, d_) : std::span<const float>();
  }
  const float* device_iterate() override {
    p_->fetch({});  // the caller may read it from any stream or copy engine
    return x_;
  }
  void set_optimizer(const OptimizerRanges& optimizer) override { optimizer_ = optimizer; }
  void set_threads(int threads) override { p_->set_threads(threads); }
  void restore(const OptimizerState& state, const GradientHistory& history) override;

  double fit(double lengthscale) override;
  void begin_batch(Batch& batch) override;
  void proxy_step(Batch& batch, int i, ProxySource source, const HostGradient& oracle) override;
  bool finish_batch(Batch& batch) override;
  double posterior_variance(int row) override;
  double distance_from_iterate(Batch& batch, int i) override;
  void discard_work_state() override { work_state_is_last_ = false; }
  void expand_points(Batch& chain, std::span<const int> evaluations, Batch& rows) override;
  double reduce_evaluations(Batch& rows, std::span<const char> admissible,
                            std::span<const int> evaluations, Batch& chain) override;
  void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                          float* out) override {
    p_->mean_in_rank_order(blocks, count, n, out);
    p_->fetch({});
  }

  void check_gradients(Batch& batch, std::span<char> finite) override;
  bool stage_step(Batch& batch, int c) override;
  void keep_coordinates(std::span<const CoordinateRange> ranges) override;
  CommitStats commit(Batch& batch, int c, std::span<const char> keep,
                     std::span<const char> predicted) override;
  void observe(std::span<const float> points, std::span<const float> gradients) override;
  void redo_step(Batch& batch, int i, std::size_t slot, bool gp_correction) override;
  std::vector<double> window_disagreements(Batch& batch, int count) override;
  bool stage_steps(Batch& batch, int count) override;

 private:
  // One kept pair that survives the push: its slot, and its row (the batch's
  // in a commit, the pair's index in observe).
  struct Push {
    std::size_t slot;
    int row;
  };

  std::size_t bytes_needed(const Options& options) const;
  BatchRows rows_of(Batch& batch);
  // The work state := the committed state, without a copy: the next step
  // reads state_ and writes work_ (the step out of place).
  void reset_work_state();
  // The work state's rows: state_ until a step wrote work_.
  const StateRows& work() const { return work_is_committed_ ? state_ : work_; }
  // Copies the committed state into work_ where no step has yet (before the
  // work state is swapped in as a whole).
  void materialize_work_state();
  void enqueue_step(const StepGradient& gradient, const float* x_in, float* x_out,
                    const StepChecks& checks = {});
  // The checks check_staged() reads, taken by the staged step's own pass.
  StepChecks staged_checks() const { return {flags_, bound_, nullptr}; }
  // Enqueues the bound flags of `nrows` rows and the work state's finiteness.
  int enqueue_within(const float* rows, int nrows);
  bool flags_all(int count) const;
  // The end of stage_step() and stage_steps(): the staged iterate's and state's
  // bound checks (and the first staging's backup), one wait.
  bool check_staged(bool checks_taken);
  // The GP step's distances on a slice: completed across the slices (a wait).
  void complete_query_distances(std::size_t n);
  // ---- proxy steps in coefficient space (device_backend_coefficients.cpp) ----
  // Whether this engine's options and optimizer allow them (SGD, one range,
  // a whole vector, N > 1, Options::proxy_distances).
  bool coefficients_apply() const;
  // Proxy point p's squared distances to the n history points into
  // query_distances_ from the round's anchor products, where the coefficient
  // path takes this step (it begins at point 0 of an ask() that has not
  // stepped yet, and follows its own steps); false: the caller measures them.
  bool coefficient_distances(int p, std::size_t n);
  // After GP step p's weights were enqueued, before its step: the chain
  // takes the same step (a wait for the weights).
  void coefficient_step(int p, std::size_t n);
  // The round's products: anchor_products() of the iterate and momentum,
  // with the pair products of the slots renewed since the last round.
  void compute_anchor_products(std::size_t n);
  // What a commit pushes: the surviving pairs in push order; returns the pushes.
  std::size_t plan_push(std::span<const char> keep);
  void enqueue_backup();
  void store_pushes(const BatchRows& rows, std::size_t& stored);
  void restore_overwritten(std::size_t stored);
  // The history side of a planned push, shared by commit() and observe():
  // enqueues the new Gram rows of the planned pairs [first, first + count)
  // over the first `size` slots into `out` (count x size squared distances,
  // count squared norms, count x size gradient inner products; the pairs
  // stored already).
  void enqueue_gram_rows(std::size_t first, std::size_t count, std::size_t size, double* out);
  // After the wait that brought every planned pair's Gram rows (`rows`, laid
  // out as enqueue_gram_rows' for all of them; unused with lazy statistics):
  // the ring advances by `pushes` and each planned pair records its row, or
  // is marked stale. The history changed: the fit, the backup and the host
  // view are no longer current. Host bookkeeping only: nothing throws.
  void record_pushes(std::size_t pushes, std::size_t size, const double* rows);
  // host (d fp32 values) into one stored row, through next_x_ where the
  // storage converts (free outside a round's commit); enqueued.
  void put_row(const float* host, StoredRows to);
  // Whether `storage` holds every value as it is (fp32 always; bf16 where a value
  // survives the rounding).
  static bool stored_exactly(std::span<const float> values, Storage storage);
  CommitStats statistics(std::span<const int> compared) const;
  // On a slice: throws std::runtime_error where the commit's completed sums
  // (statistics, ||g_c||^2, the step, the new Gram rows of `size` slots) are
  // impossible for an honest ShardSums (completed_sums.hpp).
  void check_commit_sums(std::span<const int> compared, int c, std::size_t size);
  void recompute_gram();
  // The statistics of the slots pushed without them (stale_), in push order.
  void refresh_gram();

  std::unique_ptr<DevicePrimitives> p_;
  OptimizerRanges optimizer_;  // sized for d_
  Covariance kernel_;
  double noise_;
  InputScaling scaling_;
  std::size_t d_;
  int n_;                 // N
  std::size_t capacity_;  // T0
  StateSlots slots_;
  float bound_;      // magnitude_bound of the whole vector's dimension
  ShardSums* sums_;  // completes sums over coordinates across slices; nullptr when whole
  // What the checks of completed sums allow for underflow (completed_sums.hpp).
  double sums_slack_;
  bool keeps_backup_;
  // With N = 1 no round reads the Gram statistics: a commit stores its pair
  // and leaves the statistics to the first reader (a fit, a host view). Not
  // on a slice, where computing them is a collective every slice must join.
  bool lazy_gram_;
  std::vector<std::size_t> stale_;  // slots pushed without statistics, by their last push

  float* x_ = nullptr;
  float* next_x_ = nullptr;
  StateRows state_, work_;
  std::int64_t step_ = 0;
  std::int64_t work_step_ = 0;
  bool work_state_is_last_ = false;  // the work state still is the s_{N-1} ask() left
  bool work_is_committed_ = true;    // work_'s rows are stale: the work state is state_
  StoredRows history_x_, history_g_;
  // What a commit may overwrite (the min(N, T0) slots from the next one), kept
  // by the first stage_step() of a tell() so that its wait proves the copies
  // good, and put back where a commit fails.
  StoredRows backup_x_, backup_g_;
  bool backed_up_ = false;
  HistoryGram gram_;

  // Batch rows on a device, per batch the engine uses (its batch and its chain).
  std::vector<BatchRows> row_sets_;
  std::vector<const Batch*> row_owners_;

  // The GP.
  std::size_t fitted_size_ = 0;
  std::uint64_t fitted_version_ = 0;
  double inv_scaled_lengthscale_ = 1.0;
  Eigen::MatrixXd covariance_;
  double* query_distances_ = nullptr;  // T0
  double* weights_ = nullptr;          // (N-1) x T0
  double* variances_ = nullptr;        // N-1
  int* gp_infos_ = nullptr;            // N-1
  std::vector<char> gp_rows_;          // per proxy row of this batch: a GP step wrote it
  std::vector<char> variance_known_;   // per proxy row: variances_host_ holds it
  std::vector<double> weights_host_, variances_host_, query_host_;
  std::vector<int> gp_infos_host_;
  std::vector<float> oracle_x_, oracle_g_;
  // Proxy steps in coefficient space: wanted by the options; the round's
  // chain (steps taken: coefficient_steps_taken_, -1: not this round); the
  // products on the host (AnchorLayout, then the pair products by slot,
  // T0 x T0, valid where pair_known_) and their device buffer, sized for
  // fresh_capacity_ renewed slots per pass.
  bool coefficients_wanted_ = false;
  std::optional<SgdCoefficientSteps> coefficient_steps_;
  int coefficient_steps_taken_ = -1;
  AnchorProducts products_;
  std::vector<double> anchor_host_;
  double* anchor_device_ = nullptr;
  std::size_t fresh_capacity_ = 0;
  std::vector<double> pair_products_;
  std::vector<char> pair_known_;
  std::vector<int> fresh_;
  std::vector<double> distances_host_, rounded_weights_;

  // The verified mode's redone steps: the GP weights at the old guess, and the
  // corrected weights put to the device (read when the queue runs: kept here).
  std::vector<double> redo_old_host_, redo_weights_host_;

  // Flags and sums the host reads.
  int* flags_ = nullptr;  // N rows, then the state's slots
  std::vector<int> flags_host_;
  double* sums_device_ = nullptr;
  // ||g_c||^2 of the last stage_step(batch, c), from the step's own pass, for
  // the commit's statistics; staged_norm_row_ is c (-1: none). Then, where
  // that step stepped from the iterate's values (its own row or point 0),
  // ||next iterate - iterate||^2 from the same pass, until keep_coordinates().
  double* staged_norm_ = nullptr;  // 2 doubles
  double staged_norm_host_[2] = {};
  int staged_norm_row_ = -1;
  bool staged_length_ = false;
  std::vector<double> sums_host_;

  // Commit plan, sized once.
  std::vector<Push> pushes_;
  std::vector<int> push_of_slot_;  // T0: the push that renews each slot, or -1 (checks only)
  std::vector<StoredRows> query_x_, query_g_;

  // Host views.
  std::vector<float> x_host_;
  OptimizerState state_host_;
  std::unique_ptr<GradientHistory> history_host_;
  bool history_host_current_ = false;
  std::vector<float> view_points_, view_gradients_;
};

// The most values one fetch of sums brings (device_backend.cpp).
std::size_t sums_capacity(std::size_t n, std::size_t t0);

}  // namespace optex::detail
