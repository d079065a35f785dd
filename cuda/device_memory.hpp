// What the CUDA backend checks before it allocates anything: that the device
// exists, and that everything of size d and T0 x T0 fits in its free memory.
#pragma once

#include <cstddef>

#include "optex/options.hpp"

namespace optex::cuda {

// The device ordinal of `device`, or std::invalid_argument naming it.
int checked_device(const Device& device);

// What the backend allocates on the device besides the libraries' own
// workspaces, in bytes (saturating instead of wrapping): the history in its
// storage types, the batch rows, the iterate and `state_slots` state buffers
// (each twice: the committed and the work state), the reduction partials and
// the small T0-sized buffers.
std::size_t required_device_bytes(std::size_t d, int state_slots, const Options& options,
                                  std::size_t point_bytes, std::size_t gradient_bytes);

// required_device_bytes(), or std::runtime_error naming what does not fit
// and how to make it fit, when the device has less free.
std::size_t check_device_memory(std::size_t d, int state_slots, const Options& options,
                                std::size_t point_bytes, std::size_t gradient_bytes);

}  // namespace optex::cuda
