// What a rank of a sharded engine allocates, and the check that it fits
// before anything of size d is allocated (DESIGN.md section 3, "Sharded state").
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/device_floats.hpp"
#include "sharded/sharded_engine_parts.hpp"

namespace optex {
namespace {

constexpr std::size_t kFloat = sizeof(float);

// Memory this process may still take: MemAvailable, or the free pages where
// /proc/meminfo is missing.
std::size_t available_host_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    std::size_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                               : std::numeric_limits<std::size_t>::max();
}

std::string mib(std::size_t bytes) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return s.str();
}

}  // namespace

ShardMemory shard_memory(std::size_t d, int ranks, int rank, const Options& options,
                         const OptimizerRanges& optimizer, int data_parallel) {
  const CoordinateShard shard = shard_of(d, ranks, rank);
  const std::size_t s = shard.size;
  const auto n = static_cast<std::size_t>(options.parallelism);
  const auto t0 = static_cast<std::size_t>(options.history);
  const auto slots = static_cast<std::size_t>(optimizer.state_slots().count());
  const int groups = ranks / std::max(1, data_parallel);
  const auto own_rows = static_cast<std::size_t>(
      point_range(options.parallelism, groups, rank / data_parallel).count);
  ShardMemory m;
  // The history's storage (bf16 halves points, gradients or both on a GPU).
  const std::size_t point_bytes = options.history_precision == Precision::bf16 ? 2 : kFloat;
  const std::size_t gradient_bytes = options.history_precision == Precision::fp32 ? kFloat : 2;
  m.history = t0 * s * (point_bytes + gradient_bytes);
  m.optimizer = (2 + 2 * slots) * s * kFloat;  // iterate, next iterate; state, work state
  const std::size_t batches = options.separates_points_from_rows() ? 2 : 1;
  m.rows = batches * (3 * n - 1) * s * kFloat  // points, gradients, predictions: slices
           + 2 * own_rows * d * kFloat;        // this rank's rows, whole
  if (options.separates_points_from_rows()) m.rows += s * sizeof(double);  // the mean's scratch
  if (data_parallel > 1) m.rows += static_cast<std::size_t>(ranks) * s * kFloat;  // received
  return m;
}

namespace detail {

// Refuses, on every rank, a configuration that some rank has no room for,
// before anything of size d is allocated; prints every rank's bytes on rank 0.
void check_shard_memory(const ShardMemory& memory, const CoordinateShard& shard, Device device,
                        Communicator& comm, bool quiet) {
  // A GPU is one rank's (NCCL: one process per GPU); a host is shared by its ranks.
  const int sharing = std::max(1, comm.node_local().size);
  const std::size_t available =
      device.is_cuda() ? detail::cuda_free_bytes(device) : available_host_bytes() / sharing;
  const std::uint64_t mine[4] = {memory.total(), available, memory.history, memory.optimizer};
  std::vector<std::uint64_t> all(4 * static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::uint64_t>(mine), std::span<std::uint64_t>(all));
  if (comm.rank() == 0 && !quiet) {
    std::fprintf(stderr,
                 "optex: sharded state over %d ranks, d = %zu (per rank: needed of available)\n",
                 comm.size(), shard.dim);
    for (int r = 0; r < comm.size(); ++r) {
      const std::uint64_t* a = all.data() + 4 * r;
      std::fprintf(stderr, "optex:   rank %d: %s (history %s, optimizer %s) of %s\n", r,
                   mib(a[0]).c_str(), mib(a[2]).c_str(), mib(a[3]).c_str(), mib(a[1]).c_str());
    }
  }
  for (int r = 0; r < comm.size(); ++r) {
    const std::uint64_t* a = all.data() + 4 * r;
    if (a[0] > a[1]) {
      throw std::invalid_argument("sharded state: rank " + std::to_string(r) + " needs " +
                                  std::to_string(a[0]) + " bytes (history " + std::to_string(a[2]) +
                                  ", optimizer " + std::to_string(a[3]) + ") but has " +
                                  std::to_string(a[1]) +
                                  " available; add ranks, lower the history or the parallelism");
    }
  }
}

}  // namespace detail

}  // namespace optex
