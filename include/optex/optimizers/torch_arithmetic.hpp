// PyTorch's elementwise building blocks, written as PyTorch's scalar code
// computes them, for the updates that follow torch.optim (docs/DESIGN.md
// section 9 says how far the agreement goes).
#pragma once

#include "optex/backend/host_device.hpp"

namespace optex::detail {

// torch.lerp(start, end, weight): the form depends on the weight so that both
// ends are exact.
OPTEX_HOST_DEVICE inline float lerp(float start, float end, float weight) {
  const bool small = weight < 0.5f && weight > -0.5f;
  return small ? start + weight * (end - start) : end - (end - start) * (1.0f - weight);
}

// torch.sign's vectorised form: (v > 0) - (v < 0), so -1, 0 or 1 (0 for NaN). Written
// without branches: with random signs a branch mispredicts half the time and keeps the
// loop from vectorising (Lion ran ten times slower).
OPTEX_HOST_DEVICE inline float sign(float v) {
  return static_cast<float>(v > 0.0f) - static_cast<float>(v < 0.0f);
}

}  // namespace optex::detail
