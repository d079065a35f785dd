// The memory-bound passes over the history: every proxy step, every Gram
// update and every commit statistic is made of these. Each walks [0, dim) in
// blocks of kCoordinateBlock coordinates (block_pool.hpp), on the pool's
// threads, reading several rows side by side so the query block is read from
// memory once however many rows there are. Reductions sum in float within a
// block (vectorised) and in double across blocks, in block order: the results
// are the same bit for bit on any number of threads.
//
// The single-query forms without a pool run on the calling thread and give
// the same bits as the pooled ones.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "optex/backend/block_pool.hpp"

namespace optex::streaming {

// out[q * nrows + j] = ||queries[q] - rows[j]||^2 for every query q and row
// j < nrows (rows: row-major nrows x dim). When query_squared_norms is not
// null it also receives ||queries[q]||^2 (equal to dot(queries[q], queries[q])),
// read in the same pass.
void squared_distances(const BlockPool& pool, const float* rows, std::size_t nrows, std::size_t dim,
                       std::span<const float* const> queries, double* out,
                       double* query_squared_norms = nullptr);

// out[q * nrows + j] = <queries[q], rows[j]>.
void inner_products(const BlockPool& pool, const float* rows, std::size_t nrows, std::size_t dim,
                    std::span<const float* const> queries, double* out);

// out = sum_j weights[j] * rows[j], summed in float with the weights rounded
// to float (float_weights).
void weighted_sum(const BlockPool& pool, const float* rows, std::size_t nrows, std::size_t dim,
                  const double* weights, float* out);

// The parts of weighted_sum, for a pass that fuses it with other work block
// by block: the weights as weighted_sum rounds them, and out[i] for i in
// [begin, end) (clipped to dim; begin a multiple of kCoordinateBlock), the
// same bits as weighted_sum gives there.
void float_weights(const double* weights, std::size_t nrows, std::vector<float>& out);
void weighted_sum_range(const float* rows, std::size_t nrows, std::size_t dim, const float* weights,
                        std::size_t begin, std::size_t end, float* out);

// <a, b>, returned as double.
double dot(const BlockPool& pool, const float* a, const float* b, std::size_t dim);

// The block parts of dot() and all_within_bound(), for a pass that fuses them
// with other work block by block: dot() is the sum, in block order, of
// dot_block over each block [k * kCoordinateBlock, ...) (len values), so a
// fused pass that adds the same partials in the same order has its bits;
// within_bound_block is all_within_bound over one block.
// squared_distance_block is the same for squared_distances() of one row and
// one query (row and query pointing at the block's first value).
double dot_block(const float* a, const float* b, std::size_t len);
double squared_distance_block(const float* row, const float* query, std::size_t len);
bool within_bound_block(const float* values, std::size_t len, float bound);

// Everything the commit reports about a predicted gradient a next to the
// evaluated one b, in one pass: <a, a>, <a, b>, <b, b> (each equal to dot())
// and ||a - b||^2 (equal to squared_distances with a as the row).
struct PairStatistics {
  double aa = 0.0;
  double ab = 0.0;
  double bb = 0.0;
  double squared_distance = 0.0;
};
PairStatistics pair_statistics(const BlockPool& pool, const float* a, const float* b,
                               std::size_t dim);

// Whether every value is finite and at most `bound` in magnitude.
bool all_within_bound(const BlockPool& pool, const float* values, std::size_t n, float bound);

// The anchored products of the GP proxy steps (DevicePrimitives::
// anchor_products, whose out layout is AnchorLayout(n, fresh.size())), over
// the first n rows of points X and gradients G (row-major, stride dim), the
// anchor a and the momentum m (dim values each; m may be null: its products
// are then 0):
//   e[j] = ||a - X_j||^2   f[j] = <m, a - X_j>   q[j] = <a, a - X_j>
//   h[l] = <m, G_l>        s[l] = <G_l, a - X_l>  r[l] = <a, G_l>
//   scalars = {||m||^2, <a, m>, ||a||^2}
//   rows[k n + j] = <G_t, X_t - X_j>, cols[k n + l] = <G_l, X_l - X_t>, t = fresh[k]
// Every term is formed in double from the floats (a difference of two floats
// is exact in double), so each product keeps its relative accuracy however
// far the points lie from the origin. Each block sums its terms in double in
// coordinate order; the blocks' partials are added in block order, so the
// bits do not depend on the pool's threads. out: 6 n + 3 + 2 n fresh.size()
// doubles. Throws std::invalid_argument (check_fresh_rows) before writing
// anything when a fresh index is outside [0, n).
void anchor_products(const BlockPool& pool, const float* points, const float* gradients,
                     std::size_t n, std::size_t dim, const float* a, const float* m,
                     std::span<const int> fresh, double* out);

// Throws std::invalid_argument naming the first fresh index outside [0, n):
// the check anchor_products makes before it writes, for a caller that must
// refuse the call before queueing it.
void check_fresh_rows(std::span<const int> fresh, std::size_t n);

// The single-query passes on the calling thread.
void squared_distances(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                       double* out);
void inner_products(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                    double* out);
void weighted_sum(const float* rows, std::size_t nrows, std::size_t dim, const double* weights,
                  float* out);
double dot(const float* a, const float* b, std::size_t dim);

}  // namespace optex::streaming
