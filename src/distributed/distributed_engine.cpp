#include "optex/distributed/distributed_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <sstream>
#include <utility>

#include "distributed/rank_agreement.hpp"
#include "optex/backend/block_pool.hpp"
#include "optex/distributed/configuration_fingerprint.hpp"
#include "optex/distributed/data_parallel.hpp"
#include "optex/distributed/startup_agreement.hpp"
#include "optex/util/random.hpp"

namespace optex {
namespace {

using Clock = std::chrono::steady_clock;

using detail::collectively;
using detail::name_ranks;

// What every rank needs to know about the others before the first iteration.
struct Configuration {
  std::uint64_t fingerprint = 0;  // options, optimizer, dimension
  std::uint64_t layout = 0;       // distributed options
};

Engine build_engine(std::span<const float> x0, OptimizerRanges optimizer, const Options& options,
                    Communicator& comm, const DistributedOptions& distributed) {
  // Check locally first, but agree on the outcome: a rank with bad arguments
  // must not leave the others waiting.
  collectively(comm, "DistributedEngine", true, [&] {
    distributed.validate();
    options.validate();
    if (x0.empty()) throw std::invalid_argument("x0: dimension must be >= 1, got 0");
    (void)optimizer.for_dimension(x0.size());  // the hyperparameters and the ranges' sizes
  });
  // Rank 0's start point, on every rank.
  std::uint64_t dim = x0.size();
  comm.broadcast(std::span<std::uint64_t>(&dim, 1), 0);
  std::vector<float> start(x0.begin(), x0.end());
  collectively(comm, "DistributedEngine", true, [&] {
    if (dim != x0.size()) {
      throw std::invalid_argument("x0: dimension " + std::to_string(x0.size()) + " on rank " +
                                  std::to_string(comm.rank()) + " differs from rank 0's " +
                                  std::to_string(dim));
    }
  });
  comm.broadcast(std::span<float>(start), 0);
  std::optional<Engine> engine;
  collectively(comm, "DistributedEngine", false,
               [&] { engine.emplace(start, std::move(optimizer), options); });
  return std::move(*engine);
}

}  // namespace

void DistributedOptions::validate() const {
  if (data_parallel < 1) {
    throw std::invalid_argument("data_parallel: must be >= 1, got " +
                                std::to_string(data_parallel));
  }
  if (hash_interval < 0) {
    throw std::invalid_argument("hash_interval: must be >= 0 (0: never), got " +
                                std::to_string(hash_interval));
  }
  if (on_failure != OnFailure::abort && on_failure != OnFailure::drop) {
    throw std::invalid_argument("on_failure: unknown value " +
                                std::to_string(static_cast<int>(on_failure)));
  }
}

DistributedEngine::DistributedEngine(std::span<const float> x0, OptimizerRanges optimizer,
                                     Options options, Communicator& communicator,
                                     DistributedOptions distributed)
    : DistributedEngine(build_engine(x0, std::move(optimizer), options, communicator, distributed),
                        communicator, distributed) {}

DistributedEngine::DistributedEngine(Engine engine, Communicator& communicator,
                                     DistributedOptions distributed)
    : engine_(std::move(engine)), world_(&communicator), distributed_(distributed) {
  const int world = world_->size();
  const int n = engine_.options().parallelism;
  const Device rows = world_->row_device();
  collectively(*world_, "DistributedEngine", true, [&] {
    distributed_.validate();
    const int d = distributed_.data_parallel;
    if (world % d != 0) {
      throw std::invalid_argument("data_parallel: " + std::to_string(d) +
                                  " does not divide the world size " + std::to_string(world));
    }
    if (world / d > n) {
      throw std::invalid_argument(
          "parallelism: " + std::to_string(n) + " points cannot be shared by " +
          std::to_string(world / d) + " groups (world size " + std::to_string(world) +
          " / data_parallel " + std::to_string(d) + "); every group needs at least one point");
    }
    if (rows.is_cuda() && rows != engine_.device()) {
      throw std::invalid_argument("device: the " + std::string(world_->backend()) +
                                  " communicator's gradient rows live on " + rows.name() +
                                  ", the engine on " + engine_.device().name());
    }
  });
  groups_ = world / distributed_.data_parallel;
  check_same_configuration();
  if (distributed_.data_parallel > 1) {
    group_comm_ = world_->split(group(), data_rank());
    peer_comm_ = world_->split(data_rank(), group());
    const auto rows_here = static_cast<std::size_t>(my_points().count);
    // Where the communicator keeps its rows: the GPU's for NCCL, else the host's.
    group_rows_ = detail::DeviceFloats(
        world_->row_device(),
        static_cast<std::size_t>(distributed_.data_parallel) * rows_here * engine_.dim());
  }
  check_same_state();
  share_the_cores();
}

void DistributedEngine::share_the_cores() {
  // Every rank runs the same passes on its own copy at the same time: ranks on
  // one machine each take their share of its cores rather than all of them.
  if (engine_.options().threads != 0 || engine_.device().is_cuda()) return;
  const int sharing = std::max(1, world_->node_local().size);
  engine_.set_threads(std::max(1, available_cores() / sharing));
}

DistributedEngine::DistributedEngine(DistributedEngine&&) noexcept = default;
DistributedEngine& DistributedEngine::operator=(DistributedEngine&&) noexcept = default;
DistributedEngine::~DistributedEngine() = default;

DistributedEngine DistributedEngine::load(const std::string& path, Communicator& communicator,
                                          DistributedOptions distributed,
                                          std::optional<Device> device) {
  std::optional<Engine> engine;
  collectively(communicator, "DistributedEngine::load", false,
               [&] { engine.emplace(Engine::load(path, device)); });
  return DistributedEngine(std::move(*engine), communicator, distributed);
}

void DistributedEngine::save(const std::string& path) {
  collectively(*world_, "DistributedEngine::save", false, [&] {
    if (rank() == 0) engine_.save(path);
  });
}

int DistributedEngine::rank() const { return world_->rank(); }
int DistributedEngine::world_size() const { return world_->size(); }
int DistributedEngine::group() const { return rank() / distributed_.data_parallel; }
int DistributedEngine::data_rank() const { return rank() % distributed_.data_parallel; }

DistributedEngine::PointRange DistributedEngine::points_of_group(int g) const {
  return point_range(engine_.options().parallelism, groups_, g);
}

Batch& DistributedEngine::ask() {
  if (!engine_.pending()) failures_.clear();
  return engine_.ask();
}

std::uint64_t DistributedEngine::seed(int i) const {
  if (!engine_.pending()) {
    throw std::runtime_error("seed: no batch is pending; call ask() first");
  }
  // ask() on a pending engine returns the pending batch unchanged.
  const Batch& batch = const_cast<Engine&>(engine_).ask();
  return minibatch_seed(batch.seed(i), data_rank(), distributed_.data_parallel);
}

void DistributedEngine::fail(int i, std::string_view message) {
  if (!engine_.pending()) {
    throw std::runtime_error("fail: no batch is pending; call ask() first");
  }
  const PointRange mine = my_points();
  if (!mine.contains(i)) {
    throw std::out_of_range("i: point " + std::to_string(i) + " is not one of this rank's [" +
                            std::to_string(mine.first) + ", " +
                            std::to_string(mine.first + mine.count) + ")");
  }
  failures_.push_back({i, std::string(message)});
}

const IterationInfo& DistributedEngine::tell(Batch& batch,
                                             std::span<const CoordinateRange> unchanged) {
  if (!engine_.pending()) {
    throw std::runtime_error("tell: no batch is pending; call ask() first");
  }
  if (&batch != &engine_.ask()) {
    throw std::invalid_argument("batch: not the batch this engine's ask() returned");
  }
  const auto start = Clock::now();
  exchange_status_and_losses(batch, unchanged);
  const std::span<float> rows = gradient_rows(batch);
  if (distributed_.data_parallel > 1) average_over_group(batch, rows);
  gather_groups(rows);
  stats_.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  const IterationInfo& info = engine_.tell(batch, unchanged);
  failures_.clear();
  const int k = distributed_.hash_interval;
  if (k > 0 && engine_.iteration() % k == 0) check_same_state();
  return info;
}

void DistributedEngine::exchange_status_and_losses(Batch& batch,
                                                   std::span<const CoordinateRange> unchanged) {
  const PointRange own = my_points();
  for (const detail::PointFailure& f : failures_) {
    batch.loss(f.point) = std::numeric_limits<double>::quiet_NaN();
  }
  std::vector<double> own_losses;
  for (int i : own) own_losses.push_back(batch.loss(i));
  std::vector<double> losses;
  try {
    losses = detail::exchange_status_and_losses(
        *world_, {engine_.options().parallelism, groups_, distributed_.data_parallel},
        distributed_.on_failure, engine_.iteration(), engine_.dim(), unchanged, failures_,
        own_losses, stats_);
  } catch (const RankFailure&) {
    failures_.clear();
    throw;
  }
  for (int i = 0; i < batch.size(); ++i) batch.loss(i) = losses[static_cast<std::size_t>(i)];
}

std::span<float> DistributedEngine::gradient_rows(Batch& batch) {
  if (world_->row_device().is_cuda()) {
    // Rows the caller wrote through host views must be on the device before
    // the communicator gathers the device rows.
    batch.upload_staged_gradients();
    return {batch.device_grads(), static_cast<std::size_t>(batch.size()) * batch.dim()};
  }
  if (engine_.device().is_cuda()) {
    // A device engine with a host communicator: this rank's rows may have
    // been written on the device; reading them through the const view copies
    // those down (staged rows stay as they are) before grads() stages all.
    const Batch& view = batch;
    for (int i : my_points()) view.grad(i);
  }
  return batch.grads();  // host rows (staged for upload on a device engine)
}

void DistributedEngine::average_over_group(Batch&, std::span<float> rows) {
  const PointRange own = my_points();
  const std::size_t dim = engine_.dim();
  const std::size_t count = static_cast<std::size_t>(own.count) * dim;
  const std::span<float> mine = rows.subspan(static_cast<std::size_t>(own.first) * dim, count);
  const std::vector<std::size_t> counts(static_cast<std::size_t>(distributed_.data_parallel),
                                        count);
  group_comm_->all_gather_floats(mine.data(), group_rows_.data(), counts);
  stats_.bytes_sent += count * sizeof(float);
  ++stats_.collectives;
  const auto ranks = static_cast<std::size_t>(distributed_.data_parallel);
  if (world_->row_device().is_cuda()) {
    detail::group_mean(engine_, group_rows_.data(), ranks, count, mine.data());  // on the GPU
  } else {
    mean_in_rank_order({group_rows_.data(), ranks * count}, mine);
  }
}

void DistributedEngine::gather_groups(std::span<float> rows) {
  Communicator& peers = distributed_.data_parallel > 1 ? *peer_comm_ : *world_;
  const std::size_t dim = engine_.dim();
  std::vector<std::size_t> counts(static_cast<std::size_t>(groups_));
  for (int g = 0; g < groups_; ++g) {
    counts[static_cast<std::size_t>(g)] = static_cast<std::size_t>(points_of_group(g).count) * dim;
  }
  const PointRange own = my_points();
  peers.all_gather_floats(rows.data() + static_cast<std::size_t>(own.first) * dim, rows.data(),
                          counts);
  stats_.bytes_sent += counts[static_cast<std::size_t>(group())] * sizeof(float);
  ++stats_.collectives;
}

std::uint64_t DistributedEngine::state_hash() const {
  const std::span<const float> x = engine_.iterate();
  std::uint64_t h = fnv1a64(reinterpret_cast<const unsigned char*>(x.data()), x.size_bytes());
  h = mix_seed(h, static_cast<std::uint64_t>(engine_.iteration()));
  h = mix_seed(h, static_cast<std::uint64_t>(engine_.evaluations()));
  return mix_seed(h, engine_.rng_state());
}

void DistributedEngine::set_optimizer(const OptimizerRanges& optimizer) {
  // Tried on a scratch copy first: a rank that refuses must leave every rank unchanged.
  collectively(*world_, "set_optimizer", true, [&] {
    if (engine_.pending()) {
      throw std::runtime_error("set_optimizer: between ask() and tell() (iteration " +
                               std::to_string(engine_.iteration()) + ")");
    }
    const std::string why =
        cannot_replace(engine_.optimizer_ranges(), optimizer.for_dimension(engine_.dim()));
    if (!why.empty()) throw std::invalid_argument(why);
  });
  const std::uint64_t mine =
      detail::configuration_fingerprint(engine_.options(), optimizer, engine_.dim());
  const std::vector<int> differ = detail::ranks_differing_from_rank0(*world_, mine);
  if (!differ.empty()) {
    throw std::invalid_argument(
        "set_optimizer: " +
        detail::mismatch_text(
            *world_, detail::configuration_fields(engine_.options(), optimizer, engine_.dim()),
            differ));
  }
  collectively(*world_, "set_optimizer", true, [&] { engine_.set_optimizer(optimizer); });
}

void DistributedEngine::check_same_configuration() {
  const Configuration mine{detail::configuration_fingerprint(
                               engine_.options(), engine_.optimizer_ranges(), engine_.dim()),
                           detail::layout_fingerprint(distributed_)};
  std::vector<Configuration> all(static_cast<std::size_t>(world_size()));
  world_->all_gather(std::span<const Configuration>(&mine, 1), std::span<Configuration>(all));
  std::vector<int> differ;
  for (int r = 1; r < world_size(); ++r) {
    const Configuration& c = all[static_cast<std::size_t>(r)];
    if (c.fingerprint != all[0].fingerprint || c.layout != all[0].layout) differ.push_back(r);
  }
  if (!differ.empty()) {
    // Every rank knows of the mismatch: they exchange the fields themselves
    // to name the first that differs.
    auto fields =
        detail::configuration_fields(engine_.options(), engine_.optimizer_ranges(), engine_.dim());
    detail::add_layout_fields(distributed_, fields);
    throw std::invalid_argument("DistributedEngine: " +
                                detail::mismatch_text(*world_, fields, differ));
  }
}

void DistributedEngine::check_same_state() {
  const auto start = Clock::now();
  const std::uint64_t mine = state_hash();
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world_size()));
  world_->all_gather(std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(all));
  stats_.bytes_sent += sizeof mine;
  ++stats_.collectives;
  stats_.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<int> differ;
  for (int r = 1; r < world_size(); ++r) {
    if (all[static_cast<std::size_t>(r)] != all[0]) differ.push_back(r);
  }
  if (!differ.empty()) {
    std::ostringstream msg;
    msg << "state hashes differ after iteration " << engine_.iteration() << ": "
        << name_ranks(differ) << " differ from rank 0 (a non-deterministic objective, "
        << "different inputs, or different hardware per rank)";
    throw RankDivergence(msg.str());
  }
}

}  // namespace optex
