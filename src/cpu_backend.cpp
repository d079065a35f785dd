// The CPU backend: the iterate, optimizer state, history and batch rows in
// host memory; Eigen for the T0 x T0 algebra and the streaming passes of
// streaming.hpp for everything of size d.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "optex/block_pool.hpp"
#include "optex/detail/allocation.hpp"
#include "optex/detail/engine_backend.hpp"
#include "optex/gp_estimator.hpp"
#include "optex/magnitude_bound.hpp"
#include "optex/streaming.hpp"

namespace optex::detail {
namespace {

bool state_finite(const BlockPool& pool, const OptimizerState& s) {
  return std::all_of(s.slots.begin(), s.slots.end(), [&](const std::vector<float>& slot) {
    return streaming::all_within_bound(pool, slot.data(), slot.size(), FLT_MAX);
  });
}

bool within(const BlockPool& pool, std::span<const float> values, float bound) {
  return streaming::all_within_bound(pool, values.data(), values.size(), bound);
}

// staged[r] := current[r]; nothing when both are empty (a slot the optimizer does not keep).
void keep_values(const std::vector<float>& current, std::vector<float>& staged,
                 const CoordinateRange& r) {
  if (current.empty()) return;
  const auto first = current.begin() + static_cast<std::ptrdiff_t>(r.offset);
  std::copy(first, first + static_cast<std::ptrdiff_t>(r.size),
            staged.begin() + static_cast<std::ptrdiff_t>(r.offset));
}

// ||a - b||^2 over d floats, in one pass (no cancellation between nearby rows).
double squared_distance(const BlockPool& pool, const float* a, const float* b, std::size_t d) {
  double squared = 0.0;
  streaming::squared_distances(pool, a, 1, d, {&b, 1}, &squared);
  return squared;
}

// to[i] = from[i] for i < d, in blocks on the pool's threads.
void copy(const BlockPool& pool, const float* from, float* to, std::size_t d) {
  pool.for_blocks(block_count(d), 2 * kCoordinateBlock * sizeof(float),
                  [&](std::size_t first, std::size_t last) {
                    const std::size_t begin = first * kCoordinateBlock;
                    const std::size_t end = std::min(last * kCoordinateBlock, d);
                    std::copy(from + begin, from + end, to + begin);
                  });
}

class CpuBackend final : public EngineBackend {
 public:
  CpuBackend(std::span<const float> x0, const OptimizerRanges& optimizer, const Options& options,
             const CoordinateShard& shard)
      : optimizer_(optimizer),
        x_(x0.begin(), x0.end()),
        next_x_(x0.size()),
        state_(init_state(optimizer, x0.size())),
        work_state_(state_),
        history_(static_cast<std::size_t>(options.history), x0.size()),
        bound_(magnitude_bound(shard.dim)),
        sums_(shard.sums),
        estimator_(options.kernel, options.noise, options.input_scaling,
                   static_cast<std::size_t>(options.history)),
        pool_(std::make_unique<BlockPool>(options.threads)) {}

  Device device() const override { return Device::cpu(); }
  std::size_t dim() const override { return x_.size(); }

  std::span<const float> iterate() override { return x_; }
  const OptimizerState& optimizer_state() override { return state_; }
  std::int64_t state_step() const override { return state_.step; }
  const GradientHistory& history() override { return history_; }
  const HistoryGram& gram() const override { return history_; }
  std::span<const float> iterate_if_host() const override { return x_; }
  const float* device_iterate() override { return x_.data(); }
  void set_optimizer(const OptimizerRanges& optimizer) override { optimizer_ = optimizer; }
  void set_threads(int threads) override { pool_ = std::make_unique<BlockPool>(threads); }

  void restore(const OptimizerState& state, const GradientHistory& history) override {
    state_ = state;
    work_state_ = state;
    work_state_is_last_ = false;
    history_ = history;
  }

  double fit(double lengthscale) override {
    estimator_.fit(history_, lengthscale);
    return estimator_.jitter();
  }

  void begin_batch(Batch& batch) override {
    copy(*pool_, x_.data(), BatchAccess::points(batch), dim());
    work_state_ = state_;
    work_state_is_last_ = true;
    weights_finite_ = true;
  }

  void proxy_step(Batch& batch, int i, ProxySource source, const HostGradient& oracle) override {
    const std::size_t d = dim();
    float* row = BatchAccess::points(batch) + static_cast<std::size_t>(i) * d;
    const float* from = row - d;
    std::span<float> predicted(BatchAccess::predicted(batch) + static_cast<std::size_t>(i - 1) * d,
                               d);
    if (source != ProxySource::gp) copy(*pool_, from, row, d);  // gp_step copies in its pass
    switch (source) {
      case ProxySource::hold:
        std::fill(predicted.begin(), predicted.end(), 0.0f);
        return;
      case ProxySource::zero:
        std::fill(predicted.begin(), predicted.end(), 0.0f);
        break;
      case ProxySource::newest: {
        auto g = history_.gradient(history_.newest_slot());
        std::copy(g.begin(), g.end(), predicted.begin());
        break;
      }
      case ProxySource::gp:
        gp_step(from, row, predicted);
        return;
      case ProxySource::oracle:
        oracle({from, d}, predicted);
        break;
    }
    apply_step(optimizer_, {row, d}, work_state_, predicted, *pool_);
  }

  // One pass at the end, as on a device: a state slot that overflowed stays
  // non-finite through the later steps (every update is a sum of products with it).
  bool finish_batch(Batch& batch) override {
    const std::span<const float> points(BatchAccess::points(batch),
                                        static_cast<std::size_t>(batch.size()) * dim());
    return on_every_slice(sums_, weights_finite_ && within(*pool_, points, bound_) &&
                                     state_finite(*pool_, work_state_));
  }

  // A GP proxy step: the distance pass and the solve for the weights, then
  // one pass that, block by block, forms the GP mean into `predicted`, copies
  // the previous point into the row and steps it. The same bits as predict(),
  // a copy and apply_step one after the other (DESIGN.md, "A round's passes").
  void gp_step(const float* from, float* row, std::span<float> predicted) {
    const std::size_t d = dim();
    estimator_.weigh(history_, {from, d}, *pool_, sums_);
    const std::span<const double> weights = estimator_.weights();
    for (double w : weights) weights_finite_ = weights_finite_ && std::isfinite(w);
    streaming::float_weights(weights.data(), weights.size(), float_weights_);
    StepInParts step(optimizer_, {row, d}, work_state_, predicted);
    const std::size_t rows = weights.size();
    const std::size_t bytes_per_block =
        (rows + 4 + 2 * static_cast<std::size_t>(work_state_.used().count())) * kCoordinateBlock *
        sizeof(float);
    pool_->for_blocks(block_count(d), bytes_per_block, [&](std::size_t first, std::size_t last) {
      for (std::size_t b = first; b < last; ++b) {
        const std::size_t lo = b * kCoordinateBlock;
        const std::size_t hi = std::min(lo + kCoordinateBlock, d);
        streaming::weighted_sum_range(history_.gradients_data(), rows, d, float_weights_.data(), lo,
                                      hi, predicted.data());
        std::copy(from + lo, from + hi, row + lo);
        step.update(lo, hi);
      }
    });
    step.finish();
  }

  double posterior_variance() const override { return estimator_.variance(); }

  double distance_from_iterate(Batch& batch, int i) override {
    const std::size_t d = dim();
    const float* points = BatchAccess::points(batch);
    double squared = squared_distance(*pool_, points + static_cast<std::size_t>(i) * d, points, d);
    complete_sums(sums_, {&squared, 1});
    return std::sqrt(squared);
  }

  void discard_work_state() override { work_state_is_last_ = false; }

  void check_gradients(Batch& batch, std::span<char> finite) override {
    const std::size_t d = dim();
    const float* grads = BatchAccess::grads(batch);
    for (std::size_t i = 0; i < finite.size(); ++i)
      finite[i] = within(*pool_, {grads + i * d, d}, bound_);
    complete_flags(sums_, finite);
  }

  bool stage_step(Batch& batch, int c) override {
    const std::size_t d = dim();
    const auto row = [d](const float* rows, int i) {
      return rows + static_cast<std::size_t>(i) * d;
    };
    if (c == batch.size() - 1 && work_state_is_last_) {
      copy(*pool_, row(BatchAccess::points(batch), c), next_x_.data(), d);
    } else {
      // Replay the proxy steps up to point c to recover its optimizer state.
      work_state_ = state_;
      copy(*pool_, x_.data(), next_x_.data(), d);
      if (BatchAccess::proxy_steps_applied(batch)) {
        for (int i = 0; i < c; ++i) {
          apply_step(optimizer_, next_x_, work_state_, {row(BatchAccess::predicted(batch), i), d},
                     *pool_);
        }
      }
    }
    work_state_is_last_ = false;
    apply_step(optimizer_, next_x_, work_state_, {row(BatchAccess::grads(batch), c), d}, *pool_);
    return on_every_slice(sums_,
                          within(*pool_, next_x_, bound_) && state_finite(*pool_, work_state_));
  }

  void keep_coordinates(std::span<const CoordinateRange> ranges) override {
    for (const CoordinateRange& r : ranges) {
      keep_values(x_, next_x_, r);
      for (std::size_t j = 0; j < state_.slots.size(); ++j) {
        keep_values(state_.slots[j], work_state_.slots[j], r);  // an unused slot is empty
      }
    }
  }

  CommitStats commit(Batch& batch, int c, std::span<const char> keep,
                     std::span<const char> predicted) override {
    const std::size_t d = dim();
    const auto n = static_cast<int>(keep.size());
    const float* points = BatchAccess::points(batch);
    const float* grads = BatchAccess::grads(batch);
    const float* predictions = BatchAccess::predicted(batch);
    const auto row = [d](const float* rows, int i) {
      return rows + static_cast<std::size_t>(i) * d;
    };

    // The sums over coordinates first, completed across slices in one call:
    // per compared row ||p||^2, <p, g>, ||g||^2 and ||p - g||^2, then ||g_c||^2
    // and ||next iterate - iterate||^2.
    std::vector<int> compared;
    std::vector<double> sums;
    for (int i = 0; i + 1 < n; ++i) {
      if (!keep[static_cast<std::size_t>(i)] || !predicted[static_cast<std::size_t>(i)]) continue;
      const streaming::PairStatistics pair =
          streaming::pair_statistics(*pool_, row(predictions, i), row(grads, i), d);
      compared.push_back(i);
      sums.insert(sums.end(), {pair.aa, pair.ab, pair.bb, pair.squared_distance});
    }
    const auto own = std::find(compared.begin(), compared.end(), c);
    sums.push_back(own != compared.end()
                       ? sums[4 * static_cast<std::size_t>(own - compared.begin()) + 2]
                       : streaming::dot(*pool_, row(grads, c), row(grads, c), d));
    sums.push_back(squared_distance(*pool_, next_x_.data(), x_.data(), d));
    complete_sums(sums_, sums);

    CommitStats stats;
    stats.prediction_error.assign(n > 1 ? static_cast<std::size_t>(n - 1) : 0,
                                  std::numeric_limits<double>::quiet_NaN());
    for (std::size_t k = 0; k < compared.size(); ++k) {
      const double aa = sums[4 * k], ab = sums[4 * k + 1], bb = sums[4 * k + 2];
      const double denom = std::sqrt(aa * bb);
      if (denom > 0.0) {
        stats.cosine_sum += ab / denom;
        ++stats.cosine_count;
        stats.prediction_error[static_cast<std::size_t>(compared[k])] =
            std::sqrt(sums[4 * k + 3]) / std::sqrt(bb);
      }
    }
    stats.grad_norm = std::sqrt(sums[sums.size() - 2]);
    stats.step_norm = std::sqrt(sums.back());
    // Every kept pair enters the history together: one pass over its points and one over its
    // gradients.
    std::vector<const float*> new_points;
    std::vector<const float*> new_gradients;
    for (int i = 0; i < n; ++i) {
      if (!keep[static_cast<std::size_t>(i)]) continue;
      new_points.push_back(row(points, i));
      new_gradients.push_back(row(grads, i));
    }
    history_.push_all(new_points, new_gradients, *pool_, sums_);
    std::swap(x_, next_x_);
    std::swap(state_, work_state_);
    return stats;
  }

 private:
  OptimizerRanges optimizer_;  // sized for the iterate
  std::vector<float> x_;
  std::vector<float> next_x_;
  OptimizerState state_;
  OptimizerState work_state_;        // s_{N-1} after ask(); the staged state after stage_step()
  bool work_state_is_last_ = false;  // work_state_ still is the s_{N-1} ask() left
  GradientHistory history_;
  float bound_;      // magnitude_bound(d) of the whole vector
  ShardSums* sums_;  // completes sums over coordinates across slices; nullptr when whole
  GpGradientEstimator estimator_;
  bool weights_finite_ = true;        // every GP weight of this batch's proxy steps
  std::vector<float> float_weights_;  // a GP proxy step's weights, as its weighted sum uses them
  std::unique_ptr<BlockPool> pool_;   // the threads of every pass over d-vectors
};

}  // namespace

std::unique_ptr<EngineBackend> make_cpu_backend(std::span<const float> x0,
                                                const OptimizerRanges& optimizer,
                                                const Options& options,
                                                const CoordinateShard& shard) {
  // The history, its statistics, the estimator and the optimizer state name
  // themselves when they fail; what is left is the iterate, its next value and
  // the working copy of the optimizer state.
  const std::size_t d = x0.size();
  const std::string what = "iterate: dimension " + std::to_string(d);
  const std::string contents = "fp32 iterate, next iterate and a working copy of " +
                               std::to_string(optimizer.state_slots().count()) +
                               " optimizer state slots";
  const std::size_t bytes = checked_bytes(
      what, contents, {2 + static_cast<std::size_t>(optimizer.state_slots().count()), d},
      sizeof(float));
  return allocate_or_explain(what, contents, bytes, [&] {
    return std::make_unique<CpuBackend>(x0, optimizer, options, shard);
  });
}

}  // namespace optex::detail
