// Devices without a GPU: the Device value type, the option checks that involve
// devices and history precision, what this build reports about CUDA, a CUDA
// device that does not exist, and the CPU engine's side of the device API
// (device rows are the host rows, IterationInfo::iterate is set). Runs on
// every machine; the GPU itself is tested in test_cuda.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/problems/sphere.hpp"

namespace {

using optex::Adam;
using optex::Batch;
using optex::Device;
using optex::Engine;
using optex::Options;
using optex::Precision;
using ::testing::HasSubstr;

const optex::problems::Sphere kSphere;

// The message of the std::invalid_argument that `f` throws; fails the test
// (and returns "") when it throws nothing or something else.
template <class F>
std::string InvalidArgumentMessage(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected std::invalid_argument, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected std::invalid_argument, nothing was thrown";
  return "";
}

Options OnDevice(Device device, Precision precision = Precision::fp32) {
  Options o;
  o.device = device;
  o.history_precision = precision;
  return o;
}

// ---- the Device value ------------------------------------------------------------

TEST(Device, CpuIsTheDefault) {
  const Device cpu = Device::cpu();
  EXPECT_EQ(cpu.kind, Device::Kind::cpu);
  EXPECT_EQ(cpu.index, 0);
  EXPECT_FALSE(cpu.is_cuda());
  EXPECT_EQ(cpu.name(), "cpu");
  EXPECT_EQ(cpu, Device{});
  EXPECT_EQ(Options{}.device, cpu);
  EXPECT_EQ(Options{}.history_precision, Precision::fp32);
  EXPECT_EQ(Options::reference(4).device, cpu);
}

TEST(Device, CudaNamesItsOrdinal) {
  EXPECT_EQ(Device::cuda().index, 0);
  EXPECT_EQ(Device::cuda(), Device::cuda(0));
  const Device d = Device::cuda(3);
  EXPECT_EQ(d.kind, Device::Kind::cuda);
  EXPECT_EQ(d.index, 3);
  EXPECT_TRUE(d.is_cuda());
  EXPECT_EQ(d.name(), "cuda:3");
  EXPECT_EQ(Device::cuda(0).name(), "cuda:0");
  EXPECT_NE(Device::cuda(0), Device::cpu());
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
}

TEST(Device, PrecisionNames) {
  EXPECT_STREQ(optex::precision_name(Precision::fp32), "fp32");
  EXPECT_STREQ(optex::precision_name(Precision::bf16), "bf16");
}

// ---- option checks ---------------------------------------------------------------

TEST(DeviceOptions, Bf16HistoryIsRejectedOnTheCpu) {
  const std::string msg =
      InvalidArgumentMessage([] { OnDevice(Device::cpu(), Precision::bf16).validate(); });
  EXPECT_THAT(msg, HasSubstr("history_precision"));
  EXPECT_THAT(msg, HasSubstr("bf16"));
  // The engine refuses it the same way, before touching any device.
  const std::vector<float> x0(8, 1.0f);
  const std::string engine_msg = InvalidArgumentMessage(
      [&] { Engine e(x0, Adam{}, OnDevice(Device::cpu(), Precision::bf16)); });
  EXPECT_THAT(engine_msg, HasSubstr("history_precision"));
}

TEST(DeviceOptions, Bf16HistoryIsAcceptedForACudaDevice) {
  // validate() checks the options only; whether the device exists is the engine's business.
  EXPECT_NO_THROW(OnDevice(Device::cuda(0), Precision::bf16).validate());
  EXPECT_NO_THROW(OnDevice(Device::cuda(7), Precision::fp32).validate());
}

TEST(DeviceOptions, NegativeCudaIndexIsRejected) {
  const std::string msg = InvalidArgumentMessage([] { OnDevice(Device::cuda(-1)).validate(); });
  EXPECT_THAT(msg, HasSubstr("device.index"));
  EXPECT_THAT(msg, HasSubstr("-1"));
}

TEST(DeviceOptions, NonZeroCpuIndexIsRejected) {
  const Device bad{Device::Kind::cpu, 2};
  const std::string msg = InvalidArgumentMessage([&] { OnDevice(bad).validate(); });
  EXPECT_THAT(msg, HasSubstr("device.index"));
  EXPECT_THAT(msg, HasSubstr("2"));
}

// ---- what this build and machine offer ----------------------------------------------

TEST(DeviceQueries, BuiltWithCudaMatchesTheBuildFlag) {
  EXPECT_EQ(optex::built_with_cuda(), OPTEX_HAVE_CUDA != 0);
  const int count = optex::cuda_device_count();
  EXPECT_GE(count, 0);
  if (!optex::built_with_cuda()) {
    EXPECT_EQ(count, 0);
  }
  // Asking twice gives the same answer (and neither call throws).
  EXPECT_EQ(optex::cuda_device_count(), count);
}

// A CUDA device that is not there: without CUDA in the build, or without a GPU
// in the machine, cuda:0; with GPUs, the first ordinal past the last one.
TEST(DeviceQueries, AMissingCudaDeviceIsAnInvalidArgument) {
  const int count = optex::cuda_device_count();
  const Device missing = Device::cuda(count);
  const std::vector<float> x0(16, 0.5f);
  const std::string msg = InvalidArgumentMessage([&] { Engine e(x0, Adam{}, OnDevice(missing)); });
  EXPECT_THAT(msg, HasSubstr("device"));
  EXPECT_THAT(msg, HasSubstr(missing.name()));
  if (count == 0) {
    EXPECT_THAT(msg, HasSubstr("cuda:0"));
  }
  // bf16 storage on a missing device fails on the device, not on the precision.
  const std::string bf16_msg =
      InvalidArgumentMessage([&] { Engine e(x0, Adam{}, OnDevice(missing, Precision::bf16)); });
  EXPECT_THAT(bf16_msg, HasSubstr(missing.name()));
}

// ---- the CPU engine's side of the device API -------------------------------------

TEST(CpuEngineDevice, DeviceRowsAreTheHostRows) {
  const std::vector<float> x0 = kSphere.standard_start(10);
  Engine engine(x0, Adam{.lr = 0.05}, Options{});
  EXPECT_EQ(engine.device(), Device::cpu());
  for (int t = 0; t < 3; ++t) {
    Batch& b = engine.ask();
    EXPECT_EQ(b.device(), Device::cpu());
    EXPECT_EQ(b.device_points(), b.points().data());
    EXPECT_EQ(b.device_grads(), b.grads().data());
    for (int i = 0; i < b.size(); ++i) {
      EXPECT_EQ(b.device_point(i), b.point(i).data()) << "point " << i;
      EXPECT_EQ(b.device_grad(i), b.grad(i).data()) << "point " << i;
    }
    // Writing through the device row is writing the host row.
    for (int i = 0; i < b.size(); ++i) {
      std::vector<float> g(b.dim());
      b.loss(i) = kSphere.EvaluateWithGradient(b.point(i), g);
      for (std::size_t k = 0; k < g.size(); ++k) b.device_grad(i)[k] = g[k];
      EXPECT_EQ(b.grad(i)[0], g[0]);
      EXPECT_EQ(b.grad(i)[b.dim() - 1], g[b.dim() - 1]);
    }
    engine.tell(b);
  }
  EXPECT_EQ(engine.iteration(), 3);
}

TEST(CpuEngineDevice, IterationInfoCarriesTheIterate) {
  const std::vector<float> x0 = kSphere.standard_start(12);
  Engine engine(x0, Adam{.lr = 0.05}, Options{});
  for (int t = 0; t < 2; ++t) {
    Batch& b = engine.ask();
    for (int i = 0; i < b.size(); ++i) {
      b.loss(i) = kSphere.EvaluateWithGradient(b.point(i), b.grad(i));
    }
    const optex::IterationInfo& info = engine.tell(b);
    ASSERT_EQ(info.iterate.size(), x0.size());
    const auto x = engine.iterate();
    EXPECT_TRUE(std::equal(info.iterate.begin(), info.iterate.end(), x.begin()));
    EXPECT_EQ(engine.last_info().iterate.size(), x0.size());
  }
  // The iterate moved: the info is not a stale copy of x0.
  EXPECT_FALSE(std::equal(x0.begin(), x0.end(), engine.iterate().begin()));
}

}  // namespace
