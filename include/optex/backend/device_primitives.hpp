// The small set of operations a device must offer for an Engine to run on it.
//
// The per-round logic (what to compute, in which order, what to stage and
// restore, what to validate) is written once, in the device backend
// (src/backend/device_backend.cpp), over this interface. A device implements only
// these primitives: the CPU with the streaming passes and Eigen
// (src/backend/cpu_primitives.cpp), CUDA with its kernels, cuBLAS and cuSOLVER
// (cuda/cuda_primitives.cpp). Tests add a deferred implementation and a
// fault-injecting one around the CPU's (tests/support/deferred_primitives.hpp,
// tests/support/faulty_primitives.hpp), which make a device's hazards visible without
// a device.
//
// The contract (DESIGN.md section 7):
// - Every call except fetch(), download(), upload() and the host views
//   *enqueues*: it may return before its work is done, in which case the work
//   runs in call order. Results (device memory) are defined for later
//   enqueued work at once, for the host only after the next fetch().
// - fetch() is the one wait: it copies the named device values to the host
//   and returns when everything enqueued before it has finished. An error of
//   enqueued work may surface at any later call, at the latest at fetch().
// - Host memory an enqueued call reads (the `host` argument of put()) must
//   stay unchanged until the next fetch().
// - Any call may throw. A call that throws leaves device memory other than
//   its own outputs unchanged; the backend restores the rest.
// - The cost is one virtual call per pass over memory, never per element.
//
// Not part of the public API: it may change between versions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/engine/batch.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex::detail {

// How a history keeps its values: fp32, or bf16 (half the bytes; rounded to
// nearest even on the way in, exact on the way out).
enum class Storage { fp32, bf16 };

inline std::size_t storage_bytes(Storage s) { return s == Storage::bf16 ? 2 : 4; }

// Rows of d values in a device's memory in one storage type.
struct StoredRows {
  void* data = nullptr;
  Storage storage = Storage::fp32;
  // Row r, for a row stride of d values.
  StoredRows row(std::size_t r, std::size_t d) const {
    return {static_cast<char*>(data) + r * d * storage_bytes(storage), storage};
  }
};

// An fp32 row seen as StoredRows.
inline StoredRows fp32_rows(const float* rows) { return {const_cast<float*>(rows), Storage::fp32}; }

// One optimizer state in a device's memory: slot j's d floats, nullptr where
// the optimizer keeps no slot j.
struct StateRows {
  float* slot[kMaxStateSlots] = {};
};

// The gradient one optimizer step uses: `row`, or the weighted sum of the
// first `rows` rows of `history` with device `weights` (fp64, rounded to fp32
// before use), which is also written to `sum` when that is not null.
struct StepGradient {
  const float* row = nullptr;
  StoredRows history{};
  const double* weights = nullptr;
  std::size_t rows = 0;
  float* sum = nullptr;
};

// What a step also measures in its own pass, outputs in device memory (each
// skipped where null): flags[0] := 1 if every value of x_out is finite and at
// most `bound` in magnitude, flags[1 + r] := 1 if the r-th slot state_out
// uses (in slot order) is finite, else 0, as within_bound() would give after
// the step; gradient_norm := ||gradient||^2 with the bits of dot() of the
// gradient with itself: the row given, or with weights the sum row, which
// must then be given (std::invalid_argument otherwise, before anything runs);
// step_length := ||x_out - x_in||^2 with the bits of squared_distances() of
// x_out as the row and x_in as the query (x_in != x_out).
struct StepChecks {
  int* flags = nullptr;
  float bound = 0.0f;
  double* gradient_norm = nullptr;
  double* step_length = nullptr;
};

// Where anchor_products() puts each product: offsets into its output for n
// history rows and `fresh` renewed slots (6 n + 3 + 2 n fresh doubles).
struct AnchorLayout {
  std::size_t n = 0;
  std::size_t fresh = 0;
  AnchorLayout(std::size_t rows, std::size_t renewed) : n(rows), fresh(renewed) {}
  std::size_t e() const { return 0; }
  std::size_t f() const { return n; }
  std::size_t q() const { return 2 * n; }
  std::size_t h() const { return 3 * n; }
  std::size_t s() const { return 4 * n; }
  std::size_t r() const { return 5 * n; }
  std::size_t scalars() const { return 6 * n; }  // ||m||^2, <a, m>, ||a||^2
  std::size_t rows() const { return 6 * n + 3; }
  std::size_t cols() const { return 6 * n + 3 + fresh * n; }
  std::size_t size() const { return 6 * n + 3 + 2 * fresh * n; }
};

// A value the host needs, named for fetch(): `count` elements at `device`
// copied to `host`.
struct Fetch {
  const void* device = nullptr;
  void* host = nullptr;
  std::size_t bytes = 0;
};
template <class T>
Fetch fetch_of(const T* device, T* host, std::size_t count) {
  return {device, host, count * sizeof(T)};
}

class DevicePrimitives : public DeviceRows {
 public:
  ~DevicePrimitives() override = default;

  virtual Device device() const = 0;
  // Whether device memory is host memory that the host may read after a
  // fetch() without a copy (the CPU). Decides only whether the batch uses its
  // own host rows and whether host views copy.
  virtual bool host_memory() const = 0;
  // Whether put(), copy(), store() and zero() cannot fail once memory is
  // allocated (plain memory copies on the host). Where they can, the backend
  // keeps what a commit overwrites until the commit cannot fail any more.
  virtual bool copies_cannot_fail() const = 0;
  // The threads of the host's passes (Options::threads); nothing on a device.
  virtual void set_threads(int /*threads*/) {}

  // ---- memory: owned by the primitives, valid until they are destroyed ----
  // Called once, before any allocation, with everything the backend will
  // allocate (`bytes` of device memory) and the most it fetches at once
  // (`staging_bytes`, which a device may keep in pinned host memory):
  // throws std::runtime_error naming both numbers and what to lower when
  // they do not fit.
  virtual void check_memory(std::size_t bytes, std::size_t staging_bytes,
                            const std::string& what) = 0;
  virtual float* floats(std::size_t count) = 0;
  virtual StoredRows rows(std::size_t count, Storage storage) = 0;
  virtual double* doubles(std::size_t count) = 0;
  virtual int* ints(std::size_t count) = 0;

  // ---- transfers (enqueued) ----
  // to[0, count) := host[0, count); host must stay as it is until fetch().
  virtual void put(const void* host, void* to, std::size_t bytes) = 0;
  virtual void copy(const float* from, float* to, std::size_t count) = 0;
  virtual void zero(float* to, std::size_t count) = 0;
  // Raw bytes between stored rows of the same storage (backups).
  virtual void copy_stored(StoredRows from, StoredRows to, std::size_t count) = 0;
  // Storage conversion: to := storage(from), and to := float(from).
  virtual void store(const float* from, StoredRows to, std::size_t count) = 0;
  virtual void load(StoredRows from, float* to, std::size_t count) = 0;

  // ---- reductions over d (enqueued; fp64 results) ----
  // out[q * nrows + j] = ||queries[q] - rows[j]||^2 (from the differences);
  // norms, when not null: out_norms[q] = ||queries[q]||^2 from the same pass.
  // queries: stored rows (may be history slots), one pointer each.
  virtual void squared_distances(StoredRows rows, std::size_t nrows, std::size_t d,
                                 std::span<const StoredRows> queries, double* out,
                                 double* norms = nullptr) = 0;
  // out[q * nrows + j] = <queries[q], rows[j]> (the new gradient Gram rows).
  virtual void inner_products(StoredRows rows, std::size_t nrows, std::size_t d,
                              std::span<const StoredRows> queries, double* out) = 0;
  // The anchor products that proxy steps in coefficient space read
  // (DESIGN.md section 7, "Proxy steps in coefficient space"), in one pass
  // over the first n rows of points X and gradients G (stored rows, the same
  // storage), with the anchor a and the momentum buffer m (fp32, d values;
  // m may be null: its products are then 0). Every product is a sum in fp64
  // of fp64 terms; each difference is formed per coordinate in fp64 (exact
  // for fp32 values), so a product scales with the distances among the
  // points and the anchor, never with their norms. out (AnchorLayout(n, F),
  // F = fresh.size()):
  //   e[j] = ||a - X_j||^2      f[j] = <m, a - X_j>     q[j] = <a, a - X_j>
  //   h[l] = <m, G_l>           s[l] = <G_l, a - X_l>   r[l] = <a, G_l>
  //   scalars = {||m||^2, <a, m>, ||a||^2}
  //   for k < F, with t = fresh[k] < n:
  //     rows[k * n + j] = <G_t, X_t - X_j>,  cols[k * n + l] = <G_l, X_l - X_t>
  // `fresh` is host memory read at once. The sums' order is fixed (blocks
  // of coordinates in order), so the bits do not depend on the threads.
  virtual void anchor_products(StoredRows points, StoredRows gradients, std::size_t n,
                               std::size_t d, const float* a, const float* m,
                               std::span<const int> fresh, double* out) = 0;
  // out = {<a,a>, <a,b>, <b,b>, ||a - b||^2} over d.
  virtual void pair_statistics(const float* a, const float* b, std::size_t d, double* out) = 0;
  // out = <a, b>.
  virtual void dot(const float* a, const float* b, std::size_t d, double* out) = 0;
  // flags[r] = 1 if every value of row r (nrows x d, stride d) is finite and
  // at most `bound` in magnitude, else 0.
  virtual void within_bound(const float* rows, std::size_t nrows, std::size_t d, float bound,
                            int* flags) = 0;

  // ---- the GP (T0 x T0, fp64) ----
  // The Cholesky factor of the n x n covariance `host` (column-major, host
  // memory that must stay until fetch()); info := 0 on success, > 0 where
  // the matrix is not positive definite.
  virtual void factor(const double* host, std::size_t n, int* info) = 0;
  // With the last factor: k_j = kernel(sqrt(squared_distances[j]) * inv),
  // weights := (K + sigma^2 I)^-1 k, variance := max(0, 1 - k . weights),
  // info := 0 where the solve succeeded.
  virtual void gp_weights(const double* squared_distances, std::size_t n, Covariance kernel,
                          double inv_scaled_lengthscale, double* weights, double* variance,
                          int* info) = 0;

  // ---- the optimizer ----
  // x_out := x_in and state_out := state_in, then the optimizer's update of
  // x_out and state_out with `gradient`, each coordinate with its range's
  // coefficients at the state's step `step` (OptimizerRange::local_step), in
  // one pass: stepping out of place costs no copy. x_in may equal x_out and
  // state_in state_out (in place); partial overlaps are not allowed. `checks`
  // adds what the pass measures on the way (a device may run them as passes
  // of their own; the values are the same).
  virtual void step(const OptimizerRanges& ranges, std::int64_t step, StateRows state_in,
                    StateRows state_out, const float* x_in, float* x_out,
                    const StepGradient& gradient, std::size_t d, const StepChecks& checks) = 0;
  // mean := float(sum of rows[r] for r in `which`, in fp64, in that order, /
  // |which|); when sums is not null: sums[0] = ||mean||^2 (of the fp64 mean),
  // sums[1] = sum over r in which of ||rows[r] - mean||^2 (fp64). `which`
  // is host memory read at once.
  virtual void mean_of_rows(const float* rows, std::span<const int> which, std::size_t d,
                            float* mean, double* sums) = 0;

  // out[j] := (blocks[0][j] + blocks[1][j] + ...) / count, summed in fp32 block
  // by block in order (blocks: count x n, contiguous): the data-parallel
  // group mean of data_parallel.hpp, j < n.
  virtual void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                                  float* out) = 0;

  // ---- the one wait ----
  // Copies each value to the host once everything enqueued before has
  // finished, then returns. Throws for any error of enqueued work.
  virtual void fetch(std::span<const Fetch> values) = 0;

  // ---- host views (synchronous; DeviceRows adds download and upload) ----
  // The count values at `data` readable on the host: `data` itself on host
  // memory, else a copy in `scratch`.
  virtual const float* view(const float* data, std::size_t count, std::vector<float>& scratch) = 0;
  virtual void view_stored(StoredRows data, std::size_t count, std::vector<float>& out) = 0;
};

// The CPU's primitives: streaming passes on Options::threads threads, Eigen.
std::unique_ptr<DevicePrimitives> make_cpu_primitives(int threads);
// CUDA's on options.device; std::invalid_argument without CUDA or device.
std::unique_ptr<DevicePrimitives> make_cuda_primitives(const Device& device);

// Tests run an Engine on primitives of their own: while one is alive on a
// thread, engines made there on Device::cpu() take their primitives from it.
using PrimitivesFactory = std::unique_ptr<DevicePrimitives> (*)(int threads, void* context);
class ScopedPrimitives {
 public:
  ScopedPrimitives(PrimitivesFactory factory, void* context);
  ~ScopedPrimitives();
  ScopedPrimitives(const ScopedPrimitives&) = delete;
  ScopedPrimitives& operator=(const ScopedPrimitives&) = delete;

 private:
  PrimitivesFactory previous_;
  void* previous_context_;
};
// The factory in force on this thread, or nullptr.
PrimitivesFactory test_primitives(void** context);

}  // namespace optex::detail
