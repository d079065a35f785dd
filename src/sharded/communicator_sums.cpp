// ShardSums over a communicator: the sums and flags of a sharded engine.
#include <chrono>

#include "optex/sharded/sharded_engine.hpp"

namespace optex {

using Clock = std::chrono::steady_clock;

void CommunicatorSums::count(std::size_t bytes) {
  if (stats_ == nullptr) return;
  stats_->bytes_sent += bytes;
  ++stats_->collectives;
}

void CommunicatorSums::sum(std::span<double> partials) {
  const auto start = Clock::now();
  communicator_->all_reduce(partials, ReduceOp::sum);
  count(partials.size_bytes());
  if (stats_) stats_->seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

void CommunicatorSums::all(std::span<char> flags) {
  const auto start = Clock::now();
  flags_.assign(flags.begin(), flags.end());
  for (double& f : flags_) f = f != 0.0 ? 1.0 : 0.0;
  communicator_->all_reduce(flags_, ReduceOp::min);
  for (std::size_t i = 0; i < flags.size(); ++i) flags[i] = flags_[i] != 0.0 ? 1 : 0;
  count(flags_.size() * sizeof(double));
  if (stats_) stats_->seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace optex
