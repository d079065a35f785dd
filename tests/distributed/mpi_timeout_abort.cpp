// A failure stays bounded under mpirun (ctest mpi_timeout_abort_np2): rank 1
// never enters the barrier; rank 0 times out after 1 s, reports it and calls
// abort(), and mpirun ends rank 1. The test passes on rank 0's line; ctest's
// timeout fails it if the job hangs instead.
#include <chrono>
#include <cstdio>
#include <thread>

#include "optex/distributed/mpi_communicator.hpp"

int main(int argc, char** argv) {
  optex::MpiSession mpi(&argc, &argv);
  optex::MpiCommunicator comm;
  comm.set_timeout(optex::Communicator::Seconds{1.0});
  if (comm.rank() == 1) {
    // Stopped calling the engine: wait to be ended by rank 0's abort.
    std::this_thread::sleep_for(std::chrono::seconds(300));
    std::fprintf(stderr, "rank 1 was not ended by rank 0's abort\n");
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    comm.barrier();
  } catch (const optex::CommunicatorTimeout& e) {
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    std::printf("rank %d caught CommunicatorTimeout after %.2f s: %s\n", comm.rank(),
                waited.count(), e.what());
    std::fflush(stdout);
    comm.abort("a rank did not arrive (expected by this test)");
  }
  if (comm.rank() == 0) std::fprintf(stderr, "rank 0: the barrier did not time out\n");
  return 1;
}
