// point_range: the split of the N points of a round over G groups of workers,
// shared by DistributedEngine and the Python torch.distributed integration.
// Checked exhaustively for small N and G against its contract.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "optex/distributed/distributed_engine.hpp"
#include "optex/distributed/point_split.hpp"

namespace {

using optex::point_range;
using optex::PointRange;
using ::testing::HasSubstr;

// The message of the exception `call` throws as E (fails if it throws nothing).
template <class E, class Call>
std::string message_of(Call&& call) {
  try {
    call();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception";
  return "";
}

TEST(PointRange, EveryPointOnceInContiguousBlocksTheLargerFirst) {
  for (int n = 1; n <= 40; ++n) {
    for (int groups = 1; groups <= n; ++groups) {
      SCOPED_TRACE("N=" + std::to_string(n) + " G=" + std::to_string(groups));
      std::vector<int> owner(static_cast<std::size_t>(n), -1);
      int next = 0;  // contiguous: each block starts where the last one ended
      int previous_count = n + 1;
      for (int g = 0; g < groups; ++g) {
        const PointRange r = point_range(n, groups, g);
        EXPECT_EQ(r.first, next);
        EXPECT_GE(r.count, n / groups);  // sizes differ by at most one
        EXPECT_LE(r.count, n / groups + 1);
        EXPECT_LE(r.count, previous_count);  // larger blocks first
        previous_count = r.count;
        for (int i : r) {
          ASSERT_GE(i, 0);
          ASSERT_LT(i, n);
          EXPECT_EQ(owner[static_cast<std::size_t>(i)], -1) << "point " << i << " twice";
          owner[static_cast<std::size_t>(i)] = g;
          EXPECT_TRUE(r.contains(i));
        }
        EXPECT_FALSE(r.contains(r.first - 1));
        EXPECT_FALSE(r.contains(r.first + r.count));
        next = r.first + r.count;
      }
      EXPECT_EQ(next, n);
      for (int i = 0; i < n; ++i) EXPECT_NE(owner[static_cast<std::size_t>(i)], -1) << i;
    }
  }
}

TEST(PointRange, MoreGroupsThanPointsLeavesTheLastGroupsEmpty) {
  for (int g = 0; g < 5; ++g) {
    const PointRange r = point_range(3, 5, g);
    EXPECT_EQ(r.first, g < 3 ? g : 3);
    EXPECT_EQ(r.count, g < 3 ? 1 : 0);
  }
}

TEST(PointRange, BadArgumentsThrowNamingTheArgumentAndValue) {
  EXPECT_EQ(message_of<std::invalid_argument>([] { point_range(0, 1, 0); }),
            "points: must be >= 1, got 0");
  EXPECT_EQ(message_of<std::invalid_argument>([] { point_range(-3, 1, 0); }),
            "points: must be >= 1, got -3");
  EXPECT_EQ(message_of<std::invalid_argument>([] { point_range(4, 0, 0); }),
            "groups: must be >= 1, got 0");
  EXPECT_EQ(message_of<std::out_of_range>([] { point_range(4, 2, 2); }),
            "group: 2 is outside [0, 2)");
  EXPECT_THAT(message_of<std::out_of_range>([] { point_range(4, 2, -1); }), HasSubstr("group: -1"));
}

// DistributedEngine keeps its own name for the type.
static_assert(std::is_same_v<optex::DistributedEngine::PointRange, PointRange>);

}  // namespace
