// What the GPU suites do without a GPU: skip with a message, or fail when the
// environment sets OPTEX_REQUIRE_GPU=1 (any value but empty or 0), so that a
// GPU CI job cannot pass by skipping.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "optex/backend/device.hpp"

namespace optex::test {

inline bool GpuRequired() {
  const char* v = std::getenv("OPTEX_REQUIRE_GPU");
  return v != nullptr && std::string(v) != "" && std::string(v) != "0";
}

// Call from a fixture's SetUp(): a skip or fatal failure there keeps the test
// body from running.
inline void SkipOrFailWithoutGpu() {
  if (cuda_device_count() > 0) return;
  const std::string why = std::string("no CUDA device (built_with_cuda=") +
                          (built_with_cuda() ? "true" : "false") + ", devices=0)";
  if (GpuRequired()) FAIL() << why << ", but OPTEX_REQUIRE_GPU is set: a GPU run must not skip";
  GTEST_SKIP() << why << "; set OPTEX_REQUIRE_GPU=1 to make this a failure";
}

}  // namespace optex::test
