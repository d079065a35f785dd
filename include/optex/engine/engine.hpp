// The OptEx engine: ask for the N points of an iteration, tell their true
// gradients, and it commits (DESIGN.md section 2).
//
//   optex::Engine engine(x0, optex::Adam{.lr = 1e-2}, options);
//   for (int t = 0; t < iters; ++t) {
//     optex::Batch& b = engine.ask();
//     for (int i = 0; i < b.size(); ++i) b.loss(i) = f(b.point(i), b.grad(i));
//     engine.tell(b);
//   }
//
// Non-finite values: a pair whose gradient or loss is not finite, or whose
// gradient has an entry above magnitude_bound(d), is dropped: it never enters
// the history, and the commit steps from the last point of the batch whose
// pair is admissible (replaying the proxy steps up to it, so the optimizer
// state is exactly that point's). A pair whose step would leave the bound or
// make the state non-finite is dropped too. If no pair remains, tell() throws
// std::runtime_error and nothing changes: the batch stays pending. A proxy
// step that leaves the bound, or non-finite GP weights, make ask() hold every
// point at the iterate instead (DESIGN.md section 6).
//
// Devices: with Options::device = Device::cuda(k) the iterate, optimizer
// state, history and batch rows live on GPU k, and an iteration moves nothing
// of size d to the host; the batch hands out device rows (batch.hpp).
// iterate(), optimizer_state() and history() still work there, as copies made
// on request.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/engine/adaptive_split.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/coordinate_range.hpp"
#include "optex/engine/engine_snapshot.hpp"
#include "optex/engine/iteration_info.hpp"
#include "optex/engine/options.hpp"
#include "optex/engine/refused_rows.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optex/sharded/coordinate_shard.hpp"
#include "optex/util/random.hpp"

namespace optex {

namespace detail {
class EngineBackend;
}

// Writes the true gradient at x into g and returns the loss. Needed only by
// Proxy::target, whose proxy steps use true gradients.
using GradientOracle = std::function<double(std::span<const float> x, std::span<float> g)>;

class Engine;
namespace detail {
// The data-parallel group mean of `count` blocks of n floats into `out`, in
// the engine's memory (its device's, or the host's), with the engine's
// device's arithmetic; for the distributed and sharded engines' device rows.
void group_mean(Engine& engine, const float* blocks, std::size_t count, std::size_t n, float* out);
// Why Engine::observe refuses these pairs of dimension d ("" when it takes
// them): sizes that are not m x d each, or a value that is not finite or
// above magnitude_bound(d), named by argument, row and element. The one check
// of Engine::observe and DistributedEngine::observe.
std::string observed_pairs_refusal(std::span<const float> points, std::span<const float> gradients,
                                   std::size_t d);
}  // namespace detail

class Engine {
 public:
  // `optimizer`: one base optimizer for every coordinate (Adam{...}), or
  // hyperparameters per contiguous range of x (OptimizerRanges). Throws
  // std::invalid_argument, naming the parameter and its value, for an empty
  // or non-finite x0, bad options, bad optimizer hyperparameters, ranges
  // that do not add up to x0's size or with a step_offset other than 0 (the
  // state starts at step 0; from_snapshot resumes later steps), or a device
  // this build or machine does not have; std::runtime_error when the history
  // does not fit in device memory.
  Engine(std::span<const float> x0, OptimizerRanges optimizer, Options options = {});

  // One slice of a sharded engine (sharded_engine.hpp builds them): x0 is
  // the slice [shard.offset, shard.offset + shard.size) of the start, the
  // optimizer is sized for the slice, and every sum over coordinates is
  // completed through shard.sums (coordinate_shard.hpp), which must outlive
  // the engine. The magnitude bound is the whole dimension's. Proxy::target
  // is refused (its oracle needs whole points).
  Engine(std::span<const float> x0, OptimizerRanges optimizer, Options options,
         const CoordinateShard& shard);

  // Movable, not copyable: a batch names the engine it came from.
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The N points of this iteration. Asking again before tell() returns the
  // same batch unchanged.
  Batch& ask();

  // Commits the batch returned by the last ask(), whose gradients and losses
  // the caller has filled in. Throws std::invalid_argument for a batch of
  // another engine, std::runtime_error without a pending ask(); the engine is
  // unchanged after any throw.
  //
  // `unchanged`: coordinates the commit leaves as they are (parameters that
  // took no part in this round's evaluations, as torch.optim skips a
  // parameter without a gradient). There the next iterate is the current one
  // and every optimizer state slot keeps its value, bit for bit; the step
  // count is one number for all coordinates and advances as usual. Everything
  // else is exactly as without them: the history receives the round's points
  // and the gradients as given (normally zeros there), and the point the
  // commit steps from is chosen as before. Ranges must be non-empty, within
  // [0, dim()), sorted by offset and disjoint (check_coordinate_ranges):
  // otherwise std::invalid_argument naming the range, before anything
  // changes, and the batch stays pending.
  //
  // `nonfinite`: what happens to an inadmissible row (a gradient not finite
  // or above magnitude_bound, or a loss not finite). NonfiniteRows::drop
  // keeps it out of the history (see the top of this file).
  // NonfiniteRows::refuse throws RefusedRowsError (a std::invalid_argument)
  // listing every such row, ascending, when there is one: the evaluation
  // rows when a point has several (Options::evaluations_per_point). The
  // commit's own check decides, one pass over the rows (on a device, where
  // they live; on a slice of a sharded engine, completed across the slices,
  // so that every slice refuses alike), and the refusal comes before
  // anything changes: iterate, state, history, RNG, the batch's rows and
  // losses; the batch stays pending, and a tell with admissible rows commits
  // as if the refused call had not been made.
  const IterationInfo& tell(Batch& batch, std::span<const CoordinateRange> unchanged = {},
                            NonfiniteRows nonfinite = NonfiniteRows::drop);

  // The rows of the pending batch that tell() would drop (a gradient row not
  // finite or above the bound, or a loss not finite), in order: the same
  // rows tell(..., NonfiniteRows::refuse) refuses. On a device engine the
  // rows are checked where they live. A query: to refuse such rows, tell in
  // refuse mode instead, which checks them once. Throws like tell() for a
  // foreign or stale batch; changes nothing.
  std::vector<int> nonfinite_points(Batch& batch);

  // The same, from flat arrays: gradients N x d row-major, losses N. In
  // refuse mode, a refusal also restores the rows and losses this call wrote
  // into the batch.
  const IterationInfo& tell(std::span<const float> gradients, std::span<const double> losses,
                            std::span<const CoordinateRange> unchanged = {},
                            NonfiniteRows nonfinite = NonfiniteRows::drop);

  // Adds m true pairs (points row-major m x dim(), gradients m x dim()) to
  // the history, in order, as the pushes of a commit would (beyond T0 only
  // the last T0 survive; each pair advances the ring); nothing else changes:
  // iterate, optimizer state, step, iteration, evaluations, seeds, lengthscale
  // and the last batch's rows. For gradients that arrive after their round
  // was committed (a straggler's): the next ask() refits with them (the
  // lengthscale selection runs as usual, on iteration % selection_interval),
  // and they count as history for the warm-up rules. evaluations() does not
  // change: the caller's round counted those evaluations already. m = 0 does
  // nothing.
  //
  // Everything is checked before anything changes, and a refused call changes
  // nothing: std::runtime_error between ask() and tell() (the round's proxy
  // steps used the current history); std::logic_error on a slice of a
  // sharded engine (not supported there); std::invalid_argument for sizes
  // that are not m x dim() each, or a value that is not finite or above
  // magnitude_bound(dim()), naming points or gradients, the row and the
  // element. On a device the pairs are copied to it (a wait).
  void observe(std::span<const float> points, std::span<const float> gradients);

  void set_gradient_oracle(GradientOracle oracle) { oracle_ = std::move(oracle); }

  // Changes the base optimizer's hyperparameters between iterations and keeps
  // its state (moments, step count): what a learning-rate schedule needs.
  // With ranges, give one optimizer per range, with the same sizes. Each must
  // be of the same kind as before and keep the state layout and algorithm
  // (SGD momentum may not switch between zero and non-zero, Adam may not
  // become AdamW: Optimizer::cannot_become). The ranges' step offsets may
  // change, up to the state's step count (a range that joins now has the
  // state's step as its offset). Throws std::invalid_argument
  // naming the hyperparameter, std::runtime_error between ask() and tell()
  // (the pending batch was made with the old values); the engine is
  // unchanged after a throw.
  void set_optimizer(const OptimizerRanges& optimizer);

  // The threads of the CPU's passes over d-vectors (Options::threads: 0 for
  // every core), at any time, even between ask() and tell(): the results do
  // not depend on it. Throws std::invalid_argument outside [0, 1024], changing
  // nothing. A CUDA engine's passes run on its device; the value is kept.
  void set_threads(int threads);

  // Checkpoints: everything that determines the rest of the trajectory
  // (docs/DESIGN.md section 6). An empty path or one with a NUL byte throws
  // std::invalid_argument before the file system is touched.
  // save() replaces the file atomically: a reader sees the old file or the new
  // one. It follows a symbolic link (replacing its target, keeping the link)
  // and refuses anything else that is not a regular file. Saving between ask()
  // and tell(), or a failed write, throws std::runtime_error (naming the path
  // and the OS's reason; no temporary file remains).
  // load() throws std::runtime_error, naming the path, the field and the
  // reason, for a missing, truncated, corrupted, foreign or invalid file, one
  // that is not a regular file, or one saved on a device this process lacks.
  // `device` moves the run to another device (a bf16 history becomes fp32 on
  // the CPU, exactly) and `history_precision` changes the history's storage
  // (rounding it); without them the run resumes as it was saved. A `device`
  // argument that is not there, or bf16 on the CPU, throws
  // std::invalid_argument, checked before the file is read.
  void save(const std::string& path) const;
  static Engine load(const std::string& path, std::optional<Device> device = std::nullopt,
                     std::optional<Precision> history_precision = std::nullopt);

  // The same state as values (engine_snapshot.hpp): what save() writes, and
  // what from_snapshot() continues bit for bit. With `with_history` false the
  // history is left out (an empty ring, EngineSnapshot::forget_history): an
  // engine built from it warms up again, everything else as it was. Throws
  // std::runtime_error between ask() and tell(). A device engine copies to
  // the host.
  EngineSnapshot snapshot(bool with_history = true) const;
  // An engine that continues `snapshot`, on `device` with `history_precision`
  // where given (as load()). Throws InvalidSnapshot (a std::invalid_argument)
  // naming the field and the first bad value when validate() refuses the
  // snapshot, or for a saved device this process lacks;
  // std::invalid_argument naming an argument that cannot be honoured. Nothing
  // is built then.
  static Engine from_snapshot(EngineSnapshot snapshot, std::optional<Device> device = std::nullopt,
                              std::optional<Precision> history_precision = std::nullopt);
  // One slice of a sharded engine continuing the snapshot of such a slice,
  // on its saved device; shard as in the slice constructor, its size the
  // snapshot's dimension. Throws as from_snapshot() does, and
  // std::invalid_argument for a shard that does not match, or an element
  // above the whole dimension's magnitude bound.
  static Engine from_snapshot(EngineSnapshot snapshot, const CoordinateShard& shard);

  // The coordinates this engine holds: the whole dimension, or its slice's.
  std::size_t dim() const;
  // Which coordinates of the whole vector this engine holds.
  const CoordinateShard& shard() const { return shard_; }
  Device device() const { return options_.device; }
  // Host views; on a device engine each call copies from the device.
  std::span<const float> iterate() const;
  // The iterate where it lives: a device pointer on a CUDA engine (complete on
  // return: the engine's stream is drained), the host iterate on a CPU
  // engine. dim() floats, valid until the next tell() or load.
  const float* device_iterate() const;
  const OptimizerState& optimizer_state() const;
  // optimizer_state().step without copying the state on a device engine: the
  // base optimizer's updates so far. A round advances it by the steps that
  // led to the committed point c and the commit's own: c + 1 when the round's
  // proxy steps were applied, 1 when its points held at the iterate (the
  // default warm-up, or a held batch; section 2 of DESIGN.md).
  std::int64_t optimizer_step() const;
  const GradientHistory& history() const;
  // The history's T0 x T0 statistics (which slots hold pairs, distances,
  // norms, gradient inner products): always on the host, never a copy.
  const HistoryGram& history_statistics() const;
  // The base optimizer of the first range (of every coordinate, unless the
  // engine was given ranges).
  const Optimizer& optimizer() const { return optimizer_.front(); }
  // Every range and its hyperparameters, sized for dim().
  const OptimizerRanges& optimizer_ranges() const { return optimizer_; }
  const Options& options() const { return options_; }
  std::int64_t iteration() const { return iteration_; }
  std::int64_t evaluations() const { return evaluations_; }
  double lengthscale() const { return lengthscale_; }
  bool pending() const { return pending_; }
  std::uint64_t rng_state() const { return rng_.state(); }
  const IterationInfo& last_info() const { return info_; }

 private:
  friend struct SnapshotAccess;
  friend void detail::group_mean(Engine&, const float*, std::size_t, std::size_t, float*);
  // from_snapshot() without its checks: for load(), which has validated the
  // snapshot it read and resolved the options it resumes with.
  static Engine from_validated_snapshot(EngineSnapshot snapshot, const Options& options);
  // The backend; throws std::logic_error on a moved-from engine.
  detail::EngineBackend& backend() const;
  void refit_if_needed();
  // Makes the chain hold every point at the iterate (no proxy steps).
  void hold_batch(Batch& chain);
  // Whether the options can make a round's points differ from its rows
  // (several evaluations per point, a safeguard that cuts the chain): the
  // proxy chain then lives in chain_ and is expanded into batch_.
  bool uses_chain() const;
  // This round's evaluations per point (plan_), from the options or the
  // strategy; all N at one point when `one_point`.
  void plan_round(bool one_point);
  // The safeguard that refuses the proxy step to point i, or "" (DESIGN.md section 2).
  const char* safeguard_stop(Batch& chain, int i);
  // Ends the chain at point i - 1, which takes the evaluations of the points not made.
  void cut_chain(Batch& chain, int i);
  // The point the commit steps from; marks the admissible points whose step overflows.
  int commit_point(Batch& chain, std::span<char> admissible);
  // Verified mode, in ask(): points 1 .. window_carried_ redo the last round's
  // unverified steps; returns the first point left to the proxy steps.
  int redo_window(Batch& chain);
  // Verified mode, in tell(): the steps whose guesses agree (at least one,
  // within the bounds), staged; 0 when none can be taken. `disagreement`: the
  // largest accepted. `usable`: the points before the first inadmissible one.
  int verified_steps(Batch& chain, std::span<const char> admissible, double& disagreement,
                     int& usable);
  // Throws unless `batch` is this engine's pending batch.
  void check_pending_batch(const Batch& batch) const;
  // Marks each row of `rows` admissible or not (check_gradients, then its
  // loss): the one rule of which rows tell() drops or refuses.
  void admit_rows(Batch& rows, std::span<char> admissible);
  const IterationInfo& commit(Batch& batch, std::span<const CoordinateRange> unchanged,
                              NonfiniteRows nonfinite);

  Options options_;
  CoordinateShard shard_;                           // the whole vector unless sharded
  OptimizerRanges optimizer_;                       // sized for dim()
  std::unique_ptr<detail::EngineBackend> backend_;  // everything of size d
  double lengthscale_;
  SplitMix64 rng_;
  std::int64_t iteration_ = 0;
  std::int64_t evaluations_ = 0;

  AdaptiveSplit split_rule_;     // Strategy::adaptive's state (unused with Strategy::fixed)
  double last_step_norm_ = 0.0;  // ||x_t - x_{t-1}|| of the last commit (trust region)
  // Verified mode: the last round's unverified steps, redone by the next with
  // the gradients in history slots window_first_slot_, +1, ... (modulo T0).
  int window_carried_ = 0;
  std::size_t window_first_slot_ = 0;

  // Per-iteration work space (allocated once).
  Batch batch_;                   // the N rows the caller evaluates
  Batch chain_;                   // the proxy chain's P points, when uses_chain()
  std::vector<int> plan_;         // evaluations per point this round (P entries, sum N)
  std::vector<double> variance_;  // posterior variance per point this round
  const char* chain_stop_ = "";
  std::vector<char> admissible_rows_;        // per row: finite loss and gradient within the bound
  std::vector<char> finite_;                 // per point: may its pair enter the history?
  std::vector<float> replaced_rows_;         // the flat tell()'s copy of the rows it replaces
  std::vector<float> replaced_device_rows_;  // the device rows a flat tell() uploads over
  bool pending_ = false;
  bool fitted_ = false;  // estimator matches history_ and lengthscale_
  std::uint64_t id_;
  GradientOracle oracle_;
  IterationInfo info_;
};

}  // namespace optex
