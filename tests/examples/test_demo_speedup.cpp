// The demo's ratio against a reference (examples/speedup.hpp): a loss is never
// printed as if it were a speedup.
#include <gtest/gtest.h>

#include "speedup.hpp"

namespace {

using optex_demo::kNever;
using optex_demo::speedup_text;
using optex_demo::verdict;
using optex_demo::Verdict;

TEST(DemoSpeedup, FewerRoundsThanTheReferenceIsAWin) {
  EXPECT_EQ(verdict(200, 40), Verdict::win);
  EXPECT_EQ(speedup_text(200, 40), "5.00x");
}

TEST(DemoSpeedup, MoreRoundsThanTheReferenceIsPrintedAsALoss) {
  EXPECT_EQ(verdict(44, 53), Verdict::loss);
  EXPECT_EQ(speedup_text(44, 53), "0.83x loss");
  // Rounded down: a loss never reads as 1.00x.
  EXPECT_EQ(speedup_text(399, 400), "0.99x loss");
}

TEST(DemoSpeedup, EqualRoundsIsATie) {
  EXPECT_EQ(verdict(42, 42), Verdict::tie);
  EXPECT_EQ(speedup_text(42, 42), "1.00x");
}

TEST(DemoSpeedup, ReachingTheTargetAloneWinsAndNeverReachingItLoses) {
  EXPECT_EQ(verdict(kNever, 30), Verdict::win);
  EXPECT_EQ(speedup_text(kNever, 30), "win");
  EXPECT_EQ(verdict(30, kNever), Verdict::loss);
  EXPECT_EQ(speedup_text(30, kNever), "loss");
  EXPECT_EQ(verdict(kNever, kNever), Verdict::neither);
  EXPECT_EQ(speedup_text(kNever, kNever), "-");
}

TEST(DemoSpeedup, HalfRoundsAreMediansOfAnEvenNumberOfSeeds) {
  EXPECT_EQ(speedup_text(45.5, 91), "0.50x loss");
  EXPECT_EQ(speedup_text(91, 45.5), "2.00x");
}

}  // namespace
