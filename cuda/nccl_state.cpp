// The steps NcclCommunicator's operations share (nccl_state.hpp): opening,
// checking, awaiting and failing the NCCL communicator, closing it, scratch.
#include "nccl_state.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda_check.hpp"

namespace optex {

namespace detail {

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // no call waits for other ranks: this file bounds every wait
  return config;
}

std::string where_creating(int rank, int size, std::string_view operation) {
  return "optex nccl communicator, rank " + std::to_string(rank) + " of " + std::to_string(size) +
         ", " + std::string(operation);
}

}  // namespace detail

NcclCommunicator::State::~State() {
  activation.enter_noexcept();
  if (comm != nullptr) ncclCommAbort(comm);
}

std::unique_ptr<NcclCommunicator::State> NcclCommunicator::State::open(int device, int rank,
                                                                       int size,
                                                                       const ncclUniqueId& id,
                                                                       Seconds timeout) {
  cuda::DeviceGuard guard(device);  // NCCL binds a communicator to the current device
  auto state = std::make_unique<State>(device, rank, size);
  const Call call{detail::where_creating(rank, size, "create"), "create",
                  detail::deadline_after(timeout), timeout};
  ncclConfig_t config = detail::nonblocking_config();
  state->check(call, ncclCommInitRankConfig(&state->comm, size, id, rank, &config),
               "ncclCommInitRankConfig");
  state->await(call, false);
  return state;
}

void NcclCommunicator::State::check(const Call& call, ncclResult_t result, const char* nccl_call) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  fail(call, std::string(nccl_call) + ": " + detail::nccl_message(result, comm), false);
}

void NcclCommunicator::State::await(const Call& call, bool drain) {
  if (auto failure =
          detail::poll(comm, drain ? stream.get() : nullptr, call.deadline, call.timeout)) {
    fail(call, failure->what, failure->timed_out);
  }
}

void NcclCommunicator::State::fail(const Call& call, const std::string& what, bool timed_out) {
  abort_nccl();
  broken = call.operation + ": " + what;
  const std::string message = call.where + ": " + what;
  if (timed_out) throw CommunicatorTimeout(message);
  throw CommunicatorError(message);
}

void NcclCommunicator::State::abort_nccl() noexcept {
  if (comm == nullptr) return;
  ncclCommAbort(comm);
  comm = nullptr;
}

void NcclCommunicator::State::close(Seconds timeout) noexcept {
  if (comm == nullptr) return;
  try {
    const ncclResult_t started = ncclCommFinalize(comm);
    if (started == ncclSuccess || started == ncclInProgress) {
      if (!detail::poll(comm, nullptr, detail::deadline_after(timeout), timeout)) {
        ncclCommDestroy(comm);
        comm = nullptr;
        return;
      }
    }
  } catch (...) {  // a message string that could not be allocated: abort below
  }
  abort_nccl();
}

std::byte* NcclCommunicator::State::device_bytes(std::size_t bytes) {
  if (device_scratch.size() < bytes) {
    const std::size_t grown = std::max({bytes, 2 * device_scratch.size(), std::size_t{256}});
    device_scratch = cuda::DeviceBuffer<std::byte>();  // never hold both
    device_scratch = cuda::DeviceBuffer<std::byte>(grown);
    // Defined contents, so that barrier() sends no uninitialised bytes.
    OPTEX_CUDA_CHECK(
        cudaMemsetAsync(device_scratch.data(), 0, device_scratch.size(), stream.get()));
  }
  return device_scratch.data();
}

std::byte* NcclCommunicator::State::host_bytes(std::size_t bytes) {
  if (host_scratch.size() < bytes) {
    const std::size_t grown = std::max({bytes, 2 * host_scratch.size(), std::size_t{256}});
    host_scratch = cuda::PinnedBuffer<std::byte>();
    host_scratch = cuda::PinnedBuffer<std::byte>(grown);
  }
  return host_scratch.data();
}

void NcclCommunicator::State::gather(const Call& call, std::span<const std::byte> mine,
                                     std::span<std::byte> all) {
  const std::size_t n = mine.size();
  const std::size_t at = static_cast<std::size_t>(rank) * n;
  guarded(call, [&] {
    std::byte* on_gpu = device_bytes(all.size());
    std::byte* staged = host_bytes(all.size());
    std::memcpy(staged + at, mine.data(), n);
    OPTEX_CUDA_CHECK(
        cudaMemcpyAsync(on_gpu + at, staged + at, n, cudaMemcpyHostToDevice, stream.get()));
    // In place: the send buffer is this rank's slot of the receive buffer.
    check(call, ncclAllGather(on_gpu + at, on_gpu, n, ncclUint8, comm, stream.get()),
          "ncclAllGather");
    await(call, false);
    OPTEX_CUDA_CHECK(
        cudaMemcpyAsync(staged, on_gpu, all.size(), cudaMemcpyDeviceToHost, stream.get()));
    await(call, true);
    std::memcpy(all.data(), staged, all.size());
  });
}

void NcclCommunicator::State::agree_on_counts(const Call& call,
                                              std::span<const std::size_t> send_counts,
                                              std::span<const std::size_t> recv_counts) {
  const std::vector<std::uint64_t> row =
      Communicator::all_to_all_count_row(send_counts, recv_counts);
  std::vector<std::uint64_t> rows(row.size() * static_cast<std::size_t>(size));
  gather(call, std::as_bytes(std::span(row)), std::as_writable_bytes(std::span(rows)));
  const std::string mismatch = Communicator::all_to_all_count_mismatch(size, rows);
  if (!mismatch.empty()) fail(call, mismatch, false);
}

}  // namespace optex
