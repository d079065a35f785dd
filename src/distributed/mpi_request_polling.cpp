// The MPI communicator's waiting: its requests polled with a sleep backoff
// until they complete or the timeout passes, naming the ranks not arrived.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "distributed/mpi_error_text.hpp"
#include "distributed/seconds_text.hpp"
#include "optex/distributed/mpi_communicator.hpp"

namespace optex {

bool MpiCommunicator::completed(Pending& p, std::string_view operation, Problem& problem) {
  if (p.request == MPI_REQUEST_NULL) return true;
  // Not MPI_Test: Open MPI reports the error of a non-blocking collective
  // from MPI_Test to MPI_COMM_WORLD's handler (fatal by default), not to
  // comm_'s. MPI_Request_get_status hands the error back in the status.
  int done = 0;
  MPI_Status status{};
  status.MPI_ERROR = MPI_SUCCESS;
  check(MPI_Request_get_status(p.request, &done, &status), operation, "MPI_Request_get_status");
  if (!done) return false;
  const std::string from = p.peer >= 0 ? " from rank " + std::to_string(p.peer) : "";
  std::string what;
  if (status.MPI_ERROR != MPI_SUCCESS) {
    int error_class = MPI_SUCCESS;
    MPI_Error_class(status.MPI_ERROR, &error_class);
    if (error_class == MPI_ERR_TRUNCATE) {
      what = "a message" + from + " was longer than this rank's " +
             (p.receive ? std::to_string(p.bytes) + " bytes" : "buffer") + " (" +
             detail::mpi_error_text(status.MPI_ERROR) +
             "): the ranks called different operations or passed different sizes";
    } else {
      what = "a request" + from + " failed: " + detail::mpi_error_text(status.MPI_ERROR);
    }
  } else if (p.receive) {
    int received = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &received), operation, "MPI_Get_count");
    if (static_cast<std::size_t>(received) != p.bytes) {
      what = "rank " + std::to_string(p.peer) + " contributed " + std::to_string(received) +
             " bytes, this rank expects " + std::to_string(p.bytes) +
             ": the ranks called different operations or passed different sizes";
    }
  }
  // The lowest rank's problem, whatever the order of completion.
  if (!what.empty() && (problem.what.empty() || p.peer < problem.peer)) problem = {p.peer, what};
  check(MPI_Request_free(&p.request), operation, "MPI_Request_free");
  p.request = MPI_REQUEST_NULL;
  return true;
}

void MpiCommunicator::wait_all(std::vector<Pending>& pending, std::string_view operation,
                               Polling polling) {
  using Clock = std::chrono::steady_clock;
  // Clamped so that a huge (but finite) timeout cannot overflow the clock.
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::min(timeout(), Seconds{1e9}));
  // Waiting for other ranks: short sleeps first (small collectives finish in
  // microseconds), then 1 ms, since with more ranks than cores a spinning rank
  // would starve the others. Moving data: Open MPI progresses a transfer only
  // inside MPI calls, one fragment per call, so a sleep between calls would
  // throttle it to a fragment per millisecond; there it yields instead.
  auto pause = std::chrono::microseconds(20);
  constexpr auto kLongestPause = std::chrono::microseconds(1000);
  // A problem with one request is reported once the others are done too:
  // until then MPI may still write into the caller's buffers.
  Problem problem;
  for (;;) {
    bool all_done = true;
    for (Pending& p : pending) all_done = completed(p, operation, problem) && all_done;
    if (all_done && problem.what.empty()) return;
    if (all_done || (!problem.what.empty() && Clock::now() >= deadline)) {
      fail(operation, problem.what);
    }
    if (Clock::now() >= deadline) {
      // The ranks whose messages are outstanding have not arrived (or not
      // taken this rank's message); a collective does not say which rank it
      // waits for.
      std::vector<int> missing;
      bool unknown = false;
      for (const Pending& p : pending) {
        if (p.request == MPI_REQUEST_NULL) continue;
        if (p.peer < 0)
          unknown = true;
        else if (std::find(missing.begin(), missing.end(), p.peer) == missing.end())
          missing.push_back(p.peer);
      }
      std::sort(missing.begin(), missing.end());
      std::string who = "a rank has";
      if (!unknown && !missing.empty()) {
        who = missing.size() == 1 ? "rank " : "ranks ";
        for (std::size_t k = 0; k < missing.size(); ++k)
          who += (k > 0 ? ", " : "") + std::to_string(missing[k]);
        who += missing.size() == 1 ? " has" : " have";
      }
      const std::string what = "did not complete within " + detail::seconds_text(timeout()) + ": " +
                               who +
                               " not arrived (failed, stopped calling the engine, or slower "
                               "than the timeout: Communicator::set_timeout)";
      failure_ = std::string(operation) + " " + what;
      throw CommunicatorTimeout(where(operation) + ": " + what);
    }
    if (polling == Polling::transfer) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kLongestPause);
  }
}

void MpiCommunicator::wait(MPI_Request& request, std::string_view operation, Polling polling) {
  std::vector<Pending> pending{Pending{request, -1, false, 0}};
  request = MPI_REQUEST_NULL;
  wait_all(pending, operation, polling);
}

}  // namespace optex
