// OptEx across ranks when the state does not fit on one device: rank r of W
// holds only its slice of the iterate, the optimizer state and the history
// (ZeRO-style sharding). DESIGN.md section 3, "Sharded state".
//
//   optex::MpiSession mpi(&argc, &argv);
//   optex::MpiCommunicator world;
//   optex::ShardedEngine engine(x0, optex::Adam{.lr = 1e-2}, options, world);
//   for (int t = 0; t < iters; ++t) {
//     optex::ShardedBatch& b = engine.ask();       // collective: this rank's rows, whole
//     for (int i : b.rows()) b.loss(i) = f(b.point(i), b.grad(i));
//     engine.tell(b);                              // collective
//   }
//
// Each rank runs an Engine on its slice (coordinate_shard.hpp): the GP's
// T0 x T0 statistics and every query distance are partial sums over the
// slice, completed by an all-reduce of T0 values in rank order, so every
// rank computes the same weights, the same commit and the same random seeds.
// The predicted gradient and the optimizer update are per coordinate. What
// travels per round: the slices of each point to the ranks that evaluate
// it (ask), each gradient's slices to their owners (tell), both all-to-all,
// plus a few all-reduces of O(T0) values. No rank holds more than its own
// rows in full.
//
// The layout, the failures (fail(), OnFailure) and the timeouts are those of
// DistributedEngine; DistributedOptions means the same. A rank owns whole
// blocks of 4096 coordinates (shard_of), so d must have at least W blocks.
// Devices: a CPU engine with a host communicator (in-process, MPI), or a CUDA
// engine with a NCCL communicator on its GPU (data_parallel = 1): the rows
// move where they live.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "optex/backend/device_floats.hpp"
#include "optex/distributed/communicator.hpp"
#include "optex/distributed/distributed_engine.hpp"
#include "optex/engine/engine.hpp"
#include "optex/sharded/coordinate_shard.hpp"
#include "optex/sharded/sharded_batch.hpp"

namespace optex {

// ShardSums over a communicator: sums by all_reduce (in rank order, the same
// bits on every rank), flags by an all_reduce of the minimum.
class CommunicatorSums final : public ShardSums {
 public:
  explicit CommunicatorSums(Communicator& communicator, CommunicationStats* stats = nullptr)
      : communicator_(&communicator), stats_(stats) {}
  void sum(std::span<double> partials) override;
  void all(std::span<char> flags) override;

 private:
  void count(std::size_t bytes);
  Communicator* communicator_;
  CommunicationStats* stats_;
  std::vector<double> flags_;
};

// What one rank of a sharded engine allocates, in bytes.
struct ShardMemory {
  std::size_t history = 0;  // its slice of the T0 points and gradients
  std::size_t optimizer =
      0;                 // its slice of the iterate and the state (each twice: committed, work)
  std::size_t rows = 0;  // its slice of the round's rows, its whole rows, the exchange buffer
  std::size_t total() const { return history + optimizer + rows; }
};

// The bytes rank `rank` of `ranks` needs for dimension d with these options
// and optimizer (fp32 on the CPU): the formula of the README's "When the
// state does not fit on one device".
ShardMemory shard_memory(std::size_t d, int ranks, int rank, const Options& options,
                         const OptimizerRanges& optimizer, int data_parallel = 1);

class ShardedEngine {
 public:
  // Collective. Rank 0's x0 is the start (broadcast; others may pass any
  // vector of the same size). Throws std::invalid_argument on every rank for
  // what DistributedEngine refuses, for Proxy::target, for a communicator
  // whose rows live elsewhere than the engine, for a dimension with
  // fewer than W blocks of 4096, and when this configuration needs more
  // memory on some rank than it has available (naming the rank, the bytes
  // needed and available), before anything of size d is allocated. Prints
  // the per-rank bytes to stderr on rank 0 unless `quiet`.
  ShardedEngine(std::span<const float> x0, OptimizerRanges optimizer, Options options,
                Communicator& communicator, DistributedOptions distributed = {},
                bool quiet = false);

  ShardedEngine(ShardedEngine&&) noexcept;
  ShardedEngine& operator=(ShardedEngine&&) noexcept;
  ~ShardedEngine();

  // Collective checkpoints, one file per rank plus a manifest at `path`
  // (DESIGN.md section 6): every rank writes its slice beside `path`, then
  // rank 0 replaces the manifest atomically, so a failure anywhere leaves the
  // previous checkpoint whole. load() needs the same number of ranks.
  void save(const std::string& path);
  static ShardedEngine load(const std::string& path, Communicator& communicator,
                            DistributedOptions distributed = {});

  // Collective: this rank's rows of the round, whole. Asking again before
  // tell() returns the same batch.
  ShardedBatch& ask();
  // Collective: every rank's losses and failures, each gradient's slices to
  // their owners, then the same commit on every rank. Throws as
  // DistributedEngine::tell does; `unchanged` in whole-vector coordinates.
  const IterationInfo& tell(ShardedBatch& batch, std::span<const CoordinateRange> unchanged = {});
  // Records that this rank could not evaluate row i (one of its rows).
  void fail(int i, std::string_view message);

  // Collective, as DistributedEngine::set_optimizer; ranges over the whole vector.
  void set_optimizer(const OptimizerRanges& optimizer);
  // Local: the threads of this rank's passes (results never depend on them).
  void set_threads(int threads) { engine_.set_threads(threads); }

  // Collective: the whole iterate, on every rank (out has dim() floats).
  void gather_iterate(std::span<float> out);

  PointRange my_points() const { return points_of_group(group()); }
  PointRange points_of_group(int group) const;
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int groups() const { return groups_; }
  int group() const { return rank() / distributed_.data_parallel; }
  int data_rank() const { return rank() % distributed_.data_parallel; }
  std::size_t dim() const { return shard_.dim; }
  // This rank's coordinates, and the engine that holds them.
  const CoordinateShard& shard() const { return shard_; }
  const Engine& engine() const { return engine_; }
  const OptimizerRanges& optimizer_ranges() const { return optimizer_; }
  const DistributedOptions& distributed_options() const { return distributed_; }
  const ShardMemory& memory() const { return memory_; }
  const CommunicationStats& communication() const { return *stats_; }
  // What the ranks compare: the iteration, the generator and the T0 x T0
  // statistics, which every rank holds whole and equal.
  std::uint64_t state_hash() const;

 private:
  // What a new or loaded engine is made of (sharded_engine.cpp,
  // sharded_checkpoint.cpp): the slice engine and what it points to.
  struct Parts;
  static Parts build(std::span<const float> x0, OptimizerRanges optimizer, const Options& options,
                     Communicator& communicator, const DistributedOptions& distributed, bool quiet);
  ShardedEngine(Parts parts, Communicator& communicator, DistributedOptions distributed);
  void check_same_configuration();
  void check_same_state();
  // Rows k of every group: slices of points to their evaluators (ask), or
  // of gradients to their owners (tell); `slices` is the slice engine's
  // pending batch.
  void send_points(int k, const Batch& slices);
  void send_gradients(int k, Batch& slices);
  void count_sent(std::span<const std::size_t> send_counts);
  std::vector<CoordinateRange> local_ranges(std::span<const CoordinateRange> unchanged) const;

  Communicator* world_;
  DistributedOptions distributed_;
  int groups_ = 1;
  std::unique_ptr<CommunicationStats> stats_;
  std::unique_ptr<CommunicatorSums> sums_;  // the engine's completions; stable address
  CoordinateShard shard_;
  std::vector<CoordinateShard> shards_;  // every rank's
  OptimizerRanges optimizer_;            // over the whole vector
  Engine engine_;                        // this rank's slice
  ShardMemory memory_;
  ShardedBatch batch_;
  std::vector<detail::PointFailure> failures_;
  detail::DeviceFloats received_;  // W slices of one row: a round's group contributions
};

}  // namespace optex
