// Which CUDA device an engine runs on: checked before anything is made on it.
// (What fits in its memory is checked by the primitives' check_memory, from
// the backend's own count of what it allocates.)
#pragma once

#include "optex/engine/options.hpp"

namespace optex::cuda {

// The device ordinal of `device`, or std::invalid_argument naming it.
int checked_device(const Device& device);

}  // namespace optex::cuda
