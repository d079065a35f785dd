// The NCCL communicator (optex::nccl) on one GPU: the communicator contract
// (communicator_contract.hpp) in a world of one rank, gradient rows gathered
// in device memory (out of place, in place, more than INT_MAX floats),
// creation from a bootstrap, split, abort and the errors.
//
// Every test of the Nccl fixture needs a CUDA device. Without one it is
// skipped with a message, or fails when the environment sets
// OPTEX_REQUIRE_GPU=1 (as in test_cuda.cpp: a GPU CI job must not pass by
// skipping). Several ranks need several GPUs (one per rank) and are not
// exercised here.
#include <cuda_runtime.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/communicator_contract.hpp"
#include "optex/backend/device.hpp"
#include "optex/distributed/communicator.hpp"
#include "optex/distributed/distributed_engine.hpp"
#include "optex/distributed/in_process_communicator.hpp"
#include "optex/distributed/nccl_communicator.hpp"
#include "optex/problems/problems.hpp"
#include "optex/sharded/sharded_engine.hpp"
#include "support/engine_equality.hpp"
#include "support/gpu_test_support.hpp"

namespace {

using optex::Communicator;
using optex::CommunicatorError;
using optex::Device;
using optex::NcclCommunicator;
using optex::ReduceOp;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Seconds = Communicator::Seconds;

// A bound on every collective here: a broken test fails instead of hanging.
constexpr Seconds kTestTimeout{60.0};

// ---- the fixture: skip, or fail under OPTEX_REQUIRE_GPU=1 ---------------------------

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override { optex::test::SkipOrFailWithoutGpu(); }

  // GPU 0 as a world of one rank.
  static std::unique_ptr<NcclCommunicator> Single() {
    return NcclCommunicator::create_single(0, kTestTimeout);
  }
};

// ---- helpers ------------------------------------------------------------------------

// Floats in the current GPU's memory (GPU 0 here), filled from and read back
// to the host.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t count) : count_(count) {
    if (count > 0) ok_ = cudaMalloc(&data_, count * sizeof(float)) == cudaSuccess;
  }
  ~DeviceFloats() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  bool ok() const { return ok_; }
  float* data() { return data_; }
  void upload(const std::vector<float>& host) {
    ASSERT_EQ(host.size(), count_);
    ASSERT_EQ(cudaMemcpy(data_, host.data(), count_ * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> download() const {
    std::vector<float> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  float* data_ = nullptr;
  std::size_t count_ = 0;
  bool ok_ = true;
};

// The contract's rows (communicator_contract.hpp's HostRows) in GPU 0's memory.
class DeviceRows {
 public:
  explicit DeviceRows(const std::vector<float>& values) : floats_(values.size()) {
    EXPECT_TRUE(floats_.ok());
    floats_.upload(values);
  }
  float* data() { return floats_.data(); }
  std::vector<float> read() const { return floats_.download(); }

 private:
  DeviceFloats floats_;
};

std::uint32_t BitsOf(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// ---- identity -----------------------------------------------------------------------

TEST_F(Nccl, IsAWorldOfOneRankOnTheChosenGpu) {
  auto comm = Single();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->row_device(), Device::cuda(0));
  EXPECT_EQ(comm->timeout(), kTestTimeout);
}

// The caller's current device belongs to the caller.
TEST_F(Nccl, LeavesTheCallersCurrentDeviceAlone) {
  const int last = optex::cuda_device_count() - 1;
  ASSERT_EQ(cudaSetDevice(last), cudaSuccess);
  {
    auto comm = NcclCommunicator::create_single(0, kTestTimeout);
    comm->barrier();
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, last);
  }
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, last);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// ---- host memory: the backend-independent contract --------------------------------

TEST_F(Nccl, HostOperationsKeepTheContract) {
  auto comm = Single();
  optex::test::check_all_gather_bytes(*comm);
  optex::test::check_all_reduce(*comm);
  optex::test::check_broadcast(*comm);
  optex::test::check_barrier(*comm);
  optex::test::check_node_local(*comm);
  optex::test::check_set_timeout_rejects_bad_values(*comm);
}

// One rank: every op leaves the bits as they are, signed zero and NaN included.
TEST_F(Nccl, AllReduceOfOneRankKeepsTheBits) {
  auto comm = Single();
  const std::vector<double> input = {1e16 + 2.0, -0.0, std::numeric_limits<double>::denorm_min(),
                                     std::numeric_limits<double>::quiet_NaN(), -3.25};
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
    std::vector<double> values = input;
    comm->all_reduce(values, op);
    for (std::size_t i = 0; i < input.size(); ++i) {
      EXPECT_EQ(optex::test::bits_of(values[i]), optex::test::bits_of(input[i]))
          << "op " << static_cast<int>(op) << ", index " << i;
    }
  }
}

// Large host payloads grow the scratch buffers.
TEST_F(Nccl, HostOperationsHandleLargePayloads) {
  auto comm = Single();
  std::vector<std::byte> mine(3 << 20);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<std::byte>(i * 7 + 1);
  std::vector<std::byte> all(mine.size());
  comm->all_gather_bytes(mine, all);
  EXPECT_EQ(all, mine);
  std::vector<std::byte> data = mine;
  comm->broadcast_bytes(data, 0);
  EXPECT_EQ(data, mine);
}

// ---- gradient rows in device memory -----------------------------------------------

TEST_F(Nccl, GathersDeviceRowsOutOfPlaceAndInPlace) {
  auto comm = Single();
  const std::size_t n = 1000;
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = optex::test::source_value(0, i);
  const std::vector<std::size_t> counts = {n};

  DeviceFloats mine(n);
  DeviceFloats all(n);
  ASSERT_TRUE(mine.ok() && all.ok());
  mine.upload(values);
  all.upload(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
  comm->all_gather_floats(mine.data(), all.data(), counts);
  const std::vector<float> out_of_place = all.download();
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(BitsOf(out_of_place[i]), BitsOf(values[i])) << "out of place, index " << i;
  }

  DeviceFloats in_place(n);
  ASSERT_TRUE(in_place.ok());
  in_place.upload(values);
  comm->all_gather_floats(in_place.data(), in_place.data(), counts);
  const std::vector<float> gathered = in_place.download();
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(BitsOf(gathered[i]), BitsOf(values[i])) << "in place, index " << i;
  }

  // Nothing to gather: no pointer is needed.
  const std::vector<std::size_t> zero = {0};
  comm->all_gather_floats(nullptr, nullptr, zero);
}

// In a world of one, all_to_all_floats is the self pair: a copy between
// device buffers, with the contract's gaps, overlaps and offsets.
TEST_F(Nccl, AllToAllOnDeviceRowsKeepsTheContract) {
  auto comm = Single();
  optex::test::check_all_to_all_floats<DeviceRows>(*comm);
  optex::test::check_all_to_all_floats<DeviceRows>(*comm, 1000);
}

// Counts that disagree (rank 0 expects more from itself than it sends): a
// CommunicatorError before any float moves; the communicator is aborted.
TEST_F(Nccl, AllToAllMismatchFailsBeforeAnyFloatMoves) {
  auto comm = Single();
  optex::test::check_all_to_all_mismatch_throws<DeviceRows>(*comm);
}

// NCCL counts are size_t: a row of more than INT_MAX floats arrives whole.
// Needs about 17 GB free on GPU 0; skipped (with the reason) otherwise.
TEST_F(Nccl, GathersARowOfMoreThanIntMaxFloats) {
  const std::size_t n = static_cast<std::size_t>(INT_MAX) + 3;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const std::size_t need = 2 * n * sizeof(float) + (std::size_t{1} << 30);
  if (free_bytes < need) {
    GTEST_SKIP() << "GPU 0 has " << free_bytes << " bytes free, this test needs " << need;
  }
  auto comm = Single();
  DeviceFloats mine(n);
  DeviceFloats all(n);
  ASSERT_TRUE(mine.ok() && all.ok());
  ASSERT_EQ(cudaMemset(mine.data(), 0, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(all.data(), 0xff, n * sizeof(float)), cudaSuccess);  // NaNs
  const std::vector<std::size_t> marked = {0, static_cast<std::size_t>(INT_MAX) - 1,
                                           static_cast<std::size_t>(INT_MAX), n - 1};
  for (const std::size_t i : marked) {
    const float v = static_cast<float>(i % 1000) + 0.5f;
    ASSERT_EQ(cudaMemcpy(mine.data() + i, &v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
  }
  const std::vector<std::size_t> counts = {n};
  comm->all_gather_floats(mine.data(), all.data(), counts);
  for (const std::size_t i : marked) {
    float v = 0.0f;
    ASSERT_EQ(cudaMemcpy(&v, all.data() + i, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(v, static_cast<float>(i % 1000) + 0.5f) << "index " << i;
  }
  float unmarked = -1.0f;
  ASSERT_EQ(cudaMemcpy(&unmarked, all.data() + 1, sizeof unmarked, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(unmarked, 0.0f);
}

// ---- structure --------------------------------------------------------------------

TEST_F(Nccl, SplitsIntoAWorldOfOneOnTheSameGpu) {
  auto comm = Single();
  optex::test::check_split(*comm);

  std::unique_ptr<Communicator> sub = comm->split(3, 7);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->row_device(), Device::cuda(0));
  EXPECT_EQ(sub->timeout(), kTestTimeout);
  DeviceFloats row(4);
  ASSERT_TRUE(row.ok());
  const std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f};
  row.upload(values);
  const std::vector<std::size_t> counts = {4};
  sub->all_gather_floats(row.data(), row.data(), counts);
  EXPECT_EQ(row.download(), values);
}

// The bootstrap's node-local rank picks the GPU: rank 0 of one gets GPU 0.
TEST_F(Nccl, CreatesFromABootstrap) {
  std::unique_ptr<Communicator> bootstrap = optex::local_communicator();
  auto comm = NcclCommunicator::create(*bootstrap, kTestTimeout);
  EXPECT_EQ(comm->rank(), bootstrap->rank());
  EXPECT_EQ(comm->size(), bootstrap->size());
  EXPECT_EQ(comm->row_device(), Device::cuda(0));
  EXPECT_EQ(comm->timeout(), kTestTimeout);
  comm->barrier();
}

TEST_F(Nccl, AbortLeavesTheCommunicatorUnusable) {
  auto comm = Single();
  ::testing::internal::CaptureStderr();
  comm->abort("the test says so");
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(printed, HasSubstr("optex: rank 0 aborts: the test says so"));
  EXPECT_THAT([&] { comm->barrier(); },
              ThrowsMessage<CommunicatorError>(
                  AllOf(HasSubstr("barrier"), HasSubstr("rank 0"), HasSubstr("the test says so"))));
  std::vector<double> values = {1.0};
  EXPECT_THROW(comm->all_reduce(values, ReduceOp::sum), CommunicatorError);
  const std::vector<std::size_t> zero = {0};
  EXPECT_THROW(comm->all_to_all_floats(nullptr, zero, zero, nullptr, zero, zero),
               CommunicatorError);
}

// ---- errors -----------------------------------------------------------------------

TEST_F(Nccl, RejectsADeviceItDoesNotHave) {
  const int devices = optex::cuda_device_count();
  EXPECT_THAT([&] { NcclCommunicator::create_single(devices); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("device"), HasSubstr("cuda:" + std::to_string(devices)))));
}

// Bad arguments throw std::invalid_argument naming the parameter, before any
// communication: the communicator still works afterwards.
TEST_F(Nccl, RejectsBadArgumentsAndStaysUsable) {
  auto comm = Single();
  DeviceFloats row(4);
  ASSERT_TRUE(row.ok());
  const std::vector<std::size_t> two_counts = {4, 4};
  EXPECT_THAT([&] { comm->all_gather_floats(row.data(), row.data(), two_counts); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("counts")));
  const std::vector<std::size_t> four = {4};
  EXPECT_THAT([&] { comm->all_gather_floats(nullptr, row.data(), four); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("mine")));
  std::vector<float> host(4);
  EXPECT_THAT([&] { comm->all_gather_floats(host.data(), host.data(), four); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("mine"), HasSubstr("not memory of cuda:0"))));
  EXPECT_THAT([&] { comm->all_gather_floats(row.data(), host.data(), four); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("all")));
  const std::vector<std::size_t> zero = {0};
  EXPECT_THAT(
      [&] { comm->all_to_all_floats(row.data(), four, zero, row.data(), four, two_counts); },
      ThrowsMessage<std::invalid_argument>(
          HasSubstr("recv_offsets.size() must be size() = 1, got 2")));
  EXPECT_THAT([&] { comm->all_to_all_floats(host.data(), four, zero, row.data(), four, zero); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("send"), HasSubstr("not memory of cuda:0"))));
  EXPECT_THAT([&] { comm->all_to_all_floats(row.data(), four, zero, host.data(), four, zero); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("recv"), HasSubstr("not memory of cuda:0"))));

  std::vector<std::byte> mine(3);
  std::vector<std::byte> wrong(4);
  EXPECT_THAT([&] { comm->all_gather_bytes(mine, wrong); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("all")));
  EXPECT_THAT([&] { comm->broadcast_bytes(mine, 1); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("root")));
  std::vector<double> values = {1.0};
  EXPECT_THAT([&] { comm->all_reduce(values, static_cast<ReduceOp>(7)); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("op")));
  EXPECT_THAT([&] { comm->split(-1, 0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("color")));

  comm->barrier();
  comm->all_reduce(values, ReduceOp::sum);
  EXPECT_EQ(values[0], 1.0);
}

// ---- without a GPU: argument checks come first, and the errors say why -------------

// ---- the distributed engine on device rows ---------------------------------------------

// A DistributedEngine over NCCL gathers the batch's device rows. With one rank
// it must commit exactly what a plain engine on the same GPU commits, whether
// the gradients were written through host views (uploaded before the gather)
// or straight into the device rows.
TEST_F(Nccl, DistributedEngineOnDeviceRowsMatchesTheDeviceEngine) {
  auto comm = Single();
  optex::Options options;
  options.parallelism = 3;
  options.seed = 5;
  options.device = comm->row_device();
  const optex::problems::Rosenbrock f;
  const std::vector<float> x0 = f.standard_start(64);
  optex::DistributedEngine distributed(x0, optex::Adam{.lr = 0.01}, options, *comm);
  optex::Engine reference(x0, optex::Adam{.lr = 0.01}, options);
  std::vector<float> g(x0.size());
  for (int t = 0; t < 6; ++t) {
    optex::Batch& b = distributed.ask();
    for (int i : distributed.my_points()) {
      if (t % 2 == 0) {
        b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));  // host view
      } else {
        b.loss(i) = f.EvaluateWithGradient(b.point(i), g);  // straight into the device row
        ASSERT_EQ(cudaMemcpy(b.device_grad(i), g.data(), g.size() * sizeof(float),
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
    }
    distributed.tell(b);
    optex::Batch& rb = reference.ask();
    for (int i = 0; i < rb.size(); ++i)
      rb.loss(i) = f.EvaluateWithGradient(rb.point(i), rb.grad(i));
    reference.tell(rb);
    ASSERT_TRUE(optex::test::SameEngine(distributed.engine(), reference)) << "iteration " << t;
  }
}

TEST_F(Nccl, DistributedEngineRefusesAnEngineOnAnotherDevice) {
  auto comm = Single();
  optex::Options options;  // a CPU engine: the NCCL rows are on the GPU
  const std::vector<float> x0(16, 0.5f);
  EXPECT_THAT([&] { optex::DistributedEngine e(x0, optex::Sgd{.lr = 0.1}, options, *comm); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("device"), HasSubstr("cpu"))));
}

// Sharded state on device rows: a world of one NCCL rank holds the whole
// vector as its slice; its points and gradients move between device rows.
// It follows the whole CUDA engine within the sharded tolerance (DESIGN.md
// section 3), with the same seeds and commits, and its host views refuse.
TEST_F(Nccl, ShardedEngineOnDeviceRowsFollowsTheDeviceEngine) {
  auto comm = Single();
  optex::Options options;
  options.parallelism = 3;
  options.seed = 7;
  options.history = 8;
  options.device = comm->row_device();
  const std::size_t d = 3 * 4096 + 17;
  const std::vector<float> x0(d, 0.75f);
  const optex::problems::Sphere f;
  optex::ShardedEngine sharded(x0, optex::Adam{.lr = 0.01}, options, *comm, {}, true);
  optex::Engine reference(x0, optex::Adam{.lr = 0.01}, options);
  std::vector<float> point(d), g(d);
  for (int t = 0; t < 12; ++t) {
    optex::ShardedBatch& b = sharded.ask();
    EXPECT_THROW((void)b.point(b.rows().first), std::logic_error);
    for (int i : b.rows()) {
      ASSERT_EQ(
          cudaMemcpy(point.data(), b.device_point(i), d * sizeof(float), cudaMemcpyDeviceToHost),
          cudaSuccess);
      b.loss(i) = f.EvaluateWithGradient(point, g);
      ASSERT_EQ(cudaMemcpy(b.device_grad(i), g.data(), d * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    const optex::IterationInfo& info = sharded.tell(b);
    optex::Batch& rb = reference.ask();
    for (int i = 0; i < rb.size(); ++i)
      rb.loss(i) = f.EvaluateWithGradient(rb.point(i), rb.grad(i));
    const optex::IterationInfo& ref_info = reference.tell(rb);
    ASSERT_EQ(info.committed_point, ref_info.committed_point) << "round " << t;
    ASSERT_EQ(sharded.engine().rng_state(), reference.rng_state());
    std::vector<float> x(d);
    sharded.gather_iterate(x);
    const std::span<const float> want = reference.iterate();
    for (std::size_t j = 0; j < d; ++j) {
      ASSERT_NEAR(x[j], want[j], 1e-5 * (1.0 + std::fabs(want[j]))) << "round " << t << ", " << j;
    }
  }
}

TEST_F(Nccl, ShardedEngineRefusesACpuEngineOnDeviceRows) {
  auto comm = Single();
  const std::vector<float> x0(8192, 0.5f);
  EXPECT_THAT([&] { optex::ShardedEngine e(x0, optex::Sgd{.lr = 0.1}, {}, *comm, {}, true); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("device"), HasSubstr("cpu"))));
}

TEST(NcclArguments, RejectsBadTimeoutsAndNegativeDevicesAnywhere) {
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity()}) {
    EXPECT_THAT([&] { NcclCommunicator::create_single(0, Seconds{bad}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("timeout")))
        << bad;
  }
  std::unique_ptr<Communicator> bootstrap = optex::local_communicator();
  EXPECT_THAT([&] { NcclCommunicator::create(*bootstrap, Seconds{0.0}); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("timeout")));
  EXPECT_THAT([&] { NcclCommunicator::create_single(-1); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("device"), HasSubstr("-1"))));
}

TEST(NcclWithoutGpu, FactoriesSayThereIsNoDevice) {
  if (optex::cuda_device_count() > 0) {
    GTEST_SKIP() << "a CUDA device is present; this checks the errors without one";
  }
  EXPECT_THAT([] { NcclCommunicator::create_single(0); },
              ThrowsMessage<std::runtime_error>(HasSubstr("0 CUDA devices")));
  std::unique_ptr<Communicator> bootstrap = optex::local_communicator();
  EXPECT_THAT(
      [&] { NcclCommunicator::create(*bootstrap); },
      ThrowsMessage<std::runtime_error>(AllOf(HasSubstr("rank 0"), HasSubstr("0 CUDA devices"))));
}

}  // namespace
