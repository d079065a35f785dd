// The window of the last T0 evaluated (point, gradient) pairs, in a ring buffer.
//
// All storage is allocated once, at construction: pushing a pair overwrites
// the oldest slot and updates, for that slot only, the pairwise squared
// distances between points and the inner products between gradients. That is
// the "incremental Gram update" of the design: per iteration only the N new
// rows and columns are computed, at O(N * T0 * d), and everything the
// estimator and the lengthscale selection need afterwards is T0 x T0 (the
// HistoryGram base).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/estimator/history_gram.hpp"
#include "optex/sharded/coordinate_shard.hpp"

namespace optex {

class GradientHistory : public HistoryGram {
 public:
  GradientHistory(std::size_t capacity, std::size_t dim);

  // Appends a pair; once full, replaces the oldest. Sizes must equal dim()
  // and values must be finite (the engine checks; this class trusts it).
  void push(std::span<const float> point, std::span<const float> gradient,
            const BlockPool& pool = BlockPool::serial());

  // Appends the pairs (points[k], gradients[k]) in order, with the same
  // result bit for bit as push() for each, but reading the history once: all
  // new rows of the distances (and the new squared norms) come from one pass
  // over the points, all new rows of the gradient inner products from one
  // pass over the gradients. Each pointer holds dim() floats; pairs beyond
  // capacity() overwrite earlier ones as successive pushes would. With
  // `sums`, this history holds one slice of the coordinates: the new rows'
  // statistics are completed across the slices (coordinate_shard.hpp) by one
  // call; if that call throws, the history is left as it was.
  void push_all(std::span<const float* const> points, std::span<const float* const> gradients,
                const BlockPool& pool = BlockPool::serial(), ShardSums* sums = nullptr);

  // Replaces the whole history: the bookkeeping of `gram` (same capacity) and
  // its size() rows of points and gradients, in slot order. For checkpoints
  // and for device backends handing out a host copy.
  void assign(const HistoryGram& gram, std::span<const float> points,
              std::span<const float> gradients);

  std::size_t dim() const { return dim_; }

  std::span<const float> point(std::size_t slot) const {
    return {points_.data() + slot * dim_, dim_};
  }
  std::span<const float> gradient(std::size_t slot) const {
    return {gradients_.data() + slot * dim_, dim_};
  }
  // Row-major size() x dim() blocks of points and gradients.
  const float* points_data() const { return points_.data(); }
  const float* gradients_data() const { return gradients_.data(); }

 private:
  friend struct SnapshotAccess;  // takes and restores every member (engine_snapshot.cpp)

  // What a push on a slice overwrites, to put back when completing its sums
  // across the slices fails.
  struct Backup {
    Backup(const GradientHistory& h, std::size_t pairs);
    void restore(GradientHistory& h) const;
    HistoryGram gram;
    std::vector<std::size_t> slots;
    std::vector<float> points;
    std::vector<float> gradients;
  };

  std::size_t dim_;
  std::vector<float> points_;
  std::vector<float> gradients_;
  // A push's new statistics: pairs x size() distances, pairs squared norms,
  // pairs x size() inner products.
  std::vector<double> scratch_;
};

}  // namespace optex
