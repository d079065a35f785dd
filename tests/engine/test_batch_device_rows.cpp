// The device side of a Batch, without a GPU: the host views of a device batch
// are copies made through a detail::DeviceRows copier, and the logic that
// decides what is copied, when and how often (src/engine/batch.cpp) is plain CPU
// code. A fake copier whose "device memory" is ordinary host arrays lets us
// count every download and check every value. The real CUDA copier is tested
// in test_cuda.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/backend/engine_backend.hpp"
#include "optex/engine/batch.hpp"

namespace {

using optex::Batch;
using optex::Device;
using optex::detail::BatchAccess;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// A copier over host memory that counts what crosses. Atomic counters: host
// views may be used from several worker threads at once.
class FakeDeviceRows : public optex::detail::DeviceRows {
 public:
  void download(const float* device_src, float* host_dst, std::size_t count) const override {
    std::memcpy(host_dst, device_src, count * sizeof(float));
    download_calls.fetch_add(1);
    downloaded_floats.fetch_add(count);
  }
  void upload(const float* host_src, float* device_dst, std::size_t count) const override {
    std::memcpy(device_dst, host_src, count * sizeof(float));
    upload_calls.fetch_add(1);
    uploaded_floats.fetch_add(count);
  }

  mutable std::atomic<int> download_calls{0};
  mutable std::atomic<std::size_t> downloaded_floats{0};
  mutable std::atomic<int> upload_calls{0};
  mutable std::atomic<std::size_t> uploaded_floats{0};
};

constexpr int kN = 4;
constexpr std::size_t kD = 6;

// Row i of a row-major array of width kD, as a vector to compare against.
std::vector<float> Row(const std::vector<float>& rows, int i) {
  const auto begin = rows.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * kD);
  return {begin, begin + static_cast<std::ptrdiff_t>(kD)};
}

// rows[k] = base + k: every value in every array is distinct, so a row read
// from the wrong array or the wrong offset cannot pass.
std::vector<float> Filled(std::size_t rows, float base) {
  std::vector<float> v(rows * kD);
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = base + static_cast<float>(k);
  return v;
}

// A batch on cuda:0 whose device rows are the three vectors below.
class DeviceBatch : public ::testing::Test {
 protected:
  DeviceBatch() {
    BatchAccess::allocate(b, kN, kD, Device::cuda(0));
    BatchAccess::attach_device(b, &rows, device_points.data(), device_grads.data(),
                               device_predicted.data());
  }

  FakeDeviceRows rows;
  std::vector<float> device_points = Filled(kN, 1000.0f);
  std::vector<float> device_grads = Filled(kN, 2000.0f);
  std::vector<float> device_predicted = Filled(kN - 1, 3000.0f);
  Batch b;
};

TEST_F(DeviceBatch, DevicePointersAreTheAttachedRows) {
  EXPECT_EQ(b.device(), Device::cuda(0));
  EXPECT_EQ(b.size(), kN);
  EXPECT_EQ(b.dim(), kD);
  EXPECT_EQ(b.device_points(), device_points.data());
  EXPECT_EQ(b.device_grads(), device_grads.data());
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(b.device_point(i), device_points.data() + static_cast<std::size_t>(i) * kD) << i;
    EXPECT_EQ(b.device_grad(i), device_grads.data() + static_cast<std::size_t>(i) * kD) << i;
  }
  // Handing out device pointers copies nothing.
  EXPECT_EQ(rows.download_calls.load(), 0);
}

TEST_F(DeviceBatch, PointDownloadsItsRowOnce) {
  EXPECT_THAT(b.point(2), ElementsAreArray(Row(device_points, 2)));
  EXPECT_EQ(rows.download_calls.load(), 1);
  EXPECT_EQ(rows.downloaded_floats.load(), kD);

  // The host copy is current now: reading it again costs nothing.
  EXPECT_THAT(b.point(2), ElementsAreArray(Row(device_points, 2)));
  EXPECT_EQ(rows.download_calls.load(), 1);
  EXPECT_EQ(rows.downloaded_floats.load(), kD);
}

TEST_F(DeviceBatch, PointsDownloadsOnlyStaleRowsOneCallPerRun) {
  b.point(1);
  rows.download_calls = 0;
  rows.downloaded_floats = 0;

  // Row 1 is current; rows 0 and 2..3 are two runs of stale rows.
  const std::span<const float> all = b.points();
  EXPECT_EQ(rows.download_calls.load(), 2);
  EXPECT_EQ(rows.downloaded_floats.load(), (kN - 1) * kD);
  EXPECT_THAT(all, ElementsAreArray(device_points));

  // Everything is current: a second points() copies nothing.
  EXPECT_THAT(b.points(), ElementsAreArray(device_points));
  EXPECT_EQ(rows.download_calls.load(), 2);
}

TEST_F(DeviceBatch, InvalidateHostCopiesMakesTheNextReadDownloadAgain) {
  const std::vector<float> old_row = Row(device_points, 0);
  b.point(0);
  // The device row changes (the next ask() writes new points) ...
  for (std::size_t j = 0; j < kD; ++j) device_points[j] = -1.0f - static_cast<float>(j);
  // ... but the host copy is still considered current until invalidated.
  EXPECT_THAT(b.point(0), ElementsAreArray(old_row));
  EXPECT_EQ(rows.download_calls.load(), 1);

  BatchAccess::invalidate_host_copies(b);
  EXPECT_THAT(b.point(0), ElementsAreArray(Row(device_points, 0)));
  EXPECT_EQ(rows.download_calls.load(), 2);
  EXPECT_EQ(rows.downloaded_floats.load(), 2 * kD);
}

TEST_F(DeviceBatch, MutableGradStagesTheRowWithoutDownloading) {
  const std::vector<float> device_row_before = Row(device_grads, 1);
  const std::span<float> g = b.grad(1);
  // A row about to be overwritten is not worth copying down.
  EXPECT_EQ(rows.download_calls.load(), 0);
  EXPECT_EQ(g.size(), kD);
  EXPECT_THAT(BatchAccess::staged_gradients(b), ElementsAreArray({0, 1, 0, 0}));

  // What the caller writes lands in the host row that tell() uploads.
  for (std::size_t j = 0; j < kD; ++j) g[j] = 7.0f + static_cast<float>(j);
  const float* host_row = BatchAccess::host_grads(b) + kD;
  EXPECT_THAT(std::vector<float>(host_row, host_row + kD), ElementsAreArray(g));
  // Nothing is uploaded by the batch itself: that is the backend's job at tell().
  EXPECT_EQ(rows.upload_calls.load(), 0);
  // The device row is untouched until then.
  EXPECT_THAT(Row(device_grads, 1), ElementsAreArray(device_row_before));
}

TEST_F(DeviceBatch, ConstGradReadsTheStagedRowOrDownloadsTheDeviceRow) {
  const std::span<float> g = b.grad(1);
  for (std::size_t j = 0; j < kD; ++j) g[j] = 7.0f + static_cast<float>(j);
  const Batch& cb = b;

  // A staged row: the host row is the truth, the device row would be stale.
  EXPECT_THAT(cb.grad(1), ElementsAreArray(g));
  EXPECT_EQ(rows.download_calls.load(), 0);

  // An unstaged row: the device row, copied down on every read, since the
  // caller's kernels may rewrite it at any time.
  EXPECT_THAT(cb.grad(2), ElementsAreArray(Row(device_grads, 2)));
  EXPECT_EQ(rows.download_calls.load(), 1);
  EXPECT_EQ(rows.downloaded_floats.load(), kD);
  device_grads[2 * kD] = -9.0f;
  EXPECT_THAT(cb.grad(2), ElementsAreArray(Row(device_grads, 2)));
  EXPECT_EQ(rows.download_calls.load(), 2);
  // Reading does not stage.
  EXPECT_THAT(BatchAccess::staged_gradients(b), ElementsAreArray({0, 1, 0, 0}));
}

TEST_F(DeviceBatch, GradsStagesEveryRow) {
  const std::span<float> all = b.grads();
  EXPECT_EQ(all.size(), kN * kD);
  EXPECT_EQ(all.data(), BatchAccess::host_grads(b));
  EXPECT_THAT(BatchAccess::staged_gradients(b), ElementsAreArray({1, 1, 1, 1}));
  EXPECT_EQ(rows.download_calls.load(), 0);
}

TEST_F(DeviceBatch, UploadStagedGradientsCopiesEachRunOnceAndUnstages) {
  for (int i : {0, 1, 3}) {
    const std::span<float> g = b.grad(i);
    for (std::size_t j = 0; j < kD; ++j) g[j] = -static_cast<float>(10 * i) - static_cast<float>(j);
  }
  const std::vector<float> untouched = Row(device_grads, 2);
  b.upload_staged_gradients();
  // Rows 0-1 are one run, row 3 another.
  EXPECT_EQ(rows.upload_calls.load(), 2);
  EXPECT_EQ(rows.uploaded_floats.load(), 3 * kD);
  for (int i : {0, 1, 3}) {
    const float* host_row = BatchAccess::host_grads(b) + static_cast<std::size_t>(i) * kD;
    EXPECT_THAT(Row(device_grads, i), ElementsAreArray(host_row, kD)) << "row " << i;
  }
  EXPECT_THAT(Row(device_grads, 2), ElementsAreArray(untouched));
  // Uploaded rows are no longer staged: the device rows are now the truth
  // (a communicator may overwrite them), and tell() uploads nothing again.
  EXPECT_THAT(BatchAccess::staged_gradients(b), ElementsAreArray({0, 0, 0, 0}));
  b.upload_staged_gradients();
  EXPECT_EQ(rows.upload_calls.load(), 2);
}

TEST_F(DeviceBatch, SetGradientStagesTheRowAndChecksItsSize) {
  const std::vector<float> g = Filled(1, -50.0f);
  b.set_gradient(3, g);
  EXPECT_THAT(BatchAccess::staged_gradients(b), ElementsAreArray({0, 0, 0, 1}));
  const float* host_row = BatchAccess::host_grads(b) + 3 * kD;
  EXPECT_THAT(std::vector<float>(host_row, host_row + kD), ElementsAreArray(g));
  EXPECT_EQ(rows.download_calls.load(), 0);

  // A wrong size is refused before anything is staged.
  const std::vector<float> short_g(kD - 1, 1.0f);
  try {
    b.set_gradient(0, short_g);
    FAIL() << "set_gradient accepted " << short_g.size() << " floats for d = " << kD;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("gradient"));
  }
  EXPECT_THAT(BatchAccess::staged_gradients(b), ElementsAreArray({0, 0, 0, 1}));
}

TEST_F(DeviceBatch, PredictedGradientDownloadsItsRowOnce) {
  EXPECT_THAT(b.predicted_gradient(1), ElementsAreArray(Row(device_predicted, 1)));
  EXPECT_EQ(rows.download_calls.load(), 1);
  EXPECT_EQ(rows.downloaded_floats.load(), kD);
  EXPECT_THAT(b.predicted_gradient(1), ElementsAreArray(Row(device_predicted, 1)));
  EXPECT_EQ(rows.download_calls.load(), 1);

  // Only points 0..N-2 start a proxy step, so only they have a prediction.
  EXPECT_THROW(b.predicted_gradient(kN - 1), std::out_of_range);
  EXPECT_THROW(b.predicted_gradient(-1), std::out_of_range);
  EXPECT_EQ(rows.download_calls.load(), 1);
}

// Sized again (a new N), the host copies follow the new size.
TEST_F(DeviceBatch, ResizingReallocatesTheHostCopies) {
  b.point(0);
  std::vector<float> points = Filled(2 * kN, 5000.0f);
  std::vector<float> grads = Filled(2 * kN, 6000.0f);
  std::vector<float> predicted = Filled(2 * kN - 1, 7000.0f);
  BatchAccess::allocate(b, 2 * kN, kD, Device::cuda(0));
  BatchAccess::attach_device(b, &rows, points.data(), grads.data(), predicted.data());
  EXPECT_THAT(b.points(), ElementsAreArray(points));
  EXPECT_EQ(b.grads().size(), 2 * kN * kD);
}

TEST_F(DeviceBatch, OutOfRangeIndicesThrowWithoutCopying) {
  EXPECT_THROW(b.point(kN), std::out_of_range);
  EXPECT_THROW(b.point(-1), std::out_of_range);
  EXPECT_THROW(b.grad(kN), std::out_of_range);
  EXPECT_THROW(std::as_const(b).grad(-1), std::out_of_range);
  EXPECT_THROW(b.device_point(kN), std::out_of_range);
  EXPECT_EQ(rows.download_calls.load(), 0);
  EXPECT_THAT(BatchAccess::staged_gradients(b), ElementsAreArray({0, 0, 0, 0}));
}

TEST_F(DeviceBatch, CopyKeepsDevicePointersAndHostCopies) {
  b.point(0);
  b.grad(2)[0] = 42.0f;

  Batch copy = b;
  EXPECT_EQ(copy.device(), Device::cuda(0));
  EXPECT_EQ(copy.device_points(), device_points.data());
  EXPECT_EQ(copy.device_grad(3), device_grads.data() + 3 * kD);
  EXPECT_THAT(BatchAccess::staged_gradients(copy), ElementsAreArray({0, 0, 1, 0}));
  EXPECT_EQ(BatchAccess::host_grads(copy)[2 * kD], 42.0f);

  // The copy's host copy of row 0 came along: reading it copies nothing.
  EXPECT_THAT(copy.point(0), ElementsAreArray(Row(device_points, 0)));
  EXPECT_EQ(rows.download_calls.load(), 1);
  // Its own host rows, not the original's.
  EXPECT_NE(copy.point(0).data(), b.point(0).data());

  // Both are usable at once (each has its own mutex): the copy's stale rows
  // are downloaded into the copy, the original's into the original.
  std::thread other([&] { EXPECT_THAT(copy.points(), ElementsAreArray(device_points)); });
  EXPECT_THAT(b.points(), ElementsAreArray(device_points));
  other.join();
  EXPECT_EQ(rows.downloaded_floats.load(), kD + 2 * (kN - 1) * kD);
}

TEST_F(DeviceBatch, ConcurrentReadersDownloadEveryRowExactlyOnce) {
  std::vector<std::vector<float>> own(kN);
  std::vector<std::vector<float>> all(kN);
  std::atomic<int> ready{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < kN; ++i) {
    workers.emplace_back([&, i] {
      // Start together, so that the calls overlap as much as they can.
      ready.fetch_add(1);
      while (ready.load() < kN) std::this_thread::yield();
      const std::span<const float> p = b.point(i);
      own[static_cast<std::size_t>(i)].assign(p.begin(), p.end());
      const std::span<const float> ps = b.points();
      all[static_cast<std::size_t>(i)].assign(ps.begin(), ps.end());
    });
  }
  for (std::thread& t : workers) t.join();

  // Each row crossed once, whichever thread copied it.
  EXPECT_EQ(rows.downloaded_floats.load(), kN * kD);
  EXPECT_GE(rows.download_calls.load(), 1);
  EXPECT_LE(rows.download_calls.load(), kN);
  for (int i = 0; i < kN; ++i) {
    EXPECT_THAT(own[static_cast<std::size_t>(i)], ElementsAreArray(Row(device_points, i))) << i;
    EXPECT_THAT(all[static_cast<std::size_t>(i)], ElementsAreArray(device_points)) << i;
  }
}

TEST(HostBatch, RowsAreTheHostRowsAndNothingIsCopied) {
  // No copier is attached: a CPU batch that tried to copy would crash here.
  Batch b;
  BatchAccess::allocate(b, kN, kD, Device::cpu());
  EXPECT_EQ(b.device(), Device::cpu());
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(b.device_point(i), b.point(i).data()) << i;
    EXPECT_EQ(b.device_grad(i), b.grad(i).data()) << i;
  }
  EXPECT_EQ(b.device_points(), b.points().data());
  EXPECT_EQ(b.device_grads(), b.grads().data());
  EXPECT_EQ(b.device_points(), BatchAccess::points(b));

  // A gradient written on the host is the "device" row: nothing to stage.
  b.grad(1)[0] = 5.0f;
  EXPECT_EQ(b.device_grad(1)[0], 5.0f);
  EXPECT_THAT(BatchAccess::staged_gradients(b), ElementsAreArray({0, 0, 0, 0}));
}

}  // namespace
