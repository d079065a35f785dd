// The MPI communicator's collectives: gathers point to point or in windows,
// all_reduce, broadcast, barrier and all_to_all, each polled to a timeout.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/rank_order_reduce.hpp"
#include "optex/distributed/mpi_communicator.hpp"

namespace optex {

namespace {

constexpr auto kIntMax = static_cast<std::size_t>(INT_MAX);

// One tag per kind of point-to-point exchange. Messages between two ranks
// with the same tag do not overtake each other. A rank in an operation of
// another kind never takes these messages: the ranks time out naming each
// other instead of exchanging data that happens to have the same size.
constexpr int kGatherTag = 17;  // gathers, and the arrival rounds before collectives
constexpr int kBroadcastTag = 18;
constexpr int kAllToAllCountsTag = 19;
constexpr int kAllToAllTag = 20;

// Where each rank's block starts in the gathered buffer: the exclusive prefix sums of `sizes`.
std::vector<std::size_t> block_offsets(std::span<const std::size_t> sizes) {
  std::vector<std::size_t> offsets(sizes.size());
  std::exclusive_scan(sizes.begin(), sizes.end(), offsets.begin(), std::size_t{0});
  return offsets;
}

}  // namespace

void MpiCommunicator::gather_point_to_point(const std::byte* mine, std::byte* all,
                                            std::span<const std::size_t> bytes,
                                            std::string_view operation, int tag) {
  // A rank in another operation with the same tag sends a message of another
  // size, which the receiver names.
  const auto ranks = static_cast<std::size_t>(size_);
  const auto me = static_cast<std::size_t>(rank_);
  const std::vector<std::size_t> offsets = block_offsets(bytes);
  std::byte none{};  // a valid address for empty messages
  const auto at = [&](std::size_t r) { return bytes[r] > 0 ? all + offsets[r] : &none; };
  std::vector<Pending> pending;
  pending.reserve(2 * ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    if (r == me) continue;
    Pending p{MPI_REQUEST_NULL, static_cast<int>(r), true, bytes[r]};
    check(MPI_Irecv(at(r), static_cast<int>(bytes[r]), MPI_BYTE, static_cast<int>(r), tag, comm_,
                    &p.request),
          operation, "MPI_Irecv");
    pending.push_back(p);
  }
  const std::byte* send = bytes[me] > 0 ? mine : &none;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (r == me) continue;
    Pending p{MPI_REQUEST_NULL, static_cast<int>(r), false, 0};
    check(MPI_Isend(send, static_cast<int>(bytes[me]), MPI_BYTE, static_cast<int>(r), tag, comm_,
                    &p.request),
          operation, "MPI_Isend");
    pending.push_back(p);
  }
  if (bytes[me] > 0 && mine != all + offsets[me]) std::memcpy(all + offsets[me], mine, bytes[me]);
  wait_all(pending, operation);
}

void MpiCommunicator::wait_for_every_rank(std::string_view operation) {
  if (size_ <= kNamedRanksLimit) {
    const std::vector<std::size_t> nothing(static_cast<std::size_t>(size_), 0);
    gather_point_to_point(nullptr, nullptr, nothing, operation, kGatherTag);
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm_, &request), operation, "MPI_Ibarrier");
  wait(request, operation, Polling::arrival);
}

// ---- MpiCommunicator: collectives ------------------------------------------

void MpiCommunicator::gather_in_windows(const std::byte* mine, std::byte* all,
                                        std::span<const std::size_t> counts, MPI_Datatype type,
                                        std::size_t element_bytes, std::string_view operation) {
  // MPI 3.1 counts and displacements are int. Each round fills one window of
  // `all` of at most max_chunk_floats_ elements: every rank sends the part of
  // its block that falls in the window, and the displacements are relative
  // to the window's start, so both stay below the window size. (Slicing each
  // rank's block instead would keep the counts small but not the
  // displacements: blocks lie further apart than INT_MAX elements.)
  const auto ranks = static_cast<std::size_t>(size_);
  const auto me = static_cast<std::size_t>(rank_);
  const std::vector<std::size_t> offsets = block_offsets(counts);
  const std::size_t total = offsets.back() + counts.back();
  const bool in_place = counts[me] == 0 || mine == all + offsets[me] * element_bytes;
  // First wait (sleeping) until every rank has arrived, which may take as
  // long as the slowest rank's gradient (and names the ranks that do not
  // arrive), then move the data; a large transfer without sleeping between
  // polls.
  const bool large = total * element_bytes > kLargeTransferBytes;
  wait_for_every_rank(operation);
  std::vector<int> window_counts(ranks);
  std::vector<int> window_displacements(ranks);
  for (std::size_t begin = 0; begin < total; begin += max_chunk_floats_) {
    const std::size_t end = std::min(begin + max_chunk_floats_, total);
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::size_t from = std::clamp(offsets[r], begin, end);
      const std::size_t to = std::clamp(offsets[r] + counts[r], begin, end);
      window_counts[r] = static_cast<int>(to - from);
      window_displacements[r] = static_cast<int>(from - begin);
    }
    const std::size_t my_first = std::clamp(offsets[me], begin, end) - offsets[me];
    const void* send = in_place ? MPI_IN_PLACE : mine + my_first * element_bytes;
    if (!in_place && window_counts[me] == 0) send = mine;
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgatherv(send, window_counts[me], type, all + begin * element_bytes,
                          window_counts.data(), window_displacements.data(), type, comm_, &request),
          operation, "MPI_Iallgatherv");
    wait(request, operation, large ? Polling::transfer : Polling::arrival);
  }
}

void MpiCommunicator::gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all,
                                   std::string_view operation, int tag) {
  const std::size_t n = mine.size();
  const std::vector<std::size_t> counts(static_cast<std::size_t>(size_), n);
  if (n <= max_chunk_floats_ && point_to_point(all.size())) {
    gather_point_to_point(mine.data(), all.data(), counts, operation, tag);
    return;
  }
  gather_in_windows(mine.data(), all.data(), counts, MPI_BYTE, 1, operation);
}

void MpiCommunicator::all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) {
  constexpr std::string_view kOperation = "all_gather_bytes";
  check_usable(kOperation);
  const std::size_t n = mine.size();
  const auto ranks = static_cast<std::size_t>(size_);
  if (all.size() != n * ranks) {
    throw std::invalid_argument(where(kOperation) + ": all.size() must be size() * mine.size() = " +
                                std::to_string(n * ranks) + ", got " + std::to_string(all.size()));
  }
  gather_bytes(mine, all, kOperation, kGatherTag);
}

void MpiCommunicator::all_reduce(std::span<double> values, ReduceOp op) {
  constexpr std::string_view kOperation = "all_reduce";
  check_usable(kOperation);
  const std::size_t n = values.size();
  if (n > kIntMax) {
    throw std::invalid_argument(
        where(kOperation) + ": values.size() must be at most INT_MAX, got " + std::to_string(n));
  }
  if (op != ReduceOp::sum && op != ReduceOp::min && op != ReduceOp::max) {
    throw std::invalid_argument(where(kOperation) + ": op: unknown ReduceOp " +
                                std::to_string(static_cast<int>(op)));
  }
  // MPI may add in a different order on different ranks (recursive
  // doubling, for one), and the engine needs the same bits everywhere:
  // every rank gathers all the values and reduces them in rank order. The
  // values are a few scalars, so the gather costs nothing worth noting.
  std::vector<double> everyone(n * static_cast<std::size_t>(size_));
  all_gather(std::span<const double>(values), std::span<double>(everyone));
  detail::reduce_in_rank_order(everyone, static_cast<std::size_t>(size_), values, op);
}

void MpiCommunicator::broadcast_bytes(std::span<std::byte> data, int root) {
  constexpr std::string_view kOperation = "broadcast_bytes";
  check_usable(kOperation);
  if (root < 0 || root >= size_) {
    throw std::invalid_argument(where(kOperation) + ": root: must be in [0, " +
                                std::to_string(size_) + "), got " + std::to_string(root));
  }
  if (point_to_point(data.size())) {
    // The root sends to every rank; the others wait for the root (named if
    // it does not arrive).
    std::byte none{};
    std::byte* buffer = data.empty() ? &none : data.data();
    const int count = static_cast<int>(data.size());
    std::vector<Pending> pending;
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        if (r == root) continue;
        Pending p{MPI_REQUEST_NULL, r, false, 0};
        check(MPI_Isend(buffer, count, MPI_BYTE, r, kBroadcastTag, comm_, &p.request), kOperation,
              "MPI_Isend");
        pending.push_back(p);
      }
    } else {
      Pending p{MPI_REQUEST_NULL, root, true, data.size()};
      check(MPI_Irecv(buffer, count, MPI_BYTE, root, kBroadcastTag, comm_, &p.request), kOperation,
            "MPI_Irecv");
      pending.push_back(p);
    }
    wait_all(pending, kOperation);
    return;
  }
  // Pieces of at most INT_MAX bytes.
  std::size_t begin = 0;
  do {
    const std::size_t piece = std::min(data.size() - begin, kIntMax);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibcast(data.data() + begin, static_cast<int>(piece), MPI_BYTE, root, comm_, &request),
          kOperation, "MPI_Ibcast");
    wait(request, kOperation, Polling::transfer);
    begin += piece;
  } while (begin < data.size());
}

void MpiCommunicator::barrier() {
  constexpr std::string_view kOperation = "barrier";
  check_usable(kOperation);
  wait_for_every_rank(kOperation);
}

void MpiCommunicator::all_gather_floats(const float* mine, float* all,
                                        std::span<const std::size_t> counts) {
  constexpr std::string_view kOperation = "all_gather_floats";
  check_usable(kOperation);
  if (counts.size() != static_cast<std::size_t>(size_)) {
    throw std::invalid_argument(where(kOperation) + ": counts.size() must be size() = " +
                                std::to_string(size_) + ", got " + std::to_string(counts.size()));
  }
  std::size_t total = 0;
  for (const std::size_t c : counts) total += c;
  const std::size_t own = counts[static_cast<std::size_t>(rank_)];
  if (mine == nullptr && own > 0) {
    throw std::invalid_argument(where(kOperation) + ": mine: null with counts[" +
                                std::to_string(rank_) + "] = " + std::to_string(own));
  }
  if (all == nullptr && total > 0) {
    throw std::invalid_argument(where(kOperation) + ": all: null with " + std::to_string(total) +
                                " floats to receive");
  }
  if (total <= max_chunk_floats_ && point_to_point(total * sizeof(float))) {
    std::vector<std::size_t> bytes(counts.begin(), counts.end());
    for (std::size_t& b : bytes) b *= sizeof(float);
    gather_point_to_point(reinterpret_cast<const std::byte*>(mine),
                          reinterpret_cast<std::byte*>(all), bytes, kOperation, kGatherTag);
    return;
  }
  gather_in_windows(reinterpret_cast<const std::byte*>(mine), reinterpret_cast<std::byte*>(all),
                    counts, MPI_FLOAT, sizeof(float), kOperation);
}

void MpiCommunicator::all_to_all_floats(const float* send, std::span<const std::size_t> send_counts,
                                        std::span<const std::size_t> send_offsets, float* recv,
                                        std::span<const std::size_t> recv_counts,
                                        std::span<const std::size_t> recv_offsets) {
  constexpr std::string_view kOperation = "all_to_all_floats";
  check_usable(kOperation);
  const std::string problem =
      all_to_all_argument_problem(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
  if (!problem.empty()) throw std::invalid_argument(where(kOperation) + ": " + problem);
  // Every rank's counts first, so that every rank finds the same mismatch
  // before any float moves (and a timeout names the ranks that did not
  // arrive). 16 * size() bytes from each rank.
  const std::vector<std::uint64_t> row = all_to_all_count_row(send_counts, recv_counts);
  const auto ranks = static_cast<std::size_t>(size_);
  count_rows_.resize(row.size() * (ranks + 1));
  const std::span<std::uint64_t> mine = std::span(count_rows_).first(row.size());
  const std::span<std::uint64_t> rows = std::span(count_rows_).subspan(row.size());
  std::copy(row.begin(), row.end(), mine.begin());
  gather_bytes(std::as_bytes(mine), std::as_writable_bytes(rows), kOperation, kAllToAllCountsTag);
  const std::string mismatch = all_to_all_count_mismatch(size_, rows);
  if (!mismatch.empty()) fail(kOperation, mismatch);
  exchange_blocks(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, kOperation);
}

void MpiCommunicator::exchange_blocks(const float* send, std::span<const std::size_t> send_counts,
                                      std::span<const std::size_t> send_offsets, float* recv,
                                      std::span<const std::size_t> recv_counts,
                                      std::span<const std::size_t> recv_offsets,
                                      std::string_view operation) {
  // Messages of at most max_chunk_floats_ floats and INT_MAX bytes (MPI
  // counts are int); a block's pieces arrive in order (same tag).
  const std::size_t chunk = std::min(max_chunk_floats_, kIntMax / sizeof(float));
  const auto in_pieces = [chunk](std::size_t count, const auto& post) {
    for (std::size_t first = 0; first < count; first += chunk) {
      post(first, static_cast<int>(std::min(chunk, count - first)));
    }
  };
  std::vector<Pending> pending;
  std::size_t floats = 0;
  for (int s = 0; s < size_; ++s) {
    if (s == rank_) continue;
    const auto peer = static_cast<std::size_t>(s);
    in_pieces(recv_counts[peer], [&](std::size_t first, int n) {
      Pending p{MPI_REQUEST_NULL, s, true, static_cast<std::size_t>(n) * sizeof(float)};
      check(MPI_Irecv(recv + recv_offsets[peer] + first, n, MPI_FLOAT, s, kAllToAllTag, comm_,
                      &p.request),
            operation, "MPI_Irecv");
      pending.push_back(p);
    });
    in_pieces(send_counts[peer], [&](std::size_t first, int n) {
      Pending p{MPI_REQUEST_NULL, s, false, 0};
      check(MPI_Isend(send + send_offsets[peer] + first, n, MPI_FLOAT, s, kAllToAllTag, comm_,
                      &p.request),
            operation, "MPI_Isend");
      pending.push_back(p);
    });
    floats += recv_counts[peer] + send_counts[peer];
  }
  const auto me = static_cast<std::size_t>(rank_);
  if (recv_counts[me] > 0) {
    std::memcpy(recv + recv_offsets[me], send + send_offsets[me], recv_counts[me] * sizeof(float));
  }
  const bool large = floats * sizeof(float) > kLargeTransferBytes;
  wait_all(pending, operation, large ? Polling::transfer : Polling::arrival);
}

}  // namespace optex
