// CUDA cost of the OptEx backend against a device-to-device copy.
//
// DESIGN.md section 4: a proxy step is a memory-bound pass over the T0 x d
// history, so the figure of merit is bytes moved per second, compared with a
// cudaMemcpyAsync device-to-device copy measured in the same process at the
// same d.
//
//   BM_DeviceCopy/d          cudaMemcpyAsync device-to-device of d floats.
//   BM_PlainAdamStep/d       one fused Adam update with a given gradient
//                            (cuda::optimizer_step, weights = nullptr): what one
//                            plain (non-OptEx) Adam step costs at this d.
//   BM_ProxyStep/d/T0/precision/optimizer
//                            the real CUDA backend (make_cuda_backend, N = 2)
//                            with a full history of T0 pairs: one
//                            proxy_step(batch, 1, ProxySource::gp), i.e. the
//                            distance pass over X, the T0-kernel vector, the
//                            cuSOLVER potrs, and the fused "GP mean + optimizer
//                            step" pass over G.
//   BM_Fit/T0                the backend's fit() at d = 1e6 (host covariance,
//                            upload, cuSOLVER potrf, devInfo readback).
//   BM_Iteration/d/T0/precision
//                            a whole OptEx iteration on the device: Engine with
//                            Device::cuda(0), N = 4, Adam; ask(), the objective
//                            (gradient = point, loss 0: f = ||x||^2 / 2, one
//                            device-to-device copy per row), tell().
//
// Byte counts (every array counted once per pass that must touch it, writes
// once, no write-allocate traffic, as STREAM does; S = sizeof(history Store),
// 4 for fp32 and 2 for bf16):
//   copy            8 d               read d floats, write d floats
//   plain Adam      28 d              read g, x, m, v; write x, m, v
//   proxy, Adam     (2 T0 S + 32) d   distance pass: X (T0 S d) and the query
//                                     (4 d); fused step: G (T0 S d), read x, m,
//                                     v (12 d), write predicted, x, m, v (16 d)
//   proxy, SGD      (2 T0 S + 24) d   the same with one moment: query (4 d),
//                                     read x, b (8 d), write predicted, x, b
//                                     (12 d)
//
// Timing: manual, from cudaEvent pairs (UseManualTime). Work the program
// enqueues itself (copy, plain Adam) runs on one stream held closed by a host
// function until the whole window is enqueued, so the events see back-to-back
// device work and no launch gaps. The backend and the Engine enqueue on their
// own non-blocking stream, which no event of this program can join: there the
// device is idle, the start event is recorded and waited for, the work is
// enqueued, cudaDeviceSynchronize() waits for it, and the stop event is
// recorded; the window contains the work plus about 10-20 us of host latency,
// amortised by timing `reps` operations per window. Each benchmark iteration
// is one window; the time reported is the window over reps (per operation).
// Each window of copies and plain Adam steps cycles through enough buffers
// (>= 256 MiB, five times the H200's 50 MiB L2) that every source is read
// from HBM, not from L2.
//
// Counters: bytes (per operation, as counted above), bytes_per_second
// (SetBytesProcessed over the manual time), copy_ratio = that bandwidth over
// the device-copy bandwidth at the same d, measured once at startup in this
// process (median of 20 windows) and also printed in the context, so each row
// is self-contained; plain_adam_ratio = OptEx iteration time over one plain
// Adam step at the same d (also measured at startup, median of 20 windows).
//
// Without a CUDA device every benchmark is skipped with "no CUDA device"; a
// configuration whose device memory need exceeds cudaMemGetInfo's free memory
// is skipped with the numbers.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "kernels.cuh"
#include "optex/backend/device.hpp"
#include "optex/backend/engine_backend.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/adam.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/sgd.hpp"
#include "optex/util/random.hpp"

namespace {

using optex::cuda::DeviceBuffer;
using optex::detail::BatchAccess;
using optex::detail::EngineBackend;
using optex::detail::ProxySource;

constexpr std::int64_t kDims[] = {1'000'000, 10'000'000, 100'000'000};
constexpr std::int64_t kHistories[] = {16, 32, 64};
constexpr std::int64_t kFitDim = 1'000'000;
constexpr int kProxyParallelism = 2;
constexpr int kIterationParallelism = 4;
constexpr double kFloat = sizeof(float);

// Only for sizing windows and iteration counts at registration (results never
// use it): about what an H200 streams, on the low side.
constexpr double kNominalBandwidth = 4.0e12;
// A timed window of backend work is at least this long, so the host latency
// around it (10-20 us) stays near 1%.
constexpr double kBackendWindow = 2e-3;
// A window of gated stream work (copy, plain Adam) is at least this long.
constexpr double kStreamWindow = 100e-6;
// Device time each benchmark spends in its timed windows.
constexpr double kMeasure = 0.4;
// Rotating buffers cover at least this much memory (5x the H200's L2).
constexpr double kRotateBytes = 256.0 * 1024 * 1024;
// Device memory kept free beyond what a configuration counts (context,
// cuBLAS / cuSOLVER workspaces, scratch).
constexpr double kMemoryMargin = 1.0e9;
constexpr int kReferenceRuns = 20;

enum class Opt { sgd_momentum = 0, adam = 1 };

bool have_device() { return optex::cuda_device_count() > 0; }

double store_bytes(optex::Precision p) { return p == optex::Precision::bf16 ? 2.0 : 4.0; }

double proxy_bytes(double d, double t0, optex::Precision p, Opt opt) {
  return (2.0 * t0 * store_bytes(p) + (opt == Opt::adam ? 32.0 : 24.0)) * d;
}

double copy_bytes(double d) { return 2.0 * kFloat * d; }
double adam_bytes(double d) { return 7.0 * kFloat * d; }

std::int64_t clamp_count(double v, std::int64_t lo, std::int64_t hi) {
  if (!(v < static_cast<double>(hi))) return hi;
  return std::clamp(static_cast<std::int64_t>(std::ceil(v)), lo, hi);
}

// printf into a std::string of the right size.
template <class... Args>
std::string format(const char* fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return {};
  std::string out(static_cast<std::size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, args...);
  out.pop_back();
  return out;
}

std::string gigabytes(double bytes) { return format("%.2f GB", bytes * 1e-9); }

// ---- timing -------------------------------------------------------------------

// A host function that keeps its stream closed until the host opens the gate
// (or, as a safety net that never triggers in a healthy run, 10 s pass).
void CUDART_CB wait_for_gate(void* gate) {
  auto* open = static_cast<std::atomic<bool>*>(gate);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!open->load(std::memory_order_acquire) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
}

// The benchmark's own stream and event pair on device 0.
class Timer {
 public:
  Timer() {
    OPTEX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    OPTEX_CUDA_CHECK(cudaEventCreate(&start_));
    OPTEX_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(stop_);
    cudaEventDestroy(start_);
    cudaStreamDestroy(stream_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  cudaStream_t stream() const { return stream_; }

  // Seconds of device time for `enqueue`, which enqueues on stream() only. The
  // stream waits behind a host function until everything is enqueued, so the
  // events bracket back-to-back device work.
  template <class F>
  double time_stream(F&& enqueue) {
    struct Opener {
      std::atomic<bool>& gate;
      ~Opener() { gate.store(true, std::memory_order_release); }
    };
    gate_.store(false, std::memory_order_release);
    OPTEX_CUDA_CHECK(cudaLaunchHostFunc(stream_, &wait_for_gate, &gate_));
    {
      const Opener opener{gate_};  // opens even when an enqueue throws
      OPTEX_CUDA_CHECK(cudaEventRecord(start_, stream_));
      enqueue();
      OPTEX_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    }
    OPTEX_CUDA_CHECK(cudaEventSynchronize(stop_));
    return elapsed();
  }

  // Seconds for `work`, which may enqueue on any stream of the device (the
  // backend's own): the device is idle at the start event, and the stop event
  // is recorded once cudaDeviceSynchronize() has seen all of the work finish.
  template <class F>
  double time_device(F&& work) {
    OPTEX_CUDA_CHECK(cudaDeviceSynchronize());
    OPTEX_CUDA_CHECK(cudaEventRecord(start_, stream_));
    OPTEX_CUDA_CHECK(cudaEventSynchronize(start_));
    work();
    OPTEX_CUDA_CHECK(cudaDeviceSynchronize());
    OPTEX_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    OPTEX_CUDA_CHECK(cudaEventSynchronize(stop_));
    return elapsed();
  }

 private:
  double elapsed() const {
    float ms = 0.0f;
    OPTEX_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return 1e-3 * static_cast<double>(ms);
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  std::atomic<bool> gate_{true};
};

// ---- state shared across benchmarks ---------------------------------------------

// A backend with a full history, driven without an Engine.
struct ProxySetup {
  std::int64_t d = 0;
  std::int64_t t0 = 0;
  optex::Precision precision = optex::Precision::fp32;
  Opt opt = Opt::adam;
  std::unique_ptr<EngineBackend> backend;
  optex::Batch batch;
  double lengthscale = 1.0;
};

struct Globals {
  std::unique_ptr<Timer> timer;
  std::unique_ptr<ProxySetup> proxy;
  std::map<std::int64_t, std::vector<float>> x0;      // host start points per d
  std::map<std::int64_t, double> copy_bandwidth;      // bytes/s, median of 20 windows
  std::map<std::int64_t, double> plain_adam_seconds;  // per step, median of 20 windows
};

Globals& globals() {
  static Globals g;
  return g;
}

Timer& timer() {
  if (!globals().timer) globals().timer = std::make_unique<Timer>();
  return *globals().timer;
}

// Frees every cached device allocation (before a configuration that needs the memory).
void release_device_state() { globals().proxy.reset(); }

// x0 uniform in [-1, 1]^d, seeded, made once per d.
const std::vector<float>& start_point(std::int64_t d) {
  auto& x0 = globals().x0[d];
  if (x0.empty()) {
    optex::SplitMix64 rng(0xc0da'0000 + static_cast<std::uint64_t>(d));
    x0.resize(static_cast<std::size_t>(d));
    for (float& e : x0) e = static_cast<float>(rng.uniform(-1.0, 1.0));
  }
  return x0;
}

double free_device_bytes() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  OPTEX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<double>(free_bytes);
}

// Empty when `need` bytes fit in free device memory (with the margin), else why not.
std::string memory_shortfall(double need, const std::string& what) {
  const double free_bytes = free_device_bytes();
  if (need + kMemoryMargin <= free_bytes) return {};
  return what + " needs about " + gigabytes(need) + " of device memory (+" +
         gigabytes(kMemoryMargin) + " margin); " + gigabytes(free_bytes) + " free";
}

// Runs `body` unless there is no device; exceptions become SkipWithError.
template <class F>
void guarded(benchmark::State& state, F&& body) {
  if (!have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  try {
    body();
  } catch (const std::exception& e) {
    if (!state.error_occurred()) state.SkipWithError(e.what());
  }
}

// ---- device copy and plain Adam: rotating buffers on the timer's stream -----

// `count` sets of buffers, each set covering `set_bytes`, enough sets that a
// window never reads a source still in L2.
std::size_t rotating_sets(double set_bytes) {
  return static_cast<std::size_t>(clamp_count(kRotateBytes / set_bytes, 1, 64));
}

struct CopyPool {
  std::size_t d;
  std::vector<DeviceBuffer<float>> src, dst;
  explicit CopyPool(std::size_t dim) : d(dim) {
    const std::size_t sets = rotating_sets(copy_bytes(static_cast<double>(dim)));
    for (std::size_t s = 0; s < sets; ++s) {
      src.emplace_back(dim);
      dst.emplace_back(dim);
      OPTEX_CUDA_CHECK(cudaMemset(src.back().data(), 0x3c, dim * sizeof(float)));
      OPTEX_CUDA_CHECK(cudaMemset(dst.back().data(), 0, dim * sizeof(float)));
    }
    OPTEX_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Seconds per copy over one window of `reps` copies.
  double window(Timer& t, std::int64_t reps) {
    const double s = t.time_stream([&] {
      for (std::int64_t r = 0; r < reps; ++r) {
        const std::size_t k = static_cast<std::size_t>(r) % src.size();
        OPTEX_CUDA_CHECK(cudaMemcpyAsync(dst[k].data(), src[k].data(), d * sizeof(float),
                                         cudaMemcpyDeviceToDevice, t.stream()));
      }
    });
    return s / static_cast<double>(reps);
  }
};

struct AdamPool {
  std::size_t d;
  optex::OptimizerRanges ranges;
  optex::cuda::StepCoefficients coefficients;
  std::int64_t step = 0;
  std::vector<DeviceBuffer<float>> x, m, v, g;
  explicit AdamPool(std::size_t dim)
      : d(dim), ranges(optex::OptimizerRanges(optex::Adam{}).for_dimension(dim)) {
    const std::size_t sets = rotating_sets(4.0 * kFloat * static_cast<double>(dim));
    const std::vector<float>& x0 = start_point(static_cast<std::int64_t>(dim));
    for (std::size_t s = 0; s < sets; ++s) {
      x.emplace_back(dim);
      m.emplace_back(dim);
      v.emplace_back(dim);
      g.emplace_back(dim);
      OPTEX_CUDA_CHECK(
          cudaMemcpy(x.back().data(), x0.data(), dim * sizeof(float), cudaMemcpyHostToDevice));
      OPTEX_CUDA_CHECK(
          cudaMemcpy(g.back().data(), x0.data(), dim * sizeof(float), cudaMemcpyHostToDevice));
      OPTEX_CUDA_CHECK(cudaMemset(m.back().data(), 0, dim * sizeof(float)));
      OPTEX_CUDA_CHECK(cudaMemset(v.back().data(), 0, dim * sizeof(float)));
    }
    OPTEX_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Seconds per fused Adam step over one window of `reps` steps.
  double window(Timer& t, std::int64_t reps) {
    const double s = t.time_stream([&] {
      for (std::int64_t r = 0; r < reps; ++r) {
        const std::size_t k = static_cast<std::size_t>(r) % x.size();
        optex::cuda::fill_step_coefficients(ranges, step++, coefficients);
        optex::cuda::StateRows state;
        state.slot[optex::Adam::kExpAvg] = m[k].data();
        state.slot[optex::Adam::kExpAvgSq] = v[k].data();
        optex::cuda::optimizer_step<float>(nullptr, nullptr, 0, g[k].data(), nullptr, x[k].data(),
                                           x[k].data(), state, coefficients, d, t.stream());
        OPTEX_CUDA_CHECK(cudaGetLastError());
      }
    });
    return s / static_cast<double>(reps);
  }
};

// Operations per gated window: at least one pass over the rotating sets.
std::int64_t stream_reps(double bytes_per_op, std::size_t sets) {
  return std::max<std::int64_t>(
      static_cast<std::int64_t>(sets),
      clamp_count(kStreamWindow * kNominalBandwidth / bytes_per_op, 1, 64));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The references of the ratios, per d, measured before any benchmark runs.
void measure_references() {
  Timer& t = timer();
  for (const std::int64_t d : kDims) {
    const double dd = static_cast<double>(d);
    const auto n = static_cast<std::size_t>(d);
    {
      const std::size_t sets = rotating_sets(copy_bytes(dd));
      const std::string why = memory_shortfall(static_cast<double>(sets) * copy_bytes(dd), "copy");
      if (why.empty()) {
        CopyPool pool(n);
        const std::int64_t reps = stream_reps(copy_bytes(dd), sets);
        pool.window(t, reps);  // warm-up
        std::vector<double> runs;
        for (int r = 0; r < kReferenceRuns; ++r) runs.push_back(pool.window(t, reps));
        globals().copy_bandwidth[d] = copy_bytes(dd) / median(runs);
      }
    }
    {
      const std::size_t sets = rotating_sets(4.0 * kFloat * dd);
      const std::string why =
          memory_shortfall(static_cast<double>(sets) * 4.0 * kFloat * dd, "plain Adam");
      if (why.empty()) {
        AdamPool pool(n);
        const std::int64_t reps = stream_reps(adam_bytes(dd), sets);
        pool.window(t, reps);  // warm-up
        std::vector<double> runs;
        for (int r = 0; r < kReferenceRuns; ++r) runs.push_back(pool.window(t, reps));
        globals().plain_adam_seconds[d] = median(runs);
      }
    }
  }
}

void set_copy_ratio(benchmark::State& state, std::int64_t d, double bandwidth) {
  const auto it = globals().copy_bandwidth.find(d);
  if (it != globals().copy_bandwidth.end()) state.counters["copy_ratio"] = bandwidth / it->second;
}

// Iterations of a stream benchmark: about kMeasure seconds of device time.
std::int64_t stream_iterations(double bytes_per_op, std::size_t sets) {
  const double window =
      static_cast<double>(stream_reps(bytes_per_op, sets)) * bytes_per_op / kNominalBandwidth;
  return clamp_count(kMeasure / window, 10, 2000);
}

// A stream benchmark: windows of back-to-back operations of one Pool (copies
// or plain Adam steps) over rotating buffers, `bytes` moved per operation.
template <class Pool>
void stream_benchmark(benchmark::State& state, const char* name, double bytes, double buffer_bytes,
                      const char* per_window_counter) {
  guarded(state, [&] {
    const std::int64_t d = state.range(0);
    release_device_state();
    const std::size_t sets = rotating_sets(buffer_bytes);
    if (const std::string why = memory_shortfall(static_cast<double>(sets) * buffer_bytes, name);
        !why.empty()) {
      state.SkipWithError(why.c_str());
      return;
    }
    Pool pool(static_cast<std::size_t>(d));
    Timer& t = timer();
    const std::int64_t reps = stream_reps(bytes, sets);
    pool.window(t, reps);  // warm-up
    double total = 0.0;
    for (auto _ : state) {
      const double s = pool.window(t, reps);
      state.SetIterationTime(s);
      total += s;
    }
    const double moved = bytes * static_cast<double>(state.iterations());
    state.SetBytesProcessed(static_cast<std::int64_t>(moved));
    state.counters["bytes"] = bytes;
    state.counters[per_window_counter] = static_cast<double>(reps);
    state.counters["rotating_buffers"] = static_cast<double>(sets);
    set_copy_ratio(state, d, moved / total);
  });
}

void BM_DeviceCopy(benchmark::State& state) {
  const double d = static_cast<double>(state.range(0));
  stream_benchmark<CopyPool>(state, "BM_DeviceCopy", copy_bytes(d), copy_bytes(d),
                             "copies_per_window");
}

void BM_PlainAdamStep(benchmark::State& state) {
  const double d = static_cast<double>(state.range(0));
  stream_benchmark<AdamPool>(state, "BM_PlainAdamStep", adam_bytes(d), 4.0 * kFloat * d,
                             "steps_per_window");
}

// ---- the backend, driven directly -------------------------------------------------

// Step sizes large enough that consecutive points differ even in bf16 (8
// significant bits: a relative step of 1e-3 would often round away).
optex::Optimizer make_optimizer(Opt opt) {
  if (opt == Opt::adam) return optex::Adam{.lr = 1e-2};
  return optex::Sgd{.lr = 1e-2, .momentum = 0.9};
}

// Device bytes the backend allocates for N points (as its own memory check counts).
double backend_bytes(double d, double t0, optex::Precision p, Opt opt, int n) {
  const double moments = opt == Opt::adam ? 2.0 : 1.0;
  return 2.0 * t0 * d * store_bytes(p) + (3.0 * n - 1.0) * d * kFloat +
         (2.0 + 2.0 * moments) * d * kFloat;
}

// Median pairwise distance of the history points: the lengthscale of the fit.
double median_distance(const optex::HistoryGram& gram) {
  std::vector<double> dist;
  for (std::size_t i = 0; i < gram.size(); ++i) {
    for (std::size_t j = i + 1; j < gram.size(); ++j) {
      dist.push_back(std::sqrt(std::max(0.0, gram.squared_distance(i, j))));
    }
  }
  if (dist.empty()) throw std::runtime_error("history: fewer than two pairs");
  const double m = median(dist);
  const double smallest = *std::min_element(dist.begin(), dist.end());
  if (!std::isfinite(m) || !(smallest > 0.0)) {
    throw std::runtime_error("history: degenerate pairwise distances (median " + std::to_string(m) +
                             ", smallest " + std::to_string(smallest) + ")");
  }
  return m;
}

// Fills the history of a fresh backend to T0 pairs. Objective f = ||x||^2 / 2,
// so the gradient is the point, written on the device by one copy. The first
// round (empty history) holds point 1 at point 0 and keeps only point 1; later
// rounds step point 1 from point 0 with the newest history gradient, so every
// pair in the history has its own point.
void fill_history(ProxySetup& s) {
  EngineBackend& b = *s.backend;
  Timer& t = timer();
  const std::size_t rows_bytes =
      static_cast<std::size_t>(kProxyParallelism) * static_cast<std::size_t>(s.d) * sizeof(float);
  const std::vector<char> no_prediction(static_cast<std::size_t>(kProxyParallelism), 0);
  std::vector<char> finite(static_cast<std::size_t>(kProxyParallelism), 0);
  const optex::detail::HostGradient no_oracle;
  for (int round = 0; b.gram().size() < static_cast<std::size_t>(s.t0); ++round) {
    if (round > 2 * s.t0) throw std::runtime_error("history: did not fill");
    const bool empty = b.gram().empty();
    b.begin_batch(s.batch);
    b.proxy_step(s.batch, 1, empty ? ProxySource::hold : ProxySource::newest, no_oracle);
    // The rows are written on the backend's stream; copy once they are there,
    // and hand them back only once the copy has landed.
    OPTEX_CUDA_CHECK(cudaDeviceSynchronize());
    OPTEX_CUDA_CHECK(cudaMemcpyAsync(s.batch.device_grads(), s.batch.device_points(), rows_bytes,
                                     cudaMemcpyDeviceToDevice, t.stream()));
    OPTEX_CUDA_CHECK(cudaStreamSynchronize(t.stream()));
    b.check_gradients(s.batch, finite);
    if (std::find(finite.begin(), finite.end(), 0) != finite.end()) {
      throw std::runtime_error("history: a gradient row is not finite");
    }
    const std::vector<char> keep = empty ? std::vector<char>{0, 1} : std::vector<char>{1, 1};
    if (!b.stage_step(s.batch, 1)) throw std::runtime_error("history: a step left the bound");
    b.commit(s.batch, 1, keep, no_prediction);
  }
}

// The cached setup for this configuration, built (and the old one freed) on demand.
ProxySetup& proxy_setup(std::int64_t d, std::int64_t t0, optex::Precision precision, Opt opt) {
  auto& cached = globals().proxy;
  if (cached && cached->d == d && cached->t0 == t0 && cached->precision == precision &&
      cached->opt == opt) {
    return *cached;
  }
  cached.reset();  // free the old history before allocating the new one
  auto s = std::make_unique<ProxySetup>();
  s->d = d;
  s->t0 = t0;
  s->precision = precision;
  s->opt = opt;
  optex::Options o;
  o.parallelism = kProxyParallelism;
  o.history = static_cast<int>(t0);
  o.device = optex::Device::cuda(0);
  o.history_precision = precision;
  // The backend takes ranges sized to the dimension, as the Engine hands them over.
  const optex::OptimizerRanges ranges =
      optex::OptimizerRanges(make_optimizer(opt)).for_dimension(static_cast<std::size_t>(d));
  s->backend =
      optex::detail::make_cuda_backend(start_point(d), ranges, o, optex::CoordinateShard::whole(d));
  BatchAccess::allocate(s->batch, kProxyParallelism, static_cast<std::size_t>(d),
                        optex::Device::cuda(0));
  fill_history(*s);
  s->lengthscale = median_distance(s->backend->gram());
  cached = std::move(s);
  return *cached;
}

void BM_ProxyStep(benchmark::State& state) {
  guarded(state, [&] {
    const std::int64_t d = state.range(0);
    const std::int64_t t0 = state.range(1);
    const auto precision = state.range(2) == 1 ? optex::Precision::bf16 : optex::Precision::fp32;
    const auto opt = state.range(3) == 1 ? Opt::adam : Opt::sgd_momentum;
    const double dd = static_cast<double>(d);
    const double bytes = proxy_bytes(dd, static_cast<double>(t0), precision, opt);
    state.SetLabel(std::string(optex::precision_name(precision)) +
                   (opt == Opt::adam ? " adam" : " sgd-momentum"));

    auto& cached = globals().proxy;
    if (!(cached && cached->d == d && cached->t0 == t0 && cached->precision == precision &&
          cached->opt == opt)) {
      release_device_state();
      const double need =
          backend_bytes(dd, static_cast<double>(t0), precision, opt, kProxyParallelism);
      if (const std::string why = memory_shortfall(need, "the backend"); !why.empty()) {
        state.SkipWithError(why.c_str());
        return;
      }
    }
    ProxySetup& s = proxy_setup(d, t0, precision, opt);
    EngineBackend& b = *s.backend;
    b.fit(s.lengthscale);  // BM_Fit may have refitted since
    b.begin_batch(s.batch);

    const optex::detail::HostGradient no_oracle;
    const std::int64_t reps = clamp_count(kBackendWindow * kNominalBandwidth / bytes, 1, 64);
    Timer& t = timer();
    const auto window = [&] {
      return t.time_device([&] {
        for (std::int64_t r = 0; r < reps; ++r) {
          b.proxy_step(s.batch, 1, ProxySource::gp, no_oracle);
        }
      }) / static_cast<double>(reps);
    };
    window();  // warm-up
    double total = 0.0;
    for (auto _ : state) {
      const double step = window();
      state.SetIterationTime(step);
      total += step;
    }
    if (!b.finish_batch(s.batch)) {
      state.SkipWithError("proxy: the GP weights are not finite");
      return;
    }
    const double moved = bytes * static_cast<double>(state.iterations());
    state.SetBytesProcessed(static_cast<std::int64_t>(moved));
    state.counters["bytes"] = bytes;
    state.counters["steps_per_window"] = static_cast<double>(reps);
    set_copy_ratio(state, d, moved / total);
  });
}

void BM_Fit(benchmark::State& state) {
  guarded(state, [&] {
    const std::int64_t t0 = state.range(0);
    const std::int64_t d = kFitDim;
    const auto precision = optex::Precision::fp32;
    auto& cached = globals().proxy;
    if (!(cached && cached->d == d && cached->t0 == t0 && cached->precision == precision &&
          cached->opt == Opt::adam)) {
      release_device_state();
      const double need = backend_bytes(static_cast<double>(d), static_cast<double>(t0), precision,
                                        Opt::adam, kProxyParallelism);
      if (const std::string why = memory_shortfall(need, "the backend"); !why.empty()) {
        state.SkipWithError(why.c_str());
        return;
      }
    }
    ProxySetup& s = proxy_setup(d, t0, precision, Opt::adam);
    EngineBackend& b = *s.backend;
    constexpr int reps = 16;  // fit synchronises: amortise the host latency around the window
    double jitter = 0.0;
    Timer& t = timer();
    const auto window = [&] {
      return t.time_device([&] {
        for (int r = 0; r < reps; ++r) jitter = b.fit(s.lengthscale);
      }) / reps;
    };
    window();  // warm-up
    for (auto _ : state) state.SetIterationTime(window());
    state.counters["fits_per_window"] = reps;
    state.counters["jitter"] = jitter;
    state.counters["lengthscale"] = s.lengthscale;
  });
}

// ---- a whole OptEx iteration through the Engine -------------------------------------

// Bytes an iteration moves, roughly (only for sizing windows): N - 1 proxy
// steps with Adam and the commit's pass over the history.
double iteration_bytes_estimate(double d, double t0, optex::Precision p) {
  return (kIterationParallelism - 1) * proxy_bytes(d, t0, p, Opt::adam) +
         (2.0 * t0 * store_bytes(p) + 64.0) * d;
}

std::int64_t iteration_reps(double d, double t0, optex::Precision p) {
  return clamp_count(kBackendWindow * kNominalBandwidth / iteration_bytes_estimate(d, t0, p), 1,
                     16);
}

void BM_Iteration(benchmark::State& state) {
  guarded(state, [&] {
    const std::int64_t d = state.range(0);
    const std::int64_t t0 = state.range(1);
    const auto precision = state.range(2) == 1 ? optex::Precision::bf16 : optex::Precision::fp32;
    const double dd = static_cast<double>(d);
    state.SetLabel(std::string(optex::precision_name(precision)) + " adam N=4");
    release_device_state();
    const double need =
        backend_bytes(dd, static_cast<double>(t0), precision, Opt::adam, kIterationParallelism);
    if (const std::string why = memory_shortfall(need, "the engine"); !why.empty()) {
      state.SkipWithError(why.c_str());
      return;
    }

    optex::Options o;
    o.parallelism = kIterationParallelism;
    o.history = static_cast<int>(t0);
    o.device = optex::Device::cuda(0);
    o.history_precision = precision;
    optex::Engine engine(start_point(d), make_optimizer(Opt::adam), o);

    Timer& t = timer();
    const std::size_t row_bytes = static_cast<std::size_t>(d) * sizeof(float);
    // f(x) = ||x||^2 / 2: the gradient is the point, one device copy per row.
    const auto iteration = [&] {
      optex::Batch& batch = engine.ask();
      for (int i = 0; i < batch.size(); ++i) {
        OPTEX_CUDA_CHECK(cudaMemcpyAsync(batch.device_grad(i), batch.device_point(i), row_bytes,
                                         cudaMemcpyDeviceToDevice, t.stream()));
        batch.loss(i) = 0.0;
      }
      // tell() reads the rows on the engine's stream, which does not wait for ours.
      OPTEX_CUDA_CHECK(cudaStreamSynchronize(t.stream()));
      engine.tell(batch);
    };
    // Warm-up: N pairs enter the history per iteration; two more so that the
    // timed iterations see a full history with GP proxy steps.
    const std::int64_t warmup = (t0 + kIterationParallelism - 1) / kIterationParallelism + 2;
    for (std::int64_t i = 0; i < warmup; ++i) iteration();

    const std::int64_t reps = iteration_reps(dd, static_cast<double>(t0), precision);
    double total = 0.0;
    for (auto _ : state) {
      const double s = t.time_device([&] {
        for (std::int64_t r = 0; r < reps; ++r) iteration();
      }) / static_cast<double>(reps);
      state.SetIterationTime(s);
      total += s;
    }
    const double mean = total / static_cast<double>(state.iterations());
    state.counters["iteration_ms"] = 1e3 * mean;
    state.counters["iterations_per_window"] = static_cast<double>(reps);
    // Sanity of the predictions (NaN when none was made: left out of the JSON).
    if (std::isfinite(engine.last_info().cosine)) {
      state.counters["cosine"] = engine.last_info().cosine;
    }
    state.counters["lengthscale"] = engine.last_info().lengthscale;
    if (const auto it = globals().plain_adam_seconds.find(d);
        it != globals().plain_adam_seconds.end()) {
      state.counters["plain_adam_ratio"] = mean / it->second;
    }
  });
}

// ---- context -------------------------------------------------------------------------

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void add_context() {
  benchmark::AddCustomContext("bench_cuda_started_utc", utc_now());
  const int count = optex::cuda_device_count();
  if (count == 0) {
    benchmark::AddCustomContext("cuda_device",
                                "none (optex::cuda_device_count() == 0): every benchmark skips");
    return;
  }
  cudaDeviceProp prop{};
  OPTEX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  int bus_bits = 0;
  OPTEX_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0));
  OPTEX_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  OPTEX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  int driver = 0;
  int runtime = 0;
  OPTEX_CUDA_CHECK(cudaDriverGetVersion(&driver));
  OPTEX_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));

  benchmark::AddCustomContext(
      "cuda_device", format("%s (cuda:0 of %d, sm_%d%d, %d SMs, L2 %.0f MiB)", prop.name, count,
                            prop.major, prop.minor, prop.multiProcessorCount,
                            static_cast<double>(prop.l2CacheSize) / (1024.0 * 1024.0)));
  benchmark::AddCustomContext("cuda_memory", format("%.1f GB total, %.1f GB free at start",
                                                    static_cast<double>(total_bytes) * 1e-9,
                                                    static_cast<double>(free_bytes) * 1e-9));
  benchmark::AddCustomContext(
      "cuda_nominal_bandwidth",
      format("%.2f TB/s (2 x %d MHz x %d bits, as the driver reports)",
             2.0 * clock_khz * 1e3 * bus_bits / 8.0 * 1e-12, clock_khz / 1000, bus_bits));
  benchmark::AddCustomContext(
      "cuda_versions", format("driver %d.%d, runtime %d.%d", driver / 1000, (driver % 1000) / 10,
                              runtime / 1000, (runtime % 1000) / 10));

  measure_references();
  for (const std::int64_t d : kDims) {
    const std::string key = "d=" + std::to_string(d);
    if (const auto it = globals().copy_bandwidth.find(d); it != globals().copy_bandwidth.end()) {
      benchmark::AddCustomContext("copy_reference_" + key, format("%.1f GB/s", it->second * 1e-9));
    }
    if (const auto it = globals().plain_adam_seconds.find(d);
        it != globals().plain_adam_seconds.end()) {
      benchmark::AddCustomContext("plain_adam_reference_" + key,
                                  format("%.4f ms", it->second * 1e3));
    }
  }
}

// ---- registration -------------------------------------------------------------------

void register_benchmarks() {
  for (const std::int64_t d : kDims) {
    const double dd = static_cast<double>(d);
    benchmark::RegisterBenchmark("BM_DeviceCopy", BM_DeviceCopy)
        ->Arg(d)
        ->ArgName("d")
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(stream_iterations(copy_bytes(dd), rotating_sets(copy_bytes(dd))));
  }
  for (const std::int64_t d : kDims) {
    const double dd = static_cast<double>(d);
    benchmark::RegisterBenchmark("BM_PlainAdamStep", BM_PlainAdamStep)
        ->Arg(d)
        ->ArgName("d")
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(stream_iterations(adam_bytes(dd), rotating_sets(4.0 * kFloat * dd)));
  }
  // Proxy steps; BM_Fit right after the d = 1e6 fp32 Adam proxy step of its
  // T0, whose backend (and full history) it reuses.
  for (const std::int64_t d : kDims) {
    for (const std::int64_t t0 : kHistories) {
      for (const std::int64_t precision : {0, 1}) {
        for (const std::int64_t opt : {0, 1}) {
          const double bytes =
              proxy_bytes(static_cast<double>(d), static_cast<double>(t0),
                          precision == 1 ? optex::Precision::bf16 : optex::Precision::fp32,
                          opt == 1 ? Opt::adam : Opt::sgd_momentum);
          const double step = bytes / kNominalBandwidth;
          const std::int64_t reps = clamp_count(kBackendWindow / step, 1, 64);
          benchmark::RegisterBenchmark("BM_ProxyStep", BM_ProxyStep)
              ->Args({d, t0, precision, opt})
              ->ArgNames({"d", "T0", "precision", "optimizer"})
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond)
              ->Iterations(clamp_count(kMeasure / (static_cast<double>(reps) * step), 5, 500));
          if (d == kFitDim && precision == 0 && opt == 1) {
            benchmark::RegisterBenchmark("BM_Fit", BM_Fit)
                ->Arg(t0)
                ->ArgName("T0")
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond)
                ->Iterations(50);
          }
        }
      }
    }
  }
  for (const std::int64_t d : kDims) {
    for (const std::int64_t t0 : kHistories) {
      for (const std::int64_t precision : {0, 1}) {
        const double dd = static_cast<double>(d);
        const double tt = static_cast<double>(t0);
        const auto p = precision == 1 ? optex::Precision::bf16 : optex::Precision::fp32;
        const double window = static_cast<double>(iteration_reps(dd, tt, p)) *
                              iteration_bytes_estimate(dd, tt, p) / kNominalBandwidth;
        benchmark::RegisterBenchmark("BM_Iteration", BM_Iteration)
            ->Args({d, t0, precision})
            ->ArgNames({"d", "T0", "precision"})
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->Iterations(clamp_count(kMeasure / window, 5, 100));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int rc = 0;
  try {
    add_context();  // device, memory, date; measures the copy and plain-Adam references
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    rc = 1;
  }
  // Device state goes before the CUDA runtime shuts down at exit.
  globals().proxy.reset();
  globals().timer.reset();
  benchmark::Shutdown();
  return rc;
}
