// CUDA's primitives: construction, memory, transfers, fetch() and the host
// views (cuda_primitives.hpp describes the whole class).
#include "cuda_primitives.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda_check.hpp"
#include "device_memory.hpp"
#include "optex/backend/bf16.hpp"

namespace optex::cuda {
namespace {

using detail::Fetch;
using detail::Storage;
using detail::StoredRows;

constexpr std::size_t kDirect = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kStagingAlignment = 16;  // every staged value starts aligned for any type

std::size_t add_saturating(std::size_t a, std::size_t b) {
  return b > std::numeric_limits<std::size_t>::max() - a ? std::numeric_limits<std::size_t>::max()
                                                         : a + b;
}

std::size_t mul_checked(std::size_t count, std::size_t size, const char* what) {
  if (size != 0 && count > std::numeric_limits<std::size_t>::max() / size) {
    throw std::length_error(std::string(what) + ": " + std::to_string(count) +
                            " values do not fit in memory");
  }
  return count * size;
}

}  // namespace

CudaPrimitives::CudaPrimitives(const Device& device)
    : activation_(checked_device(device)),
      device_(device),
      index_(device.index),
      blas_(stream_.get()),
      solver_(stream_.get()) {
  activation_.leave();  // the caller's device again; public methods guard themselves
}

CudaPrimitives::~CudaPrimitives() {
  // The buffers, handles and the stream are released by the member
  // destructors that run after this body: make the device current for them
  // (activation_, the first member, is destroyed last and restores the
  // caller's device), and let enqueued work finish before its memory goes.
  activation_.enter_noexcept();
  cudaStreamSynchronize(stream());  // best effort: never throws
}

// ---- memory ------------------------------------------------------------------------

void CudaPrimitives::check_memory(std::size_t bytes, std::size_t staging_bytes,
                                  const std::string& what) {
  DeviceGuard guard(index_);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  OPTEX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::size_t need = add_saturating(bytes, kWorkspaceMargin);
  if (need > free_bytes) {
    std::ostringstream msg;
    msg << "device: " << device_.name() << " has " << free_bytes << " bytes free but " << what
        << " needs " << need << " bytes (" << bytes << " for its rows and buffers, "
        << kWorkspaceMargin
        << " for the cuBLAS and cuSOLVER workspaces and scratch); lower Options::history or "
           "Options::parallelism, or store the history in bf16 with Options::history_precision";
    throw std::runtime_error(msg.str());
  }
  if (staging_bytes <= staging_.size()) return;
  try {
    staging_ = PinnedBuffer<std::byte>(staging_bytes);
  } catch (const CudaError& e) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for later calls
    throw std::runtime_error(
        "device: " + device_.name() + " could not pin " + std::to_string(staging_bytes) +
        " bytes of host memory to fetch its results through (" + e.what() + ")");
  }
}

void* CudaPrimitives::allocate(std::size_t bytes) {
  DeviceGuard guard(index_);
  // At least one byte, so that every allocation has an address of its own, as on the CPU.
  DeviceBuffer<std::byte> block(std::max<std::size_t>(bytes, 1));
  OPTEX_CUDA_CHECK(cudaMemsetAsync(block.data(), 0, block.bytes(), stream()));
  blocks_.push_back(std::move(block));
  return blocks_.back().data();
}

float* CudaPrimitives::floats(std::size_t count) {
  return static_cast<float*>(allocate(mul_checked(count, sizeof(float), "floats")));
}

StoredRows CudaPrimitives::rows(std::size_t count, Storage storage) {
  if (storage == Storage::bf16 && !bf16_probed_) probe_bf16_gemm();
  return {allocate(mul_checked(count, detail::storage_bytes(storage), "rows")), storage};
}

double* CudaPrimitives::doubles(std::size_t count) {
  return static_cast<double*>(allocate(mul_checked(count, sizeof(double), "doubles")));
}

int* CudaPrimitives::ints(std::size_t count) {
  return static_cast<int*>(allocate(mul_checked(count, sizeof(int), "ints")));
}

template <class T>
T* CudaPrimitives::scratch(DeviceBuffer<std::byte>& buffer, std::size_t count) {
  const std::size_t bytes = mul_checked(count, sizeof(T), "scratch");
  if (buffer.bytes() < bytes) {
    // Doubling keeps the number of growths (and retired buffers) logarithmic.
    DeviceBuffer<std::byte> bigger(std::max(bytes, 2 * buffer.bytes()));
    if (buffer.size() > 0) retired_.push_back(std::move(buffer));  // enqueued work may read it
    buffer = std::move(bigger);
  }
  return reinterpret_cast<T*>(buffer.data());
}

template float* CudaPrimitives::scratch<float>(DeviceBuffer<std::byte>&, std::size_t);
template double* CudaPrimitives::scratch<double>(DeviceBuffer<std::byte>&, std::size_t);
template int* CudaPrimitives::scratch<int>(DeviceBuffer<std::byte>&, std::size_t);

double* CudaPrimitives::partials(std::size_t d, std::size_t rows) {
  const auto blocks = static_cast<std::size_t>(reduction_blocks(d));
  return scratch<double>(partials_, mul_checked(blocks, std::max<std::size_t>(rows, 1), "rows"));
}

void CudaPrimitives::probe_bf16_gemm() {
  DeviceGuard guard(index_);
  const bf16_bits one = detail::to_bf16(1.0f);
  const bf16_bits two = detail::to_bf16(2.0f);
  float product = 0.0f;
  try {
    DeviceBuffer<bf16_bits> a(1);
    DeviceBuffer<bf16_bits> b(1);
    DeviceBuffer<float> c(1);
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(a.data(), &one, sizeof one, cudaMemcpyHostToDevice, stream()));
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(b.data(), &two, sizeof two, cudaMemcpyHostToDevice, stream()));
    gemm({a.data(), Storage::bf16}, 1, 1, {b.data(), Storage::bf16}, 1, c.data());
    OPTEX_CUDA_CHECK(
        cudaMemcpyAsync(&product, c.data(), sizeof product, cudaMemcpyDeviceToHost, stream()));
    synchronize();  // the probe's point: fail here, at construction, not inside a commit
  } catch (const CudaError& e) {
    throw std::runtime_error("device: " + device_.name() +
                             " cannot run cuBLAS's bf16 GEMM, which a bf16 history needs (" +
                             e.what() +
                             "); store the history in fp32 (Options::history_precision)");
  }
  if (product != 2.0f) {
    throw std::runtime_error("device: " + device_.name() +
                             " computed 1 x 2 = " + std::to_string(product) +
                             " in cuBLAS's bf16 GEMM; store the history in fp32 "
                             "(Options::history_precision)");
  }
  bf16_probed_ = true;
}

// ---- transfers -----------------------------------------------------------------------

void CudaPrimitives::put(const void* host, void* to, std::size_t bytes) {
  DeviceGuard guard(index_);
  if (bytes == 0) return;
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(to, host, bytes, cudaMemcpyHostToDevice, stream()));
}

void CudaPrimitives::copy(const float* from, float* to, std::size_t count) {
  DeviceGuard guard(index_);
  if (count == 0 || from == to) return;
  OPTEX_CUDA_CHECK(
      cudaMemcpyAsync(to, from, count * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
}

void CudaPrimitives::zero(float* to, std::size_t count) {
  DeviceGuard guard(index_);
  if (count == 0) return;
  OPTEX_CUDA_CHECK(cudaMemsetAsync(to, 0, count * sizeof(float), stream()));
}

void CudaPrimitives::copy_stored(StoredRows from, StoredRows to, std::size_t count) {
  DeviceGuard guard(index_);
  if (from.storage != to.storage) {
    throw std::invalid_argument("copy_stored: the rows must have the same storage");
  }
  if (count == 0 || from.data == to.data) return;
  OPTEX_CUDA_CHECK(cudaMemcpyAsync(to.data, from.data, count * detail::storage_bytes(from.storage),
                                   cudaMemcpyDeviceToDevice, stream()));
}

void CudaPrimitives::store(const float* from, StoredRows to, std::size_t count) {
  DeviceGuard guard(index_);
  if (to.storage == Storage::bf16) {
    store_values<bf16_bits>(from, static_cast<bf16_bits*>(to.data), count, stream());
  } else {
    store_values<float>(from, static_cast<float*>(to.data), count, stream());
  }
}

void CudaPrimitives::load(StoredRows from, float* to, std::size_t count) {
  DeviceGuard guard(index_);
  if (from.storage == Storage::bf16) {
    load_values<bf16_bits>(static_cast<const bf16_bits*>(from.data), to, count, stream());
  } else {
    load_values<float>(static_cast<const float*>(from.data), to, count, stream());
  }
}

// ---- the one wait ----------------------------------------------------------------------

void CudaPrimitives::fetch(std::span<const Fetch> values) {
  DeviceGuard guard(index_);
  // Every copy is enqueued first, packed into the pinned staging buffer, so
  // that they run asynchronously behind the enqueued work and the host waits
  // once. A value past the staging (more than check_memory's staging_bytes at
  // once) goes straight to its pageable destination, which is correct but
  // makes that copy synchronous.
  placed_.assign(values.size(), kDirect);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Fetch& v = values[i];
    if (v.bytes == 0) continue;
    if (v.bytes <= staging_.size() && offset <= staging_.size() - v.bytes) {
      placed_[i] = offset;
      OPTEX_CUDA_CHECK(cudaMemcpyAsync(staging_.data() + offset, v.device, v.bytes,
                                       cudaMemcpyDeviceToHost, stream()));
      offset += (v.bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
    } else {
      OPTEX_CUDA_CHECK(
          cudaMemcpyAsync(v.host, v.device, v.bytes, cudaMemcpyDeviceToHost, stream()));
    }
  }
  synchronize();     // the one wait: the values, and every error of enqueued work
  retired_.clear();  // no enqueued work reads outgrown scratch or held lists any more
  held_lists_.clear();
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (placed_[i] != kDirect)
      std::memcpy(values[i].host, staging_.data() + placed_[i], values[i].bytes);
  }
}

// ---- host views ----------------------------------------------------------------------

const float* CudaPrimitives::view(const float* data, std::size_t count,
                                  std::vector<float>& scratch) {
  scratch.resize(count);
  download(data, scratch.data(), count);
  return scratch.data();
}

void CudaPrimitives::view_stored(StoredRows data, std::size_t count, std::vector<float>& out) {
  out.resize(count);
  if (data.storage == Storage::fp32) {
    download(static_cast<const float*>(data.data), out.data(), count);
    return;
  }
  DeviceGuard guard(index_);
  raw_.resize(count);
  if (count > 0) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(raw_.data(), data.data, count * sizeof(bf16_bits),
                                     cudaMemcpyDeviceToHost, stream()));
  }
  synchronize();  // converted on the host right below
  std::transform(raw_.begin(), raw_.end(), out.begin(),
                 [](bf16_bits b) { return detail::from_bf16(b); });
}

void CudaPrimitives::download(const float* device_src, float* host_dst, std::size_t count) const {
  DeviceGuard guard(index_);
  if (count > 0) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, count * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream()));
  }
  synchronize();  // the caller reads the values on return
}

void CudaPrimitives::upload(const float* host_src, float* device_dst, std::size_t count) const {
  DeviceGuard guard(index_);
  if (count > 0) {
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, count * sizeof(float),
                                     cudaMemcpyHostToDevice, stream()));
  }
  // A pageable upload may return before its DMA lands; the caller may reuse
  // its buffer or launch on another stream next.
  synchronize();
}

}  // namespace optex::cuda

namespace optex::detail {

std::unique_ptr<DevicePrimitives> make_cuda_primitives(const Device& device) {
  if (!device.is_cuda()) {
    throw std::invalid_argument("device: " + device.name() + " is not a CUDA device");
  }
  return std::make_unique<cuda::CudaPrimitives>(device);
}

}  // namespace optex::detail
