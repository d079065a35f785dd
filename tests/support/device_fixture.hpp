// The device suite's fixture: one instance of a test per device, the CPU, the
// CPU on deferred primitives (deferred_primitives.hpp: every call queued until
// the next wait, the outputs the host could read poisoned until then, as on a
// device) and CUDA device 0, which skips without a GPU (gpu_test_support.hpp).
//
//   class EngineThing : public optex::test::Onoptex::Device {};
//   TEST_P(EngineThing, ...) { Engine e(x0, Adam{}, On(Options{})); ... }
//   INSTANTIATE_TEST_SUITE_P(Devices, EngineThing, ::testing::ValuesIn(optex::test::kDevices),
//                            optex::test::DeviceName);
//
// tests/CMakeLists.txt runs the instances whose name ends in /cuda* with the
// ctest label gpu and the others (cpu, cpu_deferred) without it.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/backend/device_primitives.hpp"
#include "optex/engine/options.hpp"
#include "support/deferred_primitives.hpp"
#include "support/gpu_test_support.hpp"

namespace optex::test {

// The device, and for the CPU whether its primitives are deferred.
struct DeviceParam {
  optex::Device device;
  bool deferred = false;
};
// In gtest's messages by name, not as bytes.
inline void PrintTo(const DeviceParam& p, std::ostream* os) {
  *os << p.device.name() << (p.deferred ? " (deferred primitives)" : "");
}

class OnDevice : public ::testing::TestWithParam<DeviceParam> {
 protected:
  void SetUp() override {
    if (on_gpu()) optex::test::SkipOrFailWithoutGpu();
    // Every engine this test makes on the CPU runs on deferred primitives.
    if (GetParam().deferred) deferred_.emplace(&DeferredPrimitives::factory, &deferred_stats_);
  }
  void TearDown() override {
    if (deferred_) {
      deferred_.reset();
      EXPECT_GT(deferred_stats_.fetches, 0) << "no engine ran on the deferred primitives";
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  optex::Device device() const { return GetParam().device; }
  bool on_gpu() const { return GetParam().device.is_cuda(); }
  // o on this test's device.
  optex::Options On(optex::Options o) const {
    o.device = device();
    return o;
  }
  // The history storages this device offers: bf16 only on a CUDA device.
  std::vector<optex::Precision> Precisions() const {
    if (on_gpu())
      return {optex::Precision::fp32, optex::Precision::bf16, optex::Precision::bf16_gradients};
    return {optex::Precision::fp32};
  }

  // A file name in this test's own temporary directory.
  std::string Path(const std::string& name) {
    if (dir_.empty()) {
      static std::atomic<int> counter{0};
      dir_ =
          std::filesystem::temp_directory_path() /
          ("optex_test_on_device_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
    }
    return (dir_ / name).string();
  }

 private:
  std::filesystem::path dir_;
  DeferredStats deferred_stats_;
  std::optional<optex::detail::ScopedPrimitives> deferred_;
};

// The parameter in the test name: .../cpu, .../cpu_deferred, .../cuda0.
inline std::string DeviceName(const ::testing::TestParamInfo<DeviceParam>& info) {
  if (info.param.device.is_cuda()) return "cuda" + std::to_string(info.param.device.index);
  return info.param.deferred ? "cpu_deferred" : "cpu";
}

// Every instance: the CPU, the CPU on deferred primitives, CUDA device 0.
inline const DeviceParam kDevices[] = {
    {optex::Device::cpu(), false}, {optex::Device::cpu(), true}, {optex::Device::cuda(0), false}};

}  // namespace optex::test
