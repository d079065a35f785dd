// The in-process communicator: the backend-independent contract with 1, 2 and
// 4 ranks (one thread each), and what only this backend does: it names the
// ranks that did not arrive, detects mismatched calls, and spreads a failure
// or an abort to every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <latch>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "distributed/communicator_contract.hpp"
#include "optex/distributed/communicator.hpp"
#include "optex/distributed/in_process_communicator.hpp"

namespace {

using optex::Communicator;
using optex::CommunicatorError;
using optex::CommunicatorTimeout;
using optex::InProcessWorld;
using optex::ReduceOp;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using Seconds = Communicator::Seconds;

// A bound on every collective here: a broken test fails instead of hanging.
constexpr Seconds kTestTimeout{30.0};

// Runs body(rank's communicator) on one thread per rank of a fresh world. An
// exception on a rank is a failure that names the rank.
void run_world(int size, const std::function<void(Communicator&)>& body) {
  InProcessWorld world(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([r, &body, comm = world.communicator(r)] {
      SCOPED_TRACE("rank " + std::to_string(r));
      comm->set_timeout(kTestTimeout);
      try {
        body(*comm);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << " threw: " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

// What one rank saw when its collective failed.
struct Failure {
  bool threw = false;
  bool timed_out = false;  // a CommunicatorTimeout, not only a CommunicatorError
  std::string what;
  double seconds = 0.0;  // from the call to the throw
};

// Calls op() and records how it failed.
Failure expect_failure(const std::function<void()>& op) {
  Failure f;
  const auto start = Clock::now();
  try {
    op();
  } catch (const CommunicatorTimeout& e) {
    f = {true, true, e.what(), 0.0};
  } catch (const CommunicatorError& e) {
    f = {true, false, e.what(), 0.0};
  }
  f.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return f;
}

// ---- the contract with 1, 2 and 4 ranks ------------------------------------

class InProcessContract : public ::testing::TestWithParam<int> {};

TEST_P(InProcessContract, AllGatherBytes) {
  run_world(GetParam(), optex::test::check_all_gather_bytes);
}
TEST_P(InProcessContract, AllReduce) { run_world(GetParam(), optex::test::check_all_reduce); }
TEST_P(InProcessContract, Broadcast) { run_world(GetParam(), optex::test::check_broadcast); }
TEST_P(InProcessContract, Barrier) { run_world(GetParam(), optex::test::check_barrier); }
TEST_P(InProcessContract, AllGatherFloats) {
  run_world(GetParam(), optex::test::check_all_gather_floats);
}
TEST_P(InProcessContract, AllToAllFloats) {
  run_world(GetParam(), [](Communicator& comm) { optex::test::check_all_to_all_floats(comm); });
}
TEST_P(InProcessContract, AllToAllMismatchThrows) {
  run_world(GetParam(), optex::test::check_all_to_all_mismatch_throws<>);
}
TEST_P(InProcessContract, Split) { run_world(GetParam(), optex::test::check_split); }
TEST_P(InProcessContract, NodeLocal) { run_world(GetParam(), optex::test::check_node_local); }
TEST_P(InProcessContract, SetTimeoutRejectsBadValues) {
  run_world(GetParam(), optex::test::check_set_timeout_rejects_bad_values);
}
TEST_P(InProcessContract, MismatchedSizesThrow) {
  run_world(GetParam(), optex::test::check_mismatched_sizes_throw);
}

// Many collectives back to back: a generation that starts before the last one
// has fully ended must not mix the two up.
TEST_P(InProcessContract, ManyCollectivesInARow) {
  run_world(GetParam(), [](Communicator& comm) {
    for (int i = 0; i < 200; ++i) {
      std::vector<double> v = {static_cast<double>(comm.rank() + i)};
      comm.all_reduce(v, ReduceOp::max);
      ASSERT_EQ(v[0], static_cast<double>(comm.size() - 1 + i)) << "iteration " << i;
      std::vector<int> all(static_cast<std::size_t>(comm.size()));
      const int mine = comm.rank() * i;
      comm.all_gather(std::span<const int>(&mine, 1), std::span<int>(all));
      for (int r = 0; r < comm.size(); ++r) {
        ASSERT_EQ(all[static_cast<std::size_t>(r)], r * i) << "iteration " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InProcessContract, ::testing::Values(1, 2, 4),
                         [](const auto& param_info) {
                           return "W" + std::to_string(param_info.param);
                         });

// ---- the world ---------------------------------------------------------------

TEST(InProcessWorld, RejectsBadSizes) {
  for (const int size : {0, -1}) {
    try {
      InProcessWorld world(size);
      ADD_FAILURE() << "size " << size << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("size"));
      EXPECT_THAT(e.what(), HasSubstr(std::to_string(size)));
    }
  }
}

TEST(InProcessWorld, RejectsBadRanksAndHandsEachRankOutOnce) {
  InProcessWorld world(2);
  EXPECT_EQ(world.size(), 2);
  for (const int rank : {-1, 2}) {
    try {
      world.communicator(rank);
      ADD_FAILURE() << "rank " << rank << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank"));
      EXPECT_THAT(e.what(), HasSubstr(std::to_string(rank)));
    }
  }
  auto first = world.communicator(1);
  try {
    world.communicator(1);
    ADD_FAILURE() << "rank 1 handed out twice";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1"));
    EXPECT_THAT(e.what(), HasSubstr("already"));
  }
}

TEST(InProcessWorld, DescribesItself) {
  InProcessWorld world(3);
  auto comm = world.communicator(2);
  EXPECT_EQ(comm->rank(), 2);
  EXPECT_EQ(comm->size(), 3);
  EXPECT_EQ(comm->backend(), "in-process");
  EXPECT_EQ(comm->row_device(), optex::Device::cpu());
  EXPECT_EQ(comm->timeout(), Communicator::kDefaultTimeout);
}

TEST(InProcessWorld, CommunicatorsOutliveTheWorld) {
  std::vector<std::unique_ptr<Communicator>> comms;
  {
    InProcessWorld world(2);
    comms.push_back(world.communicator(0));
    comms.push_back(world.communicator(1));
  }
  std::vector<std::thread> threads;
  std::vector<double> sums(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<double> v = {1.0};
      comms[static_cast<std::size_t>(r)]->all_reduce(v, ReduceOp::sum);
      sums[static_cast<std::size_t>(r)] = v[0];
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sums, (std::vector<double>{2.0, 2.0}));
}

TEST(LocalCommunicator, IsRankZeroOfOne) {
  auto comm = optex::local_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), "in-process");
  std::vector<double> v = {2.5};
  comm->all_reduce(v, ReduceOp::sum);
  EXPECT_EQ(v[0], 2.5);
  const std::vector<float> mine = {1.0f, 2.0f};
  std::vector<float> all(2);
  const std::size_t counts[] = {2};
  comm->all_gather_floats(mine.data(), all.data(), counts);
  EXPECT_EQ(all, mine);
  comm->barrier();
  EXPECT_EQ(comm->split(7, 0)->size(), 1);
}

// ---- failures ----------------------------------------------------------------

// all_to_all_floats with the contract's case: its buffers live for the call.
void all_to_all(Communicator& comm) {
  const optex::test::AllToAllCase c = optex::test::all_to_all_case(comm.rank(), comm.size());
  std::vector<float> recv(c.expected.size(), optex::test::kUntouched);
  comm.all_to_all_floats(c.send.data(), c.send_counts, c.send_offsets, recv.data(), c.recv_counts,
                         c.recv_offsets);
}

// Rank 3 calls `operation` only after the others have failed in it: they
// throw within their timeout, exactly one of them a CommunicatorTimeout, and
// every message names rank 3. Rank 3's late call then fails at once.
void expect_timeout_names_rank_3(const std::string& operation,
                                 const std::function<void(Communicator&)>& call) {
  constexpr int kSize = 4;
  const Seconds timeout{0.5};
  InProcessWorld world(kSize);
  std::vector<Failure> failures(kSize);
  std::latch others_done(kSize - 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r, comm = world.communicator(r)] {
      comm->set_timeout(timeout);
      if (r == kSize - 1) {
        others_done.wait();
      } else {
        failures[static_cast<std::size_t>(r)] = expect_failure([&] { call(*comm); });
        others_done.count_down();
        return;
      }
      failures[static_cast<std::size_t>(r)] = expect_failure([&] { call(*comm); });
    });
  }
  for (auto& t : threads) t.join();

  int timeouts = 0;
  for (int r = 0; r < kSize - 1; ++r) {
    const Failure& f = failures[static_cast<std::size_t>(r)];
    ASSERT_TRUE(f.threw) << "rank " << r;
    timeouts += f.timed_out ? 1 : 0;
    EXPECT_THAT(f.what, HasSubstr("rank 3 did not arrive within 0.5 s")) << "rank " << r;
    EXPECT_THAT(f.what, HasSubstr(operation));
    EXPECT_GE(f.seconds, 0.4) << "rank " << r;
    EXPECT_LT(f.seconds, 5.0) << "rank " << r;
  }
  EXPECT_EQ(timeouts, 1);
  const Failure& late = failures[kSize - 1];
  EXPECT_TRUE(late.threw);
  EXPECT_FALSE(late.timed_out);
  EXPECT_LT(late.seconds, 0.4) << "the late rank waited instead of failing at once";
  EXPECT_THAT(late.what, HasSubstr("rank 3 did not arrive"));
}

TEST(InProcessFailure, TimeoutNamesTheMissingRank) {
  expect_timeout_names_rank_3("barrier", [](Communicator& comm) { comm.barrier(); });
}

TEST(InProcessFailure, AllToAllTimeoutNamesTheMissingRank) {
  expect_timeout_names_rank_3("all_to_all_floats", all_to_all);
}

// One rank's short timeout fails the ranks with long ones at the same time.
TEST(InProcessFailure, OneTimeoutFailsTheOthersFast) {
  constexpr int kSize = 4;
  InProcessWorld world(kSize);
  std::vector<Failure> failures(kSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize - 1; ++r) {  // rank 3 never calls
    threads.emplace_back([&, r, comm = world.communicator(r)] {
      comm->set_timeout(r == 0 ? Seconds{0.2} : kTestTimeout);
      std::vector<double> v = {1.0};
      failures[static_cast<std::size_t>(r)] =
          expect_failure([&] { comm->all_reduce(v, ReduceOp::sum); });
    });
  }
  auto absent = world.communicator(kSize - 1);
  for (auto& t : threads) t.join();
  EXPECT_TRUE(failures[0].timed_out);
  EXPECT_THAT(failures[0].what, HasSubstr("rank 0 of 4, all_reduce: rank 3 did not arrive"));
  for (int r = 1; r < kSize - 1; ++r) {
    const Failure& f = failures[static_cast<std::size_t>(r)];
    EXPECT_TRUE(f.threw);
    EXPECT_FALSE(f.timed_out);
    EXPECT_LT(f.seconds, 5.0) << "rank " << r << " waited out its own timeout";
    EXPECT_THAT(f.what, HasSubstr("rank 0 timed out in all_reduce"));
  }
}

// Rank 1 aborts while the others wait in a barrier: they throw with its
// reason; abort returns; the world stays poisoned for every operation.
TEST(InProcessFailure, AbortReachesEveryRankAndPoisonsTheWorld) {
  constexpr int kSize = 4;
  InProcessWorld world(kSize);
  std::vector<Failure> failures(kSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r, comm = world.communicator(r)] {
      comm->set_timeout(kTestTimeout);
      if (r == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        comm->abort("the loss is NaN");
      } else {
        failures[static_cast<std::size_t>(r)] = expect_failure([&] { comm->barrier(); });
      }
      // Every later operation fails at once, on every rank, with the reason.
      std::vector<std::byte> bytes(1);
      std::vector<std::byte> all(kSize);
      std::vector<double> values(1);
      const std::vector<std::size_t> counts(kSize, 0);
      const std::vector<std::function<void()>> operations = {
          [&] { comm->barrier(); },
          [&] { comm->all_gather_bytes(bytes, all); },
          [&] { comm->all_reduce(values, ReduceOp::sum); },
          [&] { comm->broadcast_bytes(bytes, 0); },
          [&] { comm->all_gather_floats(nullptr, nullptr, counts); },
          [&] { all_to_all(*comm); },
          [&] { comm->split(0, 0); },
          [&] { comm->node_local(); },
      };
      for (std::size_t i = 0; i < operations.size(); ++i) {
        const Failure later = expect_failure(operations[i]);
        EXPECT_TRUE(later.threw) << "rank " << r << ", operation " << i;
        EXPECT_LT(later.seconds, 5.0);
        EXPECT_THAT(later.what, HasSubstr("rank 1 aborted: the loss is NaN"));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const int r : {0, 2, 3}) {
    const Failure& f = failures[static_cast<std::size_t>(r)];
    EXPECT_TRUE(f.threw) << "rank " << r;
    EXPECT_FALSE(f.timed_out);
    EXPECT_LT(f.seconds, 5.0);
    EXPECT_THAT(f.what, HasSubstr("rank 1 aborted: the loss is NaN"));
    EXPECT_THAT(f.what, HasSubstr("optex in-process communicator, rank " + std::to_string(r)));
  }
}

// A rank whose communicator is destroyed can never arrive: the others fail now.
TEST(InProcessFailure, DestroyedCommunicatorFailsTheOthers) {
  InProcessWorld world(2);
  auto survivor = world.communicator(0);
  world.communicator(1).reset();
  survivor->set_timeout(kTestTimeout);
  const Failure f = expect_failure([&] { survivor->barrier(); });
  EXPECT_TRUE(f.threw);
  EXPECT_LT(f.seconds, 5.0);
  EXPECT_THAT(f.what, HasSubstr("rank 1 left"));
}

// A bad argument on one rank throws std::invalid_argument there and fails the
// others at once instead of leaving them to their timeout.
TEST(InProcessFailure, BadArgumentOnOneRankFailsTheOthers) {
  run_world(3, [](Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<std::byte> data(4);
      try {
        comm.broadcast_bytes(data, 3);
        ADD_FAILURE() << "root 3 accepted";
      } catch (const std::invalid_argument& e) {
        EXPECT_THAT(e.what(), HasSubstr("root"));
        EXPECT_THAT(e.what(), HasSubstr("got 3"));
      }
    } else {
      const Failure f = expect_failure([&] { comm.barrier(); });
      EXPECT_TRUE(f.threw);
      EXPECT_LT(f.seconds, 5.0);
      EXPECT_THAT(f.what, HasSubstr("rank 0 passed a bad argument to broadcast_bytes"));
    }
  });
}

TEST(InProcessFailure, BadArgumentsNameTheParameter) {
  const auto expect_invalid = [](const std::function<void(Communicator&)>& call,
                                 const std::string& words) {
    auto comm = optex::local_communicator();
    try {
      call(*comm);
      ADD_FAILURE() << "accepted; expected an error with '" << words << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(words));
    }
  };
  std::vector<std::byte> one(1);
  std::vector<std::byte> three(3);
  expect_invalid([&](Communicator& c) { c.all_gather_bytes(one, three); },
                 "all.size() must be size() * mine.size() = 1, got 3");
  expect_invalid([&](Communicator& c) { c.broadcast_bytes(one, -1); }, "root");
  const std::vector<std::size_t> two_counts = {1, 1};
  float x = 0.0f;
  expect_invalid([&](Communicator& c) { c.all_gather_floats(&x, &x, two_counts); },
                 "counts.size() must be size() = 1, got 2");
  const std::vector<std::size_t> one_count = {1};
  expect_invalid([&](Communicator& c) { c.all_gather_floats(nullptr, &x, one_count); }, "mine");
  expect_invalid([&](Communicator& c) { c.all_gather_floats(&x, nullptr, one_count); }, "all");
  expect_invalid([&](Communicator& c) { c.split(-1, 0); }, "color");

  // all_to_all_floats: x to itself, except where a case says otherwise.
  float y = 0.0f;
  const std::vector<std::size_t> zero = {0};
  const std::vector<std::size_t> huge = {std::numeric_limits<std::size_t>::max()};
  const auto a2a = [&](const float* send, std::span<const std::size_t> send_counts,
                       std::span<const std::size_t> send_offsets, float* recv,
                       std::span<const std::size_t> recv_counts,
                       std::span<const std::size_t> recv_offsets) {
    return [=](Communicator& c) {
      c.all_to_all_floats(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
    };
  };
  expect_invalid(a2a(&x, two_counts, zero, &y, one_count, zero),
                 "send_counts.size() must be size() = 1, got 2");
  expect_invalid(a2a(&x, one_count, {}, &y, one_count, zero),
                 "send_offsets.size() must be size() = 1, got 0");
  expect_invalid(a2a(&x, one_count, zero, &y, two_counts, zero),
                 "recv_counts.size() must be size() = 1, got 2");
  expect_invalid(a2a(&x, one_count, zero, &y, one_count, two_counts),
                 "recv_offsets.size() must be size() = 1, got 2");
  expect_invalid(a2a(nullptr, one_count, zero, &y, one_count, zero),
                 "send: null with send_counts[0] = 1");
  expect_invalid(a2a(&x, one_count, zero, nullptr, one_count, zero),
                 "recv: null with recv_counts[0] = 1");
  expect_invalid(a2a(&x, one_count, huge, &y, one_count, zero),
                 "send_offsets[0] + send_counts[0] = " + std::to_string(huge[0]) +
                     " + 1 floats run past the end of the address space");
  expect_invalid(a2a(&x, one_count, zero, &x, one_count, zero),
                 "the receive region from rank 0 overlaps the send region to rank 0");
}

// Receive regions that overlap each other: refused on the rank that passes
// them (here both).
TEST(InProcessFailure, AllToAllRefusesOverlappingReceiveRegions) {
  run_world(2, [](Communicator& comm) {
    const float send[2] = {1.0f, 2.0f};
    float recv[2] = {0.0f, 0.0f};
    const std::vector<std::size_t> counts = {1, 1};
    const std::vector<std::size_t> apart = {0, 1};
    const std::vector<std::size_t> same = {1, 1};
    try {
      comm.all_to_all_floats(send, counts, apart, recv, counts, same);
      ADD_FAILURE() << "overlapping receive regions accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("the receive regions from ranks 0 and 1 overlap"));
    }
  });
}

// A rank whose spans have the wrong length throws std::invalid_argument
// before it arrives; the other rank fails at once, and no float moves on
// either.
TEST(InProcessFailure, AllToAllBadArgumentOnOneRankMovesNothing) {
  run_world(2, [](Communicator& comm) {
    optex::test::AllToAllCase c = optex::test::all_to_all_case(comm.rank(), comm.size());
    if (comm.rank() == 0) c.recv_offsets.push_back(0);
    const std::vector<float> untouched(c.expected.size(), optex::test::kUntouched);
    std::vector<float> recv = untouched;
    const auto call = [&] {
      comm.all_to_all_floats(c.send.data(), c.send_counts, c.send_offsets, recv.data(),
                             c.recv_counts, c.recv_offsets);
    };
    if (comm.rank() == 0) {
      EXPECT_THAT(call, ::testing::ThrowsMessage<std::invalid_argument>(
                            HasSubstr("recv_offsets.size() must be size() = 2, got 3")));
    } else {
      const Failure f = expect_failure(call);
      EXPECT_TRUE(f.threw);
      EXPECT_LT(f.seconds, 5.0);
      EXPECT_THAT(f.what, HasSubstr("rank 0 passed a bad argument to all_to_all_floats"));
    }
    EXPECT_EQ(recv, untouched);
  });
}

// Every kind of disagreement is caught, on every rank, naming what differs.
TEST(InProcessFailure, MismatchedCallsThrowOnEveryRank) {
  struct Case {
    std::string expected;
    std::function<void(Communicator&)> call;
  };
  const std::vector<Case> cases = {
      {"the operation differs between ranks: rank 0 called barrier, rank 1 called all_reduce",
       [](Communicator& c) {
         if (c.rank() == 0) {
           c.barrier();
         } else {
           std::vector<double> v(1);
           c.all_reduce(v, ReduceOp::sum);
         }
       }},
      {"values.size() differs between ranks: rank 0 passed 1, rank 1 passed 2",
       [](Communicator& c) {
         std::vector<double> v(static_cast<std::size_t>(c.rank() + 1));
         c.all_reduce(v, ReduceOp::sum);
       }},
      {"op differs between ranks: rank 0 passed min, rank 1 passed max",
       [](Communicator& c) {
         std::vector<double> v(1);
         c.all_reduce(v, c.rank() == 0 ? ReduceOp::min : ReduceOp::max);
       }},
      {"root differs between ranks: rank 0 passed 0, rank 1 passed 1",
       [](Communicator& c) {
         std::vector<std::byte> data(2);
         c.broadcast_bytes(data, c.rank());
       }},
      {"data.size() differs between ranks: rank 0 passed 1, rank 1 passed 2",
       [](Communicator& c) {
         std::vector<std::byte> data(static_cast<std::size_t>(c.rank() + 1));
         c.broadcast_bytes(data, 0);
       }},
      {"counts differs between ranks: rank 0 passed [1, 1], rank 1 passed [1, 2]",
       [](Communicator& c) {
         const std::vector<std::size_t> counts = {1, c.rank() == 0 ? 1u : 2u};
         std::vector<float> all(counts[0] + counts[1]);
         c.all_gather_floats(all.data() + c.rank(), all.data(), counts);
       }},
  };
  for (const Case& test_case : cases) {
    SCOPED_TRACE(test_case.expected);
    run_world(2, [&](Communicator& comm) {
      const Failure f = expect_failure([&] { test_case.call(comm); });
      EXPECT_TRUE(f.threw);
      EXPECT_THAT(f.what, HasSubstr(test_case.expected));
    });
  }
}

// The sub-communicators of a split inherit the parent's (short) timeout: an
// absent member makes the other one time out quickly, naming the member by
// its rank in the sub-communicator.
TEST(InProcessFailure, SplitInheritsTheTimeout) {
  constexpr int kSize = 4;
  InProcessWorld world(kSize);
  std::vector<Failure> failures(kSize);
  std::latch rank_0_done(1);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r, comm = world.communicator(r)] {
      comm->set_timeout(Seconds{0.3});
      auto sub = comm->split(r % 2, r);
      EXPECT_EQ(sub->timeout(), Seconds{0.3});
      if (r == 0) {
        failures[0] = expect_failure([&] { sub->barrier(); });
        rank_0_done.count_down();
      }
      // Odd ranks meet normally in theirs.
      if (r % 2 == 1) sub->barrier();
      // Rank 2 stays (without calling) until rank 0 has timed out: leaving
      // would fail rank 0 at once.
      if (r == 2) rank_0_done.wait();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(failures[0].timed_out);
  EXPECT_LT(failures[0].seconds, 5.0);
  EXPECT_THAT(failures[0].what,
              HasSubstr("rank 0 of 2, barrier: rank 1 did not arrive within 0.3 s"));
}

}  // namespace
