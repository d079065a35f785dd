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
#include "optex/distributed/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_context.hpp"
#include "device_buffer.hpp"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "optex::nccl needs NCCL 2.18 or later (non-blocking ncclCommSplit and ncclCommFinalize)"
#endif

namespace optex {

namespace {

using Clock = std::chrono::steady_clock;

// NCCL's words for `result`, with the text of its last error when it has one.
std::string nccl_message(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  return text;
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // no call waits for other ranks: this file bounds every wait
  return config;
}

// Communicator::set_timeout's check, for the factories, which have no
// communicator yet.
void check_timeout(Communicator::Seconds timeout) {
  if (!(std::isfinite(timeout.count()) && timeout.count() > 0.0)) {
    throw std::invalid_argument("timeout: must be positive and finite, got " +
                                std::to_string(timeout.count()) + " s");
  }
}

Clock::time_point deadline_after(Communicator::Seconds timeout) {
  // Beyond a few decades the clock's representation would overflow.
  if (timeout.count() > 1e9) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
}

std::string seconds_text(Communicator::Seconds timeout) {
  std::ostringstream text;
  text << timeout.count() << " s";
  return text.str();
}

// The context of messages before a communicator exists (Communicator::where's wording).
std::string where_creating(int rank, int size, std::string_view operation) {
  return "optex nccl communicator, rank " + std::to_string(rank) + " of " + std::to_string(size) +
         ", " + std::string(operation);
}

// Between two polls: a few yields first (a small collective on one node ends
// within microseconds), then sleeps that double up to a millisecond, so a long
// wait for a slow rank costs no CPU.
class Backoff {
 public:
  void pause() {
    if (polls_++ < kYields) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, kLongestSleep);
  }

 private:
  static constexpr int kYields = 100;
  static constexpr std::chrono::microseconds kLongestSleep{1000};
  int polls_ = 0;
  std::chrono::microseconds sleep_{10};
};

// Why a wait ended early; nothing when the work is done.
struct Failure {
  std::string what;
  bool timed_out = false;
};

// Polls `comm` until it leaves ncclInProgress and, given a stream, until the
// stream is idle too; or until an error or the deadline.
std::optional<Failure> poll(ncclComm_t comm, cudaStream_t stream, Clock::time_point deadline,
                            Communicator::Seconds timeout) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
    if (queried != ncclSuccess) {
      return Failure{"ncclCommGetAsyncError: " + nccl_message(queried, comm)};
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      return Failure{nccl_message(state, comm)};
    }
    if (state == ncclSuccess) {
      if (stream == nullptr) return std::nullopt;
      const cudaError_t done = cudaStreamQuery(stream);
      if (done == cudaSuccess) return std::nullopt;
      if (done != cudaErrorNotReady) {
        return Failure{std::string("cuda: ") + cudaGetErrorString(done) + " (cudaStreamQuery)"};
      }
    }
    if (Clock::now() >= deadline) {
      return Failure{"did not complete within the timeout of " + seconds_text(timeout) +
                         " (a rank did not take part in time?)",
                     true};
    }
    backoff.pause();
  }
}

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

// One step of all_reduce's rank-order fold, worded as the in-process backend
// words it, so that every backend gives the same bits (NaN included).
double combine(double so_far, double next, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return so_far + next;
    case ReduceOp::min:
      return next < so_far ? next : so_far;
    case ReduceOp::max:
      return next > so_far ? next : so_far;
  }
  return so_far;
}

}  // namespace

// One collective in progress: how messages name it, and when it gives up.
struct NcclCommunicator::Call {
  std::string where;      // "optex nccl communicator, rank r of n, operation"
  std::string operation;  // "barrier"
  Clock::time_point deadline;
  Seconds timeout;
};

struct NcclCommunicator::State {
  State(int device_index, int rank_index, int ranks)
      : activation(device_index), device(device_index), rank(rank_index), size(ranks) {
    activation.leave();  // the stream exists: the caller's device again
  }
  // A communicator that was not closed (a failed creation or split) is aborted.
  ~State() {
    activation.enter_noexcept();
    if (comm != nullptr) ncclCommAbort(comm);
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Rank `rank` of `size` of the NCCL clique `id` on GPU `device`, its
  // non-blocking initialisation awaited within `timeout`.
  static std::unique_ptr<State> open(int device, int rank, int size, const ncclUniqueId& id,
                                     Seconds timeout) {
    cuda::DeviceGuard guard(device);  // NCCL binds a communicator to the current device
    auto state = std::make_unique<State>(device, rank, size);
    const Call call{where_creating(rank, size, "create"), "create", deadline_after(timeout),
                    timeout};
    ncclConfig_t config = nonblocking_config();
    state->check(call, ncclCommInitRankConfig(&state->comm, size, id, rank, &config),
                 "ncclCommInitRankConfig");
    state->await(call, false);
    return state;
  }

  // Accepts ncclSuccess and ncclInProgress (the caller then awaits);
  // anything else fails the call.
  void check(const Call& call, ncclResult_t result, const char* nccl_call) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    fail(call, std::string(nccl_call) + ": " + nccl_message(result, comm), false);
  }

  // Until NCCL has enqueued the work (drain = false) or until it has also
  // completed on the stream (drain = true).
  void await(const Call& call, bool drain) {
    if (auto failure = poll(comm, drain ? stream.get() : nullptr, call.deadline, call.timeout)) {
      fail(call, failure->what, failure->timed_out);
    }
  }

  // Aborts the NCCL communicator, remembers why, and throws for `call`.
  [[noreturn]] void fail(const Call& call, const std::string& what, bool timed_out) {
    abort_nccl();
    broken = call.operation + ": " + what;
    const std::string message = call.where + ": " + what;
    if (timed_out) throw CommunicatorTimeout(message);
    throw CommunicatorError(message);
  }

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
        error = std::string(name) + ": " + nccl_message(queued, comm);
      }
    });
    const ncclResult_t ended = ncclGroupEnd();
    if (!error.empty()) fail(call, error, false);
    check(call, ended, "ncclGroupEnd");
    await(call, true);
  }

  void abort_nccl() noexcept {
    if (comm == nullptr) return;
    ncclCommAbort(comm);
    comm = nullptr;
  }

  // Finalize, then destroy: bounded by `timeout`; abort instead past it or on an error.
  void close(Seconds timeout) noexcept {
    if (comm == nullptr) return;
    try {
      const ncclResult_t started = ncclCommFinalize(comm);
      if (started == ncclSuccess || started == ncclInProgress) {
        if (!poll(comm, nullptr, deadline_after(timeout), timeout)) {
          ncclCommDestroy(comm);
          comm = nullptr;
          return;
        }
      }
    } catch (...) {  // a message string that could not be allocated: abort below
    }
    abort_nccl();
  }

  // Scratch space for the host operations, grown as needed and kept.
  std::byte* device_bytes(std::size_t bytes) {
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
  // Page-locked, so that copies back to it are truly asynchronous: a copy to
  // pageable memory would block this thread until the collective ends,
  // however long a late rank takes.
  std::byte* host_bytes(std::size_t bytes) {
    if (host_scratch.size() < bytes) {
      const std::size_t grown = std::max({bytes, 2 * host_scratch.size(), std::size_t{256}});
      host_scratch = cuda::PinnedBuffer<std::byte>();
      host_scratch = cuda::PinnedBuffer<std::byte>(grown);
    }
    return host_scratch.data();
  }

  // all := every rank's `mine` in rank order, through the scratch buffers.
  void gather(const Call& call, std::span<const std::byte> mine, std::span<std::byte> all) {
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

  // all_to_all_floats' check: every rank's counts, through the host path. A
  // mismatch fails every rank alike (and aborts).
  void agree_on_counts(const Call& call, std::span<const std::size_t> send_counts,
                       std::span<const std::size_t> recv_counts) {
    const std::vector<std::uint64_t> row =
        Communicator::all_to_all_count_row(send_counts, recv_counts);
    std::vector<std::uint64_t> rows(row.size() * static_cast<std::size_t>(size));
    gather(call, std::as_bytes(std::span(row)), std::as_writable_bytes(std::span(rows)));
    const std::string mismatch = Communicator::all_to_all_count_mismatch(size, rows);
    if (!mismatch.empty()) fail(call, mismatch, false);
  }

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
  return Call{where(operation), std::string(operation), deadline_after(timeout()), timeout()};
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
  const std::string where = where_creating(rank, size, "create");

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
    throw std::runtime_error(where_creating(0, 1, "create_single") +
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
    throw CommunicatorError(where_creating(0, 1, "create_single") +
                            ": ncclGetUniqueId: " + nccl_message(made_id, nullptr));
  }
  std::unique_ptr<NcclCommunicator> made(
      new NcclCommunicator(State::open(device, 0, 1, id, timeout)));
  made->set_timeout(timeout);
  return made;
}

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
  for (std::size_t i = 0; i < n; ++i) {
    double acc = all[i];
    for (std::size_t r = 1; r < static_cast<std::size_t>(size()); ++r) {
      acc = combine(acc, all[r * n + i], op);
    }
    values[i] = acc;
  }
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
    ncclConfig_t config = nonblocking_config();
    s.check(call, ncclCommSplit(s.comm, color, key, &child->comm, &config), "ncclCommSplit");
    // The new communicator appears once the parent leaves ncclInProgress.
    s.await(call, false);
    if (child->comm == nullptr) s.fail(call, "ncclCommSplit made no communicator", false);
    if (auto failure = poll(child->comm, nullptr, call.deadline, call.timeout)) {
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
