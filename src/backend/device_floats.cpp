#include "optex/backend/device_floats.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#if OPTEX_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace optex::detail {
namespace {

#if OPTEX_HAVE_CUDA
// Runs `f` with `device` current, then restores the caller's device.
template <class F>
cudaError_t on_device(const Device& device, F&& f) {
  int previous = 0;
  if (cudaError_t e = cudaGetDevice(&previous); e != cudaSuccess) return e;
  if (cudaError_t e = cudaSetDevice(device.index); e != cudaSuccess) return e;
  const cudaError_t result = std::forward<F>(f)();
  cudaSetDevice(previous);
  return result;
}

[[noreturn]] void fail(const std::string& doing, cudaError_t e) {
  cudaGetLastError();  // clear a sticky error
  throw std::runtime_error(doing + ": " + cudaGetErrorString(e));
}
#endif

}  // namespace

DeviceFloats::DeviceFloats(Device device, std::size_t count) : device_(device), count_(count) {
  if (!device.is_cuda()) {
    host_.assign(count, 0.0f);
    return;
  }
#if OPTEX_HAVE_CUDA
  if (count == 0) return;
  const cudaError_t e = on_device(device, [&] {
    cudaError_t r = cudaMalloc(reinterpret_cast<void**>(&device_data_), count * sizeof(float));
    if (r == cudaSuccess) r = cudaMemset(device_data_, 0, count * sizeof(float));
    return r;
  });
  if (e != cudaSuccess) {
    if (device_data_ != nullptr) cudaFree(device_data_);
    device_data_ = nullptr;
    fail("rows: " + std::to_string(count * sizeof(float)) + " bytes on " + device.name(), e);
  }
#else
  throw std::invalid_argument("device: " + device.name() +
                              " requested, but this build of optex has no CUDA backend");
#endif
}

DeviceFloats::DeviceFloats(DeviceFloats&& other) noexcept
    : device_(other.device_),
      count_(std::exchange(other.count_, 0)),
      host_(std::move(other.host_)),
      device_data_(std::exchange(other.device_data_, nullptr)) {}

DeviceFloats& DeviceFloats::operator=(DeviceFloats&& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(count_, other.count_);
  std::swap(host_, other.host_);
  std::swap(device_data_, other.device_data_);
  return *this;
}

DeviceFloats::~DeviceFloats() {
#if OPTEX_HAVE_CUDA
  if (device_data_ != nullptr) cudaFree(device_data_);  // never throws from a destructor
#endif
}

void DeviceFloats::copy_to_host(std::size_t offset, std::span<float> out) const {
  if (offset > count_ || out.size() > count_ - offset) {
    throw std::out_of_range("rows: floats [" + std::to_string(offset) + ", " +
                            std::to_string(offset + out.size()) + ") of " + std::to_string(count_));
  }
  if (!device_.is_cuda()) {
    std::copy_n(host_.begin() + static_cast<std::ptrdiff_t>(offset), out.size(), out.begin());
    return;
  }
#if OPTEX_HAVE_CUDA
  const cudaError_t e = on_device(device_, [&] {
    return cudaMemcpy(out.data(), device_data_ + offset, out.size_bytes(), cudaMemcpyDeviceToHost);
  });
  if (e != cudaSuccess) fail("rows: a copy from " + device_.name(), e);
#endif
}

std::size_t cuda_free_bytes(Device device) {
#if OPTEX_HAVE_CUDA
  std::size_t free_bytes = 0, total = 0;
  const cudaError_t e = on_device(device, [&] { return cudaMemGetInfo(&free_bytes, &total); });
  if (e != cudaSuccess) fail("device: free memory of " + device.name(), e);
  return free_bytes;
#else
  (void)device;
  return 0;
#endif
}

}  // namespace optex::detail
