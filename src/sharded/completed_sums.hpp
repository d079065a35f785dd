// What a slice engine checks in the sums and flags its ShardSums completes
// (coordinate_shard.hpp; DESIGN.md section 6, "Promises"). A completion is
// the sum of every slice's partials, so some answers are impossible whatever
// the other slices hold: a negative squared distance or norm, a flag other
// than 0 and 1, a flag that is 1 where this slice's own is 0, a distance from
// a point to itself other than 0, two completions of the same partials that
// differ, values that break Cauchy-Schwarz or the triangle inequality. Each
// check throws std::runtime_error naming the sums and the value, before the
// engine uses it: the callers check where a throw leaves the engine unchanged
// (before anything is written, or inside the commit's restoring try).
//
// Tolerances: two completions of the same quantity from different passes
// (another kernel, another summation order within a block, a bf16 history)
// differ by the float rounding of those passes, at most about 2 * 4096 *
// 2^-24 (5e-4) relative from the float sums within a 4096-coordinate block,
// plus 2 * 2^-9 (4e-3) for values rounded to bf16: kSumsAgreement = 1e-2
// leaves a margin of two and a half. Squares and products below FLT_MIN may
// underflow or be flushed to zero: every squared norm may be short by up to
// d * FLT_MIN, so every inequality allows kUnderflowPerCoordinate * d (8 d
// FLT_MIN) on each squared quantity it reads (inside the square roots).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>

#include "optex/sharded/coordinate_shard.hpp"

namespace optex::detail {

inline constexpr double kSumsAgreement = 1e-2;
inline constexpr double kUnderflowPerCoordinate = 8.0 * FLT_MIN;

// "shard: the sums completed <what>; the ShardSums is faulty".
[[noreturn]] inline void refuse_completion(const std::string& what) {
  throw std::runtime_error("shard: the sums completed " + what +
                           "; the ShardSums is faulty (DESIGN.md section 6: what a slice engine "
                           "checks in its sums)");
}

inline std::string sums_number(double v) {
  std::ostringstream text;
  text.precision(17);
  text << v;
  return text.str();
}

// One completed squared distance or norm (value `index` of `count` of one
// completion, `what` plural): >= 0, and finite unless `may_be_infinite`
// (partials over points not yet checked against the magnitude bound may be
// +inf, or NaN from a NaN point: then only a negative value is impossible).
inline void check_completed_square(double v, std::size_t index, std::size_t count, const char* what,
                                   bool may_be_infinite = false) {
  const bool possible = may_be_infinite ? !(v < 0.0) : v >= 0.0 && std::isfinite(v);
  if (!possible) {
    refuse_completion("value " + std::to_string(index) + " of " + std::to_string(count) + " (" +
                      what + ") to " + sums_number(v) + ", impossible for " + what +
                      (may_be_infinite ? " (>= 0)" : " (finite and >= 0)"));
  }
}

inline void check_completed_squares(std::span<const double> values, const char* what,
                                    bool may_be_infinite = false) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    check_completed_square(values[i], i, values.size(), what, may_be_infinite);
  }
}

// Completed inner products of vectors within the magnitude bound: finite.
inline void check_completed_finite(std::span<const double> values, const char* what) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      refuse_completion("value " + std::to_string(i) + " of " + std::to_string(values.size()) +
                        " (" + what + ") to " + sums_number(values[i]) + ", impossible for " +
                        what + " of vectors within the magnitude bound (finite)");
    }
  }
}

// |a - b| within kSumsAgreement of `scale`, plus `slack`: two completions of
// one quantity by different passes. describe() names it, called only to refuse.
template <class Describe>
void check_agreement(double a, double b, double scale, double slack, const Describe& describe) {
  if (!(std::abs(a - b) <= kSumsAgreement * scale + slack)) {
    refuse_completion(describe() + " to " + sums_number(a) + " and " + sums_number(b) +
                      ", which must agree within a relative " + sums_number(kSumsAgreement));
  }
}

// New rows of the history's statistics, completed in one call: for pair k
// (history slot slot_of(k)) against the `size` slots held,
// distances[k * size + j] = ||x_k - x_j||^2, norms[k] = ||x_k||^2 and
// inner[k * size + j] = <g_k, g_j>. push_of(j) is the pair whose slot is j,
// or -1 for a slot these rows do not renew. Checks what needs no earlier
// call (the statistics the history already holds may come from a snapshot
// whose cached values disagree with its points, which loads; DESIGN.md
// section 6): every value finite, distances, norms and <g_k, g_k> >= 0, the
// distance of x_k to itself exactly 0 (its partials are all exactly 0), and
// between two new pairs: the two completions of their distance and of their
// inner product agree, the triangle inequality and Cauchy-Schwarz. The last
// two on the inner products only with `inner_relations`: the CPU's passes
// bound their rounding by a block (above); a device's inner products may come
// from an fp32 GEMM that accumulates over all of d, with no such bound.
struct GramRows {
  std::size_t pairs = 0;
  std::size_t size = 0;
  const double* distances = nullptr;
  const double* norms = nullptr;
  const double* inner = nullptr;
};

template <class SlotOf, class PushOf>
void check_gram_rows(const GramRows& g, SlotOf slot_of, PushOf push_of, double slack,
                     bool inner_relations = true) {
  const std::size_t size = g.size;
  check_completed_squares({g.distances, g.pairs * size},
                          "squared distances between history points");
  check_completed_squares({g.norms, g.pairs}, "squared norms of history points");
  check_completed_finite({g.inner, g.pairs * size}, "inner products between history gradients");
  const auto diagonal = [&](std::size_t k) { return g.inner[k * size + slot_of(k)]; };
  for (std::size_t k = 0; k < g.pairs; ++k) {
    const std::size_t s = slot_of(k);
    const double self = g.distances[k * size + s];
    if (self != 0.0) {
      refuse_completion("the squared distance of history point " + std::to_string(s) +
                        " to itself to " + sums_number(self) +
                        ", impossible for a distance whose every partial is 0");
    }
    check_completed_square(diagonal(k), k * size + s, g.pairs * size,
                           "squared norms of history gradients (the Gram diagonal)");
  }
  const double root_slack = std::sqrt(slack);
  for (std::size_t k = 0; k < g.pairs; ++k) {
    const std::size_t s = slot_of(k);
    const double gk = diagonal(k);
    for (std::size_t j = 0; j < size; ++j) {
      const std::ptrdiff_t other = push_of(j);
      if (other < 0 || static_cast<std::size_t>(other) <= k) continue;
      const auto m = static_cast<std::size_t>(other);
      const auto pair = [&] {
        return "history slots " + std::to_string(s) + " and " + std::to_string(j);
      };
      const double d1 = g.distances[k * size + j], d2 = g.distances[m * size + s];
      check_agreement(d1, d2, std::max(d1, d2), slack, [&] {
        return "the squared distance between " + pair() + " (completed twice)";
      });
      const double i1 = g.inner[k * size + j], i2 = g.inner[m * size + s];
      const double gm = diagonal(m);
      const double bound = std::sqrt((gk + slack) * (gm + slack));
      if (inner_relations) {
        check_agreement(i1, i2, bound, 2.0 * slack, [&] {
          return "the gradients' inner product between " + pair() + " (completed twice)";
        });
        if (!(std::abs(i1) <= (1.0 + kSumsAgreement) * bound)) {
          refuse_completion("the gradients' inner product between " + pair() + " to " +
                            sums_number(i1) + " with squared norms " + sums_number(gk) + " and " +
                            sums_number(gm) + ", impossible by Cauchy-Schwarz");
        }
      }
      const double r = std::sqrt(d1), a = std::sqrt(g.norms[k]), b = std::sqrt(g.norms[m]);
      if (!(r <= (1.0 + kSumsAgreement) * (a + b) + 3.0 * root_slack &&
            std::abs(a - b) <= r + kSumsAgreement * (a + b) + 3.0 * root_slack)) {
        refuse_completion("the squared distance between " + pair() + " to " + sums_number(d1) +
                          " with squared norms " + sums_number(g.norms[k]) + " and " +
                          sums_number(g.norms[m]) + ", impossible by the triangle inequality");
      }
    }
  }
}

// Flags completed by ShardSums::all (`mine` before the call, any nonzero
// counting as 1): each must be 0 or 1, and 0 where this slice's is 0 (the AND
// of every slice's flags).
template <class Mine>
void check_completed_flags(std::span<const char> completed, const Mine& mine, const char* what) {
  for (std::size_t i = 0; i < completed.size(); ++i) {
    const int f = static_cast<unsigned char>(completed[i]);
    if (f != 0 && f != 1) {
      refuse_completion("flag " + std::to_string(i) + " of " + std::to_string(completed.size()) +
                        " (" + what + ") to " + std::to_string(f) +
                        ", impossible for flags (ShardSums::all completes to 0 or 1)");
    }
    if (f == 1 && mine[i] == 0) {
      refuse_completion("flag " + std::to_string(i) + " of " + std::to_string(completed.size()) +
                        " (" + what +
                        ") to 1 where this slice's is 0, impossible for ShardSums::all (1 only "
                        "where every slice's flag is 1)");
    }
  }
}

// on_every_slice() with its completion checked.
inline bool checked_on_every_slice(ShardSums* sums, bool mine, const char* what) {
  if (sums == nullptr) return mine;
  char flag = mine ? 1 : 0;
  const char before = flag;
  sums->all({&flag, 1});
  check_completed_flags(std::span<const char>(&flag, 1), &before, what);
  return flag != 0;
}

}  // namespace optex::detail
