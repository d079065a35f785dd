// The MPI communicator: non-blocking MPI collectives, polled with a sleep
// backoff until they complete or the timeout passes. This file: the session,
// the communicator's lifetime, its errors, split and abort.
#include "optex/distributed/mpi_communicator.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "distributed/mpi_error_text.hpp"

namespace optex {

namespace {

bool mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace

// ---- MpiSession ----------------------------------------------------------------

MpiSession::MpiSession(int* argc, char*** argv) {
  if (mpi_finalized()) {
    throw CommunicatorError("optex MpiSession: MPI was already finalised and cannot start again");
  }
  if (!mpi_initialized()) {
    // SERIALIZED costs nothing over FUNNELED in the common implementations and
    // lets the engine call from a thread other than main.
    const int code = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &thread_level_);
    if (code != MPI_SUCCESS) {
      throw CommunicatorError("optex MpiSession: MPI_Init_thread failed: " +
                              detail::mpi_error_text(code));
    }
    initialized_here_ = true;
  } else {
    MPI_Query_thread(&thread_level_);
  }
  if (thread_level_ < MPI_THREAD_FUNNELED) {
    if (initialized_here_) MPI_Finalize();
    throw CommunicatorError(
        "optex MpiSession: MPI provides thread level " + std::to_string(thread_level_) +
        ", optex needs at least MPI_THREAD_FUNNELED (" + std::to_string(MPI_THREAD_FUNNELED) + ")");
  }
}

MpiSession::~MpiSession() {
  if (initialized_here_ && !mpi_finalized()) MPI_Finalize();
}

// ---- MpiCommunicator: lifetime ------------------------------------------------

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  if (!mpi_initialized() || mpi_finalized()) {
    throw CommunicatorError(
        "optex mpi communicator: MPI is not initialised (create an optex::MpiSession first)");
  }
  if (comm == MPI_COMM_NULL) throw std::invalid_argument("comm: must not be MPI_COMM_NULL");
  const int code = MPI_Comm_dup(comm, &comm_);
  if (code != MPI_SUCCESS) {
    comm_ = MPI_COMM_NULL;
    throw CommunicatorError("optex mpi communicator: MPI_Comm_dup failed: " +
                            detail::mpi_error_text(code));
  }
  attach();
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, Adopt) : comm_(comm) { attach(); }

void MpiCommunicator::attach() {
  // Errors come back as codes (thrown as CommunicatorError) instead of
  // ending the process, so that the caller can report and abort.
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "setup", "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(comm_, &rank_), "setup", "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "setup", "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  // After a failure, requests on comm_ may still be pending: freeing could
  // block or fail. The documented reaction to a failure is abort() anyway.
  if (comm_ != MPI_COMM_NULL && failure_.empty() && !mpi_finalized()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::set_max_chunk_floats(std::size_t floats) {
  if (floats < 1 || floats > kDefaultMaxChunkFloats) {
    throw std::invalid_argument("floats: must be in [1, 2^30], got " + std::to_string(floats));
  }
  max_chunk_floats_ = floats;
}

// ---- MpiCommunicator: errors -----------------------------------------------

void MpiCommunicator::check_usable(std::string_view operation) const {
  if (!failure_.empty()) {
    throw CommunicatorError(where(operation) + ": unusable after an earlier failure (" + failure_ +
                            "); abort the run");
  }
}

void MpiCommunicator::check(int code, std::string_view operation, std::string_view call) {
  if (code == MPI_SUCCESS) return;
  fail(operation, std::string(call) + " failed: " + detail::mpi_error_text(code));
}

void MpiCommunicator::fail(std::string_view operation, const std::string& what) {
  failure_ = std::string(operation) + ": " + what;
  throw CommunicatorError(where(operation) + ": " + what);
}

// ---- MpiCommunicator: structure --------------------------------------------

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  constexpr std::string_view kOperation = "split";
  check_usable(kOperation);
  if (color < 0) {
    throw std::invalid_argument(where(kOperation) + ": color: must be >= 0, got " +
                                std::to_string(color));
  }
  MPI_Comm part = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &part), kOperation, "MPI_Comm_split");
  std::unique_ptr<MpiCommunicator> sub(new MpiCommunicator(part, Adopt{}));
  sub->set_timeout(timeout());
  sub->max_chunk_floats_ = max_chunk_floats_;
  return sub;
}

void MpiCommunicator::abort(std::string_view reason) {
  std::fprintf(stderr, "optex: rank %d aborts: %.*s\n", rank_, static_cast<int>(reason.size()),
               reason.data());
  std::fflush(stderr);
  MPI_Abort(comm_ != MPI_COMM_NULL ? comm_ : MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; if it did, the run must still end
}

}  // namespace optex
