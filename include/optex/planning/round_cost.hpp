// What one OptEx round costs besides its gradient evaluations, measured on this
// machine: the sequential overhead that the N parallel evaluations must pay
// for (DESIGN.md section 4, "A round's passes"). plan.hpp turns it into a
// recommendation.
//
//   optex::RoundCost c = optex::measure_round_cost({.dim = 1'000'000, .parallelism = 8});
//   // c.seconds: ask() + tell() with the gradients given, median of 5 rounds
//
// The byte model of a CPU round (round_bytes), with fp32 = 4 bytes, an
// optimizer of k state slots (Adam: k = 2), D = 1 evaluation per point and the
// commit from the last point; d = dim, T0 = history, N = parallelism.
// DESIGN.md section 4, "A round's passes", has the table:
//   ask:  begin (copy x to the batch's first row; the first step
//         reads the state and writes the work state: no copy)      2 d
//         each of the N - 1 proxy steps: the distance pass, then
//         the GP mean, the copy and the update in one pass           (2 T0 + 4 + 2k) d
//         finite checks of the points and the state                  (N + k) d
//   tell: finite check of the N gradients                            N d
//         the staged step: copy, update, its checks and ||g_c||^2
//         in one pass                                                (3 + 2k) d
//         the prediction statistics                                  2 (N - 1) d
//         the step norm (in the staged step's pass when N = 1)       2 d (N > 1)
// With N = 1 ask() checks nothing and the N new Gram rows wait for their
// first reader (a fit, a view): those terms are 0.
//         copying the N pairs into the history                       4 N d
//         one pass over the points and one over the gradients
//         for all N new rows                                         2 (T0 + N) d
// round_bytes is the sum times 4 bytes; round_bytes / RoundCost::ask_seconds +
// tell_seconds is the bandwidth a round reached, to set against
// triad_bandwidth.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex {

// The size of a round: what Options and the problem fix.
struct RoundShape {
  std::size_t dim = 100000;
  int parallelism = 4;  // N
  int history = 32;     // T0
  Device device = Device::cpu();
  int threads = 0;  // Options::threads: 0 = every core
};

struct RoundCost {
  double seconds = 0;       // median wall-clock of ask() + tell() with the gradients given
  double ask_seconds = 0;   // median of ask()
  double tell_seconds = 0;  // median of tell()
  int rounds = 0;           // rounds timed
};

// One round's two halves, in seconds.
struct RoundTimes {
  double ask_seconds = 0;
  double tell_seconds = 0;
};

class BlockPool;
class Engine;

// An engine of a given shape, with its history full, whose rounds can be
// timed one by one: what measure_round_cost and bench/bench_round.cpp share.
// Adam lr 1e-3 from a random x0 (uniform in [-1, 1], fixed seed), fed
// precomputed random gradients (N x d, uniform in [-1, 1], fixed seed) and
// losses that fall along the batch, so that every commit steps from the last
// point. `base` gives every option but the shape's parallelism, history,
// device and threads. The constructor runs ceil(T0 / N) + 1 untimed rounds
// (the history is full after them). Throws like measure_round_cost.
class RoundRig {
 public:
  // An engine of `base` with the shape's fields, stepping with `optimizer`
  // (Adam at lr 1e-3 when not given).
  explicit RoundRig(const RoundShape& shape, const Options& base = Options{});
  RoundRig(const RoundShape& shape, const Options& base, const OptimizerRanges& optimizer);
  ~RoundRig();
  RoundRig(const RoundRig&) = delete;
  RoundRig& operator=(const RoundRig&) = delete;

  // One round: ask() and tell() timed apart with std::chrono::steady_clock;
  // writing the gradients into the batch (the evaluation) between them is not.
  // On a device, each half ends when the device has finished it.
  RoundTimes round();

 private:
  std::unique_ptr<Engine> engine_;
  std::vector<float> gradients_;
  std::vector<double> losses_;
};

// Builds a RoundRig of Options{} with the shape and times `rounds` rounds
// after the ones that fill the history: the medians of ask(), tell() and
// their sum. Throws std::invalid_argument naming the field for a shape Options refuses
// (dim 0, N or T0 out of range, threads out of range) or rounds < 1, before
// allocating anything; std::invalid_argument from the Engine for a device this
// build or machine lacks, std::bad_alloc or std::runtime_error when the round
// does not fit in memory.
RoundCost measure_round_cost(const RoundShape& shape, int rounds = 5);

// One plain optimizer step (optex::apply_step of Adam lr 1e-3 over dim floats)
// in seconds, the median of `repeats` after an untimed one: the overhead per
// step of the sequential baseline. Throws std::invalid_argument for dim 0 or
// repeats < 1.
double measure_plain_step(std::size_t dim, int repeats = 5);

// The STREAM triad a[i] = b[i] + s * c[i] over n floats of seeded data, the
// roofline every benchmark of a pass is set against. run() makes one pass on
// the pool's threads in BlockPool's coordinate blocks; bytes() is what STREAM
// counts for it (read b and c, write a: 12 n). Throws std::invalid_argument for
// n = 0.
class Triad {
 public:
  explicit Triad(std::size_t n);
  void run(const BlockPool& pool);
  double bytes() const { return 12.0 * static_cast<double>(a_.size()); }

 private:
  std::vector<float> a_, b_, c_;
  float s_ = 0.5f;
};

// The bandwidth of a Triad over n floats on `threads` threads (0: every
// core), the best of `repeats` passes after an untimed one, in bytes per
// second. Throws std::invalid_argument for n = 0, threads outside [0, 1024] or
// repeats < 1.
double triad_bandwidth(std::size_t n, int threads = 0, int repeats = 5);

// The bytes a CPU round of this shape moves, by the model above. Throws
// std::invalid_argument like measure_round_cost for a bad shape.
double round_bytes(const RoundShape& shape);

}  // namespace optex
