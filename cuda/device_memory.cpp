#include "device_memory.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cuda_check.hpp"
#include "kernels.cuh"

namespace optex::cuda {
namespace {

// Byte counts, saturating instead of wrapping.
std::size_t mul_bytes(std::size_t a, std::size_t b) {
  if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a)
    return std::numeric_limits<std::size_t>::max();
  return a * b;
}
std::size_t add_bytes(std::size_t a, std::size_t b) {
  return b > std::numeric_limits<std::size_t>::max() - a ? std::numeric_limits<std::size_t>::max()
                                                         : a + b;
}

}  // namespace

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

std::size_t required_device_bytes(std::size_t d, int state_slots, const Options& options,
                                  std::size_t point_bytes, std::size_t gradient_bytes) {
  const auto n = static_cast<std::size_t>(options.parallelism);
  const auto t0 = static_cast<std::size_t>(options.history);
  const auto slots = static_cast<std::size_t>(state_slots);
  std::size_t need = mul_bytes(mul_bytes(t0, d), point_bytes + gradient_bytes);  // X, G
  need = add_bytes(need, mul_bytes(mul_bytes(3 * n - 1, d), sizeof(float)));     // batch rows
  // The iterate twice (x, next x) and the state twice (committed, work).
  need = add_bytes(need, mul_bytes(mul_bytes(2 + 2 * slots, d), sizeof(float)));
  const std::size_t reduction_rows = std::max(t0, n);
  need = add_bytes(
      need, mul_bytes(mul_bytes(static_cast<std::size_t>(reduction_blocks(d)), reduction_rows),
                      sizeof(double)));  // reduction partials
  // Weights, Cholesky factor, new Gram rows (distances, inner products), small outputs.
  const std::size_t small =
      add_bytes(add_bytes(mul_bytes(n - 1, t0), mul_bytes(3 * t0, t0)), 3 * n + 3 * t0 + 4);
  return add_bytes(need, mul_bytes(small, sizeof(double)));
}

std::size_t check_device_memory(std::size_t d, int state_slots, const Options& options,
                                std::size_t point_bytes, std::size_t gradient_bytes) {
  const std::size_t need =
      required_device_bytes(d, state_slots, options, point_bytes, gradient_bytes);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  OPTEX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (need > free_bytes) {
    std::ostringstream msg;
    msg << "device: " << options.device.name() << " has " << free_bytes
        << " bytes free but the CUDA backend needs " << need
        << " bytes (history T0 = " << options.history << ", d = " << d
        << ", N = " << options.parallelism << ", precision "
        << precision_name(options.history_precision)
        << "); lower the history or the parallelism, or store the history in bf16";
    throw std::runtime_error(msg.str());
  }
  return need;
}

}  // namespace optex::cuda
