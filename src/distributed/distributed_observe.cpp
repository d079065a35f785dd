// DistributedEngine::observe: every rank's late pairs, exchanged and observed
// in rank order on every rank (distributed_engine.hpp; DESIGN.md section 3).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/rank_agreement.hpp"
#include "optex/distributed/distributed_engine.hpp"

namespace optex {
namespace {

// Each rank's part of the first exchange: its pairs' count, and why it
// refuses them (failed != 0).
struct ObserveStatus {
  std::uint64_t pairs = 0;
  std::int32_t failed = 0;
  char message[236] = {};
};

}  // namespace

void DistributedEngine::observe(std::span<const float> points, std::span<const float> gradients) {
  if (engine_.pending()) {
    throw std::runtime_error("observe: between ask() and tell() (iteration " +
                             std::to_string(engine_.iteration()) +
                             "): the pending batch's proxy steps used the current history; call "
                             "it after tell() (on every rank)");
  }
  const std::size_t d = engine_.dim();
  const auto start = std::chrono::steady_clock::now();
  ObserveStatus mine;
  const std::string refusal = detail::observed_pairs_refusal(points, gradients, d);
  if (refusal.empty()) {
    mine.pairs = points.size() / d;
  } else {
    mine.failed = 1;
    detail::put_message(mine.message, refusal);
  }
  const auto ranks = static_cast<std::size_t>(world_size());
  std::vector<ObserveStatus> all(ranks);
  world_->all_gather(std::span<const ObserveStatus>(&mine, 1), std::span<ObserveStatus>(all));
  stats_.bytes_sent += sizeof mine;
  ++stats_.collectives;
  std::size_t most = 0;
  std::size_t total = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (all[r].failed) {
      stats_.seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      throw std::invalid_argument("observe: rank " + std::to_string(r) + " refused its pairs: " +
                                  std::string(all[r].message) + " (no rank observed anything)");
    }
    most = std::max<std::size_t>(most, all[r].pairs);
    total += all[r].pairs;
  }
  if (total == 0) {
    stats_.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return;
  }
  // Every rank's points then gradients, padded to the largest count.
  const std::size_t block = 2 * most * d;
  std::vector<float> send(block, 0.0f);
  std::copy(points.begin(), points.end(), send.begin());
  std::copy(gradients.begin(), gradients.end(),
            send.begin() + static_cast<std::ptrdiff_t>(most * d));
  std::vector<float> received(block * ranks);
  world_->all_gather(std::span<const float>(send), std::span<float>(received));
  stats_.bytes_sent += block * sizeof(float);
  ++stats_.collectives;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<float> xs;
  std::vector<float> gs;
  xs.reserve(total * d);
  gs.reserve(total * d);
  for (std::size_t r = 0; r < ranks; ++r) {
    const float* from = received.data() + r * block;
    const std::size_t count = static_cast<std::size_t>(all[r].pairs) * d;
    xs.insert(xs.end(), from, from + count);
    gs.insert(gs.end(), from + most * d, from + most * d + count);
  }
  engine_.observe(xs, gs);
}

}  // namespace optex
