#include "optex/sharded/sharded_batch.hpp"

#include <stdexcept>
#include <string>

namespace optex {

std::size_t ShardedBatch::local(int i) const {
  if (!rows_.contains(i)) {
    throw std::out_of_range("i: row " + std::to_string(i) + " is not one of this rank's [" +
                            std::to_string(rows_.first) + ", " +
                            std::to_string(rows_.first + rows_.count) + ")");
  }
  return static_cast<std::size_t>(i - rows_.first);
}

void ShardedBatch::check_host(const char* view) const {
  if (device().is_cuda()) {
    throw std::logic_error(std::string(view) + ": the rows live on " + device().name() +
                           "; use device_point(i) and device_grad(i)");
  }
}

std::span<const float> ShardedBatch::point(int i) const {
  check_host("point");
  return {device_point(i), dim_};
}
std::span<float> ShardedBatch::grad(int i) {
  check_host("grad");
  return {device_grad(i), dim_};
}
const float* ShardedBatch::device_point(int i) const { return points_.data() + local(i) * dim_; }
float* ShardedBatch::device_grad(int i) { return grads_.data() + local(i) * dim_; }
double& ShardedBatch::loss(int i) { return losses_[local(i)]; }
double ShardedBatch::loss(int i) const { return losses_[local(i)]; }
std::uint64_t ShardedBatch::seed(int i) const { return seeds_[local(i)]; }

}  // namespace optex
