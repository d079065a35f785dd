// The CUDA kernels of the backend, behind host launchers that enqueue on a
// stream and never synchronise. Every reduction is deterministic: a fixed
// grid (it depends on the sizes only, not on the device), per-thread fp32
// partial sums, fp64 across threads and blocks, in a fixed order.
//
// History storage is `Store` = float or detail::bf16_bits (bf16); arithmetic is
// fp32 per coordinate.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "optex/backend/bf16.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex::cuda {

using detail::bf16_bits;

// How many fp64 partial sums per row a reduction over d coordinates needs:
// the `partials` scratch below holds reduction_blocks(d) * nrows doubles
// (squared_distances: * squared_distances_partial_rows). With d == 0 the
// outputs are zero (distances, dots) or 1 (rows_finite).
int reduction_blocks(std::size_t d);

// out[row] = the sum of partials[row * blocks + b] over b < blocks, in fp64 in a
// fixed order (one warp per row), row < nrows: the second stage of every
// reduction here and in anchor_products.cu.
void sum_partials(const double* partials, int nrows, int blocks, double* out, cudaStream_t stream);

// Queries squared_distances takes in one pass over the rows, at most.
inline constexpr int kDistanceQueriesPerPass = 4;

// Queries per pass over nrows rows: kDistanceQueriesPerPass, fewer only where
// their partial rows (per pass * nrows) would pass INT_MAX.
int distance_queries_per_pass(int nrows);

// The partial rows squared_distances needs: nrows per query of one pass,
// min(nqueries, distance_queries_per_pass(nrows)) * nrows (0 without rows or
// queries).
std::size_t squared_distances_partial_rows(int nrows, int nqueries);

// out[q * nrows + j] = ||queries[q] - rows[j]||^2 for q < nqueries, j < nrows.
// rows: nrows x d row-major (stride d), queries: nqueries x d. Computed from
// the differences directly, not from norms: proxy points are close together
// and ||a||^2 + ||b||^2 - 2<a,b> would cancel in float. The rows are read
// once per distance_queries_per_pass(nrows) queries; each value is summed as
// with one query at a time, so the grouping changes no bit. partials:
// reduction_blocks(d) * squared_distances_partial_rows(nrows, nqueries)
// doubles.
template <class Store, class Query>
void squared_distances(const Store* rows, int nrows, std::size_t d, const Query* queries,
                       int nqueries, double* partials, double* out, cudaStream_t stream);

// out[j] = kernel(sqrt(squared_distances[j]) * inv_scaled_lengthscale), j < n.
void covariance_vector(const double* squared_distances, int n, Covariance covariance,
                       double inv_scaled_lengthscale, double* out, cudaStream_t stream);

// out[r] = <a[r], b[r]> for r < nrows (a, b: nrows x d, row stride d).
template <class Store>
void row_dots(const Store* a, const Store* b, int nrows, std::size_t d, double* partials,
              double* out, cudaStream_t stream);

// finite[r] = 1 if every value of row r of rows (nrows x d) is finite and at
// most `bound` in magnitude (FLT_MAX: finite), else 0.
void rows_finite(const float* rows, int nrows, std::size_t d, float bound, int* finite,
                 cudaStream_t stream);

// dst[i] = Store(src[i]) and dst[i] = float(src[i]), i < count.
template <class Store>
void store_values(const float* src, Store* dst, std::size_t count, cudaStream_t stream);
template <class Store>
void load_values(const Store* src, float* dst, std::size_t count, cudaStream_t stream);

// out[0..3] = <a, a>, <a, b>, <b, b>, ||a - b||^2 over d, from one pass (each
// summed like row_dots); partials: 4 * reduction_blocks(d) doubles.
void pair_statistics(const float* a, const float* b, std::size_t d, double* partials, double* out,
                     cudaStream_t stream);

// dst[i] = double(src[i]), i < count (the fp32 GEMM's inner products as fp64).
void widen_floats(const float* src, double* dst, std::size_t count, cudaStream_t stream);

// *variance = max(0, 1 - sum_{j < n} k[j] * w[j]): the GP's posterior variance
// from the covariance vector k and the weights w = (K + sigma^2 I)^-1 k, summed
// in j order in fp64 by one thread (n <= T0), as the CPU sums it.
void posterior_variance(const double* k, const double* w, int n, double* variance,
                        cudaStream_t stream);

// The most rows a mean_of_rows launch takes in its kernel arguments.
inline constexpr int kMaxInlineMeanRows = 64;

// mean[k] = float(m_k), m_k = (sum over r in `which`, in that order, of
// double(rows[r * d + k])) / |which| in fp64: bitwise the CPU's mean. When sums
// is not null also sums[0] = sum_k m_k^2 and sums[1] = sum_k sum_{r in which}
// (double(rows[r * d + k]) - m_k)^2, deterministic reductions over fp64
// per-thread partials (partials: 2 * reduction_blocks(d) doubles). `which` is
// host memory, read before the call returns: up to kMaxInlineMeanRows entries
// travel as kernel arguments; a longer list must also be in device memory at
// `device_which` (the same entries, left there until the launch has run), else
// std::invalid_argument before anything is enqueued. `mean` may be one of the
// rows.
void mean_of_rows(const float* rows, std::span<const int> which, const int* device_which,
                  std::size_t d, float* mean, double* partials, double* sums, cudaStream_t stream);

// out[j] = (blocks[0][j] + blocks[1][j] + ... + blocks[count-1][j]) / float(count)
// in fp32, block by block in order, j < n (blocks: count x n, contiguous): the
// data-parallel group mean, bitwise data_parallel.hpp's mean_in_rank_order.
void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n, float* out,
                        cudaStream_t stream);

// ---- the fused optimizer step -------------------------------------------------

// An optimizer state's device rows: slot j's d floats, nullptr where unused.
// A step reads slot j from from[j] where that is set (stepping out of place:
// the old state stays as it was) and writes it to slot[j].
struct StateRows {
  float* slot[kMaxStateSlots] = {};
  const float* from[kMaxStateSlots] = {};
};

// The coefficients of one step of optimizer kind O, per range: range r covers
// coordinates [begin[r], begin[r + 1]) with coefficients[r].
template <class O>
struct StepRanges {
  using Kind = O;
  std::vector<std::size_t> begin;  // count + 1 entries, from 0 to d
  std::vector<typename O::Coefficients> coefficients;
  StateSlots slots;  // the state slots the update reads and writes
};

template <class V>
struct StepCoefficientsOf;
template <class... O>
struct StepCoefficientsOf<std::variant<O...>> {
  using type = std::variant<StepRanges<O>...>;
};
// One step's coefficients, whichever the optimizer kind.
using StepCoefficients = StepCoefficientsOf<Optimizer>::type;

// The coefficients of the step that takes the state from `step` to step + 1,
// each range with its own hyperparameters at its own step count
// (OptimizerRange::local_step; ranges sized for the dimension).
// Reuses `out`'s storage when the kind is unchanged.
void fill_step_coefficients(const OptimizerRanges& ranges, std::int64_t step,
                            StepCoefficients& out);

// The proxy-step update, one pass over memory. For every coordinate k < d:
//   g        = weights ? sum_{j < nrows} float(weights[j]) * history[j][k] : gradient[k]
//   predicted[k] = g            (skipped when predicted == nullptr or gradient is used)
//   x_out[k] = x_in[k], then O::update(x_out[k], g, the state's slots at k,
//              the coefficients of k's range).
// x_in may equal x_out; `history` (read through __restrict__) must not alias
// any output. `weights` is device memory (the solve's output), so no value
// crosses to the host. history: nrows x d, row stride d, nrows <= 12288 (the
// float weights sit in shared memory). One launch handles up to 16 ranges
// (their coefficients travel as kernel arguments); more ranges take one
// launch per 16. With d == 0 there is nothing to do and nothing is checked.
// Otherwise throws std::invalid_argument, before anything is enqueued, for a
// missing buffer (history with nrows > 0, gradient without weights, a slot
// the ranges' optimizer uses) or coefficients whose ranges do not cover
// [0, d) in increasing, non-empty pieces.
template <class Store>
void optimizer_step(const Store* history, const double* weights, int nrows, const float* gradient,
                    float* predicted, const float* x_in, float* x_out, StateRows state,
                    const StepCoefficients& coefficients, std::size_t d, cudaStream_t stream);

}  // namespace optex::cuda
