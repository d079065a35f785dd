// Polling a non-blocking NCCL communicator (nccl_polling.hpp): its state and
// a stream, with a backoff between polls, until done, an error or the deadline.
#include "nccl_polling.hpp"

#include <algorithm>
#include <thread>

#include "distributed/seconds_text.hpp"

namespace optex::detail {

namespace {

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

}  // namespace

std::string nccl_message(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  return text;
}

Clock::time_point deadline_after(Communicator::Seconds timeout) {
  // Beyond a few decades the clock's representation would overflow.
  if (timeout.count() > 1e9) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
}

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

}  // namespace optex::detail
