// The CUDA kernels of the backend (see kernels.cuh).
//
// Reductions over d (squared_distances, row_dots, pair_statistics,
// mean_of_rows' sums) are deterministic: the grid over d is reduction_blocks(d)
// blocks of kThreads threads whatever the device; every thread sums its
// grid-stride slice in increasing k (fp32; fp64 for mean_of_rows, whose terms
// are fp64), each block sums its threads in fp64 in a fixed tree order and
// writes one partial per row, and a second kernel sums each row's partials in
// a fixed order in fp64. No atomics touch a value.
//
// Compiled with --fmad=false and IEEE division and square root, so the
// elementwise updates (each optimizer's update()) are bitwise the CPU's.

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "cuda_check.hpp"
#include "kernels.cuh"

namespace optex::cuda {
namespace {

constexpr int kThreads = 256;  // threads per block, every kernel
constexpr int kWarps = kThreads / 32;
constexpr std::size_t kElementsPerThread = 8;  // of a reduction, before the grid stops growing
constexpr int kMaxReductionBlocks = 1024;
constexpr int kMaxChunk = 16;  // rows per squared_distances block, at most
// fp32 accumulators per thread of squared_distances, one per (query, row) of a
// block, and so the rows block_sum_to_partials sums at once.
constexpr int kMaxAccumulators = 32;
constexpr int kMaxGridY = 65535;  // gridDim.y (and z) limit
constexpr std::size_t kMaxElementwiseBlocks = 65536;
constexpr int kMaxStepRows = 12288;  // 48 KiB of float weights in shared memory, and the pad
constexpr unsigned kFullMask = 0xffffffffu;

int ceil_div(int a, int b) { return static_cast<int>((static_cast<long long>(a) + b - 1) / b); }

// Blocks of a grid-stride elementwise kernel over count elements (count > 0).
unsigned elementwise_blocks(std::size_t count) {
  const std::size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min(blocks, kMaxElementwiseBlocks));
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  return v;  // the warp's sum in lane 0, in a fixed order
}

// The shared scratch of block_sum_to_partials: one array per kernel, whatever
// the instantiations of the template it holds.
__device__ __forceinline__ double (*reduction_scratch())[kWarps] {
  __shared__ double scratch[kMaxAccumulators][kWarps];
  return scratch;
}

// Where block_sum_to_partials writes accumulator i: partial row i (rows of
// partials one after the other).
struct ConsecutiveRows {
  __device__ std::size_t operator()(int i) const { return static_cast<std::size_t>(i); }
};

// Sums acc[i] over the block (kThreads threads) in fp64 in a fixed order and
// writes the block's sum of accumulator i to partials[row(i) * blocks + block].
// Every thread of the block must call it. T: the per-thread partials' type
// (fp32, or fp64 where a kernel keeps fp64 partials per thread). Each sum
// depends on its own accumulator only, not on N or on the other accumulators.
template <int N, class T, class PartialRow = ConsecutiveRows>
__device__ __forceinline__ void block_sum_to_partials(const T (&acc)[N], double* partials,
                                                      int blocks, int block,
                                                      PartialRow row = PartialRow{}) {
  static_assert(N >= 1 && N <= kMaxAccumulators);
  double(*warp_sums)[kWarps] = reduction_scratch();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const double s = warp_sum(static_cast<double>(acc[i]));
    if (lane == 0) warp_sums[i][warp] = s;
  }
  __syncthreads();
  const int i = static_cast<int>(threadIdx.x);
  if (i < N) {
    double s = 0.0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += warp_sums[i][w];
    partials[row(i) * static_cast<std::size_t>(blocks) + static_cast<std::size_t>(block)] = s;
  }
}

// out[row] = sum_b partials[row * blocks + b], fp64, one warp per row: lane l
// sums b = l, l + 32, ... in order, then the warp sums its lanes in a fixed tree.
__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const double* __restrict__ partials, int nrows, int blocks,
                        double* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const long long row = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= nrows) return;  // whole warps leave together
  const double* p = partials + static_cast<std::size_t>(row) * static_cast<std::size_t>(blocks);
  double s = 0.0;
  for (int b = lane; b < blocks; b += 32) s += p[b];
  s = warp_sum(s);
  if (lane == 0) out[row] = s;
}

}  // namespace

void sum_partials(const double* partials, int nrows, int blocks, double* out, cudaStream_t stream) {
  if (nrows <= 0) return;
  sum_partials_kernel<<<static_cast<unsigned>(ceil_div(nrows, kWarps)), kThreads, 0, stream>>>(
      partials, nrows, blocks, out);
  OPTEX_CUDA_CHECK(cudaGetLastError());
}

namespace {

// ---- squared_distances -------------------------------------------------------

// Rows per squared_distances block with Q queries: R * Q accumulators per
// thread at most, so the registers stay few enough for full occupancy.
constexpr int max_chunk(int queries) { return std::min(kMaxChunk, kMaxAccumulators / queries); }

// The partial sums of ||queries[i] - rows[r]||^2, i < Q, r < R, over this
// block's grid-stride slice of [0, d): each value of the R rows is loaded once
// for all Q queries. For small R several k are loaded before they are summed
// (U), so enough loads are in flight. Each accumulator's adds are those of one
// query and one row alone, in increasing k, whatever Q, R and U: the sums are
// bitwise those of one query at a time. The block's partial of (i, r) goes to
// partial row i * nrows + r (query-major, as the caller's out).
template <int Q, int R, class Store, class Query>
__device__ __forceinline__ void squared_distances_chunk(const Store* __restrict__ rows, int nrows,
                                                        std::size_t d,
                                                        const Query* __restrict__ queries,
                                                        double* partials, int blocks) {
  static_assert(Q >= 1 && R >= 1 && Q * R <= kMaxAccumulators);
  constexpr int U = R >= 8 ? 1 : (R >= 4 ? 2 : 4);
  float acc[Q * R];  // acc[i * R + r]: query i, row r
#pragma unroll
  for (int a = 0; a < Q * R; ++a) acc[a] = 0.0f;

  const int block = static_cast<int>(blockIdx.y);
  const std::size_t stride = static_cast<std::size_t>(blocks) * kThreads;
  std::size_t k = static_cast<std::size_t>(block) * kThreads + threadIdx.x;
  if constexpr (U > 1) {
    for (; k + (U - 1) * stride < d; k += U * stride) {
      float q[U][Q];
      float x[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int i = 0; i < Q; ++i)
          q[u][i] =
              detail::load_as_float(queries[static_cast<std::size_t>(i) * d + k + u * stride]);
#pragma unroll
        for (int r = 0; r < R; ++r)
          x[u][r] = detail::load_as_float(rows[static_cast<std::size_t>(r) * d + k + u * stride]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int i = 0; i < Q; ++i) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float t = x[u][r] - q[u][i];
            acc[i * R + r] += t * t;
          }
        }
      }
    }
  }
  for (; k < d; k += stride) {
    float q[Q];
    float x[R];
#pragma unroll
    for (int i = 0; i < Q; ++i)
      q[i] = detail::load_as_float(queries[static_cast<std::size_t>(i) * d + k]);
#pragma unroll
    for (int r = 0; r < R; ++r)
      x[r] = detail::load_as_float(rows[static_cast<std::size_t>(r) * d + k]);
#pragma unroll
    for (int i = 0; i < Q; ++i) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float t = x[r] - q[i];
        acc[i * R + r] += t * t;
      }
    }
  }
  const auto partial_row = [nrows](int a) {
    return static_cast<std::size_t>(a / R) * static_cast<std::size_t>(nrows) +
           static_cast<std::size_t>(a % R);
  };
  block_sum_to_partials<Q * R>(acc, partials, blocks, block, partial_row);
}

// Q queries (rows of stride d) against all rows. grid: x = chunk of rows
// (fastest, so the chunks of one slice of d run side by side and share the
// queries through L2), y = reduction block over d. The rows are split into
// nchunks balanced chunks: chunk c holds rows [c * nrows / nchunks,
// (c + 1) * nrows / nchunks), R or R - 1 of them, where
// R = ceil(nrows / nchunks) <= max_chunk(Q).
template <int Q, int R, class Store, class Query>
__global__ void __launch_bounds__(kThreads)
    squared_distances_kernel(const Store* __restrict__ rows, int nrows, std::size_t d,
                             const Query* __restrict__ queries, int nchunks, double* partials,
                             int blocks) {
  const long long c = blockIdx.x;
  const int begin = static_cast<int>(c * nrows / nchunks);
  const int end = static_cast<int>((c + 1) * nrows / nchunks);
  const Store* chunk_rows = rows + static_cast<std::size_t>(begin) * d;
  double* chunk_partials =
      partials + static_cast<std::size_t>(begin) * static_cast<std::size_t>(blocks);
  if constexpr (R > 1) {
    if (end - begin != R) {
      squared_distances_chunk<Q, R - 1>(chunk_rows, nrows, d, queries, chunk_partials, blocks);
      return;
    }
  }
  squared_distances_chunk<Q, R>(chunk_rows, nrows, d, queries, chunk_partials, blocks);
}

// Launches squared_distances_kernel<Q, chunk> (chunk <= R).
template <int Q, int R, class Store, class Query>
void launch_squared_distances(int chunk, const Store* rows, int nrows, std::size_t d,
                              const Query* queries, int nchunks, double* partials, int blocks,
                              cudaStream_t stream) {
  if constexpr (R > 1) {
    if (chunk != R) {
      launch_squared_distances<Q, R - 1>(chunk, rows, nrows, d, queries, nchunks, partials, blocks,
                                         stream);
      return;
    }
  }
  const dim3 grid(static_cast<unsigned>(nchunks), static_cast<unsigned>(blocks));
  squared_distances_kernel<Q, R>
      <<<grid, kThreads, 0, stream>>>(rows, nrows, d, queries, nchunks, partials, blocks);
  OPTEX_CUDA_CHECK(cudaGetLastError());
}

// One pass over the rows for `group` queries (1 <= group <= Q): the partials of
// query i, row j in partial row i * nrows + j.
template <int Q, class Store, class Query>
void squared_distances_pass(int group, const Store* rows, int nrows, std::size_t d,
                            const Query* queries, double* partials, int blocks,
                            cudaStream_t stream) {
  if constexpr (Q > 1) {
    if (group != Q) {
      squared_distances_pass<Q - 1>(group, rows, nrows, d, queries, partials, blocks, stream);
      return;
    }
  }
  constexpr int kChunk = max_chunk(Q);
  const int nchunks = ceil_div(nrows, kChunk);
  const int chunk = ceil_div(nrows, nchunks);  // rows per chunk: chunk or chunk - 1
  launch_squared_distances<Q, kChunk>(chunk, rows, nrows, d, queries, nchunks, partials, blocks,
                                      stream);
}

// ---- row_dots ------------------------------------------------------------------

// grid: x = reduction block over d, y = row (row0 + blockIdx.y).
template <class Store>
__global__ void __launch_bounds__(kThreads)
    row_dots_kernel(const Store* __restrict__ a, const Store* __restrict__ b, int row0,
                    std::size_t d, double* partials, int blocks) {
  constexpr int U = 4;
  const std::size_t row = static_cast<std::size_t>(row0) + blockIdx.y;
  const Store* ar = a + row * d;
  const Store* br = b + row * d;
  const int block = static_cast<int>(blockIdx.x);
  const std::size_t stride = static_cast<std::size_t>(blocks) * kThreads;
  std::size_t k = static_cast<std::size_t>(block) * kThreads + threadIdx.x;
  float acc[1] = {0.0f};
  for (; k + (U - 1) * stride < d; k += U * stride) {
    float x[U];
    float y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      x[u] = detail::load_as_float(ar[k + u * stride]);
      y[u] = detail::load_as_float(br[k + u * stride]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc[0] += x[u] * y[u];
  }
  for (; k < d; k += stride) acc[0] += detail::load_as_float(ar[k]) * detail::load_as_float(br[k]);
  block_sum_to_partials<1>(acc, partials + row * static_cast<std::size_t>(blocks), blocks, block);
}

// ---- kernel_vector -------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    covariance_vector_kernel(const double* __restrict__ squared_distances, int n, Covariance kernel,
                             double inv_scaled_lengthscale, double* __restrict__ out) {
  for (int j = static_cast<int>(threadIdx.x); j < n; j += static_cast<int>(blockDim.x))
    out[j] = covariance_value(kernel, ::sqrt(squared_distances[j]) * inv_scaled_lengthscale);
}

// ---- rows_finite -----------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) fill_ones_kernel(int* __restrict__ out, int n) {
  const int step = static_cast<int>(gridDim.x * blockDim.x);
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += step)
    out[i] = 1;
}

// grid: x = block over d, y = row (row0 + blockIdx.y). A block that sees a
// value that is not finite or above `bound` clears the row's flag (the flags
// start at 1).
__global__ void __launch_bounds__(kThreads)
    rows_finite_kernel(const float* __restrict__ rows, int row0, std::size_t d, float bound,
                       int* finite) {
  const std::size_t row = static_cast<std::size_t>(row0) + blockIdx.y;
  const float* r = rows + row * d;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * kThreads;
  int bad = 0;
  for (std::size_t k = static_cast<std::size_t>(blockIdx.x) * kThreads + threadIdx.x; k < d;
       k += stride)
    bad |= fabsf(r[k]) <= bound ? 0 : 1;  // false for NaN
  if (__syncthreads_or(bad) != 0 && threadIdx.x == 0) atomicAnd(finite + row, 0);
}

// ---- store_values / load_values ------------------------------------------------

template <class Store>
__device__ __forceinline__ Store to_store(float v) {
  if constexpr (std::is_same_v<Store, bf16_bits>) {
    return detail::to_bf16(v);
  } else {
    return v;
  }
}

template <class Store>
__global__ void __launch_bounds__(kThreads)
    store_values_kernel(const float* __restrict__ src, Store* __restrict__ dst, std::size_t count) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step)
    dst[i] = to_store<Store>(src[i]);
}

template <class Store>
__global__ void __launch_bounds__(kThreads)
    load_values_kernel(const Store* __restrict__ src, float* __restrict__ dst, std::size_t count) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step)
    dst[i] = detail::load_as_float(src[i]);
}

// ---- pair_statistics -----------------------------------------------------------

// grid: x = reduction block over d. The four sums of one pass, each thread in
// fp32 over its grid-stride slice in increasing k (as row_dots_kernel and
// squared_distances_chunk sum theirs), then the block in fp64:
// partials[s * blocks + block] for s = <a,a>, <a,b>, <b,b>, ||a - b||^2.
__global__ void __launch_bounds__(kThreads)
    pair_statistics_kernel(const float* __restrict__ a, const float* __restrict__ b, std::size_t d,
                           double* partials, int blocks) {
  const int block = static_cast<int>(blockIdx.x);
  const std::size_t stride = static_cast<std::size_t>(blocks) * kThreads;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (std::size_t k = static_cast<std::size_t>(block) * kThreads + threadIdx.x; k < d;
       k += stride) {
    const float x = a[k];
    const float y = b[k];
    const float t = x - y;
    acc[0] += x * x;
    acc[1] += x * y;
    acc[2] += y * y;
    acc[3] += t * t;
  }
  block_sum_to_partials<4>(acc, partials, blocks, block);
}

// ---- widen_floats ----------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    widen_floats_kernel(const float* __restrict__ src, double* __restrict__ dst,
                        std::size_t count) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step)
    dst[i] = static_cast<double>(src[i]);
}

// Per element, in the order of data_parallel.hpp's loops: the first block,
// then each later one added, then the division.
__global__ void __launch_bounds__(kThreads)
    mean_in_rank_order_kernel(const float* __restrict__ blocks, std::size_t count, std::size_t n,
                              float* __restrict__ out) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const float divisor = static_cast<float>(count);
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += step) {
    float sum = blocks[j];
    for (std::size_t r = 1; r < count; ++r) sum += blocks[r * n + j];
    out[j] = sum / divisor;
  }
}

// ---- posterior_variance ----------------------------------------------------------

// One thread: n <= T0 terms, summed in j order in fp64 like the CPU's
// `explained += k_j * w_j` (no contraction: --fmad=false), then max(0, 1 - .)
// as std::max(0.0, v) picks it (0 for NaN).
__global__ void posterior_variance_kernel(const double* __restrict__ k,
                                          const double* __restrict__ w, int n,
                                          double* __restrict__ variance) {
  double explained = 0.0;
  for (int j = 0; j < n; ++j) explained += k[j] * w[j];
  const double v = 1.0 - explained;
  *variance = 0.0 < v ? v : 0.0;
}

// ---- mean_of_rows ----------------------------------------------------------------

// The rows a mean averages, in order: up to kMaxInlineMeanRows travel in the
// kernel's arguments (read through the constant cache), more are read from
// device memory (`list`).
struct MeanRows {
  int count = 0;
  const int* list = nullptr;
  int inline_rows[kMaxInlineMeanRows] = {};
};

__device__ __forceinline__ std::size_t mean_row(const MeanRows& which, int i) {
  return static_cast<std::size_t>(which.list != nullptr ? which.list[i] : which.inline_rows[i]);
}

// grid: x = reduction block over d. For each k of the thread's grid-stride
// slice: m = (sum over `which`, in order, of double(rows[r][k])) / count in
// fp64, the CPU's arithmetic term for term, so float(m) is bitwise the CPU's
// mean. With Sums the thread also keeps fp64 partials of m^2 and of
// sum_r (double(rows[r][k]) - m)^2, which the block sums in a fixed tree into
// partials[s * blocks + block]. `rows` and `mean` are not __restrict__: mean[k]
// is written after the last read of column k, so `mean` may be one of the rows.
template <bool Sums>
__global__ void __launch_bounds__(kThreads)
    mean_of_rows_kernel(const float* rows, std::size_t d, const __grid_constant__ MeanRows which,
                        float* mean, double* partials, int blocks) {
  const int block = static_cast<int>(blockIdx.x);
  const std::size_t stride = static_cast<std::size_t>(blocks) * kThreads;
  const double count = static_cast<double>(which.count);
  double acc[2] = {0.0, 0.0};
  for (std::size_t k = static_cast<std::size_t>(block) * kThreads + threadIdx.x; k < d;
       k += stride) {
    double m = 0.0;
    for (int i = 0; i < which.count; ++i)
      m += static_cast<double>(rows[mean_row(which, i) * d + k]);
    m /= count;
    if constexpr (Sums) {
      acc[0] += m * m;
      for (int i = 0; i < which.count; ++i) {
        const double e = static_cast<double>(rows[mean_row(which, i) * d + k]) - m;
        acc[1] += e * e;
      }
    }
    mean[k] = static_cast<float>(m);
  }
  if constexpr (Sums) block_sum_to_partials<2>(acc, partials, blocks, block);
}

// ---- optimizer_step ------------------------------------------------------------

constexpr int kMaxRangesPerLaunch = 16;
// The compiler loads the weights of the remainder loop below (up to three rows)
// before it tests the loop's bound; zeroed floats after the last weight keep those
// loads inside the allocation (compute-sanitizer's memcheck flags them otherwise).
constexpr int kWeightPad = 4;

// The ranges of one launch, passed by value as a kernel argument (a few
// hundred bytes, read through the constant cache): range r covers
// [begin[r], begin[r + 1]) in absolute coordinates, r < count.
template <class O>
struct RangeTable {
  int count = 0;
  std::size_t begin[kMaxRangesPerLaunch + 1] = {};
  typename O::Coefficients coefficients[kMaxRangesPerLaunch] = {};
};

// One pass over [table.begin[0], table.begin[count]): g = sum_j
// float(weights[j]) * history[j][k] (Weighted) or gradient[k];
// predicted[k] = g; x_out[k] = x_in[k] updated by O::update with g, the
// state's slots at k and the coefficients of k's range. The weighted sum is
// the CPU's streaming::weighted_sum, term for term: fp32, rows in groups of
// four as (w0 r0 + w1 r1) + (w2 r2 + w3 r3), then the rest one at a time.
// x_in may equal x_out, so neither is __restrict__. `d` is the history's row
// stride.
template <bool Weighted, class Store, class O>
__global__ void __launch_bounds__(kThreads)
    step_kernel(const Store* __restrict__ history, const double* __restrict__ weights, int nrows,
                const float* gradient, float* predicted, const float* x_in, float* x_out,
                StateRows state, std::size_t d, const __grid_constant__ RangeTable<O> table) {
  extern __shared__ float w[];  // nrows + kWeightPad floats
  if constexpr (Weighted) {
    for (int j = static_cast<int>(threadIdx.x); j < nrows + kWeightPad; j += kThreads)
      w[j] = j < nrows ? static_cast<float>(weights[j]) : 0.0f;
    __syncthreads();
  }
  const std::size_t end = table.begin[table.count];
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * kThreads;
  int r = 0;  // k only grows, so k's range only moves forward
  for (std::size_t k =
           table.begin[0] + static_cast<std::size_t>(blockIdx.x) * kThreads + threadIdx.x;
       k < end; k += step) {
    while (k >= table.begin[r + 1]) ++r;
    float g;
    if constexpr (Weighted) {
      float acc = 0.0f;
      int j = 0;
#pragma unroll 2
      for (; j + 4 <= nrows; j += 4) {
        const float r0 = detail::load_as_float(history[static_cast<std::size_t>(j) * d + k]);
        const float r1 = detail::load_as_float(history[static_cast<std::size_t>(j + 1) * d + k]);
        const float r2 = detail::load_as_float(history[static_cast<std::size_t>(j + 2) * d + k]);
        const float r3 = detail::load_as_float(history[static_cast<std::size_t>(j + 3) * d + k]);
        acc += (w[j] * r0 + w[j + 1] * r1) + (w[j + 2] * r2 + w[j + 3] * r3);
      }
      for (; j < nrows; ++j)
        acc += w[j] * detail::load_as_float(history[static_cast<std::size_t>(j) * d + k]);
      g = acc;
      if (predicted != nullptr) predicted[k] = g;
    } else {
      g = gradient[k];
    }
    SlotValues s = {};
#pragma unroll
    for (int j = 0; j < kMaxStateSlots; ++j) {
      if (state.slot[j] != nullptr) s[j] = state.from[j][k];  // launch_step set every from[j]
    }
    float x = x_in[k];
    O::update(x, g, s, table.coefficients[r]);
#pragma unroll
    for (int j = 0; j < kMaxStateSlots; ++j) {
      if (state.slot[j] != nullptr) state.slot[j][k] = s[j];
    }
    x_out[k] = x;
  }
}

// Launches step_kernel over the ranges of one optimizer kind, up to
// kMaxRangesPerLaunch ranges per launch.
template <class Store, class O>
void launch_step(const Store* history, const double* weights, int nrows, const float* gradient,
                 float* predicted, const float* x_in, float* x_out, StateRows state,
                 const StepRanges<O>& ranges, std::size_t d, cudaStream_t stream) {
  static_assert(sizeof(RangeTable<O>) <= 2048, "kernel arguments are limited to 4 KiB");
  const std::size_t count = ranges.coefficients.size();
  bool covers = count > 0 && ranges.begin.size() == count + 1 && ranges.begin.front() == 0 &&
                ranges.begin.back() == d;
  for (std::size_t r = 0; covers && r < count; ++r) covers = ranges.begin[r] < ranges.begin[r + 1];
  if (!covers) {
    throw std::invalid_argument(
        "coefficients: the ranges must cover [0, d) in increasing, non-empty pieces, d = " +
        std::to_string(d));
  }
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (ranges.slots.uses(j) && state.slot[j] == nullptr) {
      const auto slot = static_cast<std::size_t>(j);
      const std::string_view name = slot < O::slot_names.size() ? O::slot_names[slot] : "?";
      throw std::invalid_argument("state: slot " + std::to_string(j) + " (" + std::string(name) +
                                  ") must not be null for " + std::string(O::name));
    }
  }
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (state.from[j] == nullptr) state.from[j] = state.slot[j];  // in place
  }
  const bool weighted = weights != nullptr;
  if (weighted) {
    if (nrows < 0 || nrows > kMaxStepRows) {
      throw std::invalid_argument("nrows: must be in [0, " + std::to_string(kMaxStepRows) +
                                  "] for the CUDA proxy step, got " + std::to_string(nrows));
    }
    if (nrows > 0 && history == nullptr) {
      throw std::invalid_argument("history: must not be null when nrows > 0");
    }
  } else if (gradient == nullptr) {
    throw std::invalid_argument("gradient: must not be null when weights is null");
  }
  const std::size_t shared =
      weighted ? static_cast<std::size_t>(nrows + kWeightPad) * sizeof(float) : 0;
  // Past the default 48 KiB a kernel must opt in to more dynamic shared memory.
  if (shared > 48 * 1024) {
    OPTEX_CUDA_CHECK(cudaFuncSetAttribute(step_kernel<true, Store, O>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared)));
  }
  for (std::size_t first = 0; first < count; first += kMaxRangesPerLaunch) {
    RangeTable<O> table;
    table.count = static_cast<int>(std::min<std::size_t>(kMaxRangesPerLaunch, count - first));
    for (int r = 0; r <= table.count; ++r) table.begin[r] = ranges.begin[first + r];
    for (int r = 0; r < table.count; ++r) table.coefficients[r] = ranges.coefficients[first + r];
    const std::size_t lo = table.begin[0];
    const std::size_t hi = table.begin[table.count];
    if (hi <= lo) continue;
    const unsigned blocks = elementwise_blocks(hi - lo);
    if (weighted) {
      step_kernel<true, Store, O><<<blocks, kThreads, shared, stream>>>(
          history, weights, nrows, gradient, predicted, x_in, x_out, state, d, table);
    } else {
      step_kernel<false, Store, O><<<blocks, kThreads, 0, stream>>>(
          history, weights, nrows, gradient, predicted, x_in, x_out, state, d, table);
    }
    OPTEX_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

// ---- host launchers ------------------------------------------------------------

int reduction_blocks(std::size_t d) {
  const std::size_t per_block = kThreads * kElementsPerThread;
  const std::size_t blocks = (d + per_block - 1) / per_block;
  return static_cast<int>(
      std::clamp<std::size_t>(blocks, 1, static_cast<std::size_t>(kMaxReductionBlocks)));
}

int distance_queries_per_pass(int nrows) {
  // At most INT_MAX partial rows, the count sum_partials takes.
  return std::clamp(INT_MAX / std::max(nrows, 1), 1, kDistanceQueriesPerPass);
}

std::size_t squared_distances_partial_rows(int nrows, int nqueries) {
  if (nrows <= 0 || nqueries <= 0) return 0;
  return static_cast<std::size_t>(nrows) *
         static_cast<std::size_t>(std::min(nqueries, distance_queries_per_pass(nrows)));
}

template <class Store, class Query>
void squared_distances(const Store* rows, int nrows, std::size_t d, const Query* queries,
                       int nqueries, double* partials, double* out, cudaStream_t stream) {
  if (nrows <= 0 || nqueries <= 0) return;
  const std::size_t nrows_z = static_cast<std::size_t>(nrows);
  if (d == 0) {
    OPTEX_CUDA_CHECK(cudaMemsetAsync(
        out, 0, nrows_z * static_cast<std::size_t>(nqueries) * sizeof(double), stream));
    return;
  }
  const int blocks = reduction_blocks(d);
  const int per_pass = distance_queries_per_pass(nrows);
  // per_pass queries at a time: the rows are read ceil(nqueries / per_pass)
  // times, and partials (per_pass * nrows rows) is reused pass after pass (the
  // launches are ordered on the stream).
  for (int q0 = 0; q0 < nqueries; q0 += per_pass) {
    const int group = std::min(per_pass, nqueries - q0);
    squared_distances_pass<kDistanceQueriesPerPass>(group, rows, nrows, d,
                                                    queries + static_cast<std::size_t>(q0) * d,
                                                    partials, blocks, stream);
    sum_partials(partials, group * nrows, blocks, out + static_cast<std::size_t>(q0) * nrows_z,
                 stream);
  }
}

void covariance_vector(const double* squared_distances, int n, Covariance kernel,
                       double inv_scaled_lengthscale, double* out, cudaStream_t stream) {
  if (n <= 0) return;
  covariance_vector_kernel<<<1, kThreads, 0, stream>>>(squared_distances, n, kernel,
                                                       inv_scaled_lengthscale, out);
  OPTEX_CUDA_CHECK(cudaGetLastError());
}

template <class Store>
void row_dots(const Store* a, const Store* b, int nrows, std::size_t d, double* partials,
              double* out, cudaStream_t stream) {
  if (nrows <= 0) return;
  if (d == 0) {
    OPTEX_CUDA_CHECK(
        cudaMemsetAsync(out, 0, static_cast<std::size_t>(nrows) * sizeof(double), stream));
    return;
  }
  const int blocks = reduction_blocks(d);
  for (int row0 = 0; row0 < nrows; row0 += kMaxGridY) {
    const int count = std::min(kMaxGridY, nrows - row0);
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(count));
    row_dots_kernel<<<grid, kThreads, 0, stream>>>(a, b, row0, d, partials, blocks);
    OPTEX_CUDA_CHECK(cudaGetLastError());
  }
  sum_partials(partials, nrows, blocks, out, stream);
}

void rows_finite(const float* rows, int nrows, std::size_t d, float bound, int* finite,
                 cudaStream_t stream) {
  if (nrows <= 0) return;
  fill_ones_kernel<<<static_cast<unsigned>(std::min(ceil_div(nrows, kThreads), 1024)), kThreads, 0,
                     stream>>>(finite, nrows);
  OPTEX_CUDA_CHECK(cudaGetLastError());
  if (d == 0) return;
  const int blocks = reduction_blocks(d);
  for (int row0 = 0; row0 < nrows; row0 += kMaxGridY) {
    const int count = std::min(kMaxGridY, nrows - row0);
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(count));
    rows_finite_kernel<<<grid, kThreads, 0, stream>>>(rows, row0, d, bound, finite);
    OPTEX_CUDA_CHECK(cudaGetLastError());
  }
}

template <class Store>
void store_values(const float* src, Store* dst, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  store_values_kernel<Store><<<elementwise_blocks(count), kThreads, 0, stream>>>(src, dst, count);
  OPTEX_CUDA_CHECK(cudaGetLastError());
}

template <class Store>
void load_values(const Store* src, float* dst, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  load_values_kernel<Store><<<elementwise_blocks(count), kThreads, 0, stream>>>(src, dst, count);
  OPTEX_CUDA_CHECK(cudaGetLastError());
}

void pair_statistics(const float* a, const float* b, std::size_t d, double* partials, double* out,
                     cudaStream_t stream) {
  if (d == 0) {
    OPTEX_CUDA_CHECK(cudaMemsetAsync(out, 0, 4 * sizeof(double), stream));
    return;
  }
  const int blocks = reduction_blocks(d);
  pair_statistics_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, b, d, partials,
                                                                                 blocks);
  OPTEX_CUDA_CHECK(cudaGetLastError());
  sum_partials(partials, 4, blocks, out, stream);
}

void widen_floats(const float* src, double* dst, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  widen_floats_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(src, dst, count);
  OPTEX_CUDA_CHECK(cudaGetLastError());
}

void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n, float* out,
                        cudaStream_t stream) {
  if (n == 0 || count == 0) return;
  mean_in_rank_order_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(blocks, count, n, out);
  OPTEX_CUDA_CHECK(cudaGetLastError());
}

void posterior_variance(const double* k, const double* w, int n, double* variance,
                        cudaStream_t stream) {
  posterior_variance_kernel<<<1, 1, 0, stream>>>(k, w, std::max(n, 0), variance);
  OPTEX_CUDA_CHECK(cudaGetLastError());
}

void mean_of_rows(const float* rows, std::span<const int> which, const int* device_which,
                  std::size_t d, float* mean, double* partials, double* sums, cudaStream_t stream) {
  MeanRows table;
  if (which.size() > static_cast<std::size_t>(kMaxInlineMeanRows)) {
    if (which.size() > static_cast<std::size_t>(INT_MAX) || device_which == nullptr) {
      throw std::invalid_argument("which: " + std::to_string(which.size()) +
                                  " rows need a device copy of the list (at most " +
                                  std::to_string(kMaxInlineMeanRows) +
                                  " travel as kernel arguments)");
    }
    table.list = device_which;
  } else {
    std::copy(which.begin(), which.end(), table.inline_rows);
  }
  table.count = static_cast<int>(which.size());
  if (d == 0) {
    if (sums != nullptr) OPTEX_CUDA_CHECK(cudaMemsetAsync(sums, 0, 2 * sizeof(double), stream));
    return;
  }
  const int blocks = reduction_blocks(d);
  const auto grid = static_cast<unsigned>(blocks);
  if (sums == nullptr) {
    mean_of_rows_kernel<false>
        <<<grid, kThreads, 0, stream>>>(rows, d, table, mean, nullptr, blocks);
    OPTEX_CUDA_CHECK(cudaGetLastError());
    return;
  }
  mean_of_rows_kernel<true><<<grid, kThreads, 0, stream>>>(rows, d, table, mean, partials, blocks);
  OPTEX_CUDA_CHECK(cudaGetLastError());
  sum_partials(partials, 2, blocks, sums, stream);
}

void fill_step_coefficients(const OptimizerRanges& ranges, std::int64_t step,
                            StepCoefficients& out) {
  std::visit(
      [&](const auto& first) {
        using O = std::decay_t<decltype(first)>;
        if (!std::holds_alternative<StepRanges<O>>(out)) out = StepRanges<O>{};
        StepRanges<O>& table = std::get<StepRanges<O>>(out);
        table.begin.assign(1, 0);
        table.coefficients.clear();
        table.slots = ranges.state_slots();
        for (const OptimizerRange& range : ranges.ranges()) {
          table.begin.push_back(table.begin.back() + range.size);
          table.coefficients.push_back(
              std::get<O>(range.optimizer).coefficients(range.local_step(step)));
        }
      },
      ranges.front());
}

template <class Store>
void optimizer_step(const Store* history, const double* weights, int nrows, const float* gradient,
                    float* predicted, const float* x_in, float* x_out, StateRows state,
                    const StepCoefficients& coefficients, std::size_t d, cudaStream_t stream) {
  if (d == 0) return;
  // Every optimizer kind of the variant gets its kernels here.
  std::visit(
      [&](const auto& ranges) {
        using O = typename std::decay_t<decltype(ranges)>::Kind;
        launch_step<Store, O>(history, weights, nrows, gradient, predicted, x_in, x_out, state,
                              ranges, d, stream);
      },
      coefficients);
}

// ---- explicit instantiations ---------------------------------------------------

#define OPTEX_INSTANTIATE_STORE(Store)                                                             \
  template void squared_distances<Store, float>(const Store*, int, std::size_t, const float*, int, \
                                                double*, double*, cudaStream_t);                   \
  template void squared_distances<Store, bf16_bits>(                                               \
      const Store*, int, std::size_t, const bf16_bits*, int, double*, double*, cudaStream_t);      \
  template void row_dots<Store>(const Store*, const Store*, int, std::size_t, double*, double*,    \
                                cudaStream_t);                                                     \
  template void store_values<Store>(const float*, Store*, std::size_t, cudaStream_t);              \
  template void load_values<Store>(const Store*, float*, std::size_t, cudaStream_t);               \
  template void optimizer_step<Store>(const Store*, const double*, int, const float*, float*,      \
                                      const float*, float*, StateRows, const StepCoefficients&,    \
                                      std::size_t, cudaStream_t);

OPTEX_INSTANTIATE_STORE(float)
OPTEX_INSTANTIATE_STORE(bf16_bits)

#undef OPTEX_INSTANTIATE_STORE

}  // namespace optex::cuda
