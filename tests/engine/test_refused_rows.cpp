// Engine::tell(..., NonfiniteRows::refuse): an inadmissible row (a gradient
// not finite or above the magnitude bound, or a loss not finite) refuses the
// whole tell with RefusedRowsError naming exactly those rows; the engine is
// unchanged bit for bit and a retry commits as if the refused call had never
// been made; and the rows are checked once per tell (the commit's own check,
// no pass of the caller's before it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optex/backend/device_primitives.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/engine/options.hpp"
#include "optex/engine/refused_rows.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "support/engine_equality.hpp"
#include "support/faulty_primitives.hpp"
#include "support/test_support.hpp"

namespace optex {
namespace {

using test::BitEqual;
using test::FaultControl;
using test::FaultyPrimitives;
using test::Quartic;
using test::SameEngine;
using test::UniformStart;
using test::WithN;

constexpr std::size_t kDim = 12;
constexpr int kN = 4;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void Evaluate(Batch& b) {
  const Quartic f;
  for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
}

// Rounds of ask, evaluate, tell (dropping, the default).
void Rounds(Engine& engine, int rounds) {
  for (int t = 0; t < rounds; ++t) {
    Batch& b = engine.ask();
    Evaluate(b);
    engine.tell(b);
  }
}

// One value made inadmissible: gradient element (row, column) := value, or,
// with column < 0, the loss of the row := value.
struct Corruption {
  int row;
  int column;
  double value;
};

struct RefusalCase {
  std::string name;
  std::vector<Corruption> corruptions;
  std::vector<int> refused;  // the rows, ascending
};

std::vector<RefusalCase> Cases(int rows) {
  const double huge = 2.0 * static_cast<double>(magnitude_bound(kDim));
  const int last = rows - 1;
  std::vector<Corruption> every_row;
  std::vector<int> all;
  for (int r = 0; r < rows; ++r) {
    every_row.push_back({r, r % static_cast<int>(kDim), r % 2 == 0 ? kNaN : -kInf});
    all.push_back(r);
  }
  return {
      {"NaN gradient in row 1", {{1, 3, kNaN}}, {1}},
      {"+inf gradient in row 2", {{2, 0, kInf}}, {2}},
      {"gradient beyond the bound in row 1", {{1, kDim - 1, huge}}, {1}},
      {"-(beyond the bound) in the last row", {{last, 5, -huge}}, {last}},
      {"NaN loss with a finite gradient in row 2", {{2, -1, kNaN}}, {2}},
      {"inf loss in row 1", {{1, -1, std::numeric_limits<double>::infinity()}}, {1}},
      {"first and last rows", {{0, 2, kNaN}, {last, -1, kNaN}}, {0, last}},
      {"every row", every_row, all},
  };
}

void Corrupt(Batch& b, const std::vector<Corruption>& corruptions) {
  for (const Corruption& c : corruptions) {
    if (c.column < 0) {
      b.loss(c.row) = c.value;
    } else {
      b.grad(c.row)[static_cast<std::size_t>(c.column)] = static_cast<float>(c.value);
    }
  }
}

std::vector<float> Copy(std::span<const float> v) { return {v.begin(), v.end()}; }

bool SameLosses(std::span<const double> a, std::span<const double> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// The engine's observable state and the pending batch's rows, bit for bit.
struct Before {
  explicit Before(Engine& engine, Batch& b)
      : grads(Copy(b.grads())),
        losses(b.losses().begin(), b.losses().end()),
        rng(engine.rng_state()),
        iteration(engine.iteration()) {}
  std::vector<float> grads;
  std::vector<double> losses;
  std::uint64_t rng;
  std::int64_t iteration;
};

void ExpectUnchanged(Engine& engine, const Engine& twin, Batch& b, const Before& before) {
  EXPECT_TRUE(SameEngine(engine, twin));  // iterate, state, history, RNG, counters
  EXPECT_TRUE(engine.pending());
  EXPECT_EQ(engine.iteration(), before.iteration);
  EXPECT_EQ(engine.rng_state(), before.rng);
  EXPECT_TRUE(BitEqual(b.grads(), before.grads)) << "batch gradient rows";
  EXPECT_TRUE(SameLosses(b.losses(), before.losses)) << "batch losses";
}

// The twin commits its own pending round with good rows, as the engine's
// retry just did: both are then the same engine, and stay so for `rounds`
// more rounds, bit for bit.
void ExpectTwinAfterTheRetry(Engine& engine, Engine& twin, int rounds) {
  Batch& tb = twin.ask();
  Evaluate(tb);
  twin.tell(tb);
  ASSERT_TRUE(SameEngine(engine, twin));
  for (int t = 0; t < rounds; ++t) {
    Rounds(engine, 1);
    Rounds(twin, 1);
    ASSERT_TRUE(SameEngine(engine, twin)) << "round " << t;
  }
}

// Options with one evaluation per point, or `evaluations` per point (a chain).
Options WithEvaluations(int evaluations) {
  Options o = WithN(kN, 7);
  o.evaluations_per_point = evaluations;
  return o;
}

void RefusesExactlyTheBadRows(const Options& o) {
  const std::vector<float> x0 = UniformStart(kDim, 21);
  for (const RefusalCase& c : Cases(kN)) {
    SCOPED_TRACE(c.name);
    Engine engine(x0, Adam{.lr = 0.02}, o);
    Engine twin(x0, Adam{.lr = 0.02}, o);  // never sees the refused call
    Rounds(engine, 3);
    Rounds(twin, 3);
    Batch& b = engine.ask();
    Evaluate(b);
    const std::vector<float> good_grads = Copy(b.grads());
    const std::vector<double> good_losses(b.losses().begin(), b.losses().end());
    Corrupt(b, c.corruptions);
    twin.ask();
    const Before before(engine, b);
    try {
      engine.tell(b, {}, NonfiniteRows::refuse);
      ADD_FAILURE() << "tell accepted inadmissible rows";
    } catch (const RefusedRowsError& e) {
      EXPECT_EQ(e.rows(), c.refused);
      EXPECT_NE(std::string(e.what()).find("nothing was committed"), std::string::npos) << e.what();
    }
    ExpectUnchanged(engine, twin, b, before);
    // The query names the same rows: one rule.
    EXPECT_EQ(engine.nonfinite_points(b), c.refused);

    // A refused call again (a retry with the same bad rows) is refused alike.
    EXPECT_THROW(engine.tell(b, {}, NonfiniteRows::refuse), RefusedRowsError);
    ExpectUnchanged(engine, twin, b, before);

    // The retry with good rows commits as the twin that never saw the bad call.
    std::copy(good_grads.begin(), good_grads.end(), b.grads().begin());
    std::copy(good_losses.begin(), good_losses.end(), b.losses().begin());
    const IterationInfo& info = engine.tell(b, {}, NonfiniteRows::refuse);
    EXPECT_EQ(info.dropped, 0);
    ExpectTwinAfterTheRetry(engine, twin, 3);
  }
}

TEST(RefusedRows, RefusesExactlyTheBadRowsAndChangesNothing) {
  RefusesExactlyTheBadRows(WithEvaluations(1));
}

// With several evaluations per point the rows refused are the evaluation
// rows (what nonfinite_points names), not the points.
TEST(RefusedRows, WithSeveralEvaluationsPerPointTheRowsAreTheEvaluations) {
  RefusesExactlyTheBadRows(WithEvaluations(2));
}

// In refuse mode a batch with admissible rows commits exactly as in drop mode.
TEST(RefusedRows, AdmissibleRowsCommitAsInDropMode) {
  const std::vector<float> x0 = UniformStart(kDim, 22);
  for (const int evaluations : {1, 2}) {
    SCOPED_TRACE(evaluations);
    const Options o = WithEvaluations(evaluations);
    Engine refusing(x0, Adam{.lr = 0.02}, o);
    Engine dropping(x0, Adam{.lr = 0.02}, o);
    for (int t = 0; t < 5; ++t) {
      Batch& a = refusing.ask();
      Evaluate(a);
      refusing.tell(a, {}, NonfiniteRows::refuse);
      Batch& b = dropping.ask();
      Evaluate(b);
      dropping.tell(b);
      ASSERT_TRUE(SameEngine(refusing, dropping)) << "round " << t;
    }
  }
}

// Drop mode is unchanged: the same bad rows are dropped, and the commit goes on.
TEST(RefusedRows, DropModeStillDrops) {
  const std::vector<float> x0 = UniformStart(kDim, 23);
  Engine engine(x0, Adam{.lr = 0.02}, WithN(kN, 7));
  Rounds(engine, 2);
  Batch& b = engine.ask();
  Evaluate(b);
  b.grad(1)[0] = kNaN;
  EXPECT_EQ(engine.tell(b).dropped, 1);
  EXPECT_EQ(engine.iteration(), 3);
}

// The flat overload: a refusal restores the rows and losses it wrote; every
// row bad is a refusal too (drop mode's "nothing to commit" is a different
// error), and the retry commits as a twin that never saw the bad call.
TEST(RefusedRows, FlatTellRefusesAndRestoresTheBatch) {
  const std::vector<float> x0 = UniformStart(kDim, 24);
  const Options o = WithN(kN, 7);
  for (const RefusalCase& c : Cases(kN)) {
    SCOPED_TRACE(c.name);
    Engine engine(x0, Adam{.lr = 0.02}, o);
    Engine twin(x0, Adam{.lr = 0.02}, o);
    Rounds(engine, 2);
    Rounds(twin, 2);
    Batch& b = engine.ask();
    Evaluate(b);  // good rows in the batch, bad ones in the caller's arrays
    std::vector<float> grads = Copy(b.grads());
    std::vector<double> losses(b.losses().begin(), b.losses().end());
    const std::vector<float> good_grads = grads;
    const std::vector<double> good_losses = losses;
    for (const Corruption& k : c.corruptions) {
      if (k.column < 0) {
        losses[static_cast<std::size_t>(k.row)] = k.value;
      } else {
        grads[static_cast<std::size_t>(k.row) * kDim + static_cast<std::size_t>(k.column)] =
            static_cast<float>(k.value);
      }
    }
    twin.ask();
    const Before before(engine, b);
    try {
      engine.tell(grads, losses, {}, NonfiniteRows::refuse);
      ADD_FAILURE() << "tell accepted inadmissible rows";
    } catch (const RefusedRowsError& e) {
      EXPECT_EQ(e.rows(), c.refused);
    }
    ExpectUnchanged(engine, twin, b, before);
    engine.tell(good_grads, good_losses, {}, NonfiniteRows::refuse);
    ExpectTwinAfterTheRetry(engine, twin, 2);
  }
}

// The other refusals come first and keep their types.
TEST(RefusedRows, StaleForeignAndBadRangesAreRefusedAsBefore) {
  const std::vector<float> x0 = UniformStart(kDim, 25);
  Engine engine(x0, Adam{.lr = 0.02}, WithN(kN, 7));
  Engine other(x0, Adam{.lr = 0.02}, WithN(kN, 7));
  Batch& b = engine.ask();
  Evaluate(b);
  b.grad(0)[0] = kNaN;
  other.ask();
  Batch& foreign = other.ask();
  EXPECT_THROW(engine.tell(foreign, {}, NonfiniteRows::refuse), std::invalid_argument);
  const std::vector<CoordinateRange> outside = {{kDim, 1}};
  try {
    engine.tell(b, outside, NonfiniteRows::refuse);
    ADD_FAILURE() << "a range outside the dimension was accepted";
  } catch (const RefusedRowsError&) {
    ADD_FAILURE() << "the range is checked before the rows";
  } catch (const std::invalid_argument&) {
  }
  Batch& good = engine.ask();
  Evaluate(good);
  engine.tell(good, {}, NonfiniteRows::refuse);
  EXPECT_THROW(engine.tell(good, {}, NonfiniteRows::refuse), std::runtime_error);  // not pending
}

// The rows are checked once per tell: a refused tell runs one within_bound
// pass (the commit's check, then it throws), an admitted one runs exactly as
// many as a tell in drop mode, and the former pattern (nonfinite_points, then
// tell) would have run one more.
TEST(RefusedRows, TheRowsAreCheckedOncePerTell) {
  FaultControl control;
  const detail::ScopedPrimitives scope(&FaultyPrimitives::factory, &control);
  const auto within_bound_calls = [&] {
    const std::vector<const char*>& names = control.names();
    return std::count_if(names.begin(), names.end(),
                         [](const char* name) { return std::string(name) == "within_bound"; });
  };
  const auto counted = [&](auto&& call) {
    control.reset();
    control.log = true;
    call();
    control.log = false;
    return within_bound_calls();
  };
  const std::vector<float> x0 = UniformStart(kDim, 26);
  // The CPU's primitives, and deferred ones (a device's late results).
  for (const auto& [deferred, evaluations] :
       {std::pair{false, 1}, std::pair{false, 2}, std::pair{true, 1}, std::pair{true, 2}}) {
    SCOPED_TRACE(std::string(deferred ? "deferred" : "cpu") + ", evaluations per point " +
                 std::to_string(evaluations));
    control.deferred = deferred;
    const Options o = WithEvaluations(evaluations);
    Engine refusing(x0, Adam{.lr = 0.02}, o);
    Engine dropping(x0, Adam{.lr = 0.02}, o);
    Rounds(refusing, 3);
    Rounds(dropping, 3);

    Batch& b = refusing.ask();
    Evaluate(b);
    const float kept = b.grad(2)[1];
    b.grad(2)[1] = kNaN;
    const auto refused = counted(
        [&] { EXPECT_THROW(refusing.tell(b, {}, NonfiniteRows::refuse), RefusedRowsError); });
    EXPECT_EQ(refused, 1) << "within_bound passes of a refused tell";
    const auto query = counted([&] { refusing.nonfinite_points(b); });
    EXPECT_EQ(query, 1) << "within_bound passes of nonfinite_points (what a pre-check costs)";
    b.grad(2)[1] = kept;
    const auto refuse_mode = counted([&] { refusing.tell(b, {}, NonfiniteRows::refuse); });

    Batch& d = dropping.ask();
    Evaluate(d);
    const auto drop_mode = counted([&] { dropping.tell(d); });
    EXPECT_EQ(refuse_mode, drop_mode) << "within_bound passes of an admitted tell";
    EXPECT_GE(drop_mode, 1);
    const FaultControl::Pause pause(control);
    EXPECT_TRUE(SameEngine(refusing, dropping));
  }
}

}  // namespace
}  // namespace optex
