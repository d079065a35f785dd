#include "device_memory.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace optex::cuda {

int checked_device(const Device& device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the error so later CUDA calls do not report it
    throw std::invalid_argument("device: " + device.name() +
                                " requested but no CUDA device is available (" +
                                cudaGetErrorString(status) + ")");
  }
  if (device.index < 0 || device.index >= count) {
    throw std::invalid_argument("device: " + device.name() + " does not exist (this process sees " +
                                std::to_string(count) + " CUDA device(s))");
  }
  return device.index;
}

}  // namespace optex::cuda
