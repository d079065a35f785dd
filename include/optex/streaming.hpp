// The memory-bound passes over the history: every proxy step and every Gram
// update is made of these. Each walks the rows in blocks that stay in L1, so
// the query vector is read from memory once however many rows there are.
// Reductions sum in float within a block of 1024 elements (vectorised) and in
// double across blocks (accurate at large d).
#pragma once

#include <cstddef>

namespace optex::streaming {

// out[j] = ||x - rows[j]||^2 for j < nrows (rows: row-major nrows x dim).
void squared_distances(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                       double* out);

// out[j] = <x, rows[j]> for j < nrows.
void inner_products(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                    double* out);

// out = sum_j weights[j] * rows[j].
void weighted_sum(const float* rows, std::size_t nrows, std::size_t dim, const double* weights,
                  float* out);

// <a, b>, returned as double.
double dot(const float* a, const float* b, std::size_t dim);

}  // namespace optex::streaming
