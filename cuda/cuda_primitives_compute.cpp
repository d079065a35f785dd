// CUDA's primitives: the reductions over d, the GP, the optimizer step and
// mean_of_rows (cuda_primitives.hpp describes the whole class). Every call
// enqueues on the stream and returns.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "anchor_products.cuh"
#include "cuda_check.hpp"
#include "cuda_primitives.hpp"
#include "optex/backend/streaming.hpp"

namespace optex::cuda {
namespace {

using detail::Storage;
using detail::StoredRows;

// f(Store{}) with Store the C++ type of `storage`: float or bf16_bits.
template <class F>
void with_store(Storage storage, F&& f) {
  if (storage == Storage::bf16) {
    f(bf16_bits{});
  } else {
    f(float{});
  }
}

template <class Store>
const Store* as(StoredRows rows) {
  return static_cast<const Store*>(rows.data);
}

// The kernels and the libraries count rows in int.
int checked_int(std::size_t value, const char* what) {
  if (value > static_cast<std::size_t>(INT_MAX)) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(value) +
                                " is more than the CUDA primitives take (" +
                                std::to_string(INT_MAX) + ")");
  }
  return static_cast<int>(value);
}

// The end of the run of adjacent queries that starts at q0: queries q0..end-1
// have one storage and each starts d values after the one before, so one
// launch (or GEMM) covers them as consecutive rows.
std::size_t run_end(std::span<const StoredRows> queries, std::size_t q0, std::size_t d) {
  std::size_t end = q0 + 1;
  while (end < queries.size() && queries[end].storage == queries[q0].storage &&
         queries[end].data == queries[end - 1].row(1, d).data)
    ++end;
  return end;
}

}  // namespace

// ---- reductions over d ---------------------------------------------------------------

void CudaPrimitives::squared_distances(StoredRows rows, std::size_t nrows, std::size_t d,
                                       std::span<const StoredRows> queries, double* out,
                                       double* norms) {
  DeviceGuard guard(index_);
  const int nr = checked_int(nrows, "nrows");
  for (std::size_t q0 = 0; q0 < queries.size();) {
    const std::size_t q1 = run_end(queries, q0, d);
    const int q = checked_int(q1 - q0, "queries");
    const StoredRows first = queries[q0];
    // squared_distances reuses nrows rows of partials per query of a pass,
    // row_dots needs q rows.
    double* scratch = partials(d, std::max(cuda::squared_distances_partial_rows(nr, q), q1 - q0));
    with_store(rows.storage, [&](auto row_tag) {
      using Store = decltype(row_tag);
      with_store(first.storage, [&](auto query_tag) {
        using Query = decltype(query_tag);
        cuda::squared_distances<Store, Query>(as<Store>(rows), nr, d, as<Query>(first), q, scratch,
                                              out + q0 * nrows, stream());
      });
    });
    if (norms != nullptr) {
      with_store(first.storage, [&](auto query_tag) {
        using Query = decltype(query_tag);
        row_dots<Query>(as<Query>(first), as<Query>(first), q, d, scratch, norms + q0, stream());
      });
    }
    q0 = q1;
  }
}

void CudaPrimitives::gemm(StoredRows rows, std::size_t nrows, std::size_t d, StoredRows first,
                          std::size_t q, float* out) {
  // Row-major nrows x d rows = column-major d x nrows with ld = d: C = A^T B,
  // C column-major nrows x q, so C[j + k * nrows] = <rows[j], first[k]>.
  const cudaDataType_t type = rows.storage == Storage::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const float one = 1.0f;
  const float zero = 0.0f;
#if CUBLAS_VER_MAJOR >= 12
  // The 64-bit interface: d may exceed INT_MAX.
  OPTEX_CUDA_CHECK(cublasGemmEx_64(
      blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<std::int64_t>(nrows),
      static_cast<std::int64_t>(q), static_cast<std::int64_t>(d), &one, rows.data, type,
      static_cast<std::int64_t>(d), first.data, type, static_cast<std::int64_t>(d), &zero, out,
      CUDA_R_32F, static_cast<std::int64_t>(nrows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
#else
  const int dd = checked_int(d, "d");
  OPTEX_CUDA_CHECK(cublasGemmEx(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, checked_int(nrows, "nrows"),
                                checked_int(q, "queries"), dd, &one, rows.data, type, dd,
                                first.data, type, dd, &zero, out, CUDA_R_32F,
                                static_cast<int>(nrows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
#endif
}

void CudaPrimitives::inner_products(StoredRows rows, std::size_t nrows, std::size_t d,
                                    std::span<const StoredRows> queries, double* out) {
  DeviceGuard guard(index_);
  for (const StoredRows& query : queries) {
    if (query.storage != rows.storage) {  // cublasGemmEx takes A and B of one type
      throw std::invalid_argument(
          "inner_products: the queries must be stored like the rows on a CUDA device");
    }
  }
  const std::size_t values = nrows * queries.size();
  if (values == 0) return;
  if (d == 0) {
    OPTEX_CUDA_CHECK(cudaMemsetAsync(out, 0, values * sizeof(double), stream()));
    return;
  }
  // fp32 products (the GEMM's output, as the old backend's Gram rows), then
  // one pass widens them into `out`.
  float* products = scratch<float>(products_, values);
  for (std::size_t q0 = 0; q0 < queries.size();) {
    const std::size_t q1 = run_end(queries, q0, d);
    gemm(rows, nrows, d, queries[q0], q1 - q0, products + q0 * nrows);
    q0 = q1;
  }
  widen_floats(products, out, values, stream());
}

void CudaPrimitives::anchor_products(StoredRows points, StoredRows gradients, std::size_t n,
                                     std::size_t d, const float* a, const float* m,
                                     std::span<const int> fresh, double* out) {
  DeviceGuard guard(index_);
  // Everything is checked before the scratch grows or anything is enqueued.
  streaming::check_fresh_rows(fresh, n);
  if (points.storage != gradients.storage) {
    throw std::invalid_argument(
        "anchor_products: the points and the gradients must have one storage");
  }
  if (d > 0 && (a == nullptr || (n > 0 && (points.data == nullptr || gradients.data == nullptr)))) {
    throw std::invalid_argument(
        "anchor_products: the anchor, the points and the gradients must not be null");
  }
  // The kernels count rows in int: n, and the partial rows (more than n + 1,
  // the grid's blocks per slice of d).
  const int nrows = checked_int(n, "anchor_products: n");
  const std::size_t partial_rows = anchor_products_partial_rows(n, fresh.size());
  (void)checked_int(partial_rows, "anchor_products: partial rows");
  double* scratch = d > 0 ? partials(d, partial_rows) : nullptr;
  with_store(points.storage, [&](auto tag) {
    using Store = decltype(tag);
    cuda::anchor_products<Store>(as<Store>(points), as<Store>(gradients), nrows, d, a, m, fresh,
                                 scratch, out, stream());
  });
}

void CudaPrimitives::pair_statistics(const float* a, const float* b, std::size_t d, double* out) {
  DeviceGuard guard(index_);
  cuda::pair_statistics(a, b, d, partials(d, 4), out, stream());
}

void CudaPrimitives::dot(const float* a, const float* b, std::size_t d, double* out) {
  DeviceGuard guard(index_);
  row_dots<float>(a, b, 1, d, partials(d, 1), out, stream());
}

void CudaPrimitives::within_bound(const float* rows, std::size_t nrows, std::size_t d, float bound,
                                  int* flags) {
  DeviceGuard guard(index_);
  rows_finite(rows, checked_int(nrows, "nrows"), d, bound, flags, stream());
}

// ---- the GP ------------------------------------------------------------------------------
// The formulas of optex/estimator/gp_fit.hpp, which the host's GpFactor runs: the
// kernel vector and the clamped variance by the kernels of kernels.cu, the factor and
// the solve by cuSOLVER (potrf, potrs) instead of Eigen's LLT.

void CudaPrimitives::factor(const double* host, std::size_t n, int* info) {
  DeviceGuard guard(index_);
  has_factor_ = false;
  const int ni = checked_int(n, "n");
  if (n == 0) {  // the empty matrix is positive definite (as Eigen's LLT says)
    OPTEX_CUDA_CHECK(cudaMemsetAsync(info, 0, sizeof(int), stream()));
    factored_ = 0;
    has_factor_ = true;
    return;
  }
  double* a = scratch<double>(factor_, n * n);
  OPTEX_CUDA_CHECK(
      cudaMemcpyAsync(a, host, n * n * sizeof(double), cudaMemcpyHostToDevice, stream()));
  int lwork = 0;
  OPTEX_CUDA_CHECK(
      cusolverDnDpotrf_bufferSize(solver_.get(), CUBLAS_FILL_MODE_LOWER, ni, a, ni, &lwork));
  double* work = scratch<double>(potrf_work_, static_cast<std::size_t>(std::max(lwork, 1)));
  OPTEX_CUDA_CHECK(
      cusolverDnDpotrf(solver_.get(), CUBLAS_FILL_MODE_LOWER, ni, a, ni, work, lwork, info));
  factored_ = n;
  has_factor_ = true;
}

void CudaPrimitives::gp_weights(const double* squared_distances, std::size_t n, Covariance kernel,
                                double inv_scaled_lengthscale, double* weights, double* variance,
                                int* info) {
  DeviceGuard guard(index_);
  if (!has_factor_ || n != factored_) {
    throw std::logic_error("cuda primitives: gp_weights for " + std::to_string(n) +
                           " rows needs a factor() of that size first");
  }
  const int ni = static_cast<int>(n);  // factor() checked it
  // k := kernel(distances) (kept for the variance), weights := k, solved in place.
  double* k = scratch<double>(kernel_vector_, std::max<std::size_t>(n, 1));
  if (n > 0) {
    covariance_vector(squared_distances, ni, kernel, inv_scaled_lengthscale, k, stream());
    OPTEX_CUDA_CHECK(
        cudaMemcpyAsync(weights, k, n * sizeof(double), cudaMemcpyDeviceToDevice, stream()));
    OPTEX_CUDA_CHECK(cusolverDnDpotrs(solver_.get(), CUBLAS_FILL_MODE_LOWER, ni, 1,
                                      reinterpret_cast<const double*>(factor_.data()), ni, weights,
                                      ni, info));
  } else {
    OPTEX_CUDA_CHECK(cudaMemsetAsync(info, 0, sizeof(int), stream()));
  }
  cuda::posterior_variance(k, weights, ni, variance, stream());
}

// ---- the optimizer -----------------------------------------------------------------------

void CudaPrimitives::step(const OptimizerRanges& ranges, std::int64_t step,
                          detail::StateRows state_in, detail::StateRows state_out,
                          const float* x_in, float* x_out, const detail::StepGradient& gradient,
                          std::size_t d, const detail::StepChecks& checks) {
  DeviceGuard guard(index_);
  const float* g = gradient.weights == nullptr ? gradient.row : gradient.sum;
  if (checks.gradient_norm != nullptr && g == nullptr) {
    throw std::invalid_argument("checks: the gradient's norm of a weighted step needs its sum row");
  }
  if (checks.step_length != nullptr && x_in == x_out) {
    throw std::invalid_argument("checks: the step's length needs x_in and x_out apart");
  }
  fill_step_coefficients(ranges, step, coefficients_);
  StateRows slots;
  std::copy(std::begin(state_out.slot), std::end(state_out.slot), std::begin(slots.slot));
  std::copy(std::begin(state_in.slot), std::end(state_in.slot), std::begin(slots.from));
  if (gradient.weights == nullptr) {
    optimizer_step<float>(nullptr, nullptr, 0, gradient.row, nullptr, x_in, x_out, slots,
                          coefficients_, d, stream());
  } else {
    const int rows = checked_int(gradient.rows, "rows");
    with_store(gradient.history.storage, [&](auto tag) {
      using Store = decltype(tag);
      optimizer_step<Store>(as<Store>(gradient.history), gradient.weights, rows, nullptr,
                            gradient.sum, x_in, x_out, slots, coefficients_, d, stream());
    });
  }
  // The checks as passes of their own, through the primitives that define
  // them: the values the CPU takes inside its step's pass.
  if (checks.flags != nullptr) {
    within_bound(x_out, 1, d, checks.bound, checks.flags);
    int r = 1;
    for (int j = 0; j < kMaxStateSlots; ++j) {
      if (ranges.state_slots().uses(j))
        within_bound(state_out.slot[j], 1, d, FLT_MAX, checks.flags + r++);
    }
  }
  if (checks.gradient_norm != nullptr) dot(g, g, d, checks.gradient_norm);
  if (checks.step_length != nullptr) {
    const detail::StoredRows from = detail::fp32_rows(x_in);
    squared_distances(detail::fp32_rows(x_out), 1, d, {&from, 1}, checks.step_length, nullptr);
  }
}

void CudaPrimitives::mean_of_rows(const float* rows, std::span<const int> which, std::size_t d,
                                  float* mean, double* sums) {
  DeviceGuard guard(index_);
  const int* device_which = nullptr;
  if (which.size() > static_cast<std::size_t>(kMaxInlineMeanRows)) {
    // Too many for the kernel's arguments: a device copy, from a host copy
    // kept until the next fetch() (the caller may change `which` at once, and
    // an asynchronous copy from pageable memory need not have read it on
    // return). The stream orders the next call's copy into the same scratch
    // after this launch.
    (void)checked_int(which.size(), "which");
    const std::vector<int>& held = held_lists_.emplace_back(which.begin(), which.end());
    int* list = scratch<int>(which_, held.size());
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(list, held.data(), held.size() * sizeof(int),
                                     cudaMemcpyHostToDevice, stream()));
    device_which = list;
  }
  double* scratch_partials = sums != nullptr ? partials(d, 2) : nullptr;
  cuda::mean_of_rows(rows, which, device_which, d, mean, scratch_partials, sums, stream());
}

void CudaPrimitives::mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                                        float* out) {
  DeviceGuard guard(index_);
  cuda::mean_in_rank_order(blocks, count, n, out, stream());
}

}  // namespace optex::cuda
