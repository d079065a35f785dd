// The NCCL communicator (include/optex/distributed/nccl_communicator.hpp).
//
// The NCCL communicator is non-blocking (ncclConfig_t::blocking = 0) so that
// no NCCL call can hang: every call returns at once, possibly with
// ncclInProgress, and this file polls ncclCommGetAsyncError (and the stream)
// until the work is done, an error shows or timeout() passes, and then calls
// ncclCommAbort. The rules it follows, from the NCCL user guide ("Fault
// tolerance") and nccl4py's Communicator.get_async_error
// (docs.nvidia.com/deeplearning/nccl/user-guide/docs/nccl4py/communicator/status.html):
// after ncclInProgress, poll the communicator until it reports ncclSuccess
// before the next NCCL call and before enqueueing other work on its stream;
// an operation with a stream is only enqueued then, and may still report an
// error until the stream completes; after an error, abort.
//
// This file: creating, splitting, closing and aborting the communicator. The
// collectives are in nccl_collectives.cpp, the steps they share in
// nccl_state.hpp, the polling in nccl_polling.hpp.
#include "optex/distributed/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda_check.hpp"
#include "nccl_state.hpp"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "optex::nccl needs NCCL 2.18 or later (non-blocking ncclCommSplit and ncclCommFinalize)"
#endif

namespace optex {

namespace {

// Communicator::set_timeout's check, for the factories, which have no
// communicator yet.
void check_timeout(Communicator::Seconds timeout) {
  if (!(std::isfinite(timeout.count()) && timeout.count() > 0.0)) {
    throw std::invalid_argument("timeout: must be positive and finite, got " +
                                std::to_string(timeout.count()) + " s");
  }
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::unique_ptr<State> state) : state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() {
  if (state_ == nullptr) return;
  state_->activation.enter_noexcept();
  state_->close(timeout());
  state_.reset();  // the stream and the buffers, on their device; then the caller's device again
}

NcclCommunicator::Call NcclCommunicator::start(std::string_view operation) const {
  if (!state_->broken.empty()) {
    throw CommunicatorError(where(operation) +
                            ": the communicator is unusable after an earlier failure (" +
                            state_->broken + ")");
  }
  return Call{where(operation), std::string(operation), detail::deadline_after(timeout()),
              timeout()};
}

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return state_->size; }
Device NcclCommunicator::row_device() const { return Device::cuda(state_->device); }

// ---- creation ------------------------------------------------------------------

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& bootstrap,
                                                           Seconds timeout) {
  check_timeout(timeout);
  const int rank = bootstrap.rank();
  const int size = bootstrap.size();
  const std::string where = detail::where_creating(rank, size, "create");

  // One GPU per rank of a host: the node-local rank picks it.
  const NodeLocal local = bootstrap.node_local();
  const int devices = cuda_device_count();
  std::string problem;
  if (devices == 0) {
    problem = "no CUDA device: this process sees 0 CUDA devices";
  } else if (local.size > devices) {
    problem = "local rank " + std::to_string(local.rank) + " of " + std::to_string(local.size) +
              " ranks on this host, but the host has " + std::to_string(devices) +
              " CUDA device(s): start one process per GPU";
  }
  // Every rank learns whether some rank cannot pick a GPU, so that none waits
  // for NCCL in vain.
  std::array<double, 1> any_problem{problem.empty() ? 0.0 : 1.0};
  bootstrap.all_reduce(any_problem, ReduceOp::max);
  if (!problem.empty()) throw std::runtime_error(where + ": " + problem);
  if (any_problem[0] != 0.0) {
    throw std::runtime_error(where + ": another rank cannot pick a GPU (see its error)");
  }
  const int device = local.rank;

  // Rank 0 makes the clique's id and sends it with its status, so that a
  // failure there stops every rank at once.
  ncclUniqueId id{};
  std::int32_t status = ncclSuccess;
  std::array<std::byte, sizeof(ncclUniqueId) + sizeof(std::int32_t)> packet{};
  if (rank == 0) {
    status = ncclGetUniqueId(&id);
    std::memcpy(packet.data(), &id, sizeof(id));
    std::memcpy(packet.data() + sizeof(id), &status, sizeof(status));
  }
  bootstrap.broadcast_bytes(packet, 0);
  std::memcpy(&id, packet.data(), sizeof(id));
  std::memcpy(&status, packet.data() + sizeof(id), sizeof(status));
  if (status != ncclSuccess) {
    throw CommunicatorError(where + ": ncclGetUniqueId failed on rank 0: " +
                            ncclGetErrorString(static_cast<ncclResult_t>(status)));
  }

  std::unique_ptr<NcclCommunicator> made(
      new NcclCommunicator(State::open(device, rank, size, id, timeout)));
  made->set_timeout(timeout);
  return made;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_single(int device, Seconds timeout) {
  check_timeout(timeout);
  if (device < 0) {
    throw std::invalid_argument("device: " + std::to_string(device) +
                                " is not a CUDA device index (must be >= 0)");
  }
  const int devices = cuda_device_count();
  if (devices == 0) {
    throw std::runtime_error(detail::where_creating(0, 1, "create_single") +
                             ": no CUDA device: this process sees 0 CUDA devices");
  }
  if (device >= devices) {
    throw std::invalid_argument("device: cuda:" + std::to_string(device) +
                                " does not exist (this process sees " + std::to_string(devices) +
                                " CUDA device(s))");
  }
  ncclUniqueId id{};
  const ncclResult_t made_id = ncclGetUniqueId(&id);
  if (made_id != ncclSuccess) {
    throw CommunicatorError(detail::where_creating(0, 1, "create_single") +
                            ": ncclGetUniqueId: " + detail::nccl_message(made_id, nullptr));
  }
  std::unique_ptr<NcclCommunicator> made(
      new NcclCommunicator(State::open(device, 0, 1, id, timeout)));
  made->set_timeout(timeout);
  return made;
}
// ---- structure -------------------------------------------------------------------

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  if (color < 0) {
    throw std::invalid_argument("color: " + std::to_string(color) + " (must be >= 0)");
  }
  const Call call = start("split");
  State& s = *state_;
  std::unique_ptr<State> child;
  s.guarded(call, [&] {
    child = std::make_unique<State>(s.device, 0, 0);
    ncclConfig_t config = detail::nonblocking_config();
    s.check(call, ncclCommSplit(s.comm, color, key, &child->comm, &config), "ncclCommSplit");
    // The new communicator appears once the parent leaves ncclInProgress.
    s.await(call, false);
    if (child->comm == nullptr) s.fail(call, "ncclCommSplit made no communicator", false);
    if (auto failure = detail::poll(child->comm, nullptr, call.deadline, call.timeout)) {
      child->abort_nccl();
      s.fail(call, "the new communicator: " + failure->what, failure->timed_out);
    }
    s.check(call, ncclCommUserRank(child->comm, &child->rank), "ncclCommUserRank");
    s.check(call, ncclCommCount(child->comm, &child->size), "ncclCommCount");
  });
  std::unique_ptr<NcclCommunicator> made(new NcclCommunicator(std::move(child)));
  made->set_timeout(timeout());
  return made;
}

void NcclCommunicator::abort(std::string_view reason) {
  std::cerr << "optex: rank " << rank() << " aborts: " << reason << std::endl;
  State& s = *state_;
  s.activation.enter_noexcept();  // NCCL frees device resources on the communicator's GPU
  s.abort_nccl();
  s.activation.leave();
  if (s.broken.empty()) s.broken = "abort: " + std::string(reason);
}

}  // namespace optex
