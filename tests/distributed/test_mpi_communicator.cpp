// The MPI communicator against the backend-independent contract, run by
// mpirun with 2 and 4 ranks (optex_add_mpi_test), plus what is particular to
// MPI: the gather of counts beyond INT_MAX in rounds (forced here with tiny
// rounds), the duplicated communicator, and its argument checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <limits>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "distributed/communicator_contract.hpp"
#include "optex/distributed/mpi_communicator.hpp"

namespace {

using optex::Communicator;
using optex::MpiCommunicator;
using ::testing::HasSubstr;

// "rank 1 has" or "ranks 1, 3 have": the odd ranks of MPI_COMM_WORLD.
std::string comm_size_odd_ranks() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string names;
  int count = 0;
  for (int r = 1; r < size; r += 2, ++count) names += (count > 0 ? ", " : "") + std::to_string(r);
  return (count == 1 ? "rank " : "ranks ") + names + (count == 1 ? " has" : " have");
}

// A bound on every collective here: a broken test fails instead of hanging.
constexpr Communicator::Seconds kTestTimeout{30.0};

// A fresh communicator over MPI_COMM_WORLD per test, as a user would make one.
class MpiContract : public ::testing::Test {
 protected:
  MpiContract() { comm_.set_timeout(kTestTimeout); }
  MpiCommunicator comm_;
};

TEST_F(MpiContract, AllGatherBytes) { optex::test::check_all_gather_bytes(comm_); }
TEST_F(MpiContract, AllReduce) { optex::test::check_all_reduce(comm_); }
TEST_F(MpiContract, Broadcast) { optex::test::check_broadcast(comm_); }
TEST_F(MpiContract, Barrier) { optex::test::check_barrier(comm_); }
TEST_F(MpiContract, AllGatherFloats) { optex::test::check_all_gather_floats(comm_); }
TEST_F(MpiContract, AllToAllFloats) { optex::test::check_all_to_all_floats(comm_); }
TEST_F(MpiContract, Split) { optex::test::check_split(comm_); }
TEST_F(MpiContract, NodeLocal) { optex::test::check_node_local(comm_); }
TEST_F(MpiContract, SetTimeoutRejectsBadValues) {
  optex::test::check_set_timeout_rejects_bad_values(comm_);
}

TEST_F(MpiContract, DescribesItselfAndIsADuplicate) {
  int world_rank = -1;
  int world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_EQ(comm_.rank(), world_rank);
  EXPECT_EQ(comm_.size(), world_size);
  EXPECT_EQ(comm_.backend(), "mpi");
  EXPECT_EQ(comm_.row_device(), optex::Device::cpu());
  int comparison = MPI_IDENT;
  MPI_Comm_compare(comm_.comm(), MPI_COMM_WORLD, &comparison);
  EXPECT_EQ(comparison, MPI_CONGRUENT) << "not a duplicate of MPI_COMM_WORLD";
}

// Rounds of 3 floats: several rounds, windows that cut through a rank's block,
// and ranks with nothing in a round; out of place and in place.
TEST_F(MpiContract, AllGatherFloatsInSeveralRounds) {
  for (const std::size_t chunk : {1, 3, 7}) {
    SCOPED_TRACE("max_chunk_floats " + std::to_string(chunk));
    comm_.set_max_chunk_floats(chunk);
    EXPECT_EQ(comm_.max_chunk_floats(), chunk);
    optex::test::check_all_gather_floats(comm_);
    // all_gather_bytes beyond the window goes through the rounds as well.
    optex::test::check_all_gather_bytes(comm_);
    // A split passes the round size on.
    auto sub = comm_.split(0, comm_.rank());
    EXPECT_EQ(static_cast<MpiCommunicator&>(*sub).max_chunk_floats(), chunk);
    optex::test::check_all_gather_floats(*sub);
  }
  // Larger blocks: 1000 floats per rank in rounds of 64.
  comm_.set_max_chunk_floats(64);
  const auto size = static_cast<std::size_t>(comm_.size());
  const std::vector<std::size_t> counts(size, 1000);
  std::vector<float> mine(1000);
  for (std::size_t i = 0; i < mine.size(); ++i)
    mine[i] = optex::test::source_value(comm_.rank(), i);
  std::vector<float> all(1000 * size, std::numeric_limits<float>::quiet_NaN());
  comm_.all_gather_floats(mine.data(), all.data(), counts);
  for (std::size_t r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < 1000; ++i) {
      ASSERT_EQ(all[r * 1000 + i], optex::test::source_value(static_cast<int>(r), i))
          << "rank " << r << ", index " << i;
    }
  }
}

// Pieces of 1, 3 and 7 floats: a block in several messages, pieces that end
// mid-block; then blocks of up to 900 floats in pieces of 64. The seam that
// stands in for counts above INT_MAX (which would need some 17 GB here).
TEST_F(MpiContract, AllToAllFloatsInSeveralPieces) {
  for (const std::size_t chunk : {1, 3, 7}) {
    SCOPED_TRACE("max_chunk_floats " + std::to_string(chunk));
    comm_.set_max_chunk_floats(chunk);
    optex::test::check_all_to_all_floats(comm_);
  }
  comm_.set_max_chunk_floats(64);
  optex::test::check_all_to_all_floats(comm_, 300);
}

TEST_F(MpiContract, RejectsBadArguments) {
  const auto expect_invalid = [](const auto& call, const std::string& words) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected an error with '" << words << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(words));
    }
  };
  expect_invalid([&] { comm_.set_max_chunk_floats(0); }, "floats: must be in [1, 2^30], got 0");
  expect_invalid([&] { comm_.set_max_chunk_floats((std::size_t{1} << 30) + 1); }, "floats");
  std::vector<std::byte> one(1);
  expect_invalid([&] { comm_.broadcast_bytes(one, comm_.size()); },
                 "root: must be in [0, " + std::to_string(comm_.size()) + ")");
  expect_invalid([&] { comm_.all_gather_bytes(one, one); },
                 "all.size() must be size() * mine.size()");
  const std::vector<std::size_t> wrong(static_cast<std::size_t>(comm_.size()) + 1, 0);
  expect_invalid([&] { comm_.all_gather_floats(nullptr, nullptr, wrong); }, "counts.size()");
  const std::vector<std::size_t> ones(static_cast<std::size_t>(comm_.size()), 1);
  std::vector<float> all(ones.size());
  expect_invalid([&] { comm_.all_gather_floats(nullptr, all.data(), ones); }, "mine");
  expect_invalid([&] { comm_.split(-1, 0); }, "color: must be >= 0, got -1");
  // all_to_all_floats: spans of another length, before anything is sent.
  const std::vector<std::size_t> zeros(ones.size(), 0);
  expect_invalid([&] { comm_.all_to_all_floats(nullptr, zeros, zeros, nullptr, zeros, wrong); },
                 "all_to_all_floats: recv_offsets.size() must be size() = " +
                     std::to_string(comm_.size()) + ", got " + std::to_string(wrong.size()));
  expect_invalid([&] { comm_.all_to_all_floats(nullptr, ones, zeros, all.data(), ones, zeros); },
                 "send: null with send_counts[0] = 1");
  expect_invalid([] { MpiCommunicator bad(MPI_COMM_NULL); }, "comm");
  // Local checks leave the communicator working.
  optex::test::check_barrier(comm_);
}

// Ranks that pass different sizes (a rank at another iteration, or in
// another operation) get a CommunicatorError naming the operation and the
// rank, on every rank. Before, Open MPI ended the job with its own fatal
// MPI_ERR_TRUNCATE, since it reports a failed non-blocking collective to
// MPI_COMM_WORLD's handler, not to the duplicate's.
TEST(MpiErrors, DifferentSizesAreACommunicatorErrorNamingTheRank) {
  MpiCommunicator comm;
  comm.set_timeout(Communicator::Seconds{5.0});
  const auto n = static_cast<std::size_t>(8 * (comm.rank() + 1));
  std::vector<std::byte> mine(n);
  std::vector<std::byte> all(n * static_cast<std::size_t>(comm.size()));
  try {
    comm.all_gather_bytes(mine, all);
    ADD_FAILURE() << "different sizes were gathered";
  } catch (const optex::CommunicatorError& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_gather_bytes"));
    EXPECT_THAT(e.what(), HasSubstr("different operations or passed different sizes"));
    // Every other rank's size differs: the first one named is rank 0, or rank 1 on rank 0.
    EXPECT_THAT(e.what(), HasSubstr(comm.rank() == 0 ? "rank 1 contributed 16 bytes"
                                                     : "rank 0 contributed 8 bytes"));
    EXPECT_THAT(e.what(), HasSubstr("this rank expects " + std::to_string(n)));
  }
  // The communicator refuses further use; a new one works.
  EXPECT_THROW(comm.barrier(), optex::CommunicatorError);
  MpiCommunicator fresh;
  fresh.set_timeout(kTestTimeout);
  optex::test::check_barrier(fresh);
}

// Counts that disagree between ranks: a CommunicatorError on every rank that
// names the ranks and the counts, before any float moves; with the counts
// gathered point to point, and in collective rounds (tiny windows).
TEST(MpiErrors, AllToAllMismatchIsACommunicatorErrorOnEveryRank) {
  for (const std::size_t chunk : {std::size_t{1} << 30, std::size_t{2}}) {
    SCOPED_TRACE("max_chunk_floats " + std::to_string(chunk));
    MpiCommunicator comm;
    comm.set_timeout(Communicator::Seconds{5.0});
    comm.set_max_chunk_floats(chunk);
    optex::test::check_all_to_all_mismatch_throws(comm);
  }
  MpiCommunicator fresh;
  fresh.set_timeout(kTestTimeout);
  optex::test::check_all_to_all_floats(fresh);
}

// The same in the gather of MPI collectives (forced with tiny rounds): an
// error or a timeout, never MPI's fatal abort. (A rank that receives shorter
// messages than it expects may not notice: MPI allows short messages.)
TEST(MpiErrors, DifferentSizesInCollectiveRoundsAreNotFatal) {
  MpiCommunicator comm;
  comm.set_timeout(Communicator::Seconds{2.0});
  comm.set_max_chunk_floats(2);
  const auto size = static_cast<std::size_t>(comm.size());
  const std::vector<std::size_t> counts(size, comm.rank() == 0 ? 3 : 5);
  std::vector<float> mine(counts[0]);
  std::vector<float> all(counts[0] * size);
  try {
    comm.all_gather_floats(mine.data(), all.data(), counts);
    EXPECT_EQ(comm.rank(), 0) << "the longer messages went unnoticed";
  } catch (const optex::CommunicatorError& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_gather_floats"));
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the buffers outlive every rank's attempt
}

// A timeout names the ranks that did not arrive (here the odd ranks, which
// come too late), on every rank that waited.
TEST(MpiErrors, TimeoutNamesTheRanksThatDidNotArrive) {
  const std::string odd = comm_size_odd_ranks();
  for (const std::string operation : {"all_gather_bytes", "barrier", "all_to_all_floats"}) {
    SCOPED_TRACE(operation);
    MpiCommunicator comm;
    comm.set_timeout(Communicator::Seconds{0.5});
    // Alive until every late message has landed (the world barrier below).
    std::vector<std::byte> mine(4);
    std::vector<std::byte> all(4 * static_cast<std::size_t>(comm.size()));
    // all_to_all_floats: a float to each rank of the same parity, so that
    // the late ranks complete among themselves once their counts arrive.
    const auto ranks = static_cast<std::size_t>(comm.size());
    std::vector<std::size_t> counts(ranks);
    for (std::size_t r = 0; r < ranks; ++r)
      counts[r] = r % 2 == static_cast<std::size_t>(comm.rank() % 2) ? 1 : 0;
    std::vector<std::size_t> offsets(ranks);
    std::iota(offsets.begin(), offsets.end(), std::size_t{0});
    const std::vector<float> send(ranks, 1.0f);
    std::vector<float> recv(ranks);
    const auto call = [&] {
      if (operation == "barrier") {
        comm.barrier();
      } else if (operation == "all_gather_bytes") {
        comm.all_gather_bytes(mine, all);
      } else {
        comm.all_to_all_floats(send.data(), counts, offsets, recv.data(), counts, offsets);
      }
    };
    if (comm.rank() % 2 == 1) {
      // Late: the others have given up; their messages and posted receives
      // are there, so this rank completes and nothing is left in flight.
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      EXPECT_NO_THROW(call());
    } else {
      try {
        call();
        ADD_FAILURE() << "the collective completed without the odd ranks";
      } catch (const optex::CommunicatorTimeout& e) {
        EXPECT_THAT(e.what(), HasSubstr(operation + ": did not complete within 0.5 s: " + odd));
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
