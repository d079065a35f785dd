// A slice engine checks the sums its ShardSums completes (DESIGN.md section
// 6): a faulty ShardSums (negative distances, NaN, values that disagree with
// each other, flags of 2) is refused with a std::runtime_error that names the
// sums, the engine exactly as it was; with honest sums it then goes on as a
// twin that never saw the fault. And a slice must lie on the block grid.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/engine/engine.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/problems/noisy_quadratic.hpp"
#include "optex/sharded/coordinate_shard.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"
#include "support/throws_with.hpp"

namespace optex::test {
namespace {

constexpr std::size_t kDim = 2 * kCoordinateBlock + 5;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Fault {
  none,
  negative,      // sum: every value -1 - |value|
  nan,           // sum: the middle value NaN
  huge,          // sum: 1e30 added to every value
  inconsistent,  // sum: every odd value 1.5 x + 1
  alternating,   // sum: value i of call k times 1.5 where i + k is odd (another answer per call)
  flag_two,      // all: every flag 2
  flag_255,      // all: every flag 255
  flag_one,      // all: every flag 1, also where this slice's is 0
};

// The sums of a slice that holds every coordinate (nothing to add), faulty
// from the call numbered `from` (counted from arm()) on, in `fault`'s way.
class FaultySums final : public ShardSums {
 public:
  void arm(Fault fault, int from = 0) {
    fault_ = fault;
    from_ = from;
    calls_ = 0;
  }
  void disarm() { arm(Fault::none); }
  int calls() const { return calls_; }

  void sum(std::span<double> v) override {
    const int call = calls_++;
    if (call < from_) return;
    switch (fault_) {
      case Fault::negative:
        for (double& x : v) x = -1.0 - std::abs(x);
        break;
      case Fault::nan:
        v[v.size() / 2] = kNaN;
        break;
      case Fault::huge:
        for (double& x : v) x += 1e30;
        break;
      case Fault::inconsistent:
        for (std::size_t i = 1; i < v.size(); i += 2) v[i] = 1.5 * v[i] + 1.0;
        break;
      case Fault::alternating:
        for (std::size_t i = 0; i < v.size(); ++i) {
          if ((i + static_cast<std::size_t>(call)) % 2 == 1) v[i] *= 1.5;
        }
        break;
      default:
        break;
    }
  }
  void all(std::span<char> flags) override {
    const int call = calls_++;
    if (call < from_) return;
    for (char& f : flags) {
      if (fault_ == Fault::flag_two) f = 2;
      if (fault_ == Fault::flag_255) f = static_cast<char>(255);
      if (fault_ == Fault::flag_one) f = 1;
    }
  }

 private:
  Fault fault_ = Fault::none;
  int from_ = 0;
  int calls_ = 0;
};

Options SliceOptions(int n = 4) {
  Options o = WithN(n, 9);
  o.history = 12;
  return o;
}

// The slice under test and an honest twin (a lone slice too: the same calls).
struct Pair {
  explicit Pair(const Options& options = SliceOptions())
      : x0(UniformStart(kDim, 3)),
        slice(x0, Adam{.lr = 0.02}, options, CoordinateShard{kDim, 0, kDim, &faulty}),
        twin(x0, Adam{.lr = 0.02}, options, CoordinateShard{kDim, 0, kDim, &honest}) {}

  FaultySums faulty, honest;
  std::vector<float> x0;
  Engine slice, twin;
};

void Evaluate(Batch& b) {
  const NoisyQuadratic f;
  for (int i = 0; i < b.size(); ++i) {
    b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i), b.seed(i));
  }
}

void Round(Engine& e) {
  Batch& b = e.ask();
  Evaluate(b);
  e.tell(b);
}

void Rounds(Pair& p, int rounds) {
  for (int t = 0; t < rounds; ++t) {
    Round(p.slice);
    Round(p.twin);
  }
  ASSERT_TRUE(SameEngine(p.slice, p.twin));
}

// What every refusal says.
const std::vector<std::string> kFaulty = {"shard: the sums completed", "the ShardSums is faulty"};

std::vector<std::string> Needles(std::initializer_list<const char*> more) {
  std::vector<std::string> out = kFaulty;
  for (const char* m : more) out.emplace_back(m);
  return out;
}

// tell() with the sums faulty from its call `from` on: refused, the slice as
// its twin (pending, the same batch); tell() again with honest sums commits
// what the twin commits, and a round later they still agree.
void ExpectTellRefused(Pair& p, Fault fault, int from, const std::vector<std::string>& needles,
                       bool bad_row = false) {
  ASSERT_TRUE(SameEngine(p.slice, p.twin));
  Batch& b = p.slice.ask();
  Batch& tb = p.twin.ask();
  Evaluate(b);
  Evaluate(tb);
  if (bad_row) {
    b.grad(1)[kDim - 1] = std::numeric_limits<float>::quiet_NaN();
    tb.grad(1)[kDim - 1] = std::numeric_limits<float>::quiet_NaN();
  }
  p.faulty.arm(fault, from);
  EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { p.slice.tell(b); }, needles));
  p.faulty.disarm();
  EXPECT_TRUE(p.slice.pending());
  ASSERT_TRUE(SameEngine(p.slice, p.twin)) << "after the refused tell()";
  p.slice.tell(b);
  p.twin.tell(tb);
  ASSERT_TRUE(SameEngine(p.slice, p.twin)) << "after the honest tell()";
  Rounds(p, 1);
}

// The calls of the sums in one tell() without a chain: the rows' flags, the
// staged step's flag, then the commit's one sum.
constexpr int kRowFlags = 0, kStepFlag = 1, kCommitSum = 2;

TEST(ShardSums, HonestSumsAreNeverRefused) {
  // Several shapes: more pairs than the history holds (skipped pushes), one
  // point per round, a chain of points with two evaluations each.
  for (const auto& [n, history, per_point] :
       std::vector<std::tuple<int, int, int>>{{4, 12, 1}, {8, 3, 1}, {1, 4, 1}, {4, 12, 2}}) {
    Options o = SliceOptions(n);
    o.history = history;
    o.evaluations_per_point = per_point;
    Pair p(o);
    for (int t = 0; t < 25; ++t) {
      Round(p.slice);
      Round(p.twin);
    }
    EXPECT_TRUE(SameEngine(p.slice, p.twin)) << "N = " << n << ", T0 = " << history;
    EXPECT_EQ(p.slice.iteration(), 25);
  }
}

TEST(ShardSums, ANegativeCompletionInTheCommitIsRefusedAndChangesNothing) {
  Pair p;
  Rounds(p, 3);
  ExpectTellRefused(p, Fault::negative, kCommitSum, Needles({"impossible for squared"}));
}

TEST(ShardSums, ANaNCompletionInTheCommitIsRefused) {
  Pair p;
  Rounds(p, 3);
  ExpectTellRefused(p, Fault::nan, kCommitSum, Needles({"nan"}));
}

TEST(ShardSums, HugeInconsistentAndAlternatingCompletionsAreRefused) {
  for (const Fault fault : {Fault::huge, Fault::inconsistent, Fault::alternating}) {
    Pair p;
    Rounds(p, 3);
    ExpectTellRefused(p, fault, kCommitSum, kFaulty);
    // Every call faulty from the start of tell(): the same.
    ExpectTellRefused(p, fault, 0, kFaulty);
  }
}

TEST(ShardSums, ACommitOfOnePointPerRoundIsChecked) {
  // N = 1: no statistics of predictions, only ||g||^2, the step and one Gram
  // row. What can be checked within the call is: non-negative and finite,
  // the point's distance to itself 0, ||g||^2 twice. (A fault that changes
  // only the step or the distances to older points by a finite, non-negative
  // amount passes: nothing in the call contradicts it.)
  for (const Fault fault : {Fault::negative, Fault::nan, Fault::huge}) {
    SCOPED_TRACE(static_cast<int>(fault));
    Pair p(SliceOptions(1));
    Rounds(p, 2);
    ExpectTellRefused(p, fault, kCommitSum, kFaulty);
  }
}

TEST(ShardSums, FlagsOtherThanZeroOrOneAreRefused) {
  for (const Fault fault : {Fault::flag_two, Fault::flag_255}) {
    for (const int call : {kRowFlags, kStepFlag}) {
      Pair p;
      Rounds(p, 2);
      ExpectTellRefused(p, fault, call, Needles({"impossible for flags"}));
    }
  }
}

TEST(ShardSums, AFlagOfOneWhereTheSliceSaysZeroIsRefused) {
  // Row 1 holds a NaN: this slice's flag is 0, and no AND can make it 1. A
  // ShardSums that did would put the NaN into the history.
  Pair p;
  Rounds(p, 2);
  ExpectTellRefused(p, Fault::flag_one, kRowFlags, Needles({"to 1 where this slice's is 0"}), true);
}

TEST(ShardSums, TheMeansOfSeveralEvaluationsAreChecked) {
  // With two evaluations per point, the first sum of tell() completes the
  // means' squared norms and spreads.
  Options o = SliceOptions(4);
  o.evaluations_per_point = 2;
  Pair p(o);
  Rounds(p, 2);
  ExpectTellRefused(p, Fault::negative, kRowFlags + 1,
                    Needles({"squared norms of mean gradients"}));
}

// ask() with the sums faulty from its call `from` on: refused, the slice as
// its twin (not pending, its generator and lengthscale as before); the next
// ask() with honest sums hands out the twin's points.
void ExpectAskRefused(Pair& p, Fault fault, int from, const std::vector<std::string>& needles) {
  p.faulty.arm(fault, from);
  EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { (void)p.slice.ask(); }, needles));
  p.faulty.disarm();
  EXPECT_FALSE(p.slice.pending());
  ASSERT_TRUE(SameEngine(p.slice, p.twin)) << "after the refused ask()";
  Rounds(p, 2);
}

TEST(ShardSums, ANegativeDistanceInAskIsRefusedAndChangesNothing) {
  Pair p;
  Rounds(p, 3);
  // ask() completes the GP steps' distances, then one flag.
  ExpectAskRefused(p, Fault::negative, 0, Needles({"squared distances from a proxy point"}));
  ExpectAskRefused(p, Fault::flag_two, 0, Needles({"impossible for flags"}));
}

TEST(ShardSums, TheTrustRegionsDistanceIsChecked) {
  Options o = SliceOptions(4);
  o.trust_region = 1e6;  // a safeguard that reads the distance from the iterate, never cuts
  Pair p(o);
  Rounds(p, 3);
  // Each proxy step completes its GP distances, then the safeguard's distance.
  ExpectAskRefused(p, Fault::negative, 1, Needles({"squared distances from the iterate"}));
}

// The history's own push on a slice (GradientHistory::push_all with sums)
// checks its new rows the same way, and a refused push leaves it as it was.
TEST(ShardSums, AHistoryPushOnASliceChecksItsRows) {
  GradientHistory history(4, 10);
  FaultySums sums;
  const std::vector<float> x1(10, 0.5f), g1(10, 1.0f), x2(10, -0.5f), g2(10, 2.0f);
  const float* xs[] = {x1.data(), x2.data()};
  const float* gs[] = {g1.data(), g2.data()};
  history.push_all(xs, gs, BlockPool::serial(), &sums);
  ASSERT_EQ(history.size(), 2u);
  EXPECT_DOUBLE_EQ(history.squared_distance(0, 1), 10.0);
  for (const Fault fault : {Fault::negative, Fault::huge, Fault::inconsistent}) {
    sums.arm(fault);
    const std::uint64_t version = history.version();
    EXPECT_TRUE(ThrowsWith<std::runtime_error>(
        [&] { history.push_all(xs, gs, BlockPool::serial(), &sums); }, kFaulty));
    EXPECT_EQ(history.size(), 2u);
    EXPECT_EQ(history.version(), version);
    EXPECT_DOUBLE_EQ(history.squared_distance(0, 1), 10.0);
    EXPECT_TRUE(BitEqual(history.point(1), x2));
  }
}

// ---- the block grid ---------------------------------------------------------------

TEST(ShardSums, ASliceOffTheBlockGridIsRefused) {
  FaultySums sums;
  const std::size_t d = 3 * kCoordinateBlock + 7;
  const auto make = [&](std::size_t offset, std::size_t size) {
    const std::vector<float> x0(size, 0.5f);
    return Engine(x0, Adam{}, SliceOptions(), CoordinateShard{d, offset, size, &sums});
  };
  const std::vector<std::string> needles = {"shard:", "off the block grid", "4096"};
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { make(5, 100); }, needles));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { make(100, d - 100); }, needles));
  // A whole-block offset, but a partial block that does not end at d.
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { make(kCoordinateBlock, 100); }, needles));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { make(0, kCoordinateBlock + 1); }, needles));
  // On the grid: whole blocks, or a run that ends at d with a partial block.
  EXPECT_NO_THROW(make(0, kCoordinateBlock));
  EXPECT_NO_THROW(make(kCoordinateBlock, 2 * kCoordinateBlock));
  EXPECT_NO_THROW(make(kCoordinateBlock, d - kCoordinateBlock));
  EXPECT_NO_THROW(make(3 * kCoordinateBlock, 7));
  EXPECT_NO_THROW(make(0, d));
  // shard_of's slices are on it.
  for (int w = 1; w <= 3; ++w) {
    for (int r = 0; r < w; ++r) {
      const CoordinateShard s = shard_of(d, w, r);
      EXPECT_NO_THROW(make(s.offset, s.size)) << "W = " << w << ", rank " << r;
    }
  }
  // A whole engine has no grid to keep (its shard is the vector).
  EXPECT_NO_THROW(Engine(std::vector<float>(7, 0.5f), Adam{}, SliceOptions()));
}

}  // namespace
}  // namespace optex::test
