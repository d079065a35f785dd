// Device primitives that make a device's hazards visible on the CPU: every
// enqueuing call (device_primitives.hpp) is queued instead of run, and the
// queue runs, in call order, at the next fetch() or before a synchronous call
// (download, upload, view, view_stored), as a device's stream would. The
// small outputs the host could read (the fp64 sums and the int flags) are
// poisoned when their call is queued (NaN, kPoisonInt), so that a backend
// that reads one before the fetch that brings it sees garbage, and a test
// fails. Host memory handed to put() and factor() is read when the queue
// runs, so a backend that changes it before the fetch sends the changed bytes.
//
// Memory stays host memory (host_memory() is the inner's true): what this
// models is that results are late, not where they live. copies_cannot_fail()
// is false, as on a device whose copies may fail asynchronously, so the
// backend keeps its backups.
//
// What it cannot model: the float rows (d values) are never poisoned, since
// queued work may still read what an earlier call left there; nor is an fp64
// output that queued work still reads (the GP's distances and weights, read by
// gp_weights() and step()), for the same reason. See DESIGN.md section 7.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "optex/backend/device_primitives.hpp"
#include "optex/backend/streaming.hpp"

namespace optex::test {

// What an int output holds while its call is queued.
inline constexpr int kPoisonInt = 0x7fbadbad;

// Counters of one DeferredPrimitives, or of every one made with the same
// factory context.
struct DeferredStats {
  std::int64_t calls = 0;           // every primitive call, queued or not
  std::int64_t queued = 0;          // calls queued instead of run
  std::int64_t fetches = 0;         // fetch() calls
  std::int64_t drains = 0;          // times queued work ran (a fetch or a synchronous call)
  std::int64_t poisoned = 0;        // outputs filled with poison when their call was queued
  std::int64_t poison_skipped = 0;  // outputs left as they were: queued work still read them
};

class DeferredPrimitives final : public detail::DevicePrimitives {
 public:
  // `stats`: where to count, or nullptr for counters of its own.
  explicit DeferredPrimitives(std::unique_ptr<detail::DevicePrimitives> inner,
                              DeferredStats* stats = nullptr)
      : inner_(std::move(inner)), stats_(stats != nullptr ? stats : &own_stats_) {}
  // Queued work is dropped with the device it would have run on.
  ~DeferredPrimitives() override = default;
  DeferredPrimitives(const DeferredPrimitives&) = delete;
  DeferredPrimitives& operator=(const DeferredPrimitives&) = delete;

  // A PrimitivesFactory (detail::ScopedPrimitives): deferred CPU primitives;
  // `context` is a DeferredStats* or nullptr.
  static std::unique_ptr<detail::DevicePrimitives> factory(int threads, void* context) {
    return std::make_unique<DeferredPrimitives>(detail::make_cpu_primitives(threads),
                                                static_cast<DeferredStats*>(context));
  }

  const DeferredStats& stats() const { return *stats_; }
  std::int64_t calls() const { return stats_->calls; }
  std::int64_t fetches() const { return stats_->fetches; }
  // Calls queued and not run yet.
  std::size_t pending() const { return queue_.size(); }

  Device device() const override { return inner_->device(); }
  bool host_memory() const override { return inner_->host_memory(); }
  bool copies_cannot_fail() const override { return false; }
  void set_threads(int threads) override { inner_->set_threads(threads); }

  // ---- memory: at once ----
  void check_memory(std::size_t bytes, std::size_t staging_bytes,
                    const std::string& what) override {
    ++stats_->calls;
    inner_->check_memory(bytes, staging_bytes, what);
  }
  float* floats(std::size_t count) override {
    ++stats_->calls;
    return inner_->floats(count);
  }
  detail::StoredRows rows(std::size_t count, detail::Storage storage) override {
    ++stats_->calls;
    return inner_->rows(count, storage);
  }
  double* doubles(std::size_t count) override {
    ++stats_->calls;
    return inner_->doubles(count);
  }
  int* ints(std::size_t count) override {
    ++stats_->calls;
    return inner_->ints(count);
  }

  // ---- transfers: queued ----
  void put(const void* host, void* to, std::size_t bytes) override {
    enqueue([p = inner_.get(), host, to, bytes] { p->put(host, to, bytes); });
  }
  void copy(const float* from, float* to, std::size_t count) override {
    enqueue([p = inner_.get(), from, to, count] { p->copy(from, to, count); });
  }
  void zero(float* to, std::size_t count) override {
    enqueue([p = inner_.get(), to, count] { p->zero(to, count); });
  }
  void copy_stored(detail::StoredRows from, detail::StoredRows to, std::size_t count) override {
    enqueue([p = inner_.get(), from, to, count] { p->copy_stored(from, to, count); });
  }
  void store(const float* from, detail::StoredRows to, std::size_t count) override {
    enqueue([p = inner_.get(), from, to, count] { p->store(from, to, count); });
  }
  void load(detail::StoredRows from, float* to, std::size_t count) override {
    enqueue([p = inner_.get(), from, to, count] { p->load(from, to, count); });
  }

  // ---- reductions: queued, outputs poisoned ----
  void squared_distances(detail::StoredRows rows, std::size_t nrows, std::size_t d,
                         std::span<const detail::StoredRows> queries, double* out,
                         double* norms) override {
    poison(out, queries.size() * nrows);
    poison(norms, queries.size());
    enqueue([p = inner_.get(), rows, nrows, d,
             q = std::vector<detail::StoredRows>(queries.begin(), queries.end()), out,
             norms] { p->squared_distances(rows, nrows, d, q, out, norms); });
  }
  void inner_products(detail::StoredRows rows, std::size_t nrows, std::size_t d,
                      std::span<const detail::StoredRows> queries, double* out) override {
    poison(out, queries.size() * nrows);
    enqueue([p = inner_.get(), rows, nrows, d,
             q = std::vector<detail::StoredRows>(queries.begin(), queries.end()),
             out] { p->inner_products(rows, nrows, d, q, out); });
  }
  void anchor_products(detail::StoredRows points, detail::StoredRows gradients, std::size_t n,
                       std::size_t d, const float* a, const float* m, std::span<const int> fresh,
                       double* out) override {
    // Refused at the call, as a device refuses it before it queues anything.
    streaming::check_fresh_rows(fresh, n);
    poison(out, detail::AnchorLayout(n, fresh.size()).size());
    enqueue([p = inner_.get(), points, gradients, n, d, a, m,
             f = std::vector<int>(fresh.begin(), fresh.end()),
             out] { p->anchor_products(points, gradients, n, d, a, m, f, out); });
  }
  void pair_statistics(const float* a, const float* b, std::size_t d, double* out) override {
    poison(out, 4);
    enqueue([p = inner_.get(), a, b, d, out] { p->pair_statistics(a, b, d, out); });
  }
  void dot(const float* a, const float* b, std::size_t d, double* out) override {
    poison(out, 1);
    enqueue([p = inner_.get(), a, b, d, out] { p->dot(a, b, d, out); });
  }
  void within_bound(const float* rows, std::size_t nrows, std::size_t d, float bound,
                    int* flags) override {
    poison(flags, nrows);
    enqueue([p = inner_.get(), rows, nrows, d, bound, flags] {
      p->within_bound(rows, nrows, d, bound, flags);
    });
  }

  // ---- the GP: queued ----
  void factor(const double* host, std::size_t n, int* info) override {
    poison(info, 1);
    enqueue([p = inner_.get(), host, n, info] { p->factor(host, n, info); });
  }
  void gp_weights(const double* squared_distances, std::size_t n, Covariance kernel,
                  double inv_scaled_lengthscale, double* weights, double* variance,
                  int* info) override {
    poison(weights, n);
    poison(variance, 1);
    poison(info, 1);
    reads(squared_distances, n);
    enqueue([p = inner_.get(), squared_distances, n, kernel, inv_scaled_lengthscale, weights,
             variance, info] {
      p->gp_weights(squared_distances, n, kernel, inv_scaled_lengthscale, weights, variance, info);
    });
  }

  // ---- the optimizer: queued ----
  void step(const OptimizerRanges& ranges, std::int64_t step, detail::StateRows state_in,
            detail::StateRows state_out, const float* x_in, float* x_out,
            const detail::StepGradient& gradient, std::size_t d,
            const detail::StepChecks& checks) override {
    if (gradient.weights != nullptr) reads(gradient.weights, gradient.rows);
    if (checks.gradient_norm != nullptr) poison(checks.gradient_norm, 1);
    if (checks.step_length != nullptr) poison(checks.step_length, 1);
    if (checks.flags != nullptr) poison(checks.flags, 1 + ranges.state_slots().count());
    enqueue(
        [p = inner_.get(), ranges, step, state_in, state_out, x_in, x_out, gradient, d, checks] {
          p->step(ranges, step, state_in, state_out, x_in, x_out, gradient, d, checks);
        });
  }
  void mean_of_rows(const float* rows, std::span<const int> which, std::size_t d, float* mean,
                    double* sums) override {
    if (sums != nullptr) poison(sums, 2);
    enqueue([p = inner_.get(), rows, w = std::vector<int>(which.begin(), which.end()), d, mean,
             sums] { p->mean_of_rows(rows, w, d, mean, sums); });
  }
  void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                          float* out) override {
    enqueue([p = inner_.get(), blocks, count, n, out] {
      p->mean_in_rank_order(blocks, count, n, out);
    });
  }

  // ---- the one wait ----
  void fetch(std::span<const detail::Fetch> values) override {
    ++stats_->calls;
    ++stats_->fetches;
    drain();
    inner_->fetch(values);
  }

  // ---- synchronous: they wait for the queue too ----
  const float* view(const float* data, std::size_t count, std::vector<float>& scratch) override {
    ++stats_->calls;
    drain();
    return inner_->view(data, count, scratch);
  }
  void view_stored(detail::StoredRows data, std::size_t count, std::vector<float>& out) override {
    ++stats_->calls;
    drain();
    inner_->view_stored(data, count, out);
  }
  void download(const float* device_src, float* host_dst, std::size_t count) const override {
    ++stats_->calls;
    drain();
    inner_->download(device_src, host_dst, count);
  }
  void upload(const float* host_src, float* device_dst, std::size_t count) const override {
    ++stats_->calls;
    drain();
    inner_->upload(host_src, device_dst, count);
  }

 private:
  void enqueue(std::function<void()> work) {
    ++stats_->calls;
    ++stats_->queued;
    queue_.push_back(std::move(work));
  }

  // Runs the queued work in call order. Work that throws drops the rest (a
  // device's stream is lost after an error) and the error surfaces here.
  void drain() const {
    pending_reads_.clear();
    if (queue_.empty()) return;
    ++stats_->drains;
    std::deque<std::function<void()>> work;
    work.swap(queue_);
    for (std::function<void()>& w : work) w();
  }

  // Queued work reads `count` values at `data` when it runs.
  template <class T>
  void reads(const T* data, std::size_t count) {
    if (data == nullptr || count == 0) return;
    const auto* begin = reinterpret_cast<const char*>(data);
    pending_reads_.emplace_back(begin, begin + count * sizeof(T));
  }

  // The host must not read `count` values at `out` before the next fetch:
  // poison them, unless queued work still reads some of them.
  template <class T>
  void poison(T* out, std::size_t count) {
    if (out == nullptr || count == 0) return;
    const auto* begin = reinterpret_cast<const char*>(out);
    const char* end = begin + count * sizeof(T);
    for (const auto& [lo, hi] : pending_reads_) {
      if (begin < hi && lo < end) {
        ++stats_->poison_skipped;
        return;
      }
    }
    T value;
    if constexpr (std::is_same_v<T, double>) {
      value = std::numeric_limits<double>::quiet_NaN();
    } else {
      value = kPoisonInt;
    }
    for (std::size_t i = 0; i < count; ++i) out[i] = value;
    ++stats_->poisoned;
  }

  std::unique_ptr<detail::DevicePrimitives> inner_;
  DeferredStats own_stats_;
  DeferredStats* stats_;
  // Mutable: download() and upload() are const (DeviceRows) and wait too.
  mutable std::deque<std::function<void()>> queue_;
  mutable std::vector<std::pair<const char*, const char*>> pending_reads_;
};

}  // namespace optex::test
