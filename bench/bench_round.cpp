// A whole round's overhead against its bytes-moved roofline, on every core.
//
// A round's overhead is what the N parallel gradient evaluations must pay for:
// ask() (lengthscale selection, fit, N - 1 proxy steps) and tell() (admission,
// the staged step, the statistics, the history update), timed with the
// gradients given (optex::RoundRig, the code optex-plan measures with). Its
// roofline is round_bytes (DESIGN.md section 4, "A round's passes") over the
// bandwidth of a STREAM triad measured in this binary on the same threads,
// over 3 x 2.5e7 floats (300 MB, far beyond any cache, as a round's history is).
//
//   BM_Triad                the triad, every core; its bandwidth is the roofline's
//   BM_Round/d/T0/N         Options{} (the library's defaults) with N and T0,
//                           Adam; every core
//   BM_RoundOneThread/...   two of those cases on one thread, for what the
//                           other cores add
//   BM_RoundReference/...   the authors' reference settings: Options::reference(5)
//                           (T0 = 50, no lengthscale selection, the commit from
//                           the last point) at d = 1e5
//   BM_Round/d/32/2, /16    with N = 4 and 8: how a round grows with N
//   BM_RoundSgd/d/32/N      SGD with momentum, N = 2 to 16, the proxy steps'
//                           distances direct (a pass over the history's points
//                           each) and, BM_RoundSgdCoefficients, in coefficient
//                           space (one anchor pass per round), side by side
//   BM_Round/d/32/1         a round that makes no prediction (N = 1), next to
//   BM_PlainStep/d          one plain fused Adam step (optex::apply_step) on
//                           every core: what such a round costs beyond the step
//
// Counters: ask_ms and tell_ms (medians over the iterations, like the reported
// time, which is their sum per round: manual time); GB (round_bytes / 1e9);
// roofline_ms = round_bytes / triad bandwidth; roofline_ratio = round time /
// roofline_ms (1 is the roofline; the goal is <= 1.5 at d >= 1e6); threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/adam.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optex/planning/round_cost.hpp"

namespace {

constexpr std::size_t kTriadFloats = 25'000'000;

double& triad_bytes_per_second() {
  static double bw = 0.0;
  return bw;
}

void BM_Triad(benchmark::State& state) {
  for (auto _ : state) {
    const double bw = optex::triad_bandwidth(kTriadFloats, 0, 10);
    state.SetIterationTime(12.0 * static_cast<double>(kTriadFloats) / bw);
    triad_bytes_per_second() = bw;
  }
  state.counters["GB_per_s"] = triad_bytes_per_second() / 1e9;
  state.counters["threads"] = optex::available_cores();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void run_rounds(benchmark::State& state, const optex::RoundShape& shape, const optex::Options& base,
                const optex::OptimizerRanges& optimizer = optex::Adam{.lr = 1e-3}) {
  optex::RoundRig rig(shape, base, optimizer);  // the history is full when it returns
  std::vector<double> asks, tells;
  for (auto _ : state) {
    const optex::RoundTimes t = rig.round();
    asks.push_back(t.ask_seconds);
    tells.push_back(t.tell_seconds);
    state.SetIterationTime(t.ask_seconds + t.tell_seconds);
  }
  const double bytes = optex::round_bytes(shape);
  const double seconds = median(asks) + median(tells);
  state.counters["ask_ms"] = 1e3 * median(asks);
  state.counters["tell_ms"] = 1e3 * median(tells);
  state.counters["GB"] = bytes / 1e9;
  state.counters["threads"] = optex::BlockPool(shape.threads).threads();
  if (triad_bytes_per_second() > 0.0) {
    const double roofline = bytes / triad_bytes_per_second();
    state.counters["roofline_ms"] = 1e3 * roofline;
    state.counters["roofline_ratio"] = seconds / roofline;
  }
}

optex::RoundShape shape_of(const benchmark::State& state) {
  return {.dim = static_cast<std::size_t>(state.range(0)),
          .parallelism = static_cast<int>(state.range(2)),
          .history = static_cast<int>(state.range(1)),
          .threads = 0};
}

void BM_Round(benchmark::State& state) { run_rounds(state, shape_of(state), optex::Options{}); }

// The same round on one thread: what the other cores add, side by side.
void BM_RoundOneThread(benchmark::State& state) {
  optex::RoundShape shape = shape_of(state);
  shape.threads = 1;
  run_rounds(state, shape, optex::Options{});
}

void BM_RoundReference(benchmark::State& state) {
  run_rounds(state, shape_of(state), optex::Options::reference(5));
}

// SGD with momentum, its GP proxy steps' distances found the direct way (a pass
// over the history's points per step) and in coefficient space, side by side.
const optex::Sgd kSgdMomentum{.lr = 1e-3, .momentum = 0.9};
void BM_RoundSgd(benchmark::State& state) {
  run_rounds(state, shape_of(state), optex::Options{}, kSgdMomentum);
}
void BM_RoundSgdCoefficients(benchmark::State& state) {
  optex::Options o;
  o.proxy_distances = optex::ProxyDistances::coefficients;
  run_rounds(state, shape_of(state), o, kSgdMomentum);
}

// One Adam step with a given gradient, the memory-bound pass a plain optimizer
// makes per iteration.
void BM_PlainStep(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const optex::OptimizerRanges adam(optex::Adam{});
  std::vector<float> x(d, 0.5f), g(d, 0.25f);
  optex::OptimizerState s = optex::init_state(adam, d);
  const optex::BlockPool pool(0);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    optex::apply_step(adam, x, s, g, pool);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  state.counters["threads"] = pool.threads();
}

// Rounds at d >= 1e6 move gigabytes: a few timed rounds each.
void configure(benchmark::internal::Benchmark* b, std::int64_t d) {
  b->UseManualTime()->Unit(benchmark::kMillisecond)->ArgNames({"d", "T0", "N"});
  b->Iterations(d >= 1'000'000 ? 5 : d >= 100'000 ? 20 : 100);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("BM_Triad", BM_Triad)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
  struct Case {
    std::int64_t d, t0, n;
  };
  std::vector<Case> cases;
  for (const std::int64_t d : {10'000, 100'000, 1'000'000}) {
    for (const std::int64_t t0 : {8, 32, 64}) {
      for (const std::int64_t n : {4, 8}) cases.push_back({d, t0, n});
    }
  }
  // d = 1e7: the history alone is 2.6 GB at T0 = 32; fewer cases.
  for (const Case c : {Case{10'000'000, 8, 4}, Case{10'000'000, 32, 4}, Case{10'000'000, 32, 8},
                       Case{10'000'000, 64, 4}}) {
    cases.push_back(c);
  }
  for (const Case c : cases) {
    configure(benchmark::RegisterBenchmark("BM_Round", BM_Round)->Args({c.d, c.t0, c.n}), c.d);
  }
  for (const Case c : {Case{1'000'000, 32, 4}, Case{10'000'000, 32, 4}}) {
    configure(benchmark::RegisterBenchmark("BM_RoundOneThread", BM_RoundOneThread)
                  ->Args({c.d, c.t0, c.n}),
              c.d);
  }
  // The authors' settings, with their options and with the library's defaults.
  configure(
      benchmark::RegisterBenchmark("BM_RoundReference", BM_RoundReference)->Args({100'000, 50, 5}),
      100'000);
  configure(benchmark::RegisterBenchmark("BM_Round", BM_Round)->Args({100'000, 50, 5}), 100'000);
  // How a round grows with N at T0 = 32 (N = 4 and 8 are above): one d-pass
  // per point is the goal, T0 passes per point today's proxy steps.
  for (const std::int64_t d : {1'000'000, 10'000'000}) {
    for (const std::int64_t n : {2, 16}) {
      configure(benchmark::RegisterBenchmark("BM_Round", BM_Round)->Args({d, 32, n}), d);
    }
  }
  // SGD with momentum: the direct and the coefficient-space distances, N = 2 to 16.
  for (const std::int64_t d : {1'000'000, 10'000'000}) {
    for (const std::int64_t n : {2, 4, 8, 16}) {
      configure(benchmark::RegisterBenchmark("BM_RoundSgd", BM_RoundSgd)->Args({d, 32, n}), d);
      configure(benchmark::RegisterBenchmark("BM_RoundSgdCoefficients", BM_RoundSgdCoefficients)
                    ->Args({d, 32, n}),
                d);
    }
  }
  for (const std::int64_t d : {100'000, 1'000'000, 10'000'000}) {
    configure(benchmark::RegisterBenchmark("BM_Round", BM_Round)->Args({d, 32, 1}), d);
    benchmark::RegisterBenchmark("BM_PlainStep", BM_PlainStep)
        ->Arg(d)
        ->ArgName("d")
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(d >= 10'000'000  ? 10
                     : d >= 1'000'000 ? 20
                                      : 100);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
