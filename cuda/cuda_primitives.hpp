// CUDA's device primitives (optex/backend/device_primitives.hpp): the memory of
// one device, the kernels of kernels.cuh, cuBLAS and cuSOLVER.
//
// Everything is enqueued on one non-blocking stream, which the cuBLAS and
// cuSOLVER handles share, so the stream order is the call order and no event
// is needed. The host waits in fetch() (once, for every value it names),
// device_iterate's fetch({}), and the synchronous host views (view,
// view_stored, download, upload); nowhere else, except once in the first
// rows(count, bf16), which probes the bf16 GEMM.
//
// Memory the backend asks for (floats, rows, doubles, ints) is owned here and
// zeroed on the stream, as the CPU's is. Scratch the primitives need for
// themselves (reduction partials, the GEMM's fp32 output, the Cholesky
// factor and its workspace, the kernel vector, long `which` lists) grows on
// demand; a buffer it outgrows may still be read by enqueued work, so it is
// kept until the next fetch() has waited for that work, and so are host
// copies that enqueued copies read.
//
// The member functions live in two files: cuda_primitives.cpp (construction,
// memory, transfers, fetch, host views) and cuda_primitives_compute.cpp (the
// reductions, the GP, the optimizer step, mean_of_rows). Compiled by the host
// compiler. Private to the library.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda_context.hpp"
#include "device_buffer.hpp"
#include "kernels.cuh"
#include "optex/backend/device_primitives.hpp"

namespace optex::cuda {

class CudaPrimitives final : public detail::DevicePrimitives {
 public:
  // The device must exist (std::invalid_argument otherwise); creates the
  // stream and the handles, allocates nothing else.
  explicit CudaPrimitives(const Device& device);
  ~CudaPrimitives() override;
  CudaPrimitives(const CudaPrimitives&) = delete;
  CudaPrimitives& operator=(const CudaPrimitives&) = delete;

  Device device() const override { return device_; }
  bool host_memory() const override { return false; }
  bool copies_cannot_fail() const override { return false; }

  // ---- memory (cuda_primitives.cpp) ----
  // `bytes` plus kWorkspaceMargin against cudaMemGetInfo's free memory, then
  // the pinned staging buffer of fetch().
  void check_memory(std::size_t bytes, std::size_t staging_bytes, const std::string& what) override;
  float* floats(std::size_t count) override;
  detail::StoredRows rows(std::size_t count, detail::Storage storage) override;
  double* doubles(std::size_t count) override;
  int* ints(std::size_t count) override;

  // ---- transfers (cuda_primitives.cpp) ----
  void put(const void* host, void* to, std::size_t bytes) override;
  void copy(const float* from, float* to, std::size_t count) override;
  void zero(float* to, std::size_t count) override;
  void copy_stored(detail::StoredRows from, detail::StoredRows to, std::size_t count) override;
  void store(const float* from, detail::StoredRows to, std::size_t count) override;
  void load(detail::StoredRows from, float* to, std::size_t count) override;

  // ---- reductions (cuda_primitives_compute.cpp) ----
  void squared_distances(detail::StoredRows rows, std::size_t nrows, std::size_t d,
                         std::span<const detail::StoredRows> queries, double* out,
                         double* norms) override;
  void inner_products(detail::StoredRows rows, std::size_t nrows, std::size_t d,
                      std::span<const detail::StoredRows> queries, double* out) override;
  // anchor_products.cu's kernels: one pass over the rows per kAnchorFreshPerPass
  // fresh slots.
  void anchor_products(detail::StoredRows points, detail::StoredRows gradients, std::size_t n,
                       std::size_t d, const float* a, const float* m, std::span<const int> fresh,
                       double* out) override;
  void pair_statistics(const float* a, const float* b, std::size_t d, double* out) override;
  void dot(const float* a, const float* b, std::size_t d, double* out) override;
  void within_bound(const float* rows, std::size_t nrows, std::size_t d, float bound,
                    int* flags) override;

  // ---- the GP (cuda_primitives_compute.cpp) ----
  void factor(const double* host, std::size_t n, int* info) override;
  void gp_weights(const double* squared_distances, std::size_t n, Covariance kernel,
                  double inv_scaled_lengthscale, double* weights, double* variance,
                  int* info) override;

  // ---- the optimizer (cuda_primitives_compute.cpp) ----
  void step(const OptimizerRanges& ranges, std::int64_t step, detail::StateRows state_in,
            detail::StateRows state_out, const float* x_in, float* x_out,
            const detail::StepGradient& gradient, std::size_t d,
            const detail::StepChecks& checks) override;
  void mean_of_rows(const float* rows, std::span<const int> which, std::size_t d, float* mean,
                    double* sums) override;
  void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                          float* out) override;

  // ---- the one wait, host views (cuda_primitives.cpp) ----
  void fetch(std::span<const detail::Fetch> values) override;
  const float* view(const float* data, std::size_t count, std::vector<float>& scratch) override;
  void view_stored(detail::StoredRows data, std::size_t count, std::vector<float>& out) override;
  // DeviceRows: ordered on the stream (they see every enqueued update) and
  // synchronous; safe from several host threads at once (they touch no
  // member but the stream, which serialises the copies).
  void download(const float* device_src, float* host_dst, std::size_t count) const override;
  void upload(const float* host_src, float* device_dst, std::size_t count) const override;

  // What check_memory() adds to the backend's bytes for memory allocated
  // later and not counted there: cuBLAS's workspace (up to 32 MiB per handle
  // on Hopper), cuSOLVER's potrf workspace, and this object's scratch: the
  // factor (T0 x T0 doubles: 8 MiB at T0 = 1024), the GEMM's fp32 output and
  // the reduction partials, each grown to at most twice its need. Larger
  // histories may still fail later, in the call that grows the scratch, with
  // a CudaError (a std::runtime_error) naming cudaMalloc.
  static constexpr std::size_t kWorkspaceMargin = std::size_t{64} << 20;

 private:
  cudaStream_t stream() const { return stream_.get(); }
  // Waits for everything enqueued; every call site says why it must.
  void synchronize() const { OPTEX_CUDA_CHECK(cudaStreamSynchronize(stream())); }
  // `bytes` of device memory owned until destruction, zeroed on the stream.
  void* allocate(std::size_t bytes);
  // `count` values of T in `buffer`, grown (to at least twice its size) when
  // too small; the outgrown buffer waits in retired_ for the next fetch().
  template <class T>
  T* scratch(DeviceBuffer<std::byte>& buffer, std::size_t count);
  // The reduction partials for `rows` rows over d (reduction_blocks(d) each).
  double* partials(std::size_t d, std::size_t rows);
  // out (nrows x q, column-major, fp32) := rows[0..nrows)^T [first .. first + q)
  // by one cublasGemmEx with fp32 accumulation (CUBLAS_COMPUTE_32F).
  void gemm(detail::StoredRows rows, std::size_t nrows, std::size_t d, detail::StoredRows first,
            std::size_t q, float* out);
  // One 1 x 1 x 1 bf16 GEMM, synchronised: std::runtime_error where cuBLAS
  // cannot multiply bf16 on this device, at construction rather than in a
  // commit.
  void probe_bf16_gemm();

  DeviceGuard activation_;  // first member: active during construction and destruction only
  Device device_;
  int index_;
  Stream stream_;
  BlasHandle blas_;
  SolverHandle solver_;

  std::vector<DeviceBuffer<std::byte>> blocks_;   // what floats/rows/doubles/ints handed out
  std::vector<DeviceBuffer<std::byte>> retired_;  // outgrown scratch, until the next fetch()
  std::vector<std::vector<int>> held_lists_;      // mean_of_rows' long lists, likewise
  DeviceBuffer<std::byte> partials_, products_, factor_, potrf_work_, kernel_vector_, which_;
  std::size_t factored_ = 0;  // n of the last factor()
  bool has_factor_ = false;
  bool bf16_probed_ = false;
  StepCoefficients coefficients_;  // reused by every step

  // fetch(): the pinned staging buffer, and where each value of a fetch went
  // in it (or kDirect: copied straight to the host, past the staging).
  PinnedBuffer<std::byte> staging_;
  std::vector<std::size_t> placed_;
  std::vector<bf16_bits> raw_;  // view_stored's bf16 values
};

}  // namespace optex::cuda
