// The MPI communicator (target optex::mpi): one process per rank, host buffers,
// launched with mpirun.
//
//   int main(int argc, char** argv) {
//     optex::MpiSession mpi(&argc, &argv);
//     optex::MpiCommunicator comm;  // over MPI_COMM_WORLD
//     ...
//   }
//
// Every collective is non-blocking underneath and polled with a short sleep
// until it completes or timeout() passes, so a rank that died or stopped
// calling makes the others throw CommunicatorTimeout instead of hanging (and
// the waiting ranks leave the cores to the working ones). Small collectives
// (up to 64 KiB in a world of up to 64 ranks: the engine's status exchange,
// sums, hashes, barriers) are point-to-point messages, so the timeout names
// the ranks that have not arrived and a rank that contributes another size
// is named; larger ones are MPI collectives, preceded by such an arrival
// round in a world of up to 64 ranks. Every MPI error comes back as a
// CommunicatorError naming the operation, never as MPI's fatal abort: the
// requests are polled with MPI_Request_get_status, since Open MPI reports a
// failed non-blocking collective to MPI_COMM_WORLD's error handler (fatal by
// default) from MPI_Test. Called from one thread at a time; with
// MPI_THREAD_FUNNELED (see MpiSession) from the thread that initialised MPI.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "optex/distributed/communicator.hpp"

namespace optex {

// MPI for the lifetime of the object: MPI_Init_thread unless MPI is already
// initialised (by the caller or another library), MPI_Finalize in the
// destructor only if this object initialised it.
class MpiSession {
 public:
  // argc/argv as MPI_Init_thread takes them; may be null. Asks for
  // MPI_THREAD_SERIALIZED (any one thread at a time) and throws
  // CommunicatorError if MPI provides less than MPI_THREAD_FUNNELED, or if
  // MPI was already finalised.
  explicit MpiSession(int* argc = nullptr, char*** argv = nullptr);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // True when this object called MPI_Init_thread (and will finalise).
  bool initialized_here() const { return initialized_here_; }
  // The thread level MPI provides (MPI_THREAD_FUNNELED or better).
  int thread_level() const { return thread_level_; }

 private:
  bool initialized_here_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
};

class MpiCommunicator final : public Communicator {
 public:
  // The largest count a single MPI call takes (MPI 3.1 counts are int).
  static constexpr std::size_t kDefaultMaxChunkFloats = std::size_t{1} << 30;

  // Works on a duplicate of `comm` (MPI_Comm_dup, blocking and collective
  // over `comm`), so optex's messages never match the caller's. MPI must be
  // initialised (MpiSession). Errors on the duplicate are returned, not
  // fatal, and thrown as CommunicatorError.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);
  // Frees the duplicate, unless MPI is already finalised or a collective of
  // this communicator failed (its requests may still be pending).
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  // The duplicate optex talks on.
  MPI_Comm comm() const { return comm_; }

  void all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) override;
  // sum: gathers every rank's values and adds them in rank order on every
  // rank, so that every rank has the same bits (MPI does not promise that).
  void all_reduce(std::span<double> values, ReduceOp op) override;
  void broadcast_bytes(std::span<std::byte> data, int root) override;
  void barrier() override;
  // Counts above INT_MAX are moved in rounds: each round fills a window of at
  // most max_chunk_floats() floats of `all`.
  void all_gather_floats(const float* mine, float* all,
                         std::span<const std::size_t> counts) override;
  // First every rank's counts (a gather of 16 * size() bytes from each rank),
  // so that a mismatch is a CommunicatorError on every rank before any float
  // moves; then a message per peer and piece of at most max_chunk_floats()
  // floats (and INT_MAX bytes), so counts above INT_MAX move too.
  void all_to_all_floats(const float* send, std::span<const std::size_t> send_counts,
                         std::span<const std::size_t> send_offsets, float* recv,
                         std::span<const std::size_t> recv_counts,
                         std::span<const std::size_t> recv_offsets) override;
  // MPI_Comm_split: blocking (MPI 3.1 has no non-blocking split), so its
  // wait is not bounded by timeout(). color must be >= 0.
  std::unique_ptr<Communicator> split(int color, int key) override;
  // Prints "optex: rank r aborts: reason" to stderr and calls MPI_Abort:
  // mpirun ends every rank. Does not return.
  [[noreturn]] void abort(std::string_view reason) override;

  // The window of one round of all_gather_floats (and all_gather_bytes), in
  // elements, and the largest message of all_to_all_floats; default 2^30.
  // For tests: a small value exercises the rounds and pieces without
  // gigabytes of data. Throws std::invalid_argument outside
  // [1, 2^30]. Must be the same on every rank; split() passes it on.
  void set_max_chunk_floats(std::size_t floats);
  std::size_t max_chunk_floats() const { return max_chunk_floats_; }

 private:
  struct Adopt {};
  // Takes ownership of `comm` (the result of a split) without duplicating it.
  MpiCommunicator(MPI_Comm comm, Adopt);
  void attach();

  // Throws CommunicatorError if an earlier collective failed.
  void check_usable(std::string_view operation) const;
  // Turns an MPI return code into a CommunicatorError (and marks failure).
  void check(int code, std::string_view operation, std::string_view call);
  [[noreturn]] void fail(std::string_view operation, const std::string& what);

  // A request and what it waits for: a message from or to `peer`, or a
  // collective (peer -1, no rank to name).
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    int peer = -1;
    bool receive = false;
    std::size_t bytes = 0;  // a receive: the size every rank agreed on
  };
  // How to poll: sleeping while other ranks may still be computing, yielding
  // while data moves (Open MPI progresses a transfer only inside MPI calls).
  enum class Polling { arrival, transfer };
  // Polls every request until all complete; CommunicatorTimeout after
  // timeout(), naming the ranks whose messages are still outstanding. A
  // receive of another size than agreed is a CommunicatorError naming the
  // sender (the ranks called different operations or passed different sizes).
  void wait_all(std::vector<Pending>& pending, std::string_view operation,
                Polling polling = Polling::arrival);
  void wait(MPI_Request& request, std::string_view operation, Polling polling = Polling::arrival);
  // What went wrong with a completed request, and with whose message.
  struct Problem {
    int peer = -1;
    std::string what;  // empty: nothing
  };
  // True once `p` completed; a failure or a receive of another size than
  // agreed is described in `problem` (the lowest rank's is kept).
  bool completed(Pending& p, std::string_view operation, Problem& problem);

  // Collectives of at most this many bytes, in a world of at most
  // kNamedRanksLimit ranks, are point-to-point messages (each rank sends its
  // part to every other): a timeout then knows which ranks have not arrived.
  static constexpr std::size_t kLargeTransferBytes = std::size_t{64} << 10;
  static constexpr int kNamedRanksLimit = 64;
  bool point_to_point(std::size_t total_bytes) const {
    return size_ <= kNamedRanksLimit && total_bytes <= kLargeTransferBytes;
  }
  // Rank r's bytes[r] land in `all` at offset bytes[0] + ... + bytes[r-1].
  // `tag` keeps the messages apart from those of other kinds of operation.
  void gather_point_to_point(const std::byte* mine, std::byte* all,
                             std::span<const std::size_t> bytes, std::string_view operation,
                             int tag);
  // all_gather_bytes without its checks: point to point when small, else in windows.
  void gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all,
                    std::string_view operation, int tag);
  // Returns once every rank has called it (a point-to-point round of empty
  // messages, or MPI_Ibarrier in a larger world).
  void wait_for_every_rank(std::string_view operation);
  // All-gather of element counts that may exceed INT_MAX, in windows.
  void gather_in_windows(const std::byte* mine, std::byte* all, std::span<const std::size_t> counts,
                         MPI_Datatype type, std::size_t element_bytes, std::string_view operation);
  // all_to_all_floats once the counts agree: the blocks of the other ranks as
  // messages, the own block by memcpy.
  void exchange_blocks(const float* send, std::span<const std::size_t> send_counts,
                       std::span<const std::size_t> send_offsets, float* recv,
                       std::span<const std::size_t> recv_counts,
                       std::span<const std::size_t> recv_offsets, std::string_view operation);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::size_t max_chunk_floats_ = kDefaultMaxChunkFloats;
  // all_to_all_floats' counts: this rank's row, then every rank's. A member,
  // so that the messages of a rank that arrives after a timeout land in
  // memory the communicator still owns.
  std::vector<std::uint64_t> count_rows_;
  // Why the communicator is unusable; empty while it works.
  std::string failure_;
};

}  // namespace optex
