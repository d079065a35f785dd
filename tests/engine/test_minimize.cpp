// Tests of optex::minimize (objective forms, stop criteria, callbacks, Result),
// of the ThreadPool it runs on, and of the ProgressBar callback.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "optex/engine/iteration_info.hpp"
#include "optex/engine/minimize.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/util/progress_bar.hpp"
#include "optex/util/random.hpp"
#include "optex/util/thread_pool.hpp"
#include "support/watchdog_child.hpp"

namespace {

using optex::Adam;
using optex::IterationInfo;
using optex::Options;
using optex::Result;
using optex::Sgd;
using optex::Stop;
using optex::StopReason;
using ::testing::HasSubstr;

// ---- objectives: the same function in the three accepted forms ---------------

// f = sum_i w_i x_i^2 + 0.1 x_i^4 with w_i = 1 + (i mod 4).
double Loss(std::span<const float> x) {
  double f = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    f += (1.0 + static_cast<double>(i % 4)) * xi * xi + 0.1 * xi * xi * xi * xi;
  }
  return f;
}

void Grad(std::span<const float> x, std::span<float> g) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    g[i] = static_cast<float>(2.0 * (1.0 + static_cast<double>(i % 4)) * xi + 0.4 * xi * xi * xi);
  }
}

struct WithGradient {
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    Grad(x, g);
    return Loss(x);
  }
};

struct EvaluateAndGradient {
  double Evaluate(std::span<const float> x) const { return Loss(x); }
  void Gradient(std::span<const float> x, std::span<float> g) const { Grad(x, g); }
};

// Counts its calls (from several threads at once).
struct Counting {
  std::shared_ptr<std::atomic<long>> calls = std::make_shared<std::atomic<long>>(0);
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    ++*calls;
    Grad(x, g);
    return Loss(x);
  }
};

static_assert(optex::Objective<WithGradient> && optex::Objective<const EvaluateAndGradient>);

std::vector<float> Start(std::size_t d = 24, std::uint64_t seed = 1) {
  optex::SplitMix64 rng(seed);
  std::vector<float> x(d);
  for (float& v : x) v = static_cast<float>(rng.uniform(-2.0, 2.0));
  return x;
}

Options WithN(int n) {
  Options o;
  o.parallelism = n;
  o.seed = 17;
  return o;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void ExpectSameResult(const Result& a, const Result& b) {
  EXPECT_TRUE(SameBits(a.x, b.x));
  EXPECT_EQ(a.fun, b.fun);
  EXPECT_EQ(a.iterations, b.iterations);
  EXPECT_EQ(a.evaluations, b.evaluations);
  EXPECT_EQ(a.loss_history, b.loss_history);
  EXPECT_EQ(a.stop_reason, b.stop_reason);
}

// ---- objective forms ----------------------------------------------------------

TEST(Minimize, EveryObjectiveFormGivesTheSameResult) {
  const std::vector<float> x0 = Start();
  const Stop stop{.max_iters = 15};
  for (const optex::Optimizer& opt :
       {optex::Optimizer(Adam{.lr = 0.05}), optex::Optimizer(Sgd{.lr = 0.01, .momentum = 0.5})}) {
    const Result a = optex::minimize(WithGradient{}, x0, opt, WithN(4), stop);
    const WithGradient const_lvalue;
    const Result b = optex::minimize(const_lvalue, x0, opt, WithN(4), stop);
    EvaluateAndGradient two_members;
    const Result c = optex::minimize(two_members, x0, opt, WithN(4), stop);
    const Result d = optex::minimize(
        [](std::span<const float> x, std::span<float> g) {
          Grad(x, g);
          return Loss(x);
        },
        x0, opt, WithN(4), stop);
    ExpectSameResult(a, b);
    ExpectSameResult(a, c);
    ExpectSameResult(a, d);
    EXPECT_LT(a.fun, Loss(x0));  // it did optimise
  }
}

// ---- Result ---------------------------------------------------------------------

TEST(Minimize, ResultFields) {
  const std::vector<float> x0 = Start();
  for (int n : {1, 3, 6}) {
    SCOPED_TRACE(n);
    Counting f;
    const Result r = optex::minimize(f, x0, Adam{.lr = 0.05}, WithN(n), Stop{.max_iters = 9});
    EXPECT_EQ(r.iterations, 9);
    EXPECT_EQ(r.stop_reason, StopReason::max_iters);
    EXPECT_EQ(r.evaluations, n * r.iterations + 1);
    EXPECT_EQ(*f.calls, r.evaluations);  // the count is the real number of calls
    EXPECT_EQ(r.loss_history.size(), 9u);
    ASSERT_EQ(r.x.size(), x0.size());
    EXPECT_EQ(r.fun, Loss(r.x));
    for (double l : r.loss_history) EXPECT_TRUE(std::isfinite(l));
  }
}

TEST(Minimize, ZeroIterationsEvaluatesTheStartOnce) {
  const std::vector<float> x0 = Start();
  Counting f;
  const Result r = optex::minimize(f, x0, Adam{}, WithN(4), Stop{.max_iters = 0});
  EXPECT_EQ(r.iterations, 0);
  EXPECT_EQ(r.evaluations, 1);
  EXPECT_EQ(*f.calls, 1);
  EXPECT_TRUE(r.loss_history.empty());
  EXPECT_TRUE(SameBits(r.x, x0));
  EXPECT_EQ(r.fun, Loss(x0));
}

// Proxy::target also calls the objective sequentially, N-1 times per round.
TEST(Minimize, TargetProxyCountsTheOracleCalls) {
  const std::vector<float> x0 = Start();
  Counting f;
  Options o = WithN(4);
  o.proxy = optex::Proxy::target;
  const Result r = optex::minimize(f, x0, Adam{.lr = 0.05}, o, Stop{.max_iters = 5});
  EXPECT_EQ(r.iterations, 5);
  EXPECT_EQ(r.evaluations, (2 * 4 - 1) * 5 + 1);
  EXPECT_EQ(*f.calls, r.evaluations);
}

// ---- stop criteria ----------------------------------------------------------------

// The first index whose value is <= threshold, or -1.
long FirstAtOrBelow(const std::vector<double>& v, double threshold) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] <= threshold) return static_cast<long>(i);
  }
  return -1;
}

TEST(Minimize, TargetLossStopsAsSoonAsItIsReached) {
  const std::vector<float> x0 = Start();
  const Result full =
      optex::minimize(WithGradient{}, x0, Adam{.lr = 0.05}, WithN(4), Stop{.max_iters = 60});
  ASSERT_EQ(full.iterations, 60);
  for (long k : {0L, 7L, 25L}) {
    const double target = full.loss_history[static_cast<std::size_t>(k)];
    const long first = FirstAtOrBelow(full.loss_history, target);
    ASSERT_GE(first, 0);
    const Result r = optex::minimize(WithGradient{}, x0, Adam{.lr = 0.05}, WithN(4),
                                     Stop{.max_iters = 60, .target_loss = target});
    EXPECT_EQ(r.stop_reason, StopReason::target_loss);
    EXPECT_EQ(r.iterations, first + 1);
    EXPECT_EQ(r.evaluations, 4 * (first + 1) + 1);
    ASSERT_EQ(r.loss_history.size(), static_cast<std::size_t>(first + 1));
    EXPECT_LE(r.loss_history.back(), target);
    // The same trajectory as the full run, up to the stop.
    for (long i = 0; i <= first; ++i) {
      EXPECT_EQ(r.loss_history[static_cast<std::size_t>(i)],
                full.loss_history[static_cast<std::size_t>(i)]);
    }
  }
  // A target below every loss never stops the run early.
  const Result never = optex::minimize(WithGradient{}, x0, Adam{.lr = 0.05}, WithN(4),
                                       Stop{.max_iters = 10, .target_loss = -1.0});
  EXPECT_EQ(never.stop_reason, StopReason::max_iters);
  EXPECT_EQ(never.iterations, 10);
}

TEST(Minimize, GradTolStopsOnTheCommittedGradientNorm) {
  const std::vector<float> x0 = Start();
  std::vector<double> norms;
  optex::minimize(WithGradient{}, x0, Adam{.lr = 0.05}, WithN(3), Stop{.max_iters = 50},
                  [&norms](const IterationInfo& info) { norms.push_back(info.grad_norm); });
  ASSERT_EQ(norms.size(), 50u);
  for (long k : {3L, 20L}) {
    const double tol = norms[static_cast<std::size_t>(k)];
    const long first = FirstAtOrBelow(norms, tol);
    const Result r = optex::minimize(WithGradient{}, x0, Adam{.lr = 0.05}, WithN(3),
                                     Stop{.max_iters = 50, .grad_tol = tol});
    EXPECT_EQ(r.stop_reason, StopReason::grad_tol);
    EXPECT_EQ(r.iterations, first + 1);
  }
  // The norm reported is that of the gradient at the committed point.
  std::vector<float> g(x0.size());
  Grad(x0, g);
  double norm0 = 0.0;
  for (float v : g) norm0 += static_cast<double>(v) * v;
  // Default warm-up holds every point at x0 in the first round.
  EXPECT_NEAR(norms[0], std::sqrt(norm0), 1e-6 * std::sqrt(norm0));
}

// ---- callbacks ------------------------------------------------------------------

TEST(Minimize, ACallbackReturningTrueStops) {
  const std::vector<float> x0 = Start();
  int seen = 0;
  const Result r = optex::minimize(WithGradient{}, x0, Adam{.lr = 0.05}, WithN(4),
                                   Stop{.max_iters = 100}, [&seen](const IterationInfo& info) {
                                     ++seen;
                                     EXPECT_EQ(info.iteration, seen);
                                     return info.iteration == 3;
                                   });
  EXPECT_EQ(r.stop_reason, StopReason::callback);
  EXPECT_EQ(r.iterations, 3);
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(r.loss_history.size(), 3u);
  EXPECT_EQ(std::string(optex::stop_reason_name(r.stop_reason)), "callback");
}

TEST(Minimize, VoidCallbacksAndSeveralCallbacks) {
  const std::vector<float> x0 = Start();
  int void_calls = 0;
  int second_calls = 0;
  std::vector<double> losses;
  auto record = [&](const IterationInfo& info) {  // an lvalue, returning nothing
    ++void_calls;
    losses.push_back(info.loss);
    EXPECT_EQ(info.iterate.size(), x0.size());
  };
  const Result r = optex::minimize(
      WithGradient{}, x0, Adam{.lr = 0.05}, WithN(4), Stop{.max_iters = 8}, record,
      [](const IterationInfo& info) { return info.iteration == 5; },
      [&second_calls](const IterationInfo&) { ++second_calls; });
  // Every callback sees every round, including the one another callback stops.
  EXPECT_EQ(r.stop_reason, StopReason::callback);
  EXPECT_EQ(r.iterations, 5);
  EXPECT_EQ(void_calls, 5);
  EXPECT_EQ(second_calls, 5);
  EXPECT_EQ(losses, r.loss_history);
}

// A callback that stops in the same round as the target reports `callback`.
TEST(Minimize, CallbackIsCheckedBeforeTheOtherCriteria) {
  const Result r = optex::minimize(WithGradient{}, Start(), Adam{.lr = 0.05}, WithN(2),
                                   Stop{.max_iters = 5, .target_loss = 1e300},
                                   [](const IterationInfo&) { return true; });
  EXPECT_EQ(r.stop_reason, StopReason::callback);
  EXPECT_EQ(r.iterations, 1);
}

// ---- exceptions ---------------------------------------------------------------

TEST(Minimize, ExceptionsFromTheObjectivePropagate) {
  const std::vector<float> x0 = Start();
  for (int n : {1, 4}) {
    SCOPED_TRACE(n);
    std::atomic<int> calls{0};
    auto f = [&calls](std::span<const float> x, std::span<float> g) {
      if (++calls == 10) throw std::domain_error("objective failed at call 10");
      Grad(x, g);
      return Loss(x);
    };
    try {
      optex::minimize(f, x0, Adam{}, WithN(n), Stop{.max_iters = 100});
      FAIL() << "the objective's exception was swallowed";
    } catch (const std::domain_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("call 10"));
    }
  }
  // Also from the sequential oracle calls of Proxy::target.
  Options o = WithN(3);
  o.proxy = optex::Proxy::target;
  std::atomic<int> oracle_calls{0};  // also called from the pool's threads
  auto g = [&oracle_calls](std::span<const float> x, std::span<float> grad) -> double {
    if (++oracle_calls == 5) throw std::range_error("oracle");
    Grad(x, grad);
    return Loss(x);
  };
  EXPECT_THROW(optex::minimize(g, x0, Adam{}, o, Stop{.max_iters = 10}), std::range_error);
  // A callback's exception propagates too.
  EXPECT_THROW(optex::minimize(WithGradient{}, x0, Adam{}, WithN(2), Stop{.max_iters = 10},
                               [](const IterationInfo&) -> bool { throw std::logic_error("cb"); }),
               std::logic_error);
}

// A non-finite loss at some points is dropped; minimize goes on.
TEST(Minimize, NonFiniteValuesAtSomePointsAreSurvived) {
  const std::vector<float> x0 = Start();
  std::atomic<int> calls{0};
  auto f = [&calls](std::span<const float> x, std::span<float> g) {
    Grad(x, g);
    return ++calls % 7 == 0 ? std::numeric_limits<double>::quiet_NaN() : Loss(x);
  };
  const Result r = optex::minimize(f, x0, Adam{.lr = 0.05}, WithN(4), Stop{.max_iters = 20});
  EXPECT_EQ(r.iterations, 20);
  for (double l : r.loss_history) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(Loss(r.x), Loss(x0));
}

// ---- ThreadPool ------------------------------------------------------------------

TEST(ThreadPool, RunsEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    optex::ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int n : {0, 1, 2, 3, 7, 8, 9, 64, 1000}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", n " + std::to_string(n));
      std::vector<std::atomic<int>> counts(static_cast<std::size_t>(n));
      pool.parallel_for(n, [&](int i) { ++counts[static_cast<std::size_t>(i)]; });
      for (int i = 0; i < n; ++i) ASSERT_EQ(counts[static_cast<std::size_t>(i)], 1) << i;
    }
  }
}

TEST(ThreadPool, ManyLoopsInARow) {
  optex::ThreadPool pool(4);
  std::atomic<long> sum{0};
  for (int round = 0; round < 500; ++round) {
    pool.parallel_for(5, [&](int i) { sum += i + 1; });
  }
  EXPECT_EQ(sum, 500 * 15);
}

TEST(ThreadPool, RethrowsTheLowestIndexExceptionAfterEveryIndexRan) {
  for (int threads : {1, 3, 8}) {
    SCOPED_TRACE(threads);
    optex::ThreadPool pool(threads);
    constexpr int kN = 100;
    std::vector<std::atomic<int>> counts(kN);
    try {
      pool.parallel_for(kN, [&](int i) {
        ++counts[static_cast<std::size_t>(i)];
        if (i == 40 || i == 17 || i == 93) throw std::runtime_error("index " + std::to_string(i));
        if (i == 61) throw std::logic_error("index 61");
      });
      FAIL() << "nothing was rethrown";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "index 17");
    }
    for (int i = 0; i < kN; ++i) EXPECT_EQ(counts[static_cast<std::size_t>(i)], 1) << i;
    // Reusable: the next loop runs normally, with no stale exception.
    std::atomic<int> ran{0};
    EXPECT_NO_THROW(pool.parallel_for(10, [&](int) { ++ran; }));
    EXPECT_EQ(ran, 10);
    // The exception's type is preserved.
    EXPECT_THROW(pool.parallel_for(3,
                                   [](int i) {
                                     if (i == 2) throw std::out_of_range("x");
                                   }),
                 std::out_of_range);
    EXPECT_NO_THROW(pool.parallel_for(3, [](int) {}));
  }
}

// A thread that cannot be started (the OS out of threads or address space)
// stops and joins the ones already running and says so. Before, the
// constructor left them waiting on the pool's condition variables and hung
// in their destructor: the test runs in a watched child and fails instead.
TEST(ThreadPool, AFailedThreadStartJoinsTheStartedOnesAndNamesTheCause) {
  constexpr int kThreads = 8;
  constexpr int kFailing = 5;
  const optex::test::ChildOutcome child = optex::test::run_in_watched_child(
      [] {
        std::atomic<int> started{0};
        std::atomic<int> running{0};
        const optex::detail::ThreadStarter start = [&](int index, std::function<void()> work) {
          if (index == kFailing) throw std::system_error(EAGAIN, std::generic_category());
          ++started;
          return std::thread([&running, work = std::move(work)] {
            ++running;
            work();
            --running;
          });
        };
        try {
          optex::ThreadPool pool(kThreads, start);
          return std::string("built");
        } catch (const std::system_error& e) {
          return std::string(e.what()) + "|code " + std::to_string(e.code().value()) + "|started " +
                 std::to_string(started) + "|running " + std::to_string(running);
        }
      },
      10);
  ASSERT_TRUE(child.exited) << "the pool hung or crashed (signal " << child.signal << ")";
  EXPECT_EQ(child.status, 0);
  EXPECT_THAT(child.output, HasSubstr("thread 5 of 8"));
  EXPECT_THAT(child.output, HasSubstr(std::strerror(EAGAIN)));
  EXPECT_THAT(child.output, HasSubstr("|code " + std::to_string(EAGAIN)));
  // Every thread started was joined: none is left running.
  EXPECT_THAT(child.output, HasSubstr("|started 5|running 0"));
}

// The same with the OS refusing for real: an address-space limit that leaves
// room for a few thread stacks only (8 MiB each by default).
TEST(ThreadPool, RefusesCleanlyWhenTheAddressSpaceRunsOut) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers reserve more address space than the limit allows";
#else
  const optex::test::ChildOutcome child = optex::test::run_in_watched_child(
      [] {
        long pages = 0;
        if (FILE* f = std::fopen("/proc/self/statm", "r")) {
          if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
          std::fclose(f);
        }
        if (pages == 0) return std::string("skip: no /proc/self/statm");
        const rlim_t limit =
            static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
            (rlim_t{64} << 20);
        const rlimit as{limit, limit};
        if (setrlimit(RLIMIT_AS, &as) != 0) return std::string("skip: setrlimit refused");
        try {
          optex::ThreadPool pool(1000);
          return std::string("built");
        } catch (const std::system_error& e) {
          return std::string(e.what());
        }
      },
      20);
  ASSERT_TRUE(child.exited) << "the pool hung or crashed (signal " << child.signal << ")";
  if (child.output.starts_with("skip")) GTEST_SKIP() << child.output;
  EXPECT_EQ(child.status, 0);
  EXPECT_THAT(child.output, HasSubstr("of 1000"));
  EXPECT_THAT(child.output, HasSubstr(std::strerror(EAGAIN)));
#endif
}

TEST(ThreadPool, RejectsAbsurdThreadCounts) {
  for (int threads : {optex::kMaxParallelism + 1, 1'000'000}) {
    try {
      optex::ThreadPool pool(threads);
      FAIL() << "a pool of " << threads << " threads was built";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("threads: must be in [1, 65536], got " + std::to_string(threads)));
    }
  }
}

TEST(ThreadPool, RejectsZeroThreads) {
  try {
    optex::ThreadPool pool(0);
    FAIL() << "a pool of 0 threads was built";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("threads"));
    EXPECT_THAT(e.what(), HasSubstr("0"));
  }
}

// ---- ProgressBar -----------------------------------------------------------------

TEST(ProgressBar, DrawsTheIterationCountAndEndsWithANewline) {
  std::ostringstream out;
  optex::ProgressBar bar(5, out);
  IterationInfo info;
  info.loss = 1.5;
  info.cosine = std::numeric_limits<double>::quiet_NaN();
  for (int t = 1; t <= 5; ++t) {
    info.iteration = t;
    if (t > 1) info.cosine = 0.5;
    EXPECT_FALSE(bar(info));  // never asks to stop
    const std::string s = out.str();
    EXPECT_THAT(s, HasSubstr(std::to_string(t) + "/5"));
    if (t < 5) {
      EXPECT_EQ(s.find('\n'), std::string::npos) << "newline before the last iteration";
    }
  }
  const std::string s = out.str();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.back(), '\n');
  EXPECT_THAT(s, HasSubstr("#"));
  EXPECT_THAT(s, HasSubstr("0.5"));
}

TEST(ProgressBar, AsAMinimizeCallback) {
  std::ostringstream out;
  const Result r = optex::minimize(WithGradient{}, Start(), Adam{.lr = 0.05}, WithN(3),
                                   Stop{.max_iters = 4}, optex::ProgressBar(4, out));
  EXPECT_EQ(r.iterations, 4);
  EXPECT_EQ(r.stop_reason, StopReason::max_iters);
  const std::string s = out.str();
  EXPECT_THAT(s, HasSubstr("4/4"));
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.back(), '\n');
}

// A run that stops before the total must still leave the terminal on a new line.
TEST(ProgressBar, EndsTheLineWhenStoppedEarly) {
  std::ostringstream out;
  {
    optex::ProgressBar bar(10, out);
    IterationInfo info;
    info.iteration = 3;
    bar(info);
    EXPECT_EQ(out.str().find('\n'), std::string::npos);
  }
  const std::string s = out.str();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.back(), '\n');
  EXPECT_THAT(s, HasSubstr("3/10"));
}

}  // namespace
