// Waiting on a non-blocking NCCL communicator (nccl_communicator.cpp's
// header explains why): poll its state, and a stream, to a deadline.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <optional>
#include <string>

#include "optex/distributed/communicator.hpp"

namespace optex::detail {

using Clock = std::chrono::steady_clock;

// NCCL's words for `result`, with the text of its last error when it has one.
std::string nccl_message(ncclResult_t result, ncclComm_t comm);

Clock::time_point deadline_after(Communicator::Seconds timeout);

// Why a wait ended early; nothing when the work is done.
struct Failure {
  std::string what;
  bool timed_out = false;
};

// Polls `comm` until it leaves ncclInProgress and, given a stream, until the
// stream is idle too; or until an error or the deadline.
std::optional<Failure> poll(ncclComm_t comm, cudaStream_t stream, Clock::time_point deadline,
                            Communicator::Seconds timeout);

}  // namespace optex::detail
