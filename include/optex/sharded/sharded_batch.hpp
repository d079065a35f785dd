// The points of one round that a rank of a ShardedEngine evaluates, whole.
//
// A sharded engine's ranks hold slices of every point; ask() brings the whole
// points of this rank's rows here, and tell() sends each gradient's slices to
// their owners, so a rank holds only its own rows in full (sharded_engine.hpp).
// The rows live where the engine computes: host memory on the CPU, the GPU's
// memory for a CUDA engine, where the caller evaluates through
// device_point(i) and device_grad(i) and finishes its writes before tell().
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/backend/device_floats.hpp"
#include "optex/distributed/point_split.hpp"

namespace optex {

class ShardedBatch {
 public:
  // N: the rows of the round (every rank's together).
  int size() const { return size_; }
  // d: the whole dimension.
  std::size_t dim() const { return dim_; }
  // The rows this rank evaluates (its group's).
  PointRange rows() const { return rows_; }
  std::int64_t iteration() const { return iteration_; }

  // Row i of rows(): the whole point, the gradient to fill, the loss to set,
  // and this rank's minibatch seed. std::out_of_range for another row; the
  // host views throw std::logic_error when the rows live on a GPU.
  std::span<const float> point(int i) const;
  std::span<float> grad(int i);
  // Where the rows live: device pointers on a GPU, host pointers on the CPU.
  const float* device_point(int i) const;
  float* device_grad(int i);
  Device device() const { return points_.device(); }
  double& loss(int i);
  double loss(int i) const;
  std::uint64_t seed(int i) const;

 private:
  friend class ShardedEngine;
  std::size_t local(int i) const;
  void check_host(const char* view) const;

  int size_ = 0;
  std::size_t dim_ = 0;
  PointRange rows_;
  std::int64_t iteration_ = 0;
  detail::DeviceFloats points_;  // rows_.count x dim_
  detail::DeviceFloats grads_;   // rows_.count x dim_
  std::vector<double> losses_;
  std::vector<std::uint64_t> seeds_;
};

}  // namespace optex
