#include "optex/sharded/sharded_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "distributed/rank_agreement.hpp"
#include "optex/backend/block_pool.hpp"
#include "optex/backend/device_floats.hpp"
#include "optex/distributed/configuration_fingerprint.hpp"
#include "optex/distributed/data_parallel.hpp"
#include "optex/util/random.hpp"
#include "sharded/sharded_engine_parts.hpp"

namespace optex {
namespace {

using Clock = std::chrono::steady_clock;
using detail::collectively;

constexpr std::size_t kFloat = sizeof(float);

// What DistributedEngine checks, and what the sharded layout adds.
void check_arguments(std::span<const float> x0, const OptimizerRanges& optimizer,
                     const Options& options, Communicator& comm,
                     const DistributedOptions& distributed) {
  distributed.validate();
  options.validate();
  if (x0.empty()) throw std::invalid_argument("x0: dimension must be >= 1, got 0");
  (void)optimizer.for_dimension(x0.size());
  if (options.proxy == Proxy::target) {
    throw std::invalid_argument(
        "proxy: Proxy::target needs whole points for its oracle; a sharded engine holds slices");
  }
  // The exchanges move rows where both the engine and the communicator keep
  // them: host rows for a CPU engine, that GPU's rows (NCCL) for a CUDA one.
  if (comm.row_device() != options.device) {
    throw std::invalid_argument("device: the " + std::string(comm.backend()) +
                                " communicator's rows live on " + comm.row_device().name() +
                                ", the engine on " + options.device.name() +
                                " (a CUDA engine needs a NCCL communicator on its GPU, a CPU "
                                "engine an in-process or MPI one)");
  }
  const int d = distributed.data_parallel;
  if (comm.size() % d != 0) {
    throw std::invalid_argument("data_parallel: " + std::to_string(d) +
                                " does not divide the world size " + std::to_string(comm.size()));
  }
  if (comm.size() / d > options.parallelism) {
    throw std::invalid_argument("parallelism: " + std::to_string(options.parallelism) +
                                " points cannot be shared by " + std::to_string(comm.size() / d) +
                                " groups; every group needs at least one point");
  }
}

// Rank 0's value of d on every rank; a rank with another throws on every rank.
std::size_t agreed_dimension(std::size_t mine, Communicator& comm) {
  std::uint64_t dim = mine;
  comm.broadcast(std::span<std::uint64_t>(&dim, 1), 0);
  collectively(comm, "ShardedEngine", true, [&] {
    if (dim != mine) {
      throw std::invalid_argument("x0: dimension " + std::to_string(mine) + " on rank " +
                                  std::to_string(comm.rank()) + " differs from rank 0's " +
                                  std::to_string(dim));
    }
  });
  return dim;
}

// Rank 0's x0, in windows of 2^24 floats: each rank keeps its slice.
std::vector<float> rank0_slice(std::span<const float> x0, const CoordinateShard& shard,
                               Communicator& comm) {
  constexpr std::size_t kWindow = std::size_t{1} << 24;
  std::vector<float> window;
  std::vector<float> slice(shard.size);
  for (std::size_t begin = 0; begin < shard.dim; begin += kWindow) {
    const std::size_t end = std::min(shard.dim, begin + kWindow);
    window.assign(x0.begin() + static_cast<std::ptrdiff_t>(begin),
                  x0.begin() + static_cast<std::ptrdiff_t>(end));
    comm.broadcast(std::span<float>(window), 0);
    const std::size_t lo = std::max(begin, shard.offset);
    const std::size_t hi = std::min(end, shard.offset + shard.size);
    for (std::size_t j = lo; j < hi; ++j) slice[j - shard.offset] = window[j - begin];
  }
  return slice;
}

}  // namespace

namespace detail {

std::uint64_t shared_state_hash(const Engine& engine) {
  const HistoryGram& gram = engine.history_statistics();  // host, never copies
  const auto bytes = [](const auto& v) {
    return fnv1a64(reinterpret_cast<const unsigned char*>(&v), sizeof v);
  };
  std::uint64_t h = mix_seed(static_cast<std::uint64_t>(engine.iteration()),
                             static_cast<std::uint64_t>(engine.evaluations()));
  h = mix_seed(h, engine.rng_state());
  h = mix_seed(h, bytes(engine.lengthscale()));
  for (std::size_t i = 0; i < gram.size(); ++i) {
    h = mix_seed(h, bytes(gram.squared_norm(i)));
    for (std::size_t j = 0; j < gram.size(); ++j) {
      const double v[2] = {gram.squared_distance(i, j), gram.gradient_inner(i, j)};
      h = mix_seed(h, bytes(v));
    }
  }
  return h;
}

}  // namespace detail

// ---- construction ------------------------------------------------------------

ShardedEngine::Parts ShardedEngine::build(std::span<const float> x0, OptimizerRanges optimizer,
                                          const Options& options, Communicator& comm,
                                          const DistributedOptions& distributed, bool quiet) {
  collectively(comm, "ShardedEngine", true,
               [&] { check_arguments(x0, optimizer, options, comm, distributed); });
  const std::size_t d = agreed_dimension(x0.size(), comm);
  Parts parts;
  CoordinateShard shard;
  ShardMemory memory;
  collectively(comm, "ShardedEngine", true, [&] {
    parts.optimizer = optimizer.for_dimension(d);
    shard = shard_of(d, comm.size(), comm.rank());
    memory = shard_memory(d, comm.size(), comm.rank(), options, parts.optimizer,
                          distributed.data_parallel);
  });
  collectively(comm, "ShardedEngine", true,
               [&] { detail::check_shard_memory(memory, shard, options.device, comm, quiet); });
  const std::vector<float> slice = rank0_slice(x0, shard, comm);
  parts.stats = std::make_unique<CommunicationStats>();
  parts.sums = std::make_unique<CommunicatorSums>(comm, parts.stats.get());
  shard.sums = parts.sums.get();
  // A bad start is the caller's argument on every rank (the rank that owns
  // the bad coordinate names it).
  collectively(comm, "ShardedEngine", true, [&] {
    parts.engine.emplace(slice, slice_ranges(parts.optimizer, shard.offset, shard.size), options,
                         shard);
  });
  return parts;
}

ShardedEngine::ShardedEngine(std::span<const float> x0, OptimizerRanges optimizer, Options options,
                             Communicator& communicator, DistributedOptions distributed, bool quiet)
    : ShardedEngine(build(x0, std::move(optimizer), options, communicator, distributed, quiet),
                    communicator, distributed) {}

ShardedEngine::ShardedEngine(Parts parts, Communicator& communicator,
                             DistributedOptions distributed)
    : world_(&communicator),
      distributed_(distributed),
      groups_(communicator.size() / distributed.data_parallel),
      stats_(std::move(parts.stats)),
      sums_(std::move(parts.sums)),
      shard_(parts.engine->shard()),
      optimizer_(std::move(parts.optimizer)),
      engine_(std::move(*parts.engine)) {
  const int w = world_size();
  for (int r = 0; r < w; ++r) shards_.push_back(shard_of(shard_.dim, w, r));
  memory_ = shard_memory(shard_.dim, w, rank(), engine_.options(), optimizer_,
                         distributed_.data_parallel);
  const PointRange mine = my_points();
  batch_.size_ = engine_.options().parallelism;
  batch_.dim_ = shard_.dim;
  batch_.rows_ = mine;
  const auto rows = static_cast<std::size_t>(mine.count);
  batch_.points_ = detail::DeviceFloats(engine_.device(), rows * shard_.dim);
  batch_.grads_ = detail::DeviceFloats(engine_.device(), rows * shard_.dim);
  batch_.losses_.assign(rows, 0.0);
  batch_.seeds_.assign(rows, 0);
  if (distributed_.data_parallel > 1)
    received_ = detail::DeviceFloats(engine_.device(), static_cast<std::size_t>(w) * shard_.size);
  check_same_configuration();
  check_same_state();
  if (engine_.options().threads == 0) {
    const int sharing = std::max(1, world_->node_local().size);
    engine_.set_threads(std::max(1, available_cores() / sharing));
  }
}

ShardedEngine::ShardedEngine(ShardedEngine&&) noexcept = default;
ShardedEngine& ShardedEngine::operator=(ShardedEngine&&) noexcept = default;
ShardedEngine::~ShardedEngine() = default;

PointRange ShardedEngine::points_of_group(int g) const {
  return point_range(engine_.options().parallelism, groups_, g);
}

// ---- one round ------------------------------------------------------------------

ShardedBatch& ShardedEngine::ask() {
  if (engine_.pending()) return batch_;
  failures_.clear();
  const Batch& slices = engine_.ask();
  batch_.iteration_ = engine_.iteration();
  for (int i : batch_.rows_) {
    batch_.seeds_[batch_.local(i)] =
        minibatch_seed(slices.seed(i), data_rank(), distributed_.data_parallel);
    batch_.losses_[batch_.local(i)] = std::numeric_limits<double>::quiet_NaN();
  }
  const auto start = Clock::now();
  for (int k = 0; k < points_of_group(0).count; ++k) send_points(k, slices);
  stats_->seconds += std::chrono::duration<double>(Clock::now() - start).count();
  return batch_;
}

void ShardedEngine::count_sent(std::span<const std::size_t> send_counts) {
  for (std::size_t r = 0; r < send_counts.size(); ++r) {
    if (static_cast<int>(r) != rank())
      stats_->bytes_sent += send_counts[r] * kFloat;  // not the copy to itself
  }
  ++stats_->collectives;
}

void ShardedEngine::send_points(int k, const Batch& slices) {
  // Rank s sends its slice of row k of every group to the group's ranks.
  const auto w = static_cast<std::size_t>(world_size());
  std::vector<std::size_t> send_counts(w), send_offsets(w), recv_counts(w), recv_offsets(w);
  for (std::size_t r = 0; r < w; ++r) {
    const PointRange rows = points_of_group(static_cast<int>(r) / distributed_.data_parallel);
    if (k >= rows.count) continue;
    send_counts[r] = shard_.size;
    send_offsets[r] = static_cast<std::size_t>(rows.first + k) * shard_.size;
  }
  if (k < my_points().count) {
    for (std::size_t s = 0; s < w; ++s) {
      recv_counts[s] = shards_[s].size;
      recv_offsets[s] = static_cast<std::size_t>(k) * shard_.dim + shards_[s].offset;
    }
  }
  world_->all_to_all_floats(slices.device_points(), send_counts, send_offsets,
                            batch_.points_.data(), recv_counts, recv_offsets);
  count_sent(send_counts);
}

void ShardedEngine::send_gradients(int k, Batch& slices) {
  // Each rank sends slice s of its row k's gradient to rank s; with D > 1
  // the D contributions of a group arrive side by side and are averaged in
  // rank order (data_parallel.hpp), as DistributedEngine does.
  const int d = distributed_.data_parallel;
  const auto w = static_cast<std::size_t>(world_size());
  const std::size_t s = shard_.size;
  std::vector<std::size_t> send_counts(w), send_offsets(w), recv_counts(w), recv_offsets(w);
  if (k < my_points().count) {
    for (std::size_t r = 0; r < w; ++r) {
      send_counts[r] = shards_[r].size;
      send_offsets[r] = static_cast<std::size_t>(k) * shard_.dim + shards_[r].offset;
    }
  }
  float* grads = slices.device_grads();  // host rows on the CPU
  for (std::size_t r = 0; r < w; ++r) {
    const PointRange rows = points_of_group(static_cast<int>(r) / d);
    if (k >= rows.count) continue;
    recv_counts[r] = s;
    recv_offsets[r] = d == 1 ? static_cast<std::size_t>(rows.first + k) * s : r * s;
  }
  world_->all_to_all_floats(batch_.grads_.data(), send_counts, send_offsets,
                            d == 1 ? grads : received_.data(), recv_counts, recv_offsets);
  count_sent(send_counts);
  if (d == 1) return;
  for (int g = 0; g < groups_; ++g) {
    const PointRange rows = points_of_group(g);
    if (k >= rows.count) continue;
    // In the engine's memory, with its device's arithmetic (the CPU's is
    // data_parallel.hpp's mean_in_rank_order).
    detail::group_mean(engine_, received_.data() + static_cast<std::size_t>(g * d) * s,
                       static_cast<std::size_t>(d), s,
                       grads + static_cast<std::size_t>(rows.first + k) * s);
  }
}

void ShardedEngine::fail(int i, std::string_view message) {
  if (!engine_.pending()) throw std::runtime_error("fail: no batch is pending; call ask() first");
  (void)batch_.local(i);  // std::out_of_range for another rank's row
  failures_.push_back({i, std::string(message)});
}

std::vector<CoordinateRange> ShardedEngine::local_ranges(
    std::span<const CoordinateRange> unchanged) const {
  std::vector<CoordinateRange> local;
  const std::size_t lo = shard_.offset;
  const std::size_t hi = shard_.offset + shard_.size;
  for (const CoordinateRange& r : unchanged) {
    const std::size_t begin = std::max(lo, r.offset);
    const std::size_t end = std::min(hi, r.offset + r.size);
    if (begin < end) local.push_back({begin - lo, end - begin});
  }
  return local;
}

const IterationInfo& ShardedEngine::tell(ShardedBatch& batch,
                                         std::span<const CoordinateRange> unchanged) {
  if (!engine_.pending()) throw std::runtime_error("tell: no batch is pending; call ask() first");
  if (&batch != &batch_) {
    throw std::invalid_argument("batch: not the batch this engine's ask() returned");
  }
  const auto start = Clock::now();
  for (const detail::PointFailure& f : failures_) {
    batch_.losses_[batch_.local(f.point)] = std::numeric_limits<double>::quiet_NaN();
  }
  std::vector<double> losses;
  try {
    losses = detail::exchange_status_and_losses(
        *world_, {engine_.options().parallelism, groups_, distributed_.data_parallel},
        distributed_.on_failure, engine_.iteration(), shard_.dim, unchanged, failures_,
        batch_.losses_, *stats_);
  } catch (const RankFailure&) {
    failures_.clear();
    throw;
  }
  Batch& slices = engine_.ask();  // pending: the round's batch
  for (int i = 0; i < slices.size(); ++i) slices.loss(i) = losses[static_cast<std::size_t>(i)];
  for (int k = 0; k < points_of_group(0).count; ++k) send_gradients(k, slices);
  stats_->seconds += std::chrono::duration<double>(Clock::now() - start).count();
  const std::vector<CoordinateRange> local = local_ranges(unchanged);
  const IterationInfo& info = engine_.tell(slices, local);
  failures_.clear();
  const int k = distributed_.hash_interval;
  if (k > 0 && engine_.iteration() % k == 0) check_same_state();
  return info;
}

void ShardedEngine::gather_iterate(std::span<float> out) {
  if (out.size() != shard_.dim) {
    throw std::invalid_argument("out: size " + std::to_string(out.size()) +
                                " does not match the dimension " + std::to_string(shard_.dim));
  }
  std::vector<std::size_t> counts;
  for (const CoordinateShard& s : shards_) counts.push_back(s.size);
  if (!engine_.device().is_cuda()) {
    world_->all_gather_floats(engine_.device_iterate(), out.data(), counts);
    return;
  }
  detail::DeviceFloats whole(engine_.device(), shard_.dim);
  world_->all_gather_floats(engine_.device_iterate(), whole.data(), counts);
  whole.copy_to_host(0, out);
}

// ---- agreement between the ranks ---------------------------------------------

std::uint64_t ShardedEngine::state_hash() const { return detail::shared_state_hash(engine_); }

void ShardedEngine::check_same_state() {
  const auto start = Clock::now();
  const std::vector<int> differ = detail::ranks_differing_from_rank0(*world_, state_hash());
  stats_->bytes_sent += sizeof(std::uint64_t);
  ++stats_->collectives;
  stats_->seconds += std::chrono::duration<double>(Clock::now() - start).count();
  if (!differ.empty()) {
    throw RankDivergence("state hashes differ after iteration " +
                         std::to_string(engine_.iteration()) + ": " + detail::name_ranks(differ) +
                         " differ from rank 0 (a non-deterministic objective, different inputs, "
                         "or different hardware per rank)");
  }
}

void ShardedEngine::check_same_configuration() {
  const Options& options = engine_.options();
  std::uint64_t mine = detail::configuration_fingerprint(options, optimizer_, shard_.dim);
  mine = mix_seed(mine, detail::layout_fingerprint(distributed_));
  const std::vector<int> differ = detail::ranks_differing_from_rank0(*world_, mine);
  if (differ.empty()) return;
  auto fields = detail::configuration_fields(options, optimizer_, shard_.dim);
  detail::add_layout_fields(distributed_, fields);
  throw std::invalid_argument("ShardedEngine: " + detail::mismatch_text(*world_, fields, differ));
}

void ShardedEngine::set_optimizer(const OptimizerRanges& optimizer) {
  // Every rank checks the whole ranges, then the ranks compare them, then
  // each takes its slice: a rank that refuses leaves every rank unchanged.
  OptimizerRanges sized = Optimizer{};
  collectively(*world_, "set_optimizer", true, [&] {
    if (engine_.pending()) {
      throw std::runtime_error("set_optimizer: between ask() and tell() (iteration " +
                               std::to_string(engine_.iteration()) + ")");
    }
    sized = optimizer.for_dimension(shard_.dim);
    const std::string why = cannot_replace(optimizer_, sized);
    if (!why.empty()) throw std::invalid_argument(why);
    check_step_offsets(sized, engine_.optimizer_step());
  });
  const std::uint64_t mine =
      detail::configuration_fingerprint(engine_.options(), sized, shard_.dim);
  const std::vector<int> differ = detail::ranks_differing_from_rank0(*world_, mine);
  if (!differ.empty()) {
    throw std::invalid_argument(
        "set_optimizer: " +
        detail::mismatch_text(
            *world_, detail::configuration_fields(engine_.options(), sized, shard_.dim), differ));
  }
  collectively(*world_, "set_optimizer", true,
               [&] { engine_.set_optimizer(slice_ranges(sized, shard_.offset, shard_.size)); });
  optimizer_ = std::move(sized);
}

}  // namespace optex
