// NcclCommunicator's state (the NCCL communicator, its device, stream and
// scratch buffers) and the steps its operations share: await, fail, groups.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cuda_context.hpp"
#include "device_buffer.hpp"
#include "nccl_polling.hpp"
#include "optex/distributed/nccl_communicator.hpp"

namespace optex {

namespace detail {

ncclConfig_t nonblocking_config();

// The context of messages before a communicator exists (Communicator::where's wording).
std::string where_creating(int rank, int size, std::string_view operation);

}  // namespace detail

// One collective in progress: how messages name it, and when it gives up.
struct NcclCommunicator::Call {
  std::string where;      // "optex nccl communicator, rank r of n, operation"
  std::string operation;  // "barrier"
  detail::Clock::time_point deadline;
  Seconds timeout;
};

struct NcclCommunicator::State {
  State(int device_index, int rank_index, int ranks)
      : activation(device_index), device(device_index), rank(rank_index), size(ranks) {
    activation.leave();  // the stream exists: the caller's device again
  }
  // A communicator that was not closed (a failed creation or split) is aborted.
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Rank `rank` of `size` of the NCCL clique `id` on GPU `device`, its
  // non-blocking initialisation awaited within `timeout`.
  static std::unique_ptr<State> open(int device, int rank, int size, const ncclUniqueId& id,
                                     Seconds timeout);

  // Accepts ncclSuccess and ncclInProgress (the caller then awaits);
  // anything else fails the call.
  void check(const Call& call, ncclResult_t result, const char* nccl_call);

  // Until NCCL has enqueued the work (drain = false) or until it has also
  // completed on the stream (drain = true).
  void await(const Call& call, bool drain);

  // Aborts the NCCL communicator, remembers why, and throws for `call`.
  [[noreturn]] void fail(const Call& call, const std::string& what, bool timed_out);

  // Runs `body` (which enqueues and awaits) with the device current; any
  // failure in it, a CUDA error included, leaves the communicator aborted and
  // becomes a CommunicatorError naming the operation and the rank.
  template <class Body>
  void guarded(const Call& call, Body&& body) {
    try {
      cuda::DeviceGuard guard(device);
      body();
    } catch (const CommunicatorError&) {
      throw;
    } catch (const std::exception& e) {
      fail(call, e.what(), false);
    }
  }

  // One NCCL group: enqueue_all(enqueue) calls enqueue(name, nccl_call) for
  // each NCCL call of the group; once one has failed, the later ones are not
  // made. The group is always closed (it is per thread, and would swallow
  // later calls); then the stream is awaited.
  template <class EnqueueAll>
  void run_group(const Call& call, EnqueueAll&& enqueue_all) {
    check(call, ncclGroupStart(), "ncclGroupStart");
    std::string error;  // the first failed call's
    enqueue_all([&](const char* name, const auto& nccl_call) {
      if (!error.empty()) return;
      const ncclResult_t queued = nccl_call();
      if (queued != ncclSuccess && queued != ncclInProgress) {
        error = std::string(name) + ": " + detail::nccl_message(queued, comm);
      }
    });
    const ncclResult_t ended = ncclGroupEnd();
    if (!error.empty()) fail(call, error, false);
    check(call, ended, "ncclGroupEnd");
    await(call, true);
  }

  void abort_nccl() noexcept;

  // Finalize, then destroy: bounded by `timeout`; abort instead past it or on an error.
  void close(Seconds timeout) noexcept;

  // Scratch space for the host operations, grown as needed and kept.
  std::byte* device_bytes(std::size_t bytes);
  // Page-locked, so that copies back to it are truly asynchronous: a copy to
  // pageable memory would block this thread until the collective ends,
  // however long a late rank takes.
  std::byte* host_bytes(std::size_t bytes);

  // all := every rank's `mine` in rank order, through the scratch buffers.
  void gather(const Call& call, std::span<const std::byte> mine, std::span<std::byte> all);

  // all_to_all_floats' check: every rank's counts, through the host path. A
  // mismatch fails every rank alike (and aborts).
  void agree_on_counts(const Call& call, std::span<const std::size_t> send_counts,
                       std::span<const std::size_t> recv_counts);

  cuda::DeviceGuard activation;  // first member: active during construction and destruction
  int device;
  int rank;
  int size;
  // Written by NCCL's asynchronous initialisation: a stable address.
  ncclComm_t comm = nullptr;
  cuda::Stream stream;
  cuda::DeviceBuffer<std::byte> device_scratch;
  cuda::PinnedBuffer<std::byte> host_scratch;
  std::string broken;  // why the communicator is unusable; empty while it is healthy
};

}  // namespace optex
