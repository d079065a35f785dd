// Each CUDA kernel launcher of cuda/kernels.cuh against its CPU twin, on device
// buffers: upload, launch, synchronise, download, compare.
//
//   squared_distances, row_dots   a double reference (error bounds derived below)
//                                 and streaming::squared_distances / dot; several
//                                 queries at once bit for bit as one at a time
//   covariance_vector             optex::covariance_value, within 4 ulp (why: below)
//   rows_finite                   finite and within a bound, over each row
//   store_values, load_values     detail::to_bf16 / from_bf16, bit for bit
//   optimizer_step                streaming::weighted_sum and optex::apply_step,
//                                 bit for bit: x, every state slot, the prediction
//
// Every test but the host arithmetic of the partials' size (CudaKernelsHost)
// needs a CUDA device: without one it is skipped with a message, or
// fails when the environment sets OPTEX_REQUIRE_GPU=1. A build without CUDA
// compiles a stand-in that does the same.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/gpu_test_support.hpp"

#if OPTEX_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "kernels.cuh"
#include "optex/backend/bf16.hpp"
#include "optex/backend/streaming.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/engine_equality.hpp"
#include "support/optimizer_configs.hpp"
#include "support/test_support.hpp"

#endif

namespace {

// ---- the fixture: skip, or fail under OPTEX_REQUIRE_GPU=1 ------------------------------

#if !OPTEX_HAVE_CUDA

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override { optex::test::SkipOrFailWithoutGpu(); }
};

// A build without CUDA has no launchers to test; SetUp skips (or fails under
// OPTEX_REQUIRE_GPU=1) before this body could run.
TEST_F(CudaKernels, NeedACudaBuild) { FAIL() << "unreachable: a build without CUDA has no device"; }

#else  // OPTEX_HAVE_CUDA

using optex::Covariance;
using optex::OptimizerRanges;
using optex::OptimizerState;
using optex::cuda::bf16_bits;
using optex::cuda::DeviceBuffer;
using optex::cuda::StateRows;
using optex::cuda::StepCoefficients;
using optex::detail::from_bf16;
using optex::detail::to_bf16;
using optex::test::BitEqual;
using optex::test::OptimizerConfig;
using optex::test::StateBitEqual;

// The unit roundoff of fp32: every fp32 operation is exact up to a factor 1 + e, |e| <= kU.
constexpr double kU = 0x1p-24;

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    optex::test::SkipOrFailWithoutGpu();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    // A non-blocking stream, like the backend's: the launchers must put all of
    // their work on the stream they are given.
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Waits for the launches on the stream and checks that they ran.
  void Sync() const {
    OPTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    OPTEX_CUDA_CHECK(cudaGetLastError());
  }

  cudaStream_t stream_ = nullptr;
};

// ---- helpers ------------------------------------------------------------------------------

// A copy of host in device memory. cudaMemcpy from pageable memory may return
// before the data has landed, and a non-blocking stream does not wait for the
// legacy stream: wait for the device before anything is launched on it.
template <class T>
DeviceBuffer<T> ToDevice(const std::vector<T>& host) {
  DeviceBuffer<T> buffer(host.size());
  if (!host.empty()) {
    OPTEX_CUDA_CHECK(
        cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  OPTEX_CUDA_CHECK(cudaDeviceSynchronize());
  return buffer;
}

template <class T>
std::vector<T> ToHost(const DeviceBuffer<T>& buffer) {
  std::vector<T> host(buffer.size());
  if (!host.empty()) {
    OPTEX_CUDA_CHECK(
        cudaMemcpy(host.data(), buffer.data(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  }
  return host;
}

std::vector<float> Normal(std::mt19937& rng, std::size_t n, double stddev = 1.0) {
  return optex::test::random_vector(rng, n, 0.0, stddev);
}

// Values in the history's storage type, and back.
template <class Store>
std::vector<Store> Stored(const std::vector<float>& v) {
  if constexpr (std::is_same_v<Store, float>) {
    return v;
  } else {
    std::vector<Store> out(v.size());
    std::transform(v.begin(), v.end(), out.begin(), [](float f) { return to_bf16(f); });
    return out;
  }
}

template <class Store>
std::vector<float> Decoded(const std::vector<Store>& v) {
  std::vector<float> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(),
                 [](Store s) { return optex::detail::load_as_float(s); });
  return out;
}

template <class Store>
std::string StoreName() {
  return std::is_same_v<Store, float> ? "float" : "bf16";
}

// The bits of a float, for bitwise comparisons and messages.
std::uint32_t Bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// How many doubles lie between a and b (same sign): 0 when bitwise equal.
std::uint64_t UlpDistance(double a, double b) {
  const auto ia = std::bit_cast<std::int64_t>(a);
  const auto ib = std::bit_cast<std::int64_t>(b);
  return ia > ib ? static_cast<std::uint64_t>(ia - ib) : static_cast<std::uint64_t>(ib - ia);
}

// The terms each thread of a deterministic reduction sums in fp32: its
// grid-stride slice of [0, d) over reduction_blocks(d) blocks of 256 threads.
std::size_t TermsPerThread(std::size_t d) {
  const std::size_t stride = static_cast<std::size_t>(optex::cuda::reduction_blocks(d)) * 256;
  return (d + stride - 1) / stride;
}

// ---- reduction_blocks ----------------------------------------------------------------------

// The grid depends on d alone: 256 threads x 8 elements per block, 1 to 1024 blocks.
TEST_F(CudaKernels, ReductionBlocksDependOnTheDimensionOnly) {
  using optex::cuda::reduction_blocks;
  EXPECT_EQ(reduction_blocks(0), 1);
  EXPECT_EQ(reduction_blocks(1), 1);
  EXPECT_EQ(reduction_blocks(2048), 1);
  EXPECT_EQ(reduction_blocks(2049), 2);
  EXPECT_EQ(reduction_blocks(5000), 3);
  EXPECT_EQ(reduction_blocks(2048u * 1024u), 1024);
  EXPECT_EQ(reduction_blocks(std::size_t{1} << 40), 1024);
}

// ---- squared_distances ---------------------------------------------------------------------

// Error bounds, relative to the exact sum S = sum_k (x_k - q_k)^2 of non-negative
// terms (x, q as decoded floats):
//  - device: each thread sums its m = TermsPerThread(d) terms in fp32, each term
//    fl(fl(x - q)^2) within (1 + kU)^3 of exact, then fp64 (exact to ~1e-16):
//    |gpu - S| <= (m + 3) kU S.
//  - CPU (streaming): fp32 sums within blocks of at most 4096 elements, in any
//    order (SIMD lanes), then fp64: |cpu - S| <= (min(d, 4096) + 3) kU S,
//    whatever the order (the bound of recursive summation holds for every order).
template <class Store, class Query>
void CheckSquaredDistances(int nrows, std::size_t d, int nqueries, cudaStream_t stream,
                           std::uint32_t seed) {
  SCOPED_TRACE(StoreName<Store>() + " rows, " + StoreName<Query>() + " queries, nrows " +
               std::to_string(nrows) + ", d " + std::to_string(d) + ", nqueries " +
               std::to_string(nqueries));
  std::mt19937 rng(seed);
  const auto nr = static_cast<std::size_t>(nrows);
  const auto nq = static_cast<std::size_t>(nqueries);
  std::vector<float> rows_f = Normal(rng, nr * d);
  for (std::size_t j = 0; j < nr; ++j) {  // rows at different distances
    for (std::size_t k = 0; k < d; ++k) rows_f[j * d + k] *= 1.0f + static_cast<float>(j % 7);
  }
  std::vector<float> queries_f = Normal(rng, nq * d);
  const std::vector<Store> rows = Stored<Store>(rows_f);
  std::vector<Query> queries = Stored<Query>(queries_f);
  // With the same storage, query 1 is row 1: a distance of exactly 0.
  const bool exact_zero = std::is_same_v<Store, Query> && nrows > 1 && nqueries > 1;
  if constexpr (std::is_same_v<Store, Query>) {
    if (exact_zero) {
      std::copy_n(rows.begin() + static_cast<std::ptrdiff_t>(d), d,
                  queries.begin() + static_cast<std::ptrdiff_t>(d));
    }
  }
  const std::vector<float> x = Decoded(rows);
  const std::vector<float> q = Decoded(queries);

  const DeviceBuffer<Store> d_rows = ToDevice(rows);
  const DeviceBuffer<Query> d_queries = ToDevice(queries);
  // Exactly the partials the header asks for, then a guard of NaNs that no
  // launch may touch.
  const std::size_t need = static_cast<std::size_t>(optex::cuda::reduction_blocks(d)) *
                           optex::cuda::squared_distances_partial_rows(nrows, nqueries);
  constexpr std::size_t kGuard = 64;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  DeviceBuffer<double> partials = ToDevice(std::vector<double>(need + kGuard, nan));
  DeviceBuffer<double> out = ToDevice(std::vector<double>(nq * nr, -1.0));
  optex::cuda::squared_distances<Store, Query>(d_rows.data(), nrows, d, d_queries.data(), nqueries,
                                               partials.data(), out.data(), stream);
  OPTEX_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<double> gpu = ToHost(out);
  const std::vector<double> after = ToHost(partials);
  for (std::size_t i = need; i < need + kGuard; ++i)
    ASSERT_TRUE(std::isnan(after[i])) << "partials written past their size, at " << i;

  // Query by query, each alone: the same bits (each sum's order does not
  // depend on how many queries share a pass over the rows).
  DeviceBuffer<double> alone = ToDevice(std::vector<double>(nr, -1.0));
  for (std::size_t iq = 0; iq < nq; ++iq) {
    optex::cuda::squared_distances<Store, Query>(d_rows.data(), nrows, d, d_queries.data() + iq * d,
                                                 1, partials.data(), alone.data(), stream);
    OPTEX_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<double> one = ToHost(alone);
    for (std::size_t j = 0; j < nr; ++j) {
      EXPECT_EQ(std::bit_cast<std::uint64_t>(gpu[iq * nr + j]),
                std::bit_cast<std::uint64_t>(one[j]))
          << "query " << iq << " row " << j << ": " << gpu[iq * nr + j] << " with the others, "
          << one[j] << " alone";
    }
  }

  const double gpu_bound = static_cast<double>(TermsPerThread(d) + 3) * kU;
  const double cpu_bound = static_cast<double>(std::min<std::size_t>(d, 4096) + 3) * kU;
  std::vector<double> cpu(nr);
  for (std::size_t iq = 0; iq < nq; ++iq) {
    if constexpr (std::is_same_v<Store, float> && std::is_same_v<Query, float>) {
      optex::streaming::squared_distances(x.data(), nr, d, q.data() + iq * d, cpu.data());
    }
    for (std::size_t j = 0; j < nr; ++j) {
      double exact = 0.0;
      for (std::size_t k = 0; k < d; ++k) {
        const double t = static_cast<double>(x[j * d + k]) - static_cast<double>(q[iq * d + k]);
        exact += t * t;
      }
      const double value = gpu[iq * nr + j];
      if (exact_zero && iq == 1 && j == 1) {
        EXPECT_EQ(value, 0.0) << "a row against itself";
        continue;
      }
      EXPECT_LE(std::abs(value - exact), gpu_bound * exact)
          << "query " << iq << " row " << j << ": " << value << " vs " << exact;
      if constexpr (std::is_same_v<Store, float> && std::is_same_v<Query, float>) {
        EXPECT_LE(std::abs(cpu[j] - exact), cpu_bound * exact) << "the CPU twin, row " << j;
        EXPECT_LE(std::abs(value - cpu[j]), (gpu_bound + cpu_bound) * exact)
            << "query " << iq << " row " << j << ": " << value << " vs the CPU's " << cpu[j];
      }
    }
  }
}

// Rows split into balanced chunks of at most 16 rows with one or two queries in
// a pass (17: 8 + 9, 50: 12 + 13 + 12 + 13), fewer with more (three: 10, four:
// 8); queries in passes of kDistanceQueriesPerPass (1, 3: one pass; 5: a full
// one and one of 1; 9: two full ones and one of 1); d = 1, odd d, d not a
// multiple of 256, and d over several reduction blocks (5000: 3 blocks, with
// the unrolled loads and the tail loop).
TEST_F(CudaKernels, SquaredDistancesMatchADoubleReferenceAndTheCpu) {
  constexpr int kPass = optex::cuda::kDistanceQueriesPerPass;
  std::uint32_t seed = 1;
  for (const int nrows : {1, 2, 3, 5, 8, 16, 17, 33, 50}) {
    for (const std::size_t d :
         {std::size_t{1}, std::size_t{7}, std::size_t{255}, std::size_t{1000}, std::size_t{5000}}) {
      for (const int nqueries : {1, 3, kPass + 1, 2 * kPass + 1}) {
        CheckSquaredDistances<float, float>(nrows, d, nqueries, stream_, seed++);
        CheckSquaredDistances<float, bf16_bits>(nrows, d, nqueries, stream_, seed++);
        CheckSquaredDistances<bf16_bits, float>(nrows, d, nqueries, stream_, seed++);
        CheckSquaredDistances<bf16_bits, bf16_bits>(nrows, d, nqueries, stream_, seed++);
      }
    }
  }
}

// The partials squared_distances needs: nrows rows for each query of a pass,
// kDistanceQueriesPerPass queries a pass unless that would make more than
// INT_MAX rows. Host arithmetic only: runs without a device.
TEST(CudaKernelsHost, SquaredDistancesPartialRowsCoverOnePass) {
  using optex::cuda::distance_queries_per_pass;
  using optex::cuda::squared_distances_partial_rows;
  constexpr int kPass = optex::cuda::kDistanceQueriesPerPass;
  static_assert(kPass == 4, "the expected values below assume passes of 4 queries");
  EXPECT_EQ(squared_distances_partial_rows(5, 1), 5u);
  EXPECT_EQ(squared_distances_partial_rows(5, 3), 15u);
  EXPECT_EQ(squared_distances_partial_rows(5, 4), 20u);
  EXPECT_EQ(squared_distances_partial_rows(5, 9), 20u);
  EXPECT_EQ(squared_distances_partial_rows(33, 100), 132u);
  EXPECT_EQ(squared_distances_partial_rows(0, 3), 0u);
  EXPECT_EQ(squared_distances_partial_rows(3, 0), 0u);
  EXPECT_EQ(squared_distances_partial_rows(-1, 3), 0u);
  EXPECT_EQ(distance_queries_per_pass(1), 4);
  EXPECT_EQ(distance_queries_per_pass(INT_MAX / 4), 4);
  EXPECT_EQ(distance_queries_per_pass(INT_MAX / 4 + 1), 3);
  EXPECT_EQ(distance_queries_per_pass(INT_MAX / 2 + 1), 1);
  EXPECT_EQ(distance_queries_per_pass(INT_MAX), 1);
  EXPECT_EQ(squared_distances_partial_rows(INT_MAX, 2), static_cast<std::size_t>(INT_MAX));
}

// d = 0 writes zeros; no rows or no queries writes nothing.
TEST_F(CudaKernels, SquaredDistancesOfEmptyInputs) {
  DeviceBuffer<double> partials(16);
  DeviceBuffer<double> out = ToDevice(std::vector<double>(6, -1.0));
  optex::cuda::squared_distances<float, float>(nullptr, 3, 0, nullptr, 2, partials.data(),
                                               out.data(), stream_);
  Sync();
  EXPECT_EQ(ToHost(out), std::vector<double>(6, 0.0));
  out = ToDevice(std::vector<double>(6, -1.0));
  const DeviceBuffer<float> row = ToDevice(std::vector<float>(4, 1.0f));
  optex::cuda::squared_distances<float, float>(row.data(), 0, 4, row.data(), 1, partials.data(),
                                               out.data(), stream_);
  optex::cuda::squared_distances<float, float>(row.data(), 1, 4, row.data(), 0, partials.data(),
                                               out.data(), stream_);
  Sync();
  EXPECT_EQ(ToHost(out), std::vector<double>(6, -1.0));
}

// ---- row_dots ------------------------------------------------------------------------------

// Bounds as for the distances, relative to sum_k |a_k b_k| (the terms have both
// signs): device (m + 2) kU, CPU (streaming::dot) (min(d, 4096) + 2) kU.
template <class Store>
void CheckRowDots(int nrows, std::size_t d, cudaStream_t stream, std::uint32_t seed) {
  SCOPED_TRACE(StoreName<Store>() + ", nrows " + std::to_string(nrows) + ", d " +
               std::to_string(d));
  std::mt19937 rng(seed);
  const auto nr = static_cast<std::size_t>(nrows);
  const std::vector<Store> a = Stored<Store>(Normal(rng, nr * d));
  const std::vector<Store> b = Stored<Store>(Normal(rng, nr * d, 3.0));
  const std::vector<float> af = Decoded(a);
  const std::vector<float> bf = Decoded(b);
  const DeviceBuffer<Store> d_a = ToDevice(a);
  const DeviceBuffer<Store> d_b = ToDevice(b);
  DeviceBuffer<double> partials(static_cast<std::size_t>(optex::cuda::reduction_blocks(d)) * nr);
  DeviceBuffer<double> out = ToDevice(std::vector<double>(nr, -1.0));
  optex::cuda::row_dots<Store>(d_a.data(), d_b.data(), nrows, d, partials.data(), out.data(),
                               stream);
  OPTEX_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<double> gpu = ToHost(out);
  const double gpu_bound = static_cast<double>(TermsPerThread(d) + 2) * kU;
  const double cpu_bound = static_cast<double>(std::min<std::size_t>(d, 4096) + 2) * kU;
  for (std::size_t r = 0; r < nr; ++r) {
    double exact = 0.0;
    double magnitude = 0.0;
    for (std::size_t k = 0; k < d; ++k) {
      const double t = static_cast<double>(af[r * d + k]) * static_cast<double>(bf[r * d + k]);
      exact += t;
      magnitude += std::abs(t);
    }
    EXPECT_LE(std::abs(gpu[r] - exact), gpu_bound * magnitude)
        << "row " << r << ": " << gpu[r] << " vs " << exact;
    if constexpr (std::is_same_v<Store, float>) {
      const double cpu = optex::streaming::dot(af.data() + r * d, bf.data() + r * d, d);
      EXPECT_LE(std::abs(cpu - exact), cpu_bound * magnitude) << "the CPU twin, row " << r;
      EXPECT_LE(std::abs(gpu[r] - cpu), (gpu_bound + cpu_bound) * magnitude)
          << "row " << r << ": " << gpu[r] << " vs the CPU's " << cpu;
    }
  }
}

// Also more rows than one grid's y dimension holds (65535): the launcher splits them.
TEST_F(CudaKernels, RowDotsMatchADoubleReferenceAndTheCpu) {
  std::uint32_t seed = 100;
  for (const int nrows : {1, 5, 40}) {
    for (const std::size_t d : {std::size_t{1}, std::size_t{7}, std::size_t{1000},
                                std::size_t{5000}, std::size_t{40000}}) {
      CheckRowDots<float>(nrows, d, stream_, seed++);
      CheckRowDots<bf16_bits>(nrows, d, stream_, seed++);
    }
  }
  CheckRowDots<float>(70000, 3, stream_, seed++);
  CheckRowDots<bf16_bits>(70000, 1, stream_, seed++);
}

// ---- covariance_vector ---------------------------------------------------------------------

// Within 4 ulp (double), not bitwise: the formula's arithmetic is IEEE on both
// sides (no contraction, correctly rounded sqrt and division), but exp is not
// correctly rounded on either. CUDA's double exp is within 1 ulp (CUDA C++
// Programming Guide, mathematical functions) and glibc's within 1 ulp, so the
// two may differ by one ulp of exp; the Matern products (1 + a + a^2/3) * exp(-a)
// can widen that to 3 ulp of the result after rounding. The test records how
// many values were bitwise equal.
TEST_F(CudaKernels, CovarianceVectorMatchesCovarianceValue) {
  std::mt19937 rng(7);
  for (const int n : {1, 7, 256, 257, 1000}) {
    std::vector<double> squared(static_cast<std::size_t>(n));
    const double inv_scaled_lengthscale = 0.7;
    for (double& s : squared) {
      // Scaled distances in [0, 8), from the raw generator (the same numbers everywhere).
      const double r = 8.0 * static_cast<double>(rng()) / 4294967296.0 / inv_scaled_lengthscale;
      s = r * r;
    }
    squared[0] = 0.0;  // k(0) = 1 exactly
    const DeviceBuffer<double> d_squared = ToDevice(squared);
    for (const Covariance c :
         {Covariance::matern12, Covariance::matern32, Covariance::matern52, Covariance::rbf}) {
      SCOPED_TRACE(std::string(optex::covariance_name(c)) + ", n " + std::to_string(n));
      DeviceBuffer<double> out = ToDevice(std::vector<double>(squared.size(), -1.0));
      optex::cuda::covariance_vector(d_squared.data(), n, c, inv_scaled_lengthscale, out.data(),
                                     stream_);
      Sync();
      const std::vector<double> gpu = ToHost(out);
      int equal = 0;
      for (std::size_t j = 0; j < squared.size(); ++j) {
        const double cpu =
            optex::covariance_value(c, std::sqrt(squared[j]) * inv_scaled_lengthscale);
        ASSERT_GT(cpu, 0.0);
        EXPECT_LE(UlpDistance(gpu[j], cpu), 4u) << "j " << j << ": " << gpu[j] << " vs " << cpu;
        equal += gpu[j] == cpu ? 1 : 0;
      }
      EXPECT_EQ(gpu[0], 1.0);
      RecordProperty(
          std::string(optex::covariance_name(c)) + "_n" + std::to_string(n) + "_bitwise_equal",
          std::to_string(equal) + "/" + std::to_string(n));
    }
  }
}

// ---- rows_finite ---------------------------------------------------------------------------

// NaN and infinities of both signs at the first, a middle (a later reduction
// block) and the last coordinate, in different rows; rows of huge, tiny and
// negative-zero values stay finite. With a bound of 2, the normal rows' larger
// values count too. The flags buffer starts as garbage.
TEST_F(CudaKernels, RowsFiniteFlagsExactlyTheRowsWithAValueOutsideTheBound) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const std::size_t d :
       {std::size_t{1}, std::size_t{5}, std::size_t{1000}, std::size_t{5000}}) {
    SCOPED_TRACE("d " + std::to_string(d));
    std::mt19937 rng(static_cast<std::uint32_t>(d));
    constexpr int kRows = 9;
    std::vector<float> rows = Normal(rng, kRows * d);
    const std::size_t middle = d / 2;
    rows[1 * d + 0] = kNaN;
    rows[2 * d + d - 1] = kInf;
    rows[3 * d + middle] = -kInf;
    for (std::size_t k = 0; k < d; ++k) {  // row 4: extreme but finite
      const float extremes[] = {std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::lowest(),
                                std::numeric_limits<float>::denorm_min(), -0.0f};
      rows[4 * d + k] = extremes[k % 4];
    }
    rows[5 * d + d - 1] = kNaN;
    rows[6 * d + middle] = kNaN;
    rows[6 * d + 0] = kInf;
    rows[8 * d + d - 1] = -kNaN;
    DeviceBuffer<float> d_rows = ToDevice(rows);
    for (const float bound : {std::numeric_limits<float>::max(), 2.0f}) {
      SCOPED_TRACE("bound " + std::to_string(bound));
      DeviceBuffer<int> flags = ToDevice(std::vector<int>(kRows, 7));
      optex::cuda::rows_finite(d_rows.data(), kRows, d, bound, flags.data(), stream_);
      Sync();
      const std::vector<int> gpu = ToHost(flags);
      for (int r = 0; r < kRows; ++r) {
        const auto begin =
            rows.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * d);
        const bool within = std::all_of(begin, begin + static_cast<std::ptrdiff_t>(d),
                                        [bound](float v) { return std::fabs(v) <= bound; });
        EXPECT_EQ(gpu[static_cast<std::size_t>(r)], within ? 1 : 0) << "row " << r;
      }
    }
  }
}

// More rows than one grid's y dimension holds (65535), and d = 0 (every row is finite).
TEST_F(CudaKernels, RowsFiniteOverManyRowsAndNoColumns) {
  constexpr int kRows = 70000;
  constexpr std::size_t kD = 3;
  std::vector<float> rows(kRows * kD, 1.0f);
  const std::vector<int> bad = {0, 65534, 65535, 65536, kRows - 1};
  for (const int r : bad) {
    rows[static_cast<std::size_t>(r) * kD + 2] = std::numeric_limits<float>::quiet_NaN();
  }
  DeviceBuffer<float> d_rows = ToDevice(rows);
  DeviceBuffer<int> flags = ToDevice(std::vector<int>(kRows, 7));
  optex::cuda::rows_finite(d_rows.data(), kRows, kD, std::numeric_limits<float>::max(),
                           flags.data(), stream_);
  Sync();
  const std::vector<int> gpu = ToHost(flags);
  for (int r = 0; r < kRows; ++r) {
    const bool is_bad = std::find(bad.begin(), bad.end(), r) != bad.end();
    ASSERT_EQ(gpu[static_cast<std::size_t>(r)], is_bad ? 0 : 1) << "row " << r;
  }
  flags = ToDevice(std::vector<int>(4, 7));
  optex::cuda::rows_finite(nullptr, 4, 0, 1.0f, flags.data(), stream_);
  Sync();
  EXPECT_EQ(ToHost(flags), std::vector<int>(4, 1));
}

// ---- store_values / load_values ------------------------------------------------------------

// Floats whose bf16 rounding is a corner case: ties to even both ways, just
// above and below a tie, overflow to infinity (FLT_MAX and the largest tie),
// subnormals and their ties, zeros, infinities and NaNs (a NaN whose payload
// would round to infinity must stay NaN).
std::vector<float> Bf16Corners() {
  const std::vector<std::uint32_t> bits = {
      0x00000000u, 0x80000000u,                            // +-0
      0x3f800000u, 0x3f808000u, 0x3f818000u,               // 1, ties to even (down, up)
      0x3f808001u, 0x3f807fffu, 0xbf808000u, 0xbf818000u,  // around a tie, negative ties
      0x7f7fffffu, 0xff7fffffu,                            // +-FLT_MAX: round to +-inf
      0x7f7f8000u, 0x7f7f7fffu, 0x7f7e8000u,               // the largest tie (to inf), below
      0x7f800000u, 0xff800000u,                            // +-inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu,  // NaNs, one with a tiny payload
      0x00000001u, 0x00008000u, 0x00018000u, 0x00007fffu,  // subnormals and their ties
      0x007fffffu, 0x00800000u, 0x80008000u, 0x807fffffu,  // around the smallest normal
      0x4b7fffffu, 0x33800000u, 0x3effffffu,
  };
  std::vector<float> v;
  for (const std::uint32_t b : bits) v.push_back(std::bit_cast<float>(b));
  return v;
}

// bf16: dst is detail::to_bf16(src) bit for bit, and loading it back is
// from_bf16; float: both copies are exact. The counts span the grid-stride loop
// (more than 65536 blocks x 256 threads).
TEST_F(CudaKernels, StoreAndLoadValuesConvertLikeTheCpu) {
  std::mt19937 rng(11);
  for (const std::size_t count :
       {std::size_t{1}, std::size_t{31}, std::size_t{70001}, (std::size_t{1} << 24) + 1000}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<float> src(count);
    const std::vector<float> corners = Bf16Corners();
    for (std::size_t i = 0; i < count; ++i) {
      if (i < corners.size()) {
        src[i] = corners[i];
      } else {
        // Every bit pattern, NaNs included.
        src[i] = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
      }
    }
    const DeviceBuffer<float> d_src = ToDevice(src);

    DeviceBuffer<bf16_bits> stored(count);
    optex::cuda::store_values<bf16_bits>(d_src.data(), stored.data(), count, stream_);
    DeviceBuffer<float> loaded(count);
    optex::cuda::load_values<bf16_bits>(stored.data(), loaded.data(), count, stream_);
    Sync();
    const std::vector<bf16_bits> gpu_bf16 = ToHost(stored);
    const std::vector<float> gpu_loaded = ToHost(loaded);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const bf16_bits cpu = to_bf16(src[i]);
      if (gpu_bf16[i] != cpu || Bits(gpu_loaded[i]) != Bits(from_bf16(cpu))) {
        if (++mismatches <= 10) {
          ADD_FAILURE() << "value " << i << " (bits 0x" << std::hex << Bits(src[i])
                        << "): device 0x" << gpu_bf16[i] << ", CPU 0x" << cpu << ", loaded 0x"
                        << Bits(gpu_loaded[i]) << std::dec;
        }
      }
    }
    EXPECT_EQ(mismatches, 0u);

    // float storage: exact copies, bit for bit (NaNs excluded: a copy through a
    // register need not keep a signalling NaN's bits).
    std::vector<float> finite = src;
    for (float& f : finite) {
      if (std::isnan(f)) f = 0.5f;
    }
    const DeviceBuffer<float> d_finite = ToDevice(finite);
    DeviceBuffer<float> stored_f(count);
    optex::cuda::store_values<float>(d_finite.data(), stored_f.data(), count, stream_);
    DeviceBuffer<float> loaded_f(count);
    optex::cuda::load_values<float>(stored_f.data(), loaded_f.data(), count, stream_);
    Sync();
    EXPECT_TRUE(BitEqual(ToHost(stored_f), finite));
    EXPECT_TRUE(BitEqual(ToHost(loaded_f), finite));
  }
}

// ---- optimizer_step ------------------------------------------------------------------------

// A state as `step` host steps leave it, from random gradients: realistic moments
// (non-negative second moments, square averages above the squared gradient average).
OptimizerState WarmState(const OptimizerRanges& ranges, std::size_t d, std::int64_t step,
                         std::mt19937& rng) {
  OptimizerState s = optex::init_state(ranges, d);
  std::vector<float> x = Normal(rng, d);
  for (std::int64_t t = 0; t < step; ++t) optex::apply_step(ranges, x, s, Normal(rng, d));
  return s;
}

struct StepCase {
  bool weighted = false;  // else a given gradient
  int nrows = 0;          // history rows of the weighted sum
  bool bf16_history = false;
  bool in_place = false;  // x_in == x_out
  bool with_predicted = true;
  std::int64_t step = 3;

  std::string Name() const {
    std::string s = weighted ? "weighted, nrows " + std::to_string(nrows) +
                                   (bf16_history ? ", bf16 history" : ", float history")
                             : std::string("given gradient");
    s += in_place ? ", in place" : ", x_in != x_out";
    if (weighted && !with_predicted) s += ", no prediction row";
    return s + ", step " + std::to_string(step);
  }
};

// One launch of optimizer_step against the CPU: the weighted sum is
// streaming::weighted_sum over the decoded history rows (the kernel follows its
// order term for term), the update optex::apply_step from the same state.
// x_out, every used state slot and the prediction row must be bit for bit the
// CPU's; x_in (when not updated in place) and an unused prediction row untouched.
template <class Store>
void CheckStep(const OptimizerRanges& ranges, std::size_t d, const StepCase& c, cudaStream_t stream,
               std::uint32_t seed) {
  std::mt19937 rng(seed);
  const auto nr = static_cast<std::size_t>(c.nrows);
  const std::vector<float> x = Normal(rng, d);
  const std::vector<float> gradient = Normal(rng, d);
  const std::vector<Store> history = Stored<Store>(Normal(rng, nr * d, 2.0));
  std::vector<double> weights(nr);
  for (double& w : weights) w = optex::test::normal(rng);
  const OptimizerState state = WarmState(ranges, d, c.step, rng);
  ASSERT_EQ(state.step, c.step);

  // The CPU.
  std::vector<float> g_cpu = gradient;
  if (c.weighted) {
    const std::vector<float> rows = Decoded(history);
    optex::streaming::weighted_sum(rows.data(), nr, d, weights.data(), g_cpu.data());
  }
  std::vector<float> x_cpu = x;
  OptimizerState s_cpu = state;
  optex::apply_step(ranges, x_cpu, s_cpu, g_cpu);
  ASSERT_TRUE(std::all_of(x_cpu.begin(), x_cpu.end(), [](float v) { return std::isfinite(v); }))
      << "the test data must keep the step finite, or bitwise comparisons mean little";

  // The device.
  constexpr float kSentinel = -12345.5f;
  DeviceBuffer<float> d_x = ToDevice(x);
  DeviceBuffer<float> d_out = ToDevice(std::vector<float>(d, kSentinel));
  const DeviceBuffer<float> d_gradient = ToDevice(gradient);
  const DeviceBuffer<Store> d_history = ToDevice(history);
  // At least one weight, so that nrows = 0 still passes a non-null weights pointer.
  const DeviceBuffer<double> d_weights =
      ToDevice(weights.empty() ? std::vector<double>{0.0} : weights);
  DeviceBuffer<float> d_predicted = ToDevice(std::vector<float>(d, kSentinel));
  DeviceBuffer<float> d_slots[optex::kMaxStateSlots];
  StateRows rows;
  for (int j = 0; j < optex::kMaxStateSlots; ++j) {
    const auto& slot = state.slots[static_cast<std::size_t>(j)];
    if (slot.empty()) continue;
    d_slots[j] = ToDevice(slot);
    rows.slot[j] = d_slots[j].data();
  }
  StepCoefficients coefficients;
  optex::cuda::fill_step_coefficients(ranges, c.step, coefficients);
  float* x_out = c.in_place ? d_x.data() : d_out.data();
  optex::cuda::optimizer_step<Store>(c.weighted && c.nrows > 0 ? d_history.data() : nullptr,
                                     c.weighted ? d_weights.data() : nullptr, c.nrows,
                                     c.weighted ? nullptr : d_gradient.data(),
                                     c.with_predicted ? d_predicted.data() : nullptr, d_x.data(),
                                     x_out, rows, coefficients, d, stream);
  OPTEX_CUDA_CHECK(cudaStreamSynchronize(stream));
  OPTEX_CUDA_CHECK(cudaGetLastError());

  EXPECT_TRUE(BitEqual(ToHost(c.in_place ? d_x : d_out), x_cpu)) << "x";
  if (!c.in_place) {
    EXPECT_TRUE(BitEqual(ToHost(d_x), x)) << "x_in changed";
  }
  OptimizerState s_gpu;
  s_gpu.step = s_cpu.step;  // the launcher does not count steps; its caller does
  for (int j = 0; j < optex::kMaxStateSlots; ++j) {
    if (rows.slot[j] != nullptr) s_gpu.slots[static_cast<std::size_t>(j)] = ToHost(d_slots[j]);
  }
  EXPECT_TRUE(StateBitEqual(s_gpu, s_cpu));
  const std::vector<float> predicted = ToHost(d_predicted);
  if (c.weighted && c.with_predicted) {
    EXPECT_TRUE(BitEqual(predicted, g_cpu)) << "the prediction row";
  } else {
    EXPECT_TRUE(BitEqual(predicted, std::vector<float>(d, kSentinel)))
        << "a prediction row that was not asked for was written";
  }
}

// The cases every optimizer goes through: a given gradient (step 0, where SGD's
// buffer starts as the gradient, and step 3), and weights over 0, 1, 3, 5 and 9
// history rows (groups of four and the rest one at a time), in fp32 and bf16.
std::vector<StepCase> StepCases() {
  std::vector<StepCase> cases;
  for (const std::int64_t step : {0, 3}) {
    for (const bool in_place : {false, true}) {
      cases.push_back({.weighted = false, .in_place = in_place, .step = step});
    }
  }
  for (const int nrows : {0, 1, 3, 5, 9}) {
    for (const bool bf16 : {false, true}) {
      cases.push_back({.weighted = true,
                       .nrows = nrows,
                       .bf16_history = bf16,
                       .in_place = (nrows % 2 == 1) != bf16});
    }
  }
  cases.push_back({.weighted = true, .nrows = 5, .with_predicted = false});
  return cases;
}

void CheckEveryStepCase(const OptimizerRanges& ranges, std::size_t d, cudaStream_t stream,
                        std::uint32_t& seed) {
  for (const StepCase& c : StepCases()) {
    SCOPED_TRACE(c.Name());
    if (c.bf16_history) {
      CheckStep<bf16_bits>(ranges, d, c, stream, seed++);
    } else {
      CheckStep<float>(ranges, d, c, stream, seed++);
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Every optimizer kind and variant over d = 1, 1000 and 3001 coordinates (one
// block, several, and a partial last block).
TEST_F(CudaKernels, OptimizerStepIsTheCpuStepBitForBit) {
  std::uint32_t seed = 1000;
  for (const std::size_t d : {std::size_t{1}, std::size_t{1000}, std::size_t{3001}}) {
    for (const OptimizerConfig& config : optex::test::EveryKind()) {
      SCOPED_TRACE(config.name + ", d " + std::to_string(d));
      CheckEveryStepCase(config.optimizer.for_dimension(d), d, stream_, seed);
    }
  }
}

// Per-range hyperparameters: three ranges of each kind, 20 ranges (two
// launches of at most 16), and 37 ranges of 1 to 5 coordinates and a long
// last one (three launches, several ranges inside one block).
TEST_F(CudaKernels, OptimizerStepWithRangesIsTheCpuStepBitForBit) {
  std::uint32_t seed = 2000;
  for (const std::size_t d : {std::size_t{1000}, std::size_t{3001}}) {
    std::vector<OptimizerConfig> configs = optex::test::EveryKindInRanges(d);
    std::vector<optex::OptimizerRange> many;
    std::size_t used = 0;
    for (std::size_t r = 0; r < 36; ++r) {
      const std::size_t size = r % 5 + 1;
      many.push_back({size, optex::Sgd{.lr = 1e-2 * static_cast<double>(size),
                                       .momentum = r % 3 == 0 ? 0.0 : 0.9,
                                       .weight_decay = r % 2 == 0 ? 0.0 : 0.01}});
      used += size;
    }
    many.push_back({d - used, optex::Sgd{.lr = 3e-3, .momentum = 0.5, .nesterov = true}});
    configs.push_back({"sgd_37_ranges", OptimizerRanges(many)});
    for (const OptimizerConfig& config : configs) {
      SCOPED_TRACE(config.name + ", d " + std::to_string(d));
      CheckEveryStepCase(config.optimizer.for_dimension(d), d, stream_, seed);
    }
  }
}

// 12288 history rows, the most whose float weights fit the kernel's 48 KiB of
// shared memory: still the CPU's weighted sum and step, bit for bit.
TEST_F(CudaKernels, OptimizerStepWithTheLargestHistory) {
  std::uint32_t seed = 3000;
  const OptimizerRanges adam = OptimizerRanges(optex::Adam{.lr = 1e-3}).for_dimension(300);
  CheckStep<float>(adam, 300, StepCase{.weighted = true, .nrows = 12288}, stream_, seed++);
  CheckStep<bf16_bits>(adam, 300, StepCase{.weighted = true, .nrows = 12288, .in_place = true},
                       stream_, seed++);
}

// fill_step_coefficients: one entry per range, begins from 0 to d, the union of
// the ranges' slots; a new kind replaces the old one.
TEST_F(CudaKernels, FillStepCoefficientsDescribesEveryRange) {
  StepCoefficients out;
  const OptimizerRanges adam =
      OptimizerRanges{{3, optex::Adam{}}, {4, optex::adamw(1e-3, 0.1)}}.for_dimension(7);
  optex::cuda::fill_step_coefficients(adam, 5, out);
  ASSERT_TRUE(std::holds_alternative<optex::cuda::StepRanges<optex::Adam> >(out));
  const auto& a = std::get<optex::cuda::StepRanges<optex::Adam> >(out);
  EXPECT_EQ(a.begin, (std::vector<std::size_t>{0, 3, 7}));
  EXPECT_EQ(a.coefficients.size(), 2u);
  EXPECT_EQ(a.slots, adam.state_slots());
  EXPECT_EQ(a.coefficients[1].shrink,
            std::get<optex::Adam>(adam[1].optimizer).coefficients(5).shrink);

  const OptimizerRanges sgd = OptimizerRanges{
      {2, optex::Sgd{}},
      {2, optex::Sgd{.momentum = 0.9}},
      {3, optex::Sgd{.lr = 0.5}}}.for_dimension(7);
  optex::cuda::fill_step_coefficients(sgd, 0, out);
  ASSERT_TRUE(std::holds_alternative<optex::cuda::StepRanges<optex::Sgd> >(out));
  const auto& s = std::get<optex::cuda::StepRanges<optex::Sgd> >(out);
  EXPECT_EQ(s.begin, (std::vector<std::size_t>{0, 2, 4, 7}));
  EXPECT_EQ(s.coefficients.size(), 3u);
  EXPECT_EQ(s.slots, sgd.state_slots());
  EXPECT_TRUE(s.coefficients[0].first);
  EXPECT_FALSE(s.coefficients[0].use_momentum);
  EXPECT_TRUE(s.coefficients[1].use_momentum);
  EXPECT_EQ(s.coefficients[2].lr, 0.5f);
}

// ---- optimizer_step: refused arguments -------------------------------------------------------

// Each refusal is a std::invalid_argument thrown before anything is launched:
// the output buffers keep their contents.
TEST_F(CudaKernels, OptimizerStepRefusesBadArguments) {
  constexpr std::size_t kD = 100;
  constexpr float kSentinel = 7.25f;
  const OptimizerRanges adam = OptimizerRanges(optex::Adam{}).for_dimension(kD);
  DeviceBuffer<float> x = ToDevice(std::vector<float>(kD, kSentinel));
  const DeviceBuffer<float> g = ToDevice(std::vector<float>(kD, 1.0f));
  DeviceBuffer<float> m = ToDevice(std::vector<float>(kD, kSentinel));
  DeviceBuffer<float> v = ToDevice(std::vector<float>(kD, kSentinel));
  const DeviceBuffer<float> history = ToDevice(std::vector<float>(kD, 1.0f));
  const DeviceBuffer<double> weights = ToDevice(std::vector<double>(1, 1.0));
  StateRows rows;
  rows.slot[0] = m.data();
  rows.slot[1] = v.data();
  StepCoefficients coefficients;
  optex::cuda::fill_step_coefficients(adam, 0, coefficients);

  auto refused = [&](auto&& call, const std::string& what, const std::string& needle) {
    SCOPED_TRACE(what);
    try {
      call();
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(needle));
    }
    Sync();
    EXPECT_EQ(ToHost(x), std::vector<float>(kD, kSentinel));
    EXPECT_EQ(ToHost(m), std::vector<float>(kD, kSentinel));
    EXPECT_EQ(ToHost(v), std::vector<float>(kD, kSentinel));
  };
  // Coefficients that do not cover [0, d): another d, a start past 0, no range.
  refused(
      [&] {
        optex::cuda::optimizer_step<float>(nullptr, nullptr, 0, g.data(), nullptr, x.data(),
                                           x.data(), rows, coefficients, kD + 1, stream_);
      },
      "coefficients for d - 1", "coefficients");
  optex::cuda::StepRanges<optex::Adam> shifted =
      std::get<optex::cuda::StepRanges<optex::Adam> >(coefficients);
  shifted.begin.front() = 1;
  refused(
      [&] {
        optex::cuda::optimizer_step<float>(nullptr, nullptr, 0, g.data(), nullptr, x.data(),
                                           x.data(), rows, StepCoefficients(shifted), kD, stream_);
      },
      "a first range that starts at 1", "coefficients");
  refused(
      [&] {
        optex::cuda::optimizer_step<float>(
            nullptr, nullptr, 0, g.data(), nullptr, x.data(), x.data(), rows,
            StepCoefficients(optex::cuda::StepRanges<optex::Adam>{}), kD, stream_);
      },
      "no range", "coefficients");
  // Pieces that are empty or go backwards.
  optex::cuda::StepRanges<optex::Adam> empty_piece =
      std::get<optex::cuda::StepRanges<optex::Adam> >(coefficients);
  empty_piece.begin = {0, kD, kD};
  empty_piece.coefficients.push_back(empty_piece.coefficients.front());
  refused(
      [&] {
        optex::cuda::optimizer_step<float>(nullptr, nullptr, 0, g.data(), nullptr, x.data(),
                                           x.data(), rows, StepCoefficients(empty_piece), kD,
                                           stream_);
      },
      "an empty range", "increasing, non-empty");
  // A state slot the optimizer uses is missing.
  StateRows missing = rows;
  missing.slot[1] = nullptr;
  refused(
      [&] {
        optex::cuda::optimizer_step<float>(nullptr, nullptr, 0, g.data(), nullptr, x.data(),
                                           x.data(), missing, coefficients, kD, stream_);
      },
      "Adam without its second moment", "slot 1");
  // Too many history rows for the shared memory, or a negative count.
  refused(
      [&] {
        optex::cuda::optimizer_step<float>(history.data(), weights.data(), 12289, nullptr, nullptr,
                                           x.data(), x.data(), rows, coefficients, kD, stream_);
      },
      "nrows 12289", "nrows");
  refused(
      [&] {
        optex::cuda::optimizer_step<bf16_bits>(nullptr, weights.data(), -1, nullptr, nullptr,
                                               x.data(), x.data(), rows, coefficients, kD, stream_);
      },
      "nrows -1", "nrows");
  // Weights without history rows.
  refused(
      [&] {
        optex::cuda::optimizer_step<float>(nullptr, weights.data(), 1, nullptr, nullptr, x.data(),
                                           x.data(), rows, coefficients, kD, stream_);
      },
      "no history", "history");
  // Neither weights nor a gradient.
  refused(
      [&] {
        optex::cuda::optimizer_step<float>(nullptr, nullptr, 0, nullptr, nullptr, x.data(),
                                           x.data(), rows, coefficients, kD, stream_);
      },
      "no gradient", "gradient");
}

#endif  // OPTEX_HAVE_CUDA

}  // namespace
