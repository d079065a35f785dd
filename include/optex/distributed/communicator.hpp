// Communication between the ranks of a distributed OptEx run.
//
// With replicated state every rank computes the same proxy trajectory, so only
// the N true gradients and losses travel, plus a few scalars; with sharded
// state the slices of points and gradients travel all-to-all and the GP's
// sums as a few doubles (DESIGN.md section 3). This is the whole interface a
// backend implements:
//
//   in-process  InProcessWorld: W ranks as W threads of one process (tests,
//               a single machine without MPI).
//   MPI         MpiCommunicator (optex::mpi target): one process per rank,
//               host buffers, launched with mpirun.
//   NCCL        NcclCommunicator (optex::nccl target): one process per GPU,
//               gradient rows in device memory.
//
// Every operation is collective: each rank of the communicator calls it, in
// the same order, with matching sizes. Every wait is bounded by timeout():
// a rank that does not arrive in time makes the others throw
// CommunicatorTimeout instead of hanging. After any CommunicatorError the
// communicator is unusable; the documented reaction is abort(), which ends
// the run on every rank.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "optex/backend/device.hpp"

namespace optex {

// A collective failed, or another rank aborted. The message names the
// backend, the operation and the rank that reports it.
class CommunicatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective did not complete within Communicator::timeout().
class CommunicatorTimeout : public CommunicatorError {
 public:
  using CommunicatorError::CommunicatorError;
};

enum class ReduceOp { sum, min, max };

class Communicator {
 public:
  using Seconds = std::chrono::duration<double>;
  // Long enough for slow gradient evaluations (the wait after evaluating
  // includes the slowest rank's evaluation), short enough not to hang a job.
  static constexpr Seconds kDefaultTimeout{600.0};

  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "in-process", "mpi" or "nccl".
  virtual std::string_view backend() const = 0;

  // ---- host memory, every backend ----------------------------------------
  // Each rank contributes mine.size() bytes (the same on every rank); `all`
  // (size() * mine.size() bytes) receives them in rank order.
  virtual void all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
  // In place, element by element. Every rank receives the same bits.
  virtual void all_reduce(std::span<double> values, ReduceOp op) = 0;
  // Root's bytes to every rank.
  virtual void broadcast_bytes(std::span<std::byte> data, int root) = 0;
  virtual void barrier() = 0;

  // ---- gradient rows ------------------------------------------------------
  // Where all_gather_floats and all_to_all_floats read and write: host
  // memory for Device::cpu(), that GPU's memory for Device::cuda(k).
  virtual Device row_device() const { return Device::cpu(); }
  // Rank r contributes counts[r] floats from its `mine`; they land in `all`
  // at offset counts[0] + ... + counts[r-1] on every rank. `mine` may point
  // into `all` at the rank's own offset (in place). counts has size() entries,
  // the same on every rank; a count may be zero and may exceed INT_MAX.
  virtual void all_gather_floats(const float* mine, float* all,
                                 std::span<const std::size_t> counts) = 0;
  // Rank r sends send_counts[s] floats, read from send + send_offsets[s], to
  // every rank s, and receives recv_counts[s] floats from rank s into
  // recv + recv_offsets[s]. recv_counts[s] on rank r must equal
  // send_counts[r] on rank s. All four spans have size() entries; counts may
  // be zero and may exceed INT_MAX. Send regions may overlap (the same floats
  // to several ranks); receive regions must not overlap each other or a send
  // region. Buffers live in row_device() memory. A rank sends to itself too
  // (a copy).
  virtual void all_to_all_floats(const float* send, std::span<const std::size_t> send_counts,
                                 std::span<const std::size_t> send_offsets, float* recv,
                                 std::span<const std::size_t> recv_counts,
                                 std::span<const std::size_t> recv_offsets) = 0;

  // For backends, all_to_all_floats' agreement on the counts, worded the same
  // everywhere. One rank's row: its send_counts, then its recv_counts
  // (2 * size() entries). Given the rows of all `size` ranks in rank order,
  // the mismatch says which ranks disagree on what ("" when every rank
  // expects what its peers send it).
  static std::vector<std::uint64_t> all_to_all_count_row(std::span<const std::size_t> send_counts,
                                                         std::span<const std::size_t> recv_counts);
  static std::string all_to_all_count_mismatch(int size, std::span<const std::uint64_t> rows);

  // ---- structure ----------------------------------------------------------
  // Collective: ranks with the same color form a new communicator, ordered by
  // key (then by rank). The new communicator inherits the timeout.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Ends the run on every rank: MPI_Abort, ncclCommAbort, or, in process,
  // every other rank's pending and later operations throw CommunicatorError
  // carrying `reason`. Not collective: one rank calls it.
  virtual void abort(std::string_view reason) = 0;

  Seconds timeout() const { return timeout_; }
  // Throws std::invalid_argument for a timeout that is not positive and finite.
  void set_timeout(Seconds timeout);

  // Typed conveniences over the byte operations.
  template <class T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    static_assert(std::is_trivially_copyable_v<T>);
    all_gather_bytes(std::as_bytes(mine), std::as_writable_bytes(all));
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    static_assert(std::is_trivially_copyable_v<T>);
    broadcast_bytes(std::as_writable_bytes(data), root);
  }

  // Every rank's text, in rank order; the texts may differ in length.
  // Collective: an all-gather of the lengths, then of the padded texts.
  std::vector<std::string> all_gather_text(std::string_view mine);

  // This rank's index among the ranks on the same host (by gethostname),
  // and how many ranks share the host. Collective. Used to pick one GPU per
  // process before a NCCL communicator exists.
  struct NodeLocal {
    int rank = 0;
    int size = 1;
  };
  NodeLocal node_local();

 protected:
  // For backends: the messages every backend words the same way.
  std::string where(std::string_view operation) const;

  // For backends, all_to_all_floats' local check, worded the same everywhere:
  // what is wrong with this rank's arguments (spans of another length than
  // size(), a null buffer with floats to move, a region past the end of the
  // address space, a receive region that overlaps another or a send region),
  // or "" when nothing is.
  std::string all_to_all_argument_problem(const float* send,
                                          std::span<const std::size_t> send_counts,
                                          std::span<const std::size_t> send_offsets,
                                          const float* recv,
                                          std::span<const std::size_t> recv_counts,
                                          std::span<const std::size_t> recv_offsets) const;

 private:
  Seconds timeout_ = kDefaultTimeout;
};

}  // namespace optex
