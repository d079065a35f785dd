// The NCCL communicator (target optex::nccl, macro OPTEX_HAVE_NCCL): one
// process (or thread) per GPU, gradient rows gathered in device memory.
//
//   optex::Communicator& bootstrap = ...;                  // MPI, or any backend
//   auto nccl = optex::NcclCommunicator::create(bootstrap);  // GPU = node-local rank
//   optex::Device rows = nccl->row_device();                 // where the rows live
//
// The host operations (all_gather_bytes, all_reduce, broadcast_bytes,
// barrier) go through a small device buffer and are meant for a few scalars.
// all_gather_floats and all_to_all_floats read and write memory of
// row_device(): the caller's writes to `mine` (`send`) must be complete when
// it is called (synchronize the stream that wrote them); `all` (`recv`) is
// complete when it returns.
//
// Every call returns within timeout() or throws CommunicatorTimeout (see
// communicator.hpp); after any CommunicatorError the communicator is aborted
// and every later call throws CommunicatorError. The calling thread's current
// CUDA device is left as it was.
//
// This header includes neither nccl.h nor the CUDA headers.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "optex/backend/device.hpp"
#include "optex/distributed/communicator.hpp"

namespace optex {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`: one NCCL rank per bootstrap rank, with the
  // same rank and size. The GPU is the node-local rank (node_local()), so
  // start one process per GPU. Throws std::runtime_error when a host has more
  // ranks than CUDA devices (or none), CommunicatorTimeout when the NCCL
  // communicator is not up within `timeout`, CommunicatorError when NCCL fails.
  static std::unique_ptr<NcclCommunicator> create(Communicator& bootstrap,
                                                  Seconds timeout = kDefaultTimeout);

  // A world of size 1 on GPU `device`, without a bootstrap: single-process use
  // and tests. Throws std::runtime_error without any CUDA device and
  // std::invalid_argument for a device index this process does not see.
  static std::unique_ptr<NcclCommunicator> create_single(int device = 0,
                                                         Seconds timeout = kDefaultTimeout);

  // Finalizes and destroys the NCCL communicator (bounded by timeout(); aborts
  // it past that, or when it is already broken). Never throws.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  std::string_view backend() const override { return "nccl"; }

  void all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) override;
  // Every rank gets the same bits: the values are gathered and reduced on the
  // host in rank order, not by NCCL's reduction (see cuda/nccl_collectives.cpp).
  void all_reduce(std::span<double> values, ReduceOp op) override;
  void broadcast_bytes(std::span<std::byte> data, int root) override;
  void barrier() override;

  // Device::cuda(k): the GPU this rank's NCCL communicator uses.
  Device row_device() const override;
  void all_gather_floats(const float* mine, float* all,
                         std::span<const std::size_t> counts) override;
  // send and recv in memory of row_device(). The counts are checked first,
  // through the host path: a mismatch fails every rank, and aborts.
  void all_to_all_floats(const float* send, std::span<const std::size_t> send_counts,
                         std::span<const std::size_t> send_offsets, float* recv,
                         std::span<const std::size_t> recv_counts,
                         std::span<const std::size_t> recv_offsets) override;

  // A NcclCommunicator on the same GPU (ncclCommSplit). color must be >= 0.
  std::unique_ptr<Communicator> split(int color, int key) override;
  // Prints "optex: rank r aborts: reason" to stderr and aborts the NCCL
  // communicator: the other ranks' pending and later collectives fail or time out.
  void abort(std::string_view reason) override;

 private:
  struct State;
  explicit NcclCommunicator(std::unique_ptr<State> state);
  // The first step of every collective: refuses a broken communicator.
  struct Call;
  Call start(std::string_view operation) const;

  std::unique_ptr<State> state_;
};

}  // namespace optex
