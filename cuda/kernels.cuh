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

#include "optex/detail/elementwise.hpp"
#include "optex/kernel.hpp"

namespace optex::cuda {

using detail::bf16_bits;

// How many fp64 partial sums per row a reduction over d coordinates needs:
// the `partials` scratch below holds reduction_blocks(d) * nrows doubles (it
// is reused query after query). With d == 0 the outputs are zero (distances,
// dots) or 1 (rows_finite).
int reduction_blocks(std::size_t d);

// out[q * nrows + j] = ||queries[q] - rows[j]||^2 for q < nqueries, j < nrows.
// rows: nrows x d row-major (stride d), queries: nqueries x d. Computed from
// the differences directly, not from norms: proxy points are close together
// and ||a||^2 + ||b||^2 - 2<a,b> would cancel in float.
template <class Store, class Query>
void squared_distances(const Store* rows, int nrows, std::size_t d, const Query* queries,
                       int nqueries, double* partials, double* out, cudaStream_t stream);

// out[j] = kernel(sqrt(squared_distances[j]) * inv_scaled_lengthscale), j < n.
void kernel_vector(const double* squared_distances, int n, Kernel kernel,
                   double inv_scaled_lengthscale, double* out, cudaStream_t stream);

// out[r] = <a[r], b[r]> for r < nrows (a, b: nrows x d, row stride d).
template <class Store>
void row_dots(const Store* a, const Store* b, int nrows, std::size_t d, double* partials,
              double* out, cudaStream_t stream);

// finite[r] = 1 if row r of rows (nrows x d) is all finite, else 0.
void rows_finite(const float* rows, int nrows, std::size_t d, int* finite, cudaStream_t stream);

// dst[i] = Store(src[i]) and dst[i] = float(src[i]), i < count.
template <class Store>
void store_values(const float* src, Store* dst, std::size_t count, cudaStream_t stream);
template <class Store>
void load_values(const Store* src, float* dst, std::size_t count, cudaStream_t stream);

// The proxy-step update, one pass over memory. For every coordinate k < d:
//   g        = weights ? sum_{j < nrows} float(weights[j]) * history[j][k] : gradient[k]
//   predicted[k] = g            (skipped when predicted == nullptr or gradient is used)
//   x_out[k] = x_in[k], then the optimizer's update with g (detail::sgd_update
//              / detail::adam_update) on x_out[k] and the moments in place.
// x_in may equal x_out; `history` (read through __restrict__) must not alias
// any output. `weights` is device memory (the solve's output), so no value
// crosses to the host. history: nrows x d, row stride d, nrows <= 12288 (the
// float weights sit in shared memory). Throws std::invalid_argument for a
// missing buffer the update needs (history with nrows > 0, gradient without
// weights, momentum with c.use_momentum, Adam's m and v).
template <class Store>
void sgd_step(const Store* history, const double* weights, int nrows, const float* gradient,
              float* predicted, const float* x_in, float* x_out, float* momentum,
              const detail::SgdCoefficients& c, std::size_t d, cudaStream_t stream);
template <class Store>
void adam_step(const Store* history, const double* weights, int nrows, const float* gradient,
               float* predicted, const float* x_in, float* x_out, float* m, float* v,
               const detail::AdamCoefficients& c, std::size_t d, cudaStream_t stream);

}  // namespace optex::cuda
