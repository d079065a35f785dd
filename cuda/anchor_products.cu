// The anchor products (see anchor_products.cuh).
//
// One pass over the rows: grid x = row j (fastest, so the blocks of every row
// working on one slice of d run side by side and read the anchor, the momentum
// and the fresh rows once from DRAM, then from L2), plus one block at x = n for
// the three scalars in the pass that computes them; grid y = reduction block
// over d. Each thread keeps fp64 accumulators for its row j: the six per-row
// products (first pass only) and, for each fresh slot t of the pass,
// <G_t, X_t - X_j> and <G_j, X_j - X_t>. So each of X_j and G_j is read from
// DRAM once per pass.
//
// Compiled with --fmad=false (kernels.cu's flags): no product is contracted
// into an add.

#include <algorithm>
#include <cstddef>

#include "anchor_products.cuh"
#include "cuda_check.hpp"
#include "kernels.cuh"
#include "optex/backend/device_primitives.hpp"

namespace optex::cuda {
namespace {

constexpr int kThreads = 256;  // threads per block, as kernels.cu's reductions
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRowSums = 6;  // e, f, q, h, s, r
constexpr int kScalarSums = 3;
// fp64 accumulators per thread: the row sums, then rows[p], then cols[p].
constexpr int kAccumulators = kRowSums + 2 * kAnchorFreshPerPass;

// The fresh slots of one pass (kernel argument): slot[p] for p < count.
struct FreshPass {
  int count = 0;
  int slot[kAnchorFreshPerPass] = {};
};

// Where a pass's block writes accumulator i of row j, as partial rows
// (query-major like the output): the row sums at i * n + j, the scalars at
// 6 n + i (with_anchor only), rows[p] then cols[p] after them. kSkip where
// the accumulator is not used by this pass.
constexpr std::size_t kSkip = ~std::size_t{0};
struct PartialRows {
  std::size_t n;
  bool with_anchor;
  int fresh;
  __device__ std::size_t fresh_base() const {
    return with_anchor ? 6 * n + kScalarSums : std::size_t{0};
  }
  __device__ std::size_t row_sum(int i, std::size_t j) const {
    return with_anchor ? static_cast<std::size_t>(i) * n + j : kSkip;
  }
  __device__ std::size_t fresh_sum(int i, std::size_t j) const {
    const int p = (i - kRowSums) % kAnchorFreshPerPass;  // i - kRowSums < 2 * per pass
    const bool col = i - kRowSums >= kAnchorFreshPerPass;
    if (p >= fresh) return kSkip;
    return fresh_base() + (col ? static_cast<std::size_t>(fresh) * n : std::size_t{0}) +
           static_cast<std::size_t>(p) * n + j;
  }
};

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  return v;  // the warp's sum in lane 0, in a fixed order
}

// Sums acc[i] over the block in a fixed tree order and writes the block's sum
// to partials[row(i) * blocks + block], except where row(i) is kSkip. Every
// thread of the block must call it.
template <int N, class Row>
__device__ __forceinline__ void block_sums(const double (&acc)[N], double* partials, int blocks,
                                           Row row) {
  __shared__ double warp_sums[N][kWarps];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const double s = warp_sum(acc[i]);
    if (lane == 0) warp_sums[i][warp] = s;
  }
  __syncthreads();
  const int i = static_cast<int>(threadIdx.x);
  if (i < N) {
    const std::size_t r = row(i);
    if (r == kSkip) return;
    double s = 0.0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += warp_sums[i][w];
    partials[r * static_cast<std::size_t>(blocks) + blockIdx.y] = s;
  }
}

template <class Store>
__device__ __forceinline__ double load_as_double(const Store& v) {
  return static_cast<double>(detail::load_as_float(v));
}

// The scalars' block (x = n): ||m||^2, <a, m>, ||a||^2 over its slice of d.
__device__ void anchor_scalars(std::size_t d, const float* __restrict__ a,
                               const float* __restrict__ m, double* partials, int blocks,
                               std::size_t n) {
  double acc[kScalarSums] = {0.0, 0.0, 0.0};
  const std::size_t stride = static_cast<std::size_t>(blocks) * kThreads;
  for (std::size_t k = static_cast<std::size_t>(blockIdx.y) * kThreads + threadIdx.x; k < d;
       k += stride) {
    const double av = a[k];
    acc[2] += av * av;
    if (m != nullptr) {
      const double mv = m[k];
      acc[0] += mv * mv;
      acc[1] += av * mv;
    }
  }
  block_sums(acc, partials, blocks, [n](int i) { return 6 * n + static_cast<std::size_t>(i); });
}

// One pass (see the file's comment). with_anchor: the row sums and the
// scalars; fresh: the pass's fresh slots.
template <class Store>
__global__ void __launch_bounds__(kThreads)
    anchor_products_kernel(const Store* __restrict__ points, const Store* __restrict__ gradients,
                           int n, std::size_t d, const float* __restrict__ a,
                           const float* __restrict__ m, bool with_anchor,
                           const __grid_constant__ FreshPass fresh, double* partials, int blocks) {
  const std::size_t nz = static_cast<std::size_t>(n);
  const std::size_t j = blockIdx.x;
  if (j == nz) {  // only in a with_anchor pass; the whole block takes this branch
    anchor_scalars(d, a, m, partials, blocks, nz);
    return;
  }
  const Store* xj = points + j * d;
  const Store* gj = gradients + j * d;
  double acc[kAccumulators];
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0;

  const std::size_t stride = static_cast<std::size_t>(blocks) * kThreads;
  for (std::size_t k = static_cast<std::size_t>(blockIdx.y) * kThreads + threadIdx.x; k < d;
       k += stride) {
    const double x = load_as_double(xj[k]);
    const double g = load_as_double(gj[k]);
    if (with_anchor) {
      const double av = a[k];
      const double u = av - x;  // a - X_j, exact: both are fp32 values
      acc[0] += u * u;
      acc[2] += av * u;
      acc[4] += g * u;
      acc[5] += av * g;
      if (m != nullptr) {  // else f and h stay exactly 0, whatever u and g are
        const double mv = m[k];
        acc[1] += mv * u;
        acc[3] += mv * g;
      }
    }
#pragma unroll
    for (int p = 0; p < kAnchorFreshPerPass; ++p) {
      if (p < fresh.count) {
        const std::size_t t = static_cast<std::size_t>(fresh.slot[p]);
        const double xt = load_as_double(points[t * d + k]);
        const double gt = load_as_double(gradients[t * d + k]);
        acc[kRowSums + p] += gt * (xt - x);
        acc[kRowSums + kAnchorFreshPerPass + p] += g * (x - xt);
      }
    }
  }
  const PartialRows rows{nz, with_anchor, fresh.count};
  block_sums(acc, partials, blocks,
             [rows, j](int i) { return i < kRowSums ? rows.row_sum(i, j) : rows.fresh_sum(i, j); });
}

}  // namespace

std::size_t anchor_products_partial_rows(std::size_t n, std::size_t nfresh) {
  const std::size_t per_pass = std::min(nfresh, static_cast<std::size_t>(kAnchorFreshPerPass));
  return 6 * n + kScalarSums + 2 * n * per_pass;
}

template <class Store>
void anchor_products(const Store* points, const Store* gradients, int n, std::size_t d,
                     const float* a, const float* m, std::span<const int> fresh, double* partials,
                     double* out, cudaStream_t stream) {
  const std::size_t nz = static_cast<std::size_t>(std::max(n, 0));
  const detail::AnchorLayout layout(nz, fresh.size());
  if (d == 0) {
    OPTEX_CUDA_CHECK(cudaMemsetAsync(out, 0, layout.size() * sizeof(double), stream));
    return;
  }
  const int blocks = reduction_blocks(d);
  // The first pass computes the row sums and the scalars with up to
  // kAnchorFreshPerPass fresh slots; each later pass the next fresh slots.
  // Every pass reuses `partials` from its row 0 (the launches are ordered on
  // the stream).
  std::size_t k0 = 0;
  bool first = true;
  while (first || k0 < fresh.size()) {
    FreshPass pass;
    pass.count = static_cast<int>(
        std::min(fresh.size() - k0, static_cast<std::size_t>(kAnchorFreshPerPass)));
    for (int p = 0; p < pass.count; ++p) pass.slot[p] = fresh[k0 + static_cast<std::size_t>(p)];
    const std::size_t fresh_rows = nz * static_cast<std::size_t>(pass.count);
    const dim3 grid(static_cast<unsigned>(nz) + (first ? 1u : 0u), static_cast<unsigned>(blocks));
    anchor_products_kernel<Store><<<grid, kThreads, 0, stream>>>(points, gradients, n, d, a, m,
                                                                 first, pass, partials, blocks);
    OPTEX_CUDA_CHECK(cudaGetLastError());
    std::size_t base = 0;  // where this pass's fresh partial rows start
    if (first) {
      base = layout.rows();
      sum_partials(partials, static_cast<int>(base), blocks, out, stream);
    }
    const double* fresh_partials = partials + base * static_cast<std::size_t>(blocks);
    sum_partials(fresh_partials, static_cast<int>(fresh_rows), blocks,
                 out + layout.rows() + k0 * nz, stream);
    sum_partials(fresh_partials + fresh_rows * static_cast<std::size_t>(blocks),
                 static_cast<int>(fresh_rows), blocks, out + layout.cols() + k0 * nz, stream);
    k0 += static_cast<std::size_t>(pass.count);
    first = false;
  }
}

template void anchor_products<float>(const float*, const float*, int, std::size_t, const float*,
                                     const float*, std::span<const int>, double*, double*,
                                     cudaStream_t);
template void anchor_products<bf16_bits>(const bf16_bits*, const bf16_bits*, int, std::size_t,
                                         const float*, const float*, std::span<const int>, double*,
                                         double*, cudaStream_t);

}  // namespace optex::cuda
