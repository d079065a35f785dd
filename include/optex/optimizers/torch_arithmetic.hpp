// PyTorch's elementwise building blocks, written as PyTorch's scalar code
// computes them, for the updates that follow torch.optim (docs/DESIGN.md
// section 9 says how far the agreement goes).
#pragma once

#include "optex/detail/host_device.hpp"

namespace optex::detail {

// torch.lerp(start, end, weight): the form depends on the weight so that both
// ends are exact.
OPTEX_HOST_DEVICE inline float lerp(float start, float end, float weight) {
  const bool small = weight < 0.5f && weight > -0.5f;
  return small ? start + weight * (end - start) : end - (end - start) * (1.0f - weight);
}

// torch.sign: -1, 0 or 1.
OPTEX_HOST_DEVICE inline float sign(float v) { return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : 0.0f); }

}  // namespace optex::detail
