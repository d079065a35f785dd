// What this build and this machine offer, and the CUDA primitives' stand-in
// when optex is built without CUDA.
#include "optex/backend/device.hpp"

#include <stdexcept>

#include "optex/backend/device_primitives.hpp"

#if OPTEX_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace optex {

bool built_with_cuda() { return OPTEX_HAVE_CUDA != 0; }

int cuda_device_count() {
#if OPTEX_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error, report none
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

#if !OPTEX_HAVE_CUDA
namespace detail {
std::unique_ptr<DevicePrimitives> make_cuda_primitives(const Device& device) {
  throw std::invalid_argument("device: " + device.name() +
                              " requested, but this build of optex has no CUDA backend "
                              "(configure with -DOPTEX_WITH_CUDA=ON on a machine with nvcc)");
}
}  // namespace detail
#endif

}  // namespace optex
