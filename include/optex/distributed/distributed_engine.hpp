// OptEx across ranks: W processes (or threads, or GPUs) share the N gradient
// evaluations of every iteration.
//
//   optex::MpiSession mpi(&argc, &argv);
//   optex::MpiCommunicator world;
//   optex::DistributedEngine engine(x0, optex::Adam{.lr = 1e-2}, options, world);
//   for (int t = 0; t < iters; ++t) {
//     optex::Batch& b = engine.ask();                  // the same N points on every rank
//     for (int i : engine.my_points())                 // this rank's share
//       b.loss(i) = f(b.point(i), b.grad(i));
//     engine.tell(b);                                  // all-gather, then the same commit
//   }
//
// Every rank runs a full Engine with the same options: the proxy trajectory,
// the history and the commit are computed redundantly and identically, so
// only the gradients and losses travel (DESIGN.md section 3). The result is
// bit for bit the single-process Engine's with the same options and seed.
//
// Layout. The W ranks form G = W / D groups of D ranks (D =
// DistributedOptions::data_parallel). The N points are split over the groups
// in contiguous blocks (group g gets N / G points, the first N % G groups one
// more: point_split.hpp); every rank of a group evaluates the group's points,
// each on its own minibatch (seed(i)), and the group's gradient is the mean
// over its D ranks in rank order (data_parallel.hpp). D = 1 is plain OptEx
// over W workers. Rank r is data rank r % D of group r / D.
//
// Failures. A rank that cannot evaluate a point calls fail(i, message) (the
// distributed minimize does this for an exception). At tell() every rank
// learns of every failure and reacts identically: OnFailure::abort throws
// RankFailure on every rank, naming the rank, point and message; with
// OnFailure::drop the point is dropped everywhere like a non-finite gradient.
// A rank that stops calling the engine makes the others throw
// CommunicatorTimeout within the communicator's timeout. Every
// DistributedOptions::hash_interval iterations the ranks compare a hash of
// their state; a mismatch throws RankDivergence on every rank, naming the
// ranks that differ.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "optex/backend/device_floats.hpp"
#include "optex/distributed/communicator.hpp"
#include "optex/distributed/point_split.hpp"
#include "optex/engine/engine.hpp"

namespace optex {

namespace detail {
struct PointFailure {
  int point;
  std::string message;
};
}  // namespace detail

enum class OnFailure {
  abort,  // every rank throws RankFailure from tell()
  drop,   // the failed point is dropped on every rank, like a non-finite gradient
};

struct DistributedOptions {
  // D: ranks per group that evaluate the same points on different minibatches.
  int data_parallel = 1;
  // Compare state hashes across ranks every this many iterations (0: never).
  // Costs one copy of the iterate to the host on a device engine.
  int hash_interval = 10;
  OnFailure on_failure = OnFailure::abort;

  // Throws std::invalid_argument naming the field and its value.
  void validate() const;
};

// One or more ranks failed to evaluate their points (OnFailure::abort).
// Thrown on every rank, with the same message.
class RankFailure : public std::runtime_error {
 public:
  RankFailure(const std::string& what, int rank, int point)
      : std::runtime_error(what), rank_(rank), point_(point) {}
  int rank() const { return rank_; }    // the lowest failing rank
  int point() const { return point_; }  // the point it failed on

 private:
  int rank_;
  int point_;
};

// The ranks' states differ: a non-deterministic objective, different inputs
// or options, or different hardware. Thrown on every rank.
class RankDivergence : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Time and volume of the communication, cumulative since construction.
struct CommunicationStats {
  double seconds = 0.0;          // wall-clock inside collectives
  std::uint64_t bytes_sent = 0;  // payload this rank contributed
  std::int64_t collectives = 0;
};

class DistributedEngine {
 public:
  // Collective. Rank 0's x0 is broadcast to every rank (others may pass their
  // own copy or any vector of the same size). Throws std::invalid_argument
  // for bad arguments (as Engine does), for a world size that is not a
  // multiple of data_parallel, for more groups than points, for a
  // communicator whose gradient rows live on another device than the
  // engine's, and, on every rank, when ranks were given different options,
  // optimizers or dimensions (naming the ranks).
  DistributedEngine(std::span<const float> x0, OptimizerRanges optimizer, Options options,
                    Communicator& communicator, DistributedOptions distributed = {});

  // Collective: every rank loads `path` (a file every rank can read) and the
  // ranks check that they hold the same state. `device` as in Engine::load.
  static DistributedEngine load(const std::string& path, Communicator& communicator,
                                DistributedOptions distributed = {},
                                std::optional<Device> device = std::nullopt);
  // Writes the checkpoint on rank 0 only (the format of Engine::save), then
  // waits for every rank. Collective.
  void save(const std::string& path);

  // Local, not collective: Engine::set_threads on this rank only (threads
  // never change results, so ranks may differ). With Options::threads = 0 a
  // CPU engine starts with its share of the machine's cores: available_cores()
  // divided by the ranks on the same host (at least 1).
  void set_threads(int threads) { engine_.set_threads(threads); }

  // Collective: Engine::set_optimizer on every rank (a learning-rate schedule
  // step). Every rank must pass the same hyperparameters; otherwise, or when
  // one rank refuses them, every rank throws std::invalid_argument (naming
  // the ranks) and every engine keeps its old optimizer.
  void set_optimizer(const OptimizerRanges& optimizer);

  DistributedEngine(DistributedEngine&&) noexcept;
  DistributedEngine& operator=(DistributedEngine&&) noexcept;
  ~DistributedEngine();

  // The N points of this iteration, the same on every rank. Not collective.
  Batch& ask();

  // The points this rank evaluates, shared with its group: first, first + 1,
  // ..., first + count - 1 (point_split.hpp). Iterable: for (int i : range).
  using PointRange = optex::PointRange;
  PointRange my_points() const { return points_of_group(group()); }
  // point_range(parallelism, groups(), group): std::out_of_range for a group
  // outside [0, groups()).
  PointRange points_of_group(int group) const;

  // The seed of this rank's minibatch at point i of the pending batch:
  // minibatch_seed(batch.seed(i), data_rank(), data_parallel).
  std::uint64_t seed(int i) const;

  // Records that this rank could not evaluate point i (one of my_points()).
  // The message travels to every rank (truncated to 200 bytes).
  void fail(int i, std::string_view message);

  // Collective: gathers every rank's gradients and losses (written into the
  // batch rows of my_points(), through host or device views as with Engine),
  // then commits the same state on every rank. The gather moves device rows
  // when the communicator's rows live on the engine's device (NCCL), host
  // rows otherwise (a device engine's rows are copied down first).
  // Throws RankFailure, RankDivergence or CommunicatorError as described
  // above; after RankFailure or CommunicatorError the batch is still pending
  // and the engine unchanged. RankDivergence comes after the commit.
  //
  // `unchanged`: the coordinates the commit leaves as they are (as in
  // Engine::tell). Every rank must pass the same ranges: the ranks compare a
  // hash of them in the exchange they make anyway, and when a rank's ranges
  // are invalid or differ from rank 0's, every rank throws
  // std::invalid_argument (naming the ranks, or this rank's own problem)
  // before anything changes; the batch stays pending.
  const IterationInfo& tell(Batch& batch, std::span<const CoordinateRange> unchanged = {});

  // Collective: Engine::observe with every rank's pairs. Each rank passes
  // its own m_r >= 0 pairs (points and gradients row-major m_r x d, e.g. the
  // late gradients that reached it); every rank's engine then observes the
  // concatenation in rank order, so the histories stay the same everywhere.
  // Each rank checks its own pairs first (as Engine::observe does), and the
  // ranks exchange the outcome: when any rank's pairs are refused, every rank
  // throws std::invalid_argument naming the lowest such rank and its reason,
  // and nothing changes anywhere. Between ask() and tell() it throws
  // std::runtime_error before any collective (the ranks are in lockstep, so
  // every rank does). The pairs travel through host memory: one exchange of
  // a small record (status and count), then one all-gather of the rows,
  // padded to the largest m_r (skipped when no rank has any). A rank that
  // stops calling makes the others throw CommunicatorTimeout.
  void observe(std::span<const float> points, std::span<const float> gradients);

  int rank() const;
  int world_size() const;
  int groups() const { return groups_; }
  int group() const;
  int data_rank() const;
  const DistributedOptions& distributed_options() const { return distributed_; }
  const Engine& engine() const { return engine_; }
  Engine& engine() { return engine_; }
  Communicator& communicator() { return *world_; }
  const CommunicationStats& communication() const { return stats_; }
  // The hash the ranks compare: iterate bytes, iteration and generator state.
  std::uint64_t state_hash() const;

 private:
  DistributedEngine(Engine engine, Communicator& communicator, DistributedOptions distributed);
  void check_same_configuration();
  void check_same_state();
  // Options::threads = 0 on the CPU: this rank's share of the host's cores.
  void share_the_cores();
  // The collectives of tell(), in order.
  void exchange_status_and_losses(Batch& batch, std::span<const CoordinateRange> unchanged);
  void average_over_group(Batch& batch, std::span<float> rows);
  void gather_groups(std::span<float> rows);
  std::span<float> gradient_rows(Batch& batch);

  Engine engine_;
  Communicator* world_;
  DistributedOptions distributed_;
  int groups_ = 1;
  // Sub-communicators of the hybrid layout (D > 1): the D ranks of this group,
  // and the G ranks with this data rank (one per group).
  std::unique_ptr<Communicator> group_comm_;
  std::unique_ptr<Communicator> peer_comm_;
  // Failures recorded by fail() since the last ask().
  std::vector<detail::PointFailure> failures_;
  detail::DeviceFloats group_rows_;  // D x (this group's rows), D > 1 only, where the rows are
  CommunicationStats stats_;
};

}  // namespace optex
