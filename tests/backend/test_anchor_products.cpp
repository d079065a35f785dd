// The CPU's anchor_products (device_primitives.hpp, streaming.hpp): every
// output against a long double reference computed from the definitions,
// within 1e-12 of the sum of its terms' magnitudes; relative accuracy kept
// far from the origin; non-finite values reaching exactly the outputs that
// read them; the same bits on 1, 2 and 3 threads and through the deferred
// wrapper; a fresh index outside the history refused with nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/backend/device_primitives.hpp"
#include "support/deferred_primitives.hpp"

namespace {

using optex::kCoordinateBlock;
using optex::detail::AnchorLayout;
using optex::detail::Storage;
using optex::detail::StoredRows;

// The inputs of one call: n rows of points X and gradients G (row-major,
// n x d), the anchor a, the momentum m (empty: null) and the fresh rows.
struct Inputs {
  std::size_t n = 0;
  std::size_t d = 0;
  std::vector<float> X, G, a, m;
  std::vector<int> fresh;
};

Inputs RandomInputs(std::size_t n, std::size_t d, std::size_t fresh_count, bool momentum,
                    std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = u(rng);
    return v;
  };
  Inputs in;
  in.n = n;
  in.d = d;
  in.X = fill(n * d);
  in.G = fill(n * d);
  in.a = fill(d);
  if (momentum) in.m = fill(d);
  // One fresh row: the last; all: in reverse order, so a mix-up of k and t shows.
  for (std::size_t k = 0; k < fresh_count; ++k)
    in.fresh.push_back(static_cast<int>(fresh_count == 1 ? n - 1 : n - 1 - k));
  return in;
}

const float* MomentumOf(const Inputs& in) { return in.m.empty() ? nullptr : in.m.data(); }

StoredRows Rows(const std::vector<float>& v) {
  return {const_cast<float*>(v.data()), Storage::fp32};
}

std::vector<double> Run(optex::detail::DevicePrimitives& p, const Inputs& in) {
  std::vector<double> out(AnchorLayout(in.n, in.fresh.size()).size(), -7.0);
  p.anchor_products(Rows(in.X), Rows(in.G), in.n, in.d, in.a.data(), MomentumOf(in), in.fresh,
                    out.data());
  return out;
}

std::vector<double> RunCpu(const Inputs& in, int threads = 1) {
  const auto cpu = optex::detail::make_cpu_primitives(threads);
  return Run(*cpu, in);
}

// Each output in long double straight from its definition, with the sum of
// its terms' magnitudes: the scale its rounding error is measured against.
struct Reference {
  std::vector<long double> value;
  std::vector<long double> magnitude;
};

Reference ReferenceOf(const Inputs& in) {
  const std::size_t n = in.n, d = in.d, F = in.fresh.size();
  const AnchorLayout at(n, F);
  Reference ref{std::vector<long double>(at.size(), 0.0L),
                std::vector<long double>(at.size(), 0.0L)};
  auto x = [&](std::size_t j, std::size_t i) -> long double { return in.X[j * d + i]; };
  auto g = [&](std::size_t j, std::size_t i) -> long double { return in.G[j * d + i]; };
  auto a = [&](std::size_t i) -> long double { return in.a[i]; };
  auto m = [&](std::size_t i) -> long double { return in.m.empty() ? 0.0L : in.m[i]; };
  auto add = [&](std::size_t k, long double term) {
    ref.value[k] += term;
    ref.magnitude[k] += std::fabs(term);
  };
  for (std::size_t i = 0; i < d; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      const long double diff = a(i) - x(j, i);
      add(at.e() + j, diff * diff);
      add(at.f() + j, m(i) * diff);
      add(at.q() + j, a(i) * diff);
      add(at.h() + j, m(i) * g(j, i));
      add(at.s() + j, g(j, i) * diff);
      add(at.r() + j, a(i) * g(j, i));
    }
    add(at.scalars() + 0, m(i) * m(i));
    add(at.scalars() + 1, a(i) * m(i));
    add(at.scalars() + 2, a(i) * a(i));
    for (std::size_t k = 0; k < F; ++k) {
      const auto t = static_cast<std::size_t>(in.fresh[k]);
      for (std::size_t j = 0; j < n; ++j) {
        add(at.rows() + k * n + j, g(t, i) * (x(t, i) - x(j, i)));
        add(at.cols() + k * n + j, g(j, i) * (x(j, i) - x(t, i)));
      }
    }
  }
  return ref;
}

// Which output index k is, for messages.
std::string NameOf(std::size_t k, std::size_t n, std::size_t F) {
  const AnchorLayout at(n, F);
  static const char* const kPerRow[] = {"e", "f", "q", "h", "s", "r"};
  if (k < at.scalars()) return std::string(kPerRow[k / n]) + "[" + std::to_string(k % n) + "]";
  if (k < at.rows()) return "scalars[" + std::to_string(k - at.scalars()) + "]";
  const bool rows = k < at.cols();
  const std::size_t i = k - (rows ? at.rows() : at.cols());
  return std::string(rows ? "rows" : "cols") + "[" + std::to_string(i / n) + "*n+" +
         std::to_string(i % n) + "]";
}

constexpr long double kRelative = 1e-12L;

// Every output within kRelative of its terms' magnitudes from the reference.
::testing::AssertionResult MatchesReference(const Inputs& in, const std::vector<double>& got) {
  const Reference ref = ReferenceOf(in);
  if (got.size() != ref.value.size()) {
    return ::testing::AssertionFailure() << got.size() << " outputs, expected " << ref.value.size();
  }
  for (std::size_t k = 0; k < got.size(); ++k) {
    const long double error = std::fabs(static_cast<long double>(got[k]) - ref.value[k]);
    if (!(error <= kRelative * ref.magnitude[k])) {
      return ::testing::AssertionFailure()
             << NameOf(k, in.n, in.fresh.size()) << " = " << got[k] << ", reference "
             << static_cast<double>(ref.value[k]) << " (error " << static_cast<double>(error)
             << ", allowed " << static_cast<double>(kRelative * ref.magnitude[k]) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (std::memcmp(&a[k], &b[k], sizeof(double)) != 0) {
      return ::testing::AssertionFailure() << "output " << k << ": " << a[k] << " vs " << b[k];
    }
  }
  return ::testing::AssertionSuccess();
}

// Rows below 4, odd, and over 32; d below a block, at its edges and over
// several blocks with a tail; no fresh row, one, all; with and without m.
TEST(AnchorProducts, EveryOutputMatchesTheLongDoubleReference) {
  const std::size_t dims[] = {1, 5, kCoordinateBlock - 1, kCoordinateBlock + 3,
                              3 * kCoordinateBlock + 17};
  std::uint64_t seed = 1;
  for (const std::size_t n : {1u, 2u, 7u, 33u}) {
    for (const std::size_t d : dims) {
      for (const std::size_t F : {std::size_t{0}, std::size_t{1}, n}) {
        for (const bool momentum : {false, true}) {
          SCOPED_TRACE("n " + std::to_string(n) + " d " + std::to_string(d) + " F " +
                       std::to_string(F) + (momentum ? " with m" : " without m"));
          const Inputs in = RandomInputs(n, d, F, momentum, seed++);
          const std::vector<double> got = RunCpu(in);
          ASSERT_TRUE(MatchesReference(in, got));
          const AnchorLayout at(n, F);
          if (!momentum) {
            // Without m its products are exactly 0.
            for (std::size_t j = 0; j < n; ++j) {
              EXPECT_EQ(got[at.f() + j], 0.0);
              EXPECT_EQ(got[at.h() + j], 0.0);
            }
            EXPECT_EQ(got[at.scalars() + 0], 0.0);
            EXPECT_EQ(got[at.scalars() + 1], 0.0);
          }
          // A row against itself: every term is exactly 0.
          for (std::size_t k = 0; k < F; ++k) {
            const auto t = static_cast<std::size_t>(in.fresh[k]);
            EXPECT_EQ(got[at.rows() + k * n + t], 0.0);
            EXPECT_EQ(got[at.cols() + k * n + t], 0.0);
          }
        }
      }
    }
  }
}

// Points ~1e4 from the origin a few float ulps (~1e-3) apart, gradients of
// 1e-20 and 1e20: every output keeps its relative accuracy, where the naive
// ||a||^2 - 2 <a, X_j> + ||X_j||^2 in double loses e[j] entirely.
TEST(AnchorProducts, KeepsRelativeAccuracyFarFromTheOrigin) {
  constexpr std::size_t n = 5, d = 2 * kCoordinateBlock + 9;
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> base(1.0e4f, 1.5e4f);
  std::uniform_int_distribution<int> ulps(-8, 8);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> centre(d);
  for (float& c : centre) c = (unit(rng) < 0 ? -1.0f : 1.0f) * base(rng);
  auto near_centre = [&](std::size_t i) {
    float v = centre[i];
    const int steps = ulps(rng);
    for (int s = 0; s < std::abs(steps); ++s)
      v = std::nextafter(v, steps > 0 ? std::numeric_limits<float>::infinity()
                                      : -std::numeric_limits<float>::infinity());
    return v;
  };
  Inputs in;
  in.n = n;
  in.d = d;
  in.X.resize(n * d);
  in.G.resize(n * d);
  in.a.resize(d);
  in.m.resize(d);
  for (std::size_t i = 0; i < d; ++i) {
    in.a[i] = near_centre(i);
    in.m[i] = unit(rng);
    for (std::size_t j = 0; j < n; ++j) {
      in.X[j * d + i] = near_centre(i);
      // Rows alternate between gradients of 1e-20 and of 1e20.
      in.G[j * d + i] = unit(rng) * (j % 2 == 0 ? 1e-20f : 1e20f);
    }
  }
  in.fresh = {4, 1};
  const std::vector<double> got = RunCpu(in);
  ASSERT_TRUE(MatchesReference(in, got));

  // The test's geometry is hostile: the expanded form in double is far off.
  const Reference ref = ReferenceOf(in);
  const AnchorLayout at(n, in.fresh.size());
  for (std::size_t j = 0; j < n; ++j) {
    double aa = 0.0, ax = 0.0, xx = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double ai = in.a[i], xi = in.X[j * d + i];
      aa += ai * ai;
      ax += ai * xi;
      xx += xi * xi;
    }
    const double naive = aa - 2.0 * ax + xx;
    const long double exact = ref.value[at.e() + j];
    ASSERT_GT(exact, 0.0L);
    EXPECT_GT(std::fabs(naive - exact) / exact, 1e-6L) << "row " << j << ": naive " << naive;
    EXPECT_LE(std::fabs(got[at.e() + j] - exact) / exact, kRelative) << "row " << j;
  }
}

// What a non-finite value poisons: the outputs that read the poisoned
// coordinate, from the definitions (momentum present).
enum class Poisoned { point, gradient, anchor, momentum };

std::set<std::size_t> OutputsThatRead(Poisoned what, std::size_t row, const Inputs& in) {
  const std::size_t n = in.n, F = in.fresh.size();
  const AnchorLayout at(n, F);
  std::set<std::size_t> reads;
  auto all_rows = [&](std::size_t offset) {
    for (std::size_t j = 0; j < n; ++j) reads.insert(offset + j);
  };
  switch (what) {
    case Poisoned::point:  // X_row: its anchored products, and every pair with it
      for (const std::size_t o : {at.e(), at.f(), at.q(), at.s()}) reads.insert(o + row);
      for (std::size_t k = 0; k < F; ++k) {
        reads.insert(at.rows() + k * n + row);
        reads.insert(at.cols() + k * n + row);
        if (static_cast<std::size_t>(in.fresh[k]) == row) {
          all_rows(at.rows() + k * n);
          all_rows(at.cols() + k * n);
        }
      }
      break;
    case Poisoned::gradient:  // G_row: h, s, r of its row, its cols, and rows when fresh
      for (const std::size_t o : {at.h(), at.s(), at.r()}) reads.insert(o + row);
      for (std::size_t k = 0; k < F; ++k) {
        reads.insert(at.cols() + k * n + row);
        if (static_cast<std::size_t>(in.fresh[k]) == row) all_rows(at.rows() + k * n);
      }
      break;
    case Poisoned::anchor:
      for (const std::size_t o : {at.e(), at.f(), at.q(), at.s(), at.r()}) all_rows(o);
      reads.insert(at.scalars() + 1);
      reads.insert(at.scalars() + 2);
      break;
    case Poisoned::momentum:
      all_rows(at.f());
      all_rows(at.h());
      reads.insert(at.scalars() + 0);
      reads.insert(at.scalars() + 1);
      break;
  }
  return reads;
}

TEST(AnchorProducts, NonFiniteValuesReachExactlyTheOutputsThatReadThem) {
  constexpr std::size_t n = 4, d = kCoordinateBlock + 7;
  constexpr std::size_t coordinate = kCoordinateBlock + 2;  // in the second block
  constexpr std::size_t row = 2;
  const float values[] = {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  const char* const names[] = {"point", "gradient", "anchor", "momentum"};
  for (const Poisoned what :
       {Poisoned::point, Poisoned::gradient, Poisoned::anchor, Poisoned::momentum}) {
    for (const float bad : values) {
      // Row 2 fresh and not (row 0 fresh too), so both kinds of pairs are read.
      Inputs in = RandomInputs(n, d, 0, true, 7);
      in.fresh = {0, static_cast<int>(row)};
      switch (what) {
        case Poisoned::point:
          in.X[row * d + coordinate] = bad;
          break;
        case Poisoned::gradient:
          in.G[row * d + coordinate] = bad;
          break;
        case Poisoned::anchor:
          in.a[coordinate] = bad;
          break;
        case Poisoned::momentum:
          in.m[coordinate] = bad;
          break;
      }
      SCOPED_TRACE(std::string(names[static_cast<int>(what)]) + " = " + std::to_string(bad));
      const std::vector<double> got = RunCpu(in);
      const std::set<std::size_t> reads = OutputsThatRead(what, row, in);
      for (std::size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(std::isfinite(got[k]), reads.count(k) == 0)
            << NameOf(k, n, in.fresh.size()) << " = " << got[k];
      }
      // And the outputs that stay finite are still right.
      const Reference ref = ReferenceOf(in);
      for (std::size_t k = 0; k < got.size(); ++k) {
        if (reads.count(k) != 0) continue;
        EXPECT_LE(std::fabs(got[k] - ref.value[k]), kRelative * ref.magnitude[k])
            << NameOf(k, n, in.fresh.size());
      }
    }
  }
}

// The per-block partials add up in block order: the same bits on 1, 2 and 3
// threads (d large enough that the pool splits the blocks).
TEST(AnchorProducts, SameBitsOnAnyThreadCount) {
  const Inputs in = RandomInputs(33, 16 * kCoordinateBlock + 5, 4, true, 99);
  const std::vector<double> one = RunCpu(in, 1);
  ASSERT_TRUE(MatchesReference(in, one));
  EXPECT_TRUE(SameBits(one, RunCpu(in, 2)));
  EXPECT_TRUE(SameBits(one, RunCpu(in, 3)));
}

// No rows: the three scalars only; no coordinates: zeros everywhere.
TEST(AnchorProducts, EmptyHistoryOrDimension) {
  Inputs rowless = RandomInputs(0, 9, 0, true, 3);
  const std::vector<double> scalars = RunCpu(rowless);
  ASSERT_EQ(scalars.size(), 3u);
  EXPECT_TRUE(MatchesReference(rowless, scalars));

  const Inputs empty = RandomInputs(3, 0, 3, true, 4);
  const std::vector<double> zeros = RunCpu(empty);
  ASSERT_EQ(zeros.size(), AnchorLayout(3, 3).size());
  for (const double v : zeros) EXPECT_EQ(v, 0.0);
}

// A fresh index outside [0, n) is refused before anything is written, and
// the message names it; the deferred wrapper refuses it at the call.
TEST(AnchorProducts, RefusesAFreshIndexOutsideTheHistory) {
  constexpr double kSentinel = -12345.678;
  for (const std::vector<int>& fresh :
       {std::vector<int>{0, 3}, std::vector<int>{-1}, std::vector<int>{1, 2, 100}}) {
    Inputs in = RandomInputs(3, kCoordinateBlock + 1, 0, true, 5);
    in.fresh = fresh;
    const int bad = fresh.back();
    std::vector<double> out(AnchorLayout(in.n, fresh.size()).size(), kSentinel);
    const std::vector<double> before = out;
    const auto cpu = optex::detail::make_cpu_primitives(2);
    try {
      cpu->anchor_products(Rows(in.X), Rows(in.G), in.n, in.d, in.a.data(), in.m.data(), fresh,
                           out.data());
      ADD_FAILURE() << "fresh index " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("= " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(SameBits(before, out));

    optex::test::DeferredPrimitives deferred(optex::detail::make_cpu_primitives(1));
    EXPECT_THROW(deferred.anchor_products(Rows(in.X), Rows(in.G), in.n, in.d, in.a.data(),
                                          in.m.data(), fresh, out.data()),
                 std::invalid_argument);
    EXPECT_EQ(deferred.pending(), 0u);
    EXPECT_TRUE(SameBits(before, out));
  }
}

// bf16 storage is a CUDA device's: the CPU refuses it, writing nothing.
TEST(AnchorProducts, CpuRefusesBf16Rows) {
  const Inputs in = RandomInputs(2, 8, 1, true, 6);
  std::vector<double> out(AnchorLayout(2, 1).size(), 3.0);
  const auto cpu = optex::detail::make_cpu_primitives(1);
  const StoredRows bf16{const_cast<float*>(in.X.data()), Storage::bf16};
  EXPECT_THROW(
      cpu->anchor_products(bf16, bf16, in.n, in.d, in.a.data(), in.m.data(), in.fresh, out.data()),
      std::logic_error);
  for (const double v : out) EXPECT_EQ(v, 3.0);
}

// Queued: poison until the fetch, then the direct call's bits; `fresh` is
// read at the call, so changing it afterwards changes nothing.
TEST(AnchorProducts, DeferredGivesTheDirectBitsAtTheFetch) {
  const Inputs in = RandomInputs(7, 2 * kCoordinateBlock + 3, 7, true, 8);
  const std::vector<double> direct = RunCpu(in, 2);

  optex::test::DeferredPrimitives deferred(optex::detail::make_cpu_primitives(2));
  const std::size_t count = AnchorLayout(in.n, in.fresh.size()).size();
  double* out = deferred.doubles(count);
  std::vector<int> fresh = in.fresh;
  deferred.anchor_products(Rows(in.X), Rows(in.G), in.n, in.d, in.a.data(), in.m.data(), fresh,
                           out);
  EXPECT_TRUE(std::isnan(out[0])) << "readable before the fetch";
  fresh.assign(fresh.size(), 0);  // the host's copy may change once the call returns
  std::vector<double> fetched(count);
  const optex::detail::Fetch values[] = {optex::detail::fetch_of(out, fetched.data(), count)};
  deferred.fetch(values);
  EXPECT_TRUE(SameBits(direct, fetched));
}

}  // namespace
