// The CPU's device primitives: memory is host memory, every call runs at once
// on the pool's threads (the streaming passes of streaming.hpp), the T0 x T0
// algebra is Eigen's. fetch() has nothing to wait for.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/backend/device_primitives.hpp"
#include "optex/backend/streaming.hpp"
#include "optex/distributed/data_parallel.hpp"
#include "optex/estimator/gp_fit.hpp"
#include "optex/util/allocation.hpp"

namespace optex::detail {
namespace {

const float* fp32(StoredRows rows) {
  if (rows.storage != Storage::fp32) {
    throw std::logic_error("cpu primitives: bf16 storage is available on CUDA devices only");
  }
  return static_cast<const float*>(rows.data);
}

class CpuPrimitives final : public DevicePrimitives {
 public:
  explicit CpuPrimitives(int threads) : pool_(std::make_unique<BlockPool>(threads)) {}

  Device device() const override { return Device::cpu(); }
  bool host_memory() const override { return true; }
  bool copies_cannot_fail() const override { return true; }
  void set_threads(int threads) override { pool_ = std::make_unique<BlockPool>(threads); }

  void check_memory(std::size_t bytes, std::size_t /*staging_bytes*/,
                    const std::string& what) override {
    // Host memory: the allocations themselves report what does not fit.
    (void)checked_bytes(what, "the engine's rows", {bytes}, 1);
  }
  float* floats(std::size_t count) override { return allocate<float>(count); }
  StoredRows rows(std::size_t count, Storage storage) override {
    if (storage != Storage::fp32) (void)fp32({nullptr, storage});  // refuses bf16
    return {allocate<float>(count), Storage::fp32};
  }
  double* doubles(std::size_t count) override { return allocate<double>(count); }
  int* ints(std::size_t count) override { return allocate<int>(count); }

  void put(const void* host, void* to, std::size_t bytes) override {
    if (bytes > 0 && host != to) std::memcpy(to, host, bytes);
  }
  void copy(const float* from, float* to, std::size_t count) override {
    if (from == to) return;
    pool_->for_blocks(block_count(count), 2 * kCoordinateBlock * sizeof(float),
                      [&](std::size_t first, std::size_t last) {
                        const std::size_t begin = first * kCoordinateBlock;
                        const std::size_t end = std::min(last * kCoordinateBlock, count);
                        std::copy(from + begin, from + end, to + begin);
                      });
  }
  void zero(float* to, std::size_t count) override { std::fill(to, to + count, 0.0f); }
  void copy_stored(StoredRows from, StoredRows to, std::size_t count) override {
    std::memcpy(to.data, from.data, count * storage_bytes(from.storage));
  }
  void store(const float* from, StoredRows to, std::size_t count) override {
    copy(from, const_cast<float*>(fp32(to)), count);
  }
  void load(StoredRows from, float* to, std::size_t count) override { copy(fp32(from), to, count); }

  void squared_distances(StoredRows rows, std::size_t nrows, std::size_t d,
                         std::span<const StoredRows> queries, double* out, double* norms) override {
    streaming::squared_distances(*pool_, fp32(rows), nrows, d, pointers(queries), out, norms);
  }
  void inner_products(StoredRows rows, std::size_t nrows, std::size_t d,
                      std::span<const StoredRows> queries, double* out) override {
    streaming::inner_products(*pool_, fp32(rows), nrows, d, pointers(queries), out);
  }
  void anchor_products(StoredRows points, StoredRows gradients, std::size_t n, std::size_t d,
                       const float* a, const float* m, std::span<const int> fresh,
                       double* out) override {
    streaming::anchor_products(*pool_, fp32(points), fp32(gradients), n, d, a, m, fresh, out);
  }
  void pair_statistics(const float* a, const float* b, std::size_t d, double* out) override {
    const streaming::PairStatistics s = streaming::pair_statistics(*pool_, a, b, d);
    out[0] = s.aa;
    out[1] = s.ab;
    out[2] = s.bb;
    out[3] = s.squared_distance;
  }
  void dot(const float* a, const float* b, std::size_t d, double* out) override {
    *out = streaming::dot(*pool_, a, b, d);
  }
  void within_bound(const float* rows, std::size_t nrows, std::size_t d, float bound,
                    int* flags) override {
    for (std::size_t r = 0; r < nrows; ++r) {
      flags[r] = streaming::all_within_bound(*pool_, rows + r * d, d, bound) ? 1 : 0;
    }
  }

  // The host's GP factor and solve, shared with GpGradientEstimator (gp_fit.hpp).
  void factor(const double* host, std::size_t n, int* info) override {
    *info = gp_.factor(host, n);
  }
  void gp_weights(const double* squared_distances, std::size_t n, Covariance kernel,
                  double inv_scaled_lengthscale, double* weights, double* variance,
                  int* info) override {
    *variance = gp_.weigh({squared_distances, n}, kernel, inv_scaled_lengthscale, {weights, n});
    *info = 0;
  }

  // One pass that, block by block, forms the weighted sum into `sum` (with
  // weights), copies x_in and state_in into x_out and state_out where they
  // differ, steps them while the block is in cache, and takes the checks and
  // the gradient's norm: the same bits as weighted_sum, the copies, an
  // in-place step, within_bound() and dot() one after the other (DESIGN.md,
  // "A round's passes"); the per-block results combine in block order.
  void step(const OptimizerRanges& ranges, std::int64_t step, StateRows state_in,
            StateRows state_out, const float* x_in, float* x_out, const StepGradient& gradient,
            std::size_t d, const StepChecks& checks) override {
    if (checks.gradient_norm != nullptr && gradient.weights != nullptr && gradient.sum == nullptr) {
      throw std::invalid_argument(
          "checks: the gradient's norm of a weighted step needs its sum row");
    }
    if (checks.step_length != nullptr && x_in == x_out) {
      throw std::invalid_argument("checks: the step's length needs x_in and x_out apart");
    }
    StateSlotPointers slots{};
    std::copy(std::begin(state_out.slot), std::end(state_out.slot), slots.begin());
    const float* history = nullptr;
    std::size_t rows = 0;
    const float* g = gradient.row;
    float* sum = nullptr;
    if (gradient.weights != nullptr) {
      history = fp32(gradient.history);
      rows = gradient.rows;
      streaming::float_weights(gradient.weights, rows, float_weights_);
      sum = gradient.sum;
      if (sum == nullptr) {
        sum_scratch_.resize(d);
        sum = sum_scratch_.data();
      }
      g = sum;
    }
    const StepInParts update(ranges, {x_out, d}, slots, step, {g, d});
    const StateSlots used = ranges.state_slots();
    const std::size_t blocks = block_count(d);
    const std::size_t flag_count =
        checks.flags != nullptr ? 1 + static_cast<std::size_t>(used.count()) : 0;
    block_flags_.assign(blocks * flag_count, 1);
    block_norms_.assign(checks.gradient_norm != nullptr ? blocks : 0, 0.0);
    block_lengths_.assign(checks.step_length != nullptr ? blocks : 0, 0.0);
    const std::size_t bytes_per_block =
        (rows + 4 + 2 * static_cast<std::size_t>(used.count())) * kCoordinateBlock * sizeof(float);
    pool_->for_blocks(blocks, bytes_per_block, [&](std::size_t first, std::size_t last) {
      for (std::size_t b = first; b < last; ++b) {
        const std::size_t lo = b * kCoordinateBlock;
        const std::size_t hi = std::min(lo + kCoordinateBlock, d);
        if (sum != nullptr) {
          streaming::weighted_sum_range(history, rows, d, float_weights_.data(), lo, hi, sum);
        }
        if (x_in != x_out) std::copy(x_in + lo, x_in + hi, x_out + lo);
        for (int j = 0; j < kMaxStateSlots; ++j) {
          if (used.uses(j) && state_in.slot[j] != state_out.slot[j]) {
            std::copy(state_in.slot[j] + lo, state_in.slot[j] + hi, state_out.slot[j] + lo);
          }
        }
        update.update(lo, hi);
        if (checks.gradient_norm != nullptr) {
          block_norms_[b] = streaming::dot_block(g + lo, g + lo, hi - lo);
        }
        if (checks.step_length != nullptr) {
          block_lengths_[b] = streaming::squared_distance_block(x_out + lo, x_in + lo, hi - lo);
        }
        if (flag_count == 0) continue;
        char* ok = block_flags_.data() + b * flag_count;
        ok[0] = streaming::within_bound_block(x_out + lo, hi - lo, checks.bound) ? 1 : 0;
        std::size_t r = 1;
        for (int j = 0; j < kMaxStateSlots; ++j) {
          if (!used.uses(j)) continue;
          ok[r++] = streaming::within_bound_block(state_out.slot[j] + lo, hi - lo, FLT_MAX) ? 1 : 0;
        }
      }
    });
    for (std::size_t r = 0; r < flag_count; ++r) {
      bool all = true;
      for (std::size_t b = 0; b < blocks; ++b) all = all && block_flags_[b * flag_count + r] != 0;
      checks.flags[r] = all ? 1 : 0;
    }
    if (checks.gradient_norm != nullptr) {
      double norm = 0.0;
      for (const double partial : block_norms_) norm += partial;
      *checks.gradient_norm = norm;
    }
    if (checks.step_length != nullptr) {
      double length = 0.0;
      for (const double partial : block_lengths_) length += partial;
      *checks.step_length = length;
    }
  }

  void mean_of_rows(const float* rows, std::span<const int> which, std::size_t d, float* mean,
                    double* sums) override {
    mean_scratch_.assign(d, 0.0);
    for (const int r : which) {
      const float* g = rows + static_cast<std::size_t>(r) * d;
      for (std::size_t j = 0; j < d; ++j) mean_scratch_[j] += g[j];
    }
    const auto used = static_cast<double>(which.size());
    for (std::size_t j = 0; j < d; ++j) {
      mean_scratch_[j] /= used;
      mean[j] = static_cast<float>(mean_scratch_[j]);
    }
    if (sums == nullptr) return;
    double spread = 0.0, mean_norm = 0.0;
    for (std::size_t j = 0; j < d; ++j) mean_norm += mean_scratch_[j] * mean_scratch_[j];
    for (const int r : which) {
      const float* g = rows + static_cast<std::size_t>(r) * d;
      for (std::size_t j = 0; j < d; ++j) {
        const double e = g[j] - mean_scratch_[j];
        spread += e * e;
      }
    }
    sums[0] = mean_norm;
    sums[1] = spread;
  }

  void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                          float* out) override {
    optex::mean_in_rank_order({blocks, count * n}, {out, n});
  }

  void fetch(std::span<const Fetch> values) override {
    for (const Fetch& f : values) put(f.device, f.host, f.bytes);
  }

  const float* view(const float* data, std::size_t, std::vector<float>&) override { return data; }
  void view_stored(StoredRows data, std::size_t count, std::vector<float>& out) override {
    const float* from = fp32(data);
    out.assign(from, from + count);
  }
  void download(const float* device_src, float* host_dst, std::size_t count) const override {
    if (count > 0 && device_src != host_dst)
      std::memcpy(host_dst, device_src, count * sizeof(float));
  }
  void upload(const float* host_src, float* device_dst, std::size_t count) const override {
    if (count > 0 && host_src != device_dst)
      std::memcpy(device_dst, host_src, count * sizeof(float));
  }

 private:
  template <class T>
  T* allocate(std::size_t count) {
    // Zeroed, as a fresh vector would be.
    auto& block =
        blocks_.emplace_back(std::make_unique<char[]>(std::max<std::size_t>(count, 1) * sizeof(T)));
    return reinterpret_cast<T*>(block.get());
  }
  std::span<const float* const> pointers(std::span<const StoredRows> queries) {
    query_pointers_.clear();
    for (const StoredRows& q : queries) query_pointers_.push_back(fp32(q));
    return query_pointers_;
  }

  std::unique_ptr<BlockPool> pool_;
  std::vector<std::unique_ptr<char[]>> blocks_;  // every allocation, freed with the primitives
  std::vector<const float*> query_pointers_;
  GpFactor gp_;
  std::vector<float> float_weights_;
  std::vector<float> sum_scratch_;
  std::vector<char> block_flags_;      // blocks x flags of a step's checks
  std::vector<double> block_norms_;    // a step's per-block partials of ||g||^2
  std::vector<double> block_lengths_;  // and of ||x_out - x_in||^2
  std::vector<double> mean_scratch_;
};

}  // namespace

std::unique_ptr<DevicePrimitives> make_cpu_primitives(int threads) {
  return std::make_unique<CpuPrimitives>(threads);
}

}  // namespace optex::detail
