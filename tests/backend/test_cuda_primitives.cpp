// Each CUDA device primitive (cuda/cuda_primitives.hpp) against the CPU's
// (make_cpu_primitives), on the same random inputs, through the interface
// alone (optex/backend/device_primitives.hpp):
//
//   put, copy, zero, copy_stored,      bit for bit (bf16: detail::to_bf16 and
//   store, load, views, fetch          from_bf16, which the CPU cannot store)
//   step (a given row, and weights)    bit for bit: x, every state slot, the sum
//   mean_of_rows' mean                 bit for bit
//   within_bound                       the same flags
//   squared_distances (+ norms), dot,  within error bounds derived below, against
//   pair_statistics, inner_products,   a double reference and against the CPU
//   mean_of_rows' sums, gp_weights     (the summation orders differ)
//
// Dimensions 1, 300, 5000 (several reduction blocks) and 70001 (more than 2^16,
// odd). The CPU keeps fp32 only: where the device stores bf16, the CPU gets the
// values the bf16 rows hold, decoded to fp32.
//
// Every test needs a CUDA device: without one it is skipped with a message, or
// fails when the environment sets OPTEX_REQUIRE_GPU=1. Only the interface is
// used, so a build without CUDA compiles the same file and skips.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/bf16.hpp"
#include "optex/backend/device.hpp"
#include "optex/backend/device_primitives.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/engine_equality.hpp"
#include "support/gpu_test_support.hpp"
#include "support/optimizer_configs.hpp"
#include "support/test_support.hpp"

namespace {

using optex::Device;
using optex::OptimizerRanges;
using optex::detail::DevicePrimitives;
using optex::detail::Fetch;
using optex::detail::fetch_of;
using optex::detail::fp32_rows;
using optex::detail::StateRows;
using optex::detail::StepGradient;
using optex::detail::Storage;
using optex::detail::StoredRows;
using optex::test::BitEqual;

constexpr double kU = 0x1p-24;   // fp32 unit roundoff
constexpr double kUd = 0x1p-53;  // fp64 unit roundoff
constexpr std::size_t kDims[] = {1, 300, 5000, 70001};
constexpr Storage kStorages[] = {Storage::fp32, Storage::bf16};

std::string Name(Storage s) { return s == Storage::bf16 ? "bf16" : "fp32"; }

// The terms each thread of the device's reductions sums in fp32: its
// grid-stride slice of [0, d) over kernels.cu's grid of 1 to 1024 blocks of
// 256 threads x 8 values (reduction_blocks(d)).
std::size_t TermsPerThread(std::size_t d) {
  const std::size_t blocks = std::clamp<std::size_t>((d + 2047) / 2048, 1, 1024);
  return (d + blocks * 256 - 1) / (blocks * 256);
}

// The CPU's fp32 partial sums run over blocks of at most 4096 coordinates
// (streaming.hpp), in any order within a block.
std::size_t CpuTerms(std::size_t d) { return std::min<std::size_t>(d, 4096); }

std::vector<float> Normal(std::mt19937& rng, std::size_t n, double stddev = 1.0) {
  return optex::test::random_vector(rng, n, 0.0, stddev);
}

// The values rows of `storage` hold for `v`.
std::vector<float> AsStored(std::vector<float> v, Storage storage) {
  if (storage == Storage::bf16) {
    for (float& f : v) f = optex::detail::from_bf16(optex::detail::to_bf16(f));
  }
  return v;
}

// ---- moving values in and out, through the primitives themselves -------------------------

template <class T>
T* Put(DevicePrimitives& p, T* to, const std::vector<T>& values) {
  p.put(values.data(), to, values.size() * sizeof(T));
  p.fetch({});  // `values` may go once this returns
  return to;
}
float* Floats(DevicePrimitives& p, const std::vector<float>& v) {
  return Put(p, p.floats(v.size()), v);
}
double* Doubles(DevicePrimitives& p, const std::vector<double>& v) {
  return Put(p, p.doubles(v.size()), v);
}

template <class T>
std::vector<T> Get(DevicePrimitives& p, const T* from, std::size_t count) {
  std::vector<T> out(count);
  const Fetch f = fetch_of(from, out.data(), count);
  p.fetch({&f, 1});
  return out;
}

// Rows in `storage` holding `values` (rounded by store() where bf16).
StoredRows Stored(DevicePrimitives& p, const std::vector<float>& values, Storage storage) {
  const StoredRows rows = p.rows(values.size(), storage);
  p.store(Floats(p, values), rows, values.size());
  return rows;
}

// ---- the fixture ---------------------------------------------------------------------------

class CudaPrimitives : public ::testing::Test {
 protected:
  static constexpr std::size_t kStaging = std::size_t{1} << 20;

  void SetUp() override {
    optex::test::SkipOrFailWithoutGpu();
    if (IsSkipped() || HasFatalFailure()) return;
    gpu_ = optex::detail::make_cuda_primitives(Device::cuda(0));
    cpu_ = optex::detail::make_cpu_primitives(1);
    gpu_->check_memory(0, kStaging, "the test");
    cpu_->check_memory(0, kStaging, "the test");
  }

  std::unique_ptr<DevicePrimitives> gpu_, cpu_;
};

// ---- construction and memory ----------------------------------------------------------------

TEST_F(CudaPrimitives, DescribeThemselvesAndRefuseWhatDoesNotFit) {
  EXPECT_EQ(gpu_->device(), Device::cuda(0));
  EXPECT_FALSE(gpu_->host_memory());
  EXPECT_FALSE(gpu_->copies_cannot_fail());
  EXPECT_THROW(optex::detail::make_cuda_primitives(Device::cuda(optex::cuda_device_count())),
               std::invalid_argument);
  EXPECT_THROW(optex::detail::make_cuda_primitives(Device::cpu()), std::invalid_argument);

  const auto fresh = optex::detail::make_cuda_primitives(Device::cuda(0));
  const std::size_t huge = std::size_t{1} << 60;
  try {
    fresh->check_memory(huge, 0, "an engine of dimension 7");
    ADD_FAILURE() << "2^60 bytes were accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("bytes free"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(std::to_string(huge)));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("an engine of dimension 7"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("Options::history"));
  }
  // Still usable, bf16 rows included (their first allocation probes the bf16 GEMM).
  fresh->check_memory(1024, 64, "a small engine");
  const StoredRows rows = Stored(*fresh, {1.0f, 2.0f}, Storage::bf16);
  std::vector<float> out;
  fresh->view_stored(rows, 2, out);
  EXPECT_EQ(out, (std::vector<float>{1.0f, 2.0f}));
}

// ---- transfers ------------------------------------------------------------------------------

// Finite values with awkward bits: zeros of both signs, a subnormal, the
// largest float (bf16: rounds to infinity), bf16 ties both ways.
std::vector<float> Awkward(std::mt19937& rng, std::size_t n) {
  std::vector<float> v = Normal(rng, n, 3.0);
  const std::uint32_t bits[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x7f7fffffu,
                                0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f807fffu};
  for (std::size_t i = 0; i < std::min(n, std::size(bits)); ++i)
    v[i * (n / std::size(bits) + 1) % n] = std::bit_cast<float>(bits[i]);
  return v;
}

TEST_F(CudaPrimitives, TransfersAndConversionsAreBitwiseTheCpus) {
  std::mt19937 rng(1);
  for (const std::size_t d : kDims) {
    SCOPED_TRACE("d " + std::to_string(d));
    const std::vector<float> v = Awkward(rng, 3 * d);
    const std::size_t n = v.size();
    // put, copy, zero, on both.
    std::vector<float> results[2];
    DevicePrimitives* both[] = {gpu_.get(), cpu_.get()};
    for (int k = 0; k < 2; ++k) {
      DevicePrimitives& p = *both[k];
      float* a = Floats(p, v);
      float* b = p.floats(n);
      p.copy(a, b, n);
      p.zero(b + d, d);
      results[k] = Get(p, b, n);
    }
    EXPECT_TRUE(BitEqual(results[0], results[1])) << "copy and zero";
    std::vector<float> expected = v;
    std::fill(expected.begin() + static_cast<std::ptrdiff_t>(d),
              expected.begin() + static_cast<std::ptrdiff_t>(2 * d), 0.0f);
    EXPECT_TRUE(BitEqual(results[0], expected));

    // store, load, copy_stored and the stored views; bf16 against to_bf16.
    const float* a = Floats(*gpu_, v);
    for (const Storage s : kStorages) {
      SCOPED_TRACE(Name(s));
      const StoredRows rows = gpu_->rows(n, s);
      gpu_->store(a, rows, n);
      float* loaded = gpu_->floats(n);
      gpu_->load(rows, loaded, n);
      const StoredRows other = gpu_->rows(n, s);
      gpu_->copy_stored(rows.row(2, d), other.row(0, d), d);  // row 2 to row 0
      const std::vector<float> held = AsStored(v, s);
      EXPECT_TRUE(BitEqual(Get(*gpu_, loaded, n), held)) << "store, then load";
      std::vector<float> view;
      gpu_->view_stored(rows, n, view);
      EXPECT_TRUE(BitEqual(view, held)) << "view_stored";
      gpu_->view_stored(other, d, view);
      EXPECT_TRUE(BitEqual(view, std::span<const float>(held).subspan(2 * d, d))) << "copy_stored";
      if (s == Storage::bf16) {
        std::vector<std::uint16_t> raw(n);
        const Fetch f{rows.data, raw.data(), n * sizeof(std::uint16_t)};
        gpu_->fetch({&f, 1});
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(raw[i], optex::detail::to_bf16(v[i])) << "value " << i;
      }
    }
    EXPECT_THROW(gpu_->copy_stored(gpu_->rows(1, Storage::fp32), gpu_->rows(1, Storage::bf16), 1),
                 std::invalid_argument);

    // view, download, upload.
    std::vector<float> scratch;
    const float* seen = gpu_->view(a, n, scratch);
    EXPECT_TRUE(BitEqual(std::span<const float>(seen, n), v)) << "view";
    const std::vector<float> w = Normal(rng, d);
    float* row = gpu_->floats(d);
    gpu_->upload(w.data(), row, d);
    std::vector<float> back(d);
    gpu_->download(row, back.data(), d);
    EXPECT_TRUE(BitEqual(back, w)) << "upload, then download";
  }
}

// Several values in one fetch, of several types: the staged ones and one too
// large for the staging buffer (copied straight to the host); no values.
TEST_F(CudaPrimitives, FetchBringsEveryValueAtOnce) {
  const auto p = optex::detail::make_cuda_primitives(Device::cuda(0));
  p->check_memory(0, 64, "the test");  // 64 bytes of staging
  const std::vector<float> f = {1.5f, -2.0f, 3.25f};
  std::vector<double> big(1000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = 0.5 * static_cast<double>(i) - 7.0;
  const std::vector<int> flags = {1, 0, 1, 1};
  const float* df = Floats(*p, f);
  const double* dd = Doubles(*p, big);
  const int* di = Put(*p, p->ints(flags.size()), flags);
  std::vector<float> hf(f.size());
  std::vector<double> hd(big.size());
  std::vector<int> hi(flags.size());
  const Fetch values[] = {fetch_of(df, hf.data(), f.size()), fetch_of(dd, hd.data(), big.size()),
                          fetch_of(di, hi.data(), flags.size()), Fetch{}};
  p->fetch(values);
  EXPECT_EQ(hf, f);
  EXPECT_EQ(hd, big);
  EXPECT_EQ(hi, flags);
  p->fetch({});
  // Fresh memory is zero, as on the CPU.
  EXPECT_EQ(Get(*p, p->doubles(3), 3), std::vector<double>(3, 0.0));
}

// ---- reductions over d --------------------------------------------------------------------

// Bounds, relative to the exact sum S of non-negative terms (x, q as the rows
// hold them): the device sums m = TermsPerThread(d) terms per thread in fp32,
// each term fl(fl(x - q)^2) within (1 + u)^3, then fp64: |gpu - S| <= (m + 3) u S.
// The CPU: (min(d, 4096) + 3) u S, whatever its order within a block. Norms and
// dots: the same with + 2, relative to sum |x q|.
struct Bounds {
  double gpu;
  double cpu;
};
Bounds DistanceBounds(std::size_t d, int extra) {
  return {static_cast<double>(TermsPerThread(d) + static_cast<std::size_t>(extra)) * kU,
          static_cast<double>(CpuTerms(d) + static_cast<std::size_t>(extra)) * kU};
}

// Checks a device value and the CPU's against an exact value whose terms'
// magnitudes sum to `magnitude`.
void ExpectWithin(double gpu, double cpu, double exact, double magnitude, Bounds b,
                  const std::string& what) {
  EXPECT_LE(std::abs(gpu - exact), b.gpu * magnitude) << what << ": " << gpu << " vs " << exact;
  EXPECT_LE(std::abs(cpu - exact), b.cpu * magnitude) << what << " (CPU): " << cpu;
  EXPECT_LE(std::abs(gpu - cpu), (b.gpu + b.cpu) * magnitude)
      << what << ": " << gpu << " vs the CPU's " << cpu;
}

// History-like rows (17: two of the kernel's chunks of rows), queried by
// slots 2, 3, 4 (one run of adjacent rows), 7 and 0 (not adjacent), and by two
// adjacent rows of another buffer in storage `qs`.
TEST_F(CudaPrimitives, SquaredDistancesAndNormsMatchTheCpu) {
  constexpr std::size_t kRows = 17;
  const std::size_t slots[] = {2, 3, 4, 7, 0};
  std::mt19937 rng(2);
  for (const std::size_t d : kDims) {
    for (const Storage rs : kStorages) {
      for (const Storage qs : kStorages) {
        SCOPED_TRACE("d " + std::to_string(d) + ", rows " + Name(rs) + ", queries " + Name(qs));
        std::vector<float> h = Normal(rng, kRows * d);
        for (std::size_t j = 0; j < kRows; ++j)  // rows at different distances
          for (std::size_t k = 0; k < d; ++k) h[j * d + k] *= 1.0f + static_cast<float>(j % 5);
        const std::vector<float> e = Normal(rng, 2 * d, 2.0);
        const std::vector<float> hv = AsStored(h, rs);
        const std::vector<float> ev = AsStored(e, qs);
        const StoredRows gh = Stored(*gpu_, h, rs);
        const StoredRows ge = Stored(*gpu_, e, qs);
        const float* ch = Floats(*cpu_, hv);
        const float* ce = Floats(*cpu_, ev);
        std::vector<StoredRows> gq, cq;
        std::vector<const float*> host_q;
        for (const std::size_t s : slots) {
          gq.push_back(gh.row(s, d));
          cq.push_back(fp32_rows(ch + s * d));
          host_q.push_back(hv.data() + s * d);
        }
        for (std::size_t s = 0; s < 2; ++s) {
          gq.insert(gq.begin() + 3 + static_cast<std::ptrdiff_t>(s), ge.row(s, d));
          cq.insert(cq.begin() + 3 + static_cast<std::ptrdiff_t>(s), fp32_rows(ce + s * d));
          host_q.insert(host_q.begin() + 3 + static_cast<std::ptrdiff_t>(s), ev.data() + s * d);
        }
        const std::size_t nq = gq.size();
        for (const std::size_t nrows : {std::size_t{1}, kRows}) {
          SCOPED_TRACE("nrows " + std::to_string(nrows));
          double* g_out = gpu_->doubles(nq * nrows);
          double* g_norms = gpu_->doubles(nq);
          double* c_out = cpu_->doubles(nq * nrows);
          double* c_norms = cpu_->doubles(nq);
          gpu_->squared_distances(gh, nrows, d, gq, g_out, g_norms);
          cpu_->squared_distances(fp32_rows(ch), nrows, d, cq, c_out, c_norms);
          const std::vector<double> gpu = Get(*gpu_, g_out, nq * nrows);
          const std::vector<double> norms = Get(*gpu_, g_norms, nq);
          const std::vector<double> cpu = Get(*cpu_, c_out, nq * nrows);
          const std::vector<double> cpu_norms = Get(*cpu_, c_norms, nq);
          for (std::size_t q = 0; q < nq; ++q) {
            for (std::size_t j = 0; j < nrows; ++j) {
              double exact = 0.0;
              for (std::size_t k = 0; k < d; ++k) {
                const double t = static_cast<double>(hv[j * d + k]) - host_q[q][k];
                exact += t * t;
              }
              ExpectWithin(gpu[q * nrows + j], cpu[q * nrows + j], exact, exact,
                           DistanceBounds(d, 3),
                           "query " + std::to_string(q) + ", row " + std::to_string(j));
            }
            double exact = 0.0;
            for (std::size_t k = 0; k < d; ++k)
              exact += static_cast<double>(host_q[q][k]) * host_q[q][k];
            ExpectWithin(norms[q], cpu_norms[q], exact, exact, DistanceBounds(d, 2),
                         "norm " + std::to_string(q));
          }
          if (nrows == kRows) {  // slot 2 against row 2: exactly zero
            EXPECT_EQ(gpu[0 * nrows + 2], 0.0);
          }
          // Without norms, and again: the same bits (a fixed reduction order).
          double* again = gpu_->doubles(nq * nrows);
          gpu_->squared_distances(gh, nrows, d, gq, again);
          EXPECT_EQ(Get(*gpu_, again, nq * nrows), gpu);
        }
      }
    }
  }
}

// A run of 9 adjacent queries (the history's slots 0 to 8: more queries than
// one pass of the distance kernel takes, so the rows are read in several passes
// of several queries) against 33 rows (chunked): each query's distances and
// norm are, bit for bit, those it gets alone, and its distance to its own row
// is exactly 0. The singles run first, so the run also grows the scratch.
TEST_F(CudaPrimitives, SquaredDistancesOfARunAreThoseOfEachQueryAlone) {
  constexpr std::size_t kRows = 33;
  constexpr std::size_t kQueries = 9;
  std::mt19937 rng(12);
  for (const std::size_t d : kDims) {
    for (const Storage rs : kStorages) {
      SCOPED_TRACE("d " + std::to_string(d) + ", " + Name(rs));
      std::vector<float> h = Normal(rng, kRows * d);
      for (std::size_t j = 0; j < kRows; ++j)  // rows at different distances
        for (std::size_t k = 0; k < d; ++k) h[j * d + k] *= 1.0f + static_cast<float>(j % 5);
      const StoredRows gh = Stored(*gpu_, h, rs);
      std::vector<StoredRows> run;
      for (std::size_t s = 0; s < kQueries; ++s) run.push_back(gh.row(s, d));

      double* alone = gpu_->doubles(kQueries * kRows);
      double* alone_norms = gpu_->doubles(kQueries);
      for (std::size_t s = 0; s < kQueries; ++s)
        gpu_->squared_distances(gh, kRows, d, {&run[s], 1}, alone + s * kRows, alone_norms + s);
      double* together = gpu_->doubles(kQueries * kRows);
      double* together_norms = gpu_->doubles(kQueries);
      gpu_->squared_distances(gh, kRows, d, run, together, together_norms);

      const std::vector<double> one = Get(*gpu_, alone, kQueries * kRows);
      const std::vector<double> all = Get(*gpu_, together, kQueries * kRows);
      for (std::size_t s = 0; s < kQueries; ++s) {
        for (std::size_t j = 0; j < kRows; ++j) {
          EXPECT_EQ(std::bit_cast<std::uint64_t>(all[s * kRows + j]),
                    std::bit_cast<std::uint64_t>(one[s * kRows + j]))
              << "query " << s << ", row " << j << ": " << all[s * kRows + j] << " in the run, "
              << one[s * kRows + j] << " alone";
        }
        EXPECT_EQ(all[s * kRows + s], 0.0) << "slot " << s << " against itself";
      }
      const std::vector<double> one_norms = Get(*gpu_, alone_norms, kQueries);
      const std::vector<double> all_norms = Get(*gpu_, together_norms, kQueries);
      for (std::size_t s = 0; s < kQueries; ++s) {
        EXPECT_EQ(std::bit_cast<std::uint64_t>(all_norms[s]),
                  std::bit_cast<std::uint64_t>(one_norms[s]))
            << "norm " << s;
      }
    }
  }
}

// Inner products by one fp32 GEMM per run of adjacent queries (cuBLAS, its own
// summation order, fp32 accumulation). Bound for any order of d products:
// (d + 1) u sum |x q|, doubled because tensor cores need not round their fp32
// additions to nearest; the CPU's as for the dots.
TEST_F(CudaPrimitives, InnerProductsMatchTheCpu) {
  constexpr std::size_t kRows = 17;
  const std::size_t slots[] = {2, 3, 4, 7, 0};
  std::mt19937 rng(3);
  for (const std::size_t d : kDims) {
    for (const Storage s : kStorages) {
      SCOPED_TRACE("d " + std::to_string(d) + ", " + Name(s));
      const std::vector<float> h = Normal(rng, kRows * d);
      const std::vector<float> hv = AsStored(h, s);
      const StoredRows gh = Stored(*gpu_, h, s);
      const float* ch = Floats(*cpu_, hv);
      std::vector<StoredRows> gq, cq;
      for (const std::size_t slot : slots) {
        gq.push_back(gh.row(slot, d));
        cq.push_back(fp32_rows(ch + slot * d));
      }
      const std::size_t nq = gq.size();
      const Bounds b{2.0 * static_cast<double>(d + 1) * kU,
                     static_cast<double>(CpuTerms(d) + 2) * kU};
      for (const std::size_t nrows : {std::size_t{1}, kRows}) {
        double* g_out = gpu_->doubles(nq * nrows);
        double* c_out = cpu_->doubles(nq * nrows);
        gpu_->inner_products(gh, nrows, d, gq, g_out);
        cpu_->inner_products(fp32_rows(ch), nrows, d, cq, c_out);
        const std::vector<double> gpu = Get(*gpu_, g_out, nq * nrows);
        const std::vector<double> cpu = Get(*cpu_, c_out, nq * nrows);
        for (std::size_t q = 0; q < nq; ++q) {
          for (std::size_t j = 0; j < nrows; ++j) {
            double exact = 0.0;
            double magnitude = 0.0;
            for (std::size_t k = 0; k < d; ++k) {
              const double t = static_cast<double>(hv[j * d + k]) * hv[slots[q] * d + k];
              exact += t;
              magnitude += std::abs(t);
            }
            ExpectWithin(gpu[q * nrows + j], cpu[q * nrows + j], exact, magnitude, b,
                         "query " + std::to_string(q) + ", row " + std::to_string(j));
          }
        }
      }
    }
  }
  // cublasGemmEx multiplies A and B of one type: mixed storage is refused.
  const StoredRows f = gpu_->rows(4, Storage::fp32);
  const StoredRows h = gpu_->rows(4, Storage::bf16);
  EXPECT_THROW(gpu_->inner_products(f, 1, 4, {&h, 1}, gpu_->doubles(1)), std::invalid_argument);
}

// pair_statistics' four sums and dot: bounds as for the distances and dots.
TEST_F(CudaPrimitives, PairStatisticsAndDotMatchTheCpu) {
  std::mt19937 rng(4);
  for (const std::size_t d : kDims) {
    SCOPED_TRACE("d " + std::to_string(d));
    const std::vector<float> a = Normal(rng, d);
    std::vector<float> b = Normal(rng, d, 0.1);  // b = a + noise: a prediction and its gradient
    for (std::size_t k = 0; k < d; ++k) b[k] += a[k];
    double* g_out = gpu_->doubles(5);
    double* c_out = cpu_->doubles(5);
    gpu_->pair_statistics(Floats(*gpu_, a), Floats(*gpu_, b), d, g_out);
    cpu_->pair_statistics(Floats(*cpu_, a), Floats(*cpu_, b), d, c_out);
    gpu_->dot(Floats(*gpu_, a), Floats(*gpu_, b), d, g_out + 4);
    cpu_->dot(Floats(*cpu_, a), Floats(*cpu_, b), d, c_out + 4);
    const std::vector<double> gpu = Get(*gpu_, g_out, 5);
    const std::vector<double> cpu = Get(*cpu_, c_out, 5);
    double exact[5] = {};
    double magnitude[5] = {};
    for (std::size_t k = 0; k < d; ++k) {
      const double x = a[k];
      const double y = b[k];
      const double terms[5] = {x * x, x * y, y * y, (x - y) * (x - y), x * y};
      for (int s = 0; s < 5; ++s) {
        exact[s] += terms[s];
        magnitude[s] += std::abs(terms[s]);
      }
    }
    const char* names[] = {"<a,a>", "<a,b>", "<b,b>", "||a-b||^2", "dot"};
    for (std::size_t s = 0; s < 5; ++s) {
      ExpectWithin(gpu[s], cpu[s], exact[s], magnitude[s], DistanceBounds(d, s == 3 ? 3 : 2),
                   names[s]);
    }
  }
}

// ---- anchor_products ------------------------------------------------------------------------

using optex::detail::AnchorLayout;

// Every value of `got` has the bits of `want`'s.
void ExpectSameBits(const std::vector<double>& got, const std::vector<double>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(optex::test::SameBits(got[i], want[i]))
        << what << ", value " << i << ": " << got[i] << " vs " << want[i];
  }
}

// Upper bounds of the sum of |terms| of each anchor product, by Cauchy-Schwarz
// (sum_k |x_k y_k| <= ||x|| ||y||) and the triangle inequality (||X_t - X_j|| <=
// ||a - X_t|| + ||a - X_j||), from O(n d) norms, out's layout: e[j] = ||a - X_j||^2
// exactly, f[j] <= ||m|| ||a - X_j||, rows[k][j] <= ||G_t|| (||a - X_t|| +
// ||a - X_j||), and so on. For random Gaussian rows they exceed the sums of
// |terms| by a factor near pi / 2, not more.
std::vector<double> AnchorMagnitudes(const std::vector<float>& x, const std::vector<float>& g,
                                     const std::vector<float>& a, const std::vector<float>* m,
                                     std::size_t n, std::size_t d, std::span<const int> fresh) {
  const auto norm = [d](auto&& value) {
    double s = 0.0;
    for (std::size_t k = 0; k < d; ++k) s += value(k) * value(k);
    return std::sqrt(s);
  };
  std::vector<double> to_anchor(n), gradient(n);
  for (std::size_t j = 0; j < n; ++j) {
    to_anchor[j] = norm([&](std::size_t k) { return double{a[k]} - double{x[j * d + k]}; });
    gradient[j] = norm([&](std::size_t k) { return double{g[j * d + k]}; });
  }
  const double an = norm([&](std::size_t k) { return double{a[k]}; });
  const double mn = m != nullptr ? norm([&](std::size_t k) { return double{(*m)[k]}; }) : 0.0;
  const AnchorLayout at(n, fresh.size());
  std::vector<double> bound(at.size());
  for (std::size_t j = 0; j < n; ++j) {
    bound[at.e() + j] = to_anchor[j] * to_anchor[j];
    bound[at.f() + j] = mn * to_anchor[j];
    bound[at.q() + j] = an * to_anchor[j];
    bound[at.h() + j] = mn * gradient[j];
    bound[at.s() + j] = gradient[j] * to_anchor[j];
    bound[at.r() + j] = an * gradient[j];
  }
  bound[at.scalars()] = mn * mn;
  bound[at.scalars() + 1] = an * mn;
  bound[at.scalars() + 2] = an * an;
  for (std::size_t k = 0; k < fresh.size(); ++k) {
    const auto t = static_cast<std::size_t>(fresh[k]);
    for (std::size_t j = 0; j < n; ++j) {
      bound[at.rows() + k * n + j] = gradient[t] * (to_anchor[t] + to_anchor[j]);
      bound[at.cols() + k * n + j] = gradient[j] * (to_anchor[j] + to_anchor[t]);
    }
  }
  return bound;
}

// Rows near a point far from the origin (the proxy points of one round): the
// products scale with the spread, not with the offset.
std::vector<float> NearPoint(std::mt19937& rng, std::size_t rows, std::size_t d, float offset) {
  std::vector<float> v = Normal(rng, rows * d, 0.01);
  for (float& f : v) f += offset;
  return v;
}

// Random points, gradients, anchor and momentum (and no momentum for F <= 1), fp32 and
// bf16 rows, n = 1, 5, 32, 33 (the first n of 33 rows), F = 0, 1, n fresh slots
// (F = 32 and 33 take several passes over the rows), d = 1, 1000 and 2^20 + 7
// (the whole reduction grid, odd): the CPU's products, on the values the
// device's rows hold.
//
// Tolerance: every term is one fp64 rounding of exact differences and products
// of floats; a sum of N terms in an order of depth h is within h u sum |terms|
// (u = 2^-53). The device's depth is at most 5 (terms per thread) + 5 + 3 (the
// block's tree) + 32 + 5 (the blocks); the CPU's, blocks of at most 4096
// coordinates in order, then at most 512 blocks in order, under 4700. So
// |device - CPU| < 4800 u sum |terms| < 1e-12 * AnchorMagnitudes(). Worst
// cases: rounding errors of random signs stay far below.
TEST_F(CudaPrimitives, AnchorProductsMatchTheCpu) {
  constexpr std::size_t kAllRows = 33;
  constexpr double kTolerance = 1e-12;
  std::mt19937 rng(21);
  for (const std::size_t d : {std::size_t{1}, std::size_t{1000}, (std::size_t{1} << 20) + 7}) {
    for (const Storage storage : kStorages) {
      const std::vector<float> x = AsStored(NearPoint(rng, kAllRows, d, 3.0f), storage);
      const std::vector<float> g = AsStored(Normal(rng, kAllRows * d), storage);
      const std::vector<float> a = NearPoint(rng, 1, d, 3.0f);
      const std::vector<float> m = Normal(rng, d, 0.1);
      const StoredRows gx = Stored(*gpu_, x, storage);
      const StoredRows gg = Stored(*gpu_, g, storage);
      const float* ga = Floats(*gpu_, a);
      const float* gm = Floats(*gpu_, m);
      const StoredRows cx = fp32_rows(Floats(*cpu_, x));
      const StoredRows cg = fp32_rows(Floats(*cpu_, g));
      const float* ca = Floats(*cpu_, a);
      const float* cm = Floats(*cpu_, m);
      for (const std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{32}, kAllRows}) {
        for (const std::size_t nfresh : {std::size_t{0}, std::size_t{1}, n}) {
          for (const bool momentum : {true, false}) {
            if (!momentum && nfresh > 1) continue;  // the fresh products do not read m
            SCOPED_TRACE("d " + std::to_string(d) + ", " + Name(storage) + ", n " +
                         std::to_string(n) + ", F " + std::to_string(nfresh) +
                         (momentum ? "" : ", no momentum"));
            std::vector<int> fresh(nfresh);  // the last rows first, then from 0
            for (std::size_t k = 0; k < nfresh; ++k)
              fresh[k] = static_cast<int>(k == 0 ? n - 1 : k - 1);
            const AnchorLayout at(n, nfresh);
            double* g_out = gpu_->doubles(at.size());
            double* c_out = cpu_->doubles(at.size());
            gpu_->anchor_products(gx, gg, n, d, ga, momentum ? gm : nullptr, fresh, g_out);
            cpu_->anchor_products(cx, cg, n, d, ca, momentum ? cm : nullptr, fresh, c_out);
            const std::vector<double> gpu = Get(*gpu_, g_out, at.size());
            const std::vector<double> cpu = Get(*cpu_, c_out, at.size());
            const std::vector<double> bound =
                AnchorMagnitudes(x, g, a, momentum ? &m : nullptr, n, d, fresh);
            for (std::size_t i = 0; i < at.size(); ++i) {
              EXPECT_LE(std::abs(gpu[i] - cpu[i]), kTolerance * bound[i])
                  << "product " << i << ": " << gpu[i] << " vs the CPU's " << cpu[i];
            }
            for (std::size_t k = 0; k < nfresh; ++k) {  // X_t - X_t is exactly 0
              const auto t = static_cast<std::size_t>(fresh[k]);
              EXPECT_EQ(gpu[at.rows() + k * n + t], 0.0) << "rows, slot " << t;
              EXPECT_EQ(gpu[at.cols() + k * n + t], 0.0) << "cols, slot " << t;
            }
            if (!momentum) {  // exactly 0, not merely small
              for (std::size_t j = 0; j < n; ++j) {
                EXPECT_EQ(gpu[at.f() + j], 0.0) << "f " << j;
                EXPECT_EQ(gpu[at.h() + j], 0.0) << "h " << j;
              }
              EXPECT_EQ(gpu[at.scalars()], 0.0);
              EXPECT_EQ(gpu[at.scalars() + 1], 0.0);
            }
            // The same call again: the same bits (a fixed order of sums).
            double* again = gpu_->doubles(at.size());
            gpu_->anchor_products(gx, gg, n, d, ga, momentum ? gm : nullptr, fresh, again);
            ExpectSameBits(Get(*gpu_, again, at.size()), gpu, "the same call again");
          }
        }
      }
    }
  }
}

// Small integers (|value| <= 8, exact in bf16): every term and every partial
// sum is an integer below 2^53, so any order of sums gives the exact value,
// which int64 arithmetic gives here. Nine fresh slots, repeats among them, take
// two passes over the rows.
TEST_F(CudaPrimitives, AnchorProductsOfSmallIntegersAreExact) {
  constexpr std::size_t n = 5;
  const std::vector<int> fresh = {4, 0, 2, 2, 1, 3, 0, 4, 1};
  std::mt19937 rng(22);
  std::uniform_int_distribution<int> small(-8, 8);
  for (const std::size_t d : {std::size_t{1000}, (std::size_t{1} << 20) + 7}) {
    for (const Storage storage : kStorages) {
      SCOPED_TRACE("d " + std::to_string(d) + ", " + Name(storage));
      const auto integers = [&](std::size_t count) {
        std::vector<float> v(count);
        for (float& f : v) f = static_cast<float>(small(rng));
        return v;
      };
      const std::vector<float> x = integers(n * d);
      const std::vector<float> g = integers(n * d);
      const std::vector<float> a = integers(d);
      const std::vector<float> m = integers(d);
      const auto i64 = [](float f) { return static_cast<std::int64_t>(f); };
      const AnchorLayout at(n, fresh.size());
      std::vector<std::int64_t> exact(at.size(), 0);
      for (std::size_t k = 0; k < d; ++k) {
        const std::int64_t ak = i64(a[k]);
        const std::int64_t mk = i64(m[k]);
        exact[at.scalars()] += mk * mk;
        exact[at.scalars() + 1] += ak * mk;
        exact[at.scalars() + 2] += ak * ak;
        for (std::size_t j = 0; j < n; ++j) {
          const std::int64_t xj = i64(x[j * d + k]);
          const std::int64_t gj = i64(g[j * d + k]);
          exact[at.e() + j] += (ak - xj) * (ak - xj);
          exact[at.f() + j] += mk * (ak - xj);
          exact[at.q() + j] += ak * (ak - xj);
          exact[at.h() + j] += mk * gj;
          exact[at.s() + j] += gj * (ak - xj);
          exact[at.r() + j] += ak * gj;
          for (std::size_t f = 0; f < fresh.size(); ++f) {
            const auto t = static_cast<std::size_t>(fresh[f]);
            const std::int64_t xt = i64(x[t * d + k]);
            const std::int64_t gt = i64(g[t * d + k]);
            exact[at.rows() + f * n + j] += gt * (xt - xj);
            exact[at.cols() + f * n + j] += gj * (xj - xt);
          }
        }
      }
      double* out = gpu_->doubles(at.size());
      gpu_->anchor_products(Stored(*gpu_, x, storage), Stored(*gpu_, g, storage), n, d,
                            Floats(*gpu_, a), Floats(*gpu_, m), fresh, out);
      const std::vector<double> gpu = Get(*gpu_, out, at.size());
      for (std::size_t i = 0; i < at.size(); ++i)
        EXPECT_EQ(gpu[i], static_cast<double>(exact[i])) << "product " << i;
    }
  }
}

// A fresh index outside [0, n), a storage mismatch or a null anchor: refused
// with std::invalid_argument before anything is enqueued, so the output keeps
// its bits; d = 0: every product is 0, n = 0: the scalars alone.
TEST_F(CudaPrimitives, AnchorProductsRefuseBadArgumentsAndWriteNothing) {
  constexpr std::size_t n = 4;
  constexpr std::size_t d = 300;
  std::mt19937 rng(23);
  const StoredRows x = Stored(*gpu_, Normal(rng, n * d), Storage::fp32);
  const StoredRows g = Stored(*gpu_, Normal(rng, n * d), Storage::fp32);
  const StoredRows g16 = Stored(*gpu_, Normal(rng, n * d), Storage::bf16);
  const std::vector<float> a_host = Normal(rng, d);
  const float* a = Floats(*gpu_, a_host);
  const std::vector<double> sentinel(AnchorLayout(n, 2).size(), -7.25);
  double* out = Doubles(*gpu_, sentinel);

  for (const int bad : {4, -1, 1 << 30}) {
    const std::vector<int> fresh = {1, bad};
    try {
      gpu_->anchor_products(x, g, n, d, a, nullptr, fresh, out);
      ADD_FAILURE() << "fresh index " << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::to_string(bad)));
    }
  }
  const std::vector<int> good = {1, 2};
  EXPECT_THROW(gpu_->anchor_products(x, g16, n, d, a, nullptr, good, out), std::invalid_argument);
  EXPECT_THROW(gpu_->anchor_products(x, g, n, d, nullptr, nullptr, good, out),
               std::invalid_argument);
  ExpectSameBits(Get(*gpu_, out, sentinel.size()), sentinel, "after the refused calls");

  gpu_->anchor_products(x, g, n, 0, a, nullptr, good, out);
  ExpectSameBits(Get(*gpu_, out, sentinel.size()), std::vector<double>(sentinel.size(), 0.0),
                 "d = 0");

  double* scalars = Doubles(*gpu_, {-1.0, -1.0, -1.0});
  gpu_->anchor_products(x, g, 0, d, a, nullptr, {}, scalars);
  double anchor_norm = 0.0;
  for (const float v : a_host) anchor_norm += double{v} * double{v};
  const std::vector<double> got = Get(*gpu_, scalars, 3);
  EXPECT_EQ(got[0], 0.0);
  EXPECT_EQ(got[1], 0.0);
  EXPECT_NEAR(got[2], anchor_norm, 1e-12 * anchor_norm);
}

// NaN and infinities at the first, a middle and the last coordinate, values
// above the bound, extreme finite values: the same flags as the CPU's.
TEST_F(CudaPrimitives, WithinBoundFlagsTheRowsTheCpuFlags) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(5);
  for (const std::size_t d : kDims) {
    SCOPED_TRACE("d " + std::to_string(d));
    constexpr std::size_t kRows = 7;
    std::vector<float> rows = Normal(rng, kRows * d);
    rows[1 * d] = kNaN;
    rows[2 * d + d - 1] = kInf;
    rows[3 * d + d / 2] = -kInf;
    rows[4 * d + d / 2] = FLT_MAX;
    rows[5 * d + d - 1] = -3.0f;
    const float* g = Floats(*gpu_, rows);
    const float* c = Floats(*cpu_, rows);
    for (const float bound : {FLT_MAX, 2.5f}) {
      int* gf = gpu_->ints(kRows);
      int* cf = cpu_->ints(kRows);
      gpu_->within_bound(g, kRows, d, bound, gf);
      cpu_->within_bound(c, kRows, d, bound, cf);
      EXPECT_EQ(Get(*gpu_, gf, kRows), Get(*cpu_, cf, kRows)) << "bound " << bound;
    }
  }
}

// ---- the GP -------------------------------------------------------------------------------

// The covariance of n random points in 3 dimensions plus noise (SPD), its
// squared distances to queries, and the bounds of the comparison.
//
// Cholesky with a triangular solve is backward stable: each side solves
// (K + dK) w = k + dk with ||dK|| <= n (3n + 1) u ||K|| (Higham, Thm. 10.4, with
// || |L||L^T| || <= n ||K||) and ||dk|| <= 8 u ||k|| (covariance_vector within 4
// ulp of covariance_value: test_cuda_kernels), so each is within
// kappa(K) (n (3n + 1) + 8) u ||w|| of the exact weights, and the two within
// twice that (10% slack for the first-order terms). The variance
// 1 - k . w then differs by at most ||k|| ||dw|| + ||dk|| ||w|| plus the
// rounding of the two dots, 2 (n + 2) u sum |k_j w_j|; max(0, .) only shrinks it.
TEST_F(CudaPrimitives, FactorAndGpWeightsMatchTheCpu) {
  std::mt19937 rng(6);
  for (const int n : {1, 7, 40}) {
    for (const optex::Covariance kernel : {optex::Covariance::matern52, optex::Covariance::rbf}) {
      SCOPED_TRACE("n " + std::to_string(n) + ", " + std::string(optex::covariance_name(kernel)));
      const auto nz = static_cast<std::size_t>(n);
      constexpr std::size_t kQueries = 3;
      const std::vector<float> points = Normal(rng, (nz + kQueries) * 3);
      const auto squared = [&](std::size_t i, std::size_t j) {
        double s = 0.0;
        for (std::size_t k = 0; k < 3; ++k) {
          const double t = static_cast<double>(points[i * 3 + k]) - points[j * 3 + k];
          s += t * t;
        }
        return s;
      };
      const double inv = 0.8;
      Eigen::MatrixXd cov(n, n);
      for (std::size_t i = 0; i < nz; ++i)
        for (std::size_t j = 0; j < nz; ++j)
          cov(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) =
              optex::covariance_value(kernel, std::sqrt(squared(i, j)) * inv) +
              (i == j ? 1e-2 : 0.0);
      const Eigen::VectorXd eig = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(cov).eigenvalues();
      ASSERT_GT(eig.minCoeff(), 0.0);
      const double kappa = eig.maxCoeff() / eig.minCoeff();
      const double weight_bound =
          2.2 * kappa * (static_cast<double>(nz * (3 * nz + 1)) + 8.0) * kUd;

      int* g_info = gpu_->ints(1);
      int* c_info = cpu_->ints(1);
      gpu_->factor(cov.data(), nz, g_info);
      cpu_->factor(cov.data(), nz, c_info);
      EXPECT_EQ(Get(*gpu_, g_info, 1), std::vector<int>{0});
      EXPECT_EQ(Get(*cpu_, c_info, 1), std::vector<int>{0});
      for (std::size_t q = 0; q < kQueries; ++q) {
        std::vector<double> dist(nz);
        for (std::size_t j = 0; j < nz; ++j) dist[j] = squared(nz + q, j);
        if (q == 1) dist[0] = 0.0;           // a query at a history point: variance about the noise
        double* gw = gpu_->doubles(nz + 1);  // weights, then the variance
        double* cw = cpu_->doubles(nz + 1);
        gpu_->gp_weights(Doubles(*gpu_, dist), nz, kernel, inv, gw, gw + nz, g_info);
        cpu_->gp_weights(Doubles(*cpu_, dist), nz, kernel, inv, cw, cw + nz, c_info);
        const std::vector<double> gpu = Get(*gpu_, gw, nz + 1);
        const std::vector<double> cpu = Get(*cpu_, cw, nz + 1);
        EXPECT_EQ(Get(*gpu_, g_info, 1), std::vector<int>{0});
        double diff = 0.0, norm_w = 0.0, norm_k = 0.0, kw = 0.0;
        for (std::size_t j = 0; j < nz; ++j) {
          const double k = optex::covariance_value(kernel, std::sqrt(dist[j]) * inv);
          diff += (gpu[j] - cpu[j]) * (gpu[j] - cpu[j]);
          norm_w += cpu[j] * cpu[j];
          norm_k += k * k;
          kw += std::abs(k * cpu[j]);
        }
        const double dw = weight_bound * std::sqrt(norm_w);
        EXPECT_LE(std::sqrt(diff), dw) << "query " << q << ", kappa " << kappa;
        const double variance_bound = std::sqrt(norm_k) * dw +
                                      16.0 * kUd * std::sqrt(norm_k * norm_w) +
                                      2.0 * static_cast<double>(nz + 2) * kUd * kw;
        EXPECT_LE(std::abs(gpu[nz] - cpu[nz]), variance_bound)
            << "query " << q << ": variance " << gpu[nz] << " vs the CPU's " << cpu[nz];
        EXPECT_GE(gpu[nz], 0.0);
      }
    }
  }
  // Not positive definite: both say so. gp_weights needs a factor of its size.
  const double indefinite[] = {1.0, 2.0, 2.0, 1.0};
  int* g_info = gpu_->ints(1);
  int* c_info = cpu_->ints(1);
  gpu_->factor(indefinite, 2, g_info);
  cpu_->factor(indefinite, 2, c_info);
  EXPECT_GT(Get(*gpu_, g_info, 1)[0], 0);
  EXPECT_GT(Get(*cpu_, c_info, 1)[0], 0);
  double* scratch = gpu_->doubles(8);
  EXPECT_THROW(
      gpu_->gp_weights(scratch, 3, optex::Covariance::rbf, 1.0, scratch + 3, scratch + 6, g_info),
      std::logic_error);
}

// ---- the optimizer ------------------------------------------------------------------------

// One optimizer's state on a device: a d-float row per slot it uses.
StateRows StateOn(DevicePrimitives& p, const OptimizerRanges& ranges, std::size_t d) {
  StateRows s;
  for (int j = 0; j < optex::kMaxStateSlots; ++j)
    if (ranges.state_slots().uses(j)) s.slot[j] = Floats(p, std::vector<float>(d, 0.0f));
  return s;
}

::testing::AssertionResult SameState(DevicePrimitives& gpu, StateRows g, DevicePrimitives& cpu,
                                     StateRows c, std::size_t d) {
  for (int j = 0; j < optex::kMaxStateSlots; ++j) {
    if (g.slot[j] == nullptr) continue;
    auto r = BitEqual(Get(gpu, g.slot[j], d), Get(cpu, c.slot[j], d));
    if (!r) return r << " (state slot " << j << ")";
  }
  return ::testing::AssertionSuccess();
}

// The optimizers of a dimension: every kind and variant, one range and, from
// d = 300 on, per-range hyperparameters (three ranges, 20 ranges) and two ranges.
std::vector<optex::test::OptimizerConfig> Configs(std::size_t d) {
  std::vector<optex::test::OptimizerConfig> configs = optex::test::EveryKind();
  if (d >= 300) {
    for (auto& c : optex::test::EveryKindInRanges(d)) configs.push_back(std::move(c));
    configs.push_back({"adam_two_ranges", OptimizerRanges{{d / 2, optex::Adam{.lr = 1e-2}},
                                                          {d - d / 2, optex::adamw(3e-3, 0.1)}}});
  }
  for (auto& c : configs) c.optimizer = c.optimizer.for_dimension(d);
  return configs;
}

// Three steps from a given row: into another row, in place, and back; after
// each, x_out and every state slot are the CPU's bit for bit, x_in unchanged.
TEST_F(CudaPrimitives, StepWithAGivenRowIsTheCpuStepBitForBit) {
  std::mt19937 rng(7);
  for (const std::size_t d : kDims) {
    for (const auto& config : Configs(d)) {
      SCOPED_TRACE(config.name + ", d " + std::to_string(d));
      const OptimizerRanges& ranges = config.optimizer;
      const std::vector<float> x0 = Normal(rng, d);
      float* gx[2] = {Floats(*gpu_, x0), gpu_->floats(d)};
      float* cx[2] = {Floats(*cpu_, x0), cpu_->floats(d)};
      const StateRows gs = StateOn(*gpu_, ranges, d);
      const StateRows cs = StateOn(*cpu_, ranges, d);
      const int in[] = {0, 1, 1};
      const int out[] = {1, 1, 0};
      for (std::int64_t t = 0; t < 3; ++t) {
        const std::vector<float> g = Normal(rng, d);
        const auto i = static_cast<std::size_t>(t);
        const std::vector<float> before = Get(*gpu_, gx[in[i]], d);
        gpu_->step(ranges, t, gs, gs, gx[in[i]], gx[out[i]], {.row = Floats(*gpu_, g)}, d, {});
        cpu_->step(ranges, t, cs, cs, cx[in[i]], cx[out[i]], {.row = Floats(*cpu_, g)}, d, {});
        ASSERT_TRUE(BitEqual(Get(*gpu_, gx[out[i]], d), Get(*cpu_, cx[out[i]], d)))
            << "x after step " << t;
        ASSERT_TRUE(SameState(*gpu_, gs, *cpu_, cs, d)) << "after step " << t;
        if (in[i] != out[i]) {
          EXPECT_TRUE(BitEqual(Get(*gpu_, gx[in[i]], d), before)) << "x_in";
        }
      }
    }
  }
}

// Out of place: two steps reading one state and writing another, with a given
// row and with weights: x, the new state (and the sum) are the CPU's bit for
// bit, and the state read is unchanged on both.
TEST_F(CudaPrimitives, StepOutOfPlaceIsTheCpuStepBitForBitAndLeavesItsSourceAlone) {
  std::mt19937 rng(9);
  for (const std::size_t d : kDims) {
    const std::vector<float> h = Normal(rng, 5 * d, 2.0);
    std::vector<double> w(5);
    for (double& v : w) v = optex::test::normal(rng);
    for (const auto& config : Configs(d)) {
      SCOPED_TRACE(config.name + ", d " + std::to_string(d));
      const OptimizerRanges& ranges = config.optimizer;
      const std::vector<float> x0 = Normal(rng, d);
      const std::vector<float> g = Normal(rng, d);
      float* gx = Floats(*gpu_, x0);
      float* cx = Floats(*cpu_, x0);
      const StateRows gs = StateOn(*gpu_, ranges, d);
      const StateRows cs = StateOn(*cpu_, ranges, d);
      gpu_->step(ranges, 0, gs, gs, gx, gx, {.row = Floats(*gpu_, g)}, d, {});  // a state not zero
      cpu_->step(ranges, 0, cs, cs, cx, cx, {.row = Floats(*cpu_, g)}, d, {});
      const StateRows gt = StateOn(*gpu_, ranges, d);
      const StateRows ct = StateOn(*cpu_, ranges, d);
      std::vector<std::vector<float>> before;
      for (int j = 0; j < optex::kMaxStateSlots; ++j) {
        if (cs.slot[j] != nullptr) before.push_back(Get(*cpu_, cs.slot[j], d));
      }
      float* gy = gpu_->floats(d);
      float* cy = cpu_->floats(d);
      gpu_->step(ranges, 1, gs, gt, gx, gy, {.row = Floats(*gpu_, g)}, d, {});
      cpu_->step(ranges, 1, cs, ct, cx, cy, {.row = Floats(*cpu_, g)}, d, {});
      ASSERT_TRUE(BitEqual(Get(*gpu_, gy, d), Get(*cpu_, cy, d))) << "x, a given row";
      ASSERT_TRUE(SameState(*gpu_, gt, *cpu_, ct, d)) << "a given row";
      const StepGradient gw{.history = Stored(*gpu_, h, Storage::fp32),
                            .weights = Doubles(*gpu_, w),
                            .rows = 5,
                            .sum = gpu_->floats(d)};
      const StepGradient cw{.history = fp32_rows(Floats(*cpu_, h)),
                            .weights = Doubles(*cpu_, w),
                            .rows = 5,
                            .sum = cpu_->floats(d)};
      gpu_->step(ranges, 1, gs, gt, gx, gy, gw, d, {});
      cpu_->step(ranges, 1, cs, ct, cx, cy, cw, d, {});
      ASSERT_TRUE(BitEqual(Get(*gpu_, gy, d), Get(*cpu_, cy, d))) << "x, weights";
      ASSERT_TRUE(SameState(*gpu_, gt, *cpu_, ct, d)) << "weights";
      ASSERT_TRUE(SameState(*gpu_, gs, *cpu_, cs, d)) << "the source state";
      std::size_t k = 0;
      for (int j = 0; j < optex::kMaxStateSlots; ++j) {
        if (cs.slot[j] != nullptr) {
          EXPECT_TRUE(BitEqual(Get(*cpu_, cs.slot[j], d), before[k++]));
        }
      }
    }
  }
}

// A step's checks: the flags are the CPU step's (x over the bound at one
// coordinate, a NaN gradient, finite), and the norm has the bits of the
// device's own dot() of the gradient, with a row and with weights.
TEST_F(CudaPrimitives, AStepsChecksAreTheCpusFlagsAndTheDevicesDot) {
  std::mt19937 rng(10);
  constexpr float kBound = 1e6f;
  for (const std::size_t d : kDims) {
    const std::vector<float> h = Normal(rng, 5 * d, 2.0);
    std::vector<double> w(5);
    for (double& v : w) v = optex::test::normal(rng);
    for (const auto& config : Configs(d)) {
      const OptimizerRanges& ranges = config.optimizer;
      const auto flag_count = static_cast<std::size_t>(1 + ranges.state_slots().count());
      for (int variant = 0; variant < 3; ++variant) {
        for (const bool weighted : {false, true}) {
          SCOPED_TRACE(config.name + ", d " + std::to_string(d) + ", variant " +
                       std::to_string(variant) + (weighted ? ", weights" : ""));
          std::vector<float> x0 = Normal(rng, d);
          std::vector<float> g = Normal(rng, d);
          if (variant == 1) x0[d / 2] = 3 * kBound;
          if (variant == 2) g[d - 1] = std::numeric_limits<float>::quiet_NaN();
          float* gx = Floats(*gpu_, x0);
          float* cx = Floats(*cpu_, x0);
          const StateRows gs = StateOn(*gpu_, ranges, d);
          const StateRows cs = StateOn(*cpu_, ranges, d);
          StepGradient gg{.row = Floats(*gpu_, g)};
          StepGradient cg{.row = Floats(*cpu_, g)};
          if (weighted) {
            gg = {.history = Stored(*gpu_, h, Storage::fp32),
                  .weights = Doubles(*gpu_, w),
                  .rows = 5,
                  .sum = gpu_->floats(d)};
            cg = {.history = fp32_rows(Floats(*cpu_, h)),
                  .weights = Doubles(*cpu_, w),
                  .rows = 5,
                  .sum = cpu_->floats(d)};
          }
          int* gf = gpu_->ints(flag_count);
          int* cf = cpu_->ints(flag_count);
          double* gn = gpu_->doubles(2);
          double* cn = cpu_->doubles(1);
          gpu_->step(ranges, 0, gs, gs, gx, gx, gg, d, {gf, kBound, gn});
          cpu_->step(ranges, 0, cs, cs, cx, cx, cg, d, {cf, kBound, cn});
          const float* gsum = weighted ? gg.sum : gg.row;
          gpu_->dot(gsum, gsum, d, gn + 1);
          EXPECT_EQ(Get(*gpu_, gf, flag_count), Get(*cpu_, cf, flag_count));
          const std::vector<double> norms = Get(*gpu_, gn, 2);
          EXPECT_TRUE(optex::test::SameBits(norms[0], norms[1])) << norms[0] << " " << norms[1];
        }
      }
    }
  }
}

// The weighted sum of 0, 1, 5 and 13 history rows (groups of four, then the
// rest) with the same fp64 weights, fp32 and bf16 history: x, the state and the
// sum are the CPU's bit for bit; without a sum row, x and the state still are.
TEST_F(CudaPrimitives, StepWithWeightsIsTheCpuStepBitForBit) {
  std::mt19937 rng(8);
  for (const std::size_t d : kDims) {
    for (const Storage s : kStorages) {
      for (const std::size_t rows :
           {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{13}}) {
        const std::vector<float> h = Normal(rng, std::max<std::size_t>(rows, 1) * d, 2.0);
        std::vector<double> w(std::max<std::size_t>(rows, 1));
        for (double& v : w) v = optex::test::normal(rng);
        const StepGradient gg{
            .history = Stored(*gpu_, h, s), .weights = Doubles(*gpu_, w), .rows = rows};
        const StepGradient cg{.history = fp32_rows(Floats(*cpu_, AsStored(h, s))),
                              .weights = Doubles(*cpu_, w),
                              .rows = rows};
        for (const auto& config : Configs(d)) {
          SCOPED_TRACE(config.name + ", d " + std::to_string(d) + ", " + Name(s) + ", rows " +
                       std::to_string(rows));
          const OptimizerRanges& ranges = config.optimizer;
          const std::vector<float> x0 = Normal(rng, d);
          const std::vector<float> g = Normal(rng, d);
          for (const bool with_sum : {true, false}) {
            float* gx = Floats(*gpu_, x0);
            float* cx = Floats(*cpu_, x0);
            const StateRows gs = StateOn(*gpu_, ranges, d);
            const StateRows cs = StateOn(*cpu_, ranges, d);
            // A step from a given row first, so that the state is not zero.
            gpu_->step(ranges, 0, gs, gs, gx, gx, {.row = Floats(*gpu_, g)}, d, {});
            cpu_->step(ranges, 0, cs, cs, cx, cx, {.row = Floats(*cpu_, g)}, d, {});
            StepGradient gw = gg;
            StepGradient cw = cg;
            gw.sum = with_sum ? gpu_->floats(d) : nullptr;
            cw.sum = with_sum ? cpu_->floats(d) : nullptr;
            float* gy = gpu_->floats(d);
            float* cy = cpu_->floats(d);
            gpu_->step(ranges, 1, gs, gs, gx, gy, gw, d, {});
            cpu_->step(ranges, 1, cs, cs, cx, cy, cw, d, {});
            ASSERT_TRUE(BitEqual(Get(*gpu_, gy, d), Get(*cpu_, cy, d))) << "x, sum " << with_sum;
            ASSERT_TRUE(SameState(*gpu_, gs, *cpu_, cs, d)) << "sum " << with_sum;
            if (with_sum) {
              ASSERT_TRUE(BitEqual(Get(*gpu_, gw.sum, d), Get(*cpu_, cw.sum, d))) << "the sum";
            }
          }
        }
      }
    }
  }
}

// ---- mean_of_rows -------------------------------------------------------------------------

// Means of 1, 3 (in two orders), 8, 65 (past the kernel arguments' 64) and 70
// (reversed) rows: the mean is the CPU's bit for bit (the same fp64 sums in the
// same order), with or without the sums. The sums add the same fp64 terms in
// another order: d terms m_k^2, and d |which| terms (x - m_k)^2, each rounded
// the same way on both sides; for any order a sum of N non-negative terms is
// within (N - 1) u_d of exact, so the two within 2 N u_d of each other.
TEST_F(CudaPrimitives, MeanOfRowsIsTheCpuMean) {
  constexpr std::size_t kRows = 70;
  std::mt19937 rng(9);
  std::vector<std::vector<int>> cases = {{3}, {0, 2, 5}, {5, 2, 0}, {1, 2, 3, 4, 5, 6, 7, 9}};
  std::vector<int> many(65);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int>((i * 7) % kRows);
  cases.push_back(many);
  std::vector<int> all(kRows);
  for (std::size_t i = 0; i < kRows; ++i) all[i] = static_cast<int>(kRows - 1 - i);
  cases.push_back(all);
  for (const std::size_t d : kDims) {
    const std::vector<float> rows = Normal(rng, kRows * d, 2.0);
    const float* g = Floats(*gpu_, rows);
    const float* c = Floats(*cpu_, rows);
    for (const std::vector<int>& which : cases) {
      SCOPED_TRACE("d " + std::to_string(d) + ", " + std::to_string(which.size()) + " rows");
      float* gm = gpu_->floats(d);
      float* cm = cpu_->floats(d);
      float* gm2 = gpu_->floats(d);
      double* gs = gpu_->doubles(2);
      double* cs = cpu_->doubles(2);
      std::vector<int> list = which;
      gpu_->mean_of_rows(g, list, d, gm, gs);
      std::fill(list.begin(), list.end(), -1);  // read at once: changing it changes nothing
      list = which;
      gpu_->mean_of_rows(g, list, d, gm2, nullptr);
      cpu_->mean_of_rows(c, which, d, cm, cs);
      const std::vector<float> mean = Get(*gpu_, gm, d);
      EXPECT_TRUE(BitEqual(mean, Get(*cpu_, cm, d))) << "the mean";
      EXPECT_TRUE(BitEqual(Get(*gpu_, gm2, d), mean)) << "the mean without sums";
      const std::vector<double> gpu = Get(*gpu_, gs, 2);
      const std::vector<double> cpu = Get(*cpu_, cs, 2);
      const double terms[2] = {static_cast<double>(d), static_cast<double>(d * which.size())};
      for (std::size_t s = 0; s < 2; ++s) {
        EXPECT_LE(std::abs(gpu[s] - cpu[s]), 2.0 * terms[s] * kUd * cpu[s])
            << "sums[" << s << "]: " << gpu[s] << " vs the CPU's " << cpu[s];
      }
    }
  }
}

// The data-parallel group mean: elementwise, so bitwise the CPU's (and so
// data_parallel.hpp's mean_in_rank_order), for 1, 2, 3 and 8 blocks.
TEST_F(CudaPrimitives, MeanInRankOrderIsTheCpuBitForBit) {
  std::mt19937 rng(10);
  for (const std::size_t d : kDims) {
    for (const std::size_t count : {1u, 2u, 3u, 8u}) {
      SCOPED_TRACE("d " + std::to_string(d) + ", " + std::to_string(count) + " blocks");
      const std::vector<float> blocks = Normal(rng, count * d, 3.0);
      float* gm = gpu_->floats(d);
      float* cm = cpu_->floats(d);
      gpu_->mean_in_rank_order(Floats(*gpu_, blocks), count, d, gm);
      cpu_->mean_in_rank_order(Floats(*cpu_, blocks), count, d, cm);
      EXPECT_TRUE(BitEqual(Get(*gpu_, gm, d), Get(*cpu_, cm, d)));
    }
  }
}

}  // namespace
