#include "optex/backend/streaming.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/device_primitives.hpp"

// Every pass reads kRows history rows side by side, so the hardware prefetchers
// see a few long sequential streams (plus the query block). One row at a time
// restarts a short stream at every block; all T0 rows at once (a plain GEMV)
// is more streams than the prefetchers track. Both measured about 2x slower
// (bench/results/cpu-estimator-2026-11-22.md).
//
// A reduction writes one partial per (block, output) into the caller's
// scratch and adds them up in block order afterwards, so the threads only
// decide who computes a partial, never how the partials are added.
namespace optex::streaming {
namespace {

constexpr std::size_t kBlock = kCoordinateBlock;
constexpr std::size_t kRows = 4;

using Packet = Eigen::internal::packet_traits<float>::type;
constexpr std::size_t kLanes =
    static_cast<std::size_t>(Eigen::internal::packet_traits<float>::size);

std::size_t block_length(std::size_t block, std::size_t dim) {
  return std::min(kBlock, dim - block * kBlock);
}

// The partials of the calling thread's current pass: blocks x outputs doubles.
double* partials(std::size_t blocks, std::size_t outputs) {
  thread_local std::vector<double> scratch;
  if (scratch.size() < blocks * outputs) scratch.resize(blocks * outputs);
  std::fill(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(blocks * outputs), 0.0);
  return scratch.data();
}

// out[k] = sum over blocks b, in order, of partial[b * outputs + k].
void sum_blocks(const double* partial, std::size_t blocks, std::size_t outputs, double* out) {
  std::fill(out, out + outputs, 0.0);
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t k = 0; k < outputs; ++k) out[k] += partial[b * outputs + k];
  }
}

// The vectorised part of a block's reduction for R rows against one query:
// acc0/acc1[q] += f(rows[q][i], x[i]) for i in [begin, end), two packets per
// step. f(r, x) = (r - x)^2 when Diff, r * x otherwise.
template <bool Diff, std::size_t R>
void accumulate_rows(const float* const* r, const float* x, std::size_t begin, std::size_t end,
                     Packet* acc0, Packet* acc1) {
  using namespace Eigen::internal;
  for (std::size_t i = begin; i < end; i += 2 * kLanes) {
    const Packet x0 = ploadu<Packet>(x + i);
    const Packet x1 = ploadu<Packet>(x + i + kLanes);
    for (std::size_t q = 0; q < R; ++q) {
      const Packet a = ploadu<Packet>(r[q] + i);
      const Packet b = ploadu<Packet>(r[q] + i + kLanes);
      if constexpr (Diff) {
        const Packet t0 = psub(a, x0);
        const Packet t1 = psub(b, x1);
        acc0[q] = padd(acc0[q], pmul(t0, t0));
        acc1[q] = padd(acc1[q], pmul(t1, t1));
      } else {
        acc0[q] = padd(acc0[q], pmul(a, x0));
        acc1[q] = padd(acc1[q], pmul(b, x1));
      }
    }
  }
}

// The end of a block's reduction: out[q] += the packets' sum plus the scalar
// tail [lv, len).
template <bool Diff, std::size_t R>
void finish_rows(const float* const* r, const float* x, std::size_t lv, std::size_t len,
                 const Packet* acc0, const Packet* acc1, double* out) {
  using namespace Eigen::internal;
  for (std::size_t q = 0; q < R; ++q) {
    float s = predux(padd(acc0[q], acc1[q]));
    for (std::size_t i = lv; i < len; ++i) {
      const float t = Diff ? r[q][i] - x[i] : r[q][i] * x[i];
      s += Diff ? t * t : t;
    }
    out[q] += static_cast<double>(s);
  }
}

// The vectorised length of a block: whole steps of two packets.
std::size_t vector_length(std::size_t len) { return len - len % (2 * kLanes); }

// out[q] += sum_i f(rows[q][i], x[i]) over one block, for R rows at once.
template <bool Diff, std::size_t R>
void block_rows(const float* const* r, const float* x, std::size_t len, double* out) {
  using namespace Eigen::internal;
  Packet acc0[R];
  Packet acc1[R];
  for (std::size_t q = 0; q < R; ++q) acc0[q] = acc1[q] = pset1<Packet>(0.0f);
  const std::size_t lv = vector_length(len);
  accumulate_rows<Diff, R>(r, x, 0, lv, acc0, acc1);
  finish_rows<Diff, R>(r, x, lv, len, acc0, acc1, out);
}

// <a, b> over one block, in float (Eigen's vectorised dot).
double block_dot(const float* a, const float* b, std::size_t len) {
  const auto n = static_cast<Eigen::Index>(len);
  return static_cast<double>(
      Eigen::Map<const Eigen::VectorXf>(a, n).dot(Eigen::Map<const Eigen::VectorXf>(b, n)));
}

// Every (query, row) pair of one block. Rows go in groups of kRows in the
// outer loop; within a group the block is walked in slices of kSlice floats,
// every query in turn, so a slice of the rows and of every query stays in L1
// while all pairs read it. Each pair's accumulators run over i in order, as
// block_rows' do: the same bits as one pass per query.
// partial: nq x nrows values for this block.
constexpr std::size_t kSlice = 512;
constexpr std::size_t kMaxQueriesInSlices = 16;

template <bool Diff, std::size_t R>
void block_group(const float* const* r, std::span<const float* const> queries, std::size_t begin,
                 std::size_t len, std::size_t nrows, double* partial) {
  using namespace Eigen::internal;
  const std::size_t nq = queries.size();
  Packet acc0[kMaxQueriesInSlices][R];
  Packet acc1[kMaxQueriesInSlices][R];
  for (std::size_t q = 0; q < nq; ++q)
    for (std::size_t k = 0; k < R; ++k) acc0[q][k] = acc1[q][k] = pset1<Packet>(0.0f);
  const std::size_t lv = vector_length(len);
  for (std::size_t slice = 0; slice < lv; slice += kSlice) {
    const std::size_t end = std::min(slice + kSlice, lv);
    for (std::size_t q = 0; q < nq; ++q)
      accumulate_rows<Diff, R>(r, queries[q] + begin, slice, end, acc0[q], acc1[q]);
  }
  for (std::size_t q = 0; q < nq; ++q)
    finish_rows<Diff, R>(r, queries[q] + begin, lv, len, acc0[q], acc1[q], partial + q * nrows);
}

template <bool Diff>
void block_all_pairs(const float* rows, std::size_t nrows, std::size_t dim,
                     std::span<const float* const> queries, std::size_t begin, std::size_t len,
                     double* partial) {
  // Queries in groups of at most kMaxQueriesInSlices (their accumulators live
  // on the stack); each pair's sum does not depend on the grouping.
  for (std::size_t q0 = 0; q0 < queries.size(); q0 += kMaxQueriesInSlices) {
    const auto group = queries.subspan(q0, std::min(kMaxQueriesInSlices, queries.size() - q0));
    double* out = partial + q0 * nrows;
    const float* r[kRows];
    std::size_t j = 0;
    for (; j + kRows <= nrows; j += kRows) {
      for (std::size_t k = 0; k < kRows; ++k) r[k] = rows + (j + k) * dim + begin;
      block_group<Diff, kRows>(r, group, begin, len, nrows, out + j);
    }
    for (; j < nrows; ++j) {
      r[0] = rows + j * dim + begin;
      block_group<Diff, 1>(r, group, begin, len, nrows, out + j);
    }
  }
}

template <bool Diff>
void all_pairs(const BlockPool& pool, const float* rows, std::size_t nrows, std::size_t dim,
               std::span<const float* const> queries, double* out, double* query_norms) {
  const std::size_t nq = queries.size();
  const std::size_t pairs = nq * nrows;
  const std::size_t outputs = pairs + (query_norms ? nq : 0);
  const std::size_t blocks = block_count(dim);
  double* partial = partials(blocks, outputs);
  const std::size_t bytes_per_block = (nrows + nq) * kBlock * sizeof(float);
  pool.for_blocks(blocks, bytes_per_block, [&](std::size_t first, std::size_t last) {
    for (std::size_t b = first; b < last; ++b) {
      const std::size_t begin = b * kBlock;
      const std::size_t len = block_length(b, dim);
      double* p = partial + b * outputs;
      block_all_pairs<Diff>(rows, nrows, dim, queries, begin, len, p);
      if (query_norms) {
        for (std::size_t q = 0; q < nq; ++q)
          p[pairs + q] = block_dot(queries[q] + begin, queries[q] + begin, len);
      }
    }
  });
  std::vector<double> sums(outputs);
  sum_blocks(partial, blocks, outputs, sums.data());
  std::copy(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(pairs), out);
  if (query_norms)
    std::copy(sums.begin() + static_cast<std::ptrdiff_t>(pairs), sums.end(), query_norms);
}

// ---- anchor_products: fp64 terms, summed in kLanes64 interleaved lanes ----
//
// Lane l of a block's sum takes the coordinates i = l (mod kLanes64), in
// order; the lanes are added as (l0 + l1) + (l2 + l3) at the block's end. The
// order depends on the block's length only, so the bits do not depend on the
// threads. The lanes are two pairs of doubles (Lanes: lo = lanes 0 and 1, hi
// = lanes 2 and 3), in GCC/Clang vector types of 16 bytes, which every
// 64-bit target holds in one register.
constexpr std::size_t kLanes64 = 4;

using Float4 = float __attribute__((vector_size(4 * sizeof(float))));
using Double2 = double __attribute__((vector_size(2 * sizeof(double))));

// Four floats widened to double: lanes 0 and 1, lanes 2 and 3.
struct Lanes {
  Double2 lo{};
  Double2 hi{};
  double sum() const { return (lo[0] + lo[1]) + (hi[0] + hi[1]); }
};

Lanes load4(const float* p) {
  Float4 f;
  std::memcpy(&f, p, sizeof f);
  return {Double2{f[0], f[1]}, Double2{f[2], f[3]}};
}

// A block's last count < 4 values, the other lanes 0 (adding +0.0 leaves a
// lane's sum as it is: a lane starts at +0.0, so it is never -0.0).
Lanes load4_tail(const float* p, std::size_t count) {
  float f[kLanes64] = {};
  std::memcpy(f, p, count * sizeof(float));
  return load4(f);
}

Lanes operator-(const Lanes& u, const Lanes& v) { return {u.lo - v.lo, u.hi - v.hi}; }
Lanes operator*(const Lanes& u, const Lanes& v) { return {u.lo * v.lo, u.hi * v.hi}; }
Lanes& operator+=(Lanes& acc, const Lanes& v) {
  acc.lo += v.lo;
  acc.hi += v.hi;
  return acc;
}

// Loaders of four lanes at p: whole, or a block's tail of count < 4 values.
struct WholeLanes {
  Lanes operator()(const float* p) const { return load4(p); }
};
struct TailLanes {
  std::size_t count;
  Lanes operator()(const float* p) const { return load4_tail(p, count); }
};

// Calls add(i, load) for each step of four coordinates of [0, len), then for
// the tail, in order; load(p) reads the step's lanes at p.
template <class Add>
void for_lanes(std::size_t len, Add add) {
  std::size_t i = 0;
  for (; i + kLanes64 <= len; i += kLanes64) add(i, WholeLanes{});
  if (i < len) add(i, TailLanes{len - i});
}

// The six anchored products of one row (x, g) over one block. Without
// momentum f and h stay 0.
struct AnchoredRow {
  Lanes e, f, q, h, s, r;
};

template <bool Momentum>
AnchoredRow anchored_row(const float* x, const float* g, const float* a, const float* m,
                         std::size_t len) {
  AnchoredRow acc;
  for_lanes(len, [&](std::size_t i, auto load) {
    const Lanes ai = load(a + i);
    const Lanes gi = load(g + i);
    const Lanes diff = ai - load(x + i);  // exact: differences of floats
    acc.e += diff * diff;
    acc.q += ai * diff;
    acc.s += gi * diff;
    acc.r += ai * gi;
    if constexpr (Momentum) {
      const Lanes mi = load(m + i);
      acc.f += mi * diff;
      acc.h += mi * gi;
    }
  });
  return acc;
}

// For two rows u and w: out[0] = <gu, xu - xt>, out[1] = <gw, xw - xt>, and,
// with the roles of t and the rows swapped, out[2] = <gt, xt - xu>, out[3] =
// <gt, xt - xw>: the cols and rows products of a fresh row t with two rows
// in one walk (independent sums, so the additions overlap).
void pairs_with_fresh(const float* gt, const float* xt, const float* gu, const float* xu,
                      const float* gw, const float* xw, std::size_t len, double* out) {
  Lanes cu, cw, ru, rw;
  for_lanes(len, [&](std::size_t i, auto load) {
    const Lanes g = load(gt + i);
    const Lanes x = load(xt + i);
    const Lanes du = load(xu + i) - x;
    const Lanes dw = load(xw + i) - x;
    cu += load(gu + i) * du;
    cw += load(gw + i) * dw;
    ru += g * (x - load(xu + i));
    rw += g * (x - load(xw + i));
  });
  out[0] = cu.sum();
  out[1] = cw.sum();
  out[2] = ru.sum();
  out[3] = rw.sum();
}

// <u, v> over one block in double (the scalars).
double dot_in_double(const float* u, const float* v, std::size_t len) {
  Lanes acc;
  for_lanes(len, [&](std::size_t i, auto load) { acc += load(u + i) * load(v + i); });
  return acc.sum();
}

// Every output of anchor_products over the block [begin, begin + len), into
// partial (AnchorLayout order).
void anchor_products_block(const float* points, const float* gradients, std::size_t n,
                           std::size_t dim, const float* a, const float* m,
                           std::span<const int> fresh, std::size_t begin, std::size_t len,
                           double* partial) {
  const detail::AnchorLayout at(n, fresh.size());
  const float* ab = a + begin;
  const float* mb = m != nullptr ? m + begin : nullptr;
  auto x = [&](std::size_t row) { return points + row * dim + begin; };
  auto g = [&](std::size_t row) { return gradients + row * dim + begin; };
  for (std::size_t j = 0; j < n; ++j) {
    const AnchoredRow acc = mb != nullptr ? anchored_row<true>(x(j), g(j), ab, mb, len)
                                          : anchored_row<false>(x(j), g(j), ab, nullptr, len);
    partial[at.e() + j] = acc.e.sum();
    partial[at.f() + j] = acc.f.sum();
    partial[at.q() + j] = acc.q.sum();
    partial[at.h() + j] = acc.h.sum();
    partial[at.s() + j] = acc.s.sum();
    partial[at.r() + j] = acc.r.sum();
  }
  double* scalars = partial + at.scalars();
  scalars[0] = mb != nullptr ? dot_in_double(mb, mb, len) : 0.0;
  scalars[1] = mb != nullptr ? dot_in_double(ab, mb, len) : 0.0;
  scalars[2] = dot_in_double(ab, ab, len);
  // Rows two at a time (an odd last row pairs with itself), every fresh row
  // against them while their block is in L1; the fresh rows stay in L2.
  for (std::size_t j = 0; j < n; j += 2) {
    const std::size_t w = std::min(j + 1, n - 1);
    for (std::size_t k = 0; k < fresh.size(); ++k) {
      const auto t = static_cast<std::size_t>(fresh[k]);
      double* rows = partial + at.rows() + k * n;
      double* cols = partial + at.cols() + k * n;
      double products[4];
      pairs_with_fresh(g(t), x(t), g(j), x(j), g(w), x(w), len, products);
      cols[j] = products[0];
      cols[w] = products[1];
      rows[j] = products[2];
      rows[w] = products[3];
    }
  }
}

}  // namespace

void check_fresh_rows(std::span<const int> fresh, std::size_t n) {
  for (std::size_t k = 0; k < fresh.size(); ++k) {
    if (fresh[k] < 0 || static_cast<std::size_t>(fresh[k]) >= n) {
      throw std::invalid_argument("anchor_products: fresh[" + std::to_string(k) +
                                  "] = " + std::to_string(fresh[k]) +
                                  " is not a row of the history's first " + std::to_string(n));
    }
  }
}

void anchor_products(const BlockPool& pool, const float* points, const float* gradients,
                     std::size_t n, std::size_t dim, const float* a, const float* m,
                     std::span<const int> fresh, double* out) {
  check_fresh_rows(fresh, n);
  const std::size_t outputs = detail::AnchorLayout(n, fresh.size()).size();
  const std::size_t blocks = block_count(dim);
  double* partial = partials(blocks, outputs);
  // Each block reads its slice of every point and gradient row, a and m.
  const std::size_t bytes_per_block = (2 * n + 2) * kBlock * sizeof(float);
  pool.for_blocks(blocks, bytes_per_block, [&](std::size_t first, std::size_t last) {
    for (std::size_t b = first; b < last; ++b) {
      anchor_products_block(points, gradients, n, dim, a, m, fresh, b * kBlock,
                            block_length(b, dim), partial + b * outputs);
    }
  });
  sum_blocks(partial, blocks, outputs, out);  // zeros when dim == 0
}

void squared_distances(const BlockPool& pool, const float* rows, std::size_t nrows, std::size_t dim,
                       std::span<const float* const> queries, double* out,
                       double* query_squared_norms) {
  all_pairs<true>(pool, rows, nrows, dim, queries, out, query_squared_norms);
}

void inner_products(const BlockPool& pool, const float* rows, std::size_t nrows, std::size_t dim,
                    std::span<const float* const> queries, double* out) {
  all_pairs<false>(pool, rows, nrows, dim, queries, out, nullptr);
}

void float_weights(const double* weights, std::size_t nrows, std::vector<float>& out) {
  out.resize(nrows);
  for (std::size_t j = 0; j < nrows; ++j) out[j] = static_cast<float>(weights[j]);
}

void weighted_sum_range(const float* rows, std::size_t nrows, std::size_t dim, const float* w,
                        std::size_t begin, std::size_t end, float* out) {
  end = std::min(end, dim);
  for (std::size_t lo = begin; lo < end; lo += kBlock) {
    const std::size_t len = std::min(kBlock, end - lo);
    float* __restrict o = out + lo;
    std::fill(o, o + len, 0.0f);
    std::size_t j = 0;
    for (; j + kRows <= nrows; j += kRows) {
      const float* __restrict r0 = rows + j * dim + lo;
      const float* __restrict r1 = r0 + dim;
      const float* __restrict r2 = r1 + dim;
      const float* __restrict r3 = r2 + dim;
      const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
      for (std::size_t i = 0; i < len; ++i)
        o[i] += (w0 * r0[i] + w1 * r1[i]) + (w2 * r2[i] + w3 * r3[i]);
    }
    for (; j < nrows; ++j) {
      const float* __restrict r = rows + j * dim + lo;
      const float wj = w[j];
      for (std::size_t i = 0; i < len; ++i) o[i] += wj * r[i];
    }
  }
}

void weighted_sum(const BlockPool& pool, const float* rows, std::size_t nrows, std::size_t dim,
                  const double* weights, float* out) {
  std::vector<float> w;
  float_weights(weights, nrows, w);
  const std::size_t bytes_per_block = (nrows + 1) * kBlock * sizeof(float);
  pool.for_blocks(block_count(dim), bytes_per_block, [&](std::size_t first, std::size_t last) {
    weighted_sum_range(rows, nrows, dim, w.data(), first * kBlock, last * kBlock, out);
  });
}

double dot(const BlockPool& pool, const float* a, const float* b, std::size_t dim) {
  const std::size_t blocks = block_count(dim);
  double* partial = partials(blocks, 1);
  pool.for_blocks(blocks, 2 * kBlock * sizeof(float), [&](std::size_t first, std::size_t last) {
    for (std::size_t k = first; k < last; ++k) {
      const std::size_t begin = k * kBlock;
      partial[k] = block_dot(a + begin, b + begin, block_length(k, dim));
    }
  });
  double sum = 0.0;
  sum_blocks(partial, blocks, 1, &sum);
  return sum;
}

PairStatistics pair_statistics(const BlockPool& pool, const float* a, const float* b,
                               std::size_t dim) {
  const std::size_t blocks = block_count(dim);
  constexpr std::size_t kOutputs = 4;
  double* partial = partials(blocks, kOutputs);
  pool.for_blocks(blocks, 2 * kBlock * sizeof(float), [&](std::size_t first, std::size_t last) {
    for (std::size_t k = first; k < last; ++k) {
      const std::size_t begin = k * kBlock;
      const std::size_t len = block_length(k, dim);
      double* p = partial + k * kOutputs;
      p[0] = block_dot(a + begin, a + begin, len);
      p[1] = block_dot(a + begin, b + begin, len);
      p[2] = block_dot(b + begin, b + begin, len);
      const float* row = a + begin;
      block_rows<true, 1>(&row, b + begin, len, p + 3);
    }
  });
  std::array<double, kOutputs> sums{};
  sum_blocks(partial, blocks, kOutputs, sums.data());
  return {sums[0], sums[1], sums[2], sums[3]};
}

double dot_block(const float* a, const float* b, std::size_t len) { return block_dot(a, b, len); }

double squared_distance_block(const float* row, const float* query, std::size_t len) {
  const float* r[1] = {row};
  double out = 0.0;
  block_group<true, 1>(r, std::span<const float* const>(&query, 1), 0, len, 1, &out);
  return out;
}

bool within_bound_block(const float* values, std::size_t len, float bound) {
  // A count of the values outside [-bound, bound], without an early exit: the
  // loop vectorises (a bool accumulator did not, and cost a step's time per
  // check). |v| <= bound is false for NaN and infinities.
  std::uint32_t outside = 0;
  for (std::size_t i = 0; i < len; ++i) outside += std::abs(values[i]) <= bound ? 0u : 1u;
  return outside == 0;
}

bool all_within_bound(const BlockPool& pool, const float* values, std::size_t n, float bound) {
  const std::size_t blocks = block_count(n);
  std::vector<char> ok(blocks, 1);
  pool.for_blocks(blocks, kBlock * sizeof(float), [&](std::size_t first, std::size_t last) {
    for (std::size_t k = first; k < last; ++k) {
      ok[k] = within_bound_block(values + k * kBlock, block_length(k, n), bound) ? 1 : 0;
    }
  });
  return std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
}

void squared_distances(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                       double* out) {
  squared_distances(BlockPool::serial(), rows, nrows, dim, {&x, 1}, out);
}

void inner_products(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                    double* out) {
  inner_products(BlockPool::serial(), rows, nrows, dim, {&x, 1}, out);
}

void weighted_sum(const float* rows, std::size_t nrows, std::size_t dim, const double* weights,
                  float* out) {
  weighted_sum(BlockPool::serial(), rows, nrows, dim, weights, out);
}

double dot(const float* a, const float* b, std::size_t dim) {
  return dot(BlockPool::serial(), a, b, dim);
}

}  // namespace optex::streaming
