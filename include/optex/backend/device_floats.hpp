// A float buffer in the memory a Device computes in: host memory for the
// CPU, the GPU's own for a CUDA device. What the sharded engine keeps its
// whole rows in, so that they sit where the engine's slices and the
// communicator's rows do.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "optex/backend/device.hpp"

namespace optex::detail {

class DeviceFloats {
 public:
  DeviceFloats() = default;
  // `count` floats, zero-filled, on `device`. Throws std::runtime_error naming
  // the bytes when they cannot be had, std::invalid_argument for a CUDA device
  // in a build without CUDA.
  DeviceFloats(Device device, std::size_t count);
  DeviceFloats(DeviceFloats&& other) noexcept;
  DeviceFloats& operator=(DeviceFloats&& other) noexcept;
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats();

  Device device() const { return device_; }
  std::size_t size() const { return count_; }
  float* data() { return device_.is_cuda() ? device_data_ : host_.data(); }
  const float* data() const { return device_.is_cuda() ? device_data_ : host_.data(); }
  // out := the floats at [offset, offset + out.size()), on the host.
  void copy_to_host(std::size_t offset, std::span<float> out) const;

 private:
  Device device_;
  std::size_t count_ = 0;
  std::vector<float> host_;
  float* device_data_ = nullptr;
};

// The bytes free on a CUDA device (cudaMemGetInfo); 0 without CUDA.
std::size_t cuda_free_bytes(Device device);

}  // namespace optex::detail
