// Device primitives that fail on request: FaultyPrimitives wraps any
// primitives (the CPU's, or DeferredPrimitives around them), counts every call
// to a primitive, and throws InjectedFault at the k-th call after
// FaultControl::arm(k), once. The call that throws has no effect: it throws
// before it forwards. fetch() may be that call, as a device's asynchronous
// error surfaces at the next wait. copies_cannot_fail() is false, so the
// backend keeps its backups.
//
// With FaultControl::asynchronous the armed call, where it enqueues, fails
// as a device's enqueued work does: it returns, its work is lost (it does not
// forward, so its outputs keep what they held), and the fault surfaces at the
// next wait (fetch, view, view_stored, download, upload).
//
// The engine owns its primitives, so the test holds the control: a
// FaultControl that it passes as the context of detail::ScopedPrimitives with
// FaultyPrimitives::factory, which builds the primitives of every engine made
// while the scope lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optex/backend/device_primitives.hpp"
#include "support/deferred_primitives.hpp"

namespace optex::test {

class InjectedFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Shared between a test and the primitives of its engines.
struct FaultControl {
  // What FaultyPrimitives::factory wraps: the CPU's primitives, or
  // DeferredPrimitives around them (counting into deferred_stats, if set).
  bool deferred = false;
  DeferredStats* deferred_stats = nullptr;
  // Keep the name of every counted call (names()).
  bool log = false;
  // An armed call that enqueues loses its work and the fault surfaces at the
  // next wait, instead of the call throwing (an armed wait or allocation
  // still throws at once).
  bool asynchronous = false;

  // The k-th counted call from now throws (k >= 1), once; 0 disarms.
  void arm(std::int64_t k) { fault_at_ = k > 0 ? count_ + k : 0; }
  void disarm() { fault_at_ = 0; }
  bool armed() const { return fault_at_ != 0; }
  // Counted calls so far.
  std::int64_t calls() const { return count_; }
  // Faults thrown so far, and the primitive of the last one.
  std::int64_t faults() const { return faults_; }
  const std::string& last_fault() const { return last_fault_; }
  const std::vector<const char*>& names() const { return names_; }
  // Starts counting from zero (and forgets the names); disarms.
  void reset() {
    count_ = 0;
    fault_at_ = 0;
    surfaces_ = false;
    names_.clear();
  }

  // While one lives, calls are neither counted nor faulted (a test's own
  // reads of the engine).
  class Pause {
   public:
    explicit Pause(FaultControl& control) : control_(control), was_(control.paused_) {
      control_.paused_ = true;
    }
    ~Pause() { control_.paused_ = was_; }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    FaultControl& control_;
    bool was_;
  };

  enum class Call { other, enqueues, waits };
  // Called by FaultyPrimitives before each call forwards; true where the call
  // must not forward (an asynchronous fault: its work is lost).
  bool on_call(const char* primitive, Call call = Call::other) {
    if (paused_) return false;
    if (call == Call::waits && surfaces_) {
      surfaces_ = false;
      throw InjectedFault("asynchronous fault of call " + std::to_string(fault_call_) + " (" +
                          last_fault_ + ") surfaces at " + primitive);
    }
    ++count_;
    if (log) names_.push_back(primitive);
    if (fault_at_ == 0 || count_ != fault_at_) return false;
    fault_at_ = 0;
    ++faults_;
    fault_call_ = count_;
    last_fault_ = primitive;
    if (asynchronous && call == Call::enqueues) {
      surfaces_ = true;
      return true;
    }
    throw InjectedFault("injected fault at call " + std::to_string(count_) + " (" + primitive +
                        ")");
  }

 private:
  std::int64_t count_ = 0;
  std::int64_t fault_at_ = 0;
  std::int64_t faults_ = 0;
  std::int64_t fault_call_ = 0;
  bool paused_ = false;
  bool surfaces_ = false;  // an asynchronous fault waits for the next wait
  std::string last_fault_;
  std::vector<const char*> names_;
};

class FaultyPrimitives final : public detail::DevicePrimitives {
 public:
  FaultyPrimitives(std::unique_ptr<detail::DevicePrimitives> inner, FaultControl* control)
      : inner_(std::move(inner)), control_(control) {}
  FaultyPrimitives(const FaultyPrimitives&) = delete;
  FaultyPrimitives& operator=(const FaultyPrimitives&) = delete;

  // A PrimitivesFactory (detail::ScopedPrimitives); `context` is the FaultControl.
  static std::unique_ptr<detail::DevicePrimitives> factory(int threads, void* context) {
    auto* control = static_cast<FaultControl*>(context);
    std::unique_ptr<detail::DevicePrimitives> inner = detail::make_cpu_primitives(threads);
    if (control->deferred) {
      inner = std::make_unique<DeferredPrimitives>(std::move(inner), control->deferred_stats);
    }
    return std::make_unique<FaultyPrimitives>(std::move(inner), control);
  }

  FaultControl& control() const { return *control_; }

  Device device() const override { return inner_->device(); }
  bool host_memory() const override { return inner_->host_memory(); }
  bool copies_cannot_fail() const override { return false; }
  void set_threads(int threads) override { inner_->set_threads(threads); }

  void check_memory(std::size_t bytes, std::size_t staging_bytes,
                    const std::string& what) override {
    control_->on_call("check_memory");
    inner_->check_memory(bytes, staging_bytes, what);
  }
  float* floats(std::size_t count) override {
    control_->on_call("floats");
    return inner_->floats(count);
  }
  detail::StoredRows rows(std::size_t count, detail::Storage storage) override {
    control_->on_call("rows");
    return inner_->rows(count, storage);
  }
  double* doubles(std::size_t count) override {
    control_->on_call("doubles");
    return inner_->doubles(count);
  }
  int* ints(std::size_t count) override {
    control_->on_call("ints");
    return inner_->ints(count);
  }

  void put(const void* host, void* to, std::size_t bytes) override {
    if (control_->on_call("put", FaultControl::Call::enqueues)) return;
    inner_->put(host, to, bytes);
  }
  void copy(const float* from, float* to, std::size_t count) override {
    if (control_->on_call("copy", FaultControl::Call::enqueues)) return;
    inner_->copy(from, to, count);
  }
  void zero(float* to, std::size_t count) override {
    if (control_->on_call("zero", FaultControl::Call::enqueues)) return;
    inner_->zero(to, count);
  }
  void copy_stored(detail::StoredRows from, detail::StoredRows to, std::size_t count) override {
    if (control_->on_call("copy_stored", FaultControl::Call::enqueues)) return;
    inner_->copy_stored(from, to, count);
  }
  void store(const float* from, detail::StoredRows to, std::size_t count) override {
    if (control_->on_call("store", FaultControl::Call::enqueues)) return;
    inner_->store(from, to, count);
  }
  void load(detail::StoredRows from, float* to, std::size_t count) override {
    if (control_->on_call("load", FaultControl::Call::enqueues)) return;
    inner_->load(from, to, count);
  }

  void squared_distances(detail::StoredRows rows, std::size_t nrows, std::size_t d,
                         std::span<const detail::StoredRows> queries, double* out,
                         double* norms) override {
    if (control_->on_call("squared_distances", FaultControl::Call::enqueues)) return;
    inner_->squared_distances(rows, nrows, d, queries, out, norms);
  }
  void inner_products(detail::StoredRows rows, std::size_t nrows, std::size_t d,
                      std::span<const detail::StoredRows> queries, double* out) override {
    if (control_->on_call("inner_products", FaultControl::Call::enqueues)) return;
    inner_->inner_products(rows, nrows, d, queries, out);
  }
  void anchor_products(detail::StoredRows points, detail::StoredRows gradients, std::size_t n,
                       std::size_t d, const float* a, const float* m, std::span<const int> fresh,
                       double* out) override {
    if (control_->on_call("anchor_products", FaultControl::Call::enqueues)) return;
    inner_->anchor_products(points, gradients, n, d, a, m, fresh, out);
  }
  void pair_statistics(const float* a, const float* b, std::size_t d, double* out) override {
    if (control_->on_call("pair_statistics", FaultControl::Call::enqueues)) return;
    inner_->pair_statistics(a, b, d, out);
  }
  void dot(const float* a, const float* b, std::size_t d, double* out) override {
    if (control_->on_call("dot", FaultControl::Call::enqueues)) return;
    inner_->dot(a, b, d, out);
  }
  void within_bound(const float* rows, std::size_t nrows, std::size_t d, float bound,
                    int* flags) override {
    if (control_->on_call("within_bound", FaultControl::Call::enqueues)) return;
    inner_->within_bound(rows, nrows, d, bound, flags);
  }

  void factor(const double* host, std::size_t n, int* info) override {
    if (control_->on_call("factor", FaultControl::Call::enqueues)) return;
    inner_->factor(host, n, info);
  }
  void gp_weights(const double* squared_distances, std::size_t n, Covariance kernel,
                  double inv_scaled_lengthscale, double* weights, double* variance,
                  int* info) override {
    if (control_->on_call("gp_weights", FaultControl::Call::enqueues)) return;
    inner_->gp_weights(squared_distances, n, kernel, inv_scaled_lengthscale, weights, variance,
                       info);
  }

  void step(const OptimizerRanges& ranges, std::int64_t step, detail::StateRows state_in,
            detail::StateRows state_out, const float* x_in, float* x_out,
            const detail::StepGradient& gradient, std::size_t d,
            const detail::StepChecks& checks) override {
    if (control_->on_call("step", FaultControl::Call::enqueues)) return;
    inner_->step(ranges, step, state_in, state_out, x_in, x_out, gradient, d, checks);
  }
  void mean_of_rows(const float* rows, std::span<const int> which, std::size_t d, float* mean,
                    double* sums) override {
    if (control_->on_call("mean_of_rows", FaultControl::Call::enqueues)) return;
    inner_->mean_of_rows(rows, which, d, mean, sums);
  }
  void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                          float* out) override {
    if (control_->on_call("mean_in_rank_order", FaultControl::Call::enqueues)) return;
    inner_->mean_in_rank_order(blocks, count, n, out);
  }

  void fetch(std::span<const detail::Fetch> values) override {
    control_->on_call("fetch", FaultControl::Call::waits);
    inner_->fetch(values);
  }

  const float* view(const float* data, std::size_t count, std::vector<float>& scratch) override {
    control_->on_call("view", FaultControl::Call::waits);
    return inner_->view(data, count, scratch);
  }
  void view_stored(detail::StoredRows data, std::size_t count, std::vector<float>& out) override {
    control_->on_call("view_stored", FaultControl::Call::waits);
    inner_->view_stored(data, count, out);
  }
  void download(const float* device_src, float* host_dst, std::size_t count) const override {
    control_->on_call("download", FaultControl::Call::waits);
    inner_->download(device_src, host_dst, count);
  }
  void upload(const float* host_src, float* device_dst, std::size_t count) const override {
    control_->on_call("upload", FaultControl::Call::waits);
    inner_->upload(host_src, device_dst, count);
  }

 private:
  std::unique_ptr<detail::DevicePrimitives> inner_;
  FaultControl* control_;
};

}  // namespace optex::test
