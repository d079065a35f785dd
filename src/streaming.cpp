#include "optex/streaming.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <vector>

// Every pass reads kRows history rows side by side, so the hardware prefetchers
// see a few long sequential streams (plus the query block). One row at a time
// restarts a short stream at every block; all T0 rows at once (a plain GEMV)
// is more streams than the prefetchers track. Both measured about 2x slower
// (bench/results/cpu-estimator-2026-11-22.md).
namespace optex::streaming {
namespace {

constexpr std::size_t kBlock = 4096;
constexpr std::size_t kRows = 4;
constexpr std::size_t kMaxRowsOnStack = 256;

using Packet = Eigen::internal::packet_traits<float>::type;
constexpr std::size_t kLanes =
    static_cast<std::size_t>(Eigen::internal::packet_traits<float>::size);

// out[j] += sum_i f(rows[j][i], x[i]) over one block, for kRows rows at once.
// f(r, x) = (r - x)^2 when Diff, r * x otherwise.
template <bool Diff, std::size_t R>
void block_rows(const float* const* r, const float* x, std::size_t len, double* out) {
  using namespace Eigen::internal;
  Packet acc0[R];
  Packet acc1[R];
  for (std::size_t q = 0; q < R; ++q) acc0[q] = acc1[q] = pset1<Packet>(0.0f);
  const std::size_t step = 2 * kLanes;
  const std::size_t lv = len - len % step;
  for (std::size_t i = 0; i < lv; i += step) {
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
  for (std::size_t q = 0; q < R; ++q) {
    float s = predux(padd(acc0[q], acc1[q]));
    for (std::size_t i = lv; i < len; ++i) {
      const float t = Diff ? r[q][i] - x[i] : r[q][i] * x[i];
      s += Diff ? t * t : t;
    }
    out[q] += static_cast<double>(s);
  }
}

template <bool Diff>
void blocked_reduce(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                    double* out) {
  std::fill(out, out + nrows, 0.0);
  for (std::size_t begin = 0; begin < dim; begin += kBlock) {
    const std::size_t len = std::min(kBlock, dim - begin);
    std::size_t j = 0;
    const float* r[kRows];
    for (; j + kRows <= nrows; j += kRows) {
      for (std::size_t q = 0; q < kRows; ++q) r[q] = rows + (j + q) * dim + begin;
      block_rows<Diff, kRows>(r, x + begin, len, out + j);
    }
    for (; j < nrows; ++j) {
      r[0] = rows + j * dim + begin;
      block_rows<Diff, 1>(r, x + begin, len, out + j);
    }
  }
}

}  // namespace

void squared_distances(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                       double* out) {
  blocked_reduce<true>(rows, nrows, dim, x, out);
}

void inner_products(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                    double* out) {
  blocked_reduce<false>(rows, nrows, dim, x, out);
}

void weighted_sum(const float* rows, std::size_t nrows, std::size_t dim, const double* weights,
                  float* out) {
  std::array<float, kMaxRowsOnStack> w_small{};
  std::vector<float> w_large;
  float* w = w_small.data();
  if (nrows > kMaxRowsOnStack) {
    w_large.resize(nrows);
    w = w_large.data();
  }
  for (std::size_t j = 0; j < nrows; ++j) w[j] = static_cast<float>(weights[j]);
  for (std::size_t begin = 0; begin < dim; begin += kBlock) {
    const std::size_t len = std::min(kBlock, dim - begin);
    float* __restrict o = out + begin;
    std::fill(o, o + len, 0.0f);
    std::size_t j = 0;
    for (; j + kRows <= nrows; j += kRows) {
      const float* __restrict r0 = rows + j * dim + begin;
      const float* __restrict r1 = r0 + dim;
      const float* __restrict r2 = r1 + dim;
      const float* __restrict r3 = r2 + dim;
      const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
      for (std::size_t i = 0; i < len; ++i)
        o[i] += (w0 * r0[i] + w1 * r1[i]) + (w2 * r2[i] + w3 * r3[i]);
    }
    for (; j < nrows; ++j) {
      const float* __restrict r = rows + j * dim + begin;
      const float wj = w[j];
      for (std::size_t i = 0; i < len; ++i) o[i] += wj * r[i];
    }
  }
}

double dot(const float* a, const float* b, std::size_t dim) {
  double acc = 0.0;
  for (std::size_t begin = 0; begin < dim; begin += kBlock) {
    const auto len = static_cast<Eigen::Index>(std::min(kBlock, dim - begin));
    acc += Eigen::Map<const Eigen::VectorXf>(a + begin, len)
               .dot(Eigen::Map<const Eigen::VectorXf>(b + begin, len));
  }
  return acc;
}

}  // namespace optex::streaming
