// The storage and arithmetic behind an Engine, one implementation per device.
//
// The Engine (src/engine/engine.cpp) owns the algorithm's control: options, the
// random seeds, the lengthscale choice, the warm-up rules, which pairs are
// finite, which point the commit steps from, and the IterationInfo. Everything
// of size d (iterate, optimizer state, history, batch rows) lives in a backend
// and is touched only through this interface: the CPU backend
// (src/cpu_backend.cpp) with Eigen and the streaming passes, the CUDA backend
// (cuda/cuda_backend.cpp) with cuBLAS, cuSOLVER and fused kernels.
//
// What each side owns and each function's contract: DESIGN.md section 7.
// Not part of the public API: it may change between versions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/coordinate_range.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/estimator/history_gram.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optex/optimizers/optimizer_state.hpp"
#include "optex/sharded/coordinate_shard.hpp"

namespace optex::detail {

// What the proxy step from point i-1 to point i uses as the gradient.
enum class ProxySource {
  hold,    // warm-up with an empty history: point i = point i-1, state untouched
  zero,    // the reference warm-up: step with a zero gradient (the state advances)
  newest,  // the newest history gradient
  gp,      // the GP mean at point i-1 (after fit())
  oracle,  // the true gradient at point i-1, from a host gradient oracle
};

// Writes the true gradient at x into g (host memory); throws on a non-finite result.
using HostGradient = std::function<void(std::span<const float> x, std::span<float> g)>;

// What commit() measured on the way.
struct CommitStats {
  double cosine_sum = 0.0;  // sum over the rows with a real prediction and a finite pair
  int cosine_count = 0;
  double grad_norm = 0.0;  // ||g_c||
  // Per row i < N-1: ||g_i - predicted_i|| / ||g_i|| where the cosine is
  // taken, NaN elsewhere.
  std::vector<double> prediction_error;
  // ||next iterate - iterate||; NaN where the backend does not measure it.
  double step_norm = 0.0;
};

// What a backend may reach inside a Batch.
struct BatchAccess {
  // Sizes the batch for n points of dimension d on `device` (benchmarks and
  // tests that drive a backend without an Engine).
  static void allocate(Batch& b, int n, std::size_t d, Device device) { b.allocate(n, d, device); }
  // Host rows (CPU backend): N x d points and gradients, (N-1) x d predictions.
  static float* points(Batch& b) { return b.points_.data(); }
  static float* grads(Batch& b) { return b.grads_.data(); }
  static float* predicted(Batch& b) { return b.predicted_.data(); }
  // Whether ask() applied the proxy steps (false when warm-up held the points).
  static bool proxy_steps_applied(const Batch& b) { return b.proxy_steps_applied_; }
  static void set_proxy_steps_applied(Batch& b, bool applied) { b.proxy_steps_applied_ = applied; }
  // Per row i < N-1: 1 where predicted row i holds a real prediction.
  static std::vector<char>& was_predicted(Batch& b) { return b.was_predicted_; }

  // Device backends: hand the batch its device rows and the copier its host
  // views use; call once, after Batch::allocate.
  static void attach_device(Batch& b, const DeviceRows* rows, float* points, float* grads,
                            float* predicted) {
    b.device_rows_ = rows;
    b.device_points_ = points;
    b.device_grads_ = grads;
    b.device_predicted_ = predicted;
  }
  // A new batch on the device: every host copy is stale.
  static void invalidate_host_copies(Batch& b) { b.invalidate_host_copies(); }
  // Gradient rows the caller wrote through host views (staged[i] != 0), and
  // the host rows holding them.
  static std::span<const char> staged_gradients(const Batch& b) { return b.gradient_staged_; }
  static const float* host_grads(const Batch& b) { return b.grads_.data(); }
  // The copier of a device batch's host views; nullptr for host rows.
  static const DeviceRows* device_rows(const Batch& b) { return b.device_rows_; }
};

class EngineBackend {
 public:
  virtual ~EngineBackend() = default;

  virtual Device device() const = 0;
  virtual std::size_t dim() const = 0;

  // ---- host views (a device backend copies on request) ----
  virtual std::span<const float> iterate() = 0;
  virtual const OptimizerState& optimizer_state() = 0;
  // The optimizer state's step count, without copying the state. Not named
  // optimizer_step: in the CUDA backend that name would hide the kernel
  // launcher of kernels.cuh.
  virtual std::int64_t state_step() const = 0;
  virtual const GradientHistory& history() = 0;
  // The T0 x T0 statistics of the history; always on the host, never copies.
  // Brings the statistics of pairs pushed by rounds that needed none up to
  // date first (a wait on a device; see DeviceBackend::commit).
  virtual const HistoryGram& gram() = 0;
  // How many pairs the history holds, without bringing anything up to date.
  virtual std::size_t history_size() const = 0;
  // The iterate as a span valid until the next commit, without copying: the
  // CPU backend's own vector; empty on a device.
  virtual std::span<const float> iterate_if_host() const = 0;
  // The iterate in the backend's memory (device pointer on a device), after
  // every queued write to it has finished.
  virtual const float* device_iterate() = 0;
  // New hyperparameters for the steps to come, sized for dim(); the caller
  // checked that the ranges and the state layout are unchanged.
  virtual void set_optimizer(const OptimizerRanges& optimizer) = 0;
  // The threads of the host's passes over d-vectors (Options::threads, checked
  // by the caller). A device backend's passes run on the device: nothing to do.
  virtual void set_threads(int /*threads*/) {}

  // Replaces optimizer state and history wholesale (checkpoint restore). The
  // iterate was given at construction. Sizes are the caller's to check.
  virtual void restore(const OptimizerState& state, const GradientHistory& history) = 0;

  // ---- one iteration ----
  // Factorises the GP covariance of the current history at this lengthscale
  // (jitter escalating by decades up to 1e-2); throws std::runtime_error when
  // even that fails. Returns the jitter used.
  virtual double fit(double lengthscale) = 0;
  // Point 0 := iterate, work state := state; the batch's host copies are stale.
  virtual void begin_batch(Batch& batch) = 0;
  // Predicted row i-1 := the source's gradient at point i-1 (zero for hold and
  // zero), then point i := step(point i-1, work state, predicted row i-1)
  // (a copy of point i-1 for hold). `oracle` is used by ProxySource::oracle only.
  virtual void proxy_step(Batch& batch, int i, ProxySource source, const HostGradient& oracle) = 0;
  // Ends ask(): waits for the device, and returns false if any GP weight of
  // this batch's proxy steps was not finite, a point left the magnitude bound
  // or the work state is not finite (the engine then holds the batch instead).
  virtual bool finish_batch(Batch& batch) = 0;
  // The GP posterior variance (units of the prior) at point `row` of this
  // batch, whose step from it was a ProxySource::gp step (NaN otherwise).
  // Known without a wait after finish_batch(); before it (a safeguard that
  // needs it during the chain) a device waits for it.
  virtual double posterior_variance(int row) = 0;
  // ||point i - point 0|| of the batch (a safeguard's question, during ask()).
  virtual double distance_from_iterate(Batch& batch, int i) = 0;
  // The engine cut the proxy chain short: the work state ask() left belongs
  // to no point of the batch any more, so stage_step() must replay.
  virtual void discard_work_state() = 0;
  // Several evaluations per point (point_evaluations.hpp): the chain's points
  // repeated as `evaluations` says into `rows`, with their predictions (zero
  // after the last point); and back in tell(): each point's gradient and loss
  // := the mean of its admissible rows, into the chain. Returns the gradient
  // noise measured from points with two or more (NaN without any).
  virtual void expand_points(Batch& chain, std::span<const int> evaluations, Batch& rows) = 0;
  virtual double reduce_evaluations(Batch& rows, std::span<const char> admissible,
                                    std::span<const int> evaluations, Batch& chain) = 0;
  // The data-parallel group mean (data_parallel.hpp) of `count` blocks of n
  // floats in this backend's memory into `out`, there too; returns once it
  // is done (a communicator reads `out` next, on its own stream).
  virtual void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                                  float* out) = 0;

  // Uploads rows the caller wrote through host views, then sets finite[i] to
  // whether gradient row i is finite and within magnitude_bound(d).
  virtual void check_gradients(Batch& batch, std::span<char> finite) = 0;
  // The step tell() would commit from point c, into scratch only: next
  // iterate := step from point c with gradient c (replaying the proxy steps
  // 0..c-1 from the iterate when c < N-1, or when the work state ask() left
  // was spent by an earlier call, and the batch's proxy steps were applied).
  // Returns whether the next iterate is within the magnitude bound and the
  // next state finite. Changes nothing anyone can observe.
  virtual bool stage_step(Batch& batch, int c) = 0;
  // After stage_step() returned true, before commit(): the staged iterate
  // and every staged state slot take the current values on these coordinates
  // (valid ranges, checked by the caller), so that the commit leaves them
  // as they are. The staged step count is untouched.
  virtual void keep_coordinates(std::span<const CoordinateRange> ranges) = 0;
  // The commit, which must not throw, right after stage_step(batch, c)
  // returned true: pairs with keep[i] enter the history in order; the staged
  // state and iterate become the current ones. Cosines are taken between
  // predicted and true rows i < N-1 with keep[i] and predicted[i].
  virtual CommitStats commit(Batch& batch, int c, std::span<const char> keep,
                             std::span<const char> predicted) = 0;

  // ---- the verified mode (Options::mode == Mode::verified) ----
  // In ask(), after begin_batch(): predicted row i-1 := the history gradient in
  // `slot`, then point i := step(point i-1, work state, it): the last round's
  // unverified step redone with the true gradient it measured (a Picard sweep).
  // With `gp_correction` and a current fit, the gradient is moved to point i-1
  // by the GP: g_s + mu(point i-1) - mu(x_s), which is g_s's bits where the two
  // points are equal.
  virtual void redo_step(Batch& batch, int i, std::size_t slot, bool gp_correction) = 0;
  // In tell(), into scratch only: y_0 := iterate, y_{j+1} := step(y_j, state
  // stepped j times, gradient row j) for j < count - 1; returns, per j,
  // ||y_{j+1} - point j+1||^2 and ||y_{j+1}||^2 (2 (count - 1) values, completed
  // across slices). Changes nothing anyone can observe.
  virtual std::vector<double> window_disagreements(Batch& batch, int count) = 0;
  // stage_step() of the verified mode: next iterate := `count` steps from the
  // iterate with gradient rows 0 .. count-1, the work state with them; the same
  // bound checks and backup. Returns whether both are within their bounds.
  virtual bool stage_steps(Batch& batch, int count) = 0;

  // ---- between rounds ----
  // Engine::observe: the m = points.size() / dim() pairs (row-major m x d
  // points and gradients, every value within the magnitude bound: the caller
  // checked) enter the history in order, exactly as the kept pairs of a
  // commit do (beyond T0 only the last T0 survive; every pair advances the
  // ring). Nothing else changes: iterate, state, step, the batches' rows. A
  // call that throws (a device's failure) changes nothing. Only between
  // rounds (it uses scratch a round owns), never on a slice (logic_error).
  virtual void observe(std::span<const float> points, std::span<const float> gradients) = 0;
};

class DevicePrimitives;
// The backend over a device's primitives (src/backend/device_backend.cpp): the one
// implementation. x0 is the shard's slice; every sum over coordinates is
// completed through shard.sums when the slice is not the whole vector.
std::unique_ptr<EngineBackend> make_device_backend(std::unique_ptr<DevicePrimitives> primitives,
                                                   std::span<const float> x0,
                                                   const OptimizerRanges& optimizer,
                                                   const Options& options,
                                                   const CoordinateShard& shard);
// On the CPU's primitives (or a test's, see device_primitives.hpp).
std::unique_ptr<EngineBackend> make_cpu_backend(std::span<const float> x0,
                                                const OptimizerRanges& optimizer,
                                                const Options& options,
                                                const CoordinateShard& shard);
// On CUDA's primitives on options.device; throws std::invalid_argument when
// optex was built without CUDA or the device does not exist,
// std::runtime_error when the history does not fit in device memory.
std::unique_ptr<EngineBackend> make_cuda_backend(std::span<const float> x0,
                                                 const OptimizerRanges& optimizer,
                                                 const Options& options,
                                                 const CoordinateShard& shard);

}  // namespace optex::detail
