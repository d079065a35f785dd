// NcclCommunicator's collectives: the host operations through the scratch
// buffers, and the gradient rows (all-gather, all-to-all) in GPU memory.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "distributed/rank_order_reduce.hpp"
#include "nccl_state.hpp"
#include "optex/distributed/nccl_communicator.hpp"

namespace optex {

namespace {

// Device memory of GPU `device` (or managed memory): what NCCL reads and writes.
bool on_device(const void* pointer, int device) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // not a pointer CUDA knows: clear the error for later calls
    return false;
  }
  if (attributes.type == cudaMemoryTypeManaged) return true;
  return attributes.type == cudaMemoryTypeDevice && attributes.device == device;
}

void require_on_device(const char* name, const void* pointer, int device) {
  if (on_device(pointer, device)) return;
  std::ostringstream text;
  text << name << ": " << pointer << " is not memory of cuda:" << device
       << " (row_device()); all_gather_floats and all_to_all_floats read and write GPU memory";
  throw std::invalid_argument(text.str());
}

}  // namespace

// ---- host memory ---------------------------------------------------------------

void NcclCommunicator::all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) {
  const auto ranks = static_cast<std::size_t>(size());
  if (mine.size() > std::numeric_limits<std::size_t>::max() / ranks ||
      all.size() != mine.size() * ranks) {
    throw std::invalid_argument("all: " + std::to_string(all.size()) +
                                " bytes, expected size() * mine.size() = " + std::to_string(ranks) +
                                " * " + std::to_string(mine.size()));
  }
  const Call call = start("all_gather_bytes");
  if (mine.empty()) return;
  state_->gather(call, mine, all);
}

// NCCL's documentation promises the same reduced array on every rank but not
// how a floating-point sum is rounded: that depends on the algorithm (ring,
// tree, NVLS, CollNet) and the topology, and its maintainers say the order
// differs between offsets (github.com/NVIDIA/nccl/issues/157). These are a
// few scalars, so they are gathered and reduced on the host in rank order:
// the same bits on every rank, on every machine, as the other backends.
void NcclCommunicator::all_reduce(std::span<double> values, ReduceOp op) {
  if (op != ReduceOp::sum && op != ReduceOp::min && op != ReduceOp::max) {
    throw std::invalid_argument("op: " + std::to_string(static_cast<int>(op)) +
                                " is not a ReduceOp");
  }
  const Call call = start("all_reduce");
  if (values.empty() || size() == 1) return;
  const std::size_t n = values.size();
  std::vector<double> all(n * static_cast<std::size_t>(size()));
  state_->gather(call, std::as_bytes(values), std::as_writable_bytes(std::span<double>(all)));
  detail::reduce_in_rank_order(all, static_cast<std::size_t>(size()), values, op);
}

void NcclCommunicator::broadcast_bytes(std::span<std::byte> data, int root) {
  if (root < 0 || root >= size()) {
    throw std::invalid_argument("root: " + std::to_string(root) +
                                " is not a rank of this communicator of size " +
                                std::to_string(size()));
  }
  const Call call = start("broadcast_bytes");
  if (data.empty()) return;
  State& s = *state_;
  s.guarded(call, [&] {
    std::byte* on_gpu = s.device_bytes(data.size());
    std::byte* staged = s.host_bytes(data.size());
    const bool is_root = rank() == root;
    if (is_root) {
      std::memcpy(staged, data.data(), data.size());
      OPTEX_CUDA_CHECK(
          cudaMemcpyAsync(on_gpu, staged, data.size(), cudaMemcpyHostToDevice, s.stream.get()));
    }
    s.check(call,
            ncclBroadcast(on_gpu, on_gpu, data.size(), ncclUint8, root, s.comm, s.stream.get()),
            "ncclBroadcast");
    s.await(call, false);
    if (!is_root) {
      OPTEX_CUDA_CHECK(
          cudaMemcpyAsync(staged, on_gpu, data.size(), cudaMemcpyDeviceToHost, s.stream.get()));
    }
    s.await(call, true);
    if (!is_root) std::memcpy(data.data(), staged, data.size());
  });
}

// An all-reduce of one value: it completes on a rank only once every rank
// has contributed.
void NcclCommunicator::barrier() {
  const Call call = start("barrier");
  State& s = *state_;
  s.guarded(call, [&] {
    auto* value = reinterpret_cast<float*>(s.device_bytes(sizeof(float)));
    s.check(call, ncclAllReduce(value, value, 1, ncclFloat, ncclSum, s.comm, s.stream.get()),
            "ncclAllReduce");
    s.await(call, true);
  });
}

// ---- gradient rows ---------------------------------------------------------------

// The all-gather-v idiom: one broadcast per contributing rank, in one group,
// so that NCCL runs them together. Counts are size_t throughout (NCCL takes
// size_t counts), so a row may exceed INT_MAX floats.
void NcclCommunicator::all_gather_floats(const float* mine, float* all,
                                         std::span<const std::size_t> counts) {
  if (counts.size() != static_cast<std::size_t>(size())) {
    throw std::invalid_argument("counts: " + std::to_string(counts.size()) +
                                " entries, expected one per rank (" + std::to_string(size()) + ")");
  }
  constexpr std::size_t kMaxFloats = std::numeric_limits<std::size_t>::max() / sizeof(float);
  std::vector<std::size_t> offsets(counts.size());
  std::size_t total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > kMaxFloats - total) {
      throw std::invalid_argument("counts: the total number of floats overflows at rank " +
                                  std::to_string(r));
    }
    offsets[r] = total;
    total += counts[r];
  }
  const auto me = static_cast<std::size_t>(rank());
  if (counts[me] > 0 && mine == nullptr) {
    throw std::invalid_argument("mine: null, but counts[" + std::to_string(me) +
                                "] = " + std::to_string(counts[me]));
  }
  if (total > 0 && all == nullptr) {
    throw std::invalid_argument("all: null, but the counts add up to " + std::to_string(total));
  }
  const Call call = start("all_gather_floats");
  if (total == 0) return;
  State& s = *state_;
  if (counts[me] > 0) require_on_device("mine", mine, s.device);
  require_on_device("all", all, s.device);

  s.guarded(call, [&] {
    s.run_group(call, [&](const auto& enqueue) {
      for (std::size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] == 0) continue;
        float* slot = all + offsets[r];
        // The root sends `mine` (in place when it is its own slot); the others
        // only receive, and NCCL ignores their send buffer.
        const float* send = r == me ? mine : slot;
        enqueue("ncclBroadcast", [&] {
          return ncclBroadcast(send, slot, counts[r], ncclFloat, static_cast<int>(r), s.comm,
                               s.stream.get());
        });
      }
    });
  });
}

// First every rank's counts, gathered through the host path, so that a
// mismatch fails every rank before any float moves (NCCL's send and receive
// of different sizes are not an error it reports). Then the own block by
// cudaMemcpyAsync and one group of an ncclSend and an ncclRecv per peer with
// floats to move (size_t counts: no pieces needed).
void NcclCommunicator::all_to_all_floats(const float* send,
                                         std::span<const std::size_t> send_counts,
                                         std::span<const std::size_t> send_offsets, float* recv,
                                         std::span<const std::size_t> recv_counts,
                                         std::span<const std::size_t> recv_offsets) {
  constexpr std::string_view kOperation = "all_to_all_floats";
  const std::string problem =
      all_to_all_argument_problem(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
  if (!problem.empty()) throw std::invalid_argument(where(kOperation) + ": " + problem);
  const Call call = start(kOperation);
  State& s = *state_;
  const auto any = [](std::span<const std::size_t> counts) {
    return std::any_of(counts.begin(), counts.end(), [](std::size_t c) { return c > 0; });
  };
  if (any(send_counts)) require_on_device("send", send, s.device);
  if (any(recv_counts)) require_on_device("recv", recv, s.device);

  s.agree_on_counts(call, send_counts, recv_counts);
  const auto me = static_cast<std::size_t>(rank());
  s.guarded(call, [&] {
    if (recv_counts[me] > 0) {
      OPTEX_CUDA_CHECK(cudaMemcpyAsync(recv + recv_offsets[me], send + send_offsets[me],
                                       recv_counts[me] * sizeof(float), cudaMemcpyDeviceToDevice,
                                       s.stream.get()));
    }
    s.run_group(call, [&](const auto& enqueue) {
      for (std::size_t r = 0; r < recv_counts.size(); ++r) {
        if (r == me) continue;
        const int peer = static_cast<int>(r);
        if (send_counts[r] > 0) {
          enqueue("ncclSend", [&] {
            return ncclSend(send + send_offsets[r], send_counts[r], ncclFloat, peer, s.comm,
                            s.stream.get());
          });
        }
        if (recv_counts[r] > 0) {
          enqueue("ncclRecv", [&] {
            return ncclRecv(recv + recv_offsets[r], recv_counts[r], ncclFloat, peer, s.comm,
                            s.stream.get());
          });
        }
      }
    });
  });
}

}  // namespace optex
