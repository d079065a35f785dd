// The communicator contract (include/optex/distributed/communicator.hpp), checked the same
// way for every backend. Every rank calls the same check with its own
// communicator, in the same order; the checks use GoogleTest assertions,
// which are thread-safe, so the ranks may be threads of one process
// (in-process) or processes (MPI).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "optex/distributed/communicator.hpp"

namespace optex::test {

// A value that names the rank and the index it came from.
inline float source_value(int rank, std::size_t index) {
  return static_cast<float>(rank * 1000) + static_cast<float>(index);
}

// Uneven counts, zero included from two ranks on: 2, 0, 4, 5, 6, 0, ...
inline std::vector<std::size_t> uneven_counts(int size) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    counts[static_cast<std::size_t>(r)] = r % 4 == 1 ? 0 : static_cast<std::size_t>(r + 2);
  }
  return counts;
}

inline std::uint64_t bits_of(double x) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// Each rank contributes 3 ints naming it; everyone receives them in rank order,
// through the typed wrapper and the byte operation, and a zero-byte gather works.
inline void check_all_gather_bytes(Communicator& comm) {
  const int size = comm.size();
  const int rank = comm.rank();
  const std::vector<int> mine = {rank * 10, rank * 10 + 1, rank * 10 + 2};
  std::vector<int> all(3 * static_cast<std::size_t>(size), -1);
  comm.all_gather(std::span<const int>(mine), std::span<int>(all));
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(all[static_cast<std::size_t>(3 * r + i)], r * 10 + i) << "from rank " << r;
    }
  }

  const std::byte mark = static_cast<std::byte>(0x40 + rank);
  std::vector<std::byte> bytes(static_cast<std::size_t>(size), std::byte{0});
  comm.all_gather_bytes(std::span<const std::byte>(&mark, 1), bytes);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(bytes[static_cast<std::size_t>(r)], static_cast<std::byte>(0x40 + r));
  }

  comm.all_gather_bytes({}, {});
}

// sum: the rank-order sum, bit for bit the same on every rank (the values are
// chosen so that the order of summation changes the result); min and max.
inline void check_all_reduce(Communicator& comm) {
  const int size = comm.size();
  const int rank = comm.rank();
  const auto input = [](int r, std::size_t i) {
    // 1e16 on rank 0 and small values elsewhere: each addition rounds.
    return r == 0 ? 1e16 + static_cast<double>(i) : 0.7 + 0.1 * r + static_cast<double>(i);
  };
  constexpr std::size_t kValues = 5;
  std::vector<double> values(kValues);
  for (std::size_t i = 0; i < kValues; ++i) values[i] = input(rank, i);
  comm.all_reduce(values, ReduceOp::sum);
  for (std::size_t i = 0; i < kValues; ++i) {
    double expected = input(0, i);
    for (int r = 1; r < size; ++r) expected += input(r, i);
    EXPECT_EQ(bits_of(values[i]), bits_of(expected)) << "sum at " << i << ": " << values[i];
  }
  // Identical bits on every rank.
  std::vector<double> everyone(kValues * static_cast<std::size_t>(size));
  comm.all_gather(std::span<const double>(values), std::span<double>(everyone));
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < kValues; ++i) {
      EXPECT_EQ(bits_of(everyone[static_cast<std::size_t>(r) * kValues + i]), bits_of(values[i]))
          << "rank " << r << " got a different sum at " << i;
    }
  }

  std::vector<double> low = {static_cast<double>(rank) - 1.5, -static_cast<double>(rank)};
  comm.all_reduce(low, ReduceOp::min);
  EXPECT_EQ(low[0], -1.5);
  EXPECT_EQ(low[1], -static_cast<double>(size - 1));

  std::vector<double> high = {static_cast<double>(rank) - 1.5, -static_cast<double>(rank)};
  comm.all_reduce(high, ReduceOp::max);
  EXPECT_EQ(high[0], static_cast<double>(size - 1) - 1.5);
  EXPECT_EQ(high[1], 0.0);

  comm.all_reduce({}, ReduceOp::sum);
}

// From every root in turn: the root's bytes reach every rank; the root's own
// buffer is unchanged.
inline void check_broadcast(Communicator& comm) {
  const int rank = comm.rank();
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<std::int64_t> data(7);
    for (std::size_t i = 0; i < data.size(); ++i) {
      data[i] = rank == root ? root * 100 + static_cast<std::int64_t>(i) : -1;
    }
    comm.broadcast(std::span<std::int64_t>(data), root);
    for (std::size_t i = 0; i < data.size(); ++i) {
      EXPECT_EQ(data[i], root * 100 + static_cast<std::int64_t>(i)) << "root " << root;
    }
  }
  comm.broadcast_bytes({}, 0);
}

// Nobody leaves a barrier before the last rank enters it: rank 0 enters late,
// and every rank's barrier lasts most of that delay.
inline void check_barrier(Communicator& comm) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kDelay = std::chrono::milliseconds(300);
  comm.barrier();
  const auto start = Clock::now();
  if (comm.rank() == 0) std::this_thread::sleep_for(kDelay);
  comm.barrier();
  const auto waited = Clock::now() - start;
  // A third of the delay: the ranks leave the first barrier at different times
  // (more ranks than cores, other tests running).
  if (comm.size() > 1) {
    EXPECT_GE(waited, kDelay / 3);
  }
  for (int i = 0; i < 5; ++i) comm.barrier();
}

// Uneven counts (zero included), out of place and in place; each value names
// its source rank and index. Also: every count zero.
inline void check_all_gather_floats(Communicator& comm) {
  const int size = comm.size();
  const int rank = comm.rank();
  const std::vector<std::size_t> counts = uneven_counts(size);
  std::vector<std::size_t> offsets(counts.size());
  std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), std::size_t{0});
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const auto me = static_cast<std::size_t>(rank);

  const auto expect_gathered = [&](const std::vector<float>& all, const char* how) {
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i) {
        EXPECT_EQ(all[offsets[static_cast<std::size_t>(r)] + i], source_value(r, i))
            << how << ": rank " << r << ", index " << i;
      }
    }
  };

  std::vector<float> mine(counts[me]);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = source_value(rank, i);
  std::vector<float> all(total, std::numeric_limits<float>::quiet_NaN());
  comm.all_gather_floats(mine.data(), all.data(), counts);
  expect_gathered(all, "out of place");

  std::vector<float> in_place(total, std::numeric_limits<float>::quiet_NaN());
  for (std::size_t i = 0; i < counts[me]; ++i) in_place[offsets[me] + i] = source_value(rank, i);
  comm.all_gather_floats(in_place.data() + offsets[me], in_place.data(), counts);
  expect_gathered(in_place, "in place");

  const std::vector<std::size_t> zeros(static_cast<std::size_t>(size), 0);
  comm.all_gather_floats(nullptr, nullptr, zeros);
}

// ---- all_to_all_floats ------------------------------------------------------

// Rows in host memory, for the backends whose row_device() is the CPU. A
// backend with rows elsewhere passes a type with the same members (test_nccl.cpp).
class HostRows {
 public:
  explicit HostRows(std::vector<float> values) : values_(std::move(values)) {}
  float* data() { return values_.data(); }
  std::vector<float> read() const { return values_; }

 private:
  std::vector<float> values_;
};

// What a receive buffer holds where no block lands.
inline constexpr float kUntouched = -1.0f;

// How many floats rank `from` sends rank `to` in the case below, times
// `scale`: zero for some pairs from two ranks on, the self pair included.
inline std::size_t all_to_all_count(int from, int to, std::size_t scale = 1) {
  return static_cast<std::size_t>((from + 2 * to + 1) % 4) * scale;
}

// One rank's arguments to all_to_all_floats, and its receive buffer afterwards.
struct AllToAllCase {
  std::vector<float> send;
  std::vector<std::size_t> send_counts;
  std::vector<std::size_t> send_offsets;
  std::vector<std::size_t> recv_counts;
  std::vector<std::size_t> recv_offsets;
  std::vector<float> expected;  // kUntouched in the gaps
};

// Rank r's float j is source_value(r, j). Its block for rank s starts at
// float s * scale, so the blocks overlap (the same floats go to several
// ranks), and a float that reaches the wrong rank, or comes from the wrong
// offset, has another value. The receive blocks lie in reverse rank order,
// each after a gap of one float that must stay untouched.
inline AllToAllCase all_to_all_case(int rank, int size, std::size_t scale = 1) {
  const auto ranks = static_cast<std::size_t>(size);
  AllToAllCase c;
  std::size_t send_size = 0;
  for (int s = 0; s < size; ++s) {
    c.send_counts.push_back(all_to_all_count(rank, s, scale));
    c.send_offsets.push_back(static_cast<std::size_t>(s) * scale);
    send_size = std::max(send_size, c.send_offsets.back() + c.send_counts.back());
  }
  for (std::size_t j = 0; j < send_size; ++j) c.send.push_back(source_value(rank, j));
  c.recv_counts.resize(ranks);
  c.recv_offsets.resize(ranks);
  std::size_t at = 1;
  for (int s = size - 1; s >= 0; --s) {
    const auto from = static_cast<std::size_t>(s);
    c.recv_counts[from] = all_to_all_count(s, rank, scale);
    c.recv_offsets[from] = at;
    at += c.recv_counts[from] + 1;
  }
  c.expected.assign(at, kUntouched);
  for (int s = 0; s < size; ++s) {
    const auto from = static_cast<std::size_t>(s);
    for (std::size_t i = 0; i < c.recv_counts[from]; ++i) {
      // Rank s's block for this rank starts at its float rank * scale.
      c.expected[c.recv_offsets[from] + i] =
          source_value(s, static_cast<std::size_t>(rank) * scale + i);
    }
  }
  return c;
}

// The case above (uneven counts with zeros, overlapping sends, receive
// blocks with gaps, the self pair), and a call with nothing to move.
template <class Rows = HostRows>
inline void check_all_to_all_floats(Communicator& comm, std::size_t scale = 1) {
  const AllToAllCase c = all_to_all_case(comm.rank(), comm.size(), scale);
  Rows send(c.send);
  Rows recv(std::vector<float>(c.expected.size(), kUntouched));
  comm.all_to_all_floats(send.data(), c.send_counts, c.send_offsets, recv.data(), c.recv_counts,
                         c.recv_offsets);
  EXPECT_EQ(recv.read(), c.expected);
  EXPECT_EQ(send.read(), c.send) << "the send buffer changed";

  const std::vector<std::size_t> zeros(static_cast<std::size_t>(comm.size()), 0);
  comm.all_to_all_floats(nullptr, zeros, zeros, nullptr, zeros, zeros);
}

// The last rank expects one float more from rank 0 than rank 0 sends it (in
// a world of one, rank 0 from itself): every rank throws a CommunicatorError
// naming both ranks and both counts, before any float moves. The
// communicator is unusable afterwards, for all_to_all_floats too.
template <class Rows = HostRows>
inline void check_all_to_all_mismatch_throws(Communicator& comm) {
  AllToAllCase c = all_to_all_case(comm.rank(), comm.size());
  const int last = comm.size() - 1;
  const std::size_t sent = all_to_all_count(0, last);
  if (comm.rank() == last) ++c.recv_counts[0];  // block 0 is the last: the final gap holds it
  Rows send(c.send);
  const std::vector<float> untouched(c.expected.size(), kUntouched);
  Rows recv(untouched);
  try {
    comm.all_to_all_floats(send.data(), c.send_counts, c.send_offsets, recv.data(), c.recv_counts,
                           c.recv_offsets);
    ADD_FAILURE() << "mismatched all_to_all_floats did not throw";
  } catch (const CommunicatorError& e) {
    const std::string who = "rank 0 sends rank " + std::to_string(last) + " " +
                            std::to_string(sent) + " floats, rank " + std::to_string(last) +
                            " expects " + std::to_string(sent + 1);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("all_to_all_floats"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(who));
  }
  EXPECT_EQ(recv.read(), untouched) << "floats moved although the counts disagree";
  EXPECT_THROW(comm.barrier(), CommunicatorError);
  const std::vector<std::size_t> zeros(static_cast<std::size_t>(comm.size()), 0);
  EXPECT_THROW(comm.all_to_all_floats(nullptr, zeros, zeros, nullptr, zeros, zeros),
               CommunicatorError);
}

// Two colors (even and odd ranks); the key reverses the order within each.
// The new communicator has the right rank and size, inherits the timeout,
// and works: a gather inside it lists the parent ranks of its color.
inline void check_split(Communicator& comm) {
  const int size = comm.size();
  const int rank = comm.rank();
  const int color = rank % 2;
  const Communicator::Seconds timeout{123.0};
  const Communicator::Seconds before = comm.timeout();
  comm.set_timeout(timeout);
  std::unique_ptr<Communicator> sub = comm.split(color, -rank);
  comm.set_timeout(before);
  ASSERT_NE(sub, nullptr);

  std::vector<int> members;  // parent ranks of this color, by descending rank
  for (int r = size - 1; r >= 0; --r) {
    if (r % 2 == color) members.push_back(r);
  }
  const auto position = std::find(members.begin(), members.end(), rank) - members.begin();
  EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(sub->rank(), static_cast<int>(position));
  EXPECT_EQ(sub->timeout(), timeout);
  EXPECT_EQ(sub->backend(), comm.backend());

  std::vector<int> gathered(static_cast<std::size_t>(sub->size()), -1);
  const int mine = rank;
  sub->all_gather(std::span<const int>(&mine, 1), std::span<int>(gathered));
  EXPECT_EQ(gathered, members);

  std::vector<double> sum = {1.0};
  sub->all_reduce(sum, ReduceOp::sum);
  EXPECT_EQ(sum[0], static_cast<double>(members.size()));

  // The parent still works after the split.
  comm.barrier();
}

// All ranks run on this host: the node-local rank and size are the global ones.
inline void check_node_local(Communicator& comm) {
  const Communicator::NodeLocal local = comm.node_local();
  EXPECT_EQ(local.rank, comm.rank());
  EXPECT_EQ(local.size, comm.size());
}

// Not collective: zero, negative, NaN and infinite timeouts are rejected with
// a message naming the parameter, and the timeout stays as it was.
inline void check_set_timeout_rejects_bad_values(Communicator& comm) {
  const Communicator::Seconds before = comm.timeout();
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity()}) {
    try {
      comm.set_timeout(Communicator::Seconds{bad});
      ADD_FAILURE() << "set_timeout(" << bad << ") did not throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("timeout"));
    }
    EXPECT_EQ(comm.timeout(), before);
  }
  comm.set_timeout(Communicator::Seconds{2.5});
  EXPECT_EQ(comm.timeout(), Communicator::Seconds{2.5});
  comm.set_timeout(before);
}

// Where the backend detects it (in-process): the last rank passes more bytes
// than the others, and every rank throws, naming the operation and the ranks
// that disagree. The communicator is unusable afterwards.
inline void check_mismatched_sizes_throw(Communicator& comm) {
  const int size = comm.size();
  if (size < 2) return;  // nobody to disagree with
  const int rank = comm.rank();
  const std::size_t n = rank == size - 1 ? 2 : 1;
  std::vector<std::byte> mine(n);
  std::vector<std::byte> all(n * static_cast<std::size_t>(size));
  try {
    comm.all_gather_bytes(mine, all);
    ADD_FAILURE() << "mismatched all_gather_bytes did not throw";
  } catch (const CommunicatorError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("all_gather_bytes"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("mine.size()"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("rank 0 passed 1"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("rank " + std::to_string(size - 1) + " passed 2"));
  }
  EXPECT_THROW(comm.barrier(), CommunicatorError);
}

}  // namespace optex::test
