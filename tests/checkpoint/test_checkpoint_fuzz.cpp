// Mutated checkpoints (docs/DESIGN.md section 6): every truncation, thousands of
// seeded byte flips, and hand-made hostile files whose checksum is valid. Each is
// refused with an exception that names the field, or (only a file that is still
// well-formed) loads into an engine that runs; none crashes, and none makes load()
// ask for much more memory than the file holds.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/util/random.hpp"

// ---- the largest single allocation while armed --------------------------------
// Replaces the global operator new of this test program only.
namespace {
std::atomic<bool> g_armed{false};
std::atomic<std::size_t> g_largest{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_armed.load(std::memory_order_relaxed)) {
    std::size_t seen = g_largest.load(std::memory_order_relaxed);
    while (n > seen && !g_largest.compare_exchange_weak(seen, n)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// GCC cannot see that the operator new above is malloc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace {

namespace fs = std::filesystem;
using optex::Engine;
using optex::Options;
using ::testing::HasSubstr;

// A load may allocate the engine it builds and copies of the file's arrays; nothing
// near a file's claimed sizes. The files here are about a kilobyte.
constexpr std::size_t kAllocationLimit = std::size_t{16} << 20;

constexpr std::size_t kHeader = 8 + 4 + 8;  // magic, version, payload size
constexpr std::size_t kTrailer = 8;         // FNV-1a of the payload

void FixChecksum(std::vector<char>& bytes) {
  const std::uint64_t sum =
      optex::fnv1a64(reinterpret_cast<const unsigned char*>(bytes.data()) + kHeader,
                     bytes.size() - kHeader - kTrailer);
  std::memcpy(bytes.data() + bytes.size() - kTrailer, &sum, sizeof sum);
}

template <class T>
T Get(const std::vector<char>& bytes, std::size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}
template <class T>
void Set(std::vector<char>& bytes, std::size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

// The file offsets of a format 7 checkpoint's fields, found by walking it with the
// layout of src/checkpoint/checkpoint_payload.cpp (DESIGN.md section 6). `*_count` is a u64 element
// count, the elements follow it.
struct Layout {
  std::size_t parallelism, history, lengthscale_grid_count, device_index, proxy_distances;
  std::size_t ranges_count, range_size, range_step_offset, iterate_count, step, slot_count_byte;
  std::size_t slot_count[optex::kMaxStateSlots];
  std::size_t lengthscale, iteration, evaluations, history_size, history_next;
  std::size_t points_count, gradients_count, distances_count, norms_count, gram_count;
  std::size_t split_evaluations, split_noise, split_rounds, last_step_norm;
  std::size_t window_carried, window_first_slot, end;
  std::size_t d, capacity;
};

std::size_t HyperparameterBytes(std::uint8_t tag) {
  std::size_t bytes = 0;
  optex::for_each_optimizer_kind([&](auto kind) {
    using O = typename decltype(kind)::type;
    if (tag != O::checkpoint_tag) return;
    optex::detail::for_each_hyperparameter<O>([&](const auto& field) {
      using V = typename std::decay_t<decltype(field)>::value_type;
      bytes += std::is_same_v<V, bool> ? 1 : 8;
    });
  });
  return bytes;
}

Layout Walk(const std::vector<char>& b) {
  Layout l{};
  std::size_t p = kHeader;
  const auto array = [&](std::size_t& count_at, std::size_t element) {
    count_at = p;
    p += 8 + Get<std::uint64_t>(b, p) * element;
  };
  l.parallelism = p;
  l.history = p + 4;
  l.capacity = static_cast<std::size_t>(Get<std::int32_t>(b, l.history));
  p += 4 + 4 + 1 + 8 + 8 + 1 + 1 + 1 + 4;  // through selection_interval
  array(l.lengthscale_grid_count, 8);
  p += 1 + 8;  // proxy, seed
  l.device_index = p + 1;
  p += 1 + 4 + 1;
  p += 4 + 1 + 1 + 8 + 8 + 8;  // evaluations per point, strategy .. max_lengthscale_change
  p += 1 + 8;                  // mode, tolerance
  l.proxy_distances = p;
  p += 1;
  l.ranges_count = p;
  const auto ranges = Get<std::uint32_t>(b, p);
  p += 4;
  l.range_size = p;
  l.range_step_offset = p + 8;
  for (std::uint32_t k = 0; k < ranges; ++k) {
    p += 8 + 8;  // size, step offset
    const auto tag = Get<std::uint8_t>(b, p);
    p += 1 + HyperparameterBytes(tag);
  }
  array(l.iterate_count, 4);
  l.d = Get<std::uint64_t>(b, l.iterate_count);
  l.step = p;
  p += 8;
  l.slot_count_byte = p;
  p += 1;
  for (std::size_t& slot : l.slot_count) array(slot, 4);
  l.lengthscale = p;
  p += 8 + 8;  // lengthscale, random state
  l.iteration = p;
  l.evaluations = p + 8;
  p += 16;
  l.history_size = p;
  l.history_next = p + 8;
  p += 16;
  array(l.points_count, 4);
  array(l.gradients_count, 4);
  array(l.distances_count, 8);
  array(l.norms_count, 8);
  array(l.gram_count, 8);
  l.split_evaluations = p;
  l.split_noise = p + 4;
  l.split_rounds = p + 12;
  l.last_step_norm = p + 20;
  p += 28;
  l.window_carried = p;
  l.window_first_slot = p + 4;
  p += 12;
  l.end = p;
  return l;
}

double Objective(std::span<const float> x, std::span<float> g) {
  double f = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    f += (1.0 + static_cast<double>(i)) * x[i] * x[i];
    g[i] = static_cast<float>(2.0 * (1.0 + static_cast<double>(i)) * x[i]);
  }
  return f;
}

void Step(Engine& e) {
  optex::Batch& b = e.ask();
  for (int i = 0; i < b.size(); ++i) b.loss(i) = Objective(b.point(i), b.grad(i));
  e.tell(b);
}

struct Base {
  const char* name;
  optex::Optimizer optimizer;
};

// Every kind, every state slot: SGD's buffer, Adam's two moments, RmsProp's three.
const Base kBases[] = {
    {"sgd_momentum", optex::Sgd{.lr = 0.02, .momentum = 0.9}},
    {"adam", optex::Adam{.lr = 0.03}},
    {"rmsprop_centered_momentum", optex::RmsProp{.lr = 0.01, .momentum = 0.5, .centered = true}},
    {"lion", optex::Lion{.lr = 0.01, .weight_decay = 0.1}},
};

class CheckpointFuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() / ("optex_test_checkpoint_fuzz_" + std::to_string(::getpid()) +
                                        "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    ASSERT_TRUE(fs::create_directories(dir_));
    path_ = (dir_ / "mutated.ckpt").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // d = 5, N = 3, a ring of 4 that has wrapped after three iterations.
  std::vector<char> Saved(const optex::Optimizer& optimizer) {
    Options o;
    o.parallelism = 3;
    o.history = 4;
    o.seed = 9;
    Engine e(std::vector<float>{0.5f, -1.0f, 1.5f, -0.25f, 2.0f}, optimizer, o);
    for (int t = 0; t < 3; ++t) Step(e);
    const std::string p = (dir_ / "good.ckpt").string();
    e.save(p);
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  enum class Outcome { refused, loaded };

  // Loads `bytes`: refused with std::runtime_error or std::invalid_argument, or loaded
  // into an engine that runs. Anything else is a failure. Returns the message of a refusal.
  Outcome Load(const std::vector<char>& bytes, std::string* message = nullptr) {
    {
      std::ofstream out(path_, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    g_largest = 0;
    g_armed = true;
    try {
      Engine e = Engine::load(path_);
      g_armed = false;
      const std::int64_t iteration = e.iteration();
      EXPECT_LE(g_largest.load(), kAllocationLimit);
      // A file that is still well-formed: the engine runs. Its cached statistics may
      // no longer match its points, which the fit can refuse (std::runtime_error, the
      // engine unchanged), as it refuses any history it cannot fit.
      try {
        Step(e);
      } catch (const std::runtime_error&) {
        EXPECT_EQ(e.iteration(), iteration);
      }
      return Outcome::loaded;
    } catch (const std::runtime_error& error) {
      if (message) *message = error.what();
    } catch (const std::invalid_argument& error) {
      if (message) *message = error.what();
    } catch (const std::exception& error) {
      ADD_FAILURE() << "neither refused nor loaded: " << typeid(error).name() << ": "
                    << error.what();
    }
    g_armed = false;
    EXPECT_LE(g_largest.load(), kAllocationLimit) << "a refused load allocated too much";
    return Outcome::refused;
  }

  // A hostile file with a valid checksum: refused with std::runtime_error naming `needle`.
  void ExpectRefused(std::vector<char> bytes, const std::string& needle) {
    FixChecksum(bytes);
    {
      std::ofstream out(path_, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    g_largest = 0;
    g_armed = true;
    try {
      (void)Engine::load(path_);
      ADD_FAILURE() << "accepted (" << needle << ")";
    } catch (const std::runtime_error& error) {
      EXPECT_THAT(error.what(), HasSubstr(needle));
      EXPECT_THAT(error.what(), HasSubstr("checkpoint '" + path_ + "'"));
    } catch (const std::exception& error) {
      ADD_FAILURE() << needle << ": " << typeid(error).name() << ": " << error.what();
    }
    g_armed = false;
    EXPECT_LE(g_largest.load(), kAllocationLimit) << needle;
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(CheckpointFuzz, EveryTruncationIsRefused) {
  for (const Base& base : kBases) {
    SCOPED_TRACE(base.name);
    const std::vector<char> good = Saved(base.optimizer);
    ASSERT_EQ(Load(good), Outcome::loaded);
    for (std::size_t n = 0; n < good.size(); ++n) {
      std::string message;
      ASSERT_EQ(Load({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)}, &message),
                Outcome::refused)
          << "a prefix of " << n << " bytes";
      ASSERT_THAT(message, HasSubstr("checkpoint"));
    }
  }
}

// Seeded flips of 1 to 4 bytes anywhere: the checksum refuses essentially all of them.
// The same flips with the checksum recomputed reach the parser and the content checks:
// each is refused or loads an engine that runs.
TEST_F(CheckpointFuzz, ByteFlipsAreRefusedOrLoadAWorkingEngine) {
  optex::SplitMix64 rng(20240601);
  int loaded_with_checksum = 0, loaded = 0, flips = 0;
  for (const Base& base : kBases) {
    SCOPED_TRACE(base.name);
    const std::vector<char> good = Saved(base.optimizer);
    for (int trial = 0; trial < 750; ++trial) {
      for (const bool fix_checksum : {false, true}) {
        std::vector<char> bytes = good;
        const std::size_t begin = fix_checksum ? kHeader : 0;
        const std::size_t span = bytes.size() - begin - (fix_checksum ? kTrailer : 0);
        const int count = 1 + static_cast<int>(rng.next() % 4);
        for (int k = 0; k < count; ++k) {
          const std::size_t at = begin + rng.next() % span;
          bytes[at] = static_cast<char>(bytes[at] ^ static_cast<char>(1 + rng.next() % 255));
        }
        if (fix_checksum) FixChecksum(bytes);
        ++flips;
        if (Load(bytes) == Outcome::loaded) ++(fix_checksum ? loaded : loaded_with_checksum);
      }
    }
  }
  EXPECT_EQ(loaded_with_checksum, 0) << "a random flip kept the checksum";
  std::cout << flips << " mutated files; " << loaded
            << " of those with a recomputed checksum loaded (still well-formed)\n";
}

class HostileCheckpoint : public CheckpointFuzz {
 protected:
  void SetUp() override {
    CheckpointFuzz::SetUp();
    adam_ = Saved(optex::Adam{.lr = 0.03});
    l_ = Walk(adam_);
    ASSERT_EQ(l_.end, adam_.size() - kTrailer);  // the walk matches the file
    ASSERT_EQ(l_.d, 5u);
    ASSERT_EQ(l_.capacity, 4u);
  }
  std::size_t Element(std::size_t count_at, std::size_t i, std::size_t size) const {
    return count_at + 8 + i * size;
  }
  template <class T>
  std::vector<char> With(std::size_t at, T v) const {
    std::vector<char> bytes = adam_;
    Set(bytes, at, v);
    return bytes;
  }
  std::vector<char> adam_;
  Layout l_{};
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST_F(HostileCheckpoint, NonFiniteOrHugeValuesAreRefusedNamingTheElement) {
  ExpectRefused(With(Element(l_.iterate_count, 2, 4), kNaN), "iterate element 2 is nan");
  ExpectRefused(With(Element(l_.iterate_count, 0, 4), -kInf), "iterate element 0 is -inf");
  // Finite but beyond magnitude_bound(5), about 5.8e18.
  ExpectRefused(With(Element(l_.iterate_count, 4, 4), 1e30f), "iterate element 4 is 1e+30");
  ExpectRefused(With(Element(l_.points_count, 3 * 5 + 1, 4), kInf),
                "history point 3, element 1 is inf");
  ExpectRefused(With(Element(l_.gradients_count, 3 * 5 + 2, 4), kNaN),
                "history gradient 3, element 2 is nan");
  ExpectRefused(With(Element(l_.gradients_count, 0, 4), 1e20f),
                "history gradient 0, element 0 is 1e+20");
  ExpectRefused(With(Element(l_.distances_count, 1 * 4 + 2, 8), -1.0),
                "history squared distance (1, 2) is -1");
  ExpectRefused(With(Element(l_.distances_count, 0, 8), std::nan("")),
                "history squared distance (0, 0) is nan");
  ExpectRefused(With(Element(l_.norms_count, 3, 8), -2.0), "history squared norm 3 is -2");
  ExpectRefused(With(Element(l_.gram_count, 2 * 4 + 3, 8), HUGE_VAL),
                "history gradient inner product (2, 3) is inf");
}

TEST_F(HostileCheckpoint, OptimizerStateOutOfRangeIsRefusedNamingTheSlot) {
  ExpectRefused(With(Element(l_.slot_count[0], 1, 4), kNaN),
                "optimizer state exp_avg (slot 0), element 1 is nan");
  ExpectRefused(With(Element(l_.slot_count[1], 3, 4), -1.0f),
                "optimizer state exp_avg_sq (slot 1), element 3 is -1");
  ExpectRefused(With(l_.step, std::int64_t{-1}), "optimizer state step");
  // Every optimizer's second moments, as its header declares them.
  {
    const std::vector<char> rmsprop = Saved(optex::RmsProp{.momentum = 0.5, .centered = true});
    const Layout l = Walk(rmsprop);
    std::vector<char> bytes = rmsprop;
    Set(bytes, Element(l.slot_count[0], 0, 4), -0.5f);
    ExpectRefused(bytes, "optimizer state square_avg (slot 0), element 0 is -0.5");
    // The gradient average may be negative: only a non-finite value is refused.
    bytes = rmsprop;
    Set(bytes, Element(l.slot_count[2], 4, 4), kInf);
    ExpectRefused(bytes, "optimizer state grad_avg (slot 2), element 4 is inf");
    bytes = rmsprop;
    Set(bytes, Element(l.slot_count[2], 4, 4), -0.5f);
    FixChecksum(bytes);
    EXPECT_EQ(Load(bytes), Outcome::loaded);
  }
  {
    const std::vector<char> sgd = Saved(optex::Sgd{.lr = 0.02, .momentum = 0.9});
    const Layout l = Walk(sgd);
    std::vector<char> bytes = sgd;
    Set(bytes, Element(l.slot_count[0], 2, 4), -kInf);
    ExpectRefused(bytes, "optimizer state momentum_buffer (slot 0), element 2 is -inf");
  }
}

// Finite values that no step can leave: every later tell() would refuse its commit.
TEST_F(HostileCheckpoint, AStateThatCannotTakeAStepIsRefused) {
  ExpectRefused(With(Element(l_.slot_count[0], 2, 4), 3e38f),
                "optimizer state exp_avg (slot 0), element 2: cannot take a step");
  // A huge second moment only makes the step small: it loads, and the engine steps.
  {
    std::vector<char> bytes = With(Element(l_.slot_count[1], 2, 4), 3e38f);
    FixChecksum(bytes);
    EXPECT_EQ(Load(bytes), Outcome::loaded);
  }
  const std::vector<char> sgd = Saved(optex::Sgd{.lr = 0.02, .momentum = 0.9});
  const Layout l = Walk(sgd);
  std::vector<char> bytes = sgd;
  Set(bytes, Element(l.slot_count[0], 1, 4), -3e38f);
  ExpectRefused(bytes, "optimizer state momentum_buffer (slot 0), element 1: cannot take a step");
}

// A range's step offset: never negative, never beyond the state's step (format 5).
TEST_F(HostileCheckpoint, StepOffsetsOutOfRangeAreRefusedNamingTheRange) {
  const auto step = Get<std::int64_t>(adam_, l_.step);
  ASSERT_GT(step, 0);
  ExpectRefused(With(l_.range_step_offset, std::int64_t{-1}), "optimizer range 0 step_offset");
  ExpectRefused(With(l_.range_step_offset, std::numeric_limits<std::int64_t>::min()),
                "optimizer range 0 step_offset");
  ExpectRefused(With(l_.range_step_offset, step + 1), "optimizer range 0 step_offset");
  ExpectRefused(With(l_.range_step_offset, std::numeric_limits<std::int64_t>::max()),
                "optimizer range 0 step_offset");
  // Within the step it is a value like any other: the file loads and runs.
  std::vector<char> bytes = With(l_.range_step_offset, step);
  FixChecksum(bytes);
  EXPECT_EQ(Load(bytes), Outcome::loaded);
}

TEST_F(HostileCheckpoint, CountersLengthscaleAndRingPositionAreChecked) {
  ExpectRefused(With(l_.lengthscale, 0.0), "lengthscale");
  ExpectRefused(With(l_.lengthscale, std::nan("")), "lengthscale");
  ExpectRefused(With(l_.lengthscale, HUGE_VAL), "lengthscale");
  ExpectRefused(With(l_.iteration, std::int64_t{-1}), "iteration at byte");
  ExpectRefused(With(l_.evaluations, std::int64_t{-5}), "evaluations at byte");
  ExpectRefused(With(l_.history_next, std::uint64_t{4}), "history next slot");
  ExpectRefused(With(l_.history_size, std::uint64_t{5}), "history size");
  ExpectRefused(With(l_.history_size, ~std::uint64_t{0}), "history size");
  // The adaptive strategy's state and the last step's length (format 4).
  ExpectRefused(With(l_.split_evaluations, std::int32_t{2}), "adaptive split");  // N = 3
  ExpectRefused(With(l_.split_evaluations, std::int32_t{0}), "adaptive split");
  ExpectRefused(With(l_.split_noise, -1.0), "adaptive split");
  ExpectRefused(With(l_.split_noise, HUGE_VAL), "adaptive split");
  ExpectRefused(With(l_.split_rounds, std::int64_t{-2}), "adaptive split");
  ExpectRefused(With(l_.last_step_norm, -1.0), "last step length");
  ExpectRefused(With(l_.last_step_norm, HUGE_VAL), "last step length");
  // The verified window (format 6): none outside the verified mode.
  ExpectRefused(With(l_.window_carried, std::int32_t{1}), "verified window");
  ExpectRefused(With(l_.window_carried, std::int32_t{-1}), "verified window");
  ExpectRefused(With(l_.window_carried, std::int32_t{2147483647}), "verified window");
  ExpectRefused(With(l_.window_first_slot, std::uint64_t{1}), "verified window");
}

// Sizes that the file cannot hold, or that the options forbid, are refused before
// anything is allocated for them (the allocation limit above checks it).
TEST_F(HostileCheckpoint, SizesBeyondTheFileOrTheLimitsAreRefusedBeforeAllocating) {
  ExpectRefused(With(l_.parallelism, std::int32_t{2147483647}), "parallelism");
  ExpectRefused(With(l_.parallelism, std::int32_t{optex::kMaxParallelism + 1}), "parallelism");
  ExpectRefused(With(l_.history, std::int32_t{2147483647}), "history");
  // A valid history the file does not hold: its 4096 x 4096 statistics are not there.
  ExpectRefused(With(l_.history, std::int32_t{optex::kMaxHistory}), "history");
  ExpectRefused(With(l_.iterate_count, std::uint64_t{1} << 62), "iterate at byte");
  ExpectRefused(With(l_.iterate_count, std::uint64_t{1000000}), "iterate at byte");
  ExpectRefused(With(l_.lengthscale_grid_count, std::uint64_t{1} << 40),
                "options.lengthscale_grid at byte");
  ExpectRefused(With(l_.ranges_count, std::uint32_t{1} << 30), "optimizer ranges");
  ExpectRefused(With(l_.range_size, std::uint64_t{1} << 62), "optimizer range 0 size");
  ExpectRefused(With(l_.slot_count[0], std::uint64_t{1} << 40), "optimizer state slot 0");
  ExpectRefused(With(l_.points_count, std::uint64_t{1} << 61), "history points");
  ExpectRefused(With(l_.gradients_count, std::uint64_t{1} << 50), "history gradients");
  ExpectRefused(With(l_.distances_count, std::uint64_t{1} << 61), "history squared distances");
  ExpectRefused(With(l_.norms_count, std::uint64_t{3}), "history squared norms");
  ExpectRefused(With(l_.gram_count, std::uint64_t{1} << 40), "history gradient inner products");
  ExpectRefused(With(l_.device_index, std::int32_t{-7}), "device.index");
}

// An enumeration byte beyond its values is refused naming the option (format 7 added
// the proxy distances: 0 direct, 1 coefficients).
TEST_F(HostileCheckpoint, EnumerationValuesOutsideTheirRangeAreRefused) {
  ASSERT_EQ(Get<std::uint8_t>(adam_, l_.proxy_distances), 0);  // ProxyDistances::direct
  for (const std::uint8_t value : {std::uint8_t{2}, std::uint8_t{7}, std::uint8_t{255}}) {
    SCOPED_TRACE(static_cast<int>(value));
    ExpectRefused(With(l_.proxy_distances, value), "proxy_distances");
  }
  // Every value of the enumeration loads, and the engine runs.
  std::vector<char> bytes = With(l_.proxy_distances, std::uint8_t{1});
  FixChecksum(bytes);
  EXPECT_EQ(Load(bytes), Outcome::loaded);
}

TEST_F(HostileCheckpoint, TrailingBytesAndForeignFormatsAreRefused) {
  {
    std::vector<char> bytes = adam_;
    bytes.insert(bytes.end() - kTrailer, 16, '\0');
    Set(bytes, 12, static_cast<std::uint64_t>(bytes.size() - kHeader - kTrailer));
    ExpectRefused(bytes, "trailing bytes");
  }
  // A format 7 payload labelled 6, 4, 3, 2 or 1: read with an older layout, it fails at
  // a field.
  for (std::uint32_t version : {1u, 2u, 3u, 4u, 6u}) {
    SCOPED_TRACE(version);
    ExpectRefused(With(std::size_t{8}, version), " at byte ");
  }
}

}  // namespace
